//! kernels/flash_fa2_bwd.cu (FlashAttention-2's backward: the dK/dV pass with K and V in
//! registers and one walk over the queries, the deterministic dQ kernel, and dQ by f32 atomics
//! inside the dK/dV pass) through the shim against the CPU flash backward, after the FA2
//! forward and the delta kernel, as
//! crates/model/src/kernels/flash/cuda.rs runs them. The shapes
//! are flash_fa2.rs's: several 64-key blocks and query steps at D = 128 (so dK and dV gather
//! over many steps and GQA heads, and both pipeline stages are refilled), left and right
//! padding, packed rows starting at a block's last key, GQA 1-8, head sizes 64 and 128.
//! Gradients are compared within 2^-7 of max |ref| (bf16 inputs, dO, P and dS in bf16).

use super::flash::{causal, left, packed, right};
use super::{bf16_tol, close, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, FlashDims};
use terse_model::testing::references as r;

/// dQ's two ways: its own kernel, or f32 atomics in the dK/dV pass.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dq {
    Kernel,
    Atomic,
}

/// The backward of one shape (B, T, Hq, Hkv, D), both ways, against the reference.
fn check(name: &str, (b, t, hq, hkv, d): (usize, usize, usize, usize, usize), starts: &[u32]) {
    assert_eq!(starts.len(), b * t, "{name}: starts");
    let dm = FlashDims::new(b, hq, hkv, t, d);
    let (q, k, v) = (
        to_bf16(&rand_vec(b * hq * t * d, 51)),
        to_bf16(&rand_vec(b * hkv * t * d, 52)),
        to_bf16(&rand_vec(b * hkv * t * d, 53)),
    );
    let dout = rand_vec(b * hq * t * d, 54);
    let rows = b * hq * t;
    // The forward and delta as the CUDA path computes them.
    let (mut out, mut lse) = (vec![0f32; rows * d], vec![0f32; rows]);
    let (mut qb, mut kb, mut vb, mut st) = (q.0.clone(), k.0.clone(), v.0.clone(), starts.to_vec());
    go(
        &launch::flash_fa2_fwd(dm),
        vec![
            Buf::Bf16(&mut qb),
            Buf::Bf16(&mut kb),
            Buf::Bf16(&mut vb),
            Buf::U32(&mut st),
            Buf::F32(&mut out),
            Buf::F32(&mut lse),
        ],
    );
    let mut delta = vec![0f32; rows];
    go(
        &launch::flash_delta(rows, d),
        vec![
            Buf::F32(&mut out.clone()),
            Buf::F32(&mut dout.clone()),
            Buf::F32(&mut delta),
        ],
    );
    let (wdq, wdk, wdv) = r::flash_backward(&q.1, &k.1, &v.1, &out, &lse, &dout, starts, dm);
    for way in [Dq::Kernel, Dq::Atomic] {
        let mut g16 = to_bf16(&dout).0;
        // NaN where a kernel must write: a gradient left unwritten fails the comparison.
        let (mut dq, mut dk, mut dv) = (
            vec![if way == Dq::Atomic { 0.0 } else { f32::NAN }; q.1.len()],
            vec![f32::NAN; k.1.len()],
            vec![f32::NAN; v.1.len()],
        );
        macro_rules! inputs {
            () => {
                vec![
                    Buf::Bf16(&mut qb),
                    Buf::Bf16(&mut kb),
                    Buf::Bf16(&mut vb),
                    Buf::U32(&mut st),
                    Buf::F32(&mut lse),
                    Buf::F32(&mut delta),
                    Buf::Bf16(&mut g16),
                ]
            };
        }
        if way == Dq::Kernel {
            let mut bufs = inputs!();
            bufs.push(Buf::F32(&mut dq));
            go(&launch::flash_fa2_bwd_dq(dm), bufs);
        }
        let mut bufs = inputs!();
        bufs.extend([Buf::F32(&mut dq), Buf::F32(&mut dk), Buf::F32(&mut dv)]);
        go(&launch::flash_fa2_bwd_dkdv(dm, way == Dq::Atomic), bufs);
        let what = |x: &str| format!("{name} {way:?} {x}");
        close(&what("dq"), &dq, &wdq, bf16_tol(&wdq));
        close(&what("dk"), &dk, &wdk, bf16_tol(&wdk));
        close(&what("dv"), &dv, &wdv, bf16_tol(&wdv));
    }
}

#[test]
fn causal_several_key_blocks_and_query_steps_gqa_2_head_size_128() {
    // T = 200: four 64-key blocks (the last partial), each walking up to 13 steps of 16
    // queries for each of its 2 query heads, so both stages are refilled many times.
    check("causal d128", (1, 200, 4, 2, 128), &causal(1, 200));
}

#[test]
fn causal_small_multi_block_gqa_1_head_size_64() {
    // T = 70: two key blocks, the first walking three 32-query steps (the TSan subset's shape).
    check("causal d64", (1, 70, 1, 1, 64), &causal(1, 70));
}

#[test]
fn left_padding_with_fully_masked_rows_gqa_4_head_size_128() {
    check("left padding", (2, 130, 4, 1, 128), &left(130, &[67, 0]));
}

#[test]
fn right_padding_gqa_8_head_size_64() {
    check("right padding", (2, 80, 8, 1, 64), &right(80, &[5, 80]));
}

#[test]
fn packed_rows_starting_at_a_block_s_last_key_head_size_128() {
    // Sequences start at keys 0, 63 (a key block's last key), 127 and 128.
    check(
        "packed d128",
        (1, 150, 2, 1, 128),
        &packed(&[63, 64, 1, 22]),
    );
}

#[test]
fn packed_head_size_64_gqa_2() {
    check("packed d64", (1, 100, 4, 2, 64), &packed(&[63, 1, 36]));
}

#[test]
fn one_token_head_size_128() {
    check("t = 1", (1, 1, 2, 1, 128), &causal(1, 1));
}

/// The launches' query steps and shared-memory sizes are the kernel's: flash_fa2_bwd.cu's
/// `FA2_BWD_QT_D64`/`_D128` against launch::flash_fa2_bwd_queries.
#[test]
fn the_launch_sizes_shared_memory_from_the_kernel_s_query_step() {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/flash_fa2_bwd.cu"),
    )
    .expect("kernels/flash_fa2_bwd.cu");
    for d in [64, 128] {
        let qt = src
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define FA2_BWD_QT_D{d} ")))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or_else(|| panic!("#define FA2_BWD_QT_D{d} in flash_fa2_bwd.cu"));
        assert_eq!(qt, launch::flash_fa2_bwd_queries(d), "d = {d}");
    }
    assert_eq!(launch::flash_fa2_bwd_dkdv_shared(64), 38_656);
    assert_eq!(launch::flash_fa2_bwd_dkdv_shared(128), 52_608);
}
