//! x·Wᵀ for the CPU decode step's projections (W in HF layout, (out, in) row-major), for small
//! models whose weights stay in cache (a thread owns a part of the batch): outer products over
//! W packed into 32-column panels once per decode snapshot (panels.rs), else AVX-512 4x4 /
//! AVX2 3x4 dot-product register blocks over W in place; larger models go through `gemm` with
//! its own threads. This file is the dispatcher.
#![allow(unsafe_code)] // `gemm` and the intrinsics; pointers come from slices whose lengths are asserted
#![allow(clippy::needless_range_loop)] // register-block loops index several arrays by lane

#[cfg(target_arch = "x86_64")]
use super::avx2::hsum8;
#[cfg(target_arch = "x86_64")]
use super::panels::{xw_avx2, xw_avx512};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Work (multiply-adds) below which a matmul runs on the calling thread: waking the pool costs
/// more than it saves.
const PAR_MIN_WORK: usize = 1 << 16;

/// out (m, n) = x (m, k) @ w^T for w (n, k) row-major; `wt`, when given, is the same weight
/// in `pack_panels` layout, which the AVX-512 outer-product kernel reads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_wt(
    x: &[f32],
    w: &[f32],
    wt: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    par: bool,
) {
    assert!(x.len() == m * k && w.len() == n * k && out.len() == m * n);
    #[cfg(target_arch = "x86_64")]
    if let (false, Some(wt)) = (par, wt) {
        if available_512() {
            // SAFETY: the CPU has AVX-512F/DQ, AVX2 and FMA (checked).
            unsafe { xw_avx512(x, wt, out, m, k, n) };
            return;
        }
        if super::avx2::available() {
            // SAFETY: the CPU has AVX2 and FMA (checked).
            unsafe { xw_avx2(x, wt, out, m, k, n) };
            return;
        }
    }
    // Single-threaded calls (rows already split across threads, so the weights are small) skip
    // gemm's packing of W, which would be redone on every call.
    #[cfg(target_arch = "x86_64")]
    if !par && k.is_multiple_of(16) && available_512() {
        // SAFETY: the CPU has AVX-512F/DQ, AVX2 and FMA (checked).
        unsafe { wt_avx512(x, w, out, m, k, n) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if !par && k.is_multiple_of(8) && super::avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        unsafe { wt_avx2(x, w, out, m, k, n) };
        return;
    }
    let par = if par && m * n * k >= PAR_MIN_WORK {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the three slices hold exactly the (m, n), (m, k) and (n, k) elements the strides
    // below address (asserted above), and `out` does not alias the inputs (&mut).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(target_arch = "x86_64")]
/// out (m, n) = x (m, k) @ w^T for w (n, k) row-major, k a multiple of 8: blocks of 3 rows of
/// x against 4 rows of w, 12 accumulators in registers, no packing (the weights of the models
/// this path serves stay in cache, so re-reading them per row block is cheap).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn wt_avx2(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
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

#[cfg(target_arch = "x86_64")]
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

#[cfg(target_arch = "x86_64")]
/// `matmul_wt` with AVX-512: 4x4 blocks of dot products in zmm registers (the same bytes as the
/// AVX2 3x4 block hold 16 lanes each, half the instructions per multiply-add); rows beyond a
/// multiple of 4 go through the AVX2 kernel, columns beyond one through its 1x1 block.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512DQ, AVX2 and FMA, and k must be a multiple of 16.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn wt_avx512(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
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
        unsafe { wt_avx2(&x[full * k..], w, &mut out[full * n..], m - full, k, n) };
    }
}

#[cfg(target_arch = "x86_64")]
/// Whether the AVX-512 matmuls can run here (they are compiled with AVX2 and FMA as well).
pub(crate) fn available_512() -> bool {
    super::avx2::available() && super::avx512::available()
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_plain_loops() {
        if !crate::decode::avx2::available() {
            eprintln!("skipped: this CPU lacks AVX2/FMA");
            return;
        }
        for (m, k, n) in [(1, 8, 1), (7, 16, 9), (32, 128, 64), (4, 24, 5), (9, 32, 6)] {
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.13).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.29).cos()).collect();
            let mut out = vec![f32::NAN; m * n];
            // SAFETY: features checked above.
            unsafe { wt_avx2(&x, &w, &mut out, m, k, n) };
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
}
