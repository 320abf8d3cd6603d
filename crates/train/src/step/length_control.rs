//! The rollout-side length methods, between generation and shaping: GFPO's group filter (the
//! samples it drops become unscorable and leave the loss), here with the tests of ThinkPrune's limit and the truncation
//! rule (config/length.rs reads them from `[grpo]`, `Group::score_truncated_as_zero` applies
//! the rule). Each is a function of the config, the step and the step's groups, so a resumed
//! run does exactly what an unbroken one does.
//!
//! Data flow: `collect` (the truncation rule on every round's groups, before dynamic sampling
//! judges them) -> `gfpo_filter` (in `GrpoTrainer::rollout`) -> shaping and advantages, which
//! skip unscorable samples (terse_reward::shape_scorable, `Advantage::compute`).

use crate::config::Gfpo;
use crate::step::collect::{Collected, SampleExtra};
use anyhow::{bail, Result};
use terse_reward::gfpo::keep_mask;
use terse_reward::Group;
use terse_rollout::Sample;

/// GFPO's filter on a collected step: in every group the samples `keep_mask` does not keep
/// become unscorable (the shaper never sees them, their reward and advantage are 0 and they
/// enter no statistic) and leave the loss (no loss tokens: they weigh nothing in the
/// aggregation weights, and the held ones' loss masks are cleared). Every rank applies it to
/// the same gathered groups. Returns how many samples it dropped.
pub fn gfpo_filter(f: &Gfpo, c: &mut Collected, group_size: usize) -> Result<usize> {
    let step = Step {
        groups: &mut c.groups,
        extras: &mut c.extras,
        samples: &mut c.samples,
        held: &c.held,
    };
    filter(f, step, group_size)
}

/// What the filter changes of a collected step (`Collected`'s fields).
struct Step<'a> {
    groups: &'a mut [Group],
    extras: &'a mut [SampleExtra],
    samples: &'a mut [Sample],
    held: &'a [usize],
}

fn filter(f: &Gfpo, c: Step<'_>, group_size: usize) -> Result<usize> {
    if c.extras.len() != c.groups.len() * group_size || c.samples.len() != c.held.len() * group_size
    {
        bail!(
            "gfpo: {} groups, {} extras and {} held samples do not fit groups of {group_size}",
            c.groups.len(),
            c.extras.len(),
            c.samples.len()
        );
    }
    let mut dropped = 0;
    for (k, g) in c.groups.iter_mut().enumerate() {
        let keep = keep_mask(g, f.keep, f.metric);
        let held = c.held.iter().position(|&h| h == k);
        for (i, (s, kept)) in g.samples.iter_mut().zip(keep).enumerate() {
            if kept || !s.scorable {
                continue;
            }
            s.scorable = false;
            dropped += 1;
            c.extras[k * group_size + i].loss_tokens = 0;
            if let Some(p) = held {
                c.samples[p * group_size + i].sampled.fill(false);
            }
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GrpoSection, ThinkPrune};
    use terse_reward::gfpo::GfpoMetric;
    use terse_reward::SampleStat;
    use terse_rollout::Finish;

    fn grpo() -> GrpoSection {
        GrpoSection {
            max_new_tokens: 4096,
            group_size: 4,
            ..Default::default()
        }
    }

    #[test]
    fn think_prune_limits_follow_the_rounds_and_hold_after_the_last() {
        let mut g = grpo();
        assert_eq!(g.step_limit(7), 4096, "off: max_new_tokens");
        g.think_prune = Some(ThinkPrune {
            limits: vec![4096, 3072, 2048],
            steps_per_round: 10,
        });
        // Steps 0..9 round 0, 10..19 round 1, from 20 the last limit.
        let got: Vec<usize> = [0, 9, 10, 19, 20, 1000].map(|s| g.step_limit(s)).to_vec();
        assert_eq!(got, [4096, 4096, 3072, 3072, 2048, 2048]);
        assert!(g.zero_truncated(), "ThinkPrune scores truncation 0");
        assert!(!grpo().zero_truncated());
    }

    #[test]
    fn a_truncated_completion_scores_zero_whatever_the_verdict() {
        let mut g = Group::new(
            0,
            vec![
                SampleStat::new(10, true, 1.0),
                SampleStat::new(96, true, 1.0),
                SampleStat::new(96, false, -0.5),
            ],
        );
        g.samples[1].truncated = true;
        g.samples[2].truncated = true;
        g.score_truncated_as_zero();
        let got: Vec<(bool, f64)> = g
            .samples
            .iter()
            .map(|s| (s.correct, s.base_reward))
            .collect();
        assert_eq!(got, [(true, 1.0), (false, 0.0), (false, 0.0)]);
    }

    fn sample(len: usize) -> Sample {
        Sample {
            prompt_id: 0,
            index: 0,
            tokens: vec![1; len],
            sampled: vec![true; len],
            logp_sampled: vec![0.0; len],
            logp_plain: vec![0.0; len],
            finish: Finish::Eos,
            judge_count: 0,
            exit_step: None,
            exit_token: None,
            entropy_sum: 0.0,
            entropy_tokens: 0,
        }
    }

    /// Two groups of 4, this rank holding only the second: the filter drops the two longest
    /// of each, on every group's statistics and on the held group's samples.
    #[test]
    fn gfpo_drops_samples_from_shaping_advantages_and_the_loss() {
        let lens = [[30, 10, 40, 20], [5, 8, 6, 7]];
        let mut groups: Vec<Group> = lens
            .iter()
            .enumerate()
            .map(|(k, l)| {
                Group::new(
                    k as u64,
                    l.iter().map(|&n| SampleStat::new(n, true, 1.0)).collect(),
                )
            })
            .collect();
        let mut extras: Vec<SampleExtra> = lens
            .iter()
            .flatten()
            .map(|&n| SampleExtra {
                loss_tokens: n,
                entropy_sum: 0.0,
                entropy_tokens: n,
                judge_count: 0,
                early_exit: false,
                context_cut: false,
            })
            .collect();
        let mut samples: Vec<Sample> = lens[1].iter().map(|&n| sample(n)).collect();
        let held = [1];
        let f = Gfpo {
            keep: 2,
            metric: GfpoMetric::Length,
        };
        let c = Step {
            groups: &mut groups,
            extras: &mut extras,
            samples: &mut samples,
            held: &held,
        };
        assert_eq!(filter(&f, c, 4).expect("fits"), 4);
        let scorable: Vec<Vec<bool>> = groups
            .iter()
            .map(|g| g.samples.iter().map(|s| s.scorable).collect())
            .collect();
        // Group 0 keeps 10 and 20; group 1 keeps 5 and 6.
        assert_eq!(
            scorable,
            [[false, true, false, true], [true, false, true, false]]
        );
        let loss: Vec<usize> = extras.iter().map(|e| e.loss_tokens).collect();
        assert_eq!(loss, [0, 10, 0, 20, 5, 0, 6, 0]);
        let masked: Vec<usize> = samples.iter().map(|s| s.len()).collect();
        assert_eq!(masked, [5, 0, 6, 0]);
        // The shaper and the estimator skip the dropped samples: advantage 0, and the kept
        // ones are normalised among themselves (two values: ±1/√2 with ddof 1, ε aside).
        let shaped = terse_reward::shape_scorable(&groups, |gs| {
            Ok(terse_reward::Shaped {
                rewards: gs
                    .iter()
                    .map(|g| g.samples.iter().map(|s| -(s.len as f64)).collect())
                    .collect(),
                ..Default::default()
            })
        })
        .expect("shaped");
        let adv = terse_reward::Advantage::default()
            .compute(&groups, &shaped)
            .expect("advantages");
        let half = std::f64::consts::FRAC_1_SQRT_2;
        let want = [0.0, half, 0.0, -half];
        for (a, w) in adv.values[0].iter().zip(want) {
            assert!((a - w).abs() < 1e-6, "{:?}", adv.values[0]);
        }
        // A filter that does not fit the collected shapes is an error, not a wrong mask.
        let c = Step {
            groups: &mut groups,
            extras: &mut extras,
            samples: &mut samples,
            held: &held,
        };
        assert!(filter(&f, c, 3).is_err());
    }

    #[test]
    fn invalid_keys_are_named_with_their_value() {
        let mut g = grpo();
        g.gfpo = Some(Gfpo {
            keep: 4,
            metric: GfpoMetric::Length,
        });
        let e = g
            .validate_length_methods()
            .expect_err("invalid")
            .to_string();
        assert!(
            e.starts_with("grpo.gfpo.keep = 4 must be in 2..grpo.group_size (4)"),
            "{e}"
        );
        g.gfpo = None;
        for (limits, steps, want) in [
            (vec![], 5, "grpo.think_prune.limits must not be empty"),
            (
                vec![10],
                0,
                "grpo.think_prune.steps_per_round must be > 0, got 0",
            ),
            (
                vec![5000],
                5,
                "grpo.think_prune.limits[0] = 5000 must be in 1..=grpo.max_new_tokens (4096)",
            ),
            (
                vec![2048, 3072],
                5,
                "grpo.think_prune.limits[1] = 3072 exceeds the round before (2048)",
            ),
        ] {
            g.think_prune = Some(ThinkPrune {
                limits,
                steps_per_round: steps,
            });
            let e = g
                .validate_length_methods()
                .expect_err("invalid")
                .to_string();
            assert!(e.starts_with(want), "{e}");
        }
    }
}
