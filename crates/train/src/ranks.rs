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
//! Data flow: xtask `train --nproc N` -> N processes -> `TcpGroup` -> `Run::train_as_rank` -> rank 0:
//! `run::train_loop` with the group; rank r > 0: `follow`. The hand-offs between them are
//! handoff.rs.

use crate::config::RunConfig;
use crate::handoff::{receive_header, receive_weights};
use crate::load::{init_model, load_tokenizer};
use crate::run::{train_loop, Run, RunSummary};
use crate::task::Task;
use crate::trainer::{GrpoTrainer, ShaperWithState};
use anyhow::{Context, Result};
use terse_dist::Collective;
use terse_optim::AdamW;

/// The observer of a rank that writes nothing.
struct NoRecords;

impl crate::observe::Observer for NoRecords {
    fn record(&mut self, _: &crate::report::MetricsLine) -> Result<()> {
        Ok(())
    }
}

impl Run<'_> {
    /// Runs the run as rank `c.rank()` of `c.world()`: rank 0 runs the ordinary loop (with
    /// the observers) and returns the run's summary; the others write nothing, observe nothing
    /// and return None. Every rank must be given the same config file.
    pub fn train_as_rank(self, c: Box<dyn Collective>) -> Result<Option<RunSummary>> {
        self.with_shaper(|cfg, shaper, observers| {
            if c.rank() == 0 {
                train_loop(cfg, shaper, observers, Some(c)).map(Some)
            } else {
                follow(cfg, shaper, c).map(|()| None)
            }
        })
    }
}

/// What this rank builds before rank 0's weights arrive: a model of random weights, which they
/// overwrite; with LoRA rank 0 sends the adapters only, so the frozen base is read here.
fn weights_from_rank_0(cfg: &mut RunConfig) {
    if cfg.model.lora.is_none() {
        cfg.model.init = crate::config::Init::Random;
    }
}

/// A rank other than 0: takes part in rank 0's SFT warm-up if there is one, receives the
/// start, then steps with rank 0 until the last step.
fn follow(
    mine: &RunConfig,
    mut shaper: Box<dyn ShaperWithState>,
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
        weights_from_rank_0(&mut cfg);
        let (dev, dtype) = cfg.run.device_and_dtype()?;
        let model = init_model(&cfg, &dev, dtype)?;
        receive_weights(&mut *c, model.vars(), "weights to warm up")?;
        let tok = load_tokenizer(&cfg.model.path)?;
        crate::sft::sft(&cfg, &model, &tok, &mut NoRecords, Some(&mut *c))?;
    }
    let (header, mut cfg) = receive_header(&mut *c, mine)?;
    // The trained weights come from rank 0. The device is this rank's own (the launcher gives
    // each local rank its GPU).
    weights_from_rank_0(&mut cfg);
    cfg.run.device = mine.run.device.clone();
    let (dev, dtype) = cfg.run.device_and_dtype()?;
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
    let mut t = GrpoTrainer::assemble(cfg, task, tok, policy, reference, opt, Some(shaper))?;
    t.step = header.step;
    t.cursor = header.cursor;
    t.collective = Some(c);
    crate::run::drive(&mut t, &mut crate::run::Follower)
}
