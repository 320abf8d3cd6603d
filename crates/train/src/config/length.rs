//! The length methods' settings of `[grpo]` read as the rollout needs them: ThinkPrune's token
//! limit at a step, whether a truncated completion scores 0 (DLER, ThinkPrune), and the
//! checks of `[grpo.think_prune]` and `[grpo.gfpo]`. Functions of the config and the step
//! alone, so a resumed run samples and scores as an unbroken one; length_control.rs applies
//! them to the step's groups.

use super::{GrpoSection, TruncatedReward};
use anyhow::{bail, Result};

impl GrpoSection {
    /// The rollout's token limit at `step`: ThinkPrune's limit of the step's round, else
    /// `max_new_tokens`.
    pub fn step_limit(&self, step: u64) -> usize {
        match &self.think_prune {
            Some(tp) if !tp.limits.is_empty() => {
                let round = step / tp.steps_per_round.max(1);
                let r = usize::try_from(round).unwrap_or(usize::MAX);
                tp.limits[r.min(tp.limits.len() - 1)]
            }
            _ => self.max_new_tokens,
        }
    }

    /// Whether a truncated completion scores 0: `truncated_reward = "zero"`, or ThinkPrune
    /// (whose method is the limit together with that rule).
    pub fn zero_truncated(&self) -> bool {
        self.truncated_reward == TruncatedReward::Zero || self.think_prune.is_some()
    }

    /// Checks `[grpo.think_prune]` and `[grpo.gfpo]`; the error names the key and its value.
    pub(crate) fn validate_length_methods(&self) -> Result<()> {
        let g = self;
        if let Some(tp) = &g.think_prune {
            if tp.limits.is_empty() {
                bail!("grpo.think_prune.limits must not be empty");
            }
            if tp.steps_per_round == 0 {
                bail!("grpo.think_prune.steps_per_round must be > 0, got 0");
            }
            for (i, &l) in tp.limits.iter().enumerate() {
                if l == 0 || l > g.max_new_tokens {
                    bail!(
                        "grpo.think_prune.limits[{i}] = {l} must be in 1..=grpo.max_new_tokens ({})",
                        g.max_new_tokens
                    );
                }
                if i > 0 && l > tp.limits[i - 1] {
                    bail!(
                        "grpo.think_prune.limits[{i}] = {l} exceeds the round before ({}): each round's limit is at most the previous one's",
                        tp.limits[i - 1]
                    );
                }
            }
        }
        if let Some(f) = &g.gfpo {
            if f.keep < 2 || f.keep >= g.group_size {
                bail!(
                    "grpo.gfpo.keep = {} must be in 2..grpo.group_size ({}): GFPO samples more than it keeps, and a group of one has no baseline",
                    f.keep,
                    g.group_size
                );
            }
        }
        Ok(())
    }
}
