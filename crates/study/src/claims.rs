//! v3's claims, decided from the runs instead of read by hand, as a table of data (`V3_CLAIMS`:
//! claim, method, comparison, rule) read by one engine: for each claim the paired difference
//! against its comparison (seed s of a method against seed s of the other: same SFT start, same
//! data order), a 95 % interval (Student t over the seeds' differences), and a verdict: "holds"
//! when the interval lies on the claimed side, "fails" when it lies on the opposite side,
//! "unresolved" otherwise (or with one seed). Beside it, a robust verdict from the exact paired
//! sign-flip test (stats.rs) at v3's level, one-sided 5 % in each direction (so the two verdicts
//! run at different error rates; v4 fixes one α, confirmatory.rs). The test was chosen before
//! testbed v3 had results (issue 36). `cargo xtask repro` (xtask/src/summary/tables.rs) puts the
//! section into docs/results.md and docs/v3/results.md, byte for byte as before.

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use super::stats::{paired, sign_flip_p, Interval, MAX_FLIP_SEEDS};

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

/// Which test a verdict reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// The 95 % t interval lies on a side.
    T,
    /// The one-sided sign-flip p-value is below 0.05 (v3's level).
    SignFlip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Fails,
    Unresolved,
}

impl Verdict {
    pub(crate) fn text(self) -> &'static str {
        match self {
            Verdict::Holds => "**holds**",
            Verdict::Fails => "**fails**",
            Verdict::Unresolved => "unresolved",
        }
    }
}

/// v3's sign-flip level, one-sided in each direction.
const V3_FLIP_ALPHA: f64 = 0.05;

/// "below x" / "above x" by a test (false without an interval, or with one seed).
fn below(i: Interval, x: f64, test: Test) -> bool {
    match test {
        Test::T => i.ci.is_some_and(|(_, hi)| hi < x),
        Test::SignFlip => {
            i.n >= 2
                && i.flips()
                    .and_then(|d| sign_flip_p(d, x))
                    .is_some_and(|p| p < V3_FLIP_ALPHA)
        }
    }
}
fn above(i: Interval, x: f64, test: Test) -> bool {
    match test {
        Test::T => i.ci.is_some_and(|(lo, _)| lo > x),
        Test::SignFlip => {
            let neg: Vec<f64> = i.flips().unwrap_or(&[]).iter().map(|v| -v).collect();
            i.n >= 2 && sign_flip_p(&neg, -x).is_some_and(|p| p < V3_FLIP_ALPHA)
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

/// v3's decision rules, by name (the report's generic sentence describes them; v4 prints each
/// rule in words beside its row).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// Accuracy lower (holds), higher (fails).
    LosesAccuracy,
    /// Shorter at no more than `loss` accuracy lost (holds), longer OR clearly worse (fails).
    CutsLength { loss: f64 },
    /// Accuracy higher (holds), lower (fails).
    GainsAccuracy,
    /// Accuracy higher OR shorter (holds), less accurate AND longer (fails): an OR rule.
    AccuracyOrLength,
}

impl Rule {
    fn decide(self, acc: Interval, len: Interval, t: Test) -> Verdict {
        let pick = |holds: bool, fails: bool| {
            if holds {
                Verdict::Holds
            } else if fails {
                Verdict::Fails
            } else {
                Verdict::Unresolved
            }
        };
        match self {
            Rule::LosesAccuracy => pick(below(acc, 0.0, t), above(acc, 0.0, t)),
            Rule::CutsLength { loss } => pick(
                below(len, 0.0, t) && acc_within(acc, loss, t),
                above(len, 0.0, t) || below(acc, -loss, t),
            ),
            Rule::GainsAccuracy => rises(acc, 0.0, t),
            Rule::AccuracyOrLength => pick(
                above(acc, 0.0, t) || below(len, 0.0, t),
                below(acc, 0.0, t) && above(len, 0.0, t),
            ),
        }
    }
}

/// One row of v3's claim table: the claim's words, the method and its comparison, the rule.
struct Claim {
    claim: &'static str,
    method: &'static str,
    against: &'static str,
    rule: Rule,
}

const B: &str = "(b) shorter at ≤ 2 points accuracy loss";
const CUT2: Rule = Rule::CutsLength { loss: 0.02 };

/// v3's claims in report order. Step-GRPO is two things, a step-count reward and an early-exit
/// rollout; the `step_grpo_no_dtr` row decides (b) for the reward alone, so the report can say
/// which part a failure of (b) comes from; `step_grpo_kept` keeps the trigger in the trained
/// path (probed without it). (d) reads the levels and follows the table (`care_levels`).
#[rustfmt::skip]
const V3_CLAIMS: &[Claim] = &[
    Claim { claim: "(a) length-blind penalty loses accuracy", method: "kimi", against: "standard", rule: Rule::LosesAccuracy },
    Claim { claim: "(a) length-blind penalty loses accuracy", method: "cos_fn", against: "standard", rule: Rule::LosesAccuracy },
    Claim { claim: B, method: "short_rl", against: "standard", rule: CUT2 },
    Claim { claim: B, method: "grpo_lambda", against: "standard", rule: CUT2 },
    Claim { claim: B, method: "care", against: "standard", rule: CUT2 },
    Claim { claim: B, method: "step_grpo", against: "standard", rule: CUT2 },
    Claim { claim:
            "(b) shorter at ≤ 2 points accuracy loss (Step-GRPO's reward without its early exit)", method: "step_grpo_no_dtr", against: "standard", rule: CUT2 },
    Claim { claim: "(b) shorter at ≤ 2 points accuracy loss (Step-GRPO, the trigger kept in the path)", method: "step_grpo_kept", against: "standard", rule: CUT2 },
    Claim { claim: "(c) GRPO-λ beats its λ = 1 control", method: "grpo_lambda", against: "grpo_lambda_lp", rule: Rule::GainsAccuracy },
    Claim { claim: "(e) D1 (length reward on correct answers only) adds accuracy or removes length", method: "short_rl_d1", against: "standard", rule: Rule::AccuracyOrLength },
    Claim { claim: "(e) D2 (tolerance nucleus) adds accuracy or removes length", method: "short_rl_d1_d2", against: "short_rl_d1", rule: Rule::AccuracyOrLength },
    Claim { claim: "(e) D3 (accuracy gate) adds accuracy or removes length", method: "short_rl_d1_d3", against: "short_rl_d1", rule: Rule::AccuracyOrLength },
    Claim { claim: "(f) dynamic rollout beats its ablation", method: "step_grpo", against: "step_grpo_no_dtr", rule: CUT2 },
    Claim { claim: "(f) dynamic rollout beats its ablation (the trigger kept in the path)", method: "step_grpo_kept", against: "step_grpo_no_dtr", rule: CUT2 },
];

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

pub(crate) fn fmt(i: Interval, digits: usize) -> String {
    match i.ci {
        Some((lo, hi)) => format!("{:+.digits$} [{lo:+.digits$}, {hi:+.digits$}]", i.mean),
        None => format!("{:+.digits$}", i.mean),
    }
}

/// The paired differences of `f` between methods `a` and `b` (None when either is missing).
fn diff(
    runs: &BTreeMap<&str, Vec<RunStats>>,
    a: &str,
    b: &str,
    f: fn(&RunStats) -> f64,
) -> Option<Interval> {
    let (x, y) = (runs.get(a)?, runs.get(b)?);
    let d: Vec<f64> = x.iter().zip(y).map(|(p, q)| f(p) - f(q)).collect();
    (!d.is_empty()).then(|| paired(&d))
}

/// (d): CARE's relative cut at the easiest level minus its relative cut at the hardest.
fn care_levels(runs: &BTreeMap<&str, Vec<RunStats>>) -> Option<Row> {
    let (c, s) = (runs.get("care")?, runs.get("standard")?);
    let cut =
        |x: &RunStats, y: &RunStats, i: usize| 1.0 - x.tokens_by_level[i] / y.tokens_by_level[i];
    let d: Vec<f64> = c
        .iter()
        .zip(s)
        .filter(|(x, _)| !x.tokens_by_level.is_empty())
        .map(|(x, y)| cut(x, y, 0) - cut(x, y, x.tokens_by_level.len() - 1))
        .collect();
    let (da, dl) = (
        diff(runs, "care", "standard", |r| r.acc)?,
        diff(runs, "care", "standard", |r| r.tokens)?,
    );
    if d.is_empty() {
        return None;
    }
    let e = paired(&d);
    Some(Row {
        claim: "(d) CARE cuts easy-level length more than hard-level length".into(),
        comparison: "care vs standard".into(),
        acc: da,
        len: dl,
        verdict: rises(e, 0.0, Test::T),
        robust: rises(e, 0.0, Test::SignFlip),
        extra: Some(("relative cut, easiest − hardest level".into(), e)),
    })
}

/// The claims section of the report, from each method's runs by seed (keyed by method name).
/// Methods a claim needs but the study lacks skip that claim.
pub fn section(runs: &BTreeMap<&str, Vec<RunStats>>) -> String {
    let mut rows: Vec<Row> = V3_CLAIMS
        .iter()
        .filter_map(|c| {
            let da = diff(runs, c.method, c.against, |r| r.acc)?;
            let dl = diff(runs, c.method, c.against, |r| r.tokens)?;
            Some(Row {
                claim: c.claim.into(),
                comparison: format!("{} − {}", c.method, c.against),
                acc: da,
                len: dl,
                extra: None,
                verdict: c.rule.decide(da, dl, Test::T),
                robust: c.rule.decide(da, dl, Test::SignFlip),
            })
        })
        .collect();
    rows.extend(care_levels(runs));
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
