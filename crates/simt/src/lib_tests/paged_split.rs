//! Flash-decoding through the shim (kernels/paged_attention.cu `paged_decode_split_*` and
//! `paged_decode_merge_*`) against today's kernel (`paged_decode_attention_*`, the reference
//! path) and the f32 CPU reference: GQA 1-8 at head sizes 64 and 128, rows of very different
//! lengths in one batch (empty, one slot, a split boundary either side, capped at max_splits),
//! blocks scattered over the pool; a row's output bit-identical whatever the batch and the
//! blocks per (row, head); the production plan at an 8k context.

use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, SplitPlan, Storage};
use terse_model::testing::references as r;

/// (query heads, KV heads, head size): GQA 1, 2, 4 and 8 at head sizes 64 and 128.
const HEADS: [(usize, usize, usize); 4] = [(2, 2, 64), (4, 2, 128), (4, 1, 64), (8, 1, 128)];

/// Slots per block of the pools.
const BS: usize = 16;

/// A paged step: lengths, each row's blocks (distinct, scattered over the pool by a fixed
/// permutation) padded to `maxb`, and the pool size.
struct Tables {
    lens: Vec<u32>,
    tables: Vec<u32>,
    maxb: usize,
    nb: usize,
}

fn tables(lens: &[u32]) -> Tables {
    let used: Vec<usize> = lens.iter().map(|&l| (l as usize).div_ceil(BS)).collect();
    let maxb = used.iter().copied().max().unwrap_or(1).max(1);
    let nb = used.iter().sum::<usize>() + 1;
    // Block ids in a scattered order (7919 is prime to nb unless nb is a multiple of it).
    let mut next = (0..nb).map(|i| ((i * 7919 + 3) % nb) as u32);
    let mut flat = vec![];
    for &u in &used {
        flat.extend(next.by_ref().take(u));
        flat.extend(std::iter::repeat_n(0, maxb - u));
    }
    Tables {
        lens: lens.to_vec(),
        tables: flat,
        maxb,
        nb,
    }
}

fn i32s(x: &[u32]) -> Vec<i32> {
    x.iter().map(|&v| v as i32).collect()
}

/// The split kernels on the shim; `T` the storage (f32 or bf16 bits) of q, k, v and out.
#[allow(clippy::too_many_arguments)]
fn split<T: Clone + Default>(
    st: Storage,
    wrap: fn(&mut [T]) -> Buf<'_>,
    [q, k, v]: [&[T]; 3],
    t: &Tables,
    [hq, hkv, d]: [usize; 3],
    plan: SplitPlan,
) -> Vec<T> {
    let b = t.lens.len();
    let parts = b * hq * plan.max_splits;
    let (mut qs, mut ks, mut vs) = (q.to_vec(), k.to_vec(), v.to_vec());
    let (mut po, mut pms) = (vec![f32::NAN; parts * d], vec![f32::NAN; parts * 2]);
    let (mut tb, mut ln) = (i32s(&t.tables), i32s(&t.lens));
    go(
        &launch::paged_decode_split(st, [b, hq, hkv, BS, t.maxb, d], plan),
        vec![
            wrap(&mut qs),
            wrap(&mut ks),
            wrap(&mut vs),
            Buf::I32(&mut tb),
            Buf::I32(&mut ln),
            Buf::F32(&mut po),
            Buf::F32(&mut pms),
        ],
    );
    let mut out = vec![T::default(); b * hq * d];
    go(
        &launch::paged_decode_merge(st, [b, hq, d], plan),
        vec![
            Buf::F32(&mut po),
            Buf::F32(&mut pms),
            Buf::I32(&mut ln),
            wrap(&mut out),
        ],
    );
    out
}

/// Today's kernel on the shim.
fn whole<T: Clone + Default>(
    st: Storage,
    wrap: fn(&mut [T]) -> Buf<'_>,
    [q, k, v]: [&[T]; 3],
    t: &Tables,
    [hq, hkv, d]: [usize; 3],
) -> Vec<T> {
    let b = t.lens.len();
    let (mut qs, mut ks, mut vs) = (q.to_vec(), k.to_vec(), v.to_vec());
    let (mut tb, mut ln) = (i32s(&t.tables), i32s(&t.lens));
    let mut out = vec![T::default(); b * hq * d];
    go(
        &launch::paged_decode_attention(st, [b, hq, hkv, BS, t.maxb, d]),
        vec![
            wrap(&mut qs),
            wrap(&mut ks),
            wrap(&mut vs),
            Buf::I32(&mut tb),
            Buf::I32(&mut ln),
            wrap(&mut out),
        ],
    );
    out
}

fn f32_buf(v: &mut [f32]) -> Buf<'_> {
    Buf::F32(v)
}

fn bf16_buf(v: &mut [u16]) -> Buf<'_> {
    Buf::Bf16(v)
}

/// Chunks of 16 slots, at most 8 splits: 0 (empty), 1, 15/16/17 (one split and a boundary),
/// 100, 128, 129 (7, 8, and 9 chunks capped at 8) and 300 (8 splits of 38), in one batch.
const LENS: [u32; 9] = [100, 1, 300, 16, 0, 17, 129, 15, 128];

fn small_plan(blocks: usize) -> SplitPlan {
    SplitPlan {
        chunk: 16,
        max_splits: 8,
        blocks,
    }
}

#[test]
fn flash_decoding_matches_todays_kernel_and_the_reference() {
    let t = tables(&LENS);
    let b = LENS.len();
    for (hq, hkv, d) in HEADS {
        let pool = t.nb * hkv * BS * d;
        let (q, k, v) = (
            rand_vec(b * hq * d, 31),
            rand_vec(pool, 32),
            rand_vec(pool, 33),
        );
        let want =
            r::paged_decode_attention(&q, &k, &v, &t.tables, t.maxb, &t.lens, [hq, hkv, BS, d]);
        let today = whole(Storage::F32, f32_buf, [&q, &k, &v], &t, [hq, hkv, d]);
        // 3 blocks per head: some compute 3 splits of a row, some none (the other block
        // counts give the same bits: a_row_does_not_depend_on_the_batch).
        let got = split(
            Storage::F32,
            f32_buf,
            [&q, &k, &v],
            &t,
            [hq, hkv, d],
            small_plan(3),
        );
        let at = format!("hq {hq} hkv {hkv} d {d}");
        close(&format!("split vs reference, {at}"), &got, &want, 1e-4);
        close(
            &format!("split vs today's kernel, {at}"),
            &got,
            &today,
            1e-5,
        );
        let empty = &got[4 * hq * d..5 * hq * d];
        assert!(empty.iter().all(|&x| x == 0.0), "an empty row gives zeros");

        let ((qb, qr), (kb, kr), (vb, vr)) = (to_bf16(&q), to_bf16(&k), to_bf16(&v));
        let want =
            r::paged_decode_attention(&qr, &kr, &vr, &t.tables, t.maxb, &t.lens, [hq, hkv, BS, d]);
        let today = from_bf16(&whole(
            Storage::Bf16,
            bf16_buf,
            [&qb, &kb, &vb],
            &t,
            [hq, hkv, d],
        ));
        let got = from_bf16(&split(
            Storage::Bf16,
            bf16_buf,
            [&qb, &kb, &vb],
            &t,
            [hq, hkv, d],
            small_plan(3),
        ));
        close("bf16 split vs reference", &got, &want, bf16_tol(&want));
        close(
            "bf16 split vs today's kernel",
            &got,
            &today,
            bf16_tol(&want),
        );
    }
}

/// A row's output, bit for bit, alone (batch 1, as many blocks per head as the plan gives a
/// batch of one) and inside the batch at 1, 3 and 8 blocks per head: the split count follows
/// the row's length, never the batch.
#[test]
fn a_row_does_not_depend_on_the_batch() {
    let (hq, hkv, d) = (4, 2, 64);
    let t = tables(&LENS);
    let b = LENS.len();
    let pool = t.nb * hkv * BS * d;
    let (q, k, v) = (
        rand_vec(b * hq * d, 41),
        rand_vec(pool, 42),
        rand_vec(pool, 43),
    );
    let batch: Vec<Vec<f32>> = [1, 3, 8]
        .iter()
        .map(|&blocks| {
            split(
                Storage::F32,
                f32_buf,
                [&q, &k, &v],
                &t,
                [hq, hkv, d],
                small_plan(blocks),
            )
        })
        .collect();
    for (i, &len) in LENS.iter().enumerate() {
        // Row i alone: its own table (the same blocks) and query.
        let alone = Tables {
            lens: vec![len],
            tables: t.tables[i * t.maxb..(i + 1) * t.maxb].to_vec(),
            maxb: t.maxb,
            nb: t.nb,
        };
        let qi = &q[i * hq * d..(i + 1) * hq * d];
        let got = split(
            Storage::F32,
            f32_buf,
            [qi, &k, &v],
            &alone,
            [hq, hkv, d],
            small_plan(8),
        );
        for (n, out) in batch.iter().enumerate() {
            let row = &out[i * hq * d..(i + 1) * hq * d];
            let same = row
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "row {i} (len {len}) differs between alone and batch run {n}"
            );
        }
    }
}

/// The production plan (chunk 256, at most 32 splits; blocks per head for 132 SMs) over rows
/// of 8,300 (32 splits of 260), 3,000, 257 and 1 slots, Qwen3's GQA 2 at head size 128.
#[test]
fn the_production_plan_at_an_8k_context() {
    let (hq, hkv, d) = (2, 1, 128);
    let lens = [8300u32, 3000, 257, 1];
    let t = tables(&lens);
    let b = lens.len();
    let pool = t.nb * hkv * BS * d;
    let (q, k, v) = (
        rand_vec(b * hq * d, 51),
        rand_vec(pool, 52),
        rand_vec(pool, 53),
    );
    let plan = SplitPlan::new(132, b * hq);
    assert_eq!((plan.blocks, plan.count(8300)), (32, 32));
    let want = r::paged_decode_attention(&q, &k, &v, &t.tables, t.maxb, &t.lens, [hq, hkv, BS, d]);
    let got = split(Storage::F32, f32_buf, [&q, &k, &v], &t, [hq, hkv, d], plan);
    close("8k split vs reference", &got, &want, 1e-4);
    let today = whole(Storage::F32, f32_buf, [&q, &k, &v], &t, [hq, hkv, d]);
    close("8k split vs today's kernel", &got, &today, 1e-5);
}
