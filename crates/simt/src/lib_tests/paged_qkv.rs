//! A paged decode step's query, key and value (`paged_qkv_*`) through the shim against its CPU
//! reference (the plain norm, rotation and cache writes one after the other): Qwen3's head
//! norms and Qwen2's none, GQA, a head size whose half is not a whole warp, f32 and bf16
//! (inputs rounded for both sides); the pools' other slots are left as they were.

use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, Storage};
use terse_model::testing::references as r;

#[test]
fn paged_qkv_matches_norm_rope_and_writes() {
    let (n, nb, bs, eps) = (3usize, 4usize, 16usize, 1e-6f32);
    // Three rows writing slots in three different blocks, one mid-block.
    let slots = [5u32, 16 + 15, 3 * 16];
    for (hq, hkv, d, norm) in [(16, 8, 128, true), (4, 2, 64, false), (2, 1, 32, true)] {
        let h = d / 2;
        let qkv: Vec<f32> = rand_vec(n * (hq + 2 * hkv) * d, 31)
            .iter()
            .map(|x| 3.0 * x)
            .collect();
        let w = |seed| -> Vec<f32> { rand_vec(d, seed).iter().map(|x| 1.0 + 0.5 * x).collect() };
        let (qn, kn) = (w(33), w(34));
        let pos = [7.0f32, 100.0, 2049.0];
        let angle = |row: usize, i: usize| pos[row] / 1e6f32.powf(2.0 * i as f32 / d as f32);
        let cos: Vec<f32> = (0..n * h).map(|j| angle(j / h, j % h).cos()).collect();
        let sin: Vec<f32> = (0..n * h).map(|j| angle(j / h, j % h).sin()).collect();
        let (kpool, vpool) = (
            rand_vec(nb * hkv * bs * d, 35),
            rand_vec(nb * hkv * bs * d, 36),
        );
        let norms = norm.then_some((qn.as_slice(), kn.as_slice()));
        let dims = [n, hq, hkv, bs, d];

        let (mut want_k, mut want_v) = (kpool.clone(), vpool.clone());
        let want_q = r::paged_qkv(
            &qkv,
            norms,
            (&cos, &sin),
            &slots,
            (&mut want_k, &mut want_v),
            [hq, hkv, bs, d],
            eps,
        );
        let mut slots_i: Vec<i32> = slots.iter().map(|&x| x as i32).collect();
        let (mut xs, mut qns, mut kns) = (qkv.clone(), qn.clone(), kn.clone());
        let (mut cs, mut ss) = (cos.clone(), sin.clone());
        let (mut got_k, mut got_v) = (kpool.clone(), vpool.clone());
        let mut got_q = vec![0f32; n * hq * d];
        go(
            &launch::paged_qkv(Storage::F32, dims, norm, eps),
            vec![
                Buf::F32(&mut xs),
                Buf::F32(&mut qns),
                Buf::F32(&mut kns),
                Buf::F32(&mut cs),
                Buf::F32(&mut ss),
                Buf::I32(&mut slots_i),
                Buf::F32(&mut got_k),
                Buf::F32(&mut got_v),
                Buf::F32(&mut got_q),
            ],
        );
        close("paged qkv q", &got_q, &want_q, 1e-5);
        close("paged qkv keys", &got_k, &want_k, 1e-5);
        assert_eq!(got_v, want_v, "paged qkv values: copied as they are");
        // The written rows moved, every other slot is untouched.
        for (what, before, want, got) in [
            ("k", &kpool, &want_k, &got_k),
            ("v", &vpool, &want_v, &got_v),
        ] {
            assert_ne!(want, before, "{what}");
            let moved = before.iter().zip(got).filter(|(a, b)| a != b).count();
            assert!(moved <= n * hkv * d, "{moved} {what} pool values changed");
        }

        // bf16: the same inputs rounded, on both sides.
        let b = |x: &[f32]| to_bf16(x);
        let (mut xb, xr) = b(&qkv);
        let ((mut qnb, qnr), (mut knb, knr)) = (b(&qn), b(&kn));
        let ((mut cb, cr), (mut sb, sr)) = (b(&cos), b(&sin));
        let ((mut kb, kr), (mut vb, vr)) = (b(&kpool), b(&vpool));
        let norms = norm.then_some((qnr.as_slice(), knr.as_slice()));
        let (mut want_k, mut want_v) = (kr.clone(), vr.clone());
        let want_q = r::paged_qkv(
            &xr,
            norms,
            (&cr, &sr),
            &slots,
            (&mut want_k, &mut want_v),
            [hq, hkv, bs, d],
            eps,
        );
        let mut got_q = vec![0u16; n * hq * d];
        go(
            &launch::paged_qkv(Storage::Bf16, dims, norm, eps),
            vec![
                Buf::Bf16(&mut xb),
                Buf::Bf16(&mut qnb),
                Buf::Bf16(&mut knb),
                Buf::Bf16(&mut cb),
                Buf::Bf16(&mut sb),
                Buf::I32(&mut slots_i),
                Buf::Bf16(&mut kb),
                Buf::Bf16(&mut vb),
                Buf::Bf16(&mut got_q),
            ],
        );
        let tol = |x: &[f32]| bf16_tol(x);
        close(
            "bf16 paged qkv q",
            &from_bf16(&got_q),
            &want_q,
            tol(&want_q),
        );
        close(
            "bf16 paged qkv keys",
            &from_bf16(&kb),
            &want_k,
            tol(&want_k),
        );
        assert_eq!(from_bf16(&vb), want_v, "bf16 paged qkv values");
    }
}
