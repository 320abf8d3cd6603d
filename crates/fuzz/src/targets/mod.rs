//! The fuzz targets: one per parser terse reads user files or model output with, each calling
//! the project's real public entry points (never a copy), plus the planted targets the
//! harness's own tests fail on (below). A target returns nothing: an `Err` from a parser is
//! the expected answer to a bad input; only a panic, an abort, a hang or an allocation over
//! the limit is a finding. Text parsers: text.rs; files read from a path (datasets,
//! tokenizers, metrics): files.rs; weights and checkpoints: weights.rs.

mod files;
mod text;
mod weights;

use crate::corpus::{self, Entry, Input};
use anyhow::Result;
use std::path::PathBuf;

/// What a target's run gets besides its input: a scratch directory of its own (one per child
/// process, removed when the child ends) and the target's corpus directory.
#[derive(Debug)]
pub struct Ctx {
    pub scratch: PathBuf,
    pub corpus_dir: PathBuf,
}

impl Ctx {
    /// Writes `bytes` to `name` in the scratch directory and returns the path (the parsers
    /// that take a path read exactly this file).
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.scratch.join(name);
        std::fs::write(&p, bytes)
            .unwrap_or_else(|e| panic!("harness: writing scratch {}: {e}", p.display()));
        p
    }
}

/// One fuzz target.
#[derive(Debug)]
pub struct Target {
    pub name: &'static str,
    /// The entry points it calls, for `--list`.
    pub about: &'static str,
    /// The hand-written dictionary (crates/fuzz/dict/<name>.dict, libFuzzer's format); the
    /// corpus's own words are added to it.
    pub dict: &'static str,
    /// Dictionary tokens derived from the code rather than written in `dict` (the config's
    /// method names, from the enums that define them).
    pub words: Option<fn() -> Vec<String>>,
    /// Inputs are truncated to this many bytes.
    pub max_len: usize,
    /// A harness self-test target, run only when named.
    pub planted: bool,
    /// The corpus of a planted target (real targets read crates/fuzz/corpus/<name>/).
    pub builtin: &'static [(&'static str, &'static [u8])],
    pub run: fn(&Input, &Ctx),
}

impl Target {
    pub fn corpus_dir(&self) -> PathBuf {
        corpus::corpus_root().join(self.name)
    }

    /// The seed corpus, sorted by name.
    pub fn corpus(&self) -> Result<Vec<Entry>> {
        if self.builtin.is_empty() {
            return corpus::load(&self.corpus_dir());
        }
        Ok(self
            .builtin
            .iter()
            .map(|(n, b)| Entry {
                name: (*n).into(),
                bytes: b.to_vec(),
            })
            .collect())
    }

    /// The dictionary: the hand-written tokens, the derived ones, then the corpus's words.
    pub fn dictionary(&self, corpus: &[Entry]) -> Vec<String> {
        let mut d = corpus::parse_dict(self.dict);
        d.extend(self.words.map(|w| w()).unwrap_or_default());
        d.extend(corpus::words(corpus));
        d
    }
}

/// Every target, the real ones first in the order CI runs them.
pub fn all() -> Vec<Target> {
    let mut v = vec![
        text::config(),
        files::dataset(),
        weights::safetensors(),
        weights::checkpoint(),
        files::tokenizer(),
        text::template(),
        files::metrics(),
        text::kk(),
        text::math(),
    ];
    v.extend(planted());
    v
}

/// The target called `name`.
pub fn find(name: &str) -> Option<Target> {
    all().into_iter().find(|t| t.name == name)
}

/// Splits a two-part text seed at its separator line (`#### <label>`): the scorers' inputs are
/// a completion and a ground truth, both mutated.
pub fn split_pair(text: &str) -> (&str, &str) {
    match text.find("\n#### ") {
        Some(i) => {
            let rest = &text[i + 6..];
            let gt = rest.split_once('\n').map_or("", |(_, gt)| gt);
            (&text[..i], gt)
        }
        None => (text, ""),
    }
}

/// A fixed working directory inside the scratch one, created on first use.
pub fn subdir(ctx: &Ctx, name: &str) -> PathBuf {
    let d = ctx.scratch.join(name);
    if !d.is_dir() {
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("harness: creating {}: {e}", d.display()));
    }
    d
}

// Planted targets: parsers with a known bug of each kind the harness must catch (a panic, a
// hang, an abort, an allocation over the limit, a stack overflow), hit by about one input in
// four. The harness's tests (crates/fuzz/tests/harness.rs) run them through the bin and expect
// a finding naming the input; `--target` runs them by name, the default run never does.

const SEED: &[(&str, &[u8])] = &[("seed.txt", b"a planted parser's input")];

fn planted_target(name: &'static str, about: &'static str, run: fn(&Input, &Ctx)) -> Target {
    Target {
        name,
        about,
        dict: "\"bug\"\n",
        words: None,
        max_len: 4096,
        planted: true,
        builtin: SEED,
        run,
    }
}

fn planted() -> Vec<Target> {
    vec![
        planted_target("planted-panic", "panics on one input in four", |i, _| {
            assert!(!hit(i), "planted panic");
        }),
        planted_target(
            "planted-hang",
            "loops forever on one input in four",
            |i, _| {
                while hit(i) {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            },
        ),
        planted_target("planted-abort", "aborts on one input in four", |i, _| {
            if hit(i) {
                std::process::abort();
            }
        }),
        planted_target(
            "planted-oom",
            "allocates 2 GiB on one input in four (and survives the refusal)",
            |i, _| {
                if hit(i) {
                    // A parser that checks its allocation (try_reserve) still asked for it.
                    let mut v: Vec<u8> = Vec::new();
                    let _ = v.try_reserve_exact(2 << 30);
                }
            },
        ),
        planted_target(
            "planted-overflow",
            "recurses without bound on one input in four",
            |i, _| {
                if hit(i) {
                    std::hint::black_box(depth(std::hint::black_box(0)));
                }
            },
        ),
    ]
}

/// Whether the planted bug fires: a mutated input whose FNV hash is 0 mod 4.
fn hit(i: &Input) -> bool {
    let h = i.bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    i.bytes != SEED[0].1 && h % 4 == 0
}

/// Unbounded recursion, as a recursive-descent parser on `[[[[...`: the frame holds a buffer
/// so the optimiser cannot turn it into a loop.
fn depth(n: u64) -> u64 {
    if n == u64::MAX {
        return 0;
    }
    let frame = std::hint::black_box([n; 32]);
    depth(frame[n as usize % 32] + 1) + frame[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_splits_at_its_separator_line() {
        assert_eq!(
            split_pair("think\n\\boxed{2}\n#### answer\n2"),
            ("think\n\\boxed{2}", "2")
        );
        assert_eq!(split_pair("no separator"), ("no separator", ""));
    }

    /// Every real target has a corpus on disk, and names are unique.
    #[test]
    fn every_target_has_its_corpus() {
        let all = all();
        for t in all.iter().filter(|t| !t.planted) {
            let c = t.corpus().unwrap_or_else(|e| panic!("{}: {e}", t.name));
            assert!(!c.is_empty(), "{}", t.name);
        }
        let mut names: Vec<_> = all.iter().map(|t| t.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }

    /// The config dictionary holds every method name, read from the enums that define them,
    /// and config.dict repeats none by hand (`short_rl` is also a math scorer's value there).
    #[test]
    fn the_config_dictionary_names_every_method_from_its_enum() {
        let t = find("config").expect("the config target");
        let d = t.dictionary(&[]);
        for n in [
            "\"laser_d\"",
            "\"grpo_lead\"",
            "\"reinforce_pp\"",
            "\"gspo-token\"",
        ] {
            assert!(d.iter().any(|w| w == n), "{n} is not in the dictionary");
        }
        let hand = corpus::parse_dict(t.dict);
        let derived = t.words.map(|w| w()).unwrap_or_default();
        assert!(derived.len() > 15, "{derived:?}");
        let repeated: Vec<&String> = derived
            .iter()
            .filter(|w| hand.contains(w) && w.as_str() != "\"short_rl\"")
            .collect();
        assert!(
            repeated.is_empty(),
            "config.dict lists {repeated:?} by hand"
        );
    }
}
