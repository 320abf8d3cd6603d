//! The study's statistics, below the claims: paired differences with Student t intervals, the
//! exact paired sign-flip permutation test, one-sided p-values of both, and Holm's step-down
//! correction. Pure functions of per-seed differences; claims.rs (v3's claims) and
//! confirmatory.rs (v4's plan, docs/v4/plan.md) decide claims with them.

/// A mean difference with its 95 % interval (None with fewer than two seeds), and how many of
/// the `n` differences are below 0: a sign count that one outlier seed cannot move the way it
/// widens a t interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub mean: f64,
    pub ci: Option<(f64, f64)>,
    pub below_zero: usize,
    pub n: usize,
    /// The differences themselves (the first `MAX_FLIP_SEEDS`), for the sign-flip test.
    pub diffs: [f64; MAX_FLIP_SEEDS],
}

/// The most seeds the sign-flip test enumerates exactly (2^n sign patterns).
pub const MAX_FLIP_SEEDS: usize = 20;

/// The exact one-sided p-value of the paired sign-flip permutation test that the mean of
/// `diffs` is below `x`: the share of the 2^n sign patterns s whose mean of s·(d − x) is at
/// most the observed one (the observed pattern included, so never 0). None without
/// differences or with more than `MAX_FLIP_SEEDS`. "Above x" is `sign_flip_p` of the negated
/// differences at −x.
pub fn sign_flip_p(diffs: &[f64], x: f64) -> Option<f64> {
    let n = diffs.len();
    if n == 0 || n > MAX_FLIP_SEEDS {
        return None;
    }
    let d: Vec<f64> = diffs.iter().map(|v| v - x).collect();
    let observed: f64 = d.iter().sum();
    let eps = 1e-12 * d.iter().map(|v| v.abs()).sum::<f64>().max(1.0);
    let extreme = (0u32..1 << n)
        .filter(|mask| {
            let s: f64 = d
                .iter()
                .enumerate()
                .map(|(i, v)| if mask >> i & 1 == 1 { -v } else { *v })
                .sum();
            s <= observed + eps
        })
        .count();
    Some(extreme as f64 / f64::from(1u32 << n))
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom, to 3 decimals (the table the
/// v3 report was computed with; v4 uses [`t_quantile`]).
pub(crate) fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.960)
}

/// The mean of paired differences and its t interval with half-width `q` · sd / √n, `q` given
/// the degrees of freedom.
fn paired_with(diffs: &[f64], q: impl Fn(usize) -> f64) -> Interval {
    let n = diffs.len();
    let mean = diffs.iter().sum::<f64>() / n.max(1) as f64;
    let ci = (n >= 2).then(|| {
        let half = q(n - 1) * sd(diffs, mean) / (n as f64).sqrt();
        (mean - half, mean + half)
    });
    let mut kept = [0.0; MAX_FLIP_SEEDS];
    for (k, d) in kept.iter_mut().zip(diffs) {
        *k = *d;
    }
    Interval {
        mean,
        ci,
        below_zero: diffs.iter().filter(|&&d| d < 0.0).count(),
        n,
        diffs: kept,
    }
}

/// Sample sd (n − 1) of `xs` about `mean`.
pub(crate) fn sd(xs: &[f64], mean: f64) -> f64 {
    (xs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// The mean of paired differences and its 95 % t interval (v3's quantile table).
pub fn paired(diffs: &[f64]) -> Interval {
    paired_with(diffs, t975)
}

/// The mean of paired differences and its two-sided (1 − 2α) t interval with the exact
/// quantile, so that the interval excludes x exactly when the one-sided p-value is ≤ α.
pub fn paired_at(diffs: &[f64], alpha: f64) -> Interval {
    paired_with(diffs, |df| t_quantile(1.0 - alpha, df))
}

impl Interval {
    /// The differences the sign-flip test reads (None past `MAX_FLIP_SEEDS`).
    pub fn flips(&self) -> Option<&[f64]> {
        (self.n <= MAX_FLIP_SEEDS).then(|| &self.diffs[..self.n])
    }
}

/// Which side of a threshold a one-sided test asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Below,
    Above,
}

/// The one-sided p-value of the t test that the mean of `i`'s differences is on `side` of `x`
/// (None with fewer than two seeds). A zero spread gives 0 when the mean is strictly on the
/// side and 1 otherwise.
pub fn t_p(i: &Interval, side: Side, x: f64) -> Option<f64> {
    let d = i.flips()?;
    if i.n < 2 {
        return None;
    }
    let s = sd(d, i.mean) / (i.n as f64).sqrt();
    let shift = match side {
        Side::Below => x - i.mean,
        Side::Above => i.mean - x,
    };
    if s == 0.0 {
        return Some(if shift > 0.0 { 0.0 } else { 1.0 });
    }
    // P(T ≤ −shift / s) for the side asked.
    Some(t_cdf(-shift / s, i.n - 1))
}

/// The one-sided p-value of the sign-flip test that the mean is on `side` of `x` (None with
/// fewer than two seeds or more than `MAX_FLIP_SEEDS`).
pub fn flip_p(i: &Interval, side: Side, x: f64) -> Option<f64> {
    let d = i.flips()?;
    if i.n < 2 {
        return None;
    }
    match side {
        Side::Below => sign_flip_p(d, x),
        Side::Above => sign_flip_p(&d.iter().map(|v| -v).collect::<Vec<_>>(), -x),
    }
}

/// Holm's step-down decisions at family-wise level `alpha`: sorted ascending, the j-th smallest
/// p-value (0-based) is rejected when it and every smaller one are ≤ alpha / (m − j). A missing
/// p-value never rejects.
pub fn holm(ps: &[Option<f64>], alpha: f64) -> Vec<bool> {
    let m = ps.len();
    let mut order: Vec<usize> = (0..m).collect();
    let p = |i: usize| ps[i].unwrap_or(f64::INFINITY);
    order.sort_by(|&a, &b| p(a).total_cmp(&p(b)).then(a.cmp(&b)));
    let mut out = vec![false; m];
    for (j, &i) in order.iter().enumerate() {
        if p(i) > alpha / (m - j) as f64 {
            break;
        }
        out[i] = true;
    }
    out
}

/// The CDF of Student's t with `df` degrees of freedom, through the regularized incomplete beta
/// function: P(T ≤ t) = 1 − I_{df/(df+t²)}(df/2, 1/2) / 2 for t ≥ 0.
pub fn t_cdf(t: f64, df: usize) -> f64 {
    let v = df as f64;
    let tail = 0.5 * inc_beta(v / (v + t * t), v / 2.0, 0.5);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// The `q` quantile of Student's t (0 < q < 1), by bisection on [`t_cdf`] to 1e-12.
pub fn t_quantile(q: f64, df: usize) -> f64 {
    let (mut lo, mut hi) = (-1e3, 1e3);
    while hi - lo > 1e-12 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; about 15 significant digits).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 − x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized incomplete beta I_x(a, b), by its continued fraction (modified Lentz),
/// using the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) where the fraction converges slowly.
fn inc_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - inc_beta(1.0 - x, b, a);
    }
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    d = 1.0 / if d.abs() < tiny { tiny } else { d };
    let mut f = d;
    for m in 1..300 {
        let m = m as f64;
        for num in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            d = 1.0 / if d.abs() < tiny { tiny } else { d };
            c = 1.0 + num / c;
            if c.abs() < tiny {
                c = tiny;
            }
            f *= c * d;
        }
        if (c * d - 1.0).abs() < 1e-15 {
            break;
        }
    }
    front * f / a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_intervals_match_the_closed_form() {
        // Differences 1, 2, 3: mean 2, sd 1, half-width 4.303 / sqrt(3).
        let i = paired(&[1.0, 2.0, 3.0]);
        let h = 4.303 / 3f64.sqrt();
        let (lo, hi) = i.ci.expect("ci");
        assert!(
            (i.mean - 2.0).abs() < 1e-12
                && (lo - (2.0 - h)).abs() < 1e-12
                && (hi - (2.0 + h)).abs() < 1e-12
        );
        assert_eq!((i.below_zero, i.n), (0, 3));
        assert_eq!(paired(&[0.5]).ci, None);
        let j = paired(&[-1.0, 0.0, -0.5, 2.0]);
        assert_eq!((j.below_zero, j.n), (2, 4), "0 is not below 0");
        assert_eq!(t975(100), 1.960);
    }

    #[test]
    fn the_t_distribution_matches_its_tables() {
        // Every entry of v3's 0.975 table, to its 3 decimals.
        for df in 1..=30 {
            let q = t_quantile(0.975, df);
            assert!((q - t975(df)).abs() < 6e-4, "df {df}: {q} vs {}", t975(df));
        }
        // df = 1 is Cauchy: P(T ≤ 1) = 3/4; symmetric around 0.
        assert!((t_cdf(1.0, 1) - 0.75).abs() < 1e-12);
        assert!((t_cdf(0.0, 7) - 0.5).abs() < 1e-12);
        assert!((t_cdf(-2.0, 5) + t_cdf(2.0, 5) - 1.0).abs() < 1e-12);
        // df = 8 (9 seeds): the 0.975 quantile is 2.306.
        assert!((t_quantile(0.975, 8) - 2.306_004).abs() < 1e-5);
    }

    /// The one-sided t p-value is ≤ α exactly when the (1 − 2α) interval excludes the point.
    #[test]
    fn t_p_values_agree_with_the_interval() {
        let d = [-1.0, -2.5, -0.3, -1.7, 0.4, -2.0, -1.1, -0.9, -1.4];
        let i = paired_at(&d, 0.025);
        let (lo, hi) = i.ci.expect("ci");
        for x in [-2.0, -1.5, lo - 1e-9, lo + 1e-9, 0.0, hi - 1e-9, hi + 1e-9] {
            let below = t_p(&i, Side::Below, x).expect("p") <= 0.025;
            assert_eq!(below, hi < x, "below {x}");
            let above = t_p(&i, Side::Above, x).expect("p") <= 0.025;
            assert_eq!(above, lo > x, "above {x}");
        }
        assert_eq!(t_p(&paired_at(&[1.0], 0.025), Side::Below, 0.0), None);
        let flat = paired_at(&[-1.0, -1.0], 0.025);
        assert_eq!(t_p(&flat, Side::Below, 0.0), Some(0.0));
        assert_eq!(t_p(&flat, Side::Above, 0.0), Some(1.0));
    }

    #[test]
    fn sign_flip_p_values_by_hand() {
        // Three negative differences: only the observed pattern is as low -> 1/8.
        assert_eq!(sign_flip_p(&[-1.0, -2.0, -3.0], 0.0), Some(0.125));
        // Shifting by x tests "below x": [-1, -2, -3] is not below -2.5 (mean -2).
        let p = sign_flip_p(&[-1.0, -2.0, -3.0], -2.5).expect("p");
        assert!(p > 0.5, "{p}");
        // Mixed signs: (+1, −1) -> patterns with sum <= 0 are 3 of 4.
        assert_eq!(sign_flip_p(&[1.0, -1.0], 0.0), Some(0.75));
        assert_eq!(sign_flip_p(&[], 0.0), None);
        assert_eq!(sign_flip_p(&[1.0; MAX_FLIP_SEEDS + 1], 0.0), None);
        // Nine unanimous seeds reach 2^-9, below Holm's first step for 9 claims at 2.5 %.
        let nine = paired_at(&[-1.0; 9], 0.025);
        let p = flip_p(&nine, Side::Below, 0.0).expect("p");
        assert_eq!(p, 1.0 / 512.0);
        assert!(p <= 0.025 / 9.0 && 1.0 / 256.0 > 0.025 / 9.0);
        assert_eq!(flip_p(&nine, Side::Above, 0.0), Some(1.0));
    }

    #[test]
    fn holm_steps_down_and_stops_at_the_first_miss() {
        // m = 4 at 0.05: thresholds 0.0125, 0.0167, 0.025, 0.05.
        let ps = [Some(0.01), Some(0.04), Some(0.012), Some(0.03)];
        assert_eq!(holm(&ps, 0.05), [true, false, true, false]);
        // A small p after a miss is not rejected; a missing p never is.
        let ps = [Some(0.02), Some(0.001), None];
        assert_eq!(holm(&ps, 0.05), [true, true, false]);
        assert_eq!(holm(&[Some(0.02), Some(0.02)], 0.05), [true, true]);
        assert_eq!(holm(&[Some(0.03), Some(0.03)], 0.05), [false, false]);
        assert!(holm(&[], 0.05).is_empty());
    }
}
