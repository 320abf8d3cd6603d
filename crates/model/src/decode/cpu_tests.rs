//! Tests of the CPU decode step (`decode::cpu`): the three decode paths agree (with an f32 or
//! an f16 cache), and a row's logits do not depend on the rows beside it.

use crate::cache::DecodePath;
use crate::{Batch, Config, Padding, Qwen3};
use candle_core::{DType, Device, Tensor};

/// Prefill a left-padded batch, then decode 6 steps (one row padded at step 3) along each
/// path, with a cache storing `kv`; the prefill's and every step's logits agree with the
/// composite forward. Returns the composite forward's logits of every step.
fn paths_agree(rows: usize, head_dim: usize, kv: DType) -> Vec<Vec<Vec<f32>>> {
    let dev = Device::Cpu;
    let cfg = Config::synthetic(48, 64, 96, 2, 4, 2, head_dim, true).expect("config");
    let m = Qwen3::random(cfg, 7, &dev, DType::F32).expect("model");
    let prompts: Vec<Vec<u32>> = (0..rows)
        .map(|r| {
            (0..3 + r % 4)
                .map(|j| ((r * 5 + j * 3) % 47 + 1) as u32)
                .collect()
        })
        .collect();
    let batch = Batch::from_rows(&prompts, 0, Padding::Left, &dev).expect("batch");
    let paths: &[DecodePath] = if kv == DType::F32 {
        &[DecodePath::Composite, DecodePath::Kernels, DecodePath::Cpu]
    } else {
        &[DecodePath::Composite, DecodePath::Cpu] // the fused ops take the model's dtype
    };
    let mut caches = vec![];
    let mut prefill = vec![];
    let snap = m.decode_weights();
    for &p in paths {
        let mut c = m.new_cache_in(rows, batch.t + 8, kv).expect("cache");
        let ids = (&batch.input_ids, &batch.position_ids, &batch.mask);
        let l = m.forward_cached_with(p, &snap, &mut c, ids.0, ids.1, ids.2);
        prefill.push(l.expect("prefill").to_vec2::<f32>().expect("logits"));
        caches.push(c);
    }
    // The prefill (left-padded prompts, several slots per row) agrees too.
    for (p, o) in paths.iter().zip(&prefill).skip(1) {
        for (a, b) in o.iter().flatten().zip(prefill[0].iter().flatten()) {
            assert!((a - b).abs() < 2e-5, "{p:?} prefill: {a} vs {b}");
        }
    }
    let mut steps = vec![prefill[0].clone()];
    for step in 0..6u32 {
        let ids: Vec<u32> = (0..rows as u32)
            .map(|r| (r * 7 + step * 11) % 47 + 1)
            .collect();
        let pos: Vec<u32> = (0..rows).map(|r| (3 + r % 4) as u32 + step).collect();
        let valid: Vec<u8> = (0..rows)
            .map(|r| u8::from(!(step == 3 && r == 1)))
            .collect();
        let ids = Tensor::from_vec(ids, (rows, 1), &dev).expect("ids");
        let pos = Tensor::from_vec(pos, (rows, 1), &dev).expect("pos");
        let out: Vec<Vec<Vec<f32>>> = paths
            .iter()
            .zip(&mut caches)
            .map(|(&p, c)| {
                let l = m
                    .forward_cached_with(p, &snap, c, &ids, &pos, &valid)
                    .expect("step");
                l.to_vec2::<f32>().expect("logits")
            })
            .collect();
        for (p, o) in paths.iter().zip(&out).skip(1) {
            for (a, b) in o.iter().flatten().zip(out[0].iter().flatten()) {
                assert!((a - b).abs() < 2e-5, "{p:?} step {step}: {a} vs {b}");
            }
        }
        steps.push(out[0].clone());
    }
    steps
}

#[test]
fn a_rows_logits_do_not_depend_on_the_rows_beside_it() {
    if !crate::decode::matmul::available_512() {
        eprintln!("skipped: the batch-invariant kernels need AVX-512");
        return;
    }
    let dev = Device::Cpu;
    let cfg = Config::synthetic(48, 64, 96, 2, 4, 2, 32, true).expect("config");
    let m = Qwen3::random(cfg, 7, &dev, DType::F32).expect("model");
    // Prompts of one length (no padding, so row 5's slots are the same in both runs).
    let prompts: Vec<Vec<u32>> = (0..19)
        .map(|r| (0..5).map(|j| ((r * 5 + j * 3) % 47 + 1) as u32).collect())
        .collect();
    let run = |rows: &[Vec<u32>]| -> Vec<Vec<f32>> {
        let b = rows.len();
        let batch = Batch::from_rows(rows, 0, Padding::Left, &dev).expect("batch");
        let mut c = m.new_cache(b, 12).expect("cache");
        let snap = m.decode_weights();
        let (ids, pos) = (&batch.input_ids, &batch.position_ids);
        let mut out = vec![m
            .forward_cached(&snap, &mut c, ids, pos, &batch.mask)
            .expect("prefill")];
        for step in 0..4u32 {
            let ids = Tensor::from_vec(vec![step * 7 + 3; b], (b, 1), &dev).expect("ids");
            let pos = Tensor::from_vec(vec![5 + step; b], (b, 1), &dev).expect("pos");
            out.push(
                m.forward_cached(&snap, &mut c, &ids, &pos, &vec![1; b])
                    .expect("step"),
            );
        }
        let row = b.min(6) - 1; // row 5 of the batch, row 0 alone
        out.iter()
            .map(|l| l.get(row).and_then(|r| r.to_vec1::<f32>()).expect("row"))
            .collect()
    };
    let alone = run(&prompts[5..6]);
    let beside = run(&prompts);
    assert_eq!(alone, beside, "row 5's logits alone vs in a batch of 19");
}

#[test]
fn decode_paths_agree_on_one_row() {
    paths_agree(1, 16, DType::F32);
}

#[test]
fn decode_paths_agree_with_rows_split_across_threads() {
    // 19 rows: the CPU step splits them into parts (of uneven size) when it has threads.
    paths_agree(19, 16, DType::F32);
    // Head size 32: the one-pass AVX2 attention (where the CPU has it).
    paths_agree(19, 32, DType::F32);
}

#[test]
fn an_f16_cache_decodes_alike_on_every_path_and_near_the_f32_cache() {
    for head_dim in [16, 32] {
        // Head size 16: the converting fallback; 32: the AVX-512 kernel reading f16 (where the
        // CPU has it).
        let half = paths_agree(19, head_dim, DType::F16);
        let full = paths_agree(19, head_dim, DType::F32);
        let gap = half
            .iter()
            .flatten()
            .flatten()
            .zip(full.iter().flatten().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // K/V rounded to 11 significant bits move the logits, but only a little.
        assert!(
            gap > 0.0 && gap < 1e-2,
            "head {head_dim}: f16 vs f32 cache {gap}"
        );
    }
}
