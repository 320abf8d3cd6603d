//! The v4 report's audit: recomputes every interval, p-value and verdict of a committed report
//! from its per-seed table (seeds.csv, seeds.rs) with confirmatory.rs, and names the first row
//! that does not follow. Data flow: seeds.csv + results.md -> [`check_report`] -> Ok or the row.

use super::confirmatory::Scope;
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// Recomputes the confirmatory tables of `report` (markdown, a report of `scope`) from `csv`
/// and fails on the first claim row whose intervals, p-values or verdicts differ, or that one
/// side lacks.
pub fn check_report(csv: &str, report: &str, what: &str, scope: Scope) -> Result<()> {
    let runs = super::seeds::read_csv(csv, what)?;
    let fresh = super::confirmatory::tables(&runs, scope);
    let rows = |md: &str| -> BTreeMap<String, String> {
        md.lines()
            .filter_map(|l| {
                let id = l.strip_prefix("| ")?.split(' ').next()?;
                super::confirmatory::is_claim_id(id).then(|| (id.to_string(), l.to_string()))
            })
            .collect()
    };
    let (want, got) = (rows(&fresh), rows(report));
    if want.is_empty() {
        bail!("{what}: no claim can be decided from the CSV");
    }
    for (id, line) in &want {
        match got.get(id) {
            None => bail!("{what}: the report has no row {id}; from the CSV:\n{line}"),
            Some(g) if g != line => {
                bail!(
                    "{what}: row {id} does not follow from the CSV:\n report: {g}\n   CSV:  {line}"
                )
            }
            Some(_) => {}
        }
    }
    if let Some(id) = got.keys().find(|id| !want.contains_key(*id)) {
        bail!("{what}: the report's row {id} cannot be computed from the CSV");
    }
    // The Holm lines depend on the whole family: compare them too. Only the generated
    // summaries ("Holm (<family>): ..."), so hand-written prose included in the report may
    // start a line with the word.
    let holm = |md: &str| -> Vec<String> {
        md.lines()
            .filter(|l| l.starts_with("Holm (") && l.contains("): "))
            .map(str::to_string)
            .collect()
    };
    if holm(&fresh) != holm(report) {
        bail!("{what}: the report's Holm summary does not follow from the CSV");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture built from the committed v3 numbers (docs/v3/results.md: each method's mean
    /// and sd of accuracy and eval tokens over its 5 seeds), with per-seed values invented to
    /// match them, since v3 committed no per-seed data. It is not v3's runs.
    const FIXTURE_CSV: &str = include_str!("testdata/v3-fixture-seeds.csv");
    const FIXTURE_REPORT: &str = include_str!("testdata/v3-fixture-report.md");

    #[test]
    fn the_fixture_report_follows_from_its_csv() {
        check_report(FIXTURE_CSV, FIXTURE_REPORT, "fixture", Scope::Main).expect("report follows");
        // The fixture's rows are the report the code writes, byte for byte.
        let runs = super::super::seeds::read_csv(FIXTURE_CSV, "fixture").expect("csv");
        assert_eq!(
            super::super::confirmatory::tables(&runs, Scope::Main),
            FIXTURE_REPORT
        );
    }

    #[test]
    fn a_changed_verdict_or_interval_or_seed_is_caught() {
        let line = FIXTURE_REPORT
            .lines()
            .find(|l| l.starts_with("| P2 "))
            .expect("P2 row");
        // A verdict flipped.
        let flipped = line.replacen("**holds**", "unresolved", 1);
        assert_ne!(flipped, line, "P2 holds by t in the fixture");
        let e = check_report(
            FIXTURE_CSV,
            &FIXTURE_REPORT.replace(line, &flipped),
            "fx",
            Scope::Main,
        )
        .expect_err("caught");
        assert!(e.to_string().contains("row P2"), "{e}");
        // An interval's end moved by one digit.
        let moved = line.replacen("[-", "[-1", 1);
        assert!(check_report(
            FIXTURE_CSV,
            &FIXTURE_REPORT.replace(line, &moved),
            "fx",
            Scope::Main
        )
        .is_err());
        // A seed's value changed in the CSV.
        let mut csv: Vec<String> = FIXTURE_CSV.lines().map(str::to_string).collect();
        let i = csv
            .iter()
            .position(|l| l.starts_with("short_rl,0,"))
            .expect("row");
        csv[i] = csv[i].replacen("short_rl,0,0.", "short_rl,0,0.1", 1);
        let e = check_report(&(csv.join("\n") + "\n"), FIXTURE_REPORT, "fx", Scope::Main)
            .expect_err("caught");
        assert!(e.to_string().contains("does not follow"), "{e}");
        // Prose that starts a line with "Holm" is not a summary; a changed summary is caught.
        let prose = format!("{FIXTURE_REPORT}\nHolm within each cell, as planned.\n");
        check_report(FIXTURE_CSV, &prose, "fx", Scope::Main).expect("prose is not a summary");
        let summary = FIXTURE_REPORT
            .lines()
            .find(|l| l.starts_with("Holm ("))
            .expect("a Holm summary");
        let changed = FIXTURE_REPORT.replace(
            summary,
            &summary.replacen(" hold by t", " hold by t (changed)", 1),
        );
        assert!(check_report(FIXTURE_CSV, &changed, "fx", Scope::Main).is_err());
        // A row the CSV cannot give.
        let extra = format!("{FIXTURE_REPORT}| P9 x |\n");
        assert!(check_report(FIXTURE_CSV, &extra, "fx", Scope::Main).is_err());
    }
}
