//! Validation on the task's held-out problems: accuracy (pass@1 over n samples, and pass@n) and
//! mean completion length and reflections, overall and by level. The trainer's validation and
//! `cargo xtask eval` call [`evaluate`]; the protocol evaluation (protocol.rs: R1 sampling,
//! token budgets, efficiency metrics) reuses its sampling and per-level aggregation.

pub(crate) mod budget;
pub(crate) mod metrics;
pub(crate) mod protocol;
pub(crate) mod table;

use crate::config::RunConfig;
use crate::data;
use crate::load::encode;
use crate::report::{EvalReport, LevelReport};
use crate::step::collect::gen_params;
use crate::task::{Item, Task};
use anyhow::Result;
use terse_model::Qwen3;
use terse_reward::metrics::pass_at_k;
use terse_reward::step_grpo::{count_steps, StepScope};
use terse_rollout::{generate, GenParams, Prompt, Sample};

/// One level's items with their prompts and completions (`n` per item, item-major), as
/// [`evaluate`] samples them; the protocol evaluation (eval_protocol.rs) reads the same.
pub struct LevelSamples {
    pub level: usize,
    pub items: Vec<Item>,
    pub prompts: Vec<Prompt>,
    pub samples: Vec<Sample>,
}

/// Samples `n` completions of every evaluation item of `task` with `gen`, level by level; each
/// level's draws come from its own seed, so a level's samples do not depend on the others.
pub fn sample_levels(
    cfg: &RunConfig,
    task: &Task,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
    gen: &GenParams,
    n: usize,
) -> Result<Vec<LevelSamples>> {
    let detok = |ids: &[u32]| tok.decode(ids, false).unwrap_or_default();
    task.eval_items(cfg.eval.per_level)?
        .into_iter()
        .map(|(level, items)| {
            let prompts: Vec<Prompt> = items
                .iter()
                .enumerate()
                .map(|(j, it)| {
                    Ok(Prompt {
                        id: j as u64,
                        tokens: encode(tok, &it.prompt)?,
                    })
                })
                .collect::<Result<_>>()?;
            let samples = generate(
                model,
                &prompts,
                n,
                gen,
                data::mix(cfg.run.seed, data::EVAL, level as u64),
                &detok,
            )?;
            Ok(LevelSamples {
                level,
                items,
                prompts,
                samples,
            })
        })
        .collect()
}

/// Each completion of a level as text, with the task's verdict (item-major, as the samples).
pub fn verdicts(
    task: &Task,
    level: &LevelSamples,
    n: usize,
    tok: &tokenizers::Tokenizer,
) -> Vec<(String, bool)> {
    level
        .items
        .iter()
        .zip(level.samples.chunks(n))
        .flat_map(|(it, group)| {
            group.iter().map(move |s| {
                let text = tok.decode(&s.tokens, false).unwrap_or_default();
                let ok = task.score(it, &text).correct;
                (text, ok)
            })
        })
        .collect()
}

/// pass@1, pass@n, mean length and reflections (the run's `grpo.step_triggers` before
/// `</think>`) of one level from its verdicts.
pub fn level_report(
    level: &LevelSamples,
    verdicts: &[(String, bool)],
    n: usize,
    triggers: &[String],
) -> LevelReport {
    let (mut p1, mut pk, mut len, mut refl) = (0.0, 0.0, 0.0, 0.0);
    let mut examples = vec![];
    for (group, verdicts) in level.samples.chunks(n).zip(verdicts.chunks(n)) {
        let c = verdicts.iter().filter(|v| v.1).count();
        refl += verdicts
            .iter()
            .map(|(text, _)| (count_steps(text, triggers, StepScope::Thinking) - 1) as f64)
            .sum::<f64>()
            / n as f64;
        if examples.len() < 3 {
            examples.push(verdicts[0].clone());
        }
        p1 += pass_at_k(n, c, 1);
        pk += pass_at_k(n, c, n);
        len += group.iter().map(|s| s.len() as f64).sum::<f64>() / n as f64;
    }
    let m = level.items.len().max(1) as f64;
    LevelReport {
        level: level.level,
        pass1: p1 / m,
        pass_k: pk / m,
        len_mean: len / m,
        reflections_mean: refl / m,
        examples,
    }
}

/// The report of the levels: accuracy and length averaged over levels.
pub fn summarize(by_level: Vec<LevelReport>) -> EvalReport {
    let k = by_level.len().max(1) as f64;
    EvalReport {
        accuracy: by_level.iter().map(|l| l.pass1).sum::<f64>() / k,
        len_mean: by_level.iter().map(|l| l.len_mean).sum::<f64>() / k,
        by_level,
    }
}

/// Samples `eval.samples` completions for every evaluation item of `task` and reports
/// pass@1, pass@n and mean length, by level and averaged over levels.
pub fn evaluate(
    cfg: &RunConfig,
    task: &Task,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
) -> Result<EvalReport> {
    let n = cfg.eval.samples.max(1);
    let levels = sample_levels(cfg, task, model, tok, &gen_params(cfg, model), n)?;
    Ok(summarize(
        levels
            .iter()
            .map(|l| level_report(l, &verdicts(task, l, n, tok), n, &cfg.grpo.step_triggers))
            .collect(),
    ))
}
