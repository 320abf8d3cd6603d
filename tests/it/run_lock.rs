//! Issue 42 item 1: the run lock between processes (tests/bin/lock_holder.rs plays the other
//! process). Two starts released together through a barrier: exactly one wins, every time. A
//! restart issued right after a kill -9 of the holder (no sleep) gets the lock, every time.
//! A start that waits is told whom it waits for and proceeds when the holder exits.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;
use terse_train::RunLock;

fn holder(dir: &std::path::Path, wait_ms: u64) -> (Child, BufReader<ChildStdout>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lock-holder"))
        .arg(dir)
        .arg(wait_ms.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lock-holder");
    let out = BufReader::new(c.stdout.take().expect("stdout"));
    (c, out)
}

fn go(c: &mut Child) {
    let stdin = c.stdin.as_mut().expect("stdin");
    stdin
        .write_all(b"go\n")
        .and_then(|()| stdin.flush())
        .expect("go");
}

fn answer(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).expect("answer");
    line.trim_end().to_string()
}

/// 200 tries of two processes released together: exactly one holds the lock, and the other's
/// refusal names it.
#[test]
fn two_starts_released_together_one_wins_200_times() {
    let dir = crate::scratch("lock-race");
    for i in 0..200 {
        let (mut a, mut ao) = holder(&dir, 0);
        let (mut b, mut bo) = holder(&dir, 0);
        // Both are started and blocked on stdin; release them back to back.
        go(&mut a);
        go(&mut b);
        let (ra, rb) = (answer(&mut ao), answer(&mut bo));
        let won = [&ra, &rb].iter().filter(|r| **r == "won").count();
        assert_eq!(won, 1, "try {i}: {ra:?} / {rb:?}");
        let lost = if ra == "won" { &rb } else { &ra };
        let winner = if ra == "won" { a.id() } else { b.id() };
        assert!(
            lost.starts_with("lost ") && lost.contains(&format!("in use by pid {winner}")),
            "try {i}: {lost}"
        );
        for c in [&mut a, &mut b] {
            drop(c.stdin.take());
            assert!(c.wait().expect("wait").success());
        }
    }
}

/// 50 kill -9s of the holder, each followed at once (no sleep) by a restart that must get the
/// lock: the kernel releases it whatever state the killed process is in.
#[test]
fn a_restart_right_after_kill_9_gets_the_lock_50_times() {
    let dir = crate::scratch("lock-kill");
    for i in 0..50 {
        // The holder may wait: this process's own lock of the try before can outlive its drop
        // for as long as a sibling test's child, forked meanwhile, has not yet exec'd (the fork
        // shares the locked file until exec closes it). The restart below is what is timed.
        let (mut h, mut out) = holder(&dir, 30_000);
        go(&mut h);
        assert_eq!(answer(&mut out), "won", "try {i}");
        h.kill().expect("kill -9");
        let lock = RunLock::acquire(&dir, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("try {i}: restart refused: {e:#}"));
        drop(lock);
        h.wait().expect("reap");
    }
}

/// A start that finds the lock held waits (saying for whom, once), and proceeds when the
/// holder exits.
#[test]
fn a_waiting_start_proceeds_when_the_holder_exits() {
    let dir = crate::scratch("lock-wait");
    let (mut first, mut fo) = holder(&dir, 0);
    go(&mut first);
    assert_eq!(answer(&mut fo), "won");
    let (mut second, mut so) = holder(&dir, 30_000);
    go(&mut second);
    // Let the first go only once the second is waiting: its stderr says so.
    let mut err = BufReader::new(second.stderr.take().expect("stderr"));
    let mut said = String::new();
    err.read_line(&mut said).expect("stderr");
    assert!(
        said.contains("waiting for the lock") && said.contains(&first.id().to_string()),
        "{said}"
    );
    drop(first.stdin.take());
    assert!(first.wait().expect("wait").success());
    assert_eq!(answer(&mut so), "won");
    drop(second.stdin.take());
    assert!(second.wait().expect("wait").success());
}
