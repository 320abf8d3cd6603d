//! `cargo xtask train --nproc N`: one training process per data-parallel rank on this machine,
//! like torchrun's single-node mode. The launcher picks a loopback rendezvous address, starts
//! N copies of itself (`--rank r --world N --rendezvous ADDR`, each with its share of the
//! cores), and supervises them: the first rank that fails stops the others, and the launcher
//! says which rank failed and how, in one line. Each rank joins a `TcpGroup` (the CPU backend;
//! every exchange has `--timeout`, so a rank whose peer died fails instead of waiting) and runs
//! `terse_train::train_ranked`; rank 0 writes the run and prints the summary.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

/// The hidden flags a launched rank receives.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RankArgs {
    /// Data-parallel processes to launch on this machine (1: train in this process).
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// Seconds any exchange between ranks may wait (rank 0's SFT warm-up and evaluations
    /// happen while the others wait, so it must cover them).
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    #[arg(long, hide = true)]
    pub rank: Option<usize>,
    #[arg(long, hide = true)]
    pub world: Option<usize>,
    #[arg(long, hide = true)]
    pub rendezvous: Option<SocketAddr>,
}

/// Starts `a.nproc` ranks of `config` and waits for them; the first failure stops the rest.
pub fn launch(config: &str, a: &RankArgs) -> Result<ExitCode> {
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free loopback port for the rendezvous")?;
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / a.nproc).max(1);
    let children = (0..a.nproc)
        .map(|r| {
            Command::new(&exe)
                .args(["train", "--config", config])
                .args(["--rank", &r.to_string(), "--world", &a.nproc.to_string()])
                .args([
                    "--rendezvous",
                    &addr.to_string(),
                    "--timeout",
                    &a.timeout.to_string(),
                ])
                .env("RAYON_NUM_THREADS", threads.to_string())
                .spawn()
                .with_context(|| format!("starting rank {r}"))
        })
        .collect::<Result<Vec<_>>>()?;
    supervise(children, Duration::from_millis(50))?;
    Ok(ExitCode::SUCCESS)
}

/// Waits for every child (rank = index); the first to fail gets the others killed, and the
/// error names it and its exit status. Ranks that fail in the same poll are all named, those
/// killed by a signal first (a rank whose peer died fails right after it).
pub fn supervise(mut children: Vec<Child>, poll: Duration) -> Result<()> {
    let world = children.len();
    let mut done = vec![false; world];
    while done.iter().any(|d| !d) {
        let mut failed = vec![];
        for (r, child) in children.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            if let Some(status) = child
                .try_wait()
                .with_context(|| format!("waiting for rank {r}"))?
            {
                done[r] = true;
                if !status.success() {
                    failed.push((status.code().is_some(), r, status));
                }
            }
        }
        if !failed.is_empty() {
            for (r, c) in children.iter_mut().enumerate() {
                if !done[r] {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            failed.sort_by_key(|f| (f.0, f.1));
            let what: Vec<String> = failed
                .iter()
                .map(|(_, r, status)| format!("rank {r} of {world} failed ({status})"))
                .collect();
            bail!("{}; stopped the other ranks", what.join("; "));
        }
        std::thread::sleep(poll);
    }
    Ok(())
}

/// One launched rank: joins the group and trains; rank 0 returns the summary to print.
pub fn rank(config: &str, a: &RankArgs) -> Result<Option<terse_train::RunSummary>> {
    let (Some(rank), Some(world), Some(addr)) = (a.rank, a.world, a.rendezvous) else {
        bail!("--rank, --world and --rendezvous go together (the launcher sets them)");
    };
    let timeout = Duration::from_secs(a.timeout);
    let group = if rank == 0 {
        let l = TcpListener::bind(addr).with_context(|| format!("rank 0: binding {addr}"))?;
        terse_dist::TcpGroup::root(l, world, timeout)?
    } else {
        terse_dist::TcpGroup::join(addr, rank, world, timeout)?
    };
    let cfg = terse_train::RunConfig::from_file(std::path::Path::new(config))?;
    let mut shaper = terse_reward::BuiltinShaper {
        config: cfg.reward.clone(),
        state: Default::default(),
    };
    terse_train::train_ranked(&cfg, &mut shaper, Box::new(group))
        .with_context(|| format!("rank {rank} of {world}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn sh(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).spawn().expect("sh")
    }

    #[test]
    fn a_failing_rank_stops_the_others_and_is_named() {
        let t0 = Instant::now();
        let children = vec![sh("sleep 30"), sh("sleep 0.2; exit 3"), sh("sleep 30")];
        let e = supervise(children, Duration::from_millis(20)).expect_err("rank 1 fails");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("rank 1 of 3 failed") && msg.contains('3'),
            "{msg}"
        );
        // The sleeping ranks were killed, not waited for.
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        // A rank killed by a signal is named too; all succeeding is Ok.
        let e = supervise(
            vec![sh("kill -9 $$"), sh("sleep 30")],
            Duration::from_millis(20),
        )
        .expect_err("rank 0 killed");
        assert!(format!("{e:#}").contains("rank 0 of 2 failed"), "{e:#}");
        supervise(vec![sh("true"), sh("sleep 0.1")], Duration::from_millis(20))
            .expect("both succeed");
    }
}
