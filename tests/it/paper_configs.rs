//! configs/papers/*.toml against the papers: each file parses and validates, and its
//! hyperparameters equal the values the papers state (source in each comment; docs/methods.md, Short-RL, GRPO-λ,
//! docs/methods.md, CARE, Step-GRPO). Model and data paths point into models/ and data/.

use std::path::PathBuf;
use terse_reward::{Advantage, Method, Norm};
use terse_train::config::{Init, KlEstimator, LossAgg, MathScorer, TaskKind, TruncatedReward};
use terse_train::RunConfig;

fn load(name: &str) -> RunConfig {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/papers")
        .join(name);
    let c = RunConfig::from_file(&p).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert!(
        c.model.path.starts_with("models"),
        "{name}: model path {:?}",
        c.model.path
    );
    let train = c.data.train.as_ref().expect("a training dataset");
    assert!(train.starts_with("data"), "{name}: data path {train:?}");
    assert_eq!((c.model.init, c.sft.steps), (Init::Checkpoint, 0), "{name}");
    c
}

/// (B prompts, G, max response, temperature, lr, KL β)
fn check_grpo(name: &str, c: &RunConfig, expect: (usize, usize, usize, f64, f64, f64)) {
    let g = &c.grpo;
    let got = (
        g.prompts_per_step,
        g.group_size,
        g.max_new_tokens,
        g.sampling.temperature,
        g.schedule.peak_lr,
        g.kl_coef,
    );
    assert_eq!(got, expect, "{name}: (B, G, max len, temperature, lr, KL)");
}

#[test]
fn short_rl_configs_match_table_3() {
    // Short-RL Table 3, "Logic-RL": lr 1e-6, batch 8, rollout_n 8, temperature 0.7, KL 0.001,
    // 3 epochs, max response 4096, reinforce++, τ_ℓ 200, τ_acc 0.05.
    let c = load("short_rl_logic_rl.toml");
    check_grpo("logic-rl", &c, (8, 8, 4096, 0.7, 1e-6, 0.001));
    assert_eq!(c.grpo.data_epochs, Some(3.0));
    assert!(matches!(
        c.advantage.builtin(),
        Some(Advantage::ReinforcePp { .. })
    ));
    assert_eq!(c.data.task, TaskKind::Kk);
    match c.reward.shaper.builtin() {
        Some(Method::ShortRl(s)) => {
            assert_eq!((s.tau_len, s.tau_acc), (200.0, 0.05));
            assert!(s.correct_only && s.nucleus && s.acc_gate);
        }
        m => panic!("logic-rl: {m:?}"),
    }
    // "DeepScaleR": lr 1e-6, batch 128, mini-batch 64, rollout_n 8, temperature 0.6, KL 0.001,
    // 3 epochs, max response 8192, grpo, τ_ℓ 100, τ_acc 0.05; Short-RL's 3 / -0.5 / -3 reward.
    let c = load("short_rl_deepscaler.toml");
    check_grpo("deepscaler", &c, (128, 8, 8192, 0.6, 1e-6, 0.001));
    assert_eq!(
        (c.grpo.data_epochs, c.grpo.mini_batch_prompts),
        (Some(3.0), Some(64))
    );
    assert!(matches!(
        c.advantage.builtin(),
        Some(Advantage::Grpo { std: true, .. })
    ));
    assert_eq!(
        (c.data.task, c.data.math_scorer),
        (TaskKind::Math, MathScorer::ShortRl)
    );
    match c.reward.shaper.builtin() {
        Some(Method::ShortRl(s)) => assert_eq!((s.tau_len, s.tau_acc), (100.0, 0.05)),
        m => panic!("deepscaler: {m:?}"),
    }
}

#[test]
fn grpo_lambda_config_matches_the_paper() {
    // GRPO-λ paper §4.1: Qwen3-8B, DeepMath-103K (2-6 of 8 correct), lr 1e-6, 16 samples per query,
    // generation and training batch 128 x 16, α = 0.2, λ = 20 %; 0/1 outcome reward.
    let c = load("grpo_lambda_qwen3_8b.toml");
    check_grpo(
        "grpo-λ",
        &c,
        (128, 16, c.grpo.max_new_tokens, 1.0, 1e-6, 0.0),
    );
    assert_eq!(
        c.grpo.mini_batch_prompts, None,
        "one update per 128 x 16 batch"
    );
    assert!(c.model.path.ends_with("Qwen3-8B"));
    assert_eq!(c.data.math_scorer, MathScorer::Boxed);
    match c.reward.shaper.builtin() {
        Some(Method::GrpoLambda(s)) => assert_eq!((s.lambda, s.alpha), (0.2, 0.2)),
        m => panic!("grpo-λ: {m:?}"),
    }
}

#[test]
fn care_config_matches_table_8() {
    // CARE App. A.4 / Table 8: GRPO, temperature 1.0 (top-p 1.0), 256 questions x 16, one update
    // per 256 responses, clip 0.2, max response 6144, lr 1e-6, KL β 0.001; L_max = 6144;
    // per-sequence token mean.
    let c = load("care_qwen3_4b.toml");
    check_grpo("care", &c, (256, 16, 6144, 1.0, 1e-6, 0.001));
    assert_eq!(c.grpo.sampling.top_p, 1.0);
    assert_eq!(
        c.grpo.mini_batch_prompts.map(|p| p * c.grpo.group_size),
        Some(256)
    );
    assert_eq!((c.grpo.clip_low, c.grpo.clip_high), (0.2, 0.2));
    assert_eq!(c.grpo.loss_agg, LossAgg::SeqMeanTokenMean);
    assert!(c.model.path.ends_with("Qwen3-4B"));
    match c.reward.shaper.builtin() {
        Some(Method::Care(s)) => {
            assert_eq!(
                (s.l_max, s.coef, s.magnitude, s.fixed_direction),
                (6144, 1.0, false, None)
            )
        }
        m => panic!("care: {m:?}"),
    }
}

#[test]
fn step_grpo_config_matches_section_4_1() {
    // Step-GRPO paper §4.1: α 0.1, β 0.5, G 5, δ 0.95, global batch 512, constant lr 1e-6,
    // β_KL 0.01, max generation 16,384, triggers "Wait" and "Alternatively"; EasyR1 defaults
    // (top-p 0.99, low_var_kl, 0.9·acc + 0.1·format).
    let c = load("step_grpo_qwen3_8b.toml");
    check_grpo("step-grpo", &c, (512, 5, 16384, 1.0, 1e-6, 0.01));
    assert_eq!(c.grpo.sampling.top_p, 0.99);
    assert_eq!(c.grpo.kl_estimator, KlEstimator::K3);
    assert_eq!(c.data.math_scorer, MathScorer::EasyR1);
    assert!(c.model.path.ends_with("Qwen3-8B"));
    let se = c
        .grpo
        .step_exit
        .as_ref()
        .expect("dynamic truncated rollout");
    assert_eq!(se.delta, 0.95);
    assert_eq!(c.grpo.step_triggers, ["Wait", "Alternatively"]);
    // The exit fires at the same list (one source).
    assert_eq!(
        c.grpo.step_exit().expect("exit").triggers,
        c.grpo.step_triggers
    );
    assert!(se.induction.ends_with("\\boxed{") && se.include_trigger_on_exit);
    match c.reward.shaper.builtin() {
        Some(Method::StepGrpo(s)) => assert_eq!((s.alpha, s.beta, s.step_reward), (0.1, 0.5, true)),
        m => panic!("step-grpo: {m:?}"),
    }
}

#[test]
fn dler_config_matches_the_released_script() {
    // DLER (arXiv 2510.15110), NVlabs/DLER dler_slurm.sh: R1-Distill-Qwen-1.5B, DeepScaleR,
    // 512 prompts x 16, mini-batch 64, max response 4000 (the truncation length), temperature
    // 1.0, lr 1e-6, KL loss 0.0005 (low_var_kl), clip 0.2 / 0.28, clip_ratio_c 10, token-mean,
    // weight decay 0.01, filter_groups on, reinforce_plus_plus_baseline (batch normalisation).
    let c = load("dler_r1_distill_qwen_1p5b.toml");
    check_grpo("dler", &c, (512, 16, 4000, 1.0, 1e-6, 0.0005));
    let g = &c.grpo;
    assert_eq!(g.mini_batch_prompts, Some(64));
    assert_eq!(
        (g.clip_low, g.clip_high, g.dual_clip),
        (0.2, 0.28, Some(10.0))
    );
    assert_eq!(
        (g.kl_estimator, g.loss_agg),
        (KlEstimator::K3, LossAgg::TokenMean)
    );
    assert_eq!(g.sampling.top_p, 1.0);
    assert!(g.dynamic_sampling.is_some(), "dynamic sampling");
    assert_eq!(
        g.truncated_reward,
        TruncatedReward::Zero,
        "truncation scores 0"
    );
    assert_eq!(c.optim.weight_decay, 0.01);
    assert!(c.model.path.ends_with("DeepSeek-R1-Distill-Qwen-1.5B"));
    assert_eq!(c.data.math_scorer, MathScorer::Boxed);
    assert_eq!(
        c.reward.shaper,
        Method::None.into(),
        "no length term but truncation"
    );
    assert!(matches!(
        c.advantage.builtin(),
        Some(Advantage::Grpo {
            std: true,
            norm: Norm::Batch,
            difficulty: None,
            ..
        })
    ));
}

/// A tiny random Qwen2 in the layout of the paper's base model (its config.json keys as HF
/// ships them, bf16 storage, untied head, the real vocabulary) with the Qwen tokenizer, in
/// `dir`.
fn tiny_qwen2(dir: &std::path::Path, vocab: usize, rope_theta: f64, sliding_window: usize) {
    let raw = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 131072,
        "max_window_layers": 21,
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": rope_theta,
        "sliding_window": sliding_window,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.44.0",
        "use_cache": true,
        "use_mrope": false,
        "use_sliding_window": false,
        "vocab_size": vocab
    });
    let cfg = terse_model::Config::from_json(raw).expect("a Qwen2 config");
    assert!(cfg.qkv_bias && !cfg.qk_norm);
    let m = terse_model::Qwen3::random(cfg, 11, &candle_core::Device::Cpu, candle_core::DType::F32)
        .expect("model");
    let opts = terse_model::checkpoint::SaveOptions {
        dtype: candle_core::DType::BF16,
        max_shard_bytes: 1 << 30,
    };
    m.save(dir, &opts).expect("save");
    let tok = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/qwen3-tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f)).expect("tokenizer");
    }
}

/// Issue 35: both Short-RL paper configs (Qwen2.5-7B and DeepSeek-R1-Distill-Qwen-1.5B, both
/// Qwen2-architecture) and DLER's (R1-Distill-Qwen-1.5B) get past model loading and take a GRPO
/// step, on a tiny Qwen2 of the same layout and a two-row dataset in the paper's columns; only
/// sizes, paths and the device change.
#[test]
fn short_rl_configs_take_a_step_on_a_tiny_qwen2_of_the_paper_layout() {
    let root = crate::scratch("paper-qwen2");
    for (file, vocab, theta, window, rows) in [
        (
            "short_rl_logic_rl.toml",
            152_064,
            1e6,
            131_072,
            r#"{"quiz": "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves always lie. You meet 2 inhabitants: Zoey, and Oliver. Zoey remarked, \"Oliver is not a knight\". Oliver stated, \"Oliver is a knight if and only if Zoey is a knave\". So who is a knight and who is a knave?", "solution_text_format": "(1) Zoey is a knave\n(2) Oliver is a knight"}"#,
        ),
        (
            "short_rl_deepscaler.toml",
            151_936,
            1e4,
            4096,
            r#"{"problem": "What is 2 + 3?", "answer": "5"}"#,
        ),
        (
            "dler_r1_distill_qwen_1p5b.toml",
            151_936,
            1e4,
            4096,
            r#"{"problem": "What is 2 + 3?", "answer": "5"}"#,
        ),
    ] {
        let mut c = load(file);
        let dir = root.join(file.trim_end_matches(".toml"));
        let model = dir.join("model");
        tiny_qwen2(&model, vocab, theta, window);
        let data = dir.join("data.jsonl");
        std::fs::write(&data, format!("{rows}\n{rows}\n")).expect("data");
        c.model.path = model;
        (c.data.train, c.data.eval) = (Some(data.clone()), Some(data));
        c.run.device = "cpu".into();
        c.run.dir = dir.clone();
        c.grpo.data_epochs = None;
        c.grpo.steps = 1;
        (c.grpo.prompts_per_step, c.grpo.group_size) = (2, 2);
        c.grpo.mini_batch_prompts = None;
        c.grpo.max_new_tokens = 4;
        let mut t = terse_train::GrpoTrainer::builder(c)
            .build()
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
        assert!(t.policy().config.qkv_bias, "{file}: not loaded as Qwen2");
        let r = t.step().unwrap_or_else(|e| panic!("{file}: {e:#}"));
        assert_eq!(r.step, 0);
        assert!(
            r.loss.is_finite() && r.grad_norm.is_finite(),
            "{file}: {r:?}"
        );
        assert_eq!(t.position().0, 1, "{file}");
    }
}

/// Issue 35: GRPO-λ's Qwen3-8B config does not fit one 141 GB GPU with full fine-tuning, and
/// does with LoRA rank 64 on every projection (no optimizer state for the base, no second model
/// for the KL term); the plan names the largest micro-batch.
#[test]
fn grpo_lambda_8b_fits_one_141_gb_gpu_with_lora_rank_64() {
    let mut c = load("grpo_lambda_qwen3_8b.toml");
    let shape = terse_train::planning::model_shape(&c).expect("Qwen3-8B's shape");
    let gb141 = 141e9 as u64;
    let target = terse_train::planning::Target {
        cuda: true,
        device_bytes: Some(gb141),
        device_total: Some(gb141),
        gpus: 1,
        prompt_tokens: 512,
    };
    let full = terse_train::planning::plan(&c, &shape, target);
    assert!(!full.fits(), "full fine-tuning fits?\n{}", full.table());
    c.model.lora = Some(terse_train::config::LoraSection {
        rank: 64,
        alpha: 128.0,
        ..Default::default()
    });
    let lora = terse_train::planning::plan(&c, &shape, target);
    println!("{}", lora.table());
    assert!(lora.fits(), "{}", lora.table());
    let mb = lora.max_micro_batch_tokens.expect("largest micro-batch");
    println!(
        "full {:.1} GB, LoRA r64 {:.1} GB, largest micro-batch {mb} tokens",
        full.total as f64 / 1e9,
        lora.total as f64 / 1e9
    );
    assert!(mb >= c.grpo.micro_batch_tokens as u64, "{mb}");
}
