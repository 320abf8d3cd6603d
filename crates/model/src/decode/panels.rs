//! The decode step's projections as outer products over weights packed into 32-column panels
//! (`pack_panels`, once per `DecodeWeights` snapshot): AVX-512 tiles of up to 8 rows, or AVX2
//! tiles of up to 6 rows over 16-column halves. Each output is one FMA chain over k in order,
//! so a row's sums never depend on the rows beside it (samples are batch-independent).
//! `matmul::matmul_wt` dispatches here when the panels exist.
#![allow(unsafe_code)] // the intrinsics; pointers come from slices whose lengths are asserted
#![allow(clippy::needless_range_loop)] // register-block loops index several arrays by lane

#[cfg(target_arch = "x86_64")]
use super::avx512::first;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Columns per panel of `pack_panels` (two zmm registers).
pub(super) const PANEL: usize = 32;

/// The projection weights of a model in `pack_panels` layout, built once per `DecodeWeights`
/// snapshot (the weights of one rollout): entry i is
/// weight i of the decode step's list, `None` for weights that are not projections.
pub(crate) struct Packed(pub(crate) Vec<Option<Vec<f32>>>);

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.iter().flatten().map(Vec::len).sum::<usize>();
        write!(f, "Packed({n} floats)")
    }
}

/// w (n, k) row-major -> panels of `PANEL` output columns, each (k, PANEL) row-major (columns
/// past n zero): panel p holds w[p * PANEL + j][c] at p * k * PANEL + c * PANEL + j, so the
/// kernel reads each panel front to back.
pub(crate) fn pack_panels(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(w.len(), n * k);
    let panels = n.div_ceil(PANEL);
    let mut t = vec![0f32; panels * k * PANEL];
    for (j, row) in w.chunks_exact(k).enumerate() {
        let (p, jj) = (j / PANEL, j % PANEL);
        for (c, &v) in row.iter().enumerate() {
            t[(p * k + c) * PANEL + jj] = v;
        }
    }
    t
}

#[cfg(target_arch = "x86_64")]
/// out (m, n) = x (m, k) @ w^T with w in `pack_panels` layout: for each panel of 32 output
/// columns (in L1 while the rows go by), tiles of up to 8 rows in 16 zmm accumulators, one
/// broadcast of x and two loads of the panel per step of k (outer products: no horizontal
/// sums, unlike the dot-product blocks of `wt_avx512`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512DQ, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(super) unsafe fn xw_avx512(
    x: &[f32],
    wt: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    assert!(x.len() == m * k && wt.len() == n.div_ceil(PANEL) * k * PANEL && out.len() == m * n);
    for (p, panel) in wt.chunks_exact(k * PANEL).enumerate() {
        let (j, cols) = (p * PANEL, (n - p * PANEL).min(PANEL));
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(8);
            let (xs, o) = (&x[i * k..(i + rows) * k], &mut out[i * n..(i + rows) * n]);
            match rows {
                8 => tile::<8>(xs, panel, o, j, cols, k, n),
                7 => tile::<7>(xs, panel, o, j, cols, k, n),
                6 => tile::<6>(xs, panel, o, j, cols, k, n),
                5 => tile::<5>(xs, panel, o, j, cols, k, n),
                4 => tile::<4>(xs, panel, o, j, cols, k, n),
                3 => tile::<3>(xs, panel, o, j, cols, k, n),
                2 => tile::<2>(xs, panel, o, j, cols, k, n),
                _ => tile::<1>(xs, panel, o, j, cols, k, n),
            }
            i += rows;
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// Columns j..j + cols (<= 32) of out (R, n) = x (R, k) @ panel (k, 32).
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
fn tile<const R: usize>(
    x: &[f32],
    panel: &[f32],
    out: &mut [f32],
    j: usize,
    cols: usize,
    k: usize,
    n: usize,
) {
    assert!(x.len() == R * k && out.len() == R * n && panel.len() == k * PANEL);
    assert!(cols <= PANEL && j + cols <= n);
    let (m0, m1) = (first(cols), first(cols.saturating_sub(16)));
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for c in 0..k {
        // SAFETY: c * PANEL + 32 <= k * PANEL = panel.len().
        let (w0, w1) = unsafe {
            (
                _mm512_loadu_ps(wp.add(c * PANEL)),
                _mm512_loadu_ps(wp.add(c * PANEL + 16)),
            )
        };
        for r in 0..R {
            // SAFETY: r * k + c < R * k = x.len().
            let xb = _mm512_set1_ps(unsafe { *xp.add(r * k + c) });
            acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
        }
    }
    let op = out.as_mut_ptr();
    for r in 0..R {
        // SAFETY: the masks cover columns j..j + cols of row r, inside out (asserted); masked
        // lanes are not written, and `wrapping_add` keeps the unwritten half's address defined.
        unsafe {
            _mm512_mask_storeu_ps(op.add(r * n + j), m0, acc[r][0]);
            _mm512_mask_storeu_ps(op.wrapping_add(r * n + j + 16), m1, acc[r][1]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// `xw_avx512` for CPUs with AVX2 but not AVX-512: the same panels, each as two halves of 16
/// columns (two ymm registers), tiles of up to 6 rows (12 accumulators, two panel loads and a
/// broadcast: 15 of the 16 ymm registers). Each output is one FMA chain over k in order, so a
/// row's sums do not depend on the rows beside it.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn xw_avx2(x: &[f32], wt: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(x.len() == m * k && wt.len() == n.div_ceil(PANEL) * k * PANEL && out.len() == m * n);
    for (p, panel) in wt.chunks_exact(k * PANEL).enumerate() {
        for half in 0..2 {
            let j = p * PANEL + half * 16;
            if j >= n {
                break;
            }
            let cols = (n - j).min(16);
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(6);
                let (xs, o) = (&x[i * k..(i + rows) * k], &mut out[i * n..(i + rows) * n]);
                let t = (panel, half * 16, j, cols, k, n);
                match rows {
                    6 => tile2::<6>(xs, o, t),
                    5 => tile2::<5>(xs, o, t),
                    4 => tile2::<4>(xs, o, t),
                    3 => tile2::<3>(xs, o, t),
                    2 => tile2::<2>(xs, o, t),
                    _ => tile2::<1>(xs, o, t),
                }
                i += rows;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// Columns j..j + cols (<= 16) of out (R, n) = x (R, k) @ panel (k, 32)[:, h..h + 16].
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tile2<const R: usize>(
    x: &[f32],
    out: &mut [f32],
    (panel, h, j, cols, k, n): (&[f32], usize, usize, usize, usize, usize),
) {
    assert!(x.len() == R * k && out.len() == R * n && panel.len() == k * PANEL);
    assert!(h + 16 <= PANEL && cols <= 16 && j + cols <= n);
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for c in 0..k {
        // SAFETY: c * PANEL + h + 16 <= k * PANEL = panel.len().
        let (w0, w1) = unsafe {
            (
                _mm256_loadu_ps(wp.add(c * PANEL + h)),
                _mm256_loadu_ps(wp.add(c * PANEL + h + 8)),
            )
        };
        for r in 0..R {
            // SAFETY: r * k + c < R * k = x.len().
            let xb = _mm256_set1_ps(unsafe { *xp.add(r * k + c) });
            acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
        }
    }
    for r in 0..R {
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` holds 16 floats.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r][1]);
        }
        out[r * n + j..][..cols].copy_from_slice(&lanes[..cols]);
    }
}

/// Whether an outer-product kernel over packed panels runs here (AVX-512, or AVX2 and FMA).
pub(crate) fn available_packed() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::avx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// AVX-512 with AVX2 and FMA, as `matmul::available_512` (not imported: matmul uses this
    /// file).
    fn available_512() -> bool {
        super::super::avx2::available() && super::super::avx512::available()
    }

    #[test]
    fn outer_product_matmul_matches_plain_loops() {
        if !super::super::avx2::available() {
            eprintln!("skipped: this CPU lacks AVX2/FMA");
            return;
        }
        for (m, k, n) in [
            (1, 8, 1),
            (7, 16, 9),
            (32, 128, 64),
            (9, 24, 40),
            (13, 32, 100),
        ] {
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.13).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.29).cos()).collect();
            let wt = pack_panels(&w, n, k);
            // The AVX-512 kernel (where the CPU has it) and the AVX2 one.
            let mut outs = vec![];
            if available_512() {
                let mut out = vec![f32::NAN; m * n];
                // SAFETY: the CPU has AVX-512F/DQ, AVX2 and FMA (checked).
                unsafe { xw_avx512(&x, &wt, &mut out, m, k, n) };
                outs.push(("avx512", out));
            }
            let mut out = vec![f32::NAN; m * n];
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe { xw_avx2(&x, &wt, &mut out, m, k, n) };
            outs.push(("avx2", out));
            for (isa, out) in &outs {
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 = (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum();
                        let got = out[i * n + j];
                        assert!(
                            (got - want).abs() < 1e-4,
                            "{isa} ({m},{k},{n}) [{i},{j}]: {got} vs {want}"
                        );
                    }
                }
            }
            // A row's sums do not depend on the rows beside it (bit for bit).
            let mut one = vec![f32::NAN; n];
            // SAFETY: as above.
            unsafe { xw_avx2(&x[(m - 1) * k..], &wt, &mut one, 1, k, n) };
            assert_eq!(
                one,
                outs[outs.len() - 1].1[(m - 1) * n..],
                "avx2 ({m},{k},{n})"
            );
        }
    }
}
