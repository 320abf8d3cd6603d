//! CARE's premise checks (docs/v4/plan.md section 7b, checks 1-3), computed from the premise
//! condition's per-seed tables: (1) Standard still overthinks, (2) CARE's direction signal
//! says "shorter" more often than "longer", (3) the easy levels are length-insensitive. Each
//! check prints its rule in words, its number and pass / fail; the claims C16 and C6 are
//! decided whatever they show. Data flow: seeds.csv + trajectory.csv -> [`section`] ->
//! docs/v4/care/results.md.

use super::overthink::{GOAL, WINDOW};
use super::seeds::SeedRow;
use super::stats::{flip_p, paired_at, Interval, Side};
use super::trajectory::TrajRow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The two-sided 95 % interval's side: one-sided 2.5 %, the study's α.
const ALPHA: f64 = super::confirmatory::ALPHA;

/// Check 3's band: the easy levels' pass@1 change from start to end, in fractions.
pub const EASY_BAND: f64 = 0.02;

/// The levels the plan calls easy on this testbed (SFT start pass@1 0.99).
pub const EASY_LEVELS: [usize; 2] = [1, 2];

fn ci(i: &Interval, digits: usize) -> String {
    match i.ci {
        Some((lo, hi)) => format!("{:+.digits$} [{lo:+.digits$}, {hi:+.digits$}]", i.mean),
        None => format!("{:+.digits$}", i.mean),
    }
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "**pass**"
    } else {
        "**fail**"
    }
}

/// One check's row: (check, rule in words, value, result).
type Row = (String, String, String, &'static str);

/// Check 1: Standard's rollout growth, lower 95 % end above the goal.
fn overthinks(traj: &BTreeMap<String, Vec<TrajRow>>) -> Row {
    let rule = format!(
        "Standard's rollout length, mean of the last {WINDOW} steps over the first {WINDOW}, has the lower end of its 95 % t interval over seeds above {GOAL}"
    );
    let check = "1. Standard still overthinks (G = 6)".to_string();
    let growth: Vec<f64> = traj
        .get("standard")
        .map(|r| {
            r.iter()
                .map(|r| r.growth)
                .filter(|g| g.is_finite())
                .collect()
        })
        .unwrap_or_default();
    if growth.len() < 2 {
        return (
            check,
            rule,
            "no two finished Standard runs".into(),
            "not computed",
        );
    }
    // The ratio itself, not a difference: the interval of its mean.
    let i = paired_at(&growth, ALPHA);
    let value = match i.ci {
        Some((lo, hi)) => format!("×{:.3} [{lo:.3}, {hi:.3}] ({} seeds)", i.mean, i.n),
        None => format!("×{:.3}", i.mean),
    };
    let ok = i.ci.is_some_and(|(lo, _)| lo > GOAL);
    (check, rule, value, pass(ok))
}

/// Check 2, for one CARE arm: per seed, the mean over steps of d = −1 groups minus d = +1
/// groups, above 0 at one-sided 2.5 % (the t interval's lower end; the sign-flip p beside).
fn harms(traj: &BTreeMap<String, Vec<TrajRow>>, arm: &str, g: usize) -> Row {
    let check =
        format!("2. Reflection harms: CARE says shorter more than longer (`{arm}`, G = {g})");
    let rule = "per seed, CARE's groups per step with d = −1 (shorter) minus those with d = +1 (longer), mean over steps; the lower end of the 95 % t interval over seeds above 0 (one-sided 2.5 %)".to_string();
    let d: Vec<f64> = traj
        .get(arm)
        .map(|r| {
            r.iter()
                .filter_map(|r| Some(r.care_shorter? - r.care_longer?))
                .collect()
        })
        .unwrap_or_default();
    if d.len() < 2 {
        return (
            check,
            rule,
            format!("no two finished `{arm}` runs with CARE's direction counts"),
            "not computed",
        );
    }
    let i = paired_at(&d, ALPHA);
    let p = flip_p(&i, Side::Above, 0.0).map_or("-".into(), |p| format!("{p:.4}"));
    let ok = i.ci.is_some_and(|(lo, _)| lo > 0.0);
    let value = format!(
        "{} groups a step ({} seeds; sign-flip p {p})",
        ci(&i, 2),
        i.n
    );
    (check, rule, value, pass(ok))
}

/// Check 3, for one easy level: Standard's pass@1 end − start, mean over seeds within the band.
fn insensitive(
    seeds: &BTreeMap<String, Vec<SeedRow>>,
    traj: &BTreeMap<String, Vec<TrajRow>>,
    level: usize,
) -> Row {
    let check = format!("3. Easy level {level} is length-insensitive");
    let rule = format!(
        "Standard's level-{level} pass@1 at the end minus at the start (step 0), mean over seeds, within ±{EASY_BAND}"
    );
    let (Some(end), Some(start)) = (seeds.get("standard"), traj.get("standard")) else {
        return (
            check,
            rule,
            "no finished Standard runs".into(),
            "not computed",
        );
    };
    let d: Vec<f64> = end
        .iter()
        .filter_map(|e| {
            let s = start.iter().find(|s| s.seed == e.seed)?;
            Some(e.pass1_by_level.get(level - 1)? - s.start_pass1_by_level.get(level - 1)?)
        })
        .collect();
    if d.is_empty() {
        return (
            check,
            rule,
            format!("no Standard run has level {level} at both ends"),
            "not computed",
        );
    }
    let i = paired_at(&d, ALPHA);
    let ok = i.mean.abs() <= EASY_BAND;
    (
        check,
        rule,
        format!("{} ({} seeds)", ci(&i, 3), i.n),
        pass(ok),
    )
}

/// How a premise condition sets its overturn chance per level: what a failed check 2 can be
/// put down to differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `overturn_easy` to `overturn_hard`, a straight line (P-CARE, plan section 7b).
    Line,
    /// `data.overturn_by_level`, any shape (P-CARE-L, the plan's note of 2026-12-03).
    PerLevel,
}

/// The premise section: every check's rule, value and result, then what they mean for the
/// claims. `care_arms` names CARE's rows and their group sizes; `profile` how the condition
/// sets its overturns.
pub fn section(
    seeds: &BTreeMap<String, Vec<SeedRow>>,
    traj: &BTreeMap<String, Vec<TrajRow>>,
    care_arms: &[(&str, usize)],
    profile: Profile,
) -> String {
    let mut rows = vec![overthinks(traj)];
    rows.extend(care_arms.iter().map(|&(arm, g)| harms(traj, arm, g)));
    rows.extend(EASY_LEVELS.iter().map(|&l| insensitive(seeds, traj, l)));
    let mut s = String::new();
    let _ = writeln!(s, "## CARE's premise (plan section 7b, checks 1-3)\n");
    let _ = writeln!(
        s,
        "Computed from seeds.csv and trajectory.csv before the claims are read, and reported whatever they show. Check 2 reads CARE's direction counts as the plan defines it: no run records overturns by level (the evaluation records re-checks per level, not whether a re-check overturned a right answer), so the counts are over all of a step's groups.\n"
    );
    let _ = writeln!(s, "| Check | Rule | Value | Result |\n|---|---|---|---|");
    for (check, rule, value, result) in &rows {
        let _ = writeln!(s, "| {check} | {rule} | {value} | {result} |");
    }
    // A row's check number ("2" of "2. Reflection harms ..."), for the checks with a result.
    let checks = |result: fn(&str) -> bool| -> Vec<&str> {
        rows.iter()
            .filter(|r| result(r.3))
            .map(|r| r.0.split('.').next().unwrap_or(""))
            .collect()
    };
    let mut failed = checks(|r| r != "**pass**");
    failed.dedup();
    let _ = if failed.is_empty() {
        writeln!(
            s,
            "\nEvery premise check passes: the claims below are read on CARE's premise.\n"
        )
    } else {
        // Only a check that ran and failed says something about the condition.
        let fails = checks(|r| r == "**fail**");
        let mut why = vec![];
        if fails.contains(&"1") {
            why.push(" Check 1 failing means Standard did not lengthen as the goal asks: there is less or no overthinking for CARE to remove.");
        }
        if fails.contains(&"2") {
            why.push(match profile {
                Profile::Line => " If check 2 fails, a straight-line overturn profile may be the reason (it cannot peak on levels 3-4); the plan then asks for a per-level overturn profile, which `data.overturn_by_level` sets (added after the v4 runs).",
                Profile::PerLevel => " This condition sets its overturns per level (`data.overturn_by_level`), so where check 2 fails it is not a straight line's limit.",
            });
        }
        writeln!(
            s,
            "\nThe premise did not hold in full (checks {} did not pass): the claims below are still computed, as the plan says, and read as CARE tested where its premise is not (wholly) present.{}\n",
            failed.join(", "),
            why.concat()
        )
    };
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_row(method: &str, seed: u64, pass1: [f64; 2]) -> SeedRow {
        SeedRow {
            method: method.into(),
            seed,
            accuracy: 0.8,
            eval_tokens: 50.0,
            len_avg: 50.0,
            len_last: 55.0,
            exit_rate: None,
            pass1_by_level: pass1.to_vec(),
            tokens_by_level: vec![40.0, 45.0],
        }
    }

    fn traj_row(method: &str, seed: u64, growth: f64, dirs: Option<(f64, f64)>) -> TrajRow {
        TrajRow {
            method: method.into(),
            seed,
            growth,
            start_accuracy: 0.7,
            start_tokens: 40.0,
            care_longer: dirs.map(|d| d.0),
            care_shorter: dirs.map(|d| d.1),
            start_pass1_by_level: vec![0.99, 0.98],
        }
    }

    fn by_method<T: Clone>(rows: Vec<(String, T)>) -> BTreeMap<String, Vec<T>> {
        let mut m: BTreeMap<String, Vec<T>> = BTreeMap::new();
        for (k, r) in rows {
            m.entry(k).or_default().push(r);
        }
        m
    }

    #[test]
    fn each_check_passes_or_fails_by_its_rule() {
        let wobble = |s: u64| (s % 3) as f64 * 0.01;
        let traj = by_method(
            (0..9u64)
                .flat_map(|s| {
                    [
                        (
                            "standard".into(),
                            traj_row("standard", s, 1.40 + wobble(s), None),
                        ),
                        // Shorter wins on every seed at G = 6; balanced at G = 16.
                        (
                            "care".into(),
                            traj_row("care", s, 1.1, Some((1.5, 2.5 + wobble(s)))),
                        ),
                        (
                            "care_g16".into(),
                            traj_row("care_g16", s, 1.1, Some((2.0, 2.0 + wobble(s) - 0.01))),
                        ),
                    ]
                })
                .collect(),
        );
        // Level 1 keeps its start; level 2 falls by 0.05.
        let seeds = by_method(
            (0..9u64)
                .map(|s| ("standard".into(), seed_row("standard", s, [0.99, 0.93])))
                .collect(),
        );
        let md = section(
            &seeds,
            &traj,
            &[("care", 6), ("care_g16", 16)],
            Profile::Line,
        );
        let row = |p: &str| md.lines().find(|l| l.starts_with(p)).unwrap_or_default();
        assert!(row("| 1. ").ends_with("| **pass** |"), "{md}");
        assert!(row("| 1. ").contains("×1.410 ["), "{md}");
        assert!(
            row("| 2. Reflection harms: CARE says shorter more than longer (`care`")
                .ends_with("| **pass** |"),
            "{md}"
        );
        assert!(
            row("| 2. Reflection harms: CARE says shorter more than longer (`care_g16`")
                .ends_with("| **fail** |"),
            "{md}"
        );
        assert!(row("| 3. Easy level 1").ends_with("| **pass** |"), "{md}");
        assert!(
            row("| 3. Easy level 2").contains("-0.050")
                && row("| 3. Easy level 2").ends_with("| **fail** |"),
            "{md}"
        );
        assert!(md.contains("checks 2, 3 did not pass"), "{md}");
        assert!(md.contains("straight-line overturn profile may be"), "{md}");
        // A per-level condition does not blame the line.
        let levels = section(
            &seeds,
            &traj,
            &[("care", 6), ("care_g16", 16)],
            Profile::PerLevel,
        );
        assert!(
            levels.contains("not a straight line's limit") && !levels.contains("may be the"),
            "{levels}"
        );
        // Check 1 passed there, so nothing is said about it.
        assert!(!md.contains("Check 1 failing"), "{md}");
        // Standard that does not grow fails check 1; missing runs are named, not passed.
        let flat = by_method(
            (0..9u64)
                .map(|s| {
                    (
                        "standard".into(),
                        traj_row("standard", s, 1.15 + wobble(s), None),
                    )
                })
                .collect(),
        );
        let md = section(&BTreeMap::new(), &flat, &[("care", 6)], Profile::Line);
        let row = |p: &str| md.lines().find(|l| l.starts_with(p)).unwrap_or_default();
        assert!(row("| 1. ").ends_with("| **fail** |"), "{md}");
        // A check that could not be computed explains nothing: only check 1's sentence.
        assert!(
            md.contains("Check 1 failing means") && !md.contains("straight-line"),
            "{md}"
        );
        assert!(
            row("| 2. ").contains("no two finished `care` runs")
                && row("| 2. ").ends_with("| not computed |"),
            "{md}"
        );
        assert!(
            row("| 3. Easy level 1").ends_with("| not computed |"),
            "{md}"
        );
    }
}
