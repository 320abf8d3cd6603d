//! KV-cache parity: batched decode with rows at different positions, group expansion and row
//! dropping give the same logits as a full forward over each row's whole sequence.

use candle_core::{DType, Device, Tensor};
use terse_model::{Batch, Config, Padding, Qwen3};

/// Full-forward logits of the last token of `row` (no padding).
fn full_last_logits(model: &Qwen3, row: &[u32]) -> Tensor {
    let b = Batch::from_rows(&[row.to_vec()], 0, Padding::Left, &Device::Cpu).expect("batch");
    model
        .logits(&b)
        .expect("logits")
        .get(0)
        .expect("row")
        .get(row.len() - 1)
        .expect("last")
}

#[test]
fn batched_decode_with_left_padding_and_row_selection_matches_full_forward() {
    let cfg = Config::synthetic(50, 32, 48, 2, 4, 2, 8, true).expect("cfg");
    let model = Qwen3::random(cfg, 3, &Device::Cpu, DType::F32).expect("model");
    let dev = Device::Cpu;
    let prompts = vec![vec![5u32, 6, 7, 8, 9], vec![11, 12], vec![20, 21, 22]];
    let prefill = Batch::from_rows(&prompts, 0, Padding::Left, &dev).expect("batch");
    let mut cache = model.new_cache(3, 16).expect("cache");
    let snap = model.decode_weights();
    let logits = model
        .forward_cached(
            &snap,
            &mut cache,
            &prefill.input_ids,
            &prefill.position_ids,
            &prefill.mask,
        )
        .expect("prefill");
    for (r, p) in prompts.iter().enumerate() {
        let d = crate::max_abs_diff(&logits.get(r).expect("row"), &full_last_logits(&model, p));
        assert!(d < 1e-5, "prefill row {r}: {d}");
    }
    // Expand: prompt 0 twice, prompt 2 once (a G-sample group copy); prompt 1 dropped.
    let mut cache = cache.select_rows(&[0, 0, 2]).expect("select");
    let mut seqs = [prompts[0].clone(), prompts[0].clone(), prompts[2].clone()];
    for step in 0..6u32 {
        let next: Vec<u32> = (0..3).map(|r| 30 + step + r as u32).collect();
        let pos: Vec<u32> = seqs.iter().map(|s| s.len() as u32).collect();
        // Row 1 skips step 2 (an injected/finished slot): its slot is masked and its sequence unchanged.
        let valid: Vec<u8> = (0..3).map(|r| u8::from(!(r == 1 && step == 2))).collect();
        let logits = model
            .forward_cached(
                &snap,
                &mut cache,
                &Tensor::from_vec(next.clone(), (3, 1), &dev).expect("t"),
                &Tensor::from_vec(pos, (3, 1), &dev).expect("t"),
                &valid,
            )
            .expect("decode");
        for r in 0..3 {
            if valid[r] == 0 {
                continue;
            }
            seqs[r].push(next[r]);
            let d = crate::max_abs_diff(
                &logits.get(r).expect("row"),
                &full_last_logits(&model, &seqs[r]),
            );
            assert!(d < 1e-5, "step {step} row {r}: {d}");
        }
    }
    let over = model.forward_cached(
        &snap,
        &mut cache,
        &Tensor::zeros((3, 8), DType::U32, &dev).expect("t"),
        &Tensor::zeros((3, 8), DType::U32, &dev).expect("t"),
        &[1; 24],
    );
    assert!(over
        .expect_err("full")
        .to_string()
        .contains("capacity 16 exceeded"));
}
