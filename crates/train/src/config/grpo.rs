//! `[grpo]`: the GRPO loop's section (rollout, loss, length methods' switches) with its
//! defaults and the closed enums that spell its string values; mod.rs assembles it into
//! `RunConfig`, length.rs reads the length methods' keys.

use super::Chosen;
use serde::{Deserialize, Deserializer, Serialize};
use terse_optim::Schedule;
use terse_rollout::{KvCacheDtype, KvPaging, SamplingParams, StepExit};

/// How per-token losses become one number (verl's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    TokenMean,
    SeqMeanTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenSumNorm,
}

/// KL estimator against the reference policy (Schulman's k1, k2, k3 = verl's low_var_kl).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    K1,
    K2,
    K3,
}

/// The policy loss of the update (docs/methods.md, Policy losses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyLossKind {
    /// PPO-clip on each token's ratio (GRPO, DAPO).
    #[default]
    Ppo,
    /// GSPO: the sequence-level ratio (the geometric mean of the token ratios), clipped per
    /// sequence.
    Gspo,
    /// GSPO-token: GSPO's clipped sequence ratio with a per-token gradient path.
    GspoToken,
}

/// What rollout correction does with the sampler/trainer importance ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionMethod {
    /// Truncated importance sampling: the weight is min(ratio, cap).
    Tis,
    /// Masked importance sampling: the weight is the ratio, or 0 above the cap.
    Mis,
}

/// Where the ratio is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionLevel {
    /// Each token's own ratio.
    #[default]
    Token,
    /// The product of the sequence's token ratios, for every token of the sequence.
    Sequence,
}

/// Rollout correction: the trainer recomputes the old policy's log-probs, runs PPO against
/// them, and weights each token's policy-gradient term by the truncated (or masked)
/// trainer/sampler importance ratio (docs/methods.md, Rollout correction).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutCorrection {
    /// "tis" (truncate at the cap) or "mis" (drop above the cap).
    pub method: CorrectionMethod,
    /// The cap on the ratio (> 1).
    #[serde(default = "default_cap")]
    pub cap: f64,
    /// "token" or "sequence".
    #[serde(default)]
    pub level: CorrectionLevel,
}

fn default_cap() -> f64 {
    2.0
}

/// `grpo.loss_params`: a table, or one line saying that it must be.
fn loss_params<'de, D: Deserializer<'de>>(d: D) -> Result<Option<toml::Table>, D::Error> {
    match toml::Value::deserialize(d)? {
        toml::Value::Table(t) => Ok(Some(t)),
        v => Err(serde::de::Error::custom(format!(
            "grpo.loss_params must be a table of the loss's parameters, got {v}"
        ))),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoSection {
    /// GRPO steps.
    pub steps: u64,
    /// Passes over `data.train` instead of `steps`: steps = ⌈epochs · rows / prompts_per_step⌉
    /// (the papers' "epochs"); needs a dataset file.
    pub data_epochs: Option<f64>,
    /// Prompts (groups) per step.
    pub prompts_per_step: usize,
    /// G: completions sampled per prompt.
    pub group_size: usize,
    /// The longest completion, in tokens.
    pub max_new_tokens: usize,
    /// Rollout sampling: temperature, top_k (0 = off), top_p, min_p.
    pub sampling: SamplingParams,
    /// What the rollout's KV cache stores: "model" (the compute dtype, exact) or "f16".
    pub kv_cache: KvCacheDtype,
    /// The rollout's paged KV cache: block size, memory budget, sequences at once, prefill
    /// chunk (`[grpo.paging]`).
    pub paging: KvPaging,
    /// The GRPO learning-rate schedule (as `sft.schedule`).
    pub schedule: Schedule,
    /// PPO's lower clip ε (the ratio is kept above 1 − ε).
    pub clip_low: f64,
    /// PPO's upper clip (DAPO's clip-higher: 0.28).
    pub clip_high: f64,
    /// Dual-clip constant c (> 1) bounding the loss of negative advantages; None = off.
    pub dual_clip: Option<f64>,
    /// The policy loss: "ppo", "gspo" or "gspo-token", or a registered one by its name (its parameters: `[grpo.loss_params]`).
    pub loss: Chosen<PolicyLossKind>,
    /// A registered loss's parameters, the table its factory gets; refused with a built-in loss.
    #[serde(deserialize_with = "loss_params")]
    pub loss_params: Option<toml::Table>,
    /// GSPO's clip of the sequence ratio below 1 (the paper's 3e-4).
    pub gspo_clip_low: f64,
    /// GSPO's clip of the sequence ratio above 1 (the paper's 4e-4).
    pub gspo_clip_high: f64,
    /// Weight the loss by the sampler/trainer importance ratio (`{ method = "tis", cap = 2.0,
    /// level = "token" }`); absent = off.
    pub rollout_correction: Option<RolloutCorrection>,
    /// |log ratio| is clamped to this before exponentiating.
    pub log_ratio_clamp: f64,
    /// β; 0 loads no reference model.
    pub kl_coef: f64,
    /// "k1", "k2" or "k3" (Schulman's estimators; k3 is verl's low_var_kl).
    pub kl_estimator: KlEstimator,
    /// How per-token losses become one number: "token-mean", "seq-mean-token-mean",
    /// "seq-mean-token-sum" or "seq-mean-token-sum-norm" (Dr.GRPO).
    pub loss_agg: LossAgg,
    /// The constant length of `seq-mean-token-sum-norm` (Dr.GRPO); default max_new_tokens.
    pub norm_len: Option<usize>,
    /// Groups per optimizer update (verl's ppo_mini_batch_size, in prompts); unset = one update
    /// on the whole step.
    pub mini_batch_prompts: Option<usize>,
    /// Passes over the step's mini-batches (verl's ppo_epochs).
    pub epochs: usize,
    /// Tokens per micro-batch (gradient accumulation keeps the loss identical).
    pub micro_batch_tokens: usize,
    /// Pack a micro-batch's sequences into one row (no padding; positions restart, attention
    /// stays inside each sequence) when the attention is flash; else rows are padded.
    pub packing: bool,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// Step-GRPO's dynamic truncated rollout (docs/methods.md, Step-GRPO); absent = plain sampling.
    /// It exits at `step_triggers` (it has no trigger key of its own).
    pub step_exit: Option<StepExit>,
    /// Trigger words (docs/methods.md, Step-GRPO): the one list for Step-GRPO's step count and
    /// reward, the `steps_mean` metric, `grpo.step_exit`'s exits and eval's reflections.
    pub step_triggers: Vec<String>,
    /// DAPO's dynamic sampling: drop groups whose rewards are all equal and refill the step
    /// with new prompts, at most `max_rounds` extra rollouts; absent = off.
    pub dynamic_sampling: Option<DynamicSampling>,
    /// How a truncated completion (cut at the token limit, no end token) is scored:
    /// "verifier" (its verdict, like any other) or "zero" (reward 0 and wrong whatever the
    /// verifier says: DLER's and ThinkPrune's truncation penalty; `think_prune` implies it).
    pub truncated_reward: TruncatedReward,
    /// ThinkPrune (docs/methods.md, ThinkPrune): the rollout's token limit by round, a truncated
    /// completion scored 0; absent = `max_new_tokens` at every step.
    pub think_prune: Option<ThinkPrune>,
    /// GFPO (docs/methods.md, GFPO): of each prompt's `group_size` samples keep the `keep` best
    /// by `metric` and train on them alone; absent = off.
    pub gfpo: Option<Gfpo>,
}

/// `grpo.truncated_reward`: the verdict of a completion the token limit cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncatedReward {
    /// The verifier's verdict, like any other completion.
    #[default]
    Verifier,
    /// Base reward 0 and wrong: its answer was cut off with the rest.
    Zero,
}

/// `[grpo.think_prune]`: round r (from 0) of `steps_per_round` steps samples at most
/// `limits[r]` tokens; the last limit holds after the last round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkPrune {
    /// The token limit of each round, each at most the previous and `grpo.max_new_tokens`
    /// (the paper's 4096, 3072, 2048 for DeepSeek-R1-Distill-Qwen-1.5B).
    pub limits: Vec<usize>,
    /// GRPO steps per round (> 0).
    pub steps_per_round: u64,
}

/// `[grpo.gfpo]`: GFPO's group filter; `grpo.group_size` is the G' sampled per prompt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gfpo {
    /// k, the samples kept per prompt (2 <= k < group_size).
    pub keep: usize,
    /// What ranks them: "length" (shortest first) or "reward_per_token" (reward / length,
    /// highest first).
    #[serde(default)]
    pub metric: terse_reward::gfpo::GfpoMetric,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicSampling {
    /// Extra rollout rounds per step before training on the groups kept so far.
    pub max_rounds: usize,
}

impl Default for GrpoSection {
    fn default() -> Self {
        Self {
            steps: 60,
            data_epochs: None,
            prompts_per_step: 8,
            group_size: 8,
            max_new_tokens: 96,
            sampling: SamplingParams::default(),
            kv_cache: KvCacheDtype::Model,
            paging: KvPaging::default(),
            schedule: Schedule {
                peak_lr: 2e-4,
                ..Schedule::default()
            },
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: Some(3.0),
            loss: Chosen::Builtin(PolicyLossKind::Ppo),
            loss_params: None,
            gspo_clip_low: 3e-4,
            gspo_clip_high: 4e-4,
            rollout_correction: None,
            log_ratio_clamp: 20.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            loss_agg: LossAgg::TokenMean,
            norm_len: None,
            mini_batch_prompts: None,
            epochs: 1,
            micro_batch_tokens: 4096,
            packing: true,
            grad_clip: 1.0,
            step_exit: None,
            step_triggers: terse_reward::step_grpo::default_triggers(),
            dynamic_sampling: None,
            truncated_reward: TruncatedReward::Verifier,
            think_prune: None,
            gfpo: None,
        }
    }
}
