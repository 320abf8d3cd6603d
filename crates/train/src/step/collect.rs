//! One GRPO step's experience: items from the data cursor -> G samples each (with Step-GRPO's
//! truncated rollout when configured) -> scores and step counts -> `Group`s, with DAPO's dynamic
//! sampling dropping all-equal groups and refilling. The trainer (trainer.rs) shapes and trains on
//! it.
//!
//! Data parallel (a `Collective` of N ranks): rank r generates every N-th group of each round
//! (a sample depends only on seed, prompt id and sample index, so the split changes no
//! sample), and the ranks all-gather the per-sample statistics, never the tokens: every rank
//! sees the whole step's `Group`s (the shapers' batch accuracy, GRPO-λ's ranking, dynamic
//! sampling's refill decide alike everywhere) and holds the tokens of its own groups only.

use crate::config::RunConfig;
use crate::load::encode;
use crate::task::{Item, Task};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_reward::step_grpo::{count_steps, StepScope};
use terse_reward::ScoreFault;
use terse_reward::{Group, SampleStat};
use terse_rollout::{generate_with_stats, Finish, GenParams, Prompt, Sample};

/// The groups a step trains on.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Every group's prompt, in group order.
    pub prompts: Vec<Prompt>,
    /// G samples per held group (prompt-major, in `held` order): on one process every group's.
    pub samples: Vec<Sample>,
    /// The indices (into `groups` and `prompts`, ascending) of the groups whose samples this
    /// rank generated and trains on: all of them on one process.
    pub held: Vec<usize>,
    pub groups: Vec<Group>,
    /// What the update and the metrics need of every sample of every group (prompt-major),
    /// held here or not.
    pub extras: Vec<SampleExtra>,
    /// The data cursor after this step.
    pub cursor: u64,
    /// Rollout rounds (1 without dynamic sampling) and groups dropped for all-equal rewards.
    pub rounds: usize,
    pub dropped: usize,
    /// Samples generated in all rounds, on all ranks (for tokens/s).
    pub generated_tokens: usize,
    /// The rollouts' peak KV memory (bytes, the largest round of any rank) and preemptions
    /// (all rounds, all ranks).
    pub kv_peak_bytes: usize,
    pub preemptions: usize,
    /// Completions scored without a verdict (all rounds, all ranks, dropped groups too): the
    /// math verifier's budget refused the answer, or the scorer panicked.
    pub faults: Faults,
}

/// Scoring faults of a step, by kind (`Outcome::fault`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    pub budget_exceeded: usize,
    pub panics: usize,
}

impl Faults {
    fn count(&mut self, fault: Option<ScoreFault>) {
        match fault {
            Some(ScoreFault::BudgetExceeded) => self.budget_exceeded += 1,
            Some(ScoreFault::Panicked) => self.panics += 1,
            None => {}
        }
    }

    fn add(&mut self, other: Faults) {
        self.budget_exceeded += other.budget_exceeded;
        self.panics += other.panics;
    }
}

/// One sample's figures beyond its [`SampleStat`]: its loss tokens (for the global aggregation
/// weights) and the sampler's diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleExtra {
    pub loss_tokens: usize,
    pub entropy_sum: f64,
    pub entropy_tokens: usize,
    pub judge_count: usize,
    pub early_exit: bool,
    /// The model's context limit (`max_position_embeddings`) stopped it before
    /// `max_new_tokens`.
    #[serde(default)]
    pub context_cut: bool,
}

impl SampleExtra {
    fn of(s: &Sample, max_new_tokens: usize) -> Self {
        Self {
            loss_tokens: s.sampled.iter().filter(|&&m| m).count(),
            entropy_sum: s.entropy_sum,
            entropy_tokens: s.entropy_tokens,
            judge_count: s.judge_count,
            early_exit: s.finish == Finish::EarlyExit,
            context_cut: s.finish == Finish::Length && s.tokens.len() < max_new_tokens,
        }
    }
}

/// One group of a round: its statistics, its samples' extras and, when this rank generated it,
/// its samples.
type Slot = (Group, Vec<SampleExtra>, Option<Vec<Sample>>);

/// What a rank sends of its share of one round.
#[derive(Serialize, Deserialize)]
struct Share {
    /// (group index within the round, its statistics, its samples' extras).
    groups: Vec<(usize, Group, Vec<SampleExtra>)>,
    generated_tokens: usize,
    kv_peak_bytes: usize,
    preemptions: usize,
    /// This rank's scoring faults in the round.
    #[serde(default)]
    faults: Faults,
}

/// The sampling settings of the run's rollouts, training's and validation's alike (eval.rs
/// and eval_protocol.rs call it): `[grpo]`'s sampling, token limit, KV cache and paging.
pub fn gen_params(cfg: &RunConfig, model: &Qwen3) -> GenParams {
    let mut p = GenParams::new(cfg.grpo.max_new_tokens);
    p.sampling = cfg.grpo.sampling.clone();
    p.eos_ids = model.config.eos_token_ids.clone();
    p.pad_id = model.config.pad_token_id.unwrap_or(0);
    p.kv_cache = cfg.grpo.kv_cache;
    p.paging = cfg.grpo.paging.clone();
    p
}

/// The sampling settings of training rollouts: [`gen_params`] plus Step-GRPO's early exit at
/// the run's `grpo.step_triggers`, its induction and close texts tokenized here.
pub fn rollout_params(
    cfg: &RunConfig,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
) -> Result<GenParams> {
    let mut gen = gen_params(cfg, model);
    if let Some(mut se) = cfg.grpo.step_exit() {
        se.resolve(|text| encode(tok, text))?;
        gen.step_exit = Some(se);
    }
    Ok(gen)
}

/// Rolls out, scores and (with dynamic sampling) filters until the step has
/// `prompts_per_step` informative groups or the round cap is reached. With `dp`, this rank
/// generates its share of each round and the statistics are all-gathered (module doc).
#[allow(clippy::too_many_arguments)]
pub fn collect(
    cfg: &RunConfig,
    task: &Task,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
    gen: &GenParams,
    step: u64,
    mut cursor: u64,
    mut dp: Option<&mut dyn Collective>,
) -> Result<Collected> {
    let g = &cfg.grpo;
    let (rank, world) = dp.as_ref().map_or((0, 1), |c| (c.rank(), c.world()));
    let max_rounds = 1 + g.dynamic_sampling.map_or(0, |d| d.max_rounds);
    let mut out = Collected::empty(cursor);
    let mut last_round = vec![];
    while out.rounds < max_rounds && out.groups.len() < g.prompts_per_step {
        let need = g.prompts_per_step - out.groups.len();
        let (items, prompts) = round_prompts(task, tok, cursor, need)?;
        cursor += need as u64;
        // This rank's share of the round: every world-th group from its rank.
        let mine: Vec<usize> = (rank..need).step_by(world).collect();
        let ctx = RoundCtx {
            cfg,
            task,
            model,
            tok,
            gen,
            step,
        };
        let (share, my_samples) = generate_share(&ctx, &items, &prompts, &mine)?;
        let shares = match dp.as_deref_mut() {
            Some(c) if world > 1 => gather_shares(c, &share)?,
            _ => vec![share],
        };
        let round = out.assemble_round(shares, my_samples, rank, need)?;
        out.rounds += 1;
        // Only the last round's dropped groups can be needed again (see below).
        last_round = out.keep_informative(cfg, round, prompts)?;
    }
    // Nothing informative within the cap: train on the last round (its advantages are zero,
    // so only the KL term acts), rather than skipping the step and desynchronising schedules.
    if out.groups.is_empty() {
        for (slot, p) in last_round {
            out.push(slot, p);
        }
    }
    out.cursor = cursor;
    Ok(out)
}

/// What generating and scoring a rank's share of a round reads.
struct RoundCtx<'a> {
    cfg: &'a RunConfig,
    task: &'a Task,
    model: &'a Qwen3,
    tok: &'a tokenizers::Tokenizer,
    gen: &'a GenParams,
    step: u64,
}

/// The round's `need` items from the data cursor on, with their prompts. Prompt ids are
/// data-cursor indices: unique across the run, so sample streams are too.
fn round_prompts(
    task: &Task,
    tok: &tokenizers::Tokenizer,
    cursor: u64,
    need: usize,
) -> Result<(Vec<Item>, Vec<Prompt>)> {
    let items: Vec<Item> = (cursor..cursor + need as u64)
        .map(|i| task.train_item(i))
        .collect::<Result<_>>()?;
    let prompts = items
        .iter()
        .zip(cursor..)
        .map(|(it, id)| {
            Ok(Prompt {
                id,
                tokens: encode(tok, &it.prompt)?,
            })
        })
        .collect::<Result<_>>()?;
    Ok((items, prompts))
}

/// Generates the groups `mine` (indices into the round) and scores them: this rank's share of
/// the round, and the samples it holds, group by group.
fn generate_share(
    ctx: &RoundCtx,
    items: &[Item],
    prompts: &[Prompt],
    mine: &[usize],
) -> Result<(Share, Vec<Vec<Sample>>)> {
    let g = &ctx.cfg.grpo;
    let detok = |ids: &[u32]| ctx.tok.decode(ids, false).unwrap_or_default();
    let my_prompts: Vec<Prompt> = mine.iter().map(|&j| prompts[j].clone()).collect();
    let (samples, used) = generate_with_stats(
        ctx.model,
        &my_prompts,
        g.group_size,
        ctx.gen,
        crate::data::mix(ctx.cfg.run.seed, crate::data::TRAIN, ctx.step),
        &detok,
    )?;
    let mut share = Share {
        groups: vec![],
        generated_tokens: samples.iter().map(|s| s.tokens.len()).sum(),
        kv_peak_bytes: used.peak_bytes(),
        preemptions: used.preemptions,
        faults: Faults::default(),
    };
    let mut my_samples: Vec<Vec<Sample>> = vec![];
    let mut samples = samples.into_iter();
    for (&j, p) in mine.iter().zip(&my_prompts) {
        let group: Vec<Sample> = samples.by_ref().take(g.group_size).collect();
        let stats = group
            .iter()
            .map(|s| score_sample(ctx, &items[j], s, &detok(&s.tokens), &mut share.faults))
            .collect();
        let extras = group
            .iter()
            .map(|s| SampleExtra::of(s, ctx.gen.max_new_tokens))
            .collect();
        share.groups.push((j, Group::new(p.id, stats), extras));
        my_samples.push(group);
    }
    Ok((share, my_samples))
}

/// One sample's statistics: the task's verdict (a fault counted in `faults`) and its steps at
/// the run's trigger words.
fn score_sample(
    ctx: &RoundCtx,
    item: &Item,
    s: &Sample,
    text: &str,
    faults: &mut Faults,
) -> SampleStat {
    let v = ctx.task.score(item, text);
    faults.count(v.fault);
    let mut stat = SampleStat {
        len: s.len(),
        correct: v.correct,
        base_reward: v.base_reward,
        format_ok: v.format_ok,
        steps: count_steps(text, &ctx.cfg.grpo.step_triggers, StepScope::Thinking),
        truncated: s.finish == Finish::Length,
        scorable: true,
    };
    // Research code's weighted per-completion rewards, before any shaping.
    stat.base_reward = ctx.task.completion_reward(text, &item.answer, &stat);
    stat
}

impl Collected {
    fn empty(cursor: u64) -> Self {
        Self {
            prompts: vec![],
            samples: vec![],
            held: vec![],
            groups: vec![],
            extras: vec![],
            cursor,
            rounds: 0,
            dropped: 0,
            generated_tokens: 0,
            kv_peak_bytes: 0,
            preemptions: 0,
            faults: Faults::default(),
        }
    }

    /// The round's groups in order, each with its extras and (if held here) its samples, from
    /// every rank's share; the shares' counters are added to the step's.
    fn assemble_round(
        &mut self,
        shares: Vec<Share>,
        my_samples: Vec<Vec<Sample>>,
        rank: usize,
        need: usize,
    ) -> Result<Vec<Option<Slot>>> {
        let mut round: Vec<Option<Slot>> = (0..need).map(|_| None).collect();
        let mut my_samples = my_samples.into_iter();
        for (r, sh) in shares.into_iter().enumerate() {
            self.generated_tokens += sh.generated_tokens;
            self.kv_peak_bytes = self.kv_peak_bytes.max(sh.kv_peak_bytes);
            self.preemptions += sh.preemptions;
            self.faults.add(sh.faults);
            for (j, group, extras) in sh.groups {
                let held = (r == rank).then(|| my_samples.next()).flatten();
                match round.get_mut(j) {
                    Some(slot @ None) => *slot = Some((group, extras, held)),
                    _ => anyhow::bail!(
                        "rank {r} sent group {j} of a round of {need} twice or out of range"
                    ),
                }
            }
        }
        Ok(round)
    }

    /// Keeps the round's informative groups (all of them without dynamic sampling), after
    /// DLER's and ThinkPrune's truncation rule; returns the dropped ones.
    fn keep_informative(
        &mut self,
        cfg: &RunConfig,
        round: Vec<Option<Slot>>,
        prompts: Vec<Prompt>,
    ) -> Result<Vec<(Slot, Prompt)>> {
        let g = &cfg.grpo;
        let keep_all = g.dynamic_sampling.is_none();
        let mut dropped = vec![];
        for (j, (slot, p)) in round.into_iter().zip(prompts).enumerate() {
            let (mut group, extras, held) =
                slot.with_context(|| format!("no rank sent group {j} of the round"))?;
            // DLER's and ThinkPrune's truncation rule, before dynamic sampling judges the group.
            if g.zero_truncated() {
                group.score_truncated_as_zero();
            }
            let informative = group
                .samples
                .iter()
                .any(|x| x.base_reward != group.samples[0].base_reward);
            if keep_all || informative {
                self.push((group, extras, held), p);
            } else {
                self.dropped += 1;
                dropped.push(((group, extras, held), p));
            }
        }
        Ok(dropped)
    }

    fn push(&mut self, (group, extras, held): Slot, p: Prompt) {
        if let Some(s) = held {
            self.held.push(self.groups.len());
            self.samples.extend(s);
        }
        self.groups.push(group);
        self.prompts.push(p);
        self.extras.extend(extras);
    }
}

/// Every rank's share of a round, in rank order.
fn gather_shares(c: &mut dyn Collective, mine: &Share) -> Result<Vec<Share>> {
    let rank = c.rank();
    let bytes = serde_json::to_vec(mine)?;
    c.all_gather_bytes(bytes)
        .with_context(|| format!("rank {rank}: gathering the rollout statistics"))?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice(b).with_context(|| format!("rank {r}'s rollout statistics"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fault counts travel with a rank's share of a round (so every rank's metrics count the
    /// whole step's), and a share from a rank without them reads as none.
    #[test]
    fn fault_counts_survive_the_gather() {
        let mut faults = Faults::default();
        for f in [
            Some(ScoreFault::BudgetExceeded),
            None,
            Some(ScoreFault::Panicked),
        ] {
            faults.count(f);
        }
        faults.count(Some(ScoreFault::BudgetExceeded));
        let share = Share {
            groups: vec![],
            generated_tokens: 3,
            kv_peak_bytes: 0,
            preemptions: 0,
            faults,
        };
        let back: Share =
            serde_json::from_slice(&serde_json::to_vec(&share).expect("json")).expect("back");
        let mut sum = Faults::default();
        sum.add(back.faults);
        sum.add(back.faults);
        assert_eq!((sum.budget_exceeded, sum.panics), (4, 2));
        let old: Share = serde_json::from_str(
            r#"{"groups": [], "generated_tokens": 1, "kv_peak_bytes": 0, "preemptions": 0}"#,
        )
        .expect("a share without faults");
        assert_eq!(old.faults, Faults::default());
    }
}
