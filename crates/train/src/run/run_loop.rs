//! One training run, top to bottom: start (start.rs: validate, lock, load, SFT warm-up), then
//! GRPO steps through the step-level trainer (step/trainer.rs), each record handed to the observers
//! (metrics.jsonl, progress bar, TensorBoard, plots), checkpoints and evaluations around it.

use crate::builder::TrainerBuilder;
use crate::checkpoint::{prune, save_checkpoint, TrainState};
use crate::config::RunConfig;
use crate::eval::evaluate;
use crate::phase::{within, Phase};
use crate::records::metrics::mid_run_eval;
use crate::records::observe::{Observer, Plots, Progress};
use crate::report::EvalReport;
use crate::report::{read_evals, read_steps, EvalLine, MetricsLine};
use crate::run::start::{start, Started};
use crate::step::trainer::GrpoTrainer;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

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
    /// The run had finished before this start: nothing was trained, and `after` is its final
    /// evaluation as metrics.jsonl holds it (or the evaluation of `eval_again`).
    pub already_finished: bool,
}

/// Runs (or resumes) the whole configured run with its configured parts: the one-line form
/// of `GrpoTrainer::builder(cfg.clone()).run()`.
pub fn train(cfg: &RunConfig) -> Result<RunSummary> {
    GrpoTrainer::builder(cfg.clone())
        .run()?
        .context("a run without a collective is rank 0 and has a summary")
}

/// The run loop of `TrainerBuilder::run`; with a collective, this process is rank 0 of a
/// data-parallel run (ranks.rs): it sends the starting point to the other ranks and gathers
/// the optimizer shards at each checkpoint.
pub(crate) fn train_loop(mut b: TrainerBuilder) -> Result<RunSummary> {
    let mut collective = b.collective.take();
    let extra = std::mem::take(&mut b.observers);
    let again = b.eval_again;
    // Validate, lock, load, check; SFT and step 0's checkpoint for a fresh run. `_lock` is
    // bound (not `..`-dropped) so LOCK stays held to the end of the loop.
    let Started {
        task,
        loaded,
        dir,
        mut observers,
        kept_evals,
        finished,
        lock: _lock,
        planned,
    } = start(&mut b, extra, terse_dist::lend(&mut collective))?;
    if let Some(c) = collective.as_deref_mut() {
        let shaper = b.shaper_mut()?.state();
        within(loaded.step, Phase::Start, || {
            crate::run::handoff::send_start(&b.cfg, &loaded, shaper, c)
        })?;
    }
    b.collective = collective;
    let mut trainer = b.assemble(task, loaded)?;
    // Every failure from here on is one line naming its step and phase (and, for an
    // out-of-memory, the plan's figure beside the device's); one that repeats on resume is
    // named, with the sample that causes it.
    match run_steps(
        &mut trainer,
        &mut observers,
        &dir,
        finished,
        again,
        &kept_evals,
    ) {
        Ok(summary) => Ok(summary),
        Err(e) => {
            let e = crate::phase::stopped(e, planned, trainer.policy.device());
            Err(crate::failure::record(&dir, trainer.step, e))
        }
    }
}

/// The steps of a started run (or a finished run's evaluation again), its evaluations and the
/// summary; each evaluation is a phase of the step it follows.
fn run_steps(
    trainer: &mut GrpoTrainer,
    observers: &mut crate::records::observe::Observers,
    dir: &Path,
    finished: bool,
    again: bool,
    kept_evals: &[u64],
) -> Result<RunSummary> {
    let (start_step, steps) = (trainer.step, trainer.cfg.grpo.steps);
    let dir = dir.to_path_buf();
    let eval_at = |step: u64, t: &GrpoTrainer| within(step, Phase::Eval, || eval_of(t));
    // A finished run: nothing to train (the other ranks' loop ends at once); evaluated again
    // only when asked, that evaluation marked as such.
    if finished {
        let evaluated = if again {
            let e = eval_at(steps, trainer)?;
            let mut line = eval_line(steps, &e);
            if let MetricsLine::Eval(l) = &mut line {
                l.again = true;
            }
            observers.record(&line)?;
            Some(e)
        } else {
            None
        };
        observers.finish(&dir)?;
        return summary(dir, None, evaluated, true);
    }
    observers.push(Box::new(Progress::new(steps, start_step)));
    observers.push(Box::new(Plots));
    let before = if start_step == 0 && trainer.cfg.eval.at_start {
        Some(eval_at(0, trainer)?)
    } else {
        None
    };
    if let Some(e) = &before {
        observers.record(&eval_line(0, e))?;
    }
    // A stop between the checkpoint of `start` and its evaluation: write it now.
    let every = trainer.cfg.eval.every;
    if mid_run_eval(start_step, steps, every) && !kept_evals.contains(&start_step) {
        observers.record(&eval_line(start_step, &eval_at(start_step, trainer)?))?;
    }
    let mut leader = Leader {
        observers,
        dir: &dir,
    };
    drive(trainer, &mut leader)?;
    let after = eval_at(steps, trainer)?;
    observers.record(&eval_line(steps, &after))?;
    observers.finish(&dir)?;
    crate::failure::clear(&dir)?;
    summary(dir, before, Some(after), false)
}

/// The summary of the run in `dir`: the steps read from its metrics.jsonl (a resumed run's
/// earlier ones too) and the evaluations given; for a run that had finished, the evaluation
/// before the first step and (unless evaluated again) the final one are read from the file.
fn summary(
    dir: PathBuf,
    before: Option<EvalReport>,
    after: Option<EvalReport>,
    already_finished: bool,
) -> Result<RunSummary> {
    let path = dir.join("metrics.jsonl");
    let (before, after) = match after {
        Some(a) if !already_finished => (before, a),
        again => {
            let evals = read_evals(&path)?;
            let first = evals.iter().find(|e| e.step == 0 && !e.again);
            let after = match again {
                Some(a) => a,
                None => evals.last().map(|e| e.report.clone()).with_context(|| {
                    format!("{}: a finished run without an evaluation", path.display())
                })?,
            };
            (first.map(|e| e.report.clone()), after)
        }
    };
    let steps_read = read_steps(&path)?;
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
        already_finished,
    })
}

/// What a rank does around the steps of the one loop (`drive`): the leader (rank 0, or the
/// only process) records every step, writes checkpoints and evaluates; a follower
/// (`ranks::follow`) only takes part in each checkpoint's gather of the optimizer shards.
pub(crate) trait Role {
    fn stepped(&mut self, report: crate::report::StepReport) -> Result<()>;
    fn checkpoint(&mut self, t: &mut GrpoTrainer) -> Result<()>;
    fn evaluate(&mut self, t: &GrpoTrainer) -> Result<()>;
}

/// The loop every rank runs, from the trainer's step to the last.
pub(crate) fn drive(t: &mut GrpoTrainer, role: &mut dyn Role) -> Result<()> {
    let (steps, every, ckpt_every) = (t.cfg.grpo.steps, t.cfg.eval.every, t.cfg.checkpoint.every);
    while t.step < steps {
        let report = t.step()?;
        role.stepped(report)?;
        let done = t.step;
        if crate::run::handoff::checkpoint_due(done, steps, ckpt_every) {
            within(done, Phase::Checkpoint, || role.checkpoint(t))?;
        }
        if mid_run_eval(done, steps, every) {
            within(done, Phase::Eval, || role.evaluate(t))?;
        }
    }
    Ok(())
}

/// Rank 0 (or the only process): writes.
struct Leader<'a> {
    observers: &'a mut crate::records::observe::Observers,
    dir: &'a Path,
}

impl Role for Leader<'_> {
    fn stepped(&mut self, report: crate::report::StepReport) -> Result<()> {
        self.observers.record(&MetricsLine::Grpo(Box::new(report)))
    }
    fn checkpoint(&mut self, t: &mut GrpoTrainer) -> Result<()> {
        save(t, self.dir)
    }
    fn evaluate(&mut self, t: &GrpoTrainer) -> Result<()> {
        self.observers.record(&eval_line(t.step, &eval_of(t)?))
    }
}

/// A rank other than 0: writes nothing; its part of a checkpoint is its optimizer shard.
pub(crate) struct Follower;

impl Role for Follower {
    fn stepped(&mut self, _: crate::report::StepReport) -> Result<()> {
        Ok(())
    }
    fn checkpoint(&mut self, t: &mut GrpoTrainer) -> Result<()> {
        crate::run::handoff::gather_optimizer(t).map(|_| ())
    }
    fn evaluate(&mut self, _: &GrpoTrainer) -> Result<()> {
        Ok(())
    }
}

/// The trainer's evaluation (the config's held-out problems).
fn eval_of(t: &GrpoTrainer) -> Result<EvalReport> {
    t.policy
        .with_decoding_weights(|policy| evaluate(&t.cfg, &t.task, policy, &t.tok))
}

/// The checkpoint after the trainer's last step (with the whole optimizer state, gathered
/// from the ranks of a data-parallel run), then keep-last-N pruning.
fn save(t: &mut GrpoTrainer, dir: &Path) -> Result<()> {
    let state = TrainState {
        step: t.step,
        shaper: t.shaper.state(),
        data_cursor: Some(t.cursor),
    };
    let opt =
        crate::run::handoff::gather_optimizer(t)?.context("rank 0 holds the gathered optimizer")?;
    save_checkpoint(dir, t.step, &t.policy, &opt, &state, &t.cfg.model.path)?;
    prune(dir, t.cfg.checkpoint.keep_last)
}

fn eval_line(step: u64, e: &EvalReport) -> MetricsLine {
    MetricsLine::Eval(EvalLine {
        step,
        again: false,
        report: e.clone(),
    })
}
