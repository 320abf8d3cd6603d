//! How a run starts: validate the config, load the task, lock the run directory, compare the
//! config with the run's (config_record.rs) and the machine with the one it was created on
//! (machine.rs), load and check everything the run needs
//! (tokenizer, prompts against the context, weights, optimizer and shaper state, KL
//! reference), and only then write into the run directory. A refused or failed start loses
//! nothing, and so does a start of a finished run (unless it evaluates it again). Fresh runs
//! get their SFT warm-up and step 0's checkpoint here. A run counts as finished only when its
//! final evaluation is a whole line of metrics.jsonl (a power loss can leave it cut).

use crate::builder::{Loaded, TrainerBuilder};
use crate::checkpoint::{checkpoints_newest_first, read_state, save_checkpoint, TrainState};
use crate::config::{ContextOverflow, Resume, RunConfig};
use crate::load::{encode, init_model, load_tokenizer};
use crate::phase::{within, Phase};
use crate::records::metrics::{MetricsWriter, Start};
use crate::records::observe::{Observer, Observers};
use crate::records::tensorboard::TensorBoard;
use crate::run::config_record;
use crate::run::lock::RunLock;
use crate::run::machine::Machine;
use crate::run::sft::sft;
use crate::task::Task;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use terse_model::Qwen3;
use terse_optim::AdamW;
use terse_reward::LengthShaper;

/// A started run: the task and what the trainer starts from (its first step to run), the
/// observers (the open metrics file first, then the event files with `log.tensorboard`, then
/// the caller's), the lock. The builder assembles the trainer from it (run.rs).
pub(crate) struct Started {
    pub task: Task,
    pub loaded: Loaded,
    pub dir: PathBuf,
    pub observers: Observers,
    /// Steps of the evaluation lines kept from before a resume.
    pub kept_evals: Vec<u64>,
    /// The run had finished before this start (its last checkpoint is its last step and its
    /// final evaluation is written): nothing was written unless it is evaluated again.
    pub finished: bool,
    /// The run directory's lock: whoever drives the run keeps it until the run ends.
    pub lock: RunLock,
    /// The memory plan's total for the run on a GPU (None on the CPU), for an out-of-memory's
    /// message (phase.rs).
    pub planned: Option<u64>,
}

/// Validates, locks, loads and (for a fresh run) warms up; see the module docs. The builder's
/// config becomes the resolved one (`data_epochs` turned into steps) and its shaper (the
/// configured one unless given) gets a resumed run's state. `extra` observers see every
/// record from the SFT warm-up's first line on. With `dp` (rank 0 of a data-parallel run),
/// the other ranks are told whether an SFT warm-up follows and, if so, take part in it
/// (ranks.rs). A config other than the run's refuses before any weight is loaded, unless the
/// builder allows it (config_record.rs).
pub(crate) fn start(
    b: &mut TrainerBuilder,
    extra: Vec<Box<dyn Observer>>,
    dp: Option<&mut dyn terse_dist::Collective>,
) -> Result<Started> {
    b.check()?;
    b.cfg
        .l_max_notes()
        .iter()
        .for_each(|n| tracing::info!("{n}"));
    // The task first: a missing dataset fails before anything is written, and `data_epochs`
    // resolves into a step count saved with the run.
    let mut task = b.take_task()?;
    let mut cfg = b.cfg.clone();
    let (dev, dtype) = cfg.run.device_and_dtype()?;
    let dir = cfg.run.dir.join(&cfg.run.name);
    let lock = RunLock::create_and_acquire(&dir, cfg.run.lock_wait())?;
    let tok = load_tokenizer(&cfg.model.path)?;
    let planned = check_fits(&cfg, &mut task, &tok, &dev)?;
    if let Some(e) = cfg.grpo.data_epochs {
        let rows = task.train_rows() as f64;
        cfg.grpo.steps = (e * rows / cfg.grpo.prompts_per_step as f64).ceil() as u64;
        cfg.grpo.data_epochs = None;
    }

    if cfg.run.resume == Resume::Never && dir.join("metrics.jsonl").exists() {
        bail!("run directory {} already has metrics.jsonl; use run.resume = \"auto\" or another run.name", dir.display());
    }
    let record = config_record::check(&dir, &cfg, b.allow_config_change)?;
    // Where the run was created: a start on another machine type says so (machine.rs).
    let machine = Machine::this(&cfg.run.device);
    match machine.compare(&dir) {
        Ok(None) => {}
        Ok(Some(line)) => tracing::warn!("{line}"),
        Err(e) => tracing::warn!("{e:#}"),
    }

    // Loading (and, for a fresh run, the SFT warm-up and step 0's checkpoint) is the start
    // phase of the step the run goes on from: the newest complete checkpoint's.
    let from = crate::checkpoint::newest_step(&dir)?.unwrap_or(0);
    let shaper = b.shaper_mut()?;
    // A device error here is explained (out of memory) and a lost context kept (phase.rs).
    let stopped = |e| crate::phase::stopped(e, planned, &dev);
    let origin = within(from, Phase::Start, || {
        origin(&cfg, &dir, &dev, dtype, shaper)
    })
    .map_err(stopped)?;
    let finished = finished(&origin, &cfg, &dir)?;

    // Loaded and checked: from here on the run directory is written (a finished run's only
    // when it is evaluated again).
    let (mut observers, kept_evals) = if finished && !b.eval_again {
        (Observers(extra), vec![])
    } else {
        let step = match &origin {
            Origin::Resumed { step, .. } => *step,
            Origin::Fresh(_) => 0,
        };
        config_record::write(&dir, &record, step)?;
        if matches!(record, config_record::Record::Create(_)) {
            machine.write(&dir)?;
        }
        open_observers(&cfg, &dir, &origin, finished, extra)?
    };
    let shaper = &*b.shaper_mut()?;
    let (policy, step, cursor, opt, reference) = within(from, Phase::Start, || {
        begin(
            origin,
            &cfg,
            &dir,
            &tok,
            shaper,
            &mut observers,
            dp,
            (&dev, dtype),
        )
    })
    .map_err(stopped)?;
    b.cfg = cfg;
    let loaded = Loaded {
        tok,
        policy,
        reference,
        opt,
        step,
        cursor,
        run_dir: Some(dir.clone()),
    };
    Ok(Started {
        task,
        loaded,
        dir,
        observers,
        kept_evals,
        finished,
        lock,
        planned,
    })
}

/// The prompts fit the model's context, with room for `grpo.max_new_tokens` as
/// `data.context_overflow` says, and on a GPU the memory plan fits before any weight is loaded
/// (its total returned).
fn check_fits(
    cfg: &RunConfig,
    task: &mut Task,
    tok: &tokenizers::Tokenizer,
    dev: &candle_core::Device,
) -> Result<Option<u64>> {
    let max_pos = terse_model::Config::from_file(&cfg.model.path.join("config.json"))?
        .max_position_embeddings;
    let count = |p: &str| -> Result<usize> { Ok(encode(tok, p)?.len()) };
    let new = cfg.grpo.max_new_tokens;
    let (_, longest) = task.check_context_longest(&cfg.data, count, max_pos, new)?;
    if let Some(l) = longest.as_ref().filter(|l| l.tokens + new > max_pos) {
        let what = format!(
            "{}: a prompt of {} tokens + grpo.max_new_tokens ({new}) exceeds the model's max_position_embeddings ({max_pos}) (the longest of {} such prompts)",
            l.at, l.tokens, l.over
        );
        match cfg.data.context_overflow {
            ContextOverflow::Error => bail!(
                "{what}; shorten the prompts or grpo.max_new_tokens, or set data.context_overflow = \"truncate_generation\" (or \"allow\")"
            ),
            ContextOverflow::TruncateGeneration => tracing::warn!(
                "{what}: data.context_overflow = \"truncate_generation\": each row's generation stops at the context (counted per step as context_cut)"
            ),
            ContextOverflow::Allow => tracing::warn!(
                "{what}: allowed by data.context_overflow = \"allow\" (generation stops at the context, counted per step as context_cut)"
            ),
        }
    }
    // On a GPU, the memory plan before any weight is loaded: a run that cannot fit stops here.
    Ok(match terse_model::device::memory(dev) {
        Some((free, total)) => {
            let longest = longest.map_or(0, |l| l.tokens);
            Some(crate::plan::memory::check_device(
                cfg, longest, free, total,
            )?)
        }
        None => None,
    })
}

/// Resume from the newest complete checkpoint with finite weights (restoring the shaper's
/// state), or start from the configured model.
fn origin(
    cfg: &RunConfig,
    dir: &Path,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
    shaper: &mut dyn LengthShaper,
) -> Result<Origin> {
    // Resume from the newest complete checkpoint with finite weights, or start from the
    // configured model.
    let resume = match cfg.run.resume {
        Resume::Auto => resume_point(cfg, dir, dev, dtype)?,
        Resume::Never => None,
    };
    Ok(match resume {
        Some((ckpt, state, m)) => {
            tracing::info!("resuming from {}", ckpt.display());
            shaper
                .restore(&state.shaper)
                .map_err(|e| anyhow::anyhow!(e))
                .with_context(|| format!("{}/state.json: shaper state", ckpt.display()))?;
            let opt_path = ckpt.join("optimizer.safetensors");
            let bytes = std::fs::read(&opt_path)
                .with_context(|| format!("reading {}", opt_path.display()))?;
            let opt = AdamW::from_safetensors(cfg.optim.clone(), m.vars(), &bytes)
                .with_context(|| opt_path.display().to_string())?;
            let reference = load_reference(cfg, dir, dev, dtype)?;
            // An older state.json without the cursor: every step took prompts_per_step
            // prompts. A step count that would overflow it is a corrupt file, not a panic.
            let cursor = match state.data_cursor {
                Some(c) => c,
                None => state
                    .step
                    .checked_mul(cfg.grpo.prompts_per_step as u64)
                    .with_context(|| {
                        format!(
                            "{}/state.json: step {} is not a step of this run",
                            ckpt.display(),
                            state.step
                        )
                    })?,
            };
            Origin::Resumed {
                policy: m,
                step: state.step,
                cursor,
                opt,
                reference,
            }
        }
        None => {
            let m = init_model(cfg, dev, dtype)?;
            check_weights(&m, &cfg.model.path)?;
            Origin::Fresh(m)
        }
    })
}

/// Whether the run had finished: resumed at its last step, with the final evaluation written.
fn finished(origin: &Origin, cfg: &RunConfig, dir: &Path) -> Result<bool> {
    let Origin::Resumed { step, .. } = origin else {
        return Ok(false);
    };
    let path = dir.join("metrics.jsonl");
    if *step != cfg.grpo.steps || !path.is_file() {
        return Ok(false);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // Whole lines only: a final evaluation a crash cut short is not written.
    let done = crate::records::metrics::whole_lines(&text).any(|l| {
        serde_json::from_str::<serde_json::Value>(l)
            .is_ok_and(|v| v["phase"] == "eval" && v["step"].as_u64() == Some(*step))
    });
    Ok(done)
}

/// The observers: the metrics file (opened fresh, cut back to the resumed step, or kept whole
/// for a finished run evaluated again), the event files with `log.tensorboard`, then the
/// caller's; and the evaluation steps kept.
fn open_observers(
    cfg: &RunConfig,
    dir: &Path,
    origin: &Origin,
    finished: bool,
    extra: Vec<Box<dyn Observer>>,
) -> Result<(Observers, Vec<u64>)> {
    let (metrics, kept_evals) = MetricsWriter::open(
        &dir.join("metrics.jsonl"),
        match origin {
            _ if finished => Start::Finished,
            Origin::Resumed { step, .. } => Start::Resumed {
                start: *step,
                steps: cfg.grpo.steps,
                eval_every: cfg.eval.every,
            },
            Origin::Fresh(_) => Start::Fresh,
        },
    )?;
    let mut observers = Observers(vec![Box::new(metrics)]);
    if cfg.log.tensorboard {
        observers.push(Box::new(TensorBoard::create(dir)?));
    }
    observers.0.extend(extra);
    Ok((observers, kept_evals))
}

/// The weights, step, data cursor, optimizer and KL reference the first step starts from; a
/// fresh run gets its SFT warm-up (the other ranks told, with `dp`) and step 0's checkpoint.
#[allow(clippy::too_many_arguments)]
fn begin(
    origin: Origin,
    cfg: &RunConfig,
    dir: &Path,
    tok: &tokenizers::Tokenizer,
    shaper: &dyn LengthShaper,
    observers: &mut Observers,
    mut dp: Option<&mut dyn terse_dist::Collective>,
    (dev, dtype): (&candle_core::Device, candle_core::DType),
) -> Result<(Qwen3, u64, u64, AdamW, Option<Qwen3>)> {
    Ok(match origin {
        Origin::Resumed {
            policy,
            step,
            cursor,
            opt,
            reference,
        } => {
            if let Some(c) = dp {
                crate::run::handoff::announce_sft(c, None)?;
            }
            (policy, step, cursor, opt, reference)
        }
        Origin::Fresh(m) => {
            let warm_up = cfg.sft.steps > 0;
            if let Some(c) = dp.as_deref_mut() {
                crate::run::handoff::announce_sft(c, warm_up.then_some(&m))?;
            }
            if warm_up {
                sft(cfg, &m, tok, observers, dp)?;
            }
            let opt = AdamW::new(cfg.optim.clone(), m.vars())?;
            let state = TrainState {
                step: 0,
                shaper: shaper.state(),
                data_cursor: Some(0),
            };
            save_checkpoint(dir, 0, &m, &opt, &state, &cfg.model.path)?;
            let reference = load_reference(cfg, dir, dev, dtype)?;
            (m, 0, 0, opt, reference)
        }
    })
}

/// The newest complete checkpoint whose weights are finite, its state and its weights. A
/// newer one of non-finite weights (written by an older build) is skipped with one line.
fn resume_point(
    cfg: &RunConfig,
    dir: &Path,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
) -> Result<Option<(PathBuf, TrainState, Qwen3)>> {
    for ckpt in checkpoints_newest_first(dir)? {
        let state = read_state(&ckpt)?;
        let m = crate::load::load_checkpoint_model(cfg, &ckpt, dev, dtype)?;
        match m.first_non_finite()? {
            None => return Ok(Some((ckpt, state, m))),
            Some(name) => tracing::warn!(
                "skipping checkpoint {}: its weights hold non-finite values (first: {name})",
                ckpt.display()
            ),
        }
    }
    Ok(None)
}

/// Where a run starts: a fresh model (SFT warm-up and step 0's checkpoint follow), or a
/// checkpoint with everything the next step needs. One value per run start, so the variants'
/// sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Origin {
    Fresh(Qwen3),
    Resumed {
        policy: Qwen3,
        step: u64,
        cursor: u64,
        opt: AdamW,
        reference: Option<Qwen3>,
    },
}

/// The KL reference (step 0's weights) when `grpo.kl_coef > 0`.
fn load_reference(
    cfg: &RunConfig,
    dir: &Path,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
) -> Result<Option<Qwen3>> {
    if !crate::load::needs_reference(cfg) {
        return Ok(None);
    }
    let path = dir.join(crate::checkpoint::step_name(0));
    let m = Qwen3::load(&path, dev, dtype)
        .with_context(|| format!("loading the KL reference {}", path.display()))?;
    Ok(Some(m))
}

/// Starting weights with a NaN or an infinity are an error naming where they came from.
fn check_weights(model: &Qwen3, source: &Path) -> Result<()> {
    if let Some(name) = model.first_non_finite_base()? {
        bail!(
            "the weights loaded from {} hold non-finite values (first: {name})",
            source.display()
        );
    }
    Ok(())
}
