//! Reading the study's per-seed CSVs (seeds.csv, trajectory.csv): a header that starts with
//! the file's fixed columns, then one row per (method, seed); every error names the file, the
//! line and the column. seeds.rs and trajectory.rs say what their columns mean.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

/// One data line: its fields, read by column with errors that name the place.
pub(crate) struct Fields<'a> {
    what: &'a str,
    line: usize,
    header: &'a [&'a str],
    f: Vec<&'a str>,
}

impl Fields<'_> {
    /// The method (column 0).
    pub(crate) fn method(&self) -> String {
        self.f[0].to_string()
    }

    /// The seed (column 1).
    pub(crate) fn seed(&self) -> Result<u64> {
        let (what, line, v) = (self.what, self.line, self.f[1]);
        v.parse::<u64>()
            .with_context(|| format!("{what}:{line}: seed = `{v}` is not an integer"))
    }

    /// Column `i` as a number.
    pub(crate) fn num(&self, i: usize) -> Result<f64> {
        let (what, line, v) = (self.what, self.line, self.f[i]);
        v.parse::<f64>()
            .with_context(|| format!("{what}:{line}: {} = `{v}` is not a number", self.header[i]))
    }

    /// Column `i` as a number, or None when empty.
    pub(crate) fn maybe(&self, i: usize) -> Result<Option<f64>> {
        if self.f[i].is_empty() {
            Ok(None)
        } else {
            self.num(i).map(Some)
        }
    }
}

/// Parses `text` (`what` names it in errors) whose header starts with `fixed`: `row` gets each
/// line's fields and the number of columns after the fixed ones; `key` gives a row's method
/// and seed. Rows come back by method in seed order; a seed listed twice is an error.
pub(crate) fn read_rows<T>(
    text: &str,
    what: &str,
    fixed: &[&str],
    row: impl Fn(&Fields, usize) -> Result<T>,
    key: impl Fn(&T) -> (&str, u64),
) -> Result<BTreeMap<String, Vec<T>>> {
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines
        .next()
        .with_context(|| format!("{what}: empty file"))?
        .1
        .split(',')
        .collect();
    if header.len() < fixed.len() || header[..fixed.len()] != *fixed {
        bail!("{what}: the header must start with {}", fixed.join(","));
    }
    let extra = header.len() - fixed.len();
    let mut out: BTreeMap<String, Vec<T>> = BTreeMap::new();
    for (no, line) in lines.filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != header.len() {
            bail!(
                "{what}:{}: {} fields, the header has {}",
                no + 1,
                f.len(),
                header.len()
            );
        }
        let fields = Fields {
            what,
            line: no + 1,
            header: &header,
            f,
        };
        let r = row(&fields, extra)?;
        out.entry(key(&r).0.to_string()).or_default().push(r);
    }
    for (m, rows) in &mut out {
        rows.sort_by_key(|r| key(r).1);
        if rows.windows(2).any(|w| key(&w[0]).1 == key(&w[1]).1) {
            bail!("{what}: method {m} lists a seed twice");
        }
    }
    Ok(out)
}
