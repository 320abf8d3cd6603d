//! kernels/flash_fa2.cu's forward (FlashAttention-2's structure: mma.sync, ldmatrix, the
//! cp.async pipeline, dynamic shared memory) through the shim against the CPU flash forward, on
//! flash.rs's masks: causal over several 64-row blocks and 64-key tiles at D = 128 (so O is
//! rescaled by later tiles, and stage 1 of the pipeline is filled and reused), left and right
//! padding, packed rows starting at a tile's last key, GQA 1-8, head sizes 64 and 128. out is
//! compared within 2^-7 of max |ref| (bf16 inputs, bf16 P), lse within 1e-4.

use super::flash::{causal, close_lse, left, packed, right};
use super::{bf16_tol, close, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, FlashDims};
use terse_model::testing::references as r;

/// The forward of one shape (B, T, Hq, Hkv, D) on the shim against the reference.
fn check(name: &str, (b, t, hq, hkv, d): (usize, usize, usize, usize, usize), starts: &[u32]) {
    assert_eq!(starts.len(), b * t, "{name}: starts");
    let dm = FlashDims::new(b, hq, hkv, t, d);
    let (q, k, v) = (
        to_bf16(&rand_vec(b * hq * t * d, 41)),
        to_bf16(&rand_vec(b * hkv * t * d, 42)),
        to_bf16(&rand_vec(b * hkv * t * d, 43)),
    );
    let (want_o, want_l) = r::flash_forward(&q.1, &k.1, &v.1, starts, dm);
    let rows = b * hq * t;
    let (mut o, mut l) = (vec![0f32; rows * d], vec![0f32; rows]);
    let (mut qb, mut kb, mut vb, mut st) = (q.0, k.0, v.0, starts.to_vec());
    go(
        &launch::flash_fa2_fwd(dm),
        vec![
            Buf::Bf16(&mut qb),
            Buf::Bf16(&mut kb),
            Buf::Bf16(&mut vb),
            Buf::U32(&mut st),
            Buf::F32(&mut o),
            Buf::F32(&mut l),
        ],
    );
    close(&format!("{name} fa2 out"), &o, &want_o, bf16_tol(&want_o));
    close_lse(&l, &want_l, 1e-4);
}

#[test]
fn causal_several_row_blocks_and_key_tiles_gqa_2_head_size_128() {
    // T = 200: four 64-row blocks (the last one partial) and up to four 64-key tiles, so both
    // pipeline stages are filled and refilled and later tiles bring new row maxima.
    check("causal d128", (1, 200, 4, 2, 128), &causal(1, 200));
}

#[test]
fn causal_small_multi_tile_gqa_1_head_size_64() {
    // T = 70: two row blocks, the second walking two key tiles (the TSan subset's shape).
    check("causal d64", (1, 70, 1, 1, 64), &causal(1, 70));
}

#[test]
fn left_padding_with_fully_masked_rows_gqa_4_head_size_128() {
    // The first row block of batch row 0 starts with 67 padding rows: the block's first row
    // attends nothing, a whole warp's rows attend nothing.
    check("left padding", (2, 130, 4, 1, 128), &left(130, &[67, 0]));
}

#[test]
fn right_padding_gqa_8_head_size_64() {
    check("right padding", (2, 80, 8, 1, 64), &right(80, &[5, 80]));
}

#[test]
fn packed_rows_starting_at_a_tile_s_last_key_head_size_128() {
    // Sequences start at keys 0, 63 (the last key of the first 64-key tile), 127 (the last of
    // the second) and 128 (a tile's first), with one of length 1.
    check(
        "packed d128",
        (1, 150, 2, 1, 128),
        &packed(&[63, 64, 1, 22]),
    );
}

#[test]
fn packed_boundary_inside_a_warp_after_whole_key_tiles_head_size_64() {
    // A sequence of 136 then one of 64: warp rows 128..143 straddle the boundary at 136, and
    // keys 0..127 are whole tiles below the warp's first row. Rows 136.. must not see them, so
    // the unmasked fast path must take the warp's last start (136), not its first (0).
    check("packed mid-warp", (1, 200, 2, 1, 64), &packed(&[136, 64]));
}

#[test]
fn packed_head_size_64_gqa_2() {
    check("packed d64", (1, 100, 4, 2, 64), &packed(&[63, 1, 36]));
}

#[test]
fn one_token_and_a_partial_block_head_size_128() {
    check("t = 1", (1, 1, 2, 1, 128), &causal(1, 1));
}

/// The kernel's tile is the launch's: the shared-memory size the launch gives is computed from
/// launch::FLASH_FA2_KEYS, which must be kernels/fa2.cuh's FA2_KEYS.
#[test]
fn the_launch_sizes_shared_memory_from_the_kernel_s_tile() {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/fa2.cuh"),
    )
    .expect("kernels/fa2.cuh");
    let keys = src
        .lines()
        .find_map(|l| l.strip_prefix("#define FA2_KEYS "))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .expect("#define FA2_KEYS in fa2.cuh");
    assert_eq!(keys, launch::FLASH_FA2_KEYS);
    assert_eq!(launch::flash_fa2_shared(128), 65_536);
    assert_eq!(launch::flash_fa2_shared(64), 32_768);
}
