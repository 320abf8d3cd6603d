//! The testbed's SFT teachers: they turn a [`Problem`] into the completion a warmed-up model
//! imitates (data flow: problem -> teacher trace -> SFT loss; see models/testbed/README.md).
//!
//! - **v1**: every step right, plus random `Wait` re-checks of earlier steps that never change
//!   the answer. The SFT model overthinks, and outcome-only GRPO already shortens it.
//! - **v2**: some operations are *hard*: a big operand (`+ 4` .. `+ 6`), more of them the higher
//!   the level, none at levels 1 and 2. The teacher does not know the big facts, so its direct
//!   step on a hard operation writes a guess (any digit). A `Wait` re-check redoes the step just
//!   written, and redoes a hard one as small steps it does know (`+ 5` as `+ 3`, `+ 2`),
//!   so a re-check corrects a wrong guess and the chain continues from the re-checked value.
//!   Re-checks are drawn independently of everything else, so the imitating model reflects
//!   blindly, at one rate for all levels. Outcome-only GRPO then raises that rate, because
//!   reflection pays on hard problems, and the raise carries over to easy problems, where it is
//!   wasted: the papers' overthinking. A guess cannot be sharpened into the right digit without
//!   learning a new fact from reward alone, so reflection is the cheap way up for the policy.
//! - **v3**: v2's problems, but the teacher states an answer (`= r ;`) as soon as its chain
//!   ends and reflects only after it, in rounds of `Wait`: a round that starts at an unchecked
//!   hard step redoes the chain from there (hard steps as small steps), which corrects guesses;
//!   a round on a verified chain re-checks one step and confirms it, or (at `overturn(level)`,
//!   higher on easy levels) doubts it into a neighbouring digit and carries the wrong value on:
//!   reflection that talks the teacher out of a right answer. models/testbed/README.md, v3; the trace is in reflect.rs.

use super::Problem;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Which testbed the teacher writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Version {
    /// Redundant re-checks only (the first testbed; kept for comparison).
    #[default]
    V1,
    /// Hard operations (guessed) that a re-check corrects.
    V2,
    /// v2's problems; an answer first, then reflection that can correct or overturn it.
    V3,
}

/// Levels up to this one have no hard operation in v2: they are "always right without reflection".
pub const EASY_LEVELS: usize = 2;

/// The operands a v2 hard operation adds: facts the teacher does not know.
pub const HARD_OPERANDS: std::ops::RangeInclusive<u8> = 4..=6;

/// How a teacher writes its traces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Teacher {
    pub version: Version,
    /// v1: after each step, the chance of one more re-check of an earlier step (drawn repeatedly,
    /// up to `max_rechecks_per_step`). v2: the chance of re-checking the step just written.
    pub recheck_prob: f64,
    /// v1 only: the cap on re-checks after one step.
    pub max_rechecks_per_step: usize,
    /// v2 only: the re-check probability after a hard step; None re-checks blindly, at
    /// `recheck_prob` after every step. Set higher than `recheck_prob`, the model can learn
    /// where reflection pays (the aimed variant, see models/testbed/README.md).
    pub recheck_hard_prob: Option<f64>,
    /// v2 only: the chance that an operation is hard, added by each level above
    /// [`EASY_LEVELS`] (0.05: 5 % of level 3's operations, 20 % of level 6's), capped at 0.9.
    pub hard_rate: f64,
    /// v2 only: a trace that left a hard step unchecked answers with a guess (any digit), not
    /// with the value its chain reached: the teacher knows it did not verify. The model's
    /// answer confidence then says whether its chain was checked, the signal an early exit
    /// at a `Wait` (Step-GRPO, DEER) reads. Off, the answer copies the chain's value.
    pub guess_unchecked: bool,
    /// v3 only: the chance that a re-check of a verified chain overturns a right step, at
    /// level 1; it falls linearly to `overturn_hard` at the top level.
    pub overturn_easy: f64,
    /// v3 only: the overturn chance at the top level ([`super::MAX_LEVEL`]).
    pub overturn_hard: f64,
    /// v3 only: the overturn chance per level (the first value is level 1's), in place of the
    /// straight line from `overturn_easy` to `overturn_hard`: a profile a line cannot draw,
    /// such as overturns on the middle levels only (CARE's premise). A level past its end
    /// takes its last value.
    pub overturn_by_level: Option<Vec<f64>>,
    /// v3 only: the most reflection rounds after the first answer.
    pub max_rounds: usize,
    /// v3 only: the first round (1-based) in which doubt can overturn a right step; 2 makes
    /// the first re-check of a chain a plain confirmation and only second-guessing risky.
    pub overturn_from_round: usize,
    /// Every problem's operation count whatever its level (None: the level's). The level is
    /// then a class the prompt does not show: problems of every level are drawn alike (hard
    /// operations at [`Teacher::hard_prob`] of a chain this long), and the level sets only the
    /// teacher's overturn and verified chances (study v5's X6, CARE's hidden difficulty).
    pub chain_length: Option<usize>,
    /// v3 only: the chance per level (the first value is level 1's) that the teacher writes
    /// its first pass with the hard steps as small steps it knows: a verified chain with
    /// nothing to correct, on which reflection can only confirm or overturn. None: never (the
    /// hard steps are guessed). A level past its end takes its last value.
    pub verified_by_level: Option<Vec<f64>>,
}

impl Default for Teacher {
    fn default() -> Self {
        Self {
            version: Version::V1,
            recheck_prob: 0.5,
            max_rechecks_per_step: 2,
            recheck_hard_prob: None,
            hard_rate: 0.05,
            guess_unchecked: false,
            overturn_easy: 0.10,
            overturn_hard: 0.02,
            overturn_by_level: None,
            max_rounds: 2,
            overturn_from_round: 1,
            chain_length: None,
            verified_by_level: None,
        }
    }
}

/// One teacher completion and what went into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub text: String,
    /// `Wait` re-checks written.
    pub rechecks: usize,
    /// Steps written with a wrong result (v2's wrong guesses).
    pub slips: usize,
    /// Wrong steps a re-check corrected; the trace's answer is right when `slips == corrected`.
    pub corrected: usize,
    /// v3: right values a re-check turned wrong.
    pub overturned: usize,
}

impl Teacher {
    /// The chance that an operation of a level-`level` problem is hard (0 in v1); with
    /// `chain_length`, that of a chain that long at every level.
    pub fn hard_prob(&self, level: usize) -> f64 {
        let ops = self.chain_length.unwrap_or(level);
        match self.version {
            Version::V1 => 0.0,
            Version::V2 | Version::V3 => {
                (self.hard_rate * ops.saturating_sub(EASY_LEVELS) as f64).clamp(0.0, 0.9)
            }
        }
    }

    /// Problem `seed` of `level` in this teacher's testbed: v1's, or v2's with hard operations.
    /// With `chain_length` the problem is the same at every level (the level is hidden).
    pub fn problem(&self, level: usize, seed: u64) -> Problem {
        let ops = self.chain_length.unwrap_or(level);
        let p = match self.version {
            Version::V1 => Problem::generate(ops, seed),
            Version::V2 | Version::V3 => Problem::generate_v2(ops, seed, self.hard_prob(level)),
        };
        Problem { level, ..p }
    }

    /// A completion of `p`: its steps, the re-checks, `</think>`, then the answer the chain
    /// reached (in v2 a wrong one when a slip went uncorrected).
    pub fn trace(&self, p: &Problem, rng: &mut impl Rng) -> Trace {
        match self.version {
            Version::V1 => self.trace_v1(p, rng),
            Version::V2 => self.trace_v2(p, rng),
            Version::V3 => self.trace_v3(p, rng),
        }
    }

    fn trace_v1(&self, p: &Problem, rng: &mut impl Rng) -> Trace {
        let mut parts = vec![];
        let mut rechecks = 0;
        for i in 0..p.ops.len() {
            parts.push(p.step(i));
            for _ in 0..self.max_rechecks_per_step {
                if !rng.random_bool(self.recheck_prob) {
                    break;
                }
                parts.push(format!("Wait {}", p.step(rng.random_range(0..=i))));
                rechecks += 1;
            }
        }
        finish(parts, p.answer(), rechecks, 0, 0)
    }

    fn trace_v2(&self, p: &Problem, rng: &mut impl Rng) -> Trace {
        let (mut parts, mut rechecks, mut slips, mut corrected) = (vec![], 0, 0, 0);
        let (mut value, mut unchecked) = (p.start, false);
        for i in 0..p.ops.len() {
            let before = value;
            let right = p.apply(i, before);
            let d = p.ops[i].1;
            let hard = HARD_OPERANDS.contains(&d);
            let written = if hard { rng.random_range(0..10) } else { right };
            slips += usize::from(written != right);
            parts.push(p.step_text(i, before, written));
            value = written;
            let q = match (hard, self.recheck_hard_prob) {
                (true, Some(q)) => q,
                _ => self.recheck_prob,
            };
            let recheck = rng.random_bool(q);
            unchecked |= hard && !recheck;
            if recheck {
                let redo = if hard {
                    small_steps(before, d)
                } else {
                    p.step_text(i, before, right)
                };
                parts.push(format!("Wait {redo}"));
                rechecks += 1;
                corrected += usize::from(written != right);
                value = right;
            }
        }
        // Drawn only when enabled, so the traces of a teacher without it stay the same.
        let answer = if unchecked && self.guess_unchecked {
            rng.random_range(0..10)
        } else {
            value
        };
        finish(parts, answer, rechecks, slips, corrected)
    }
}

/// `before + d` as one chain of additions of at most `MAX_STEP`, the facts a v2 teacher knows:
/// `+ 5` from 8 is `8 + 3 = 1 + 2 = 3 ;`. One `;` per chain keeps "one `;` per step or
/// re-check", which the model uses to keep its place in the problem.
pub(super) fn small_steps(before: u8, d: u8) -> String {
    let (mut v, mut left, mut out) = (before, d, before.to_string());
    while left > 0 {
        let s = left.min(super::MAX_STEP);
        v = (v + s) % 10;
        left -= s;
        out.push_str(&format!(" + {s} = {v}"));
    }
    out + " ;"
}

pub(super) fn finish(
    mut parts: Vec<String>,
    answer: u8,
    rechecks: usize,
    slips: usize,
    corrected: usize,
) -> Trace {
    parts.push(format!("</think> <answer> {answer} </answer> <|im_end|>"));
    Trace {
        text: parts.join(" "),
        rechecks,
        slips,
        corrected,
        overturned: 0,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{verify, Verdict, MAX_LEVEL, MAX_STEP, VOCAB};
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// How many of `p`'s operations are hard.
    fn hard_ops(p: &Problem) -> usize {
        p.ops
            .iter()
            .filter(|o| HARD_OPERANDS.contains(&o.1))
            .count()
    }

    pub(in crate::testbed) fn vocab_ok(text: &str) -> bool {
        text.split_whitespace().all(|w| VOCAB.contains(&w))
    }

    #[test]
    fn v1_traces_are_correct_and_overthink() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let t = Teacher::default();
        let mut total_rechecks = 0;
        for level in 1..=MAX_LEVEL {
            for seed in 0..20 {
                let p = Problem::generate(level, seed);
                let tr = t.trace(&p, &mut rng);
                total_rechecks += tr.rechecks;
                assert_eq!(
                    verify(&tr.text, p.answer()),
                    Verdict {
                        correct: true,
                        format_ok: true,
                        reward: 1.0,
                        reason: "correct"
                    }
                );
                assert_eq!(tr.text.matches("Wait").count(), tr.rechecks);
                // Necessary steps: one "=" per operation, plus one per re-check.
                assert_eq!(tr.text.matches('=').count(), level + tr.rechecks);
                assert_eq!((tr.slips, tr.corrected), (0, 0));
                assert!(vocab_ok(&tr.text), "{}", tr.text);
                assert!(vocab_ok(&p.prompt()));
            }
        }
        assert!(total_rechecks > 100, "{total_rechecks}");
        let lazy = Teacher {
            recheck_prob: 0.0,
            ..Teacher::default()
        };
        assert_eq!(lazy.trace(&Problem::generate(3, 1), &mut rng).rechecks, 0);
    }

    #[test]
    fn v2_hard_operations_grow_with_level_and_a_recheck_corrects_them() {
        let t = Teacher {
            version: Version::V2,
            recheck_prob: 0.3,
            ..Teacher::default()
        };
        assert_eq!(t.hard_prob(1), 0.0);
        assert_eq!(t.hard_prob(2), 0.0);
        assert!((t.hard_prob(6) - 0.2).abs() < 1e-12);
        assert_eq!(small_steps(8, 5), "8 + 3 = 1 + 2 = 3 ;");
        assert_eq!(small_steps(8, 9), "8 + 3 = 1 + 3 = 4 + 3 = 7 ;");
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (mut wrong_by_level, mut corrected) = (vec![0usize; MAX_LEVEL + 1], 0);
        for (level, wrong) in wrong_by_level.iter_mut().enumerate().skip(1) {
            for seed in 0..400 {
                let p = t.problem(level, seed);
                let hard = hard_ops(&p);
                assert!(level > EASY_LEVELS || hard == 0);
                let tr = t.trace(&p, &mut rng);
                assert!(vocab_ok(&tr.text), "{}", tr.text);
                assert!(vocab_ok(&p.prompt()));
                assert_eq!(tr.text.matches("Wait").count(), tr.rechecks);
                assert!(tr.slips <= hard);
                let v = verify(&tr.text, p.answer());
                assert!(v.format_ok);
                // Every wrong step re-checked: the answer is right (two wrong guesses can also
                // cancel out by luck, so the converse does not hold).
                assert!(tr.slips != tr.corrected || v.correct, "{}", tr.text);
                *wrong += usize::from(!v.correct);
                corrected += tr.corrected;
                // Every step is `a + d = r ;` from the value written last, and every re-check
                // `Wait a (+ s = v)+ ;` from the start of the step it redoes, its additions right.
                let (mut last, mut start) = (p.start.to_string(), p.start.to_string());
                let mut steps = 0;
                for w in tr.text.split(" ;").filter(|w| w.contains('=')) {
                    let w: Vec<&str> = w.split_whitespace().collect();
                    if w[0] == "Wait" {
                        assert_eq!(w[1], start, "{}", tr.text);
                        let mut v: u8 = w[1].parse().expect("start");
                        for c in w[2..].chunks(4) {
                            let d: u8 = c[1].parse().expect("operand");
                            assert!(c[0] == "+" && c[2] == "=" && d <= MAX_STEP, "{}", tr.text);
                            v = (v + d) % 10;
                            assert_eq!(c[3], v.to_string(), "{}", tr.text);
                        }
                    } else {
                        assert_eq!(
                            (w.len(), w[1], w[3], w[0]),
                            (5, "+", "=", last.as_str()),
                            "{}",
                            tr.text
                        );
                        start = w[0].to_string();
                        steps += 1;
                    }
                    last = w[w.len() - 1].to_string();
                }
                assert_eq!(steps, level);
            }
        }
        assert_eq!(wrong_by_level[1] + wrong_by_level[2], 0);
        assert!(corrected > 50, "{corrected}");
        assert!(wrong_by_level[3] < wrong_by_level[6], "{wrong_by_level:?}");
        assert!(wrong_by_level[6] > 100, "{wrong_by_level:?}");
        // Aimed: re-checks after every hard step and after no other, so every trace is right.
        let aimed = Teacher {
            recheck_prob: 0.0,
            recheck_hard_prob: Some(1.0),
            ..t.clone()
        };
        for seed in 0..100 {
            let p = aimed.problem(6, seed);
            let tr = aimed.trace(&p, &mut rng);
            let hard = hard_ops(&p);
            assert_eq!(tr.rechecks, hard, "{}", tr.text);
            assert!(verify(&tr.text, p.answer()).correct, "{}", tr.text);
        }
        // Re-checking every step makes every trace right.
        let careful = Teacher {
            recheck_prob: 1.0,
            ..t.clone()
        };
        for seed in 0..50 {
            let p = careful.problem(6, seed);
            let tr = careful.trace(&p, &mut rng);
            assert!(verify(&tr.text, p.answer()).correct, "{}", tr.text);
        }
    }

    #[test]
    fn v2_guess_unchecked_answers_a_guess_only_after_an_unchecked_hard_step() {
        let t = Teacher {
            version: Version::V2,
            recheck_prob: 0.2,
            recheck_hard_prob: Some(0.5),
            hard_rate: 0.15,
            guess_unchecked: true,
            ..Teacher::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (mut guessed, mut copies) = (0, 0);
        for seed in 0..800 {
            let p = t.problem(6, seed);
            let tr = t.trace(&p, &mut rng);
            assert!(vocab_ok(&tr.text), "{}", tr.text);
            assert!(verify(&tr.text, p.answer()).format_ok, "{}", tr.text);
            let (think, answer) = tr.text.split_once("</think>").expect("think");
            let answer = answer.split_whitespace().nth(1).expect("answer");
            let chain = think.split_whitespace().rev().nth(1).unwrap_or("");
            // The hard steps, and the re-checks that redid one (a chain of more than one
            // addition); a hard step left unchecked makes the answer a guess.
            let parts: Vec<&str> = think.split(" ;").filter(|w| w.contains('=')).collect();
            let hard = hard_ops(&p);
            let hard_rechecks = parts
                .iter()
                .filter(|w| w.contains("Wait") && w.matches('=').count() > 1)
                .count();
            if hard_rechecks < hard {
                guessed += 1;
                copies += usize::from(answer == chain);
            } else {
                assert_eq!(answer, chain, "{}", tr.text);
                assert!(verify(&tr.text, p.answer()).correct, "{}", tr.text);
            }
        }
        // A guess is the chain's value about one time in ten, not every time.
        assert!(guessed > 300, "{guessed}");
        assert!(copies * 4 < guessed, "{copies} of {guessed}");
    }
}
