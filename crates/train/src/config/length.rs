//! The length methods' settings read as the rollout and the shapers need them: ThinkPrune's
//! token limit at a step, whether a truncated completion scores 0 (DLER, ThinkPrune), the
//! checks of `[grpo.think_prune]` and `[grpo.gfpo]`, Step-GRPO's exit with the run's one
//! trigger list, and the reward methods' `l_max`, which defaults to `grpo.max_new_tokens`.
//! Functions of the config and the step alone, so a resumed run samples and scores as an
//! unbroken one; step/trainer.rs and step/collect.rs apply them to each step's rollout and groups
//! (step/length_control.rs tests them).

use super::{Chosen, GrpoSection, RewardSection, RunConfig, TruncatedReward};
use anyhow::{bail, Result};
use terse_reward::Method;
use terse_rollout::StepExit;

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

    /// `grpo.step_exit` as the rollout runs it: exiting at `step_triggers`, the run's one list
    /// of trigger words (the step reward and eval's reflections count the same words).
    pub fn step_exit(&self) -> Option<StepExit> {
        self.step_exit.as_ref().map(|se| StepExit {
            triggers: self.step_triggers.clone(),
            ..se.clone()
        })
    }

    /// Checks `[grpo.think_prune]`, `[grpo.gfpo]` and `[grpo.step_exit]`; the error names the
    /// key and its value.
    pub(crate) fn validate_length_methods(&self) -> Result<()> {
        let g = self;
        if let Some(se) = g.step_exit() {
            if se.triggers.iter().all(String::is_empty) {
                bail!(
                    "grpo.step_triggers must hold at least one non-empty word: grpo.step_exit exits at them, got {:?}",
                    g.step_triggers
                );
            }
            se.validate().map_err(|e| anyhow::anyhow!("grpo.{e}"))?;
        }
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

/// Where a reward setting's `l_max` sits (`reward.shaper` or `reward.overlong`), and its method.
struct LMaxSlot<'a> {
    table: &'static str,
    method: String,
    value: &'a mut usize,
}

/// Every `l_max` of the reward section. Each is the paper's generation limit (docs/methods.md):
/// CosFn's and DAPO overlong's L_max, ALP's normaliser N, DAST's budget ceiling, CARE's
/// L_max and LASER-D's largest target (a target at or above the limit rewards every right
/// completion alike). A method's name is its serde tag, as the config spells it.
fn l_max_slots(reward: &mut RewardSection) -> Vec<LMaxSlot<'_>> {
    let method = serde_json::to_value(&reward.shaper)
        .ok()
        .and_then(|v| v.get("method")?.as_str().map(str::to_string))
        .unwrap_or_default();
    let shaper = |value| LMaxSlot {
        table: "shaper",
        method,
        value,
    };
    let mut slots = match &mut reward.shaper {
        Chosen::Builtin(Method::CosFn(m)) => vec![shaper(&mut m.l_max)],
        Chosen::Builtin(Method::Alp(m)) => vec![shaper(&mut m.l_max)],
        Chosen::Builtin(Method::Dast(m)) => vec![shaper(&mut m.l_max)],
        Chosen::Builtin(Method::Care(m)) => vec![shaper(&mut m.l_max)],
        Chosen::Builtin(Method::LaserD(m)) => vec![shaper(&mut m.l_max)],
        _ => vec![],
    };
    if let Some(o) = &mut reward.overlong {
        slots.push(LMaxSlot {
            table: "overlong",
            method: "dapo_overlong".into(),
            value: &mut o.l_max,
        });
    }
    slots
}

impl RunConfig {
    /// Sets every `l_max` the file `raw` leaves out to `grpo.max_new_tokens`, the one place the
    /// generation limit is configured.
    pub(crate) fn default_l_max(&mut self, raw: &toml::Table) {
        let limit = self.grpo.max_new_tokens;
        for slot in l_max_slots(&mut self.reward) {
            let set = raw
                .get("reward")
                .and_then(|r| r.get(slot.table))
                .is_some_and(|t| t.get("l_max").is_some());
            if !set {
                *slot.value = limit;
            }
        }
    }

    /// One line per `l_max` that differs from `grpo.max_new_tokens` (so was set explicitly),
    /// naming the method and both numbers; printed when a run starts.
    pub fn l_max_notes(&self) -> Vec<String> {
        let limit = self.grpo.max_new_tokens;
        let mut reward = self.reward.clone();
        l_max_slots(&mut reward)
            .into_iter()
            .filter(|s| *s.value != limit)
            .map(|s| {
                format!(
                    "{}: reward.{}.l_max = {} differs from grpo.max_new_tokens = {limit} (set explicitly)",
                    s.method, s.table, s.value
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> RunConfig {
        RunConfig::from_toml(text, Path::new("t.toml")).expect("config")
    }

    /// Without an `l_max`, every method's follows `grpo.max_new_tokens`, and nothing is reported.
    #[test]
    fn l_max_defaults_to_the_generation_limit() {
        let laser = "lower = 16\ninterval = 8\n";
        for (method, keys) in [
            ("cos_fn", ""),
            ("dast", ""),
            ("care", ""),
            ("laser_d", laser),
        ] {
            let c = parse(&format!(
                "[grpo]\nmax_new_tokens = 77\n[reward.shaper]\nmethod = \"{method}\"\n{keys}[reward.overlong]\nl_cache = 8\n"
            ));
            let mut r = c.reward.clone();
            let got: Vec<usize> = l_max_slots(&mut r).iter().map(|s| *s.value).collect();
            assert_eq!(got, [77, 77], "{method}");
            assert!(
                c.l_max_notes().is_empty(),
                "{method}: {:?}",
                c.l_max_notes()
            );
        }
        let c = parse("[grpo]\nmax_new_tokens = 50\n[reward.shaper]\nmethod = \"alp\"\nbeta = 1\n");
        match &c.reward.shaper {
            Chosen::Builtin(Method::Alp(a)) => assert_eq!(a.l_max, 50),
            m => panic!("{m:?}"),
        }
    }

    /// An explicit `l_max` other than the limit is kept and reported, naming method and numbers.
    #[test]
    fn an_explicit_l_max_is_kept_and_reported() {
        let c = parse(
            "[grpo]\nmax_new_tokens = 64\n[reward.shaper]\nmethod = \"cos_fn\"\nl_max = 100\n[reward.overlong]\nl_max = 64\nl_cache = 8\n",
        );
        match &c.reward.shaper {
            Chosen::Builtin(Method::CosFn(m)) => assert_eq!(m.l_max, 100),
            m => panic!("{m:?}"),
        }
        assert_eq!(
            c.l_max_notes(),
            ["cos_fn: reward.shaper.l_max = 100 differs from grpo.max_new_tokens = 64 (set explicitly)"]
        );
        // The resolved config written with a run keeps the value, so a resume reads the same.
        let back = parse(&toml::to_string(&c).expect("toml"));
        assert_eq!(back.reward, c.reward);
    }

    /// Step-GRPO's triggers have one source: `grpo.step_triggers` sets the exit's too, and the
    /// old `grpo.step_exit.triggers` is refused naming the key that replaced it.
    #[test]
    fn step_triggers_are_one_list() {
        let se = "[grpo.step_exit]\ninduction = \"</think>\"\n";
        let c = parse(&format!("[grpo]\nstep_triggers = [\"Hmm\"]\n{se}"));
        assert_eq!(c.grpo.step_triggers, ["Hmm"]);
        assert_eq!(c.grpo.step_exit().expect("exit").triggers, ["Hmm"]);
        let d = parse(se);
        assert_eq!(
            d.grpo.step_exit().expect("exit").triggers,
            d.grpo.step_triggers
        );
        let e = RunConfig::from_toml(&format!("{se}triggers = [\"Wait\"]\n"), Path::new("t.toml"))
            .expect_err("the old key");
        let e = format!("{e:#}");
        assert!(
            e.contains("grpo.step_exit.triggers")
                && e.contains("grpo.step_triggers")
                && !e.contains('\n'),
            "{e}"
        );
        let empty = RunConfig::from_toml(
            &format!("[grpo]\nstep_triggers = []\n{se}"),
            Path::new("t.toml"),
        )
        .expect_err("no triggers");
        assert!(
            format!("{empty:#}").contains("grpo.step_triggers"),
            "{empty:#}"
        );
    }
}
