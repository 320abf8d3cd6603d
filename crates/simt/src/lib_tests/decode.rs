//! The rollout's kernels through the shim: the preallocated cache's slot write and decode
//! attention, and the paged pool's write and attention over block tables (interleaved blocks,
//! a block two rows share after a fork, a copy-on-write copy, len == capacity, length 1 and 0).

use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, Storage};
use terse_model::testing::references as r;

/// (query heads, KV heads, head size): GQA 1, 2, 4 and 8 at head sizes 64 and 128.
const HEADS: [(usize, usize, usize); 4] = [(2, 2, 64), (4, 2, 128), (4, 1, 64), (8, 1, 128)];

#[test]
fn kv_write_and_decode_attention() {
    for (hq, hkv, d) in HEADS {
        let (b, cap) = (3, 9);
        let (q, k, v, src) = (
            rand_vec(b * hq * d, 11),
            rand_vec(b * hkv * cap * d, 12),
            rand_vec(b * hkv * cap * d, 13),
            rand_vec(b * hkv * d, 14),
        );
        // Row 0 attends every slot (len == capacity), row 1 has holes (left padding), row 2
        // none at all (a fully masked row gives zeros).
        let mut valid = vec![1u8; b * cap];
        for t in [0, 1, 4] {
            valid[cap + t] = 0;
        }
        valid[2 * cap..].fill(0);
        let (len, slot) = (cap, cap - 1);
        let mut want_k = k.clone();
        r::kv_write(&src, &mut want_k, [b, hkv, d], cap, slot);
        let mut got_k = k.clone();
        let mut s = src.clone();
        go(
            &launch::kv_write(Storage::F32, [b, hkv, cap, d], slot),
            vec![Buf::F32(&mut s), Buf::F32(&mut got_k)],
        );
        close("kv write", &got_k, &want_k, 0.0);

        let want = r::decode_attention(&q, &want_k, &v, &valid, [hq, hkv], cap, len, d);
        let mut out = vec![0f32; q.len()];
        let (mut qs, mut vs) = (q.clone(), v.clone());
        go(
            &launch::decode_attention(Storage::F32, [b, hq, hkv, cap, d], len),
            vec![
                Buf::F32(&mut qs),
                Buf::F32(&mut got_k),
                Buf::F32(&mut vs),
                Buf::U8(&mut valid.clone()),
                Buf::F32(&mut out),
            ],
        );
        close(
            &format!("decode attention hq {hq} hkv {hkv} d {d}"),
            &out,
            &want,
            1e-4,
        );
        assert!(out[2 * hq * d..].iter().all(|&x| x == 0.0), "masked row");

        let ((mut qb, qr), (mut kb, kr), (mut vb, vr)) =
            (to_bf16(&q), to_bf16(&want_k), to_bf16(&v));
        let want = r::decode_attention(&qr, &kr, &vr, &valid, [hq, hkv], cap, len, d);
        let mut ob = vec![0u16; q.len()];
        go(
            &launch::decode_attention(Storage::Bf16, [b, hq, hkv, cap, d], len),
            vec![
                Buf::Bf16(&mut qb),
                Buf::Bf16(&mut kb),
                Buf::Bf16(&mut vb),
                Buf::U8(&mut valid.clone()),
                Buf::Bf16(&mut ob),
            ],
        );
        close(
            "bf16 decode attention",
            &from_bf16(&ob),
            &want,
            bf16_tol(&want),
        );
        let mut sb = to_bf16(&src).0;
        let mut cache = to_bf16(&k).0;
        go(
            &launch::kv_write(Storage::Bf16, [b, hkv, cap, d], 0),
            vec![Buf::Bf16(&mut sb), Buf::Bf16(&mut cache)],
        );
        let mut want_c = from_bf16(&to_bf16(&k).0);
        r::kv_write(
            &from_bf16(&to_bf16(&src).0),
            &mut want_c,
            [b, hkv, d],
            cap,
            0,
        );
        close("bf16 kv write", &from_bf16(&cache), &want_c, 0.0);
    }
}

#[test]
fn paged_write_and_attention_over_block_tables() {
    let (nb, bs, maxb) = (6usize, 16usize, 2usize);
    // Row 0: blocks 3 then 1 (interleaved), len == capacity. Row 1: shares block 3 with row 0
    // (a fork), then block 5 (its copy-on-write copy of a partial block). Row 2: one token.
    // Row 3: no token (zeros).
    let tables: Vec<u32> = vec![3, 1, 3, 5, 2, 0, 0, 0];
    let lens: Vec<u32> = vec![32, 20, 1, 0];
    let b = lens.len();
    // Each row's new token goes to the slot after its last one (row 0: its last slot).
    let slots: Vec<u32> = vec![16 + 15, 5 * 16 + 3, 2 * 16, 0];
    for (hq, hkv, d) in HEADS {
        let (q, k, v, src) = (
            rand_vec(b * hq * d, 21),
            rand_vec(nb * hkv * bs * d, 22),
            rand_vec(nb * hkv * bs * d, 23),
            rand_vec(b * hkv * d, 24),
        );
        let mut want_k = k.clone();
        r::paged_kv_write(&src, &mut want_k, &slots, hkv, bs, d);
        let mut got_k = k.clone();
        let mut s = src.clone();
        let mut slots_i: Vec<i32> = slots.iter().map(|&x| x as i32).collect();
        go(
            &launch::paged_kv_write(Storage::F32, [b, hkv, bs, d]),
            vec![
                Buf::F32(&mut s),
                Buf::F32(&mut got_k),
                Buf::I32(&mut slots_i),
            ],
        );
        close("paged kv write", &got_k, &want_k, 0.0);

        let want =
            r::paged_decode_attention(&q, &want_k, &v, &tables, maxb, &lens, [hq, hkv, bs, d]);
        let mut tables_i: Vec<i32> = tables.iter().map(|&x| x as i32).collect();
        let mut lens_i: Vec<i32> = lens.iter().map(|&x| x as i32).collect();
        let mut out = vec![0f32; q.len()];
        let (mut qs, mut vs) = (q.clone(), v.clone());
        go(
            &launch::paged_decode_attention(Storage::F32, [b, hq, hkv, bs, maxb, d]),
            vec![
                Buf::F32(&mut qs),
                Buf::F32(&mut got_k),
                Buf::F32(&mut vs),
                Buf::I32(&mut tables_i),
                Buf::I32(&mut lens_i),
                Buf::F32(&mut out),
            ],
        );
        close(
            &format!("paged attention hq {hq} hkv {hkv} d {d}"),
            &out,
            &want,
            1e-4,
        );
        assert!(
            out[3 * hq * d..].iter().all(|&x| x == 0.0),
            "an empty row gives zeros"
        );

        let ((mut qb, qr), (mut kb, kr), (mut vb, vr)) =
            (to_bf16(&q), to_bf16(&want_k), to_bf16(&v));
        let want = r::paged_decode_attention(&qr, &kr, &vr, &tables, maxb, &lens, [hq, hkv, bs, d]);
        let mut ob = vec![0u16; q.len()];
        go(
            &launch::paged_decode_attention(Storage::Bf16, [b, hq, hkv, bs, maxb, d]),
            vec![
                Buf::Bf16(&mut qb),
                Buf::Bf16(&mut kb),
                Buf::Bf16(&mut vb),
                Buf::I32(&mut tables_i),
                Buf::I32(&mut lens_i),
                Buf::Bf16(&mut ob),
            ],
        );
        close(
            "bf16 paged attention",
            &from_bf16(&ob),
            &want,
            bf16_tol(&want),
        );
        let (mut sb, mut pool) = (to_bf16(&src).0, to_bf16(&k).0);
        go(
            &launch::paged_kv_write(Storage::Bf16, [b, hkv, bs, d]),
            vec![
                Buf::Bf16(&mut sb),
                Buf::Bf16(&mut pool),
                Buf::I32(&mut slots_i),
            ],
        );
        let mut want_p = from_bf16(&to_bf16(&k).0);
        r::paged_kv_write(
            &from_bf16(&to_bf16(&src).0),
            &mut want_p,
            &slots,
            hkv,
            bs,
            d,
        );
        close("bf16 paged kv write", &from_bf16(&pool), &want_p, 0.0);
    }
}
