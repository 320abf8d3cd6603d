//! RL and evaluation metrics (docs/methods.md, Short-RL, Evaluation metrics): length statistics, unbiased pass@k, compression
//! rate and the unweighted Overall mean, Short-RL's "averaged by steps" and "last", distinct-n
//! and lexical TTR, CARE's difficulty buckets and per-question length z-score bins.

use crate::types::{mean, std, Group};
use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Length statistics of a batch; means are None when the subset is empty.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LengthStats {
    pub mean: Option<f64>,
    pub min: Option<usize>,
    pub max: Option<usize>,
    pub mean_correct: Option<f64>,
    pub mean_incorrect: Option<f64>,
    pub truncated_frac: Option<f64>,
}

pub fn length_stats(groups: &[Group]) -> LengthStats {
    let all: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
    let m = |f: &dyn Fn(&&crate::SampleStat) -> bool| {
        let v: Vec<f64> = all.iter().filter(|s| f(s)).map(|s| s.len as f64).collect();
        (!v.is_empty()).then(|| mean(&v))
    };
    LengthStats {
        mean: m(&|_| true),
        min: all.iter().map(|s| s.len).min(),
        max: all.iter().map(|s| s.len).max(),
        mean_correct: m(&|s| s.correct),
        mean_incorrect: m(&|s| !s.correct),
        truncated_frac: (!all.is_empty())
            .then(|| all.iter().filter(|s| s.truncated).count() as f64 / all.len() as f64),
    }
}

/// Unbiased pass@k for n samples with c correct (Chen et al. 2021), in its stable product form.
/// Requires k ≤ n.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(
        k >= 1 && k <= n && c <= n,
        "pass@k needs 1 <= k <= n and c <= n (n={n}, c={c}, k={k})"
    );
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// Compression rate Tok_method / Tok_vanilla.
pub fn compression_rate(tokens_method: f64, tokens_vanilla: f64) -> f64 {
    tokens_method / tokens_vanilla
}

/// The Overall column: the unweighted mean over benchmarks.
pub fn overall(per_benchmark: &[f64]) -> f64 {
    mean(per_benchmark)
}

/// Short-RL's "averaged by steps" (mean of per-step mean lengths) and "last".
pub fn averaged_by_steps(per_step_mean_len: &[f64]) -> (f64, Option<f64>) {
    (mean(per_step_mean_len), per_step_mean_len.last().copied())
}

/// NLTK's WordPunctTokenizer (`\w+|[^\w\s]+`), lowercased, single-character punctuation dropped.
pub fn word_punct_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut cur_word: Option<bool> = None;
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            let t = std::mem::take(cur);
            let single_punct =
                t.chars().count() == 1 && !t.chars().all(|c| c.is_alphanumeric() || c == '_');
            if !single_punct {
                out.push(t.to_lowercase());
            }
        }
    };
    for ch in text.chars() {
        if ch.is_whitespace() {
            flush(&mut cur, &mut out);
            cur_word = None;
            continue;
        }
        let w = ch.is_alphanumeric() || ch == '_';
        if cur_word.is_some_and(|c| c != w) {
            flush(&mut cur, &mut out);
        }
        cur_word = Some(w);
        cur.push(ch);
    }
    flush(&mut cur, &mut out);
    out
}

fn ngrams(tokens: &[String], n: usize) -> Vec<Vec<String>> {
    if tokens.len() < n {
        return vec![];
    }
    tokens.windows(n).map(<[String]>::to_vec).collect()
}

/// distinct-n: unique n-grams / total n-grams, pooled over all texts (0 when there are none).
pub fn distinct_n(texts: &[&str], n: usize) -> f64 {
    let grams: Vec<Vec<String>> = texts
        .iter()
        .flat_map(|t| ngrams(&word_punct_tokens(t), n))
        .collect();
    if grams.is_empty() {
        return 0.0;
    }
    grams.iter().collect::<HashSet<_>>().len() as f64 / grams.len() as f64
}

/// Lexical diversity (Guo et al.): mean over n = 1..3 of the type-token ratio of up to `cap`
/// n-grams sampled (seeded) from the pool of all texts; all of them when the pool is smaller.
pub fn lexical_diversity(texts: &[&str], cap: usize, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ttr: Vec<f64> = (1..=3)
        .map(|n| {
            let pool: Vec<Vec<String>> = texts
                .iter()
                .flat_map(|t| ngrams(&word_punct_tokens(t), n))
                .collect();
            if pool.is_empty() {
                return 0.0;
            }
            let picked: Vec<&Vec<String>> = if pool.len() > cap {
                sample(&mut rng, pool.len(), cap)
                    .iter()
                    .map(|i| &pool[i])
                    .collect()
            } else {
                pool.iter().collect()
            };
            picked.iter().collect::<HashSet<_>>().len() as f64 / picked.len() as f64
        })
        .collect();
    mean(&ttr)
}

/// CARE's difficulty buckets of a solve rate p (docs/methods.md, Evaluation metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Difficulty {
    /// [0, 0.25]
    Hard,
    /// (0.25, 0.75]
    Partial,
    /// (0.75, 1]
    Easy,
}

pub fn difficulty(p: f64) -> Difficulty {
    if p <= 0.25 {
        Difficulty::Hard
    } else if p <= 0.75 {
        Difficulty::Partial
    } else {
        Difficulty::Easy
    }
}

/// Per-question length z-score bins (docs/methods.md, Evaluation metrics): z from the mean/population std of each
/// question's correct lengths, applied to all its samples; questions with < 3 correct samples or
/// zero std are skipped. Returns bin index (floor(z / width)) -> (correct, total), pooled.
pub fn zscore_bins(questions: &[Group], width: f64) -> BTreeMap<i64, (usize, usize)> {
    let mut bins: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
    for q in questions {
        let c = q.correct_lens();
        let (m, sd) = (mean(&c), std(&c, 0));
        if c.len() < 3 || sd == 0.0 {
            continue;
        }
        for s in &q.samples {
            let bin = ((s.len as f64 - m) / sd / width).floor() as i64;
            let e = bins.entry(bin).or_default();
            e.0 += usize::from(s.correct);
            e.1 += 1;
        }
    }
    bins
}
