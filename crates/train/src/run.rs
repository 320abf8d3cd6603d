//! One training run, top to bottom: load or initialise the model, SFT warm-up on teacher
//! traces, then GRPO steps (rollout -> score -> shape -> advantage -> PPO-clip + KL with
//! micro-batch accumulation -> clip -> AdamW), metrics.jsonl, checkpoints, evaluation.

use crate::checkpoint::{latest_checkpoint, prune, save_checkpoint, TrainState};
use crate::collect::{collect, rollout_params};
use crate::config::RunConfig;
use crate::data;
use crate::eval::{evaluate, EvalReport};

use crate::metrics::{MetricsWriter, Start};
use crate::sft::{progress_bar, sft};
use crate::task::Task;
use crate::update::{policy_update, sequences};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;
use terse_model::Qwen3;
use terse_optim::AdamW;
use terse_reward::{metrics::length_stats, BuiltinShaper, Group, LengthShaper, StepCtx};
use terse_rollout::Finish;

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

/// The tokenizer every text passes through.
pub fn load_tokenizer(model_dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = model_dir.join("tokenizer.json");
    if !path.is_file() {
        bail!(
            "model directory {} has no tokenizer.json",
            model_dir.display()
        );
    }
    tokenizers::Tokenizer::from_file(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

pub fn encode(tok: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tok
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?
        .get_ids()
        .to_vec())
}

/// The configured starting model: `model.init = "random"` draws it from the run seed (the
/// testbed), `"checkpoint"` loads `model.path`.
pub(crate) fn init_model(
    cfg: &RunConfig,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
) -> Result<Qwen3> {
    Ok(if cfg.model.init == "random" {
        let config = terse_model::Config::from_file(&cfg.model.path.join("config.json"))?;
        Qwen3::random(config, data::mix(cfg.run.seed, 0, 0), dev, dtype)?
    } else {
        Qwen3::load(&cfg.model.path, dev, dtype)?
    })
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
///
/// Everything that can fail on the user's input (config, dataset, tokenizer, checkpoint,
/// optimizer state, shaper state, reference model) is loaded and checked before the run
/// directory's files are touched: a refused or failed start loses nothing.
pub fn train_with(cfg: &RunConfig, shaper: &mut dyn ShaperWithState) -> Result<RunSummary> {
    cfg.validate()?;
    // The task first: a missing dataset fails before anything is written, and `data_epochs`
    // resolves into a step count saved with the run.
    let mut task = Task::new(&cfg.data, &cfg.model.path, cfg.run.seed)?;
    let (dev, dtype) = terse_model::device::select(&cfg.run.device)?;
    let dir = cfg.run.dir.join(&cfg.run.name);
    let _lock = crate::lock::RunLock::create_and_acquire(&dir)?;
    let tok = load_tokenizer(&cfg.model.path)?;
    let max_pos = terse_model::Config::from_file(&cfg.model.path.join("config.json"))?
        .max_position_embeddings;
    task.check_context(&cfg.data, |p| Ok(encode(&tok, p)?.len()), max_pos)?;
    let mut resolved_cfg = cfg.clone();
    if let Some(e) = cfg.grpo.data_epochs {
        let rows = task.train_rows() as f64;
        resolved_cfg.grpo.steps = (e * rows / cfg.grpo.prompts_per_step as f64).ceil() as u64;
        resolved_cfg.grpo.data_epochs = None;
    }
    let cfg = &resolved_cfg;

    // Resume from the newest complete checkpoint, or start from the configured model.
    let resume = if cfg.run.resume == "auto" {
        latest_checkpoint(&dir)?
    } else {
        None
    };
    if resume.is_none() && cfg.run.resume == "never" && dir.join("metrics.jsonl").exists() {
        bail!("run directory {} already has metrics.jsonl; use run.resume = \"auto\" or another run.name", dir.display());
    }
    let (model, start, resumed_opt, reference) = match &resume {
        Some((ckpt, state)) => {
            tracing::info!("resuming from {}", ckpt.display());
            shaper
                .restore(&state.shaper)
                .with_context(|| format!("{}/state.json: shaper state", ckpt.display()))?;
            let m = Qwen3::load(ckpt, &dev, dtype)?;
            check_weights(&m, ckpt)?;
            let opt_path = ckpt.join("optimizer.safetensors");
            let bytes = std::fs::read(&opt_path)
                .with_context(|| format!("reading {}", opt_path.display()))?;
            let opt = AdamW::from_safetensors(cfg.optim.clone(), m.vars(), &bytes)
                .with_context(|| opt_path.display().to_string())?;
            let reference = load_reference(cfg, &dir, &dev, dtype)?;
            (m, state.step, Some(opt), reference)
        }
        None => {
            let m = init_model(cfg, &dev, dtype)?;
            check_weights(&m, &cfg.model.path)?;
            (m, 0, None, None)
        }
    };

    // Loaded and checked: from here on the run directory is written.
    let probe = dir.join(".write-test");
    std::fs::write(&probe, b"")
        .with_context(|| format!("run directory {} is not writable", dir.display()))?;
    std::fs::remove_file(&probe).ok();
    let resolved = toml::to_string_pretty(cfg).context("serialising the resolved config")?;
    terse_model::checkpoint::atomic_write(&dir.join("config.toml"), resolved.as_bytes())?;
    let (mut metrics, kept_evals) = MetricsWriter::open(
        &dir.join("metrics.jsonl"),
        match resume {
            Some(_) => Start::Resumed {
                start,
                steps: cfg.grpo.steps,
                eval_every: cfg.eval.every,
            },
            None => Start::Fresh,
        },
    )?;

    if resume.is_none() && cfg.sft.steps > 0 {
        sft(cfg, &model, &tok, &mut metrics)?;
    }
    let (mut opt, reference) = match resumed_opt {
        Some(opt) => (opt, reference),
        None => {
            let opt = AdamW::new(cfg.optim.clone(), model.vars())?;
            let state = TrainState {
                step: 0,
                shaper: shaper.state(),
                data_cursor: Some(0),
            };
            save_checkpoint(&dir, 0, &model, &opt, &state, &cfg.model.path)?;
            (opt, load_reference(cfg, &dir, &dev, dtype)?)
        }
    };
    let before = if start == 0 {
        let e = evaluate(cfg, &task, &model, &tok)?;
        metrics.write(&eval_line(0, &e))?;
        Some(e)
    } else {
        None
    };
    // A stop between the checkpoint of `start` and its evaluation line: write it now, as the
    // run that did not stop did.
    if crate::metrics::mid_run_eval(start, cfg.grpo.steps, cfg.eval.every)
        && !kept_evals.contains(&start)
    {
        let e = evaluate(cfg, &task, &model, &tok)?;
        metrics.write(&eval_line(start, &e))?;
    }

    let g = &cfg.grpo;
    let gen = rollout_params(cfg, &model, &tok)?;
    let mut cursor = resume
        .as_ref()
        .and_then(|(_, st)| st.data_cursor)
        .unwrap_or(start * g.prompts_per_step as u64);
    // A progress bar on a terminal (hidden otherwise) with the step's key figures.
    let bar = progress_bar("grpo", g.steps, start);
    for step in start..g.steps {
        // Rollout and scoring: G samples for each of this step's prompts from the data cursor.
        let t0 = Instant::now();
        let c = collect(cfg, &task, &model, &tok, &gen, step, cursor)?;
        cursor = c.cursor;
        let (prompts, samples, groups) = (&c.prompts, &c.samples, &c.groups);
        let t_rollout = t0.elapsed().as_secs_f64();

        // Shape and advantages.
        let t1 = Instant::now();
        let ctx = StepCtx {
            step,
            seed: cfg.run.seed,
        };
        let shaped = terse_reward::shape_scorable(groups, |gs| shaper.shape(gs, &ctx))?;
        if let Some((k, i)) = shaped
            .rewards
            .iter()
            .enumerate()
            .find_map(|(k, r)| r.iter().position(|x| !x.is_finite()).map(|i| (k, i)))
        {
            bail!(
                "step {step}: non-finite shaped reward {} (prompt {}, sample {i}); stopped before updating; {}",
                shaped.rewards[k][i],
                groups[k].prompt_id,
                crate::checkpoint::last_good(&dir)
            );
        }
        let adv = cfg.advantage.compute(groups, &shaped)?;
        let t_score = t1.elapsed().as_secs_f64();

        // Policy update: PPO epochs x mini-batches, each micro-batched with its global
        // aggregation weights, clipped, then one AdamW step.
        let t2 = Instant::now();
        let lr = g.schedule.lr_at(step);
        let seqs = sequences(prompts, samples, &adv.values, g.group_size);
        let up = policy_update(
            g,
            &model,
            reference.as_ref(),
            &mut opt,
            seqs,
            lr,
            step,
            &dir,
        )?;
        let st = &up.stats;
        let t_update = t2.elapsed().as_secs_f64();

        let ls = length_stats(groups);
        let n = samples.len() as f64;
        let rewards: Vec<f64> = shaped.rewards.iter().flatten().copied().collect();
        let tokens = c.generated_tokens;
        let entropy_tokens: usize = samples.iter().map(|s| s.entropy_tokens).sum();
        let mut line = json!({
            "phase": "grpo",
            "step": step,
            "reward": rewards.iter().sum::<f64>() / n,
            "accuracy": groups.iter().flat_map(|g| &g.samples).filter(|s| s.correct).count() as f64 / n,
            "format_ok": groups.iter().flat_map(|g| &g.samples).filter(|s| s.format_ok).count() as f64 / n,
            "len_mean": ls.mean, "len_min": ls.min, "len_max": ls.max,
            "len_correct": ls.mean_correct, "len_incorrect": ls.mean_incorrect,
            "truncated": ls.truncated_frac,
            "zero_std_groups": adv.zero_std_groups as f64 / groups.len() as f64,
            "clip_frac_low": st.clipped_low as f64 / st.tokens.max(1) as f64,
            "clip_frac_high": st.clipped_high as f64 / st.tokens.max(1) as f64,
            "kl": st.kl_sum / st.tokens.max(1) as f64,
            "logp_gap": up.logp_gap,
            "loss": up.loss,
            "grad_norm": up.grad_norm,
            "updates": up.updates,
            "lr": lr,
            "steps_mean": groups.iter().flat_map(|g| &g.samples).map(|s| s.steps as f64).sum::<f64>() / n,
            "entropy": samples.iter().map(|s| s.entropy_sum).sum::<f64>() / entropy_tokens.max(1) as f64,
            "judge_mean": samples.iter().map(|s| s.judge_count as f64).sum::<f64>() / n,
            "early_exit": samples.iter().filter(|s| s.finish == Finish::EarlyExit).count() as f64 / n,
            "rounds": c.rounds,
            "dropped_groups": c.dropped,
            "time": {"rollout_s": t_rollout, "score_s": t_score, "logprob_s": up.logprob_s, "update_s": t_update - up.logprob_s, "tokens_per_s": tokens as f64 / (t_rollout + t_update)},
        });
        for (k, v) in &shaped.diagnostics {
            line[k] = json!(v);
        }
        metrics.write(&line)?;
        bar.set_message(format!(
            "acc {:.2}  len {:.1}  reward {:.3}",
            line["accuracy"].as_f64().unwrap_or(0.0),
            ls.mean.unwrap_or(0.0),
            rewards.iter().sum::<f64>() / n
        ));
        bar.inc(1);

        let done = step + 1;
        if (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) || done == g.steps {
            save_checkpoint(
                &dir,
                done,
                &model,
                &opt,
                &TrainState {
                    step: done,
                    shaper: shaper.state(),
                    data_cursor: Some(cursor),
                },
                &cfg.model.path,
            )?;
            prune(&dir, cfg.checkpoint.keep_last)?;
        }
        if crate::metrics::mid_run_eval(done, g.steps, cfg.eval.every) {
            let e = evaluate(cfg, &task, &model, &tok)?;
            metrics.write(&eval_line(done, &e))?;
        }
    }
    bar.finish_and_clear();
    let after = evaluate(cfg, &task, &model, &tok)?;
    metrics.write(&eval_line(g.steps, &after))?;
    // The run is done and its metrics are on disk: a plot that cannot be drawn is a warning.
    if let Err(e) = crate::plot::plot_run(&dir.join("metrics.jsonl"), &dir) {
        tracing::warn!("{e:#}");
    }
    let grpo = crate::metrics::read_grpo(&dir.join("metrics.jsonl"))?;
    let col = |k: &str| -> Vec<f64> { grpo.iter().filter_map(|l| l[k].as_f64()).collect() };
    let (lens, rewards) = (col("len_mean"), col("reward"));
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

/// The KL reference (step 0's weights) when `grpo.kl_coef > 0`.
fn load_reference(
    cfg: &RunConfig,
    dir: &Path,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
) -> Result<Option<Qwen3>> {
    if cfg.grpo.kl_coef <= 0.0 {
        return Ok(None);
    }
    let path = dir.join(crate::checkpoint::step_name(0));
    let m = Qwen3::load(&path, dev, dtype)
        .with_context(|| format!("loading the KL reference {}", path.display()))?;
    Ok(Some(m))
}

/// Starting weights with a NaN or an infinity are an error naming where they came from.
fn check_weights(model: &Qwen3, source: &Path) -> Result<()> {
    if let Some(name) = model.first_non_finite()? {
        bail!(
            "the weights loaded from {} hold non-finite values (first: {name})",
            source.display()
        );
    }
    Ok(())
}

fn eval_line(step: u64, e: &EvalReport) -> serde_json::Value {
    json!({"phase": "eval", "step": step, "accuracy": e.accuracy, "len_mean": e.len_mean, "by_level": e.by_level})
}

/// A shaper whose state (if any) the trainer checkpoints.
pub trait ShaperWithState: LengthShaper {
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Restores what `state` saved; an error (a state that does not deserialise) stops the
    /// resume, since continuing with a default state would break "resume equals not stopping".
    fn restore(&mut self, _state: &serde_json::Value) -> Result<()> {
        Ok(())
    }
}

impl<F: FnMut(&[Group], &StepCtx) -> terse_reward::Shaped> ShaperWithState for F {}

impl ShaperWithState for BuiltinShaper {
    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.state).unwrap_or_default()
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<()> {
        self.state = serde_json::from_value(state.clone())
            .map_err(|e| anyhow::anyhow!("not a built-in shaper state: {e}"))?;
        Ok(())
    }
}
