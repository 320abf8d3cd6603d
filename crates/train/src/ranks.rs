//! A whole run on several data-parallel ranks (the launcher in xtask starts one process per
//! rank; tests run them on threads). Rank 0 runs the ordinary run loop (run.rs): it validates,
//! locks, resumes or warms up (SFT, in which every rank takes its share: `announce_sft`),
//! evaluates, writes metrics and checkpoints. The other ranks
//! write nothing: they receive rank 0's starting point (resolved config, weights, optimizer
//! state, step, data cursor, shaper state) by broadcast, then take every GRPO step alongside it
//! (each rank rolls out its share of the groups and sees every group's statistics, see
//! collect.rs; the update is split and ZeRO-2-sharded, see update.rs and zero.rs). At each checkpoint the ranks' optimizer shards are gathered to rank
//! 0, which writes one full optimizer state, so a run resumes on any number of ranks.
//!
//! Data flow: xtask `train --nproc N` -> N processes -> `TcpGroup` -> `train_ranked` -> rank 0:
//! `run::train_loop` with the group; rank r > 0: `follow`.

use crate::config::RunConfig;
use crate::load::{init_model, load_tokenizer};
use crate::run::{train_loop, RunSummary};
use crate::task::Task;
use crate::trainer::{GrpoTrainer, ShaperWithState};
use crate::zero::Partition;
use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_optim::AdamW;

/// The observer of a rank that writes nothing.
struct NoRecords;

impl crate::observe::Observer for NoRecords {
    fn record(&mut self, _: &crate::report::MetricsLine) -> Result<()> {
        Ok(())
    }
}

/// What every rank needs to start where rank 0 starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StartHeader {
    /// Rank 0's resolved config (`data_epochs` already turned into steps).
    config: String,
    step: u64,
    cursor: u64,
    shaper: serde_json::Value,
    has_reference: bool,
}

/// Runs `cfg` as rank `c.rank()` of `c.world()`: rank 0 returns the run's summary, the others
/// None. Every rank must call it with the same config file.
pub fn train_ranked(
    cfg: &RunConfig,
    shaper: &mut dyn ShaperWithState,
    c: Box<dyn Collective>,
) -> Result<Option<RunSummary>> {
    if c.rank() == 0 {
        train_loop(cfg, shaper, vec![], Some(c)).map(Some)
    } else {
        follow(cfg, shaper, c).map(|()| None)
    }
}

/// Rank 0, after `start`: sends the starting point to the other ranks.
pub(crate) fn send_start(
    t: &GrpoTrainer,
    shaper: &dyn ShaperWithState,
    c: &mut dyn Collective,
) -> Result<()> {
    let header = StartHeader {
        config: toml::to_string(&t.cfg).context("serialising the resolved config")?,
        step: t.step,
        cursor: t.cursor,
        shaper: shaper.state(),
        has_reference: t.reference.is_some(),
    };
    let mut buf = serde_json::to_vec(&header)?;
    c.broadcast(&mut buf, 0)
        .context("rank 0: sending the start")?;
    let mut buf = weights_bytes(t.policy.vars())?;
    c.broadcast(&mut buf, 0)
        .context("rank 0: sending the weights")?;
    let mut buf = t.opt.to_safetensors()?;
    c.broadcast(&mut buf, 0)
        .context("rank 0: sending the optimizer state")?;
    if let Some(r) = &t.reference {
        let mut buf = weights_bytes(r.vars())?;
        c.broadcast(&mut buf, 0)
            .context("rank 0: sending the KL reference")?;
    }
    Ok(())
}

/// Rank 0, once it knows how the run starts: tells the other ranks whether an SFT warm-up
/// follows (`Some(model)`: the fresh model, whose weights it sends; they then train it with
/// rank 0, `sft.rs`) or not (a resume, or no warm-up).
pub(crate) fn announce_sft(c: &mut dyn Collective, fresh: Option<&Qwen3>) -> Result<()> {
    let mut flag = vec![u8::from(fresh.is_some())];
    c.broadcast(&mut flag, 0)
        .context("rank 0: announcing the SFT warm-up")?;
    if let Some(m) = fresh {
        let mut buf = weights_bytes(m.vars())?;
        c.broadcast(&mut buf, 0)
            .context("rank 0: sending the weights to warm up")?;
    }
    Ok(())
}

/// A rank other than 0: takes part in rank 0's SFT warm-up if there is one, receives the
/// start, then steps with rank 0 until the last step.
fn follow(
    mine: &RunConfig,
    shaper: &mut dyn ShaperWithState,
    mut c: Box<dyn Collective>,
) -> Result<()> {
    let rank = c.rank();
    let mut flag = vec![];
    c.broadcast(&mut flag, 0)
        .with_context(|| format!("rank {rank}: waiting for rank 0's start"))?;
    if flag == [1] {
        // rank 0's fresh weights, warmed up together (the config is this rank's own: rank 0
        // checked the run's, and every rank reads the same file).
        let mut cfg = mine.clone();
        cfg.model.init = crate::config::Init::Random;
        let (dev, dtype) = terse_model::device::select(&cfg.run.device)?;
        let model = init_model(&cfg, &dev, dtype)?;
        receive_weights(&mut *c, model.vars(), "weights to warm up")?;
        let tok = load_tokenizer(&cfg.model.path)?;
        crate::sft::sft(&cfg, &model, &tok, &mut NoRecords, Some(&mut *c))?;
    }
    let mut buf = vec![];
    c.broadcast(&mut buf, 0)
        .with_context(|| format!("rank {rank}: receiving the start from rank 0"))?;
    let header: StartHeader = serde_json::from_slice(&buf).context("the start header")?;
    let mut cfg: RunConfig = toml::from_str(&header.config).context("rank 0's resolved config")?;
    if (&cfg.run.dir, &cfg.run.name) != (&mine.run.dir, &mine.run.name) {
        bail!(
            "rank {rank}: its config is the run {}/{}, rank 0's is {}/{} (every rank needs the same config)",
            mine.run.dir.display(),
            mine.run.name,
            cfg.run.dir.display(),
            cfg.run.name
        );
    }
    // The weights come from rank 0; building the model needs no checkpoint on this rank. The
    // device is this rank's own (the launcher gives each local rank its GPU).
    cfg.model.init = crate::config::Init::Random;
    cfg.run.device = mine.run.device.clone();
    let (dev, dtype) = terse_model::device::select(&cfg.run.device)?;
    let policy = init_model(&cfg, &dev, dtype)?;
    receive_weights(&mut *c, policy.vars(), "weights")?;
    let mut buf = vec![];
    c.broadcast(&mut buf, 0)
        .with_context(|| format!("rank {rank}: receiving the optimizer state"))?;
    let opt = AdamW::from_safetensors(cfg.optim.clone(), policy.vars(), &buf)?;
    let reference = if header.has_reference {
        let r = init_model(&cfg, &dev, dtype)?;
        receive_weights(&mut *c, r.vars(), "KL reference")?;
        Some(r)
    } else {
        None
    };
    shaper.restore(&header.shaper)?;
    let task = Task::new(&cfg.data, &cfg.model.path, cfg.run.seed)?;
    let tok = load_tokenizer(&cfg.model.path)?;
    let mut t = GrpoTrainer::new(cfg, task, tok, policy, reference, opt)?;
    t.step = header.step;
    t.cursor = header.cursor;
    t.collective = Some(c);
    let (steps, every) = (t.cfg.grpo.steps, t.cfg.checkpoint.every);
    while t.step < steps {
        t.step(shaper)?;
        if checkpoint_due(t.step, steps, every) {
            gather_optimizer(&mut t)?;
        }
    }
    Ok(())
}

/// Whether the run loop checkpoints after `done` steps (every rank must agree, since the
/// checkpoint gathers the optimizer shards).
pub(crate) fn checkpoint_due(done: u64, steps: u64, every: u64) -> bool {
    (every > 0 && done.is_multiple_of(every)) || done == steps
}

/// Every rank's optimizer shard, merged on rank 0 into the whole optimizer state (None on the
/// other ranks). Before the first update each rank holds the whole state; its own part is sent
/// either way, so the merge never sees a parameter twice.
pub(crate) fn gather_optimizer(t: &mut GrpoTrainer) -> Result<Option<AdamW>> {
    let Some(c) = t.collective.as_mut() else {
        return Ok(Some(t.opt.clone()));
    };
    let (rank, world) = (c.rank(), c.world());
    let params = t.policy.vars();
    let part = Partition::new(params, world);
    let mut mine = t.opt.clone();
    mine.retain(|k| part.place.get(k).is_some_and(|p| p.0 == rank));
    let shards = c
        .all_gather_bytes(mine.to_safetensors()?)
        .with_context(|| format!("rank {rank}: gathering the optimizer shards"))?;
    if rank != 0 {
        return Ok(None);
    }
    let full = AdamW::from_shards(t.opt.config.clone(), params, &shards)
        .context("merging the ranks' optimizer shards")?;
    Ok(Some(full))
}

/// The variables as safetensors bytes (on the CPU), in key order.
fn weights_bytes(vars: &BTreeMap<String, Var>) -> Result<Vec<u8>> {
    let ts: Vec<(String, Tensor)> = vars
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    Ok(safetensors::serialize(
        ts.iter().map(|(k, t)| (k.as_str(), t)),
        None,
    )?)
}

/// Sets `vars` from rank 0's broadcast of [`weights_bytes`]; a missing or mis-shaped tensor is
/// an error naming it.
fn receive_weights(c: &mut dyn Collective, vars: &BTreeMap<String, Var>, what: &str) -> Result<()> {
    let rank = c.rank();
    let mut buf = vec![];
    c.broadcast(&mut buf, 0)
        .with_context(|| format!("rank {rank}: receiving the {what} from rank 0"))?;
    let dev = vars
        .values()
        .next()
        .map_or(Device::Cpu, |v| v.device().clone());
    let got = candle_core::safetensors::load_buffer(&buf, &dev)?;
    for (k, v) in vars {
        let Some(t) = got.get(k) else {
            bail!("rank {rank}: rank 0's {what} lack `{k}`");
        };
        if t.dims() != v.dims() {
            bail!(
                "rank {rank}: rank 0's `{k}` has shape {:?}, this rank's {:?}",
                t.dims(),
                v.dims()
            );
        }
        v.set(&t.to_dtype(v.dtype())?)?;
    }
    Ok(())
}
