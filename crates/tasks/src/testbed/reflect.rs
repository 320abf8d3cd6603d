//! Testbed v3's teacher trace: a chain that states its answer first, then rounds of `Wait`
//! reflection after it that correct guessed hard steps or, by doubt, overturn right answers
//! (data flow: problem -> [`Teacher::trace`] -> SFT loss; the design is models/testbed/README.md,
//! "Testbed v3"). The teacher's settings and v1/v2 traces are in teacher.rs.

use super::teacher::{finish, small_steps, Teacher, Trace, HARD_OPERANDS};
use super::Problem;
use rand::Rng;

impl Teacher {
    /// v3: the chance that a re-check of a verified level-`level` chain overturns a step:
    /// `overturn_by_level`'s value when set, else the line from `overturn_easy` at level 1 to
    /// `overturn_hard` at the top level.
    pub fn overturn(&self, level: usize) -> f64 {
        if let Some(p) = by_level(self.overturn_by_level.as_deref(), level) {
            return p;
        }
        let top = (super::MAX_LEVEL - 1).max(1) as f64;
        let t = (level.saturating_sub(1) as f64 / top).clamp(0.0, 1.0);
        self.overturn_easy + (self.overturn_hard - self.overturn_easy) * t
    }

    /// v3: the chance that a level-`level` trace's first pass is verified (hard steps as small
    /// steps): `verified_by_level`'s value, or 0.
    pub fn verified(&self, level: usize) -> f64 {
        by_level(self.verified_by_level.as_deref(), level).unwrap_or(0.0)
    }

    pub(super) fn trace_v3(&self, p: &Problem, rng: &mut impl Rng) -> Trace {
        let n = p.ops.len();
        let hard = |i: usize| HARD_OPERANDS.contains(&p.ops[i].1);
        // Drawn only when set, so the traces of a teacher without it stay the same.
        let verified = self.verified_by_level.is_some() && rng.random_bool(self.verified(p.level));
        let (mut parts, mut slips) = (vec![], 0);
        // vals[i]: the value before step i as the teacher last wrote it; vals[n]: its answer.
        let mut vals = vec![p.start];
        for i in 0..n {
            let right = p.apply(i, vals[i]);
            if verified && hard(i) {
                parts.push(small_steps(vals[i], p.ops[i].1));
                vals.push(right);
                continue;
            }
            let written = if hard(i) {
                rng.random_range(0..10)
            } else {
                right
            };
            slips += usize::from(written != right);
            parts.push(p.step_text(i, vals[i], written));
            vals.push(written);
        }
        parts.push(format!("= {} ;", vals[n]));
        // A verified first pass has no unchecked hard step.
        let mut checked = vec![verified; n];
        let (mut rechecks, mut corrected, mut overturned) = (0, 0, 0);
        for nth in 1..=self.max_rounds {
            let first_unchecked = (0..n).find(|&i| hard(i) && !checked[i]);
            let q = match (first_unchecked, self.recheck_hard_prob) {
                (Some(_), Some(q)) => q,
                _ => self.recheck_prob,
            };
            if !rng.random_bool(q) {
                break;
            }
            rechecks += 1;
            let mut round = vec![];
            // The step the round starts at, and the value it writes there.
            let (start, carry) = match first_unchecked {
                Some(i) => (i, true),
                None => (rng.random_range(0..n), false),
            };
            let wrong_before = vals[n] != p.answer();
            let right = p.apply(start, vals[start]);
            // Doubt strikes a step re-checked directly (a hard one is redone as small steps),
            // from round `overturn_from_round` on.
            let doubt = !carry
                && !hard(start)
                && nth >= self.overturn_from_round
                && rng.random_bool(self.overturn(p.level));
            let value = if doubt {
                (right + if rng.random_bool(0.5) { 1 } else { 9 }) % 10
            } else {
                right
            };
            round.push(if hard(start) {
                checked[start] = true;
                small_steps(vals[start], p.ops[start].1)
            } else {
                p.step_text(start, vals[start], value)
            });
            let changed = value != vals[start + 1];
            vals[start + 1] = value;
            // The rest of the chain again when the value moved (or the round verifies it):
            // hard steps as small steps (checked from here on), the others directly.
            if changed || carry {
                for j in start + 1..n {
                    let r = p.apply(j, vals[j]);
                    round.push(if hard(j) {
                        checked[j] = true;
                        small_steps(vals[j], p.ops[j].1)
                    } else {
                        p.step_text(j, vals[j], r)
                    });
                    vals[j + 1] = r;
                }
            }
            parts.push(format!("Wait {}", round.join(" ")));
            parts.push(format!("= {} ;", vals[n]));
            let wrong_after = vals[n] != p.answer();
            corrected += usize::from(wrong_before && !wrong_after);
            overturned += usize::from(!wrong_before && wrong_after);
        }
        let unchecked = (0..n).any(|i| hard(i) && !checked[i]);
        let answer = if unchecked && self.guess_unchecked {
            rng.random_range(0..10)
        } else {
            vals[n]
        };
        let mut t = finish(parts, answer, rechecks, slips, corrected);
        t.overturned = overturned;
        t
    }
}

/// A per-level profile's value at `level` (the first value is level 1's; a level past its end
/// takes its last value); None when the profile is unset or empty.
fn by_level(profile: Option<&[f64]>, level: usize) -> Option<f64> {
    let v = profile.filter(|v| !v.is_empty())?;
    Some(v[level.saturating_sub(1).min(v.len() - 1)])
}

#[cfg(test)]
mod tests {
    use super::super::teacher::tests::vocab_ok;
    use super::super::{verify, Version, MAX_LEVEL};
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn v3(recheck: f64, hard: Option<f64>, easy: f64, rounds: usize) -> Teacher {
        Teacher {
            version: Version::V3,
            recheck_prob: recheck,
            recheck_hard_prob: hard,
            hard_rate: 0.18,
            overturn_easy: easy,
            overturn_hard: 0.0,
            max_rounds: rounds,
            ..Default::default()
        }
    }

    /// The stated answers (`= r ;` with no operation before it), in order.
    fn stated(text: &str) -> Vec<u8> {
        let w: Vec<&str> = text.split_whitespace().collect();
        (1..w.len())
            .filter(|&k| w[k] == "=" && (w[k - 1] == ";" || w[k - 1] == "<think>" || k == 0))
            .filter_map(|k| w.get(k + 1)?.parse().ok())
            .collect()
    }

    #[test]
    fn v3_states_an_answer_first_and_reflects_after_it() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let t = v3(0.5, Some(0.9), 0.1, 2);
        for level in 1..=MAX_LEVEL {
            for seed in 0..40 {
                let p = t.problem(level, seed);
                let tr = t.trace(&p, &mut rng);
                assert!(vocab_ok(&tr.text), "{}", tr.text);
                assert!(verify(&tr.text, p.answer()).format_ok, "{}", tr.text);
                let answers = stated(&tr.text);
                assert_eq!(answers.len(), 1 + tr.rechecks, "{}", tr.text);
                // Every `Wait` comes after the first stated answer.
                let first_answer = tr.text.find("; = ").expect("an answer");
                if let Some(w) = tr.text.find("Wait") {
                    assert!(w > first_answer, "{}", tr.text);
                }
                // The final answer is the last stated one (no guessing configured).
                let last = *answers.last().expect("answer");
                assert!(
                    tr.text.contains(&format!("<answer> {last} </answer>")),
                    "{}",
                    tr.text
                );
            }
        }
    }

    /// A round on a chain with a guessed hard step corrects it; with no overturns, a teacher
    /// that always reflects on hard chains is always right.
    #[test]
    fn v3_reflection_corrects_guesses() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let t = v3(0.0, Some(1.0), 0.0, 1);
        let (mut slips, mut right) = (0, 0);
        for seed in 0..300 {
            let p = t.problem(6, seed);
            let tr = t.trace(&p, &mut rng);
            slips += tr.slips;
            right += usize::from(verify(&tr.text, p.answer()).correct);
            assert_eq!(tr.overturned, 0);
        }
        assert!(slips > 50, "few guesses to correct ({slips})");
        assert_eq!(right, 300);
    }

    /// On level 1 (no hard step) a re-check overturns a right answer at `overturn_easy`, and
    /// less often on harder levels.
    #[test]
    fn v3_reflection_overturns_right_answers_more_on_easy_levels() {
        let t = v3(1.0, Some(1.0), 0.3, 1);
        let rate = |level: usize| {
            let mut rng = ChaCha8Rng::seed_from_u64(level as u64);
            let n = 2000;
            let wrong = (0..n)
                .filter(|&seed| {
                    let p = t.problem(level, seed);
                    let tr = t.trace(&p, &mut rng);
                    tr.overturned == 1 && !verify(&tr.text, p.answer()).correct
                })
                .count();
            wrong as f64 / n as f64
        };
        let easy = rate(1);
        assert!((easy - 0.3).abs() < 0.04, "level 1 overturn rate {easy}");
        assert!(t.overturn(1) > t.overturn(5) && t.overturn(MAX_LEVEL) == 0.0);
        assert!(rate(2) < easy, "level 2 overturns as often as level 1");
    }

    /// A per-level profile replaces the line: overturns on the middle levels only, none on
    /// levels 1-2, and the last value for the levels past the profile's end.
    #[test]
    fn v3_a_per_level_profile_places_overturns_where_it_says() {
        let t = Teacher {
            overturn_by_level: Some(vec![0.0, 0.0, 0.3, 0.3, 0.05]),
            ..v3(1.0, Some(1.0), 0.3, 1)
        };
        assert_eq!(
            (1..=MAX_LEVEL).map(|l| t.overturn(l)).collect::<Vec<_>>(),
            [0.0, 0.0, 0.3, 0.3, 0.05, 0.05, 0.05, 0.05]
        );
        let overturned = |level: usize| {
            let mut rng = ChaCha8Rng::seed_from_u64(level as u64);
            (0..1000)
                .map(|seed| t.trace(&t.problem(level, seed), &mut rng).overturned)
                .sum::<usize>()
        };
        assert_eq!(overturned(1) + overturned(2), 0);
        assert!(overturned(3) > 150, "level 3 overturns {}", overturned(3));
        // Unset, the line: level 1 at overturn_easy.
        assert_eq!(v3(1.0, Some(1.0), 0.3, 1).overturn(1), 0.3);
    }

    /// With `overturn_from_round = 2` a first round only confirms: a level-1 trace with one
    /// round is never overturned, while a second round overturns at `overturn_easy`.
    #[test]
    fn v3_first_rounds_confirm_when_doubt_starts_at_round_two() {
        let t = Teacher {
            overturn_from_round: 2,
            ..v3(1.0, Some(1.0), 0.3, 2)
        };
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let (mut first_round_doubts, mut overturned, n) = (0, 0, 2000);
        for seed in 0..n {
            let p = t.problem(1, seed);
            let tr = t.trace(&p, &mut rng);
            assert_eq!(tr.rechecks, 2, "{}", tr.text);
            // The first re-stated answer is still the right one.
            first_round_doubts += usize::from(stated(&tr.text)[1] != p.answer());
            overturned += tr.overturned;
        }
        assert_eq!(first_round_doubts, 0);
        let rate = overturned as f64 / n as f64;
        assert!(
            (rate - 0.3).abs() < 0.04,
            "second-round overturn rate {rate}"
        );
    }
}

#[cfg(test)]
mod hidden_tests {
    //! `chain_length` and `verified_by_level`: a class the prompt does not show (study v5's X6).
    use super::super::{verify, Version};
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// X6's teacher: four operations at every level; level 1 guesses its hard steps (reflection
    /// corrects them), level 2 verifies them in its first pass and its second rounds overturn.
    fn hidden() -> Teacher {
        Teacher {
            version: Version::V3,
            recheck_prob: 1.0,
            recheck_hard_prob: Some(1.0),
            hard_rate: 0.15,
            guess_unchecked: true,
            overturn_by_level: Some(vec![0.0, 0.5]),
            max_rounds: 2,
            overturn_from_round: 2,
            chain_length: Some(4),
            verified_by_level: Some(vec![0.0, 1.0]),
            ..Default::default()
        }
    }

    /// The same seed draws the same prompt at every level, of `chain_length` operations, with
    /// hard operations at the rate of a four-operation chain: the level is hidden.
    #[test]
    fn a_fixed_chain_length_hides_the_level() {
        let t = hidden();
        assert_eq!(
            (t.hard_prob(1), t.hard_prob(2)),
            (t.hard_prob(4), t.hard_prob(4))
        );
        let mut hard = 0;
        for seed in 0..400 {
            let (a, b) = (t.problem(1, seed), t.problem(2, seed));
            assert_eq!((a.prompt(), a.ops.len(), a.level), (b.prompt(), 4, 1));
            assert_eq!(b.level, 2);
            hard += a
                .ops
                .iter()
                .filter(|o| HARD_OPERANDS.contains(&o.1))
                .count();
        }
        let rate = hard as f64 / 1600.0;
        assert!((rate - 0.3).abs() < 0.04, "hard rate {rate}");
        // Unset, a level's problem is as before: its level's count of operations.
        let plain = Teacher {
            chain_length: None,
            ..hidden()
        };
        assert_eq!(
            plain.problem(3, 7),
            Problem::generate_v2(3, 7, plain.hard_prob(3))
        );
    }

    /// Level 1 guesses hard steps and its rounds correct them, never overturning; level 2
    /// writes hard steps as small steps first (no slip) and only its rounds can be wrong.
    #[test]
    fn the_hidden_class_sets_whether_reflection_pays_or_harms() {
        let t = hidden();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (mut slips, mut corrected, mut overturned) = ([0; 2], [0; 2], [0; 2]);
        for seed in 0..2000 {
            for level in [1, 2] {
                let p = t.problem(level, seed);
                let tr = t.trace(&p, &mut rng);
                let k = level - 1;
                slips[k] += tr.slips;
                corrected[k] += tr.corrected;
                overturned[k] += tr.overturned;
                if level == 1 {
                    // Every round runs (recheck 1.0), so every guess is corrected.
                    assert!(verify(&tr.text, p.answer()).correct, "{}", tr.text);
                }
            }
        }
        assert!(
            slips[0] > 500 && corrected[0] > 500,
            "{slips:?} {corrected:?}"
        );
        assert_eq!((overturned[0], slips[1], corrected[1]), (0, 0, 0));
        // The second round doubts a step re-checked directly: 0.5 x the 70 % that are not hard.
        let rate = overturned[1] as f64 / 2000.0;
        assert!((rate - 0.35).abs() < 0.05, "level 2's overturn rate {rate}");
        assert_eq!(t.verified(5), 1.0);
        assert_eq!(Teacher::default().verified(1), 0.0);
    }
}
