//! Waiting with a deadline for work another party finishes (an NCCL communicator's
//! initialisation, a collective on a stream): poll until done, an error, or the deadline; on
//! expiry run the abort (`ncclCommAbort`) and fail with one line naming the rank and the
//! operation. A peer that never arrives then ends the run instead of hanging it forever.
//! Device-free, so the tests drive it with fakes on the CPU.

use anyhow::{bail, Result};
use std::time::{Duration, Instant};

/// What one poll saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    Done,
    Pending,
}

/// Polls `poll` (backing off from 10 µs to 1 ms) until it says `Done` or fails, or `timeout`
/// passes; on expiry `abort` runs and the error names `rank` and `what`.
pub fn wait(
    rank: usize,
    what: &str,
    timeout: Duration,
    mut poll: impl FnMut() -> Result<Poll>,
    abort: impl FnOnce(),
) -> Result<()> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(10);
    loop {
        match poll() {
            Ok(Poll::Done) => return Ok(()),
            Ok(Poll::Pending) => {}
            Err(e) => {
                abort();
                bail!("rank {rank}: {what}: {e:#}");
            }
        }
        if start.elapsed() >= timeout {
            abort();
            bail!(
                "rank {rank}: {what} did not complete within {timeout:?} (a peer is gone or stuck); the communicator was aborted"
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_stuck_peer_aborts_at_the_deadline_with_one_line_naming_rank_and_operation() {
        let aborted = Cell::new(false);
        let t0 = Instant::now();
        let e = wait(
            3,
            "all-reduce",
            Duration::from_millis(50),
            || Ok(Poll::Pending),
            || aborted.set(true),
        )
        .expect_err("stuck");
        let e = format!("{e:#}");
        assert!(aborted.get(), "ncclCommAbort did not run");
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.starts_with("rank 3: all-reduce did not complete"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }

    #[test]
    fn completion_and_errors_end_the_wait() {
        let polls = Cell::new(0);
        let aborted = Cell::new(false);
        wait(
            0,
            "init",
            Duration::from_secs(5),
            || {
                polls.set(polls.get() + 1);
                Ok(if polls.get() < 4 {
                    Poll::Pending
                } else {
                    Poll::Done
                })
            },
            || aborted.set(true),
        )
        .expect("completes");
        assert_eq!(polls.get(), 4);
        assert!(!aborted.get());
        let e = wait(
            1,
            "reduce-scatter",
            Duration::from_secs(5),
            || anyhow::bail!("ncclRemoteError"),
            || aborted.set(true),
        )
        .expect_err("error");
        assert!(aborted.get());
        assert_eq!(format!("{e:#}"), "rank 1: reduce-scatter: ncclRemoteError");
    }
}
