//! The efficiency metrics efficient-reasoning papers report beside accuracy, as pure functions
//! of per-sample outcomes (docs/methods.md, Evaluation metrics): avg@n and pass@k, accuracy per
//! 1k tokens, the completion-rate × conditional-correctness × length split, length of right and
//! of wrong samples, the truncation rate, and against a baseline run the Accuracy-Efficiency
//! Score (O1-Pruner) and pass@k retention. protocol.rs feeds them the samples of
//! `cargo xtask eval`; table.rs prints them.

use serde::{Deserialize, Serialize};
use terse_reward::metrics::pass_at_k;

/// What the metrics need of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleOutcome {
    /// Generated tokens.
    pub len: usize,
    /// It ended (an end token or stop string) before the generation limit.
    pub finished: bool,
    pub correct: bool,
}

/// The efficiency of one model's samples, averaged over samples (every problem weighs the same,
/// as R1's avg@n does), with `k` = the samples per problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// avg@n: the share of right samples.
    pub accuracy: f64,
    /// pass@k (unbiased, k = n) averaged over problems.
    pub pass_k: f64,
    pub k: usize,
    pub len_mean: f64,
    /// accuracy / (mean tokens / 1000); None when no token was generated.
    pub acc_per_1k: Option<f64>,
    /// The share of samples that finished before the limit.
    pub completion_rate: f64,
    /// The accuracy among finished samples; None when none finished.
    pub conditional_correctness: Option<f64>,
    /// The share that hit the limit: 1 − completion rate.
    pub truncation_rate: f64,
    /// Mean length of right and of wrong samples; None when there is none.
    pub len_correct: Option<f64>,
    pub len_incorrect: Option<f64>,
}

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// accuracy per 1000 generated tokens.
pub fn acc_per_1k(accuracy: f64, len_mean: f64) -> Option<f64> {
    (len_mean > 0.0).then(|| accuracy / (len_mean / 1000.0))
}

/// The metrics of `problems`, each the outcomes of its samples (the same number per problem).
pub fn efficiency(problems: &[Vec<SampleOutcome>]) -> Efficiency {
    let all = || problems.iter().flatten();
    let k = problems.iter().map(Vec::len).max().unwrap_or(0);
    let accuracy = mean(all().map(|s| f64::from(u8::from(s.correct)))).unwrap_or(0.0);
    let len_mean = mean(all().map(|s| s.len as f64)).unwrap_or(0.0);
    let completion_rate = mean(all().map(|s| f64::from(u8::from(s.finished)))).unwrap_or(0.0);
    let pass_k = mean(
        problems
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| pass_at_k(p.len(), p.iter().filter(|s| s.correct).count(), p.len())),
    )
    .unwrap_or(0.0);
    Efficiency {
        accuracy,
        pass_k,
        k,
        len_mean,
        acc_per_1k: acc_per_1k(accuracy, len_mean),
        completion_rate,
        conditional_correctness: mean(
            all()
                .filter(|s| s.finished)
                .map(|s| f64::from(u8::from(s.correct))),
        ),
        truncation_rate: if problems.iter().all(Vec::is_empty) {
            0.0
        } else {
            1.0 - completion_rate
        },
        len_correct: mean(all().filter(|s| s.correct).map(|s| s.len as f64)),
        len_incorrect: mean(all().filter(|s| !s.correct).map(|s| s.len as f64)),
    }
}

/// The Accuracy-Efficiency Score's constants (O1-Pruner, arXiv 2501.12570, §5: α = 1, β = 3 for
/// a gain, γ = 5 for a drop; docs/methods.md says why these and how the paper's Table 2 differs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AesWeights {
    pub alpha: f64,
    pub beta_plus: f64,
    pub beta_minus: f64,
}

impl Default for AesWeights {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            beta_plus: 3.0,
            beta_minus: 5.0,
        }
    }
}

/// A run's Accuracy-Efficiency Score against a baseline, with its two relative changes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Aes {
    /// (L_base − L) / L_base: the share of tokens saved.
    pub delta_len: f64,
    /// (A − A_base) / A_base: the relative accuracy change.
    pub delta_acc: f64,
    /// α·ΔL + β+·ΔA when ΔA ≥ 0, else α·ΔL − β−·|ΔA|.
    pub score: f64,
}

/// AES of (accuracy, mean length) against the baseline's; None when the baseline's accuracy or
/// length is 0 (the relative changes are undefined).
pub fn aes(w: AesWeights, acc: f64, len: f64, base_acc: f64, base_len: f64) -> Option<Aes> {
    if base_acc <= 0.0 || base_len <= 0.0 {
        return None;
    }
    let delta_len = (base_len - len) / base_len;
    let delta_acc = (acc - base_acc) / base_acc;
    let score = if delta_acc >= 0.0 {
        w.alpha * delta_len + w.beta_plus * delta_acc
    } else {
        w.alpha * delta_len - w.beta_minus * delta_acc.abs()
    };
    Some(Aes {
        delta_len,
        delta_acc,
        score,
    })
}

/// pass@k / base pass@k: how much of the baseline's reach a shorter model keeps; None when the
/// baseline solves nothing.
pub fn pass_k_retention(pass_k: f64, base_pass_k: f64) -> Option<f64> {
    (base_pass_k > 0.0).then(|| pass_k / base_pass_k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(len: usize, finished: bool, correct: bool) -> SampleOutcome {
        SampleOutcome {
            len,
            finished,
            correct,
        }
    }

    /// Two problems of two samples, worked by hand.
    #[test]
    fn efficiency_by_hand() {
        let problems = vec![
            vec![s(100, true, true), s(300, true, false)],
            vec![s(500, false, false), s(100, true, false)],
        ];
        let e = efficiency(&problems);
        // 1 right of 4; tokens 1000 / 4 = 250.
        assert_eq!((e.accuracy, e.len_mean, e.k), (0.25, 250.0, 2));
        // 0.25 / 0.25k tokens = 1 per 1k.
        assert_eq!(e.acc_per_1k, Some(1.0));
        // pass@2: problem 1 solved, problem 2 not.
        assert_eq!(e.pass_k, 0.5);
        // 3 of 4 finished, 1 of those 3 right; 1 truncated.
        assert_eq!(e.completion_rate, 0.75);
        assert_eq!(e.conditional_correctness, Some(1.0 / 3.0));
        assert_eq!(e.truncation_rate, 0.25);
        // The split multiplies back to the accuracy when truncated samples are wrong.
        let split = e.completion_rate * e.conditional_correctness.unwrap_or(0.0);
        assert!((split - e.accuracy).abs() < 1e-12);
        assert_eq!(e.len_correct, Some(100.0));
        assert_eq!(e.len_incorrect, Some(300.0));
    }

    #[test]
    fn empty_subsets_are_none() {
        let e = efficiency(&[vec![s(10, false, false)]]);
        assert_eq!((e.conditional_correctness, e.len_correct), (None, None));
        assert_eq!(e.len_incorrect, Some(10.0));
        assert_eq!(e.truncation_rate, 1.0);
        let none = efficiency(&[]);
        assert_eq!(
            (none.accuracy, none.acc_per_1k, none.truncation_rate),
            (0.0, None, 0.0)
        );
        assert_eq!(acc_per_1k(0.5, 0.0), None);
    }

    /// AES by hand: a gain (β+ = 3) and a drop (β− = 5, counted against the run).
    #[test]
    fn aes_by_hand() {
        let w = AesWeights::default();
        // 20 % shorter, accuracy 0.6 -> 0.66 (+10 %): 0.2 + 3 · 0.1 = 0.5.
        let a = aes(w, 0.66, 80.0, 0.6, 100.0).expect("defined");
        assert!((a.delta_len - 0.2).abs() < 1e-12 && (a.delta_acc - 0.1).abs() < 1e-12);
        assert!((a.score - 0.5).abs() < 1e-12, "{a:?}");
        // 20 % shorter, accuracy 0.6 -> 0.5 (−1/6): 0.2 − 5/6.
        let d = aes(w, 0.5, 80.0, 0.6, 100.0).expect("defined");
        assert!((d.score - (0.2 - 5.0 / 6.0)).abs() < 1e-12, "{d:?}");
        // Equal runs score 0; a longer run at equal accuracy scores its negative ΔL.
        assert_eq!(aes(w, 0.6, 100.0, 0.6, 100.0).map(|a| a.score), Some(0.0));
        assert!((aes(w, 0.6, 150.0, 0.6, 100.0).expect("x").score + 0.5).abs() < 1e-12);
        assert_eq!(aes(w, 0.6, 10.0, 0.0, 100.0), None);
        assert_eq!(aes(w, 0.6, 10.0, 0.5, 0.0), None);
    }

    /// O1-Pruner's Table 2 (Marco-o1-7B on MATH, baseline 73.8 % at 1156 tokens): O1-Pruner's
    /// row (77.5 %, 657 tokens) has AES 0.58, which the defaults reproduce. Its DPO row (71.8 %,
    /// 761 tokens) is printed as 0.42, which is ΔL + 3·|ΔA|: the table adds a drop with β = 3
    /// instead of subtracting it with γ = 5 (β− = −3 here reproduces it; the text's −5 gives
    /// 0.21). docs/methods.md, Evaluation metrics.
    #[test]
    fn aes_reproduces_o1_prunes_table_2() {
        let round2 = |x: f64| (x * 100.0).round() / 100.0;
        let w = AesWeights::default();
        let gain = aes(w, 77.5, 657.0, 73.8, 1156.0).expect("defined");
        assert_eq!(round2(gain.score), 0.58);
        let drop = aes(w, 71.8, 761.0, 73.8, 1156.0).expect("defined");
        assert_eq!(round2(drop.score), 0.21);
        let as_printed = AesWeights {
            beta_minus: -3.0,
            ..w
        };
        let printed = aes(as_printed, 71.8, 761.0, 73.8, 1156.0).expect("defined");
        assert_eq!(round2(printed.score), 0.42);
    }

    #[test]
    fn retention() {
        assert_eq!(pass_k_retention(0.45, 0.9), Some(0.5));
        assert_eq!(pass_k_retention(0.5, 0.0), None);
    }
}
