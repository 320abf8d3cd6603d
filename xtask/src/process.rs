//! Child processes with a time limit: a hung subprocess (a stalled download, a GPU stack that
//! never answers) is killed instead of eating the session.

use std::process::Command;

/// Runs `cmd` to completion and returns its output, or kills it after `limit` and fails.
pub fn output_with_timeout(
    mut cmd: Command,
    limit: std::time::Duration,
) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = vec![];
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_t = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err_t = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("killed after {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    Ok(std::process::Output {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_subprocess_is_killed_at_its_limit() {
        let mut sleep = Command::new("sleep");
        sleep.arg("30");
        let t = std::time::Instant::now();
        let e = output_with_timeout(sleep, std::time::Duration::from_millis(300))
            .expect_err("must time out");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        let mut echo = Command::new("echo");
        echo.arg("hi");
        let o = output_with_timeout(echo, std::time::Duration::from_secs(10)).expect("echo");
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "hi");
    }
}
