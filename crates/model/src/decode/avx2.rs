//! AVX2+FMA grouped-query attention of the CPU decode step over one row's cache, called by
//! `rows::attend_row` when the CPU has the features and the head size is a multiple of 8
//! (and `avx512` cannot serve: no AVX-512, or a head size not a multiple of 16).
//!
//! Intrinsics, because the auto-vectoriser got these loops wrong (it transposed keys into lanes
//! for the scores and spilled the value accumulators). `group_attend` reads each cache line
//! once for all query heads of a KV group, with an online softmax; the two-pass `group_scores` + `group_weighted_sum` serve other head sizes.
#![allow(unsafe_code)] // intrinsics; every pointer is derived from a slice whose length is asserted
#![cfg(target_arch = "x86_64")]
#![allow(clippy::needless_range_loop)] // register-block loops index several arrays by lane

use super::common::Segs;
use std::arch::x86_64::*;

/// Sum of each of 8 vectors, in order, as one vector.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum8(a: [__m256; 8]) -> __m256 {
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

/// Elements i..i + 8 of a cache stored as f16 (H) or f32, as f32 lanes.
///
/// # Safety
/// The 8 elements must lie inside the allocation `base` points into.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const H: bool>(base: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees the 8 elements are in bounds.
    unsafe {
        if H {
            _mm256_cvtph_ps(_mm_loadu_si128(base.add(2 * i).cast()))
        } else {
            _mm256_loadu_ps(base.add(4 * i).cast())
        }
    }
}

/// Scores of slots t..t + n (n <= 8/R) for the R heads of q (R, d) against keys at `kp`
/// (`klen` elements, f16 when H): one horizontal-add tree, lane r * (8/R) + j =
/// scale · q_r·k_(t+j); lanes past n hold 0. Each key chunk is loaded once for all R heads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tree_scores<const R: usize, const H: bool>(
    q: &[f32],
    (kp, klen): (*const u8, usize),
    t: usize,
    n: usize,
    scale: f32,
) -> [f32; 8] {
    let d = q.len() / R;
    let g = 8 / R;
    assert!(n <= g && d.is_multiple_of(8) && klen >= (t + n) * d);
    let qp = q.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 8]; // [r * g + j]
    for c in (0..d).step_by(8) {
        let mut qs = [_mm256_setzero_ps(); R];
        for (r, qv) in qs.iter_mut().enumerate() {
            // SAFETY: r * d + c + 8 <= R * d = q.len().
            *qv = unsafe { _mm256_loadu_ps(qp.add(r * d + c)) };
        }
        for j in 0..n {
            // SAFETY: (t + j) * d + c + 8 <= (t + n) * d <= klen.
            let kc = unsafe { load8::<H>(kp, (t + j) * d + c) };
            for r in 0..R {
                acc[r * g + j] = _mm256_fmadd_ps(qs[r], kc, acc[r * g + j]);
            }
        }
    }
    let mut s = [0f32; 8];
    // SAFETY: `s` holds 8 floats.
    unsafe {
        _mm256_storeu_ps(
            s.as_mut_ptr(),
            _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)),
        )
    };
    s
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
    let mut t = 0;
    while t < len {
        let n = g.min(len - t);
        // SAFETY: the CPU has AVX2, FMA and F16C (`available`).
        let lanes =
            unsafe { tree_scores::<R, false>(q, (k.as_ptr().cast(), k.len()), t, n, scale) };
        for r in 0..R {
            scores[r * len + t..][..n].copy_from_slice(&lanes[r * g..][..n]);
        }
        t += n;
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

/// e^x for 8 lanes (the Cephes polynomial of `rows::exp`; 0 below -87.3).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.5)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let (c1, c2) = super::common::EXP_LN2;
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c1), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(c2), r);
    let poly = super::common::EXP_POLY;
    let mut p = _mm256_set1_ps(poly[0]);
    for c in &poly[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
        _mm256_set1_ps(1.0),
    );
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    let dead = _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(-87.3));
    _mm256_andnot_ps(dead, y)
}

/// One pass over a KV group's cache for its R query heads (q (R, D)), flash-decoding style:
/// scores of G = 8/R slots per horizontal-add tree, a running max and sum per head (the
/// accumulators rescaled when the max grows), and e^(s - max)-weighted V added while the slot's
/// values are in cache. K and V stream together once; no score buffer, no separate softmax
/// passes. `masked` lists slots to skip (ascending); out (R, D) gets the normalised result
/// (0 for a head with no unmasked slot).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_attend<const R: usize, const D: usize, const H: bool>(
    q: &[f32],
    kv: Segs,
    len: usize,
    masked: &[u32],
    out: &mut [f32],
) {
    assert!(8usize.is_multiple_of(R) && D.is_multiple_of(8) && D <= 128);
    assert!(q.len() == R * D && out.len() == R * D);
    let g = 8 / R;
    let seg_len = kv.seg_len();
    let scale = 1.0 / (D as f32).sqrt();
    let mut acc = [[_mm256_setzero_ps(); 16]; R]; // [head][D / 8 vectors]
    let (mut m, mut z) = ([f32::NEG_INFINITY; R], [0f32; R]);
    let mut mi = 0; // cursor into `masked`
    let mut t = 0;
    while t < len {
        // The block's segment and its first slot o there (segments hold a multiple of 8 slots,
        // so a block never crosses one).
        let (si, o) = if seg_len == usize::MAX {
            (0, t)
        } else {
            (t / seg_len, t % seg_len)
        };
        let n = g.min(len - t).min(seg_len - o); // slots in this block
        let (ks, vs) = kv.seg(si);
        let ((kp, kn, kh), (vp, vn, vh)) = (ks.raw(), vs.raw());
        assert!(
            kh == H && vh == H,
            "group_attend (AVX2): cache element type mismatch"
        );
        assert!(kn >= (o + n) * D && vn >= (o + n) * D);
        let mut s = tree_scores::<R, H>(q, (kp, kn), o, n, scale);
        for j in n..g {
            for r in 0..R {
                s[r * g + j] = f32::NEG_INFINITY; // past the end
            }
        }
        while mi < masked.len() && (masked[mi] as usize) < t + n {
            let j = masked[mi] as usize - t;
            for r in 0..R {
                s[r * g + j] = f32::NEG_INFINITY;
            }
            mi += 1;
        }
        let mut mv = [0f32; 8];
        for r in 0..R {
            let bm = s[r * g..][..g]
                .iter()
                .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
            if bm > m[r] {
                // The running max grows: rescale what has been accumulated (e^-inf = 0 at first).
                let c = super::common::exp(m[r] - bm);
                let cv = _mm256_set1_ps(c);
                for a in acc[r].iter_mut().take(D / 8) {
                    *a = _mm256_mul_ps(*a, cv);
                }
                z[r] *= c;
                m[r] = bm;
            }
            mv[r * g..][..g].fill(m[r]);
        }
        // SAFETY: `s` and `mv` hold 8 floats each.
        let pv = unsafe {
            exp8(_mm256_sub_ps(
                _mm256_loadu_ps(s.as_ptr()),
                _mm256_loadu_ps(mv.as_ptr()),
            ))
        };
        let mut p = [0f32; 8];
        // SAFETY: `p` holds 8 floats.
        unsafe { _mm256_storeu_ps(p.as_mut_ptr(), pv) };
        for r in 0..R {
            if m[r] == f32::NEG_INFINITY {
                continue; // nothing unmasked yet for this head: e^(s - max) is not defined
            }
            z[r] += p[r * g..][..n].iter().sum::<f32>();
        }
        for j in 0..n {
            let mut pj = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let w = if m[r] == f32::NEG_INFINITY {
                    0.0
                } else {
                    p[r * g + j]
                };
                pj[r] = _mm256_set1_ps(w);
            }
            for i in 0..D / 8 {
                // SAFETY: (o + j) * D + 8i + 8 <= (o + n) * D <= vn.
                let vc = unsafe { load8::<H>(vp, (o + j) * D + 8 * i) };
                for r in 0..R {
                    acc[r][i] = _mm256_fmadd_ps(pj[r], vc, acc[r][i]);
                }
            }
        }
        t += n;
    }
    for r in 0..R {
        let inv = _mm256_set1_ps(if z[r] > 0.0 { 1.0 / z[r] } else { 0.0 });
        for i in 0..D / 8 {
            // SAFETY: r * D + 8i + 8 <= R * D = out.len().
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr().add(r * D + 8 * i),
                    _mm256_mul_ps(acc[r][i], inv),
                )
            };
        }
    }
}

/// Whether the AVX2 kernels can run here.
pub(crate) fn available() -> bool {
    super::features().avx2_fma
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The one-pass kernel over an f16 cache equals the f32 kernel over the same (rounded)
    /// values, bit for bit: conversion is exact, the sums run alike.
    #[test]
    fn group_attend_reads_an_f16_cache_like_its_f32_values() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        use super::super::common::Kv;
        use half::f16;
        const D: usize = 64;
        for len in [1usize, 7, 40, 130] {
            let q: Vec<f32> = (0..2 * D).map(|i| (i as f32 * 0.37).sin()).collect();
            let kh: Vec<f16> = (0..len * D)
                .map(|i| f16::from_f32((i as f32 * 0.11).cos()))
                .collect();
            let vh: Vec<f16> = (0..len * D)
                .map(|i| f16::from_f32((i as f32 * 0.07).sin()))
                .collect();
            let (kf, vf): (Vec<f32>, Vec<f32>) = (
                kh.iter().map(|x| x.to_f32()).collect(),
                vh.iter().map(|x| x.to_f32()).collect(),
            );
            let masked = [0u32, 3];
            let (mut a, mut b) = (vec![f32::NAN; 2 * D], vec![f32::NAN; 2 * D]);
            // SAFETY: features checked above.
            unsafe {
                group_attend::<2, D, true>(
                    &q,
                    Segs::Flat {
                        k: Kv::F16(&kh),
                        v: Kv::F16(&vh),
                    },
                    len,
                    &masked,
                    &mut a,
                );
                group_attend::<2, D, false>(
                    &q,
                    Segs::Flat {
                        k: Kv::F32(&kf),
                        v: Kv::F32(&vf),
                    },
                    len,
                    &masked,
                    &mut b,
                );
            }
            assert_eq!(a, b, "len {len}");
        }
    }
}
