//! The `_rows` entry points of kernels/flash_fa2.cu and flash_fa2_bwd.cu (the written layer
//! backward's: q, k, v, out, dO and the gradients in the projections' rows (B, T, H, D), out
//! and the gradients in bf16, delta computed inside the dQ kernel) through the shim against the
//! CPU flash forward and backward, in the order crates/model/src/kernels/flash/cuda.rs runs
//! them: forward, dQ (which writes delta), dK/dV. The shapes cover GQA, padding, packing and
//! both head sizes. Outputs are compared within 2^-7 of max |ref| plus their own bf16 rounding.

use super::flash::{causal, close_lse, left, packed};
use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, FlashDims};
use terse_model::testing::references as r;

/// (B, H, T, D) <-> (B, T, H, D): `to_tokens` picks the direction.
fn relayout(x: &[f32], (b, h, t, d): (usize, usize, usize, usize), to_tokens: bool) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let heads = ((bi * h + hi) * t + ti) * d;
                let tokens = ((bi * t + ti) * h + hi) * d;
                let (src, dst) = if to_tokens {
                    (heads, tokens)
                } else {
                    (tokens, heads)
                };
                y[dst..dst + d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    y
}

/// The tolerance for a bf16 output: the kernels' own (`bf16_tol`) plus one bf16 rounding of
/// the largest value.
fn tol16(reference: &[f32]) -> f32 {
    bf16_tol(reference) * 1.5
}

fn check(name: &str, (b, t, hq, hkv, d): (usize, usize, usize, usize, usize), starts: &[u32]) {
    assert_eq!(starts.len(), b * t, "{name}: starts");
    let dm = FlashDims::new(b, hq, hkv, t, d);
    let (sq, sk) = ((b, hq, t, d), (b, hkv, t, d));
    // The reference in attention's layout on bf16 values, the kernels' inputs as rows.
    let (q, k, v) = (
        to_bf16(&rand_vec(b * hq * t * d, 61)).1,
        to_bf16(&rand_vec(b * hkv * t * d, 62)).1,
        to_bf16(&rand_vec(b * hkv * t * d, 63)).1,
    );
    let dout = to_bf16(&rand_vec(b * hq * t * d, 64)).1;
    let (want_o, want_l) = r::flash_forward(&q, &k, &v, starts, dm);
    let rows16 = |x: &[f32], s| to_bf16(&relayout(x, s, true)).0;
    let (mut qb, mut kb, mut vb, mut gb) = (
        rows16(&q, sq),
        rows16(&k, sk),
        rows16(&v, sk),
        rows16(&dout, sq),
    );
    let mut st = starts.to_vec();
    let (mut o, mut lse) = (vec![0u16; q.len()], vec![f32::NAN; b * hq * t]);
    go(
        &launch::flash_fa2_fwd_rows(dm),
        vec![
            Buf::Bf16(&mut qb),
            Buf::Bf16(&mut kb),
            Buf::Bf16(&mut vb),
            Buf::U32(&mut st),
            Buf::Bf16(&mut o),
            Buf::F32(&mut lse),
        ],
    );
    let got_o = relayout(&from_bf16(&o), sq, false);
    close(&format!("{name} out"), &got_o, &want_o, tol16(&want_o));
    close_lse(&lse, &want_l, 1e-4);

    // The backward from the kernels' own out and lse, as the CUDA path runs it. NaN where a
    // kernel must write: a gradient or delta left unwritten fails the comparison.
    let want_delta: Vec<f32> = got_o
        .chunks(d)
        .zip(dout.chunks(d))
        .map(|(a, g)| a.iter().zip(g).map(|(x, y)| x * y).sum())
        .collect();
    let (wdq, wdk, wdv) = r::flash_backward(&q, &k, &v, &got_o, &lse, &dout, starts, dm);
    let mut delta = vec![f32::NAN; b * hq * t];
    let nan16 = half::bf16::NAN.to_bits();
    let (mut dq, mut dk, mut dv) = (
        vec![nan16; q.len()],
        vec![nan16; k.len()],
        vec![nan16; v.len()],
    );
    go(
        &launch::flash_fa2_bwd_dq_rows(dm),
        vec![
            Buf::Bf16(&mut qb),
            Buf::Bf16(&mut kb),
            Buf::Bf16(&mut vb),
            Buf::U32(&mut st),
            Buf::F32(&mut lse),
            Buf::F32(&mut delta),
            Buf::Bf16(&mut gb),
            Buf::Bf16(&mut dq),
            Buf::Bf16(&mut o),
        ],
    );
    close(&format!("{name} delta"), &delta, &want_delta, 1e-4);
    go(
        &launch::flash_fa2_bwd_dkdv_rows(dm),
        vec![
            Buf::Bf16(&mut qb),
            Buf::Bf16(&mut kb),
            Buf::Bf16(&mut vb),
            Buf::U32(&mut st),
            Buf::F32(&mut lse),
            Buf::F32(&mut delta),
            Buf::Bf16(&mut gb),
            Buf::Bf16(&mut dk),
            Buf::Bf16(&mut dv),
        ],
    );
    let grad = |x: &[u16], s| relayout(&from_bf16(x), s, false);
    close(&format!("{name} dq"), &grad(&dq, sq), &wdq, tol16(&wdq));
    close(&format!("{name} dk"), &grad(&dk, sk), &wdk, tol16(&wdk));
    close(&format!("{name} dv"), &grad(&dv, sk), &wdv, tol16(&wdv));
}

#[test]
fn rows_causal_several_blocks_gqa_2_head_size_128() {
    check("rows causal d128", (1, 200, 4, 2, 128), &causal(1, 200));
}

#[test]
fn rows_left_padding_two_sequences_gqa_4_head_size_64() {
    check(
        "rows left padding d64",
        (2, 70, 4, 1, 64),
        &left(70, &[23, 0]),
    );
}

#[test]
fn rows_packed_head_size_128_gqa_2() {
    check(
        "rows packed d128",
        (1, 150, 4, 2, 128),
        &packed(&[63, 64, 1, 22]),
    );
}
