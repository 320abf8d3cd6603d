//! LoRA (issue 35): terse's adapted model against transformers + PEFT on a committed adapter
//! (scripts/make_lora_fixture.py), the merged copy, PEFT's file layout on save, and what the
//! adapters change in training (only they are trainable; the base with the adapter off is the
//! KL reference).

use crate::fixture;
use candle_core::{DType, Device};
use terse_model::{reference, Qwen3};

fn adapted() -> Qwen3 {
    let mut m = Qwen3::load(&fixture("qwen3-tiny"), &Device::Cpu, DType::F32).expect("base");
    m.load_adapter(&fixture("qwen3-tiny-lora"))
        .expect("adapter");
    m
}

fn passes(m: &Qwen3, what: &str) {
    let r = reference::check(m, &fixture("qwen3-tiny-lora").join("reference.safetensors"))
        .expect("check");
    println!("{what}: {r:?}");
    assert!(r.passes(1e-4), "{what}: {r:?}");
}

/// Logits, log-probs (the training path), the KV-cache decode's step logits and the greedy
/// continuation of the adapted model match transformers + PEFT; so does the merged copy the
/// rollout decodes, and the adapter saved and loaded back.
#[test]
fn a_peft_adapter_matches_transformers_and_peft() {
    let m = adapted();
    let lora = m.lora().expect("adapters");
    assert_eq!((lora.rank, lora.alpha, lora.targets.len()), (4, 8.0, 7));
    passes(&m, "adapted");
    passes(&m.merged().expect("merged"), "merged");
    let out = crate::scratch("lora-save");
    m.save_adapter(&out, "tests/fixtures/qwen3-tiny")
        .expect("save");
    let mut back = Qwen3::load(&fixture("qwen3-tiny"), &Device::Cpu, DType::F32).expect("base");
    back.load_adapter(&out).expect("load back");
    passes(&back, "saved and loaded back");
    // PEFT's key names and shapes: A (r, In), B (Out, r).
    let t = candle_core::safetensors::load(out.join("adapter_model.safetensors"), &Device::Cpu)
        .expect("adapter file");
    let a = &t["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
    let b = &t["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"];
    assert_eq!((a.dims(), b.dims()), (&[4, 64][..], &[64, 4][..]));
    // `xtask export`: the merged HF checkpoint and the PEFT directory, both still the adapted
    // model (scripts/transformers_loads.py and scripts/peft_loads.py load them in Python).
    let out = crate::scratch("lora-export");
    let (merged, adapter) =
        terse_train::export_lora(&fixture("qwen3-tiny-lora"), &fixture("qwen3-tiny"), &out)
            .expect("export");
    passes(
        &Qwen3::load(&merged, &Device::Cpu, DType::F32).expect("merged"),
        "exported merged",
    );
    let mut back = Qwen3::load(&fixture("qwen3-tiny"), &Device::Cpu, DType::F32).expect("base");
    back.load_adapter(&adapter).expect("exported adapter");
    passes(&back, "exported adapter");
    // With the adapter off the model is the base again.
    let _off = m.adapter_off();
    let r =
        reference::check(&m, &fixture("qwen3-tiny").join("reference.safetensors")).expect("check");
    assert!(r.passes(1e-4), "adapter off is not the base: {r:?}");
}

/// Only the adapters are trainable: the gradient of a log-prob loss reaches A and B (B starts
/// at zero, so A's gradient is zero and B's is not), never the base.
#[test]
fn fresh_adapters_start_at_the_base_and_only_they_get_gradients() {
    let mut m = Qwen3::load(&fixture("qwen3-tiny"), &Device::Cpu, DType::F32).expect("base");
    let base_logits = {
        let r = reference::check(&m, &fixture("qwen3-tiny").join("reference.safetensors"))
            .expect("check");
        r.max_logit_diff
    };
    let cfg = terse_model::LoraConfig::new(
        8,
        16.0,
        &["q".into(), "v".into()],
        terse_model::LoraInit::Kaiming,
    )
    .expect("config");
    m.add_lora(cfg, 3).expect("lora");
    let r =
        reference::check(&m, &fixture("qwen3-tiny").join("reference.safetensors")).expect("check");
    assert_eq!(
        r.max_logit_diff, base_logits,
        "B = 0: the adapted model is the base"
    );
    assert_eq!(m.vars().len(), 2 * 2 * 2, "A and B of q and v in 2 layers");
    assert!(m.vars().keys().all(|k| k.contains("lora_")));
    let batch = terse_model::Batch::from_rows(
        &[vec![3, 5, 7, 9, 11]],
        0,
        terse_model::Padding::Right,
        &Device::Cpu,
    )
    .expect("batch");
    let (rows, targets) = ([0u32, 1, 2, 3], [5u32, 7, 9, 11]);
    let grads = m
        .logprob_backward(&batch, &rows, &targets, &mut |lp| lp.sum_all())
        .expect("backward");
    assert_eq!(
        grads.len(),
        m.vars().len(),
        "a gradient for every adapter, none for the base"
    );
    let norm = |k: &str| -> f32 {
        grads[k]
            .sqr()
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_scalar())
            .expect("norm")
    };
    let pre = "base_model.model.model.layers.0.self_attn.q_proj";
    assert_eq!(norm(&format!("{pre}.lora_A.weight")), 0.0);
    assert!(norm(&format!("{pre}.lora_B.weight")) > 0.0);
}

/// `crate::from_sft` with `[model.lora]` (rank 8, every projection) and a KL term, whose
/// reference is the base with the adapters off.
fn lora_cfg(root: &std::path::Path, name: &str, steps: u64) -> terse_train::RunConfig {
    let mut c = crate::from_sft(root, name, steps);
    c.model.lora = Some(terse_train::config::LoraSection {
        rank: 8,
        alpha: 16.0,
        ..Default::default()
    });
    c.grpo.kl_coef = 0.01;
    c.grpo.schedule.peak_lr = 2e-3;
    c.checkpoint.every = 2;
    c.checkpoint.keep_last = 3;
    c
}

/// A LoRA run checkpoints the adapters and their optimizer state only (PEFT's files, no base
/// weights), resumes as if it had not stopped, on one process or on 2 ranks, and loads no
/// second model for the KL term.
#[test]
fn a_lora_run_checkpoints_adapters_only_and_resumes_on_any_world_size() {
    let root = crate::scratch("lora-resume");
    let straight = terse_train::train(&lora_cfg(&root, "straight", 4)).expect("straight");
    let ck = straight.dir.join("step_000004");
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.safetensors",
    ] {
        assert!(ck.join(f).is_file(), "{f} missing");
    }
    assert!(
        !ck.join("model.safetensors").exists(),
        "a LoRA checkpoint holds base weights"
    );
    let opt = candle_core::safetensors::load(ck.join("optimizer.safetensors"), &Device::Cpu)
        .expect("optimizer");
    assert!(
        opt.keys().all(|k| k.contains("lora_")),
        "optimizer state beyond the adapters"
    );
    let steps = crate::ranks::steps_of(&straight.dir);
    assert!(
        steps.iter().all(|s| s.kl.is_finite()) && steps[3].kl > 0.0,
        "no KL against the base"
    );

    // Stopped after step 2, resumed on one process, and on 2 ranks.
    for (name, world) in [("resumed", 1), ("resumed-2", 2)] {
        terse_train::train(&lora_cfg(&root, name, 2)).expect("first half");
        let dir = if world == 1 {
            crate::train::resume_changed(&lora_cfg(&root, name, 4))
                .expect("second half")
                .dir
        } else {
            crate::ranks::ranked_as(lora_cfg(&root, name, 4), world, true).dir
        };
        let (a, b) = (&steps, crate::ranks::steps_of(&dir));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.reward, x.len_mean),
                (y.reward, y.len_mean),
                "{name}: step {}",
                x.step
            );
            assert!(
                (x.loss - y.loss).abs() <= 1e-6 * x.loss.abs().max(1.0),
                "{name}: step {}",
                x.step
            );
        }
        let f = "step_000004/adapter_model.safetensors";
        let d = crate::ranks::max_diff(&straight.dir.join(f), &dir.join(f));
        assert!(d <= 1e-5, "{name}: adapters differ by {d}");
        if world == 1 {
            assert_eq!(
                crate::train::deterministic_metrics(&straight.dir),
                crate::train::deterministic_metrics(&dir),
                "resumed LoRA run differs"
            );
        }
    }
}

/// LoRA on the CPU testbed learns: 20 steps from the SFT checkpoint raise held-out pass@1.
#[test]
fn a_lora_run_on_the_testbed_raises_pass_at_1() {
    let root = crate::scratch("lora-learns");
    let mut c = lora_cfg(&root, "learns", 20);
    c.data.levels = vec![3, 4, 5, 6];
    (
        c.grpo.prompts_per_step,
        c.grpo.group_size,
        c.grpo.max_new_tokens,
    ) = (4, 8, 96);
    c.checkpoint.every = 0;
    (c.eval.per_level, c.eval.samples) = (8, 2);
    c.reward = toml::from_str("[shaper]\nmethod = \"none\"\n").expect("reward");
    let s = terse_train::train(&c).expect("train");
    let before = s.before.as_ref().expect("step-0 evaluation").accuracy;
    println!("LoRA pass@1 {before:.3} -> {:.3}", s.after.accuracy);
    assert!(
        s.after.accuracy > before,
        "pass@1 {before} -> {}",
        s.after.accuracy
    );
}
