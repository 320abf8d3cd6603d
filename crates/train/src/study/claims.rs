//! The study's claims, decided from the runs instead of read by hand: for each claim of the
//! papers the testbed can test, the paired difference against its comparison (seed s of a
//! method against seed s of the other: same SFT start, same data order), a 95 % interval
//! (Student t over the seeds' differences), and a verdict: "holds" when the interval lies on
//! the claimed side, "fails" when it lies on the opposite side, "unresolved" otherwise (or with
//! one seed). Beside it, a robust verdict from an exact paired sign-flip permutation test of
//! the mean difference (one-sided, 5 %, in each direction): one seed that collapses on the
//! claimed side widens the t interval past 0, but cannot move the sign-flip test, because
//! flipping it only makes the mean less extreme. The test was chosen before testbed v3 had
//! results (issue 36); with 5 seeds its smallest p-value is 1/32, so it can decide a claim
//! only when every seed agrees. `cargo xtask repro` (xtask/src/summary.rs) puts the section
//! into docs/results.md; research code calls `section`, `paired` or `sign_flip_p` on its own
//! runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What a claim reads from one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    /// Final evaluation pass@1, mean over levels.
    pub acc: f64,
    /// Final evaluation completion tokens.
    pub tokens: f64,
    /// Final evaluation completion tokens by level, easiest first.
    pub tokens_by_level: Vec<f64>,
}

/// A mean difference with its 95 % interval (None with fewer than two seeds), and how many of
/// the `n` differences are below 0: a sign count that one outlier seed cannot move the way it
/// widens a t interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub mean: f64,
    pub ci: Option<(f64, f64)>,
    pub below_zero: usize,
    pub n: usize,
    /// The differences themselves (the first `MAX_FLIP_SEEDS`), for the sign-flip test.
    pub diffs: [f64; MAX_FLIP_SEEDS],
}

/// The most seeds the sign-flip test enumerates exactly (2^n sign patterns).
pub const MAX_FLIP_SEEDS: usize = 20;

/// The exact one-sided p-value of the paired sign-flip permutation test that the mean of
/// `diffs` is below `x`: the share of the 2^n sign patterns s whose mean of s·(d − x) is at
/// most the observed one (the observed pattern included, so never 0). None without
/// differences or with more than `MAX_FLIP_SEEDS`. `above` is `sign_flip_p` of the negated
/// differences at −x.
pub fn sign_flip_p(diffs: &[f64], x: f64) -> Option<f64> {
    let n = diffs.len();
    if n == 0 || n > MAX_FLIP_SEEDS {
        return None;
    }
    let d: Vec<f64> = diffs.iter().map(|v| v - x).collect();
    let observed: f64 = d.iter().sum();
    let eps = 1e-12 * d.iter().map(|v| v.abs()).sum::<f64>().max(1.0);
    let extreme = (0u32..1 << n)
        .filter(|mask| {
            let s: f64 = d
                .iter()
                .enumerate()
                .map(|(i, v)| if mask >> i & 1 == 1 { -v } else { *v })
                .sum();
            s <= observed + eps
        })
        .count();
    Some(extreme as f64 / f64::from(1u32 << n))
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.960)
}

/// The mean of paired differences and its t interval.
pub fn paired(diffs: &[f64]) -> Interval {
    let n = diffs.len();
    let mean = diffs.iter().sum::<f64>() / n.max(1) as f64;
    let ci = (n >= 2).then(|| {
        let sd = (diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
        let half = t975(n - 1) * sd / (n as f64).sqrt();
        (mean - half, mean + half)
    });
    let mut kept = [0.0; MAX_FLIP_SEEDS];
    for (k, d) in kept.iter_mut().zip(diffs) {
        *k = *d;
    }
    Interval {
        mean,
        ci,
        below_zero: diffs.iter().filter(|&&d| d < 0.0).count(),
        n,
        diffs: kept,
    }
}

/// Which test a verdict reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// The 95 % t interval lies on a side.
    T,
    /// The one-sided sign-flip p-value is below 0.05.
    SignFlip,
}

impl Interval {
    fn flips(&self) -> Option<&[f64]> {
        (self.n <= MAX_FLIP_SEEDS).then(|| &self.diffs[..self.n])
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Fails,
    Unresolved,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::Holds => "**holds**",
            Verdict::Fails => "**fails**",
            Verdict::Unresolved => "unresolved",
        }
    }
}

/// "below x" / "above x" by a test (false without an interval, or with one seed).
fn below(i: Interval, x: f64, test: Test) -> bool {
    match test {
        Test::T => i.ci.is_some_and(|(_, hi)| hi < x),
        Test::SignFlip => {
            i.n >= 2
                && i.flips()
                    .and_then(|d| sign_flip_p(d, x))
                    .is_some_and(|p| p < 0.05)
        }
    }
}
fn above(i: Interval, x: f64, test: Test) -> bool {
    match test {
        Test::T => i.ci.is_some_and(|(lo, _)| lo > x),
        Test::SignFlip => {
            let neg: Vec<f64> = i.flips().unwrap_or(&[]).iter().map(|v| -v).collect();
            i.n >= 2 && sign_flip_p(&neg, -x).is_some_and(|p| p < 0.05)
        }
    }
}

/// Holds when `i` is above `x`, fails when below (a claim that something increases).
fn rises(i: Interval, x: f64, t: Test) -> Verdict {
    if above(i, x, t) {
        Verdict::Holds
    } else if below(i, x, t) {
        Verdict::Fails
    } else {
        Verdict::Unresolved
    }
}

/// The accuracy difference is bounded below by −`loss`: the t interval's lower end at or above
/// it, or the sign-flip test that the mean is above it.
fn acc_within(acc: Interval, loss: f64, t: Test) -> bool {
    match t {
        Test::T => acc.ci.is_some_and(|(lo, _)| lo >= -loss),
        Test::SignFlip => above(acc, -loss, t),
    }
}

/// Shorter at no more than `loss` accuracy lost (holds), longer or clearly worse (fails).
fn cuts_length(acc: Interval, len: Interval, loss: f64, t: Test) -> Verdict {
    if below(len, 0.0, t) && acc_within(acc, loss, t) {
        Verdict::Holds
    } else if above(len, 0.0, t) || below(acc, -loss, t) {
        Verdict::Fails
    } else {
        Verdict::Unresolved
    }
}

/// One decided claim, as a table row.
struct Row {
    claim: String,
    comparison: String,
    acc: Interval,
    len: Interval,
    extra: Option<(String, Interval)>,
    verdict: Verdict,
    /// The same decision read from the sign-flip test.
    robust: Verdict,
}

fn fmt(i: Interval, digits: usize) -> String {
    match i.ci {
        Some((lo, hi)) => format!("{:+.digits$} [{lo:+.digits$}, {hi:+.digits$}]", i.mean),
        None => format!("{:+.digits$}", i.mean),
    }
}

/// The claims section of the report, from each method's runs by seed (keyed by method name).
/// Methods a claim needs but the study lacks skip that claim.
pub fn section(runs: &BTreeMap<&str, Vec<RunStats>>) -> String {
    let diff = |a: &str, b: &str, f: &dyn Fn(&RunStats) -> f64| -> Option<Interval> {
        let (x, y) = (runs.get(a)?, runs.get(b)?);
        let d: Vec<f64> = x.iter().zip(y).map(|(p, q)| f(p) - f(q)).collect();
        (!d.is_empty()).then(|| paired(&d))
    };
    let acc = |r: &RunStats| r.acc;
    let tok = |r: &RunStats| r.tokens;
    let mut rows = vec![];
    type Decide<'a> = &'a dyn Fn(Interval, Interval, Test) -> Verdict;
    let mut push = |claim: &str, a: &str, b: &str, decide: Decide| {
        if let (Some(da), Some(dl)) = (diff(a, b, &acc), diff(a, b, &tok)) {
            rows.push(Row {
                claim: claim.into(),
                comparison: format!("{a} − {b}"),
                acc: da,
                len: dl,
                extra: None,
                verdict: decide(da, dl, Test::T),
                robust: decide(da, dl, Test::SignFlip),
            });
        }
    };
    for m in ["kimi", "cos_fn"] {
        push(
            "(a) length-blind penalty loses accuracy",
            m,
            "standard",
            &|a, _, t| {
                if below(a, 0.0, t) {
                    Verdict::Holds
                } else if above(a, 0.0, t) {
                    Verdict::Fails
                } else {
                    Verdict::Unresolved
                }
            },
        );
    }
    for m in ["short_rl", "grpo_lambda", "care", "step_grpo"] {
        push(
            "(b) shorter at ≤ 2 points accuracy loss",
            m,
            "standard",
            &|a, l, t| cuts_length(a, l, 0.02, t),
        );
    }
    // Step-GRPO is two things, a step-count reward and an early-exit rollout; this row decides
    // (b) for the reward alone, so the report can say which part a failure of (b) comes from.
    push(
        "(b) shorter at ≤ 2 points accuracy loss (Step-GRPO's reward without its early exit)",
        "step_grpo_no_dtr",
        "standard",
        &|a, l, t| cuts_length(a, l, 0.02, t),
    );
    // The same with the trigger kept in the trained path (probed without it), the paper's text.
    push(
        "(b) shorter at ≤ 2 points accuracy loss (Step-GRPO, the trigger kept in the path)",
        "step_grpo_kept",
        "standard",
        &|a, l, t| cuts_length(a, l, 0.02, t),
    );
    push(
        "(c) GRPO-λ beats its λ = 1 control",
        "grpo_lambda",
        "grpo_lambda_lp",
        &|a, _, t| rises(a, 0.0, t),
    );
    for (m, b, what) in [
        (
            "short_rl_d1",
            "standard",
            "(e) D1 (length reward on correct answers only)",
        ),
        (
            "short_rl_d1_d2",
            "short_rl_d1",
            "(e) D2 (tolerance nucleus)",
        ),
        ("short_rl_d1_d3", "short_rl_d1", "(e) D3 (accuracy gate)"),
    ] {
        push(
            &format!("{what} adds accuracy or removes length"),
            m,
            b,
            &|a, l, t| {
                if above(a, 0.0, t) || below(l, 0.0, t) {
                    Verdict::Holds
                } else if below(a, 0.0, t) && above(l, 0.0, t) {
                    Verdict::Fails
                } else {
                    Verdict::Unresolved
                }
            },
        );
    }
    push(
        "(f) dynamic rollout beats its ablation",
        "step_grpo",
        "step_grpo_no_dtr",
        &|a, l, t| cuts_length(a, l, 0.02, t),
    );
    push(
        "(f) dynamic rollout beats its ablation (the trigger kept in the path)",
        "step_grpo_kept",
        "step_grpo_no_dtr",
        &|a, l, t| cuts_length(a, l, 0.02, t),
    );
    // (d): CARE's relative cut at the easiest level minus its relative cut at the hardest.
    if let (Some(c), Some(s)) = (runs.get("care"), runs.get("standard")) {
        let cut = |x: &RunStats, y: &RunStats, i: usize| {
            1.0 - x.tokens_by_level[i] / y.tokens_by_level[i]
        };
        let d: Vec<f64> = c
            .iter()
            .zip(s)
            .filter(|(x, _)| !x.tokens_by_level.is_empty())
            .map(|(x, y)| cut(x, y, 0) - cut(x, y, x.tokens_by_level.len() - 1))
            .collect();
        if let (false, Some(da), Some(dl)) = (
            d.is_empty(),
            diff("care", "standard", &acc),
            diff("care", "standard", &tok),
        ) {
            let e = paired(&d);
            rows.push(Row {
                claim: "(d) CARE cuts easy-level length more than hard-level length".into(),
                comparison: "care vs standard".into(),
                acc: da,
                len: dl,
                verdict: rises(e, 0.0, Test::T),
                robust: rises(e, 0.0, Test::SignFlip),
                extra: Some(("relative cut, easiest − hardest level".into(), e)),
            });
        }
    }
    let mut s = String::new();
    let seeds = runs.values().map(Vec::len).min().unwrap_or(0);
    let _ = writeln!(
        s,
        "## Claims, decided\n\nComputed by summary.rs from the runs above, not written by hand. Each row pairs seed s of a method with seed s of its comparison (same SFT start, same data order) and gives the mean difference with a 95 % interval (Student t over {seeds} seeds). A claim **holds** when its interval lies on the claimed side, **fails** when it lies on the opposite side, and is unresolved otherwise. Accuracy is the final mean pass@1 (points as fractions), length the final evaluation tokens. The seeds column counts the seeds whose difference is below 0 (accuracy / tokens), which one outlier seed cannot move the way it widens an interval. The sign-flip column decides the same claim with an exact paired sign-flip permutation test of the mean difference (one-sided, p < 0.05 in the claimed or the opposite direction; with 5 seeds only a unanimous sign can reach it), so a seed that collapses on the claimed side cannot turn a consistent sign into unresolved; it was chosen before testbed v3 had results.\n"
    );
    let _ = writeln!(
        s,
        "| Claim | Comparison | Δ accuracy | Δ eval tokens | Seeds below 0 | Verdict | Sign-flip verdict |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in &rows {
        let extra = r.extra.as_ref().map_or(String::new(), |(what, i)| {
            format!("; {what} {}", fmt(*i, 3))
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}{extra} | {}/{} / {}/{} | {} | {} |",
            r.claim,
            r.comparison,
            fmt(r.acc, 3),
            fmt(r.len, 1),
            r.acc.below_zero,
            r.acc.n,
            r.len.below_zero,
            r.len.n,
            r.verdict.text(),
            r.robust.text()
        );
    }
    let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
    let robust = |v: Verdict| rows.iter().filter(|r| r.robust == v).count();
    let _ = writeln!(
        s,
        "\n{} hold, {} fail, {} unresolved at this sample size (sign-flip: {} hold, {} fail, {} unresolved).",
        count(Verdict::Holds),
        count(Verdict::Fails),
        count(Verdict::Unresolved),
        robust(Verdict::Holds),
        robust(Verdict::Fails),
        robust(Verdict::Unresolved)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_intervals_match_the_closed_form() {
        // Differences 1, 2, 3: mean 2, sd 1, half-width 4.303 / sqrt(3).
        let i = paired(&[1.0, 2.0, 3.0]);
        let h = 4.303 / 3f64.sqrt();
        let (lo, hi) = i.ci.expect("ci");
        assert!(
            (i.mean - 2.0).abs() < 1e-12
                && (lo - (2.0 - h)).abs() < 1e-12
                && (hi - (2.0 + h)).abs() < 1e-12
        );
        assert_eq!((i.below_zero, i.n), (0, 3));
        assert_eq!(paired(&[0.5]).ci, None);
        let j = paired(&[-1.0, 0.0, -0.5, 2.0]);
        assert_eq!((j.below_zero, j.n), (2, 4), "0 is not below 0");
        assert_eq!(t975(100), 1.960);
    }

    fn stats(acc: f64, tokens: f64, by_level: [f64; 2]) -> RunStats {
        RunStats {
            acc,
            tokens,
            tokens_by_level: by_level.to_vec(),
        }
    }

    #[test]
    fn verdicts_follow_the_intervals() {
        let mut runs = BTreeMap::new();
        runs.insert(
            "standard",
            vec![
                stats(0.80, 40.0, [20.0, 60.0]),
                stats(0.82, 42.0, [21.0, 62.0]),
                stats(0.81, 41.0, [20.0, 61.0]),
            ],
        );
        // Kimi: clearly less accurate -> (a) holds.
        runs.insert(
            "kimi",
            vec![
                stats(0.60, 20.0, [10.0, 30.0]),
                stats(0.61, 21.0, [10.0, 31.0]),
                stats(0.62, 20.0, [10.0, 30.0]),
            ],
        );
        // CARE: shorter at equal accuracy, easy level cut 50 %, hard 10 % -> (b) and (d) hold.
        runs.insert(
            "care",
            vec![
                stats(0.80, 30.0, [10.0, 54.0]),
                stats(0.82, 31.0, [10.5, 55.8]),
                stats(0.81, 30.5, [10.0, 54.9]),
            ],
        );
        // Step-GRPO's reward alone: shorter, one point less accurate -> (b) holds.
        runs.insert(
            "step_grpo_no_dtr",
            vec![
                stats(0.79, 35.0, [15.0, 55.0]),
                stats(0.81, 36.0, [16.0, 56.0]),
                stats(0.80, 35.5, [15.0, 55.0]),
            ],
        );
        // Step-GRPO with the trigger kept: shorter than Standard at equal accuracy -> (b) holds;
        // as long as the reward alone -> (f) unresolved.
        runs.insert(
            "step_grpo_kept",
            vec![
                stats(0.80, 35.0, [15.0, 55.0]),
                stats(0.82, 37.0, [16.0, 56.0]),
                stats(0.81, 35.0, [15.0, 55.0]),
            ],
        );
        // Short-RL: longer -> (b) fails.
        runs.insert(
            "short_rl",
            vec![
                stats(0.80, 50.0, [20.0, 60.0]),
                stats(0.82, 52.0, [21.0, 62.0]),
                stats(0.81, 51.0, [20.0, 61.0]),
            ],
        );
        let s = section(&runs);
        // The row without its last column (the sign-flip verdict: 3 seeds never reach p < 0.05).
        let line = |claim: &str, cmp: &str| {
            let l = s
                .lines()
                .find(|l| l.contains(claim) && l.contains(cmp))
                .unwrap_or_else(|| panic!("no row {claim} {cmp} in\n{s}"));
            let t = l
                .strip_suffix(" unresolved |")
                .expect("sign-flip unresolved at 3 seeds");
            t.to_string()
        };
        assert!(line("(a)", "kimi − standard").ends_with("**holds** |"));
        assert!(line("(b)", "care − standard").ends_with("**holds** |"));
        // The seeds column: equal accuracy is not below 0.
        assert!(line("(b)", "short_rl − standard").ends_with("| 0/3 / 0/3 | **fails** |"));
        assert!(line("(b)", "step_grpo_no_dtr − standard").ends_with("| 3/3 / 3/3 | **holds** |"));
        assert!(line("(d)", "care vs standard").ends_with("**holds** |"));
        assert!(line("trigger kept", "step_grpo_kept − standard").ends_with("**holds** |"));
        assert!(line("(f)", "step_grpo_kept − step_grpo_no_dtr").ends_with("unresolved |"));
        assert!(!s.contains("cos_fn"), "a claim without its runs is skipped");
        // One seed: every verdict unresolved.
        let one: BTreeMap<_, _> = runs.iter().map(|(k, v)| (*k, v[..1].to_vec())).collect();
        assert!(section(&one).contains("0 hold, 0 fail"));
    }

    #[test]
    fn sign_flip_p_values_by_hand() {
        // Three negative differences: only the observed pattern is as low -> 1/8.
        assert_eq!(sign_flip_p(&[-1.0, -2.0, -3.0], 0.0), Some(0.125));
        // Shifting by x tests "below x": [-1, -2, -3] is not below -2.5 (mean -2).
        let p = sign_flip_p(&[-1.0, -2.0, -3.0], -2.5).expect("p");
        assert!(p > 0.5, "{p}");
        // Mixed signs: (+1, −1) -> patterns with sum <= 0 are 3 of 4.
        assert_eq!(sign_flip_p(&[1.0, -1.0], 0.0), Some(0.75));
        assert_eq!(sign_flip_p(&[], 0.0), None);
        assert_eq!(sign_flip_p(&[1.0; MAX_FLIP_SEEDS + 1], 0.0), None);
    }

    /// A claim whose every seed agrees, one of them by far more (a collapsed seed): the t
    /// interval crosses 0 and stays unresolved, the sign-flip test holds; one seed on the other
    /// side leaves both unresolved.
    #[test]
    fn a_collapsed_seed_on_the_claimed_side_cannot_unresolve_the_sign_flip_verdict() {
        let standard = vec![stats(0.80, 40.0, [20.0, 60.0]); 5];
        let kimi = |drops: [f64; 5]| -> Vec<RunStats> {
            drops
                .iter()
                .map(|d| stats(0.80 - d, 30.0, [15.0, 45.0]))
                .collect()
        };
        let row = |drops: [f64; 5]| {
            let mut runs = BTreeMap::new();
            runs.insert("standard", standard.clone());
            runs.insert("kimi", kimi(drops));
            let s = section(&runs);
            s.lines()
                .find(|l| l.contains("kimi − standard"))
                .expect("row")
                .to_string()
        };
        let collapsed = row([0.01, 0.02, 0.01, 0.015, 0.4]);
        assert!(
            collapsed.ends_with("| 5/5 / 5/5 | unresolved | **holds** |"),
            "{collapsed}"
        );
        let against = row([0.01, 0.02, 0.01, 0.015, -0.4]);
        assert!(
            against.ends_with("| unresolved | unresolved |"),
            "{against}"
        );
    }
}
