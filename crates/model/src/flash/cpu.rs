//! The FlashAttention-2 algorithm on the CPU, f32: the forward walks key tiles with an online
//! softmax and keeps only each query row's log-sum-exp; the backward recomputes the tile scores
//! in two passes that never race (dK/dV per key tile, then dQ per query tile), so the result is
//! the same whatever the thread count. Memory is O(T) per head beyond the inputs and outputs.
//!
//! Data flow: `flash::attention` (mod.rs) -> the custom op -> `forward` here; its `bwd` ->
//! `backward` here. Tiles are (BQ x BK) products through `gemm`, one thread per (row, head).

#![allow(unsafe_code)] // `gemm` takes raw pointers; every call goes through `mm`, which checks bounds

use super::Dims;
use rayon::prelude::*;

/// Query rows and key columns per tile: a (64 x 64) f32 score tile is 16 KiB, in L1 beside
/// the Q and K tiles at head_dim 128.
pub(crate) const BQ: usize = 64;
pub(crate) const BK: usize = 64;

/// A view of a row-major matrix inside a slice: `rows` x `cols`, row stride `rs`, column
/// stride `cs`.
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// Row-major rows of length >= `rs`: element (r, c) at r * rs + c.
    fn rows(data: &'a [f32], rs: usize) -> Self {
        Self { data, rs, cs: 1 }
    }

    /// The transpose of row-major rows of stride `cs`: element (r, c) at c * cs + r.
    fn cols(data: &'a [f32], cs: usize) -> Self {
        Self { data, rs: 1, cs }
    }

    fn span(&self, rows: usize, cols: usize) -> usize {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * self.rs + (cols - 1) * self.cs + 1
        }
    }
}

/// dst (m x n, row stride `drs`) = [dst +] a (m x k) @ b (k x n), single-threaded.
#[allow(clippy::too_many_arguments)] // a GEMM's shape, operands and strides
fn mm(m: usize, n: usize, k: usize, dst: &mut [f32], drs: usize, a: Mat, b: Mat, add: bool) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst.len() >= (m - 1) * drs + n, "flash mm: dst too small");
    assert!(a.data.len() >= a.span(m, k) && b.data.len() >= b.span(k, n));
    // SAFETY: the asserts above bound every element the strides address; `dst` is a distinct
    // &mut borrow, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            drs as isize,
            add,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            if add { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Whether query `i` (with key-range start `s`) may attend key `j`.
#[inline]
fn allowed(s: u32, i: usize, j: usize) -> bool {
    s as usize <= j && j <= i
}

/// The keys a tile of query rows [i0, i1) can see: [lo, i1), or None when no row sees any.
fn key_span(starts: &[u32], i0: usize, i1: usize) -> Option<(usize, usize)> {
    let lo = (i0..i1)
        .filter(|&i| starts[i] as usize <= i)
        .map(|i| starts[i] as usize)
        .min()?;
    Some((lo, i1))
}

/// Forward: q (B, Hq, T, D), k/v (B, Hkv, T, D), `starts` (B, T) -> (out (B, Hq, T, D), lse
/// (B, Hq, T)). A row with no key gets 0 and lse = -inf.
pub(crate) fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    starts: &[u32],
    dm: Dims,
) -> (Vec<f32>, Vec<f32>) {
    let Dims { hq, hkv, t, d, .. } = dm;
    let rep = hq / hkv;
    let mut out = vec![0f32; q.len()];
    let mut lse = vec![f32::NEG_INFINITY; q.len() / d.max(1)];
    out.par_chunks_mut(t * d)
        .zip(lse.par_chunks_mut(t))
        .enumerate()
        .for_each(|(bh, (o, l))| {
            let (b, h) = (bh / hq, bh % hq);
            let g = b * hkv + h / rep;
            let qh = &q[bh * t * d..(bh + 1) * t * d];
            let (kh, vh) = (
                &k[g * t * d..(g + 1) * t * d],
                &v[g * t * d..(g + 1) * t * d],
            );
            let st = &starts[b * t..(b + 1) * t];
            let mut s = vec![0f32; BQ * BK];
            let (mut m, mut sum) = (vec![0f32; BQ], vec![0f32; BQ]);
            for i0 in (0..t).step_by(BQ) {
                let i1 = (i0 + BQ).min(t);
                let rows = i1 - i0;
                let Some((lo, hi)) = key_span(st, i0, i1) else {
                    continue;
                };
                m[..rows].fill(f32::NEG_INFINITY);
                sum[..rows].fill(0.0);
                let acc = &mut o[i0 * d..i1 * d];
                for j0 in (lo..hi).step_by(BK) {
                    let j1 = (j0 + BK).min(hi);
                    let cols = j1 - j0;
                    let qa = Mat::rows(&qh[i0 * d..], d);
                    let kb = Mat::cols(&kh[j0 * d..], d);
                    mm(rows, cols, d, &mut s, BK, qa, kb, false);
                    for r in 0..rows {
                        let i = i0 + r;
                        let row = &mut s[r * BK..r * BK + cols];
                        let mut mx = m[r];
                        for (c, x) in row.iter_mut().enumerate() {
                            if allowed(st[i], i, j0 + c) {
                                *x *= dm.scale;
                                mx = mx.max(*x);
                            } else {
                                *x = f32::NEG_INFINITY;
                            }
                        }
                        if mx == f32::NEG_INFINITY {
                            row.fill(0.0);
                            continue;
                        }
                        let alpha = (m[r] - mx).exp();
                        let mut add = 0f32;
                        for x in row.iter_mut() {
                            *x = (*x - mx).exp();
                            add += *x;
                        }
                        sum[r] = sum[r] * alpha + add;
                        m[r] = mx;
                        acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= alpha);
                    }
                    let pa = Mat::rows(&s, BK);
                    let vb = Mat::rows(&vh[j0 * d..], d);
                    mm(rows, d, cols, acc, d, pa, vb, true);
                }
                for r in 0..rows {
                    if sum[r] > 0.0 {
                        let inv = 1.0 / sum[r];
                        acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= inv);
                        l[i0 + r] = m[r] + sum[r].ln();
                    }
                }
            }
        });
    (out, lse)
}

/// P = exp(scale * q k^T - lse) of one tile in `s` (rows x cols, row stride BK), masked to 0;
/// then, with `dp` = dO v^T, `s` becomes dS = P * (dP - delta) * scale.
#[allow(clippy::too_many_arguments)]
fn tile_ds(
    s: &mut [f32],
    dp: &mut [f32],
    (qa, kb, doa, vb): (Mat, Mat, Mat, Mat),
    (i0, rows, j0, cols, d): (usize, usize, usize, usize, usize),
    st: &[u32],
    lse: &[f32],
    delta: &[f32],
    scale: f32,
    p_out: Option<&mut [f32]>,
) {
    mm(rows, cols, d, s, BK, qa, kb, false);
    mm(rows, cols, d, dp, BK, doa, vb, false);
    let mut p_out = p_out;
    for r in 0..rows {
        let i = i0 + r;
        for c in 0..cols {
            let x = r * BK + c;
            let p = if allowed(st[i], i, j0 + c) {
                (s[x] * scale - lse[i]).exp()
            } else {
                0.0
            };
            if let Some(po) = p_out.as_deref_mut() {
                po[x] = p;
            }
            s[x] = p * (dp[x] - delta[i]) * scale;
        }
    }
}

/// Backward: given the forward's inputs, out, lse and dO, returns (dq, dk, dv) in the inputs'
/// layouts.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    starts: &[u32],
    dm: Dims,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Dims { hq, hkv, t, d, .. } = dm;
    let rep = hq / hkv;
    // delta_i = rowsum(dO_i * O_i), the softmax backward's per-row term.
    let delta: Vec<f32> = out
        .par_chunks(d.max(1))
        .zip(dout.par_chunks(d.max(1)))
        .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
        .collect();
    // dK, dV: one task per (row, KV head), key tiles in order, its query heads in order.
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    dk.par_chunks_mut(t * d)
        .zip(dv.par_chunks_mut(t * d))
        .enumerate()
        .for_each(|(bg, (dkh, dvh))| {
            let b = bg / hkv;
            let st = &starts[b * t..(b + 1) * t];
            let (kh, vh) = (
                &k[bg * t * d..(bg + 1) * t * d],
                &v[bg * t * d..(bg + 1) * t * d],
            );
            let (mut s, mut dp, mut p) = (
                vec![0f32; BQ * BK],
                vec![0f32; BQ * BK],
                vec![0f32; BQ * BK],
            );
            for j0 in (0..t).step_by(BK) {
                let j1 = (j0 + BK).min(t);
                let cols = j1 - j0;
                for h in (bg % hkv) * rep..(bg % hkv + 1) * rep {
                    let bh = b * hq + h;
                    let r0 = bh * t;
                    let (qh, doh) = (&q[r0 * d..(r0 + t) * d], &dout[r0 * d..(r0 + t) * d]);
                    // Rows before j0 cannot see these keys; starts never decrease along a row,
                    // so the first query tile whose first row starts after j1 ends the walk.
                    for i0 in (j0..t).step_by(BQ) {
                        if st[i0] as usize >= j1 {
                            break;
                        }
                        let i1 = (i0 + BQ).min(t);
                        let rows = i1 - i0;
                        let mats = (
                            Mat::rows(&qh[i0 * d..], d),
                            Mat::cols(&kh[j0 * d..], d),
                            Mat::rows(&doh[i0 * d..], d),
                            Mat::cols(&vh[j0 * d..], d),
                        );
                        let (l, dl) = (&lse[r0..r0 + t], &delta[r0..r0 + t]);
                        let at = (i0, rows, j0, cols, d);
                        tile_ds(&mut s, &mut dp, mats, at, st, l, dl, dm.scale, Some(&mut p));
                        // dV += P^T dO; dK += dS^T Q.
                        let pt = Mat::cols(&p, BK);
                        let dsa = Mat::cols(&s, BK);
                        mm(cols, d, rows, &mut dvh[j0 * d..], d, pt, mats.2, true);
                        mm(cols, d, rows, &mut dkh[j0 * d..], d, dsa, mats.0, true);
                    }
                }
            }
        });
    // dQ: one task per (row, query head), query tiles over their key tiles.
    let mut dq = vec![0f32; q.len()];
    dq.par_chunks_mut(t * d).enumerate().for_each(|(bh, dqh)| {
        let (b, h) = (bh / hq, bh % hq);
        let g = b * hkv + h / rep;
        let st = &starts[b * t..(b + 1) * t];
        let r0 = bh * t;
        let (qh, doh) = (&q[r0 * d..(r0 + t) * d], &dout[r0 * d..(r0 + t) * d]);
        let (kh, vh) = (
            &k[g * t * d..(g + 1) * t * d],
            &v[g * t * d..(g + 1) * t * d],
        );
        let (mut s, mut dp) = (vec![0f32; BQ * BK], vec![0f32; BQ * BK]);
        for i0 in (0..t).step_by(BQ) {
            let i1 = (i0 + BQ).min(t);
            let rows = i1 - i0;
            let Some((lo, hi)) = key_span(st, i0, i1) else {
                continue;
            };
            for j0 in (lo..hi).step_by(BK) {
                let j1 = (j0 + BK).min(hi);
                let cols = j1 - j0;
                let mats = (
                    Mat::rows(&qh[i0 * d..], d),
                    Mat::cols(&kh[j0 * d..], d),
                    Mat::rows(&doh[i0 * d..], d),
                    Mat::cols(&vh[j0 * d..], d),
                );
                let (l, dl) = (&lse[r0..r0 + t], &delta[r0..r0 + t]);
                tile_ds(
                    &mut s,
                    &mut dp,
                    mats,
                    (i0, rows, j0, cols, d),
                    st,
                    l,
                    dl,
                    dm.scale,
                    None,
                );
                // dQ += dS K.
                let dsa = Mat::rows(&s, BK);
                let kb = Mat::rows(&kh[j0 * d..], d);
                mm(rows, d, cols, &mut dqh[i0 * d..], d, dsa, kb, true);
            }
        }
    });
    (dq, dk, dv)
}
