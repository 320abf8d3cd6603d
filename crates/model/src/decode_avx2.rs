//! AVX2+FMA kernels of the CPU decode step: grouped-query attention over one row's cache
//! (`decode_rows::attend_row`) and the unpacked x·Wᵀ of row-split projections
//! (`decode_cpu::matmul_wt`), used when the CPU has the features and the sizes are multiples
//! of 8.
//!
//! Intrinsics, because the auto-vectoriser got these loops wrong (it transposed keys into lanes
//! for the scores, spilled the value accumulators, and kept runtime block sizes in loops). The
//! attention reads each cache line once for all query heads of a KV group (at context 1024 it
//! runs at memory speed), and the matmul keeps a 3x4 block of dot products in registers.
#![allow(unsafe_code)] // intrinsics; every pointer is derived from a slice whose length is asserted
#![cfg(target_arch = "x86_64")]
#![allow(clippy::needless_range_loop)] // register-block loops index several arrays by lane

use std::arch::x86_64::*;

/// Sum of each of 8 vectors, in order, as one vector.
#[target_feature(enable = "avx2,fma")]
fn hsum8(a: [__m256; 8]) -> __m256 {
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1); // [s0 s1 s2 s3 | s0' s1' s2' s3'] (low, high halves)
    let u1 = _mm256_hadd_ps(t2, t3); // [s4 s5 s6 s7 | s4' s5' s6' s7']
    let lo = _mm256_permute2f128_ps(u0, u1, 0x20);
    let hi = _mm256_permute2f128_ps(u0, u1, 0x31);
    _mm256_add_ps(lo, hi)
}

/// Scores of the R query heads of one KV group: scores[r * len + t] = scale · q_r·k_t, for
/// q (R, d), k (len, d) rows, d a multiple of 8. Each key chunk is loaded once for all R heads
/// (the cache is read at memory speed, so loads are the cost), 8/R slots per horizontal-add
/// tree. Validity is applied by the caller.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn group_scores<const R: usize>(
    q: &[f32],
    k: &[f32],
    scale: f32,
    scores: &mut [f32],
) {
    let d = q.len() / R;
    let len = scores.len() / R;
    assert!(R * 8 <= 64 && 8usize.is_multiple_of(R) && d.is_multiple_of(8) && k.len() >= len * d);
    let g = 8 / R; // slots per tree
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    let sv = _mm256_set1_ps(scale);
    let mut t = 0;
    while t + g <= len {
        let mut acc = [_mm256_setzero_ps(); 8]; // [r * g + j]
        for c in (0..d).step_by(8) {
            let mut qs = [_mm256_setzero_ps(); R];
            for (r, qv) in qs.iter_mut().enumerate() {
                // SAFETY: r * d + c + 8 <= R * d = q.len().
                *qv = unsafe { _mm256_loadu_ps(qp.add(r * d + c)) };
            }
            for j in 0..g {
                // SAFETY: (t + j) * d + c + 8 <= len * d <= k.len().
                let kc = unsafe { _mm256_loadu_ps(kp.add((t + j) * d + c)) };
                for r in 0..R {
                    acc[r * g + j] = _mm256_fmadd_ps(qs[r], kc, acc[r * g + j]);
                }
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_mul_ps(hsum8(acc), sv)) };
        for r in 0..R {
            scores[r * len + t..][..g].copy_from_slice(&lanes[r * g..][..g]);
        }
        t += g;
    }
    for t in t..len {
        for r in 0..R {
            let mut acc = _mm256_setzero_ps();
            for c in (0..d).step_by(8) {
                // SAFETY: as above, for slot t < len and head r < R.
                let (qc, kc) = unsafe {
                    (
                        _mm256_loadu_ps(qp.add(r * d + c)),
                        _mm256_loadu_ps(kp.add(t * d + c)),
                    )
                };
                acc = _mm256_fmadd_ps(qc, kc, acc);
            }
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            scores[r * len + t] = lanes.iter().sum::<f32>() * scale;
        }
    }
}

/// out[r] = Σ_t p[r * len + t] · v_t for the R heads of one KV group, v (len, d) rows, d a
/// multiple of 8: each value chunk is loaded once for all R heads; 8/R vectors of a head's
/// output stay in registers while the slots go by.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn group_weighted_sum<const R: usize>(p: &[f32], v: &[f32], out: &mut [f32]) {
    let d = out.len() / R;
    let len = p.len() / R;
    assert!(8usize.is_multiple_of(R) && d.is_multiple_of(8) && v.len() >= len * d);
    let vp = v.as_ptr();
    let mut c0 = 0;
    while c0 < d {
        let w = ((d - c0) / 8).min(8 / R); // vectors per head in this block
        let mut acc = [_mm256_setzero_ps(); 8]; // [r * w + i]
        for t in 0..len {
            let mut ps = [_mm256_setzero_ps(); R];
            for (r, pv) in ps.iter_mut().enumerate() {
                *pv = _mm256_set1_ps(p[r * len + t]);
            }
            for i in 0..w {
                // SAFETY: t * d + c0 + 8i + 8 <= len * d <= v.len() since c0 + 8w <= d.
                let vc = unsafe { _mm256_loadu_ps(vp.add(t * d + c0 + 8 * i)) };
                for r in 0..R {
                    acc[r * w + i] = _mm256_fmadd_ps(ps[r], vc, acc[r * w + i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..w {
                // SAFETY: r * d + c0 + 8i + 8 <= R * d = out.len().
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr().add(r * d + c0 + 8 * i), acc[r * w + i])
                };
            }
        }
        c0 += 8 * w;
    }
}

/// out (m, n) = x (m, k) @ w^T for w (n, k) row-major, k a multiple of 8: blocks of 3 rows of
/// x against 4 rows of w, 12 accumulators in registers, no packing (the weights of the models
/// this path serves stay in cache, so re-reading them per row block is cheap).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn matmul_wt(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    assert!(k.is_multiple_of(8) && x.len() == m * k && w.len() == n * k && out.len() == m * n);
    let mut i = 0;
    while i < m {
        let rows = (m - i).min(3);
        let mut j = 0;
        while j < n {
            let cols = (n - j).min(4);
            let (xs, ws) = (&x[i * k..(i + rows) * k], &w[j * k..(j + cols) * k]);
            let s = match (rows, cols) {
                (3, 4) => block::<3, 4>(xs, ws, k),
                (3, 3) => block::<3, 3>(xs, ws, k),
                (3, 2) => block::<3, 2>(xs, ws, k),
                (3, _) => block::<3, 1>(xs, ws, k),
                (2, 4) => block::<2, 4>(xs, ws, k),
                (2, 3) => block::<2, 3>(xs, ws, k),
                (2, 2) => block::<2, 2>(xs, ws, k),
                (2, _) => block::<2, 1>(xs, ws, k),
                (_, 4) => block::<1, 4>(xs, ws, k),
                (_, 3) => block::<1, 3>(xs, ws, k),
                (_, 2) => block::<1, 2>(xs, ws, k),
                (_, _) => block::<1, 1>(xs, ws, k),
            };
            for r in 0..rows {
                out[(i + r) * n + j..][..cols].copy_from_slice(&s[r][..cols]);
            }
            j += cols;
        }
        i += rows;
    }
}

/// The R x C dot products of R rows of x against C rows of w (each k long): [r][c].
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block<const R: usize, const C: usize>(x: &[f32], w: &[f32], k: usize) -> [[f32; 8]; 3] {
    assert!(x.len() >= R * k && w.len() >= C * k && k.is_multiple_of(8));
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for c in (0..k).step_by(8) {
        let mut xs = [_mm256_setzero_ps(); R];
        for (r, xv) in xs.iter_mut().enumerate() {
            // SAFETY: r * k + c + 8 <= R * k <= x.len().
            *xv = unsafe { _mm256_loadu_ps(xp.add(r * k + c)) };
        }
        for q in 0..C {
            // SAFETY: q * k + c + 8 <= C * k <= w.len().
            let wv = unsafe { _mm256_loadu_ps(wp.add(q * k + c)) };
            for r in 0..R {
                acc[r][q] = _mm256_fmadd_ps(xs[r], wv, acc[r][q]);
            }
        }
    }
    let mut out = [[0f32; 8]; 3];
    let z = _mm256_setzero_ps();
    for r in 0..R {
        let mut v = [z; 8];
        v[..C].copy_from_slice(&acc[r]);
        // SAFETY: out[r] holds 8 floats.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), hsum8(v)) };
    }
    out
}

/// `matmul_wt` with AVX-512: 4x4 blocks of dot products in zmm registers (the same bytes as the
/// AVX2 3x4 block hold 16 lanes each, half the instructions per multiply-add); rows beyond a
/// multiple of 4 go through the AVX2 kernel, columns beyond one through its 1x1 block.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512DQ, AVX2 and FMA, and k must be a multiple of 16.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn matmul_wt_512(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    assert!(k.is_multiple_of(16) && x.len() == m * k && w.len() == n * k && out.len() == m * n);
    let full = m / 4 * 4;
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    for i in (0..full).step_by(4) {
        let mut j = 0;
        while j + 4 <= n {
            let mut acc = [[_mm512_setzero_ps(); 4]; 4];
            for c in (0..k).step_by(16) {
                let mut xs = [_mm512_setzero_ps(); 4];
                for (r, xv) in xs.iter_mut().enumerate() {
                    // SAFETY: (i + r) * k + c + 16 <= full * k <= x.len().
                    *xv = unsafe { _mm512_loadu_ps(xp.add((i + r) * k + c)) };
                }
                for q in 0..4 {
                    // SAFETY: (j + q) * k + c + 16 <= n * k = w.len().
                    let wv = unsafe { _mm512_loadu_ps(wp.add((j + q) * k + c)) };
                    for r in 0..4 {
                        acc[r][q] = _mm512_fmadd_ps(xs[r], wv, acc[r][q]);
                    }
                }
            }
            // Fold each zmm to a ymm, then 8 sums per horizontal-add tree.
            let half = |v: __m512| {
                _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v))
            };
            for rr in [0, 2] {
                let mut v = [_mm256_setzero_ps(); 8];
                for q in 0..4 {
                    v[q] = half(acc[rr][q]);
                    v[4 + q] = half(acc[rr + 1][q]);
                }
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds 8 floats.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), hsum8(v)) };
                out[(i + rr) * n + j..][..4].copy_from_slice(&lanes[..4]);
                out[(i + rr + 1) * n + j..][..4].copy_from_slice(&lanes[4..]);
            }
            j += 4;
        }
        for j in j..n {
            let wr = &w[j * k..][..k];
            for r in 0..4 {
                out[(i + r) * n + j] = block::<1, 1>(&x[(i + r) * k..][..k], wr, k)[0][0];
            }
        }
    }
    if full < m {
        // SAFETY: the caller guarantees AVX2 and FMA.
        unsafe { matmul_wt(&x[full * k..], w, &mut out[full * n..], m - full, k, n) };
    }
}

/// Whether the AVX-512 matmul can run here.
pub(crate) fn available_512() -> bool {
    available()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
}

/// Whether the AVX2 kernels can run here.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_plain_loops() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2/FMA");
            return;
        }
        for (m, k, n) in [(1, 8, 1), (7, 16, 9), (32, 128, 64), (4, 24, 5), (9, 32, 6)] {
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.13).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.29).cos()).collect();
            let mut out = vec![f32::NAN; m * n];
            // SAFETY: features checked above.
            unsafe { matmul_wt(&x, &w, &mut out, m, k, n) };
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum();
                    let got = out[i * n + j];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "({m},{k},{n}) [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn group_kernels_match_plain_loops() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2/FMA");
            return;
        }
        fn check<const R: usize>(d: usize, len: usize) {
            let q: Vec<f32> = (0..R * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let k: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut s = vec![0f32; R * len];
            // SAFETY: features checked by the caller.
            unsafe { group_scores::<R>(&q, &k, 0.5, &mut s) };
            for r in 0..R {
                for t in 0..len {
                    let want: f32 = (0..d).map(|i| q[r * d + i] * k[t * d + i]).sum::<f32>() * 0.5;
                    let got = s[r * len + t];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "R {R} d {d} head {r} slot {t}: {got} vs {want}"
                    );
                }
            }
            let mut o = vec![f32::NAN; R * d];
            unsafe { group_weighted_sum::<R>(&s, &k, &mut o) };
            for r in 0..R {
                for i in 0..d {
                    let want: f32 = (0..len).map(|t| s[r * len + t] * k[t * d + i]).sum();
                    let got = o[r * d + i];
                    assert!(
                        (got - want).abs() < 1e-3,
                        "R {R} d {d} head {r} dim {i}: {got} vs {want}"
                    );
                }
            }
        }
        for (d, len) in [(32, 19), (8, 3), (64, 8), (40, 17), (128, 5)] {
            check::<1>(d, len);
            check::<2>(d, len);
            check::<4>(d, len);
        }
    }
}
