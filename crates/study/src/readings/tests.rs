//! readings.rs's tests: the rules on small texts, then every committed hand-written reading of
//! the v4 and v5 studies against the tables it may cite.
//!
//! The committed set checked: each `results-reading.md` under docs/v4 (the main design, both
//! CARE premise conditions, the nine robustness cells), docs/v5/results-reading.md and
//! docs/v5/care-hidden/results-reading.md (against their results.md) and the v4 study rows of
//! models/testbed/README.md (its "Design 3, studied" block, to the next heading). The
//! deviations.md files are not readings: they record how the runs were made (dates, minutes,
//! commits), which no table holds. A reading may cite its own report's generated part and CSVs,
//! the main design's (every cell is read against it), and every report it names by path
//! (`docs/v4/care/`, `docs/v3/results.md`); a name of a reading or a folder stands for its
//! report.

use super::*;
use std::path::{Path, PathBuf};

fn pool_of(texts: &[&str], csvs: &[&str]) -> Pool {
    let mut p = Pool::default();
    for t in texts {
        p.add_printed(t);
    }
    for c in csvs {
        p.add_csv(c);
    }
    p
}

fn texts(reading: &str) -> Vec<String> {
    cited(reading).into_iter().map(|c| c.text).collect()
}

#[test]
fn identifiers_counts_settings_and_references_are_not_numbers_to_cite() {
    let r = "P4 on sft1 (0adbdd5, 2026-12-03 06:26) at G = 16, 9 of 9 seeds, levels 3-6; \
             `recheck_prob = 0.5`; plan item 10.3 and section 7a; Qwen3-4B";
    assert_eq!(texts(r), Vec::<String>::new());
    let fenced = "```\n0.55 tokens\n```\n";
    assert!(cited(fenced).is_empty());
}

#[test]
fn decimals_percentages_ratios_and_ranges_are_numbers_to_cite() {
    let r = "−5.9 tokens [4.7, 7.1], ×0.82, x1.35, 1.18x, 29 % of it, 32-47 % in the papers";
    assert_eq!(
        texts(r),
        ["5.9", "4.7", "7.1", "0.82", "1.35", "1.18", "29", "32", "47"]
    );
    let c = cited("29 % and 32-47 %");
    assert!(c.iter().all(|c| c.percent), "{c:?}");
}

#[test]
fn a_dagger_marks_a_computed_number() {
    assert_eq!(texts("33 %† longer, 0.0031† by hand, 1.31 kept"), ["1.31"]);
}

#[test]
fn a_number_matches_within_its_printed_precision_and_not_beyond() {
    let p = pool_of(
        &["| P1 | -0.008 [-0.019, +0.002] | 0.0189 | 24.9 % | ×0.818 |"],
        &[],
    );
    let holds = |r: &str| uncited(r, &p).is_empty();
    assert!(holds("0.019 and 0.0189, 0.008 lower, 24.9 % of it, ×0.82"));
    // Too precise for the table, off by a digit, a percentage against a plain number.
    assert!(!holds("0.01890"));
    assert!(!holds("0.018"));
    assert!(!holds("0.818 %"));
    assert!(!holds("25.0 %"));
}

#[test]
fn a_csv_cell_backs_only_a_number_with_four_significant_digits() {
    let p = pool_of(&[], &["method,seed,x\ncare,0,1.3148\n"]);
    assert!(uncited("1.315 a step", &p).is_empty());
    // 1.31 would match too many of a CSV's cells by chance: it needs a printed table.
    assert_eq!(uncited("1.31 a step", &p).len(), 1);
}

#[test]
fn a_stale_report_is_named() {
    let report = "# R\n| 1.5 |\n## Reading\n1.5 kept\n";
    let part = generated_part(report, &[("r.md", "## Reading\n1.5 kept\n")]).expect("included");
    assert_eq!(part, "# R\n| 1.5 |\n");
    let err = generated_part(report, &[("r.md", "## Reading\n1.6 kept\n")]).expect_err("stale");
    assert!(err.to_string().contains("r.md"), "{err}");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The hand-written files beside a report that it includes verbatim.
fn inputs_of(report: &Path) -> Vec<(String, String)> {
    let dir = report.parent().expect("a report's folder");
    let mut out = vec![];
    for e in std::fs::read_dir(dir).expect("report folder").flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with("reading.md") || name == "deviations.md" {
            out.push((name, read(&e.path())));
        }
    }
    out
}

/// Adds a report's generated part (and, for a planned report, its CSVs) to `pool`. `own`: the
/// report must include its inputs as committed (it is the reading's own).
fn add_report(pool: &mut Pool, report: &Path, own: bool) {
    let text = read(report);
    let inputs = inputs_of(report);
    let inputs: Vec<(&str, &str)> = inputs
        .iter()
        .filter(|(_, t)| own || text.contains(t.as_str()))
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let part =
        generated_part(&text, &inputs).unwrap_or_else(|e| panic!("{}: {e:#}", report.display()));
    pool.add_printed(&part);
    if report.file_name().is_some_and(|n| n == "results.md") {
        for csv in ["seeds.csv", "trajectory.csv"] {
            let p = report.with_file_name(csv);
            if p.is_file() {
                pool.add_csv(&read(&p));
            }
        }
    }
}

/// The reports a reading names by path (`docs/v4/care/`, `docs/v3/results-reading.md`).
fn named_reports(reading: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    for (i, _) in reading.match_indices("docs/v") {
        let path: String = reading[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "_./-".contains(*c))
            .collect();
        let path = path.trim_end_matches('.');
        let report = if path.ends_with('/') {
            format!("{path}results.md")
        } else if let Some(stem) = path.strip_suffix("-reading.md") {
            format!("{stem}.md")
        } else if path.ends_with(".md")
            && path
                .rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("results"))
        {
            path.to_string()
        } else {
            continue;
        };
        let p = repo().join(report);
        if p.is_file() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The v4 study rows of the testbed README: the "Design 3, studied" block to the next heading.
fn readme_rows() -> String {
    let text = read(&repo().join("models/testbed/README.md"));
    let start = text
        .find("\nDesign 3, studied")
        .expect("the README's v4 study rows");
    let rest = &text[start..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Every hand-written reading of the v4 and v5 studies, and the reports it may cite.
fn committed_readings() -> Vec<(String, String, Vec<PathBuf>)> {
    let v4 = repo().join("docs/v4");
    let main = v4.join("results.md");
    let mut dirs = vec![v4.clone(), v4.join("care"), v4.join("care-levels")];
    let mut cells: Vec<PathBuf> = std::fs::read_dir(v4.join("robust"))
        .expect("docs/v4/robust")
        .flatten()
        .map(|e| e.path())
        .collect();
    cells.sort();
    dirs.extend(cells);
    let mut out = vec![];
    for d in dirs {
        let path = d.join("results-reading.md");
        let text = read(&path);
        let name = match d.strip_prefix(&v4) {
            Ok(rel) if rel.as_os_str().is_empty() => "docs/v4/results-reading.md".to_string(),
            Ok(rel) => format!("docs/v4/{}/results-reading.md", rel.display()),
            Err(_) => path.display().to_string(),
        };
        let mut reports = vec![d.join("results.md"), main.clone()];
        reports.extend(named_reports(&text));
        reports.dedup();
        out.push((name, text, reports));
    }
    // v5's readings (the study's and X6's), against their own report (which appends it) and
    // the reports they name.
    let v5 = repo().join("docs/v5");
    for (name, d) in [
        ("docs/v5/results-reading.md", v5.clone()),
        (
            "docs/v5/care-hidden/results-reading.md",
            v5.join("care-hidden"),
        ),
    ] {
        let text = read(&d.join("results-reading.md"));
        let mut reports = vec![d.join("results.md")];
        reports.extend(named_reports(&text));
        reports.dedup();
        out.push((name.into(), text, reports));
    }
    let rows = readme_rows();
    let reports = named_reports(&rows);
    out.push((
        "models/testbed/README.md (v4 study rows)".into(),
        rows,
        reports,
    ));
    out
}

/// Each number of each committed reading is in a table it may cite, or marked computed.
#[test]
fn every_number_of_a_committed_reading_is_in_a_committed_table() {
    let mut missing = vec![];
    for (name, text, reports) in committed_readings() {
        let mut pool = Pool::default();
        for (i, r) in reports.iter().enumerate() {
            // The first report is the reading's own: it must include the reading as committed.
            add_report(&mut pool, r, i == 0 && !name.contains("README"));
        }
        for c in uncited(&text, &pool) {
            missing.push(format!(
                "{name}:{}: {}{}",
                c.line,
                c.text,
                if c.percent { " %" } else { "" }
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "numbers in no committed table (cite a printed one, or mark a computed one with †):\n{}",
        missing.join("\n")
    );
}

/// The audit's strength on the largest pool, the main design's report: numbers drawn at random in
/// the formats a reading prints are mostly caught (what a planted number meets). A pool so dense
/// that any number matches would make the audit above pass whatever a reading says.
#[test]
fn a_random_number_planted_in_the_main_reading_is_mostly_caught() {
    let main = repo().join("docs/v4/results.md");
    let mut pool = Pool::default();
    add_report(&mut pool, &main, true);
    // A fixed LCG: the same draws every run.
    let mut state: u64 = 61;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let caught = |text: &str| !pool.holds(&cited(text)[0]);
    let rate =
        |f: &mut dyn FnMut() -> String| (0..1000).filter(|_| caught(&f())).count() as f64 / 1000.0;
    let accuracy = rate(&mut || format!("{:.3}", next()));
    let tokens = rate(&mut || format!("{:.1}", 60.0 * next()));
    let percent = rate(&mut || format!("{:.1} %", 50.0 * next()));
    assert!(accuracy > 0.8, "3-decimal accuracies caught: {accuracy}");
    assert!(tokens > 0.6, "1-decimal token counts caught: {tokens}");
    assert!(percent > 0.9, "1-decimal percentages caught: {percent}");
}
