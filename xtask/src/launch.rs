//! `cargo xtask train --nproc N [--nnodes M --node-rank R --master-addr HOST]`: one training
//! process per data-parallel rank, like torchrun. On each node the launcher starts N copies of
//! itself (`--rank --world --local-rank --rendezvous`, each with its share of the cores; on
//! CUDA, rank r of a node uses device `cuda:r`) and supervises them (supervise.rs): after the first rank
//! fails the node's others get a grace to fail by themselves, then are stopped, and the launcher
//! says which ranks failed and how, with rank 0's recorded error, in one line
//! (ranks on other nodes then fail on the broken exchange within `--timeout`, naming it).
//! Under SLURM (`srun`, one launcher per node) the node count, node rank and master host come
//! from SLURM_NNODES, SLURM_NODEID and the first host of SLURM_JOB_NODELIST; MASTER_ADDR and
//! MASTER_PORT override them, flags override everything. Each rank joins a `TcpGroup` (the CPU
//! backend; every exchange has `--timeout`, so a rank whose peer died fails instead of
//! waiting) and runs `terse_train::GrpoTrainer::builder(cfg).collective(group).run()`; rank 0 writes the run and prints the summary.

use anyhow::{bail, Context, Result};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::process::{Command, ExitCode};
use std::time::Duration;

/// The port rank 0 listens on when several nodes meet and none is given (torchrun's).
const DEFAULT_PORT: u16 = 29500;

/// The launcher's flags and the hidden ones a launched rank receives.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RankArgs {
    /// Data-parallel processes to launch on this node (1 with one node: train in this process).
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// Nodes in the job, each running this launcher with the same --nproc (default:
    /// SLURM_NNODES, else 1).
    #[arg(long)]
    pub nnodes: Option<usize>,
    /// This node's index, 0 for the node that hosts rank 0 (default: SLURM_NODEID, else 0).
    #[arg(long)]
    pub node_rank: Option<usize>,
    /// Host of node 0, where rank 0 listens (default: MASTER_ADDR, else the first host of
    /// SLURM_JOB_NODELIST; one node: 127.0.0.1).
    #[arg(long)]
    pub master_addr: Option<String>,
    /// Port rank 0 listens on (default: MASTER_PORT, else 29500 with several nodes, a free
    /// loopback port with one).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Seconds any exchange between ranks may wait (rank 0's evaluations happen while the
    /// others wait, so it must cover them).
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Seconds to wait for the run directory's lock when another process holds it, then
    /// refuse naming the holder (default: run.lock_wait_s, 30).
    #[arg(long)]
    pub lock_wait: Option<f64>,
    /// Resume a run with a config other than its own (its config.toml): each differing key is
    /// appended to <run>/config_changes.jsonl as {step, key, old, new}. Without it such a
    /// start refuses, naming each key with both values.
    #[arg(long)]
    pub allow_config_change: bool,
    /// A finished run: evaluate it again, appending that evaluation to metrics.jsonl marked
    /// "again": true. Without it a finished run is left as it is.
    #[arg(long)]
    pub eval_again: bool,
    #[arg(long, hide = true)]
    pub rank: Option<usize>,
    #[arg(long, hide = true)]
    pub world: Option<usize>,
    #[arg(long, hide = true)]
    pub local_rank: Option<usize>,
    #[arg(long, hide = true)]
    pub rendezvous: Option<SocketAddr>,
}

/// Where this node's launcher sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub nnodes: usize,
    pub node_rank: usize,
    /// Ranks per node.
    pub nproc: usize,
    /// Rank 0's host and port (None: one node, a free loopback port).
    pub master: Option<(String, u16)>,
}

impl Topology {
    /// The job's shape from the flags, then `env` (MASTER_*, SLURM_*), then the defaults; a
    /// value that does not parse or does not fit is an error naming its flag or variable.
    pub fn resolve(a: &RankArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let num = |flag: Option<usize>, var: &str, default: usize| -> Result<usize> {
            match (flag, env(var)) {
                (Some(v), _) => Ok(v),
                (None, Some(v)) => v
                    .trim()
                    .parse()
                    .with_context(|| format!("{var}={v} is not a whole number")),
                (None, None) => Ok(default),
            }
        };
        let nnodes = num(a.nnodes, "SLURM_NNODES", 1)?;
        let node_rank = num(a.node_rank, "SLURM_NODEID", 0)?;
        if nnodes == 0 || a.nproc == 0 {
            bail!(
                "--nnodes and --nproc must be at least 1 (got {nnodes} and {})",
                a.nproc
            );
        }
        if node_rank >= nnodes {
            bail!("--node-rank {node_rank} is not below --nnodes {nnodes}");
        }
        let host = a
            .master_addr
            .clone()
            .or_else(|| env("MASTER_ADDR"))
            .or_else(|| {
                env("SLURM_JOB_NODELIST")
                    .or_else(|| env("SLURM_NODELIST"))
                    .and_then(|l| first_host(&l))
            });
        let port = match (a.master_port, env("MASTER_PORT")) {
            (Some(p), _) => Some(p),
            (None, Some(p)) => Some(
                p.trim()
                    .parse()
                    .with_context(|| format!("MASTER_PORT={p} is not a port"))?,
            ),
            (None, None) => None,
        };
        let master = match (nnodes, host, port) {
            (1, _, None) => None,
            (1, host, Some(p)) => Some((host.unwrap_or_else(|| "127.0.0.1".into()), p)),
            (_, Some(host), port) => Some((host, port.unwrap_or(DEFAULT_PORT))),
            (n, None, _) => bail!(
                "--nnodes {n} needs the host of node 0: --master-addr, MASTER_ADDR or SLURM_JOB_NODELIST"
            ),
        };
        Ok(Self {
            nnodes,
            node_rank,
            nproc: a.nproc,
            master,
        })
    }

    pub fn world(&self) -> usize {
        self.nnodes * self.nproc
    }

    /// The global rank of this node's local rank 0.
    pub fn first_rank(&self) -> usize {
        self.node_rank * self.nproc
    }
}

/// The first host of a SLURM node list: `gpu[03-05,07],cpu1` -> `gpu03`, `a,b` -> `a`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find(',').unwrap_or(list.len());
    let (head, rest) = match list.find('[') {
        Some(i) if i < end => (&list[..i], &list[i + 1..]),
        _ => return Some(list[..end].to_string()).filter(|h| !h.is_empty()),
    };
    let first = rest.split([',', '-', ']']).next()?;
    Some(format!("{head}{first}")).filter(|_| !first.is_empty())
}

/// Starts this node's ranks of `config` and waits for them; the first failure stops the rest.
pub fn launch(config: &str, a: &RankArgs, topo: &Topology) -> Result<ExitCode> {
    let addr = match &topo.master {
        None => TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port for the rendezvous")?,
        Some((host, port)) => (host.as_str(), *port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .with_context(|| format!("--master-addr {host}: no address for this host"))?,
    };
    if addr.port() == 0 {
        bail!("--master-port 0: ranks on other nodes need a fixed port");
    }
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / a.nproc).max(1);
    let world = topo.world();
    let children = (0..a.nproc)
        .map(|local| {
            let r = topo.first_rank() + local;
            Command::new(&exe)
                .args(["train", "--config", config])
                .args(["--rank", &r.to_string(), "--world", &world.to_string()])
                .args(["--local-rank", &local.to_string()])
                .args([
                    "--rendezvous",
                    &addr.to_string(),
                    "--timeout",
                    &a.timeout.to_string(),
                ])
                .args(a.lock_wait.map(|w| format!("--lock-wait={w}")))
                .args(a.allow_config_change.then_some("--allow-config-change"))
                .args(a.eval_again.then_some("--eval-again"))
                .env("RAYON_NUM_THREADS", threads.to_string())
                .spawn()
                .with_context(|| format!("starting rank {r}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let started = std::time::SystemTime::now();
    let run_dir = terse_train::RunConfig::from_file(std::path::Path::new(config))
        .ok()
        .map(|c| c.run.dir.join(&c.run.name));
    // Rank 0's own account of its failure (step, phase, cause), when it wrote one this time.
    let rank_0 = || -> Option<String> {
        let path = run_dir.as_ref()?.join("last_failure.json");
        let meta = std::fs::metadata(&path).ok()?;
        if meta.modified().ok()? < started {
            return None;
        }
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
        Some(v.get("error")?.as_str()?.to_string())
    };
    crate::supervise::supervise(
        children,
        topo.first_rank(),
        world,
        Duration::from_millis(50),
        crate::supervise::Grace {
            wait: crate::supervise::GRACE,
            note: &rank_0,
        },
    )?;
    Ok(ExitCode::SUCCESS)
}

/// One launched rank: joins the group and trains; rank 0 returns the summary to print.
pub fn rank(config: &str, a: &RankArgs) -> Result<Option<terse_train::RunSummary>> {
    let (Some(rank), Some(world), Some(addr)) = (a.rank, a.world, a.rendezvous) else {
        bail!("--rank, --world and --rendezvous go together (the launcher sets them)");
    };
    let timeout = Duration::from_secs(a.timeout);
    let mut cfg = load_config(config, a)?;
    cfg.run.device = rank_device(&cfg.run.device, a.local_rank.unwrap_or(0), a.nproc)?;
    let group = if rank == 0 {
        // Ranks on other nodes reach rank 0 at its node's address: listen on every interface.
        let at = if addr.ip().is_loopback() {
            addr
        } else {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))
        };
        let l = TcpListener::bind(at).with_context(|| format!("rank 0: listening on {at}"))?;
        terse_dist::TcpGroup::root(l, world, timeout)?
    } else {
        terse_dist::TcpGroup::join(addr, rank, world, timeout)?
    };
    a.restart(terse_train::GrpoTrainer::builder(cfg.clone()))
        .collective(on_device(group, &cfg.run.device, timeout)?)
        .run()
        .with_context(|| format!("rank {rank} of {world}"))
}

impl RankArgs {
    /// The builder told what a start of an existing run may do (`--allow-config-change`,
    /// `--eval-again`).
    pub fn restart(&self, b: terse_train::TrainerBuilder) -> terse_train::TrainerBuilder {
        b.allow_config_change(self.allow_config_change)
            .eval_again(self.eval_again)
    }
}

/// The run config at `path` with the command line's overrides (`--lock-wait`), validated.
pub fn load_config(path: &str, a: &RankArgs) -> Result<terse_train::RunConfig> {
    let mut cfg = terse_train::RunConfig::from_file(std::path::Path::new(path))?;
    if let Some(w) = a.lock_wait {
        cfg.run.lock_wait_s = w;
        cfg.validate().context("--lock-wait")?;
    }
    Ok(cfg)
}

/// The rank's collective: NCCL over the TCP group for a CUDA rank (GPU builds), else the TCP
/// group itself.
/// The NCCL communicator's initialisation and collectives wait at most `timeout`.
#[cfg(feature = "cuda")]
fn on_device(
    g: terse_dist::TcpGroup,
    device: &str,
    timeout: Duration,
) -> Result<Box<dyn terse_dist::Collective>> {
    match device.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
        Some(ordinal) => Ok(Box::new(terse_dist::NcclGroup::new(g, ordinal, timeout)?)),
        None => Ok(Box::new(g)),
    }
}

#[cfg(not(feature = "cuda"))]
fn on_device(
    g: terse_dist::TcpGroup,
    _device: &str,
    _timeout: Duration,
) -> Result<Box<dyn terse_dist::Collective>> {
    Ok(Box::new(g))
}

/// The device of local rank `local`: `cuda` becomes `cuda:<local>` (one GPU per rank, like
/// torchrun's LOCAL_RANK); `cpu` stays; a fixed `cuda:N` would put every rank of a node on
/// one GPU, so it is refused when a node runs several ranks.
pub fn rank_device(device: &str, local: usize, nproc: usize) -> Result<String> {
    match device.trim() {
        "cuda" => Ok(format!("cuda:{local}")),
        d if d.starts_with("cuda:") && nproc > 1 => bail!(
            "run.device = \"{d}\" puts all {nproc} ranks of a node on one GPU; use \"cuda\" (local rank r uses cuda:r)"
        ),
        d => Ok(d.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(args: &[&str], env: &[(&str, &str)]) -> Result<Topology> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: RankArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(
            std::iter::once("x").chain(args.iter().copied()),
        )?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Topology::resolve(&cli.a, &|k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn the_job_shape_comes_from_flags_then_master_and_slurm_variables() {
        // One node: no rendezvous host needed.
        let t = topo(&["--nproc", "4"], &[]).expect("one node");
        assert_eq!((t.world(), t.first_rank(), t.master), (4, 0, None));
        // torchrun's flags.
        let t = topo(
            &[
                "--nproc",
                "8",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--master-addr",
                "n0",
            ],
            &[],
        )
        .expect("flags");
        assert_eq!((t.world(), t.first_rank()), (16, 8));
        assert_eq!(t.master, Some(("n0".into(), 29500)));
        // SLURM, with MASTER_PORT; a flag beats the variable.
        let slurm = [
            ("SLURM_NNODES", "4"),
            ("SLURM_NODEID", "3"),
            ("SLURM_JOB_NODELIST", "gpu[07-10]"),
            ("MASTER_PORT", "6000"),
        ];
        let t = topo(&["--nproc", "2"], &slurm).expect("slurm");
        assert_eq!((t.world(), t.first_rank()), (8, 6));
        assert_eq!(t.master, Some(("gpu07".into(), 6000)));
        let t = topo(&["--nproc", "2", "--node-rank", "0"], &slurm).expect("flag wins");
        assert_eq!(t.first_rank(), 0);
        // Errors name what is wrong.
        let e = topo(&["--nnodes", "2"], &[]).expect_err("no host");
        assert!(e.to_string().contains("--master-addr"), "{e}");
        let e = topo(
            &["--nnodes", "2", "--node-rank", "2", "--master-addr", "a"],
            &[],
        )
        .expect_err("rank past the nodes");
        assert!(e.to_string().contains("--node-rank 2"), "{e}");
        let e = topo(&[], &[("SLURM_NNODES", "two")]).expect_err("bad variable");
        assert!(e.to_string().contains("SLURM_NNODES=two"), "{e}");
    }

    #[test]
    fn slurm_node_lists_and_devices_per_local_rank() {
        assert_eq!(first_host("gpu[03-05,07],cpu1").as_deref(), Some("gpu03"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("node12").as_deref(), Some("node12"));
        assert_eq!(first_host("").as_deref(), None);
        assert_eq!(rank_device("cuda", 3, 8).expect("cuda"), "cuda:3");
        assert_eq!(rank_device("cpu", 3, 8).expect("cpu"), "cpu");
        assert_eq!(rank_device("cuda:1", 0, 1).expect("one rank"), "cuda:1");
        let e = rank_device("cuda:1", 0, 2).expect_err("two ranks on one GPU");
        assert!(e.to_string().contains("cuda:1"), "{e}");
    }
}
