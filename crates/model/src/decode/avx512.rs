//! AVX-512 grouped-query attention of the CPU decode step over one row's cache, called by
//! `rows::attend_row` first when the CPU has AVX-512F/DQ and the head size is a
//! multiple of 16 (`avx2` serves the rest).
//!
//! One pass over a KV group's cache in chunks of `CHUNK` slots, for all R query heads of the
//! group: the chunk's scores (16 dot products per horizontal-add tree), one max / rescale /
//! exp / sum per head and chunk (not per slot), then the e^(s - max)-weighted values while the
//! chunk's V is in L1. Per slot that is a few vector instructions, so at long contexts the
//! kernel runs at the speed the cache streams from memory (the AVX2 kernel, with scalar
//! softmax bookkeeping per 4 slots, ran at about half of it).
#![allow(unsafe_code)] // intrinsics; every pointer is derived from a slice whose length is asserted
#![cfg(target_arch = "x86_64")]
#![allow(clippy::needless_range_loop)] // register-block loops index several arrays by lane

use super::common::Segs;
use std::arch::x86_64::*;

/// Slots per chunk: the chunk's K and V (CHUNK · D floats each) stay in L1 between the scores
/// and the weighted sum.
const CHUNK: usize = 64;

/// Whether the AVX-512 kernel can run here.
pub(crate) fn available() -> bool {
    super::features().avx512
}

/// Lane i = the sum of a[i]'s 16 lanes (a transposing add tree: 30 shuffles, 15 adds).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn hsum16(a: &[__m512; 16]) -> __m512 {
    let mut b = [_mm512_setzero_ps(); 8];
    for i in 0..8 {
        // Per 128-bit block: [a0 0+2, a1 0+2, a0 1+3, a1 1+3] of the pair (a0, a1).
        let lo = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
        let hi = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
        b[i] = _mm512_add_ps(lo, hi);
    }
    let mut c = [_mm512_setzero_ps(); 4];
    for i in 0..4 {
        // Per 128-bit block: the block sums of a[4i..4i + 4].
        let x = _mm512_shuffle_ps::<0x44>(b[2 * i], b[2 * i + 1]);
        let y = _mm512_shuffle_ps::<0xEE>(b[2 * i], b[2 * i + 1]);
        c[i] = _mm512_add_ps(x, y);
    }
    let mut g = [_mm512_setzero_ps(); 2];
    for i in 0..2 {
        let x = _mm512_shuffle_f32x4::<0x88>(c[2 * i], c[2 * i + 1]);
        let y = _mm512_shuffle_f32x4::<0xDD>(c[2 * i], c[2 * i + 1]);
        g[i] = _mm512_add_ps(x, y);
    }
    let x = _mm512_shuffle_f32x4::<0x88>(g[0], g[1]);
    let y = _mm512_shuffle_f32x4::<0xDD>(g[0], g[1]);
    _mm512_add_ps(x, y)
}

/// Elements i..i + 16 of a cache stored as f16 (H) or f32, as f32 lanes.
///
/// # Safety
/// The 16 elements must lie inside the allocation `base` points into.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn load16<const H: bool>(base: *const u8, i: usize) -> __m512 {
    // SAFETY: the caller guarantees the 16 elements are in bounds.
    unsafe {
        if H {
            _mm512_cvtph_ps(_mm256_loadu_si256(base.add(2 * i).cast()))
        } else {
            _mm512_loadu_ps(base.add(4 * i).cast())
        }
    }
}

/// Unscaled scores of slots t..t + 16/R for the R heads of q (R, D) against keys k (`len`
/// slots of D elements, f16 when H): lane r · (16/R) + j = q_r·k_(t+j). In a TAIL block, slots
/// at or past `len` repeat slot len - 1 (the caller ignores their lanes).
///
/// # Safety
/// `k` must point to at least len · D elements.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn block_scores<const R: usize, const D: usize, const H: bool, const TAIL: bool>(
    q: &[f32],
    k: *const u8,
    t: usize,
    len: usize,
) -> __m512 {
    let s = 16 / R;
    assert!(t < len && (TAIL || t + s <= len) && q.len() == R * D);
    let qp = q.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 16]; // [r * s + j]
    for c in (0..D).step_by(16) {
        let mut qs = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: r * D + c + 16 <= R * D = q.len().
            qs[r] = unsafe { _mm512_loadu_ps(qp.add(r * D + c)) };
        }
        for j in 0..s {
            let slot = if TAIL { (t + j).min(len - 1) } else { t + j };
            // SAFETY: slot < len and c + 16 <= D, inside the caller's len · D elements.
            let kc = unsafe { load16::<H>(k, slot * D + c) };
            for r in 0..R {
                acc[r * s + j] = _mm512_fmadd_ps(qs[r], kc, acc[r * s + j]);
            }
        }
    }
    hsum16(&acc)
}

/// e^x for 16 lanes (the Cephes polynomial of `rows::exp`; 0 below -87.3).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.5)),
        _mm512_set1_ps(88.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let (c1, c2) = super::common::EXP_LN2;
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c1), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(c2), r);
    let poly = super::common::EXP_POLY;
    let mut p = _mm512_set1_ps(poly[0]);
    for c in &poly[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
        _mm512_set1_ps(1.0),
    );
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    let y = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
    let live = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(-87.3));
    _mm512_maskz_mov_ps(live, y)
}

/// Mask of the first n (<= 16) lanes.
#[inline]
pub(crate) fn first(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

/// Attention of the R query heads q (R, D) of one KV group over slots 0..len of its k and v
/// (len, D) rows (stored as f16 when H, else f32), skipping the slots listed in `masked`
/// (ascending): out (R, D) gets the softmax-weighted values (0 for a head with no unmasked
/// slot).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn group_attend<const R: usize, const D: usize, const H: bool>(
    q: &[f32],
    kv: Segs,
    len: usize,
    masked: &[u32],
    out: &mut [f32],
) {
    assert!(16usize.is_multiple_of(R) && D.is_multiple_of(16) && D <= 128);
    assert!(q.len() == R * D && out.len() == R * D);
    let seg_len = kv.seg_len();
    let es = if H { 2 } else { 4 }; // bytes per element
    let s = 16 / R; // slots per score tree
    let nv = D / 16; // vectors per head
    let w = nv.min(8 / R).max(1); // vectors per head per register block of the weighted sum
    let scale = 1.0 / (D as f32).sqrt();
    // Two accumulator sets (even and odd slots): one FMA chain per register would wait on
    // the FMA latency.
    let mut acc = [[[_mm512_setzero_ps(); 8]; R]; 2];
    let (mut m, mut z) = ([f32::NEG_INFINITY; R], [0f32; R]);
    let mut sc = [[0f32; CHUNK + 16]; R]; // scores, then weights, of the chunk's slots
    let mut mi = 0; // cursor into `masked`
    let mut t0 = 0;
    while t0 < len {
        // The chunk's segment, and its first slot o there: a chunk never crosses a segment.
        let (si, o) = if seg_len == usize::MAX {
            (0, t0)
        } else {
            (t0 / seg_len, t0 % seg_len)
        };
        let cn = CHUNK.min(len - t0).min(seg_len - o);
        let (ks, vs) = kv.seg(si);
        let ((kp, kn, kh), (vp, vn, vh)) = (ks.raw(), vs.raw());
        assert!(kn >= (o + cn) * D && vn >= (o + cn) * D);
        assert!(
            kh == H && vh == H,
            "group_attend: cache element type mismatch"
        );
        // Where the next chunk's keys and values start (none past the last chunk).
        let next = if t0 + cn >= len {
            None
        } else if o + cn < seg_len {
            let at = (o + cn) * D * es;
            Some((kp.wrapping_add(at), vp.wrapping_add(at)))
        } else {
            let (nk, nv) = kv.seg(si + 1);
            Some((nk.raw().0, nv.raw().0))
        };
        let mut b = 0;
        while b < cn {
            // Ask for the next chunk's keys and values a chunk ahead: the hardware prefetcher
            // stops at page boundaries and does not follow a paged cache's blocks, and each
            // chunk starts a new stream of K and then of V. This chunk's values were asked for
            // a chunk ago (the first chunk's here). A prefetch never faults.
            let at = b * D * es;
            for x in (0..s * D * es).step_by(64) {
                if t0 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(vp.wrapping_add((o + b) * D * es + x).cast());
                }
                if let Some((nk, nv)) = next {
                    _mm_prefetch::<_MM_HINT_T1>(nk.wrapping_add(at + x).cast());
                    _mm_prefetch::<_MM_HINT_T1>(nv.wrapping_add(at + x).cast());
                }
            }
            // SAFETY: the segment holds o + cn slots of D elements (asserted).
            let raw = unsafe {
                if b + s <= cn {
                    block_scores::<R, D, H, false>(q, kp, o + b, o + cn)
                } else {
                    block_scores::<R, D, H, true>(q, kp, o + b, o + cn)
                }
            };
            let lanes = _mm512_mul_ps(raw, _mm512_set1_ps(scale));
            let mut tmp = [0f32; 16];
            // SAFETY: `tmp` holds 16 floats.
            unsafe { _mm512_storeu_ps(tmp.as_mut_ptr(), lanes) };
            for r in 0..R {
                sc[r][b..b + s].copy_from_slice(&tmp[r * s..][..s]);
            }
            b += s;
        }
        while mi < masked.len() && (masked[mi] as usize) < t0 + cn {
            for row in sc.iter_mut() {
                row[masked[mi] as usize - t0] = f32::NEG_INFINITY;
            }
            mi += 1;
        }
        for r in 0..R {
            let row = sc[r].as_mut_ptr();
            let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
            for x in (0..cn).step_by(16) {
                // SAFETY: x + 16 <= CHUNK + 16 = the row's length.
                let sv = unsafe { _mm512_mask_loadu_ps(mx, first(cn - x), row.add(x)) };
                mx = _mm512_max_ps(mx, sv);
            }
            let cm = _mm512_reduce_max_ps(mx);
            if cm > m[r] {
                // The running max grows: rescale what has been accumulated (e^-inf = 0 at first).
                let c = super::common::exp(m[r] - cm);
                let cv = _mm512_set1_ps(c);
                for set in acc.iter_mut() {
                    for a in set[r].iter_mut().take(nv) {
                        *a = _mm512_mul_ps(*a, cv);
                    }
                }
                z[r] *= c;
                m[r] = cm;
            }
            let mut sum = _mm512_setzero_ps();
            let mv = _mm512_set1_ps(m[r]);
            for x in (0..cn).step_by(16) {
                // Weights of the chunk's slots; 0 past them up to the next 16 (and for a head
                // with nothing unmasked yet: e^(s - max) is not defined there). So an odd
                // chunk's slot cn, which its last pair reads, weighs 0.
                let live = if m[r] == f32::NEG_INFINITY {
                    0
                } else {
                    first(cn - x.min(cn))
                };
                // SAFETY: x + 16 <= CHUNK + 16 = the row's length.
                let p = unsafe {
                    let sv = _mm512_maskz_loadu_ps(live, row.add(x));
                    _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(sv, mv)))
                };
                sum = _mm512_add_ps(sum, p);
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(row.add(x), p) };
            }
            z[r] += _mm512_reduce_add_ps(sum);
        }
        // Weighted values, a register block of w vectors per head at a time, slots in pairs
        // (the weight past an odd chunk's last slot is 0 and its value row is not read).
        for c0 in (0..nv).step_by(w) {
            let mut a0 = [[_mm512_setzero_ps(); 8]; R];
            let mut a1 = [[_mm512_setzero_ps(); 8]; R];
            for r in 0..R {
                for i in 0..w {
                    a0[r][i] = acc[0][r][c0 + i];
                    a1[r][i] = acc[1][r][c0 + i];
                }
            }
            let mut j = 0;
            while j < cn {
                let two = j + 1 < cn;
                for i in 0..w {
                    let col = (c0 + i) * 16;
                    // SAFETY: slot o + j (and o + j + 1 when `two`) < o + cn, col + 16 <= D:
                    // inside the segment's (o + cn) · D elements (asserted).
                    let v0 = unsafe { load16::<H>(vp, (o + j) * D + col) };
                    let v1 = if two {
                        // SAFETY: as above.
                        unsafe { load16::<H>(vp, (o + j + 1) * D + col) }
                    } else {
                        _mm512_setzero_ps()
                    };
                    for r in 0..R {
                        let p0 = _mm512_set1_ps(sc[r][j]);
                        let p1 = _mm512_set1_ps(sc[r][j + 1]);
                        a0[r][i] = _mm512_fmadd_ps(p0, v0, a0[r][i]);
                        a1[r][i] = _mm512_fmadd_ps(p1, v1, a1[r][i]);
                    }
                }
                j += 2;
            }
            for r in 0..R {
                for i in 0..w {
                    acc[0][r][c0 + i] = a0[r][i];
                    acc[1][r][c0 + i] = a1[r][i];
                }
            }
        }
        t0 += cn;
    }
    for r in 0..R {
        let inv = _mm512_set1_ps(if z[r] > 0.0 { 1.0 / z[r] } else { 0.0 });
        for i in 0..nv {
            let o = _mm512_mul_ps(_mm512_add_ps(acc[0][r][i], acc[1][r][i]), inv);
            // SAFETY: r * D + 16i + 16 <= R * D = out.len().
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(r * D + 16 * i), o) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::common::{Kv, Segs};
    use super::super::rows::group_attend_shape;
    use half::f16;
    /// Softmax over the unmasked slots of scale · q_r·k_t, weighted values: plain loops.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        d: usize,
        len: usize,
        masked: &[u32],
    ) -> Vec<f32> {
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; q.len()];
        for (qr, or) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let live: Vec<usize> = (0..len)
                .filter(|t| !masked.contains(&(*t as u32)))
                .collect();
            let s: Vec<f64> = live
                .iter()
                .map(|&t| (0..d).map(|i| (qr[i] * k[t * d + i]) as f64).sum::<f64>() * scale as f64)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (&t, x) in live.iter().zip(&s) {
                for i in 0..d {
                    or[i] += ((x - m).exp() / z * v[t * d + i] as f64) as f32;
                }
            }
        }
        out
    }

    #[test]
    fn group_attend_matches_plain_loops() {
        if !super::available() || !crate::decode::avx2::available() {
            eprintln!("skipped: this CPU lacks AVX-512F/DQ");
            return;
        }
        for (r, d) in [
            (1, 32),
            (2, 32),
            (4, 32),
            (1, 64),
            (2, 64),
            (4, 64),
            (2, 128),
            (4, 128),
        ] {
            for len in [1usize, 5, 64, 65, 130, 200] {
                // No padding; the first 70 slots (a whole first chunk masked: no weight yet
                // when the second starts); scattered slots; every slot.
                let firsts: Vec<u32> = (0..70.min(len as u32 - 1)).collect();
                let scattered: Vec<u32> = (0..len as u32).filter(|t| t % 7 == 3).collect();
                let all: Vec<u32> = (0..len as u32).collect();
                for masked in [&[][..], &firsts, &scattered, &all] {
                    let q: Vec<f32> = (0..r * d).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
                    let k: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.11).cos()).collect();
                    let v: Vec<f32> = (0..len * d).map(|i| (i as f32 * 0.07).sin()).collect();
                    let half =
                        |x: &[f32]| -> Vec<f16> { x.iter().map(|&y| f16::from_f32(y)).collect() };
                    let (kh, vh) = (half(&k), half(&v));
                    let wide = |x: &[f16]| -> Vec<f32> { x.iter().map(|y| y.to_f32()).collect() };
                    // The f32 cache, and the f16 cache against the reference over its values.
                    for (kv, (kr, vr)) in [
                        ((Kv::F32(&k), Kv::F32(&v)), (k.clone(), v.clone())),
                        ((Kv::F16(&kh), Kv::F16(&vh)), (wide(&kh), wide(&vh))),
                    ] {
                        let mut out = vec![f32::NAN; r * d];
                        // SAFETY: the features were checked above (AVX-512 implies AVX2, FMA).
                        let shaped = unsafe {
                            group_attend_shape(
                                true,
                                r,
                                &q,
                                Segs::Flat { k: kv.0, v: kv.1 },
                                len,
                                masked,
                                &mut out,
                            )
                        };
                        assert!(shaped, "shape R {r} D {d}");
                        let want = reference(&q, &kr, &vr, d, len, masked);
                        for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                            assert!(
                                (a - b).abs() < 1e-5,
                                "R {r} D {d} len {len} masked {} f16 {}: out[{i}] {a} vs {b}",
                                masked.len(),
                                matches!(kv.0, Kv::F16(_)),
                            );
                        }
                    }
                }
            }
        }
    }
}
