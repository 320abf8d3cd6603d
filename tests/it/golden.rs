//! Golden tests: terse's Qwen3 against reference outputs computed by HF transformers.

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

#[test]
fn sharded_bf16_checkpoint_matches_transformers() {
    check_fixture("qwen3-sharded-bf16");
}
