//! The readings audit: every number a hand-written reading prints must be one a committed table
//! prints (a generated report's tables and text, or a per-seed CSV), within the reading's own
//! precision, or be marked as computed with a `†` right after it. Data flow: a reading's text ->
//! [`cited`] -> each number looked up in a [`Pool`] built from the reports and CSVs it may cite
//! -> [`uncited`], the numbers no table carries. The test over the committed docs is below.
//!
//! What a number is, and which are exempt (the rules the committed readings are written to):
//! - a decimal (`0.905`, `−5.9`, `×1.27`, `1.18x`) or a percentage (`29 %`, both ends of a range
//!   `32-47 %`); a bare integer is a count, a size, a level, a seed, a step, a date or a time
//!   (`9 of 9`, `G = 16`, `levels 3-6`, `2026-12-03`, `06:26`) and is not checked;
//! - its sign is not compared (prose says "shorter" for a negative Δ);
//! - not a number to check: anything inside a code span or a fenced block (settings, commands:
//!   `` `recheck_prob = 0.5` ``), a digit run touching a letter or `_` (claim ids `P4`, cells
//!   `sft1`, commits `0adbdd5`, `Qwen3-4B`; `x`/`×` beside it is a ratio, not a letter), and one
//!   after `item`, `section`, `issue` or `§` (`item 10.3`);
//! - marked computed: a `†` right after the number (after its `%` or `x`); the reading says
//!   beside it how it was computed.
//!
//! A number matches a printed one when the printed one has at least the reading's decimals and
//! lies within half a unit of the reading's last digit; a percentage matches only a printed
//! percentage. A CSV cell matches too (same rule, full precision), but only a number printed with
//! at least 4 significant digits: a shorter one would match one of a CSV's thousand cells by
//! chance.

use anyhow::{bail, Result};

/// One number a reading prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Cited {
    /// 1-based line in the reading.
    pub line: usize,
    /// As printed, without its sign.
    pub text: String,
    pub value: f64,
    pub decimals: usize,
    pub percent: bool,
}

impl Cited {
    fn significant(&self) -> usize {
        self.text
            .chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
            .trim_start_matches('0')
            .len()
    }
}

/// Words after which a number is a reference (a plan item, a section), not a result.
const REFERENCES: [&str; 4] = ["item", "section", "issue", "§"];

/// A number token found in a line: byte range, decimals, and the chars around it.
struct Token {
    start: usize,
    end: usize,
    decimals: usize,
}

/// Every digit run (with one optional decimal part) of `line`, outside code spans.
fn tokens(line: &str) -> Vec<Token> {
    let b = line.as_bytes();
    let (mut out, mut i, mut code) = (vec![], 0, false);
    while i < b.len() {
        if b[i] == b'`' {
            code = !code;
            i += 1;
            continue;
        }
        if code || !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let mut decimals = 0;
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
                decimals += 1;
            }
        }
        out.push(Token {
            start,
            end: i,
            decimals,
        });
    }
    out
}

/// Whether the token touches a letter or `_` (an identifier), `x`/`×` excepted as a ratio mark
/// when it is not itself part of a word.
fn in_word(line: &str, t: &Token) -> bool {
    let before: Vec<char> = line[..t.start].chars().rev().take(2).collect();
    let after: Vec<char> = line[t.end..].chars().take(2).collect();
    let wordy = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    let ratio = |c: Option<&char>, next: Option<&char>| {
        matches!(c, Some('x')) && !next.is_some_and(|n| n.is_alphanumeric())
    };
    let bad_before = match before.first() {
        Some(&c) if c.is_alphabetic() || c == '_' || c == '.' || c.is_ascii_digit() => {
            !ratio(before.first(), before.get(1))
        }
        _ => false,
    };
    let bad_after = match after.first() {
        Some(&c) if c.is_alphabetic() || c == '_' => !ratio(after.first(), after.get(1)),
        Some('.') => after.get(1).is_some_and(|&c| wordy(c)),
        _ => false,
    };
    bad_before || bad_after
}

/// The text after the token past a ratio `x` or a percent sign: whether it is a percentage,
/// and whether a `†` marks it computed.
fn suffix(line: &str, t: &Token) -> (bool, bool) {
    let rest = &line[t.end..];
    let trimmed = rest.strip_prefix('x').unwrap_or(rest);
    let spaced = trimmed.trim_start_matches(' ');
    let (percent, after) = match spaced.strip_prefix('%') {
        Some(a) => (true, a),
        None => (range_percent(trimmed), trimmed),
    };
    (percent, after.starts_with('†'))
}

/// `32-47 %`: the first end of a range is a percentage when the range's second end is.
fn range_percent(rest: &str) -> bool {
    let Some(r) = rest.strip_prefix('-').or_else(|| rest.strip_prefix('–')) else {
        return false;
    };
    let r = r.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    r.trim_start_matches(' ').starts_with('%')
}

fn after_reference(line: &str, t: &Token) -> bool {
    let head = line[..t.start].trim_end();
    REFERENCES.iter().any(|w| head.ends_with(w))
}

/// The numbers `reading` must cite, by the module's rules.
pub fn cited(reading: &str) -> Vec<Cited> {
    let mut out = vec![];
    let mut fenced = false;
    for (n, line) in reading.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for t in tokens(line) {
            if in_word(line, &t) || after_reference(line, &t) {
                continue;
            }
            let (percent, marked) = suffix(line, &t);
            if marked || (t.decimals == 0 && !percent) {
                continue;
            }
            let text = &line[t.start..t.end];
            let Ok(value) = text.parse() else { continue };
            out.push(Cited {
                line: n + 1,
                text: text.to_string(),
                value,
                decimals: t.decimals,
                percent,
            });
        }
    }
    out
}

/// The numbers a reading may cite: those printed by generated reports and the cells of CSVs.
#[derive(Default)]
pub struct Pool {
    /// (absolute value, decimals, printed as a percentage).
    printed: Vec<(f64, usize, bool)>,
    csv: Vec<f64>,
}

impl Pool {
    /// Every number of a generated report (identifiers aside), as printed.
    pub fn add_printed(&mut self, md: &str) {
        for line in md.lines() {
            for t in tokens(line) {
                if in_word(line, &t) {
                    continue;
                }
                if let Ok(v) = line[t.start..t.end].parse::<f64>() {
                    self.printed.push((v, t.decimals, suffix(line, &t).0));
                }
            }
        }
    }

    /// Every numeric cell of a CSV, at full precision.
    pub fn add_csv(&mut self, csv: &str) {
        for line in csv.lines().skip(1) {
            self.csv.extend(
                line.split(',')
                    .filter_map(|c| c.parse::<f64>().ok())
                    .map(f64::abs),
            );
        }
    }

    /// Whether a table carries `c` within its printed precision.
    pub fn holds(&self, c: &Cited) -> bool {
        let half = 0.5 * 10f64.powi(-(c.decimals as i32)) + 1e-9;
        let printed = self
            .printed
            .iter()
            .any(|&(v, d, p)| d >= c.decimals && p == c.percent && (v - c.value).abs() <= half);
        let in_csv = !c.percent
            && c.significant() >= 4
            && self.csv.iter().any(|v| (v - c.value).abs() <= half);
        printed || in_csv
    }
}

/// The numbers of `reading` that no table of `pool` carries.
pub fn uncited(reading: &str, pool: &Pool) -> Vec<Cited> {
    cited(reading)
        .into_iter()
        .filter(|c| !pool.holds(c))
        .collect()
}

/// A generated report with its hand-written inputs (the readings and deviations it includes
/// verbatim) cut out, so a reading is never checked against itself; an input the report does
/// not include verbatim means the report is stale.
pub fn generated_part(report: &str, inputs: &[(&str, &str)]) -> Result<String> {
    let mut out = report.to_string();
    for (name, text) in inputs {
        if !out.contains(text) {
            bail!("the report does not include {name} as committed: regenerate it (`cargo xtask repro ... --report-only`)");
        }
        out = out.replacen(text, "", 1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
