//! One training run, top to bottom: start (start.rs: validate, lock, load, SFT warm-up), then
//! GRPO steps through the step-level trainer (trainer.rs), each record handed to the observers
//! (metrics.jsonl, progress bar, TensorBoard, plots), checkpoints and evaluations around it.

pub use crate::load::{encode, init_model, load_tokenizer};

use crate::checkpoint::{prune, save_checkpoint, TrainState};
use crate::config::RunConfig;
use crate::eval::{evaluate, EvalReport};
use crate::metrics::mid_run_eval;
use crate::observe::{Observer, Plots, Progress};
use crate::report::{read_steps, EvalLine, MetricsLine};
use crate::start::{start, Started};
use crate::trainer::{GrpoTrainer, ShaperWithState};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use terse_reward::BuiltinShaper;

/// What a finished run leaves behind.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub dir: PathBuf,
    pub before: Option<EvalReport>,
    pub after: EvalReport,
    /// Mean rollout length at the first and last GRPO step, and averaged over steps.
    pub len_first: f64,
    pub len_last: f64,
    pub len_avg_by_steps: f64,
    pub reward_first: f64,
    pub reward_last: f64,
}

/// Runs (or resumes) the whole configured run with the built-in shaper.
pub fn train(cfg: &RunConfig) -> Result<RunSummary> {
    let mut shaper = BuiltinShaper {
        config: cfg.reward.clone(),
        state: Default::default(),
    };
    train_with(cfg, &mut shaper)
}

/// Runs with any shaper: research code passes its own `LengthShaper` (a closure works).
/// A `BuiltinShaper`'s state is restored from and saved into checkpoints.
pub fn train_with(cfg: &RunConfig, shaper: &mut dyn ShaperWithState) -> Result<RunSummary> {
    train_observed(cfg, shaper, vec![])
}

/// Runs with any shaper and extra observers of the run's records (after the metrics file,
/// the progress bar and, with `log.tensorboard`, the event files).
pub fn train_observed(
    cfg: &RunConfig,
    shaper: &mut dyn ShaperWithState,
    extra: Vec<Box<dyn Observer>>,
) -> Result<RunSummary> {
    train_loop(cfg, shaper, extra, None)
}

/// The run loop; with a collective, this process is rank 0 of a data-parallel run
/// (ranks.rs): it sends the starting point to the other ranks and gathers the optimizer
/// shards at each checkpoint.
pub(crate) fn train_loop(
    cfg: &RunConfig,
    shaper: &mut dyn ShaperWithState,
    extra: Vec<Box<dyn Observer>>,
    mut collective: Option<Box<dyn terse_dist::Collective>>,
) -> Result<RunSummary> {
    // Validate, lock, load, check; SFT and step 0's checkpoint for a fresh run. `_lock` is
    // bound (not `..`-dropped) so LOCK stays held to the end of the loop.
    let Started {
        mut trainer,
        dir,
        mut observers,
        kept_evals,
        lock: _lock,
        ..
    } = start(cfg, shaper, extra, terse_dist::lend(&mut collective))?;
    if let Some(mut c) = collective {
        crate::ranks::send_start(&trainer, shaper, &mut *c)?;
        trainer.collective = Some(c);
    }
    let (start_step, steps) = (trainer.step, trainer.cfg.grpo.steps);
    observers.push(Box::new(Progress::new(steps, start_step)));
    observers.push(Box::new(Plots));
    let mut emit = |line: MetricsLine| observers.record(&line);
    let evaluate = |t: &GrpoTrainer| evaluate(&t.cfg, &t.task, &t.policy, &t.tok);
    let before = if start_step == 0 {
        Some(evaluate(&trainer)?)
    } else {
        None
    };
    if let Some(e) = &before {
        emit(eval_line(0, e))?;
    }
    // A stop between the checkpoint of `start` and its evaluation: write it now.
    let (every, ckpt_every) = (trainer.cfg.eval.every, trainer.cfg.checkpoint.every);
    if mid_run_eval(start_step, steps, every) && !kept_evals.contains(&start_step) {
        emit(eval_line(start_step, &evaluate(&trainer)?))?;
    }
    while trainer.step < steps {
        let report = trainer.step(shaper)?;
        emit(MetricsLine::Grpo(Box::new(report)))?;
        let done = trainer.step;
        if crate::ranks::checkpoint_due(done, steps, ckpt_every) {
            save(&mut trainer, &dir, shaper)?;
        }
        if mid_run_eval(done, steps, every) {
            emit(eval_line(done, &evaluate(&trainer)?))?;
        }
    }
    let after = evaluate(&trainer)?;
    emit(eval_line(steps, &after))?;
    observers.finish(&dir)?;
    // The summary reads the whole run's steps (a resumed run's earlier ones too).
    let steps_read = read_steps(&dir.join("metrics.jsonl"))?;
    let lens: Vec<f64> = steps_read.iter().filter_map(|s| s.len_mean).collect();
    let rewards: Vec<f64> = steps_read.iter().map(|s| s.reward).collect();
    Ok(RunSummary {
        dir,
        before,
        after,
        len_first: lens.first().copied().unwrap_or(0.0),
        len_last: lens.last().copied().unwrap_or(0.0),
        len_avg_by_steps: terse_reward::metrics::averaged_by_steps(&lens).0,
        reward_first: rewards.first().copied().unwrap_or(0.0),
        reward_last: rewards.last().copied().unwrap_or(0.0),
    })
}

/// The checkpoint after the trainer's last step (with the whole optimizer state, gathered
/// from the ranks of a data-parallel run), then keep-last-N pruning.
fn save(t: &mut GrpoTrainer, dir: &Path, shaper: &dyn ShaperWithState) -> Result<()> {
    let state = TrainState {
        step: t.step,
        shaper: shaper.state(),
        data_cursor: Some(t.cursor),
    };
    let opt = crate::ranks::gather_optimizer(t)?.context("rank 0 holds the gathered optimizer")?;
    save_checkpoint(dir, t.step, &t.policy, &opt, &state, &t.cfg.model.path)?;
    prune(dir, t.cfg.checkpoint.keep_last)
}

fn eval_line(step: u64, e: &EvalReport) -> MetricsLine {
    MetricsLine::Eval(EvalLine {
        step,
        report: e.clone(),
    })
}
