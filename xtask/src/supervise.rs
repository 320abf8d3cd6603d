//! The launcher's watch over its ranks (launch.rs): it waits for every rank process; after the
//! first failure the others get a grace to fail by themselves (a rank whose peer died notices
//! within a collective's deadline and names its step and phase), then are killed, and one line
//! names every failed rank, its exit status, and rank 0's recorded error.

use anyhow::{bail, Context, Result};
use std::process::Child;
use std::time::Duration;

/// How long the other ranks of a node get to fail by themselves after one fails: a rank whose
/// peer died fails within a collective's deadline (the emulated NCCL and TCP notice a dead peer
/// within a second), and its own error names its step and phase.
pub const GRACE: Duration = Duration::from_secs(20);

/// What `supervise` does after the first failure: waits up to `wait` for the others, then
/// adds `note` (rank 0's recorded error) to its line.
pub struct Grace<'a> {
    pub wait: Duration,
    pub note: &'a dyn Fn() -> Option<String>,
}

/// Waits for every child (global rank `first` + index, of `world`); after the first fails,
/// the others get `grace.wait` to end by themselves and are then killed, and the error names
/// every failed rank and its exit status, those killed by a signal first (a rank whose peer
/// died fails right after it), then `grace.note`: one line.
pub fn supervise(
    mut children: Vec<Child>,
    first: usize,
    world: usize,
    poll: Duration,
    grace: Grace,
) -> Result<()> {
    let mut done = vec![false; children.len()];
    let mut failed = vec![];
    let mut first_failure: Option<std::time::Instant> = None;
    while done.iter().any(|d| !d) {
        for (r, child) in children.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            if let Some(status) = child
                .try_wait()
                .with_context(|| format!("waiting for rank {}", first + r))?
            {
                done[r] = true;
                if !status.success() {
                    failed.push((status.code().is_some(), first + r, status));
                }
            }
        }
        if !failed.is_empty() {
            let since = *first_failure.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= grace.wait {
                for (r, c) in children.iter_mut().enumerate() {
                    if !done[r] {
                        let _ = c.kill();
                        let _ = c.wait();
                        done[r] = true;
                    }
                }
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
        std::thread::sleep(poll);
    }
    if failed.is_empty() {
        return Ok(());
    }
    failed.sort_by_key(|f| (f.0, f.1));
    let what: Vec<String> = failed
        .iter()
        .map(|(_, r, status)| format!("rank {r} of {world} failed ({status})"))
        .collect();
    match (grace.note)() {
        Some(note) => bail!(
            "{}; stopped the other ranks; rank 0: {note}",
            what.join("; ")
        ),
        None => bail!("{}; stopped the other ranks", what.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Instant;

    fn sh(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).spawn().expect("sh")
    }

    #[test]
    fn a_failing_rank_stops_the_others_and_is_named() {
        let t0 = Instant::now();
        let children = vec![sh("sleep 30"), sh("sleep 0.2; exit 3"), sh("sleep 30")];
        let none = || None;
        let quick = || Grace {
            wait: Duration::from_millis(300),
            note: &none,
        };
        let e = supervise(children, 0, 3, Duration::from_millis(20), quick())
            .expect_err("rank 1 fails");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("rank 1 of 3 failed") && msg.contains('3'),
            "{msg}"
        );
        // The sleeping ranks were killed, not waited for.
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        // A rank killed by a signal is named too; all succeeding is Ok.
        // On the second of two nodes, the local ranks are 2 and 3 of 4.
        // A rank that fails within the grace is named too, and so is the note.
        let note = || Some("step 2 (checkpoint): the peer is gone".to_string());
        let e = supervise(
            vec![sh("kill -9 $$"), sh("sleep 0.1; exit 1"), sh("sleep 30")],
            2,
            4,
            Duration::from_millis(20),
            Grace {
                wait: Duration::from_secs(2),
                note: &note,
            },
        )
        .expect_err("rank 2 killed");
        let msg = format!("{e:#}");
        assert!(
            msg.starts_with("rank 2 of 4 failed (signal: 9")
                && msg.contains("rank 3 of 4 failed (exit status: 1)")
                && msg.ends_with("rank 0: step 2 (checkpoint): the peer is gone"),
            "{msg}"
        );
        supervise(
            vec![sh("true"), sh("sleep 0.1")],
            0,
            2,
            Duration::from_millis(20),
            quick(),
        )
        .expect("both succeed");
    }
}
