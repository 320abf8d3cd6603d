//! LASER-D (docs/methods.md, LASER-D; arXiv 2505.15612): a step reward at a target length (a
//! right completion no longer than its target gets a bonus) whose target adapts per difficulty
//! bucket (easy, medium, hard by the group's accuracy) to the lengths the policy produces.
//!
//! Sits between scoring and advantages (`method = "laser_d"`); the targets and the statistics
//! they are computed from live in [`LaserState`], part of the checkpointed `ShaperState`, so a
//! resumed run shapes as one that never stopped.

use crate::types::{Group, Shaped};
use serde::{Deserialize, Serialize};

/// The three difficulty buckets, in `LaserState`'s order.
pub const BUCKETS: [&str; 3] = ["easy", "medium", "hard"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LaserD {
    /// α: the bonus a right completion within its target gets (added to the base reward).
    pub bonus: f64,
    /// The largest candidate target (the released scripts: the response limit).
    pub l_max: usize,
    /// The smallest candidate target.
    pub lower: usize,
    /// The step between candidate targets: lower, lower + interval, ..., up to l_max.
    pub interval: usize,
    /// Steps of statistics between target updates (the released scripts' monitor_freq).
    pub update_every: u64,
    /// The expected number of right responses within the target a bucket must keep (ECR).
    pub expected_correct: u64,
}

impl Default for LaserD {
    /// The released LASER-D 1.5B scripts: α 0.5, targets 4096..16384 by 1024, every 20 steps,
    /// ECR ≥ 1.
    fn default() -> Self {
        Self {
            bonus: 0.5,
            l_max: 16384,
            lower: 4096,
            interval: 1024,
            update_every: 20,
            expected_correct: 1,
        }
    }
}

/// What LASER-D carries across steps: each bucket's target and the length statistics
/// gathered since the last update. Empty (the default) until the first step.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LaserState {
    /// Whether targets were ever computed (the first step computes them from its own batch).
    pub started: bool,
    /// easy, medium, hard: the target length, or None (no candidate keeps enough right
    /// responses, or no statistics yet): every right completion gets the bonus.
    pub targets: [Option<usize>; 3],
    /// Steps gathered since the last update.
    pub steps: u64,
    /// Per bucket: responses seen since the last update.
    pub total: [u64; 3],
    /// Per bucket and candidate: responses no longer than the candidate.
    pub covered: [Vec<u64>; 3],
    /// The largest group seen since the last update (n of the ECR's lower bounds).
    pub group_size: usize,
}

impl LaserState {
    /// Nothing to save: the state of a run that never used LASER-D (old checkpoints read so).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The bucket of a group with `right` right completions of `n`: easy when the accuracy is at
/// least 2/3, medium at least 1/3, else hard (integer comparisons: 3·right ≥ 2·n).
pub fn bucket(right: usize, n: usize) -> usize {
    if 3 * right >= 2 * n {
        0
    } else if 3 * right >= n {
        1
    } else {
        2
    }
}

impl LaserD {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.bonus >= 0.0 && self.bonus.is_finite()) {
            return Err(format!(
                "laser_d.bonus must be a finite number >= 0, got {}",
                self.bonus
            ));
        }
        for (key, v) in [
            ("l_max", self.l_max as u64),
            ("lower", self.lower as u64),
            ("interval", self.interval as u64),
            ("update_every", self.update_every),
            ("expected_correct", self.expected_correct),
        ] {
            if v == 0 {
                return Err(format!("laser_d.{key} must be > 0, got 0"));
            }
        }
        if self.lower > self.l_max {
            return Err(format!(
                "laser_d.lower ({}) must not exceed l_max ({})",
                self.lower, self.l_max
            ));
        }
        Ok(())
    }

    /// The candidate targets, ascending: lower, lower + interval, ... up to l_max, and l_max.
    pub fn candidates(&self) -> Vec<usize> {
        let mut c: Vec<usize> = (0..)
            .map(|j| self.lower + j * self.interval.max(1))
            .take_while(|&t| t <= self.l_max)
            .collect();
        if c.last() != Some(&self.l_max) {
            c.push(self.l_max);
        }
        c
    }

    /// The right responses a bucket is sure to have per group, C_d: ⌊2n/3⌋ (easy), ⌊n/3⌋
    /// (medium), 1 (hard), the lower bounds of the buckets' accuracy (the released code's
    /// "floor" rounding).
    fn lower_bound(d: usize, n: usize) -> u64 {
        match d {
            0 => (2 * n / 3) as u64,
            1 => (n / 3) as u64,
            _ => 1,
        }
    }

    /// Adds the batch to the statistics and, on the first step or once `update_every` steps
    /// are gathered, recomputes every bucket that saw responses: the smallest candidate L with
    /// ⌊P(L)·C_d⌋ ≥ `expected_correct`, P(L) the share of the bucket's responses (right or
    /// wrong) no longer than L; none such: no target. A bucket without responses keeps its
    /// target.
    pub fn update(&self, groups: &[Group], st: &mut LaserState) {
        let cand = self.candidates();
        for c in &mut st.covered {
            c.resize(cand.len(), 0);
        }
        for g in groups.iter().filter(|g| !g.samples.is_empty()) {
            let right = g.samples.iter().filter(|s| s.correct).count();
            let d = bucket(right, g.samples.len());
            st.group_size = st.group_size.max(g.samples.len());
            for s in &g.samples {
                st.total[d] += 1;
                for (c, &t) in st.covered[d].iter_mut().zip(&cand) {
                    *c += u64::from(s.len <= t);
                }
            }
        }
        st.steps += 1;
        if st.started && st.steps < self.update_every {
            return;
        }
        for d in 0..3 {
            if st.total[d] == 0 {
                continue;
            }
            let c_d = Self::lower_bound(d, st.group_size);
            // ⌊covered · C_d / total⌋ ≥ E  ⇔  covered · C_d ≥ E · total (integers).
            st.targets[d] = cand
                .iter()
                .zip(&st.covered[d])
                .find(|(_, &cov)| cov * c_d >= self.expected_correct * st.total[d])
                .map(|(&t, _)| t);
        }
        *st = LaserState {
            started: true,
            targets: st.targets,
            covered: std::array::from_fn(|_| vec![0; cand.len()]),
            ..Default::default()
        };
    }

    /// R = base + α·1[right ∧ L ≤ T_d] with the targets after this step's update; the
    /// diagnostics are the targets in use (a bucket without one is left out).
    pub fn shape(&self, groups: &[Group], st: &mut LaserState) -> Shaped {
        self.update(groups, st);
        let rewards = groups
            .iter()
            .map(|g| {
                let right = g.samples.iter().filter(|s| s.correct).count();
                let target = st.targets[bucket(right, g.samples.len())];
                g.samples
                    .iter()
                    .map(|s| {
                        let within = target.is_none_or(|t| s.len <= t);
                        s.base_reward + if s.correct && within { self.bonus } else { 0.0 }
                    })
                    .collect()
            })
            .collect();
        let mut out = Shaped {
            rewards,
            ..Default::default()
        };
        for (name, t) in BUCKETS.iter().zip(st.targets) {
            if let Some(t) = t {
                out.diagnostics
                    .insert(format!("laser_target_{name}"), t as f64);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{check, group};
    use crate::{BuiltinShaper, LengthShaper, Method, RewardConfig, SampleStat, StepCtx};

    /// Candidates 10, 20, 30, 40; bonus 0.5; an update every 2 steps.
    fn small() -> LaserD {
        LaserD {
            bonus: 0.5,
            l_max: 40,
            lower: 10,
            interval: 10,
            update_every: 2,
            expected_correct: 1,
        }
    }

    /// 0/1 rewards: the group helper's 3 / −0.5 replaced.
    fn g01(lens: &[usize], right: &[bool]) -> Group {
        let mut g = group(lens, right);
        for s in &mut g.samples {
            s.base_reward = f64::from(u8::from(s.correct));
        }
        g
    }

    #[test]
    fn candidates_buckets_and_lower_bounds() {
        assert_eq!(small().candidates(), [10, 20, 30, 40]);
        let odd = LaserD {
            l_max: 35,
            ..small()
        };
        assert_eq!(odd.candidates(), [10, 20, 30, 35]);
        assert_eq!(LaserD::default().candidates().len(), 13); // 4096..16384 by 1024
                                                              // G = 6: easy from 4 right (3·4 ≥ 12), medium from 2 (3·2 ≥ 6), hard below.
        assert_eq!(
            (bucket(4, 6), bucket(3, 6), bucket(2, 6), bucket(1, 6)),
            (0, 1, 1, 2)
        );
        assert_eq!((bucket(0, 0), bucket(0, 3)), (0, 2));
        assert_eq!(
            (
                LaserD::lower_bound(0, 6),
                LaserD::lower_bound(1, 6),
                LaserD::lower_bound(2, 6)
            ),
            (4, 2, 1)
        );
    }

    #[test]
    fn the_first_step_sets_the_targets_from_its_own_batch() {
        // Group A (easy, 4 of 6 right), lengths 5 15 25 35 12 40: C = 4; P(10) = 1/6,
        // ⌊4/6⌋ = 0; P(20) = 3/6, ⌊2⌋ = 2 ≥ 1: target 20.
        // Group B (hard, 1 of 6 right), lengths 8 9 18 22 31 33: C = 1; needs P(L) = 1,
        // first at 40: target 40.
        let a = g01(
            &[5, 15, 25, 35, 12, 40],
            &[true, true, true, true, false, false],
        );
        let b = g01(
            &[8, 9, 18, 22, 31, 33],
            &[false, false, false, true, false, false],
        );
        let mut st = LaserState::default();
        let s = small().shape(&[a, b], &mut st);
        assert_eq!(st.targets, [Some(20), None, Some(40)]);
        // A: right 5 and 15 are within 20 (+0.5), right 25 and 35 are not; wrong ones keep 0.
        check(&s.rewards[0], &[1.5, 1.5, 1.0, 1.0, 0.0, 0.0]);
        // B: the right one (22 ≤ 40) gets the bonus.
        check(&s.rewards[1], &[0.0, 0.0, 0.0, 1.5, 0.0, 0.0]);
        assert_eq!(s.diagnostics["laser_target_easy"], 20.0);
        assert!(!s.diagnostics.contains_key("laser_target_medium"));
        assert!(st.started && st.steps == 0 && st.total == [0, 0, 0]);
    }

    #[test]
    fn targets_move_only_every_update_every_steps_and_empty_buckets_keep_theirs() {
        let easy_long = g01(
            &[35, 36, 37, 38, 39, 40],
            &[true, true, true, true, false, false],
        );
        let easy_short = g01(
            &[5, 6, 7, 8, 9, 10],
            &[true, true, true, true, false, false],
        );
        let mut st = LaserState::default();
        let l = small();
        l.shape(std::slice::from_ref(&easy_short), &mut st);
        assert_eq!(st.targets[0], Some(10)); // P(10) = 1, ⌊4⌋ ≥ 1
                                             // Step 1: gathered, not yet an update (1 of 2 steps): the target stays 10, so the
                                             // right long completions miss the bonus.
        let s = l.shape(std::slice::from_ref(&easy_long), &mut st);
        assert_eq!(st.targets[0], Some(10));
        check(&s.rewards[0], &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
        // Step 2: the update over steps 1 and 2 (12 responses: step 1's 35..40, step 2's
        // 5..10): P(10) = 6/12, ⌊0.5 · 4⌋ = 2 ≥ 1: target 10 again.
        l.shape(std::slice::from_ref(&easy_short), &mut st);
        assert_eq!(st.targets[0], Some(10));
        // Two long steps: P(30) = 0, P(40) = 1: target 40. The hard bucket saw nothing and
        // keeps None; the medium one too.
        l.shape(std::slice::from_ref(&easy_long), &mut st);
        l.shape(std::slice::from_ref(&easy_long), &mut st);
        assert_eq!(st.targets, [Some(40), None, None]);
    }

    #[test]
    fn edge_cases_no_right_one_right_equal_lengths_and_truncation() {
        let l = small();
        // No right completion (hard bucket): nobody gets a bonus, rewards are the base.
        let mut st = LaserState::default();
        let s = l.shape(&[g01(&[12, 30, 50], &[false, false, false])], &mut st);
        check(&s.rewards[0], &[0.0, 0.0, 0.0]);
        // No candidate covers 50 (P(40) = 2/3 < 1 for C = 1): the hard target is None.
        assert_eq!(st.targets[2], None);
        // One right completion of 3 (medium: 3·1 ≥ 3): C = ⌊3/3⌋ = 1, needs P = 1 → 40.
        let mut st = LaserState::default();
        let s = l.shape(&[g01(&[12, 30, 40], &[true, false, false])], &mut st);
        assert_eq!(st.targets[1], Some(40));
        check(&s.rewards[0], &[1.5, 0.0, 0.0]);
        // Equal lengths: all right, all 25: P(30) = 1 is the first with ⌊2⌋ ≥ 1 (C = 2 of 3).
        let mut st = LaserState::default();
        let s = l.shape(&[g01(&[25, 25, 25], &[true, true, true])], &mut st);
        assert_eq!(st.targets[0], Some(30));
        check(&s.rewards[0], &[1.5, 1.5, 1.5]);
        // A truncated completion is scored by its verdict: a wrong truncated one keeps its
        // base reward and its length counts in P like any response.
        let mut g = g01(&[10, 10, 10, 60], &[true, true, true, false]);
        g.samples[3].truncated = true;
        let mut st = LaserState::default();
        let s = l.shape(&[g], &mut st);
        // Easy (3 of 4), C = ⌊8/3⌋ = 2: P(10) = 3/4, ⌊1.5⌋ = 1 ≥ 1: target 10.
        assert_eq!(st.targets[0], Some(10));
        check(&s.rewards[0], &[1.5, 1.5, 1.5, 0.0]);
    }

    /// Shaping steps 0..n in one go equals shaping 0..k, saving the state as a checkpoint does
    /// (JSON), restoring it into a fresh shaper and shaping k..n.
    #[test]
    fn a_resumed_run_shapes_as_an_unbroken_one() {
        let cfg = RewardConfig {
            shaper: Method::LaserD(LaserD {
                update_every: 3,
                ..small()
            }),
            overlong: None,
        };
        let batch = |step: u64| -> Vec<Group> {
            (0..4u64)
                .map(|k| {
                    let samples = (0..6u64)
                        .map(|i| {
                            // Lengths shrink over the run, so the targets follow them down.
                            let h = (step * 31 + k * 7 + i * 13) % 47;
                            let len = 5 + h % (45 - 4 * step);
                            SampleStat::new(len as usize, !(h + i).is_multiple_of(3), 0.0)
                        })
                        .map(|mut s| {
                            s.base_reward = f64::from(u8::from(s.correct));
                            s
                        })
                        .collect();
                    Group::new(k, samples)
                })
                .collect()
        };
        let run = |shaper: &mut BuiltinShaper, steps: std::ops::Range<u64>| -> Vec<Shaped> {
            steps
                .map(|step| {
                    let ctx = StepCtx { step, seed: 1 };
                    shaper.shape(&batch(step), &ctx).expect("valid")
                })
                .collect()
        };
        let mut unbroken = BuiltinShaper {
            config: cfg.clone(),
            state: Default::default(),
        };
        let all = run(&mut unbroken, 0..10);
        let mut first = BuiltinShaper {
            config: cfg.clone(),
            state: Default::default(),
        };
        let mut got = run(&mut first, 0..4);
        let saved = serde_json::to_string(&first.state).expect("json");
        let mut resumed = BuiltinShaper {
            config: cfg,
            state: serde_json::from_str(&saved).expect("json"),
        };
        got.extend(run(&mut resumed, 4..10));
        assert_eq!(got, all);
        assert_eq!(resumed.state, unbroken.state);
        // The targets did move over the run, so the state carried something.
        let targets: Vec<_> = all
            .iter()
            .map(|s| s.diagnostics.get("laser_target_easy").copied())
            .collect();
        assert!(targets.windows(2).any(|w| w[0] != w[1]), "{targets:?}");
    }

    /// Old checkpoints (before LASER-D) load, and a run that never used it writes the state
    /// it always wrote.
    #[test]
    fn the_checkpointed_state_stays_compatible() {
        let old = r#"{"short_rl":{"acc_max":0.5}}"#;
        let st: crate::ShaperState = serde_json::from_str(old).expect("old state");
        assert_eq!(st.short_rl.acc_max, 0.5);
        assert!(st.laser_d.is_empty());
        assert_eq!(serde_json::to_string(&st).expect("json"), old);
        let mut st = crate::ShaperState::default();
        small().update(&[g01(&[5, 6], &[true, true])], &mut st.laser_d);
        let json = serde_json::to_string(&st).expect("json");
        assert!(json.contains("laser_d"), "{json}");
    }

    #[test]
    fn invalid_keys_are_named_with_their_value() {
        let e = LaserD {
            interval: 0,
            ..small()
        }
        .validate()
        .expect_err("invalid");
        assert_eq!(e, "laser_d.interval must be > 0, got 0");
        let e = LaserD {
            bonus: f64::NAN,
            ..small()
        }
        .validate()
        .expect_err("invalid");
        assert_eq!(e, "laser_d.bonus must be a finite number >= 0, got NaN");
        let e = LaserD {
            lower: 50,
            ..small()
        }
        .validate()
        .expect_err("invalid");
        assert_eq!(e, "laser_d.lower (50) must not exceed l_max (40)");
    }
}
