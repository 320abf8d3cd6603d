//! A whole run on several data-parallel ranks (the launcher in xtask starts one process per
//! rank; tests run them on threads). Rank 0 runs the ordinary run loop (run_loop.rs): it validates,
//! locks, resumes or warms up (SFT, in which every rank takes its share: `announce_sft`),
//! evaluates, writes metrics and checkpoints. The other ranks
//! write nothing: they receive rank 0's starting point (resolved config, weights, optimizer
//! state, step, data cursor, shaper state) by broadcast, then take every GRPO step alongside it
//! (each rank rolls out its share of the groups and sees every group's statistics, see
//! step/collect.rs; the update is split and ZeRO-2-sharded, see step/update.rs and
//! step/zero.rs). At each checkpoint the ranks' optimizer shards are gathered to rank
//! 0, which writes one full optimizer state, so a run resumes on any number of ranks.
//!
//! Data flow: xtask `train --nproc N` -> N processes -> `TcpGroup` -> `GrpoTrainer::builder(cfg).collective(group).run()` -> rank 0:
//! `run::train_loop` with the group; rank r > 0: `follow`. The hand-offs between them are
//! handoff.rs.

use crate::builder::{Loaded, TrainerBuilder};
use crate::config::RunConfig;
use crate::load::{init_model, load_tokenizer};
use crate::run::handoff::{receive_header, receive_weights};
use crate::run::run_loop::RunSummary;
use anyhow::{Context, Result};
use terse_optim::AdamW;

/// The observer of a rank that writes nothing.
struct NoRecords;

impl crate::records::observe::Observer for NoRecords {
    fn record(&mut self, _: &crate::report::MetricsLine) -> Result<()> {
        Ok(())
    }
}

impl TrainerBuilder {
    /// The whole run: validate, lock, resume or warm up, then the GRPO steps with checkpoints
    /// and evaluations (run.rs). Returns the run's summary; with a collective, rank 0 returns
    /// it and every other rank None (they write nothing and observe nothing). Every rank must
    /// be given the same config file.
    pub fn run(self) -> Result<Option<RunSummary>> {
        if self.model.is_some() {
            anyhow::bail!(
                "builder: `.model(..)` is for `.build()`; a run starts from its config's \
                 `model.init` and `model.path`, so that it can be resumed"
            );
        }
        match &self.collective {
            Some(c) if c.rank() != 0 => follow(self).map(|()| None),
            _ => crate::run::run_loop::train_loop(self).map(Some),
        }
    }
}

/// What this rank builds before rank 0's weights arrive: a model of random weights, which they
/// overwrite; with LoRA rank 0 sends the adapters only, so the frozen base is read here.
fn weights_from_rank_0(cfg: &mut RunConfig) {
    if cfg.model.lora.is_none() {
        cfg.model.init = crate::config::Init::Random;
    }
}

/// `TrainerBuilder::run` on a rank other than 0: takes part in rank 0's SFT warm-up
/// if there is one, receives the start, then steps with rank 0 until the last step. Every
/// rank must be given the same config file.
fn follow(mut b: TrainerBuilder) -> Result<()> {
    let mut c = b.collective.take().context("a follower has a collective")?;
    let mine = b.cfg.clone();
    let mine = &mine;
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
        crate::run::sft::sft(&cfg, &model, &tok, &mut NoRecords, Some(&mut *c))?;
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
    b.shaper_mut()?
        .restore(&header.shaper)
        .map_err(|e| anyhow::anyhow!(e))?;
    let tok = load_tokenizer(&cfg.model.path)?;
    b.cfg = cfg;
    let task = b.take_task()?;
    b.collective = Some(c);
    let loaded = Loaded {
        tok,
        policy,
        reference,
        opt,
        step: header.step,
        cursor: header.cursor,
        run_dir: None,
    };
    let mut t = b.assemble(task, loaded)?;
    crate::run::run_loop::drive(&mut t, &mut crate::run::run_loop::Follower)
}
