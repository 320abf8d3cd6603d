//! v4's claims as planned in docs/v4/plan.md, as a table of data (`CLAIMS`: id, family, what,
//! method, comparison, rule) read by one engine. Every claim direction is tested one-sided at
//! α = 0.025 by both the t test (its two-sided 95 % interval printed) and the exact sign-flip
//! test; compound rules are intersection-union tests (p = the larger part's); Holm's step-down
//! runs within each confirmatory family, beside the raw decision, and every rule is printed in
//! words next to its row. Data flow: seeds.csv (seeds.rs) -> [`tables`] -> docs/v4/results.md.
//! A const table, not a TOML file: the rules are a closed enum the compiler checks, and the
//! plan's own table is the human-readable copy (a test checks the two agree).

use super::seeds::SeedRow;
use super::stats::{flip_p, holm, paired_at, t_p, Interval, Side};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One α for every one-sided test (the two-sided 95 % interval's side).
pub const ALPHA: f64 = 0.025;

/// Which family a claim belongs to: Holm runs within a confirmatory family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The nine papers' primary claims on the main design.
    Primary,
    /// CARE on its own premise (plan section 7b).
    CarePremise,
    /// Labelled exploratory: raw decisions only.
    Exploratory,
}

/// Which study a report covers. CARE's premise condition (plan section 7b) runs in its own
/// study directory with rows named `standard` and `care` like the main design's, so each report
/// decides only its own families: the main design's P3 is never read from the premise
/// condition's runs, nor its C6 from the main design's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main design (`repro --testbed v4`): the primary and the exploratory families.
    Main,
    /// CARE's premise conditions (`repro --testbed v4-care`, `v4-care-levels`): the family alone.
    CarePremise,
    /// A robustness cell (plan section 8: another SFT checkpoint or one knob of the grid):
    /// the four papers' primary claims P1-P4, Holm within the cell, labelled exploratory.
    Robustness,
}

/// The primary claims a robustness cell decides (plan section 8: "the primary claims P1-P4").
pub const ROBUSTNESS_CLAIMS: [&str; 4] = ["P1", "P2", "P3", "P4"];

impl Scope {
    /// Whether a report of this scope decides claim `c`.
    pub fn has(self, c: &Claim) -> bool {
        match self {
            Scope::Main => c.family != Family::CarePremise,
            Scope::CarePremise => c.family == Family::CarePremise,
            Scope::Robustness => ROBUSTNESS_CLAIMS.contains(&c.id),
        }
    }
}

/// A decision rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Δ tokens < 0 AND Δ accuracy > −margin (holds); Δ tokens > 0 OR Δ accuracy < −margin
    /// (fails).
    ShorterNotWorse { margin: f64 },
    /// Δ accuracy < 0 (holds); > 0 (fails).
    LosesAccuracy,
    /// Δ accuracy > 0 (holds); < 0 (fails).
    GainsAccuracy,
}

impl Rule {
    /// The rule in words, as the report prints it.
    pub fn words(self) -> String {
        match self {
            Rule::ShorterNotWorse { margin } => format!(
                "holds: Δ tokens < 0 AND Δ accuracy > −{margin}, both one-sided 2.5 % (p = the larger); fails (OR): Δ tokens > 0 OR Δ accuracy < −{margin}"
            ),
            Rule::LosesAccuracy => {
                "holds: Δ accuracy < 0, one-sided 2.5 %; fails: Δ accuracy > 0".into()
            }
            Rule::GainsAccuracy => {
                "holds: Δ accuracy > 0, one-sided 2.5 %; fails: Δ accuracy < 0".into()
            }
        }
    }

    /// The p-value of "holds" and whether "fails" is shown, by one test's p-value function.
    fn decide(
        self,
        acc: &Interval,
        len: &Interval,
        p: fn(&Interval, Side, f64) -> Option<f64>,
    ) -> (Option<f64>, bool) {
        let shown = |q: Option<f64>| q.is_some_and(|q| q <= ALPHA);
        match self {
            Rule::ShorterNotWorse { margin } => {
                let hold = p(len, Side::Below, 0.0)
                    .zip(p(acc, Side::Above, -margin))
                    .map(|(a, b)| a.max(b));
                let fail = shown(p(len, Side::Above, 0.0)) || shown(p(acc, Side::Below, -margin));
                (hold, fail)
            }
            Rule::LosesAccuracy => (p(acc, Side::Below, 0.0), shown(p(acc, Side::Above, 0.0))),
            Rule::GainsAccuracy => (p(acc, Side::Above, 0.0), shown(p(acc, Side::Below, 0.0))),
        }
    }
}

/// One row of the plan's claim table.
pub struct Claim {
    pub id: &'static str,
    pub family: Family,
    pub what: &'static str,
    pub method: &'static str,
    pub against: &'static str,
    pub rule: Rule,
}

const NI: Rule = Rule::ShorterNotWorse { margin: 0.02 };

/// docs/v4/plan.md, sections 4, 5 and 7b, in report order.
#[rustfmt::skip]
pub const CLAIMS: &[Claim] = &[
    Claim { id: "P1", family: Family::Primary, what: "Short-RL shortens at kept accuracy", method: "short_rl", against: "standard", rule: NI },
    Claim { id: "P2", family: Family::Primary, what: "GRPO-λ shortens at kept accuracy", method: "grpo_lambda", against: "standard", rule: NI },
    Claim { id: "P3", family: Family::Primary, what: "CARE shortens at kept accuracy", method: "care", against: "standard", rule: NI },
    Claim { id: "P4", family: Family::Primary, what: "Step-GRPO (paper) shortens at kept accuracy", method: "step_grpo_paper", against: "standard", rule: NI },
    Claim { id: "P5", family: Family::Primary, what: "DLER shortens at kept accuracy", method: "dler", against: "standard", rule: NI },
    Claim { id: "P6", family: Family::Primary, what: "LASER-D shortens at kept accuracy", method: "laser_d", against: "standard", rule: NI },
    Claim { id: "P7", family: Family::Primary, what: "GFPO shortens at kept accuracy", method: "gfpo", against: "standard", rule: NI },
    Claim { id: "P8", family: Family::Primary, what: "ThinkPrune shortens at kept accuracy", method: "think_prune", against: "standard", rule: NI },
    Claim { id: "P9", family: Family::Primary, what: "GRPO-LEAD shortens at kept accuracy", method: "grpo_lead", against: "standard", rule: NI },
    Claim { id: "C16", family: Family::CarePremise, what: "CARE at G = 16 shortens at kept accuracy (premise condition)", method: "care_g16", against: "standard_g16", rule: NI },
    Claim { id: "C6", family: Family::CarePremise, what: "CARE at G = 6 shortens at kept accuracy (premise condition)", method: "care", against: "standard", rule: NI },
    Claim { id: "X1", family: Family::Exploratory, what: "Step-GRPO (DEER probe) shortens at kept accuracy", method: "step_grpo_kept", against: "standard", rule: NI },
    Claim { id: "X2", family: Family::Exploratory, what: "Step-GRPO + DEER placement shortens at kept accuracy", method: "step_grpo", against: "standard", rule: NI },
    Claim { id: "X3", family: Family::Exploratory, what: "Step-GRPO step reward only shortens at kept accuracy", method: "step_grpo_no_dtr", against: "standard", rule: NI },
    Claim { id: "X4", family: Family::Exploratory, what: "(f) the paper's dynamic rollout adds to its step reward", method: "step_grpo_paper", against: "step_grpo_no_dtr", rule: NI },
    Claim { id: "X5", family: Family::Exploratory, what: "(a) Kimi's length-blind penalty loses accuracy", method: "kimi", against: "standard", rule: Rule::LosesAccuracy },
    Claim { id: "X6", family: Family::Exploratory, what: "(c) GRPO-λ beats its λ = 1 control", method: "grpo_lambda", against: "grpo_lambda_lp", rule: Rule::GainsAccuracy },
    Claim { id: "X7", family: Family::Exploratory, what: "(e) D1 shortens at kept accuracy", method: "short_rl_d1", against: "standard", rule: NI },
    Claim { id: "X8", family: Family::Exploratory, what: "(e) D2 shortens at kept accuracy", method: "short_rl_d1_d2", against: "short_rl_d1", rule: NI },
    Claim { id: "X9", family: Family::Exploratory, what: "(e) D3 shortens at kept accuracy", method: "short_rl_d1_d3", against: "short_rl_d1", rule: NI },
];

/// Whether `id` names a claim of the table (the report's rows start with it).
pub fn is_claim_id(id: &str) -> bool {
    CLAIMS.iter().any(|c| c.id == id)
}

/// One decided claim: its paired intervals and both tests' outcomes (raw; Holm is the
/// family's, applied by the caller over a family's rows).
pub struct Decided {
    pub claim: &'static Claim,
    pub acc: Interval,
    pub len: Interval,
    /// (p of holds, fails shown) by the t test and by the sign-flip test.
    pub t: (Option<f64>, bool),
    pub flip: (Option<f64>, bool),
}

/// Every claim of `scope` that `runs` can decide, in the table's order (a claim whose runs are
/// missing or whose seeds differ is left out).
pub fn decide(runs: &BTreeMap<String, Vec<SeedRow>>, scope: Scope) -> Vec<Decided> {
    CLAIMS
        .iter()
        .filter(|c| scope.has(c))
        .filter_map(|c| {
            let acc = diffs(runs, c.method, c.against, |r| r.accuracy)?;
            let len = diffs(runs, c.method, c.against, |r| r.eval_tokens)?;
            Some(Decided {
                claim: c,
                t: c.rule.decide(&acc, &len, t_p),
                flip: c.rule.decide(&acc, &len, flip_p),
                acc,
                len,
            })
        })
        .collect()
}

/// Whether a test's outcome (p of holds, fails shown) holds at ALPHA, before any correction.
pub fn holds((p, _): (Option<f64>, bool)) -> bool {
    p.is_some_and(|p| p <= ALPHA)
}

/// Holm's step-down at ALPHA over one family's decided rows by one test's p-value: which rows
/// it confirms. An incomplete family (a planned claim's runs missing) confirms none, since
/// Holm needs every p-value of the family.
pub fn holm_confirmed<'a>(
    rows: impl IntoIterator<Item = &'a Decided>,
    complete: bool,
    p: fn(&Decided) -> Option<f64>,
) -> Vec<bool> {
    let ps: Vec<Option<f64>> = rows.into_iter().map(p).collect();
    holm(&ps, ALPHA)
        .into_iter()
        .map(|h| h && complete)
        .collect()
}

/// A test's raw decision in the report's words.
pub fn verdict(outcome: (Option<f64>, bool)) -> &'static str {
    if holds(outcome) {
        "**holds**"
    } else if outcome.1 {
        "**fails**"
    } else {
        "unresolved"
    }
}

fn cell(i: &Interval, digits: usize) -> String {
    super::claims::fmt(*i, digits)
}

fn p_text(p: Option<f64>) -> String {
    p.map_or("-".into(), |p| format!("{p:.4}"))
}

/// The paired differences of `f` between methods `a` and `b`, seed by seed (None when either
/// is missing or their seeds differ).
fn diffs(
    runs: &BTreeMap<String, Vec<SeedRow>>,
    a: &str,
    b: &str,
    f: fn(&SeedRow) -> f64,
) -> Option<Interval> {
    let (x, y) = (runs.get(a)?, runs.get(b)?);
    if x.len() != y.len() || x.iter().zip(y).any(|(p, q)| p.seed != q.seed) || x.is_empty() {
        return None;
    }
    let d: Vec<f64> = x.iter().zip(y).map(|(p, q)| f(p) - f(q)).collect();
    Some(paired_at(&d, ALPHA))
}

/// The confirmatory and exploratory tables of the v4 report of `scope`, from each method's
/// per-seed rows. A claim whose runs are missing is skipped; a confirmatory family with a
/// missing claim gets "family incomplete" in its Holm columns.
pub fn tables(runs: &BTreeMap<String, Vec<SeedRow>>, scope: Scope) -> String {
    let decided = decide(runs, scope);
    let mut s = String::new();
    for (family, name, title) in [
        (
            Family::Primary,
            "primary claims",
            if scope == Scope::Robustness {
                "Primary claims P1-P4 in this robustness cell (exploratory, Holm within the cell)"
            } else {
                "Primary claims (confirmatory, Holm over the family)"
            },
        ),
        (
            Family::CarePremise,
            "CARE premise",
            "CARE on its premise (confirmatory family 2, Holm over the family)",
        ),
        (
            Family::Exploratory,
            "",
            "Exploratory rows (raw decisions only, no correction)",
        ),
    ] {
        let rows: Vec<&Decided> = decided
            .iter()
            .filter(|d| d.claim.family == family)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let planned = CLAIMS
            .iter()
            .filter(|c| c.family == family && scope.has(c))
            .count();
        let complete = rows.len() == planned;
        let confirm = family != Family::Exploratory;
        let adjusted = |p: fn(&Decided) -> Option<f64>| -> Vec<String> {
            holm_confirmed(rows.iter().copied(), complete, p)
                .into_iter()
                .map(|h| {
                    if !complete {
                        "family incomplete".into()
                    } else if h {
                        "**holds**".into()
                    } else {
                        "not confirmed".into()
                    }
                })
                .collect()
        };
        let (ht, hf) = (adjusted(|d| d.t.0), adjusted(|d| d.flip.0));
        let _ = writeln!(s, "### {title}\n");
        let (t_holm, flip_holm) = if confirm {
            (" t, Holm |", " sign-flip, Holm |")
        } else {
            ("", "")
        };
        let _ = writeln!(
            s,
            "| Claim | Comparison | Δ accuracy [95 %] | Δ eval tokens [95 %] | Seeds below 0 | t p | t |{t_holm} sign-flip p | sign-flip |{flip_holm} Decision rule |"
        );
        let cols = if confirm { 12 } else { 10 };
        let _ = writeln!(s, "|{}", "---|".repeat(cols));
        for (k, d) in rows.iter().enumerate() {
            let (t_holm, flip_holm) = if confirm {
                (format!(" {} |", ht[k]), format!(" {} |", hf[k]))
            } else {
                (String::new(), String::new())
            };
            let _ = writeln!(
                s,
                "| {} {} | {} − {} | {} | {} | {}/{} / {}/{} | {} | {} |{t_holm} {} | {} |{flip_holm} {} |",
                d.claim.id,
                d.claim.what,
                d.claim.method,
                d.claim.against,
                cell(&d.acc, 3),
                cell(&d.len, 1),
                d.acc.below_zero,
                d.acc.n,
                d.len.below_zero,
                d.len.n,
                p_text(d.t.0),
                verdict(d.t),
                p_text(d.flip.0),
                verdict(d.flip),
                d.claim.rule.words()
            );
        }
        if confirm {
            let count = |v: &[String]| v.iter().filter(|h| h.as_str() == "**holds**").count();
            let _ = writeln!(
                s,
                "\nHolm ({name}): {} of {planned} hold by t, {} by sign-flip, at family-wise one-sided α = {ALPHA}{}.",
                count(&ht),
                count(&hf),
                if complete { "" } else { " (family incomplete: a claim's runs are missing)" }
            );
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan's primary table and this one name the same claims, methods and comparisons.
    #[test]
    fn the_table_matches_the_plan() {
        let plan = include_str!("../../../docs/v4/plan.md");
        for c in CLAIMS.iter().filter(|c| c.family == Family::Primary) {
            let row = format!("| {} |", c.id);
            let line = plan
                .lines()
                .find(|l| l.starts_with(&row))
                .unwrap_or_else(|| panic!("plan.md has no row {}", c.id));
            assert!(
                line.contains(&format!("`{}` | `{}`", c.method, c.against)),
                "{}: {line}",
                c.id
            );
        }
        let planned = plan.lines().filter(|l| l.starts_with("| P")).count();
        let primary = CLAIMS
            .iter()
            .filter(|c| c.family == Family::Primary)
            .count();
        assert_eq!((planned, primary), (9, 9));
        // n = 9: the smallest n whose sign-flip floor passes Holm's first step.
        assert!(0.5f64.powi(9) <= ALPHA / primary as f64 && 0.5f64.powi(8) > ALPHA / 9.0);
        assert!(plan.contains("C16") && plan.contains("`care_g16`") || plan.contains("care_g16"));
        let ids: Vec<&str> = CLAIMS.iter().map(|c| c.id).collect();
        let mut unique = ids.clone();
        unique.dedup();
        assert_eq!(ids, unique, "claim ids are unique");
    }

    fn row(method: &str, seed: u64, acc: f64, tokens: f64) -> SeedRow {
        SeedRow::fixture(method, seed, acc, tokens)
    }

    /// A compound rule needs both parts; the OR in "fails" is labelled; Holm prints beside raw.
    #[test]
    fn the_and_rule_needs_both_parts_and_holm_sits_beside_raw() {
        let mut runs: BTreeMap<String, Vec<SeedRow>> = BTreeMap::new();
        let jitter = |s: u64| (s as f64 - 4.0) * 0.001;
        let put = |runs: &mut BTreeMap<String, Vec<SeedRow>>, m: &str, acc: f64, tok: f64| {
            runs.insert(
                m.into(),
                (0..9)
                    .map(|s| {
                        row(
                            m,
                            s,
                            acc + jitter(s),
                            tok + jitter(s) * 100.0 + (s % 3) as f64,
                        )
                    })
                    .collect(),
            );
        };
        put(&mut runs, "standard", 0.90, 56.0);
        put(&mut runs, "short_rl", 0.895, 50.0); // shorter, within the margin: holds
        put(&mut runs, "grpo_lambda", 0.85, 50.0); // shorter but 5 points worse: fails (OR)
        put(&mut runs, "care", 0.90, 56.0); // the same: unresolved
        let s = tables(&runs, Scope::Main);
        assert!(
            !s.contains("| C6 "),
            "the premise family is not the main design's"
        );
        let line = |id: &str| {
            s.lines()
                .find(|l| l.starts_with(&format!("| {id} ")))
                .expect(id)
                .to_string()
        };
        assert!(
            line("P1").contains("| **holds** | family incomplete |"),
            "{}",
            line("P1")
        );
        assert!(line("P2").contains("| **fails** |"), "{}", line("P2"));
        assert!(line("P3").contains("| unresolved |"), "{}", line("P3"));
        assert!(line("P1").contains("AND Δ accuracy > −0.02") && line("P1").contains("fails (OR)"));
        assert!(s.contains("family incomplete: a claim's runs are missing"));
        assert!(!s.contains("| P4 "), "a claim without its runs is skipped");
        // A robustness cell decides P1-P4 alone, Holm over those four: with step_grpo_paper
        // run too, its family is complete.
        put(&mut runs, "step_grpo_paper", 0.90, 56.0);
        put(&mut runs, "short_rl_d1", 0.90, 50.0);
        let cell = tables(&runs, Scope::Robustness);
        assert!(
            cell.contains("robustness cell (exploratory, Holm within the cell)"),
            "{cell}"
        );
        assert!(
            !cell.contains("| X7 ") && !cell.contains("Exploratory rows"),
            "{cell}"
        );
        assert!(
            cell.contains("Holm (primary claims): 1 of 4 hold by t"),
            "{cell}"
        );
        let p1 = cell.lines().find(|l| l.starts_with("| P1 ")).expect("P1");
        assert!(p1.contains("| **holds** | **holds** |"), "{p1}");
    }
}
