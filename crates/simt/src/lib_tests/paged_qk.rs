//! A paged decode step's query and key (`paged_qk_*`) through the shim against its CPU
//! reference (the plain norm, rotation and cache write one after the other): Qwen3's head
//! norms and Qwen2's none, GQA, a head size whose half is not a whole warp, f32 and bf16
//! (inputs rounded for both sides); the pool's other slots are left as they were.

use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, Storage};
use terse_model::testing::references as r;

#[test]
fn paged_qk_matches_norm_rope_and_write() {
    let (n, nb, bs, eps) = (3usize, 4usize, 16usize, 1e-6f32);
    // Three rows writing slots in three different blocks, one mid-block.
    let slots = [5u32, 16 + 15, 3 * 16];
    for (hq, hkv, d, norm) in [(16, 8, 128, true), (4, 2, 64, false), (2, 1, 32, true)] {
        let h = d / 2;
        let q = rand_vec(n * hq * d, 31);
        let k: Vec<f32> = rand_vec(n * hkv * d, 32).iter().map(|x| 3.0 * x).collect();
        let w = |seed| -> Vec<f32> { rand_vec(d, seed).iter().map(|x| 1.0 + 0.5 * x).collect() };
        let (qn, kn) = (w(33), w(34));
        let pos = [7.0f32, 100.0, 2049.0];
        let angle = |row: usize, i: usize| pos[row] / 1e6f32.powf(2.0 * i as f32 / d as f32);
        let cos: Vec<f32> = (0..n * h).map(|j| angle(j / h, j % h).cos()).collect();
        let sin: Vec<f32> = (0..n * h).map(|j| angle(j / h, j % h).sin()).collect();
        let pool = rand_vec(nb * hkv * bs * d, 35);
        let norms = norm.then_some((qn.as_slice(), kn.as_slice()));
        let dims = [n, hq, hkv, bs, d];

        let mut want_pool = pool.clone();
        let want_q = r::paged_qk(
            &q,
            &k,
            norms,
            (&cos, &sin),
            &slots,
            &mut want_pool,
            [hq, hkv, bs, d],
            eps,
        );
        let mut slots_i: Vec<i32> = slots.iter().map(|&x| x as i32).collect();
        let (mut qs, mut ks, mut qns, mut kns) = (q.clone(), k.clone(), qn.clone(), kn.clone());
        let (mut cs, mut ss, mut got_pool) = (cos.clone(), sin.clone(), pool.clone());
        let mut got_q = vec![0f32; n * hq * d];
        go(
            &launch::paged_qk(Storage::F32, dims, norm, eps),
            vec![
                Buf::F32(&mut qs),
                Buf::F32(&mut ks),
                Buf::F32(&mut qns),
                Buf::F32(&mut kns),
                Buf::F32(&mut cs),
                Buf::F32(&mut ss),
                Buf::I32(&mut slots_i),
                Buf::F32(&mut got_pool),
                Buf::F32(&mut got_q),
            ],
        );
        close("paged qk q", &got_q, &want_q, 1e-5);
        close("paged qk pool", &got_pool, &want_pool, 1e-5);
        // The written rows moved, every other slot is untouched.
        assert_ne!(want_pool, pool);
        let moved = pool.iter().zip(&got_pool).filter(|(a, b)| a != b).count();
        assert!(moved <= n * hkv * d, "{moved} pool values changed");

        // bf16: the same inputs rounded, on both sides.
        let b = |x: &[f32]| to_bf16(x);
        let ((mut qb, qr), (mut kb, kr)) = (b(&q), b(&k));
        let ((mut qnb, qnr), (mut knb, knr)) = (b(&qn), b(&kn));
        let ((mut cb, cr), (mut sb, sr), (mut pb, pr)) = (b(&cos), b(&sin), b(&pool));
        let norms = norm.then_some((qnr.as_slice(), knr.as_slice()));
        let mut want_pool = pr.clone();
        let want_q = r::paged_qk(
            &qr,
            &kr,
            norms,
            (&cr, &sr),
            &slots,
            &mut want_pool,
            [hq, hkv, bs, d],
            eps,
        );
        let mut got_q = vec![0u16; n * hq * d];
        go(
            &launch::paged_qk(Storage::Bf16, dims, norm, eps),
            vec![
                Buf::Bf16(&mut qb),
                Buf::Bf16(&mut kb),
                Buf::Bf16(&mut qnb),
                Buf::Bf16(&mut knb),
                Buf::Bf16(&mut cb),
                Buf::Bf16(&mut sb),
                Buf::I32(&mut slots_i),
                Buf::Bf16(&mut pb),
                Buf::Bf16(&mut got_q),
            ],
        );
        close(
            "bf16 paged qk q",
            &from_bf16(&got_q),
            &want_q,
            bf16_tol(&want_q),
        );
        close(
            "bf16 paged qk pool",
            &from_bf16(&pb),
            &want_pool,
            bf16_tol(&want_pool),
        );
    }
}
