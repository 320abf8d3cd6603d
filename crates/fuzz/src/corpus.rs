//! Seed corpora and findings on disk: each target's committed real files
//! (crates/fuzz/corpus/<target>/), the words they contribute to the target's dictionary, and the
//! file a finding is saved to (target/fuzz-findings/<target>/), whose name keeps the corpus
//! entry's name so a replay knows which file of a directory the input replaces.

use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One committed seed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// One input for a target: the bytes, and the name of the corpus entry they derive from (the
/// file they stand for: `state.json` of a checkpoint, `flat.parquet` of a dataset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Input {
    /// The bytes as text, invalid UTF-8 replaced, for the parsers that take a `&str` (files
    /// they read through `read_to_string` refuse invalid UTF-8 before parsing, so the lossy
    /// text is the closest input that reaches the parser).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes)
    }
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .map_or_else(|| here.to_path_buf(), Path::to_path_buf)
}

/// Where the committed corpora live.
pub fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// Every file of a target's corpus directory, sorted by name (the order inputs are numbered in).
pub fn load(dir: &Path) -> Result<Vec<Entry>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).with_context(|| format!("reading corpus {}", dir.display()))? {
        let path = e?.path();
        if !path.is_file() {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("corpus file names are UTF-8")?
            .to_string();
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        out.push(Entry { name, bytes });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if out.is_empty() {
        anyhow::bail!("corpus {} holds no file", dir.display());
    }
    Ok(out)
}

/// Words of the corpus for the dictionary: identifiers (TOML and JSON keys, enum values,
/// Jinja variables, LaTeX commands with their backslash) and short quoted strings, so that
/// a key one seed has can land in another.
pub fn words(corpus: &[Entry]) -> Vec<String> {
    let mut set = BTreeSet::new();
    for e in corpus {
        let text = String::from_utf8_lossy(&e.bytes);
        let mut word = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || c == '_' || (c == '\\' && word.is_empty()) {
                word.push(c);
                continue;
            }
            if (3..=40).contains(&word.len()) && !word.starts_with(|c: char| c.is_ascii_digit()) {
                set.insert(std::mem::take(&mut word));
            }
            word.clear();
        }
        for quoted in text.split('"').skip(1).step_by(2) {
            if (1..=40).contains(&quoted.len()) && !quoted.contains('\n') {
                set.insert(format!("\"{quoted}\""));
            }
        }
    }
    // Bounded, so a large seed does not drown the hand-written tokens.
    set.into_iter().take(600).collect()
}

/// A dictionary file: one quoted token a line with `\\`, `\"` and `\xNN` escapes (libFuzzer's
/// format, so its dictionaries can be reused); `#` lines and blank lines are skipped.
pub fn parse_dict(text: &str) -> Vec<String> {
    let mut out = vec![];
    for line in text.lines().map(str::trim) {
        let Some(body) = line.strip_prefix('"').and_then(|l| l.strip_suffix('"')) else {
            continue;
        };
        let mut bytes = vec![];
        let mut it = body.bytes();
        while let Some(b) = it.next() {
            if b != b'\\' {
                bytes.push(b);
                continue;
            }
            match it.next() {
                Some(b'x') => {
                    let hex: Vec<u8> = it.by_ref().take(2).collect();
                    let v = std::str::from_utf8(&hex)
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    bytes.extend(v);
                }
                Some(other) => bytes.push(other),
                None => {}
            }
        }
        out.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    out
}

/// What went wrong on an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Panic,
    Hang,
    Oom,
    StackOverflow,
    Abort,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Panic => "panic",
            Kind::Hang => "hang",
            Kind::Oom => "oom",
            Kind::StackOverflow => "stack-overflow",
            Kind::Abort => "abort",
        }
    }
}

/// The file name a finding is saved under: kind, seed, input index, then after `--` the name
/// of the file the input stands for.
pub fn finding_name(kind: Kind, seed: u64, index: u64, input: &str) -> String {
    format!("{}-s{seed}-i{index}--{input}", kind.label())
}

/// The corpus entry name a saved finding stands for (the part after the first `--`, which may
/// hold a `--` of its own: `lora--state.json`; a file saved by hand is named for itself).
pub fn input_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    match file.split_once("--") {
        Some((_, name)) if !name.is_empty() => name.to_string(),
        _ => file,
    }
}

/// Saves a finding's input, creating the target's folder.
pub fn save_finding(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_finding_names_the_file_it_stands_for() {
        let name = finding_name(Kind::Hang, 7, 1234, "state.json");
        assert_eq!(name, "hang-s7-i1234--state.json");
        assert_eq!(
            input_name(Path::new("x").join(&name).as_path()),
            "state.json"
        );
        assert_eq!(input_name(Path::new("by-hand.toml")), "by-hand.toml");
        let lora = finding_name(Kind::Panic, 0, 1, "lora--state.json");
        assert_eq!(input_name(Path::new(&lora)), "lora--state.json");
    }

    #[test]
    fn a_dictionary_unescapes_quotes_backslashes_and_bytes() {
        let d = parse_dict(
            "# comment\n\"\\\\frac{\"\n\n\"say \\\"hi\\\"\"\n\"\\xe2\\x88\\x9a\"\nbare\n",
        );
        assert_eq!(d, vec!["\\frac{", "say \"hi\"", "\u{221a}"]);
    }

    #[test]
    fn words_hold_keys_commands_and_quoted_strings() {
        let corpus = [Entry {
            name: "a".into(),
            bytes: br#"group_size = 6 \frac{1}{2} "phase": "grpo" 12abc"#.to_vec(),
        }];
        let w = words(&corpus);
        for want in ["group_size", "\\frac", "\"phase\"", "\"grpo\"", "phase"] {
            assert!(w.iter().any(|x| x == want), "{want} missing from {w:?}");
        }
        assert!(
            !w.iter().any(|x| x == "12abc"),
            "a number-led word is not a key"
        );
    }
}
