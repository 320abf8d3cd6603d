//! The sampler's semantics, the CPU path of rollout and the reference of kernels/sample.cu:
//! temperature, then top-k, top-p and min-p truncation (HF's warper order), then inverse CDF
//! with one uniform number. Probabilities in f64; ties in the truncated order by token id.
//! terse-rollout's `sample_row` is this function; the kernel must pick its token except where
//! a draw or a top-p mass lies within rounding of a boundary, or at tied logits.

/// The warpers: temperature (0 = greedy), top-k (0 = off), top-p (1 = off), min-p (0 = off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Warpers {
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
    pub min_p: f64,
}

impl Warpers {
    /// Whether any truncation applies to a row of `v` logits (without one, the inverse CDF walks
    /// the ids in order; with one, the kept set in descending probability).
    pub fn truncating(&self, v: usize) -> bool {
        (self.top_k > 0 && self.top_k < v) || self.top_p < 1.0 || self.min_p > 0.0
    }
}

/// One drawn token with its log-probability under the distribution it was drawn from (after
/// truncation and renormalisation) and under the plain temperature-scaled softmax (what the
/// trainer recomputes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    pub token: u32,
    pub logp_sampled: f32,
    pub logp_plain: f32,
    /// Entropy (nats) of the plain temperature-scaled softmax the token came from.
    pub entropy: f32,
}

/// The truncated, renormalised distribution as (token, probability) pairs, plus the plain
/// log-partition (for plain log-probs). Greedy returns the argmax with probability 1.
pub fn distribution(logits: &[f32], p: &Warpers) -> (Vec<(u32, f64)>, f64) {
    let (probs, log_z, _) = distribution_with_entropy(logits, p);
    (probs, log_z)
}

/// [`distribution`] plus the entropy of the plain softmax (computed from the same exponentials).
fn distribution_with_entropy(logits: &[f32], p: &Warpers) -> (Vec<(u32, f64)>, f64, f64) {
    let t = if p.temperature > 0.0 {
        p.temperature
    } else {
        1.0
    };
    let scaled: Vec<f64> = logits.iter().map(|&x| f64::from(x) / t).collect();
    let m = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scaled.iter().map(|x| (x - m).exp()).sum();
    let log_z = m + z.ln();
    // H = Σ p (log Z − x); terms with p = 0 contribute nothing (also a masked logit's, -inf).
    let term = |x: f64, q: f64| if q > 0.0 { q * (log_z - x) } else { 0.0 };
    if p.temperature == 0.0 {
        // First maximal index, as argmax does; no distribution to build.
        let best = scaled.iter().position(|&x| x == m).unwrap_or(0);
        let entropy = scaled.iter().map(|&x| term(x, (x - log_z).exp())).sum();
        return (vec![(best as u32, 1.0)], log_z, entropy);
    }
    let mut probs: Vec<(u32, f64)> = scaled
        .iter()
        .enumerate()
        .map(|(i, x)| (i as u32, (x - log_z).exp()))
        .collect();
    let entropy = probs
        .iter()
        .map(|&(i, q)| term(scaled[i as usize], q))
        .sum();
    if p.truncating(probs.len()) {
        // Descending probability, ties by token id (deterministic).
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            probs.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let total: f64 = probs.iter().map(|x| x.1).sum();
            let mut cum = 0.0;
            let keep = probs
                .iter()
                .position(|x| {
                    cum += x.1 / total;
                    cum >= p.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        if p.min_p > 0.0 {
            let total: f64 = probs.iter().map(|x| x.1).sum();
            let cut = p.min_p * probs[0].1 / total;
            probs.retain(|x| x.1 / total >= cut);
        }
    }
    let total: f64 = probs.iter().map(|x| x.1).sum();
    for x in &mut probs {
        x.1 /= total;
    }
    (probs, log_z, entropy)
}

/// Draws one token from a row of logits with uniform `u` ∈ [0, 1).
pub fn sample_row(logits: &[f32], p: &Warpers, u: f64) -> Drawn {
    let (dist, log_z, entropy) = distribution_with_entropy(logits, p);
    let mut cum = 0.0;
    let mut pick = dist[dist.len() - 1];
    for &x in &dist {
        cum += x.1;
        if u < cum {
            pick = x;
            break;
        }
    }
    let t = if p.temperature > 0.0 {
        p.temperature
    } else {
        1.0
    };
    Drawn {
        token: pick.0,
        logp_sampled: pick.1.ln() as f32,
        logp_plain: (f64::from(logits[pick.0 as usize]) / t - log_z) as f32,
        entropy: entropy as f32,
    }
}
