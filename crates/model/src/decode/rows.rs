//! Row-local kernels of the CPU decode step (`decode::cpu`): RMSNorm, RoPE, SiLU·up, a
//! vectorisable exp and the single-query attention of one row over its KV-cache block.
//!
//! Written as plain loops over fixed-width lane arrays so LLVM vectorises them, and run through
//! `simd_dispatch!`, which compiles a caller for AVX2+FMA when the CPU has it (the crate itself
//! is built for the x86-64 baseline, so without it these loops would be SSE2).
#![allow(unsafe_code)] // the target-feature trampoline in `simd_dispatch!`

use super::common::{exp, Kv, PagedGroup, PoolPtr, Segs};

const LANES: usize = 8;

/// Defines `fn $name(args)` that runs `$body(args)` compiled for AVX2 and FMA when the CPU
/// has them, and as built otherwise. `$body` and everything it calls in the hot loops must be
/// `#[inline(always)]`: only code inlined into the target-feature function gets the wide
/// registers (a closure would not be).
macro_rules! simd_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) => $body:path) => {
        $(#[$m])*
        #[allow(unsafe_code)] // the target-feature call below, guarded by a feature check
        $vis fn $name($($a: $t),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
                fn wider($($a: $t),*) {
                    $body($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn wide($($a: $t),*) {
                    $body($($a),*)
                }
                let cpu = $crate::decode::features();
                if cpu.avx512 && cpu.avx2_fma {
                    // SAFETY: the CPU has the features `wider` is compiled for (checked above).
                    return unsafe { wider($($a),*) };
                }
                if cpu.avx2_fma {
                    // SAFETY: the CPU has the features `wide` is compiled for (checked above).
                    return unsafe { wide($($a),*) };
                }
            }
            $body($($a),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// Σ a·b with LANES independent partial sums (a strict left-to-right sum does not vectorise).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// In place: each `w.len()`-wide chunk of x becomes RMSNorm(chunk) * w.
#[inline(always)]
pub(crate) fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    let cols = w.len();
    for row in x.chunks_exact_mut(cols) {
        let r = 1.0 / (dot(row, row) / cols as f32 + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * r * g;
        }
    }
}

/// In place: b is added to each `b.len()`-wide chunk of x (Qwen2's q/k/v biases).
#[inline(always)]
pub(crate) fn add_bias_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(v, c)| *v += c);
    }
}

/// Rotate-half RoPE in place on the (heads, d) chunks of one row, tables (cos, sin) of d/2.
#[inline(always)]
pub(crate) fn rope_row(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in x.chunks_exact_mut(2 * half) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] - b * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

/// gate <- silu(gate) * up, elementwise.
#[inline(always)]
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

/// One row's view of the cache for `attend_row`.
#[derive(Clone, Copy)]
pub(crate) struct CacheRow<'a> {
    pub kv: RowKv<'a>,
    /// The slots below `len` that hold no token (padding), ascending.
    pub masked: &'a [u32],
    /// Slots in use.
    pub len: usize,
    pub hkv: usize,
}

/// Where a row's keys and values live.
#[derive(Clone, Copy)]
pub(crate) enum RowKv<'a> {
    /// The preallocated cache: (Hkv, C, D) keys and values of this row.
    Flat { k: Kv<'a>, v: Kv<'a>, cap: usize },
    /// A paged pool (NB, Hkv, block, D) and the row's block table.
    Paged {
        pool: PoolPtr,
        blocks: &'a [u32],
        block: usize,
    },
}

impl<'a> CacheRow<'a> {
    /// KV group g's slots (head size d).
    #[inline(always)]
    pub(crate) fn group(&self, g: usize, d: usize) -> Segs<'a> {
        match self.kv {
            RowKv::Flat { k, v, cap } => Segs::Flat {
                k: k.slice(g * cap * d, self.len * d),
                v: v.slice(g * cap * d, self.len * d),
            },
            RowKv::Paged {
                pool,
                blocks,
                block,
            } => Segs::Paged(PagedGroup {
                pool,
                blocks,
                block,
                stride: self.hkv * block * d,
                off: g * block * d,
                d,
            }),
        }
    }
}

/// The one-pass attention of one KV group, `avx512`'s kernel when `wider` else
/// `avx2`'s, for the shapes they are compiled for (R = `rep` in 1, 2, 4; D =
/// out.len() / rep in 32, 64, 128); false, doing nothing, for any other.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and AVX-512F/DQ when `wider`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn group_attend_shape(
    wider: bool,
    rep: usize,
    q: &[f32],
    kv: Segs,
    len: usize,
    masked: &[u32],
    out: &mut [f32],
) -> bool {
    use super::{avx2 as decode_avx2, avx512 as decode_avx512};
    macro_rules! shapes {
        ($(($r:literal, $d:literal)),*) => {
            match (rep, out.len() / rep.max(1), kv.f16()) {
                // SAFETY (all arms): the caller guarantees the features of the kernel it asks
                // for.
                $(($r, $d, false) if wider => unsafe {
                    decode_avx512::group_attend::<$r, $d, false>(q, kv, len, masked, out)
                },)*
                $(($r, $d, true) if wider => unsafe {
                    decode_avx512::group_attend::<$r, $d, true>(q, kv, len, masked, out)
                },)*
                $(($r, $d, false) => unsafe {
                    decode_avx2::group_attend::<$r, $d, false>(q, kv, len, masked, out)
                },)*
                $(($r, $d, true) => unsafe {
                    decode_avx2::group_attend::<$r, $d, true>(q, kv, len, masked, out)
                },)*
                _ => return false,
            }
        };
    }
    shapes!(
        (1, 32),
        (2, 32),
        (4, 32),
        (1, 64),
        (2, 64),
        (4, 64),
        (1, 128),
        (2, 128),
        (4, 128)
    );
    true
}

/// Single-query attention of one row: q (Hq, D) -> out (Hq, D) over the unmasked slots among
/// the first `len`; a head with no such slot gives 0. `scores` is scratch. With AVX-512 (else
/// AVX2) and a common shape, `avx512::group_attend` (`avx2::group_attend`) does
/// each KV group in one pass over the cache;
/// otherwise (and in `portable` mode, which tests use) two passes: the scores of the group's
/// query heads, an exact max-subtracted softmax, then the weighted sum of V.
#[inline(always)]
pub(crate) fn attend_row(
    q: &[f32],
    c: &CacheRow,
    d: usize,
    out: &mut [f32],
    scores: &mut Vec<f32>,
    portable: bool,
) {
    let rep = q.len() / d / c.hkv;
    let len = c.len;
    // A prefill's earlier tokens see fewer slots than the row's padding list covers.
    let c = &CacheRow {
        masked: &c.masked[..c.masked.partition_point(|&t| (t as usize) < len)],
        ..*c
    };
    let scale = 1.0 / (d as f32).sqrt();
    #[cfg(target_arch = "x86_64")]
    let fast =
        !portable && d.is_multiple_of(8) && matches!(rep, 1 | 2 | 4) && super::avx2::available();
    #[cfg(target_arch = "x86_64")]
    let wider = fast && d.is_multiple_of(16) && super::avx512::available();
    #[cfg(not(target_arch = "x86_64"))]
    let fast = {
        let _ = portable;
        false
    };
    scores.resize(rep * len + rep, 0.0);
    out.fill(0.0);
    let (mut kbuf, mut vbuf) = (vec![], vec![]);
    for g in 0..c.hkv {
        let kv = c.group(g, d);
        let qg = &q[g * rep * d..][..rep * d];
        let og = &mut out[g * rep * d..][..rep * d];
        // SAFETY: `fast` implies the CPU has AVX2 and FMA, `wider` AVX-512F/DQ besides.
        #[cfg(target_arch = "x86_64")]
        if fast && unsafe { group_attend_shape(wider, rep, qg, kv, len, c.masked, og) } {
            continue;
        }
        // A cache reaches here when no one-pass kernel serves it (another shape, or the
        // portable mode): gather (and convert) the group.
        let (kb, vb) = kv.gather_f32(len, d, &mut kbuf, &mut vbuf);
        // Two passes: the scores of the group's query heads (rep, len), then the weighted sum.
        let (scores, inv) = scores.split_at_mut(rep * len); // and (rep) normalisers
        if fast {
            // SAFETY: `fast` implies the CPU has AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                use super::avx2::group_scores;
                match rep {
                    1 => group_scores::<1>(qg, kb, scale, scores),
                    2 => group_scores::<2>(qg, kb, scale, scores),
                    _ => group_scores::<4>(qg, kb, scale, scores),
                }
            }
        } else {
            for (qr, s) in qg.chunks_exact(d).zip(scores.chunks_exact_mut(len)) {
                for (sv, kr) in s.iter_mut().zip(kb.chunks_exact(d)) {
                    *sv = dot(qr, kr) * scale;
                }
            }
        }
        // Masked, max-subtracted weights (normalised after the weighted sum, d values per head
        // instead of len); a head with no valid slot gets all 0.
        for (s, iv) in scores.chunks_exact_mut(len).zip(inv.iter_mut()) {
            *iv = softmax_masked(s, c.masked);
        }
        if fast {
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                use super::avx2::group_weighted_sum;
                match rep {
                    1 => group_weighted_sum::<1>(scores, vb, og),
                    2 => group_weighted_sum::<2>(scores, vb, og),
                    _ => group_weighted_sum::<4>(scores, vb, og),
                }
            }
        } else {
            for (o, s) in og.chunks_exact_mut(d).zip(scores.chunks_exact(len)) {
                for (&p, vr) in s.iter().zip(vb.chunks_exact(d)) {
                    o.iter_mut().zip(vr).for_each(|(x, y)| *x += p * y);
                }
            }
        }
        for (o, &iv) in og.chunks_exact_mut(d).zip(inv.iter()) {
            o.iter_mut().for_each(|x| *x *= iv);
        }
    }
}

/// In place: the masked slots to -inf, then e^(x - max) over the row; returns 1 / Σ (0 when
/// every slot is masked, the row then all 0). Padding arrives as a short list of slots (worked
/// out once per step), so no pass over a validity mask runs per head.
#[inline(always)]
fn softmax_masked(s: &mut [f32], masked: &[u32]) -> f32 {
    for &t in masked {
        s[t as usize] = f32::NEG_INFINITY;
    }
    let n = s.len() / LANES * LANES;
    let mut m8 = [f32::NEG_INFINITY; LANES];
    for sc in s[..n].chunks_exact(LANES) {
        for i in 0..LANES {
            m8[i] = if sc[i] > m8[i] { sc[i] } else { m8[i] };
        }
    }
    let m = s[n..]
        .iter()
        .chain(&m8)
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    if m == f32::NEG_INFINITY {
        s.fill(0.0);
        return 0.0;
    }
    let mut z8 = [0f32; LANES];
    for sc in s[..n].chunks_exact_mut(LANES) {
        for i in 0..LANES {
            let e = exp(sc[i] - m);
            sc[i] = e;
            z8[i] += e;
        }
    }
    for x in &mut s[n..] {
        *x = exp(*x - m);
        z8[0] += *x;
    }
    1.0 / z8.iter().sum::<f32>()
}

/// The slots below `len` whose validity flag is 0, appended to `out`.
pub(crate) fn masked_slots(valid: &[u8], len: usize, out: &mut Vec<u32>) {
    out.extend(
        valid[..len]
            .iter()
            .enumerate()
            .filter(|(_, &v)| v == 0)
            .map(|(t, _)| t as u32),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.0437;
            let (a, b) = (exp(x), x.exp());
            if x <= -87.3 {
                // Flushed to 0 where std's result is subnormal.
                assert!(a == 0.0 && b < 2e-38, "exp({x}) = {a}, std {b}");
                continue;
            }
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON * b,
                "exp({x}) = {a}, std {b}"
            );
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(88.0).is_finite());
    }

    #[test]
    fn dot_matches_a_plain_sum() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.125).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-4);
    }

    /// Attention of 2 query heads over 1 KV head against the reference, with AVX2 (when the
    /// CPU has it) and without.
    fn check_attention(d: usize, valid: &[u8], len: usize) {
        let cap = valid.len();
        let q: Vec<f32> = (0..2 * d).map(|i| (i as f32 * 0.3).sin()).collect();
        let k: Vec<f32> = (0..cap * d).map(|i| (i as f32 * 0.7).cos()).collect();
        let v: Vec<f32> = (0..cap * d).map(|i| i as f32 * 0.01 - 1.0).collect();
        let want =
            crate::kernels::references::decode_attention(&q, &k, &v, valid, [2, 1], cap, len, d);
        let mut masked = vec![];
        masked_slots(valid, len, &mut masked);
        let c = CacheRow {
            kv: RowKv::Flat {
                k: Kv::F32(&k),
                v: Kv::F32(&v),
                cap,
            },
            masked: &masked,
            len,
            hkv: 1,
        };
        simd_dispatch!(fn attend(q: &[f32], c: &CacheRow, d: usize, out: &mut [f32]) => attend_one);
        #[inline(always)]
        fn attend_one(q: &[f32], c: &CacheRow, d: usize, out: &mut [f32]) {
            attend_row(q, c, d, out, &mut vec![], false);
        }
        let (mut wide, mut plain) = (vec![f32::NAN; 2 * d], vec![f32::NAN; 2 * d]);
        attend(&q, &c, d, &mut wide);
        attend_row(&q, &c, d, &mut plain, &mut vec![], true);
        for ((a, b), w) in wide.iter().zip(&plain).zip(&want) {
            assert!(
                (a - w).abs() < 1e-5 && (b - w).abs() < 1e-5,
                "d {d}: {a} {b} vs {w}"
            );
        }
    }

    #[test]
    fn attention_matches_reference() {
        check_attention(4, &[1, 1, 0, 1, 1, 0], 5);
        // A head size the AVX2 kernels take, an odd slot count, masked slots.
        check_attention(32, &[1, 0, 1, 1, 1, 1, 1], 7);
        check_attention(32, &[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1], 12);
        // No valid slot: zeros.
        check_attention(32, &[0; 9], 9);
    }
}
