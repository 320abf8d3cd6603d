//! The source lines `cargo xtask kernel-model`'s profiles speak of, found by the `// model: TAG`
//! comments the kernel sources carry on those lines (kernels/flash_tc.cu, flash_fa2.cu,
//! flash_fa2_bwd.cu, fa2.cuh) instead of by number, so an edit that moves them leaves the
//! profiles right. A line may carry several tags (`// model: a, b`); `begin X` and `end X` mark
//! the first and last line of a region (a block the profile treats as one). The SASS names lines
//! by number: the profiles ask which tag a line carries.

use anyhow::{bail, Result};
use std::ops::RangeInclusive;

/// The comment that introduces a line's tags.
const MARK: &str = "// model:";

/// One source file's tagged lines.
#[derive(Debug, Clone)]
pub struct Marks {
    file: &'static str,
    /// (line, tag), in line order.
    tags: Vec<(u32, String)>,
}

impl Marks {
    /// The tags of `text`, the source of kernels/`file`.
    pub fn parse(file: &'static str, text: &str) -> Result<Marks> {
        let mut tags = vec![];
        for (n, line) in text.lines().enumerate() {
            let Some((_, rest)) = line.split_once(MARK) else {
                continue;
            };
            for tag in rest.split(',').map(str::trim) {
                let words: Vec<&str> = tag.split_whitespace().collect();
                let ok = match words.as_slice() {
                    [one] => one.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                    ["begin" | "end", _] => true,
                    _ => false,
                };
                if !ok {
                    bail!("kernels/{file}:{}: `{tag}` is not a model tag", n + 1);
                }
                tags.push((n as u32 + 1, words.join(" ")));
            }
        }
        Ok(Marks { file, tags })
    }

    /// The lines tagged `tag`.
    pub fn lines(&self, tag: &str) -> Vec<u32> {
        self.tags
            .iter()
            .filter(|(_, t)| t == tag)
            .map(|&(l, _)| l)
            .collect()
    }

    /// The one line tagged `tag`.
    pub fn line(&self, tag: &str) -> Result<u32> {
        match self.lines(tag).as_slice() {
            [one] => Ok(*one),
            [] => bail!("kernels/{}: no line tagged `{MARK} {tag}`", self.file),
            many => bail!("kernels/{}: `{tag}` tags lines {many:?}", self.file),
        }
    }

    /// The lines from `begin tag` to `end tag`.
    pub fn region(&self, tag: &str) -> Result<RangeInclusive<u32>> {
        Ok(self.line(&format!("begin {tag}"))?..=self.line(&format!("end {tag}"))?)
    }

    /// The tag (not a region bound) of `line`, if any: what the profiles match on.
    pub fn tag(&self, line: u32) -> Option<&str> {
        self.tags
            .iter()
            .find(|(l, t)| *l == line && !t.starts_with("begin ") && !t.starts_with("end "))
            .map(|(_, t)| t.as_str())
    }

    /// Whether `line` carries `tag`.
    pub fn is(&self, line: u32, tag: &str) -> bool {
        self.tags.iter().any(|(l, t)| *l == line && t == tag)
    }
}

/// For the profiles' tests: each `(tag, lines, text)` tags that many lines of `src`, and each
/// statement it tags (a run of consecutive tagged lines) holds `text`, so a tag moved off its
/// statement fails.
#[cfg(test)]
pub fn assert_tags(m: &Marks, src: &str, table: &[(&str, usize, &str)]) {
    let line = |n: u32| src.lines().nth(n as usize - 1).unwrap_or_default();
    for &(tag, count, text) in table {
        let lines = m.lines(tag);
        assert_eq!(lines.len(), count, "`{tag}` in {}: {lines:?}", m.file);
        let mut runs: Vec<Vec<u32>> = vec![];
        for n in lines {
            match runs.last_mut() {
                Some(run) if run.last() == Some(&(n - 1)) => run.push(n),
                _ => runs.push(vec![n]),
            }
        }
        for run in runs {
            assert!(
                run.iter().any(|&n| line(n).contains(text)),
                "{}:{run:?} (`{tag}`) is `{}`, not `{text}`",
                m.file,
                line(run[0]).trim()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_regions_and_errors() {
        let src = "a\nfor (;;) {  // model: main, begin loop\nx = 1;  // model: store\n\
                   }  // model: end loop\ny = 2;  // model: store\n";
        let m = Marks::parse("k.cu", src).expect("the fixture's tags");
        assert_eq!(m.line("main").expect("the fixture's tags"), 2);
        assert_eq!(m.lines("store"), [3, 5]);
        assert!(m.line("store").is_err() && m.line("absent").is_err());
        assert_eq!(m.region("loop").expect("the fixture's tags"), 2..=4);
        assert_eq!((m.tag(2), m.tag(4), m.tag(1)), (Some("main"), None, None));
        assert!(m.is(2, "begin loop") && !m.is(3, "main"));
        let bad = Marks::parse("k.cu", "x;  // model: two words\n").expect_err("an error");
        assert_eq!(
            bad.to_string(),
            "kernels/k.cu:1: `two words` is not a model tag"
        );
    }
}
