//! Flash attention's kernels (forward, delta, dQ, dK/dV) through the shim against the CPU
//! flash implementation, on the masks the model makes: causal, left and right padding (fully
//! masked rows), packed sequences with a boundary inside a 64-key tile and one on its edge, a
//! length-1 sequence, T = 1, GQA 1-8, head sizes 64 and 128.

use super::{bf16_tol, close, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, FlashDims, Storage};
use terse_model::testing::references as r;

/// Per (row, query position), the first key it attends.
pub(super) fn causal(b: usize, t: usize) -> Vec<u32> {
    vec![0; b * t]
}

/// Left padding of `pad[r]` tokens: padding rows attend nothing (start i + 1).
pub(super) fn left(t: usize, pad: &[usize]) -> Vec<u32> {
    pad.iter()
        .flat_map(|&p| (0..t).map(move |i| if i < p { i as u32 + 1 } else { p as u32 }))
        .collect()
}

/// Right padding after `len[r]` real tokens.
pub(super) fn right(t: usize, len: &[usize]) -> Vec<u32> {
    len.iter()
        .flat_map(|&l| (0..t).map(move |i| if i < l { 0 } else { i as u32 + 1 }))
        .collect()
}

/// One row of sequences of `lens`, packed: each row starts at its sequence's first token.
pub(super) fn packed(lens: &[usize]) -> Vec<u32> {
    let mut out = vec![];
    let mut at = 0u32;
    for &l in lens {
        out.extend(std::iter::repeat_n(at, l));
        at += l as u32;
    }
    out
}

/// lse may be −∞ (rows with no key): those must match exactly, the rest within `tol`.
#[track_caller]
pub(super) fn close_lse(got: &[f32], want: &[f32], tol: f32) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= tol
        } else {
            g == w
        };
        assert!(ok, "lse row {i}: {g} vs {w}");
    }
}

/// The kernels' outputs for one storage type: (out, lse, dq, dk, dv).
type Grads = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// The kernels a variant launches: the scalar ones of flash_attn.cu, or the tensor-core ones of
/// flash_tc.cu (bf16, head size 64 or 128).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernels {
    Scalar,
    TensorCore,
}

fn run_flash(
    s: Storage,
    which: Kernels,
    dm: FlashDims,
    qkv: [&[f32]; 3],
    starts: &[u32],
    dout: &[f32],
) -> Grads {
    let tc = which == Kernels::TensorCore;
    let (q, k, v) = (qkv[0], qkv[1], qkv[2]);
    let rows = dm.b * dm.hq * dm.t;
    let (mut out, mut lse) = (vec![0f32; rows * dm.d], vec![0f32; rows]);
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; q.len()],
        vec![0f32; k.len()],
        vec![0f32; v.len()],
    );
    let mut st = starts.to_vec();
    let mut delta = vec![0f32; rows];
    let mut g = dout.to_vec();
    // The same inputs as the storage type holds them: f32, or bf16 bits.
    let (mut qb, mut kb, mut vb) = (to_bf16(q).0, to_bf16(k).0, to_bf16(v).0);
    let (mut qf, mut kf, mut vf) = (q.to_vec(), k.to_vec(), v.to_vec());
    macro_rules! qkv {
        () => {
            match s {
                Storage::F32 => [Buf::F32(&mut qf), Buf::F32(&mut kf), Buf::F32(&mut vf)],
                Storage::Bf16 => [Buf::Bf16(&mut qb), Buf::Bf16(&mut kb), Buf::Bf16(&mut vb)],
            }
        };
    }
    let [a, b, c] = qkv!();
    go(
        &if tc {
            launch::flash_tc_fwd(dm)
        } else {
            launch::flash_fwd(s, dm)
        },
        vec![
            a,
            b,
            c,
            Buf::U32(&mut st),
            Buf::F32(&mut out),
            Buf::F32(&mut lse),
        ],
    );
    go(
        &launch::flash_delta(rows, dm.d),
        vec![
            Buf::F32(&mut out.clone()),
            Buf::F32(&mut g),
            Buf::F32(&mut delta),
        ],
    );
    let [a, b, c] = qkv!();
    go(
        &if tc {
            launch::flash_tc_bwd_dq(dm)
        } else {
            launch::flash_bwd_dq(s, dm)
        },
        vec![
            a,
            b,
            c,
            Buf::U32(&mut st),
            Buf::F32(&mut lse),
            Buf::F32(&mut delta),
            Buf::F32(&mut g),
            Buf::F32(&mut dq),
        ],
    );
    let [a, b, c] = qkv!();
    go(
        &if tc {
            launch::flash_tc_bwd_dkdv(dm)
        } else {
            launch::flash_bwd_dkdv(s, dm)
        },
        vec![
            a,
            b,
            c,
            Buf::U32(&mut st),
            Buf::F32(&mut lse),
            Buf::F32(&mut delta),
            Buf::F32(&mut g),
            Buf::F32(&mut dk),
            Buf::F32(&mut dv),
        ],
    );
    (out, lse, dq, dk, dv)
}

/// Forward and backward of one shape in f32 and bf16 against the CPU flash attention.
fn check(name: &str, (b, t, hq, hkv, d): (usize, usize, usize, usize, usize), starts: &[u32]) {
    assert_eq!(starts.len(), b * t, "{name}: starts");
    let dm = FlashDims::new(b, hq, hkv, t, d);
    let (q, k, v) = (
        rand_vec(b * hq * t * d, 31),
        rand_vec(b * hkv * t * d, 32),
        rand_vec(b * hkv * t * d, 33),
    );
    let dout = rand_vec(b * hq * t * d, 34);
    let mut variants = vec![
        (Storage::F32, Kernels::Scalar),
        (Storage::Bf16, Kernels::Scalar),
    ];
    if launch::flash_tc_covers(Storage::Bf16, d) {
        variants.push((Storage::Bf16, Kernels::TensorCore));
    }
    for (s, which) in variants {
        let (qr, kr, vr) = match s {
            Storage::F32 => (q.clone(), k.clone(), v.clone()),
            Storage::Bf16 => (to_bf16(&q).1, to_bf16(&k).1, to_bf16(&v).1),
        };
        let (want_o, want_l) = r::flash_forward(&qr, &kr, &vr, starts, dm);
        let (wdq, wdk, wdv) = r::flash_backward(&qr, &kr, &vr, &want_o, &want_l, &dout, starts, dm);
        let (o, l, dq, dk, dv) = run_flash(s, which, dm, [&q, &k, &v], starts, &dout);
        let tol = |w: &[f32]| match s {
            Storage::F32 => 1e-4,
            Storage::Bf16 => bf16_tol(w),
        };
        let what = |x: &str| format!("{name} {s:?} {which:?} {x}");
        close(&what("out"), &o, &want_o, tol(&want_o));
        close_lse(&l, &want_l, 1e-4);
        close(&what("dq"), &dq, &wdq, tol(&wdq));
        close(&what("dk"), &dk, &wdk, tol(&wdk));
        close(&what("dv"), &dv, &wdv, tol(&wdv));
    }
}

#[test]
fn causal_gqa_1_head_size_64() {
    // T = 33: the last row (32) starts a key tile of its own.
    check("causal", (1, 33, 2, 2, 64), &causal(1, 33));
}

#[test]
fn left_padding_with_fully_masked_rows_gqa_4_head_size_128() {
    check("left padding", (2, 9, 4, 1, 128), &left(9, &[3, 0]));
}

#[test]
fn right_padding_gqa_8() {
    check("right padding", (2, 9, 8, 1, 64), &right(9, &[5, 9]));
}

#[test]
fn packed_boundaries_inside_and_on_a_64_key_tile_edge_and_a_length_1_sequence() {
    // Sequences of 37, 27 (ends exactly at key 64, a tile edge), 1, and 5 tokens.
    check("packed", (1, 70, 2, 1, 64), &packed(&[37, 27, 1, 5]));
}

#[test]
fn one_token_gqa_2_head_size_128() {
    check("t = 1", (1, 1, 2, 1, 128), &causal(1, 1));
}

#[test]
fn causal_several_row_blocks_and_key_tiles_gqa_2_head_size_128() {
    // T = 130: three 64-row blocks and five 32-key tiles, so later tiles bring new row maxima
    // and the whole of O (all 8 fragments at D = 128) must be rescaled.
    check("causal d128", (1, 130, 2, 1, 128), &causal(1, 130));
}

#[test]
fn packed_rows_starting_at_a_tile_s_and_a_block_s_last_key_head_size_128() {
    // Sequences start at keys 0, 31 (the last key of the first 32-key tile) and 63 (the last
    // key of the first 64-row block).
    check("packed d128", (1, 103, 2, 1, 128), &packed(&[31, 32, 40]));
}
