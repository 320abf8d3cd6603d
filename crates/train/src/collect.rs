//! One GRPO step's experience: items from the data cursor -> G samples each (with Step-GRPO's
//! truncated rollout when configured) -> scores and step counts -> `Group`s, with DAPO's dynamic
//! sampling dropping all-equal groups and refilling. The loop in run.rs shapes and trains on it.

use crate::config::RunConfig;
use crate::load::encode;
use crate::task::{Item, Task};
use anyhow::Result;
use terse_model::Qwen3;
use terse_reward::step_grpo::{count_steps, StepScope};
use terse_reward::{Group, SampleStat};
use terse_rollout::{generate_with_stats, Finish, GenParams, Prompt, Sample};

/// The groups a step trains on.
#[derive(Debug, Clone)]
pub struct Collected {
    pub prompts: Vec<Prompt>,
    /// G samples per prompt, prompt-major.
    pub samples: Vec<Sample>,
    pub groups: Vec<Group>,
    /// The data cursor after this step.
    pub cursor: u64,
    /// Rollout rounds (1 without dynamic sampling) and groups dropped for all-equal rewards.
    pub rounds: usize,
    pub dropped: usize,
    /// Samples generated in all rounds (for tokens/s).
    pub generated_tokens: usize,
    /// The rollouts' peak KV memory (bytes, the largest round) and preemptions (all rounds).
    pub kv_peak_bytes: usize,
    pub preemptions: usize,
}

/// The sampling settings of training rollouts: evaluation's plus Step-GRPO's early exit, its
/// induction and close texts tokenized here.
pub fn rollout_params(
    cfg: &RunConfig,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
) -> Result<GenParams> {
    let mut gen = crate::eval::gen_params(cfg, model);
    if let Some(se) = &cfg.grpo.step_exit {
        let mut se = se.clone();
        se.resolve(|text| encode(tok, text))?;
        gen.step_exit = Some(se);
    }
    Ok(gen)
}

/// Rolls out, scores and (with dynamic sampling) filters until the step has
/// `prompts_per_step` informative groups or the round cap is reached.
pub fn collect(
    cfg: &RunConfig,
    task: &Task,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
    gen: &GenParams,
    step: u64,
    mut cursor: u64,
) -> Result<Collected> {
    let g = &cfg.grpo;
    let detok = |ids: &[u32]| tok.decode(ids, false).unwrap_or_default();
    let max_rounds = 1 + g.dynamic_sampling.map_or(0, |d| d.max_rounds);
    let mut out = Collected {
        prompts: vec![],
        samples: vec![],
        groups: vec![],
        cursor,
        rounds: 0,
        dropped: 0,
        generated_tokens: 0,
        kv_peak_bytes: 0,
        preemptions: 0,
    };
    let mut last_round = vec![];
    while out.rounds < max_rounds && out.groups.len() < g.prompts_per_step {
        let need = g.prompts_per_step - out.groups.len();
        let items: Vec<Item> = (cursor..cursor + need as u64)
            .map(|i| task.train_item(i))
            .collect::<Result<_>>()?;
        // Prompt ids are data-cursor indices: unique across the run, so sample streams are too.
        let prompts: Vec<Prompt> = items
            .iter()
            .zip(cursor..)
            .map(|(it, id)| {
                Ok(Prompt {
                    id,
                    tokens: encode(tok, &it.prompt)?,
                })
            })
            .collect::<Result<_>>()?;
        cursor += need as u64;
        let (samples, used) = generate_with_stats(
            model,
            &prompts,
            g.group_size,
            gen,
            crate::data::mix(cfg.run.seed, crate::data::TRAIN, step),
            &detok,
        )?;
        out.kv_peak_bytes = out.kv_peak_bytes.max(used.peak_bytes());
        out.preemptions += used.preemptions;
        out.generated_tokens += samples.iter().map(|s| s.tokens.len()).sum::<usize>();
        out.rounds += 1;
        let mut round = vec![];
        let mut samples = samples.into_iter();
        for (p, it) in prompts.into_iter().zip(&items) {
            let group: Vec<Sample> = samples.by_ref().take(g.group_size).collect();
            let stats = group
                .iter()
                .map(|s| {
                    let text = detok(&s.tokens);
                    let v = task.score(it, &text);
                    SampleStat {
                        len: s.len(),
                        correct: v.correct,
                        base_reward: v.base_reward,
                        format_ok: v.format_ok,
                        steps: count_steps(&text, &g.step_triggers, StepScope::Thinking),
                        truncated: s.finish == Finish::Length,
                        scorable: true,
                    }
                })
                .collect();
            round.push((Group::new(p.id, stats), p, group));
        }
        let keep_all = g.dynamic_sampling.is_none();
        // Only the last round's dropped groups can be needed again (see below).
        last_round.clear();
        for (group, p, s) in round {
            let informative = group
                .samples
                .iter()
                .any(|x| x.base_reward != group.samples[0].base_reward);
            if keep_all || informative {
                out.groups.push(group);
                out.prompts.push(p);
                out.samples.extend(s);
            } else {
                out.dropped += 1;
                last_round.push((group, p, s));
            }
        }
    }
    // Nothing informative within the cap: train on the last round (its advantages are zero,
    // so only the KL term acts), rather than skipping the step and desynchronising schedules.
    if out.groups.is_empty() {
        for (group, p, s) in last_round {
            out.groups.push(group);
            out.prompts.push(p);
            out.samples.extend(s);
        }
    }
    out.cursor = cursor;
    Ok(out)
}
