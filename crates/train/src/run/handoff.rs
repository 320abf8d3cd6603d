//! The hand-offs between the ranks of a data-parallel run, below the run loop: rank 0 tells
//! the others whether an SFT warm-up follows (`announce_sft`), sends them its starting point
//! (`send_start`: resolved config, weights, optimizer state, step, data cursor, shaper state;
//! `receive_header` and `receive_weights` on the other side), and every rank agrees when a checkpoint is due and
//! gathers the optimizer shards for it (`checkpoint_due`, `gather_optimizer`).

use crate::builder::Loaded;
use crate::config::RunConfig;
use crate::step::trainer::GrpoTrainer;
use crate::step::zero::Partition;
use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_optim::AdamW;

/// What every rank needs to start where rank 0 starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StartHeader {
    /// Rank 0's resolved config (`data_epochs` already turned into steps).
    pub config: String,
    pub step: u64,
    pub cursor: u64,
    pub shaper: serde_json::Value,
    pub has_reference: bool,
}

/// Rank 0, after `start` and before its trainer is assembled: sends the starting point
/// (`cfg` resolved, the loaded weights, optimizer and reference, the shaper's state) to the
/// other ranks.
pub(crate) fn send_start(
    cfg: &RunConfig,
    l: &Loaded,
    shaper: serde_json::Value,
    c: &mut dyn Collective,
) -> Result<()> {
    let header = StartHeader {
        config: cfg.to_toml().context("serialising the resolved config")?,
        step: l.step,
        cursor: l.cursor,
        shaper,
        has_reference: l.reference.is_some(),
    };
    let mut buf = serde_json::to_vec(&header)?;
    c.broadcast(&mut buf, 0)
        .context("rank 0: sending the start")?;
    let mut buf = weights_bytes(l.policy.vars())?;
    c.broadcast(&mut buf, 0)
        .context("rank 0: sending the weights")?;
    let mut buf = l.opt.to_safetensors()?;
    c.broadcast(&mut buf, 0)
        .context("rank 0: sending the optimizer state")?;
    if let Some(r) = &l.reference {
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
pub(crate) fn receive_weights(
    c: &mut dyn Collective,
    vars: &BTreeMap<String, Var>,
    what: &str,
) -> Result<()> {
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

/// A rank other than 0: rank 0's start header, checked against this rank's own config.
pub(crate) fn receive_header(
    c: &mut dyn Collective,
    mine: &RunConfig,
) -> Result<(StartHeader, RunConfig)> {
    let rank = c.rank();
    let mut buf = vec![];
    c.broadcast(&mut buf, 0)
        .with_context(|| format!("rank {rank}: receiving the start from rank 0"))?;
    let header: StartHeader = serde_json::from_slice(&buf).context("the start header")?;
    let cfg = RunConfig::parse(&header.config)
        .map_err(|e| anyhow::anyhow!("rank 0's resolved config: {e}"))?;
    if (&cfg.run.dir, &cfg.run.name) != (&mine.run.dir, &mine.run.name) {
        bail!(
            "rank {rank}: its config is the run {}/{}, rank 0's is {}/{} (every rank needs the same config)",
            mine.run.dir.display(),
            mine.run.name,
            cfg.run.dir.display(),
            cfg.run.name
        );
    }
    Ok((header, cfg))
}
