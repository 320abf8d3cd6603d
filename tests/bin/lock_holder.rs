//! A second process for tests/it/run_lock.rs: takes a run directory's lock the way a run's
//! start does and reports over stdout. Usage: `lock-holder <run dir> <wait ms>`. It waits for a
//! line on stdin (the tests' barrier: every process is started and blocked before any tries),
//! tries the lock, prints "won" or "lost <error>", then holds what it has until stdin closes.

use std::io::{BufRead, Read, Write};
use std::time::Duration;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(wait)) = (args.get(1), args.get(2).and_then(|w| w.parse().ok())) else {
        eprintln!("usage: lock-holder <run dir> <wait ms>");
        return std::process::ExitCode::FAILURE;
    };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut go = String::new();
    if input.read_line(&mut go).is_err() {
        return std::process::ExitCode::FAILURE;
    }
    let lock =
        terse_train::RunLock::acquire(std::path::Path::new(dir), Duration::from_millis(wait));
    let line = match &lock {
        Ok(_) => "won".to_string(),
        Err(e) => format!("lost {e:#}"),
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    // Hold until the test closes stdin.
    let _ = input.read_to_end(&mut vec![]);
    drop(lock);
    std::process::ExitCode::SUCCESS
}
