//! Golden tests: terse's Qwen3 and Qwen2 against reference outputs computed by HF transformers.

use crate::fixture;
use candle_core::{DType, Device};
use terse_model::{reference, Qwen3};

fn check_fixture(name: &str) {
    let dir = fixture(name);
    let model = Qwen3::load(&dir, &Device::Cpu, DType::F32).expect("load");
    let report = reference::check(&model, &dir.join("reference.safetensors")).expect("check");
    println!("{name}: {report:?}");
    assert!(
        report.max_logit_diff < 1e-4,
        "{name}: logits off by {}",
        report.max_logit_diff
    );
    assert!(
        report.max_logprob_diff < 1e-4,
        "{name}: log-probs off by {}",
        report.max_logprob_diff
    );
    assert!(
        report.max_step_logit_diff < 1e-4,
        "{name}: step logits off by {}",
        report.max_step_logit_diff
    );
    assert!(
        report.greedy_match,
        "{name}: greedy {:?} != {:?}",
        report.greedy, report.reference_greedy
    );
}

#[test]
fn qwen3_tiny_matches_transformers() {
    check_fixture("qwen3-tiny");
}

#[test]
fn untied_one_kv_head_legacy_rope_theta_matches_transformers() {
    check_fixture("qwen3-untied-1kv");
}

/// Qwen2 (Qwen2.5, DeepSeek-R1-Distill-Qwen): q/k/v biases (random, not transformers' zeros),
/// no q/k norm, head_dim from hidden / heads; logits, log-probs, the KV-cache decode's step
/// logits and the greedy continuation.
#[test]
fn qwen2_tiny_matches_transformers() {
    check_fixture("qwen2-tiny");
}

#[test]
fn sharded_bf16_checkpoint_matches_transformers() {
    check_fixture("qwen3-sharded-bf16");
}

/// Issue 37 item 10: a reference file whose logits hold a NaN fails the check (before, the
/// running maximum dropped it and check-model passed), in a real row and in a padding row.
#[test]
fn item10_a_nan_in_the_reference_fails_the_check() {
    let dir = fixture("qwen3-tiny");
    let model = Qwen3::load(&dir, &Device::Cpu, DType::F32).expect("load");
    let r = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)
        .expect("reference");
    for (what, at) in [("first logit", 0usize), ("last logit", usize::MAX)] {
        let mut r = r.clone();
        let logits = &r["logits"];
        let mut v = logits
            .flatten_all()
            .expect("flat")
            .to_vec1::<f32>()
            .expect("v");
        let i = at.min(v.len() - 1);
        v[i] = f32::NAN;
        let bad = candle_core::Tensor::from_vec(v, logits.shape(), &Device::Cpu).expect("t");
        r.insert("logits".into(), bad);
        let path = crate::scratch("golden-nan").join("reference.safetensors");
        candle_core::safetensors::save(&r, &path).expect("save");
        let report = reference::check(&model, &path).expect("check");
        assert!(report.max_logit_diff.is_nan(), "{what}: {report:?}");
        assert!(!report.passes(1e-4), "{what}: a NaN reference passed");
    }
}
