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

/// One (query head, KV head) pair's slices for the backward: q and dO rows of the query head,
/// k and v rows of its KV head, the row's key-range starts, the head's lse and delta.
struct HeadPair<'a> {
    q: &'a [f32],
    dout: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    starts: &'a [u32],
    lse: &'a [f32],
    delta: &'a [f32],
    d: usize,
    scale: f32,
}

impl HeadPair<'_> {
    /// The tile of query rows [i0, i0 + rows) x keys [j0, j0 + cols): P = exp(scale q k^T -
    /// lse), masked to 0 (written to `p_out` when given), then `s` = dS = P (dP - delta) scale
    /// with dP = dO v^T in `dp`. Both buffers have row stride BK.
    fn ds(
        &self,
        s: &mut [f32],
        dp: &mut [f32],
        (i0, rows): (usize, usize),
        (j0, cols): (usize, usize),
        mut p_out: Option<&mut [f32]>,
    ) {
        let d = self.d;
        mm(
            rows,
            cols,
            d,
            s,
            BK,
            Mat::rows(&self.q[i0 * d..], d),
            Mat::cols(&self.k[j0 * d..], d),
            false,
        );
        mm(
            rows,
            cols,
            d,
            dp,
            BK,
            Mat::rows(&self.dout[i0 * d..], d),
            Mat::cols(&self.v[j0 * d..], d),
            false,
        );
        for r in 0..rows {
            let i = i0 + r;
            for c in 0..cols {
                let x = r * BK + c;
                let p = if allowed(self.starts[i], i, j0 + c) {
                    (s[x] * self.scale - self.lse[i]).exp()
                } else {
                    0.0
                };
                if let Some(po) = p_out.as_deref_mut() {
                    po[x] = p;
                }
                s[x] = p * (dp[x] - self.delta[i]) * self.scale;
            }
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
    // The slices of query head h of row b and its KV head.
    let pair = |b: usize, h: usize| {
        let (bh, g) = (b * hq + h, b * hkv + h / rep);
        let (rows, kv) = (bh * t * d..(bh + 1) * t * d, g * t * d..(g + 1) * t * d);
        HeadPair {
            q: &q[rows.clone()],
            dout: &dout[rows],
            k: &k[kv.clone()],
            v: &v[kv],
            starts: &starts[b * t..(b + 1) * t],
            lse: &lse[bh * t..(bh + 1) * t],
            delta: &delta[bh * t..(bh + 1) * t],
            d,
            scale: dm.scale,
        }
    };
    // dK, dV: one task per (row, KV head), key tiles in order, its query heads in order.
    let mut dk = vec![0f32; k.len()];
    let mut dv = vec![0f32; v.len()];
    dk.par_chunks_mut(t * d)
        .zip(dv.par_chunks_mut(t * d))
        .enumerate()
        .for_each(|(bg, (dkh, dvh))| {
            let b = bg / hkv;
            let mut tiles = [(); 3].map(|_| vec![0f32; BQ * BK]);
            let [s, dp, p] = &mut tiles;
            for j0 in (0..t).step_by(BK) {
                let cols = (j0 + BK).min(t) - j0;
                for h in (bg % hkv) * rep..(bg % hkv + 1) * rep {
                    let hp = pair(b, h);
                    // Rows before j0 cannot see these keys; starts never decrease along a row,
                    // so the first query tile whose first row starts after the keys ends the walk.
                    for i0 in (j0..t).step_by(BQ) {
                        if hp.starts[i0] as usize >= j0 + cols {
                            break;
                        }
                        let rows = (i0 + BQ).min(t) - i0;
                        hp.ds(s, dp, (i0, rows), (j0, cols), Some(p));
                        // dV += P^T dO; dK += dS^T Q.
                        let (doa, qa) = (
                            Mat::rows(&hp.dout[i0 * d..], d),
                            Mat::rows(&hp.q[i0 * d..], d),
                        );
                        mm(
                            cols,
                            d,
                            rows,
                            &mut dvh[j0 * d..],
                            d,
                            Mat::cols(p, BK),
                            doa,
                            true,
                        );
                        mm(
                            cols,
                            d,
                            rows,
                            &mut dkh[j0 * d..],
                            d,
                            Mat::cols(s, BK),
                            qa,
                            true,
                        );
                    }
                }
            }
        });
    // dQ: one task per (row, query head), query tiles over their key tiles.
    let mut dq = vec![0f32; q.len()];
    dq.par_chunks_mut(t * d).enumerate().for_each(|(bh, dqh)| {
        let hp = pair(bh / hq, bh % hq);
        let (mut s, mut dp) = (vec![0f32; BQ * BK], vec![0f32; BQ * BK]);
        for i0 in (0..t).step_by(BQ) {
            let i1 = (i0 + BQ).min(t);
            let Some((lo, hi)) = key_span(hp.starts, i0, i1) else {
                continue;
            };
            for j0 in (lo..hi).step_by(BK) {
                let cols = (j0 + BK).min(hi) - j0;
                hp.ds(&mut s, &mut dp, (i0, i1 - i0), (j0, cols), None);
                // dQ += dS K.
                let kb = Mat::rows(&hp.k[j0 * d..], d);
                mm(
                    i1 - i0,
                    d,
                    cols,
                    &mut dqh[i0 * d..],
                    d,
                    Mat::rows(&s, BK),
                    kb,
                    true,
                );
            }
        }
    });
    (dq, dk, dv)
}
