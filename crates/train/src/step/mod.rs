//! One GRPO step, the trainer's own wing: collect (rollout and scoring) -> shaped rewards and
//! advantages (trainer) -> the update (PPO epochs over micro-batches, the losses, rollout correction,
//! data-parallel gradients and ZeRO-2). Its public items are the pieces research code calls alone.

pub(crate) mod batches;
pub(crate) mod collect;
pub(crate) mod correction;
pub(crate) mod dp;
pub(crate) mod gspo;
pub(crate) mod length_control;
pub(crate) mod loss;
pub(crate) mod trainer;
pub(crate) mod update;
pub(crate) mod zero;

// The pieces of one step, for research code that calls them alone: micro-batches and
// log-probs, the policy losses, the data-parallel gradient sum, tokenizing.
pub use crate::data::sft_example;
pub use crate::load::{encode, load_checkpoint_model, load_tokenizer};
pub use crate::step::batches::{gradients, logprobs, micro_batches, MicroBatching, Objective, Seq};
pub use crate::step::dp::all_reduce_grads;
pub use crate::step::loss::{agg_weights, LossInputs, LossStats, PolicyLoss, PpoParams};
pub use crate::step::update::sequences;
