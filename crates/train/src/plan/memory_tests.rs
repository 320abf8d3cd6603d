//! The memory plan's tests (memory.rs): activations, the budget search, kept layers, percent
//! budgets, model shapes and absurd sizes.

use super::*;

fn target(cuda: bool, gb: Option<f64>) -> Target {
    Target {
        cuda,
        device_bytes: gb.map(|g| (g * (1u64 << 30) as f64) as u64),
        device_total: gb.map(|g| (g * (1u64 << 30) as f64) as u64),
        gpus: 1,
        prompt_tokens: 512,
    }
}

fn component(p: &Plan, name: &str) -> u64 {
    p.components
        .iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.bytes)
}

/// Issue 57 item 5: with "auto" on a GPU the plan keeps the last layers' forward state in
/// the memory left, every layer on an H200 at 16k tokens, some on 24 GB, none with "on"
/// or on the CPU; and the total with them still fits.
#[test]
fn the_plan_keeps_what_fits_of_the_last_layers() {
    let c = Config::qwen3_0_6b();
    let mut cfg = RunConfig::default();
    cfg.grpo.micro_batch_tokens = 16384;
    cfg.grpo.prompts_per_step = 4;
    cfg.grpo.group_size = 4;
    let per = terse_model::keep::layer_state_bytes_per_token(&c, 2) * 16384;
    let p = plan(&cfg, &c, target(true, Some(141.0)));
    assert_eq!(p.kept_layers, 28, "{}", p.table());
    assert_eq!(component(&p, "kept layer states"), 28 * per);
    assert!(p.fits(), "{}", p.table());
    let p = plan(&cfg, &c, target(true, Some(24.0)));
    assert!(p.kept_layers > 0 && p.kept_layers < 28, "{}", p.table());
    assert!(p.fits(), "{}", p.table());
    // One more layer would not fit.
    assert!(
        p.total + per > p.device_bytes.expect("device"),
        "{}",
        p.table()
    );
    assert_eq!(plan(&cfg, &c, target(false, Some(141.0))).kept_layers, 0);
    cfg.model.checkpoint_layers = crate::config::Toggle::On;
    assert_eq!(plan(&cfg, &c, target(true, Some(141.0))).kept_layers, 0);
}

/// The decode graphs' memory: on CUDA only, the buckets up to the rows that run at once (the
/// rollout's rows, at most paging.max_num_seqs), each at its step's peak per row, which is
/// worked out here by hand for Qwen3-0.6B in bf16.
#[test]
fn the_plan_counts_the_decode_graphs_buckets() {
    let c = Config::qwen3_0_6b();
    // Logits in bf16 and f32 (151,936 x 6), flash-decoding's partials (16 heads x 32 splits
    // x 130 f32), one layer's activations ((6 x 1024 + 64 x 128 + 3 x 3072) bf16), the draw.
    let per_row = 151_936 * 6 + 16 * 32 * 130 * 4 + (6 * 1024 + 64 * 128 + 3 * 3072) * 2 + 16;
    assert_eq!(per_row, 1_224_976);
    let mut cfg = RunConfig::default();
    cfg.grpo.prompts_per_step = 3;
    cfg.grpo.group_size = 4;
    // 12 rows: buckets 1 to 16, 31 rows in all.
    let p = plan(&cfg, &c, target(true, Some(80.0)));
    assert_eq!(
        component(&p, "decode graphs"),
        31 * per_row,
        "{}",
        p.table()
    );
    assert_eq!(
        component(&plan(&cfg, &c, target(false, Some(80.0))), "decode graphs"),
        0
    );
    // More rows than run at once: max_num_seqs's buckets.
    cfg.grpo.prompts_per_step = 128;
    cfg.grpo.paging.max_num_seqs = 200;
    let p = plan(&cfg, &c, target(true, Some(80.0)));
    assert_eq!(
        component(&p, "decode graphs"),
        511 * per_row,
        "{}",
        p.table()
    );
}

#[test]
fn activations_are_linear_with_checkpointing_and_the_budget_search_is_exact() {
    let c = Config::qwen3_0_6b();
    let a1 = activation_bytes(&c, 1024, 2, true);
    let a16 = activation_bytes(&c, 16 * 1024, 2, true);
    assert!(
        (a16 as f64 / a1 as f64 - 16.0).abs() < 1e-6,
        "linear in tokens"
    );
    assert!(activation_bytes(&c, 8192, 2, false) > 5 * activation_bytes(&c, 8192, 2, true));
    let mut cfg = RunConfig::default();
    cfg.grpo.micro_batch_tokens = 16384;
    cfg.grpo.prompts_per_step = 4;
    cfg.grpo.group_size = 4;
    let p = plan(&cfg, &c, target(true, Some(80.0)));
    assert!(p.checkpointing && p.fits(), "{}", p.table());
    // The largest budget fits and one more token does not (with every layer recomputed:
    // kept layer states only take what is left).
    let t = p.max_micro_batch_tokens.expect("max");
    let kept = component(&p, "kept layer states");
    let rest = p.total - kept - activation_bytes(&c, 16384, 2, true);
    let d = p.device_bytes.expect("device");
    assert!(rest + activation_bytes(&c, t, 2, true) <= d);
    assert!(rest + activation_bytes(&c, t + 1, 2, true) > d);
    // A paper-sized rollout (256 x 16 x 6k) fits with the paged cache's budget, and not
    // with a budget that asks for more than the device has.
    cfg.grpo.prompts_per_step = 256;
    cfg.grpo.group_size = 16;
    cfg.grpo.max_new_tokens = 6144;
    let p = plan(&cfg, &c, target(true, Some(141.0)));
    assert!(p.fits(), "{}", p.table());
    assert!(p.table().contains("all at once"), "{}", p.table());
    cfg.grpo.paging.kv_budget = terse_rollout::KvBudget::Gib(400.0);
    let p = plan(&cfg, &c, target(true, Some(141.0)));
    assert!(
        !p.fits() && p.table().contains("does NOT fit"),
        "{}",
        p.table()
    );
}

/// Fuzzing (terse-fuzz, target config): sizes a config multiplies (prompts x group x
/// tokens, the micro-batch budget, the LoRA rank) hung the plan (4e11 prompts summed one by
/// one) or overflowed; the plan is immediate and fits no device.
#[test]
fn absurd_config_sizes_plan_as_not_fitting_instead_of_hanging_or_overflowing() {
    let mut cfg = RunConfig::default();
    cfg.grpo.prompts_per_step = 429_496_729_612;
    cfg.grpo.group_size = usize::MAX;
    cfg.grpo.max_new_tokens = usize::MAX;
    cfg.grpo.micro_batch_tokens = usize::MAX;
    cfg.grpo.paging.block_size = 1;
    // Rows at once past 2^63: the decode graphs' buckets saturate too.
    cfg.grpo.paging.max_num_seqs = usize::MAX;
    let started = std::time::Instant::now();
    let p = plan(&cfg, &Config::qwen3_0_6b(), target(true, Some(80.0)));
    assert!(!p.fits(), "{}", p.table());
    cfg.model.lora = Some(crate::config::LoraSection {
        rank: usize::MAX,
        ..Default::default()
    });
    assert!(!plan(&cfg, &Config::qwen3_0_6b(), target(true, Some(80.0))).fits());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn shapes_come_from_the_config_json_or_the_directory_name() {
    let mut cfg = RunConfig::default();
    cfg.model.path = "models/Qwen3-4B".into();
    let c = model_shape(&cfg).expect("known size");
    assert_eq!((c.num_hidden_layers, c.hidden_size), (36, 2560));
    cfg.model.path = "models/nope".into();
    let e = model_shape(&cfg).expect_err("unknown");
    assert!(e.to_string().contains("models/nope/config.json"), "{e}");
}

/// Issue 37 item 3: the plan counts a "25%" budget as the rollout's pool does: a quarter of
/// the device's total memory, not of what is free at start-up.
#[test]
fn item3_the_plan_and_the_pool_read_a_percent_budget_alike() {
    let mut cfg = RunConfig::default();
    cfg.grpo.prompts_per_step = 256;
    cfg.grpo.group_size = 16;
    cfg.grpo.max_new_tokens = 6144;
    cfg.grpo.paging.kv_budget = terse_rollout::KvBudget::Fraction(0.25);
    let c = Config::qwen3_0_6b();
    let gib = 1u64 << 30;
    let t = Target {
        cuda: true,
        device_bytes: Some(40 * gib),
        device_total: Some(140 * gib),
        gpus: 1,
        prompt_tokens: 512,
    };
    let p = plan(&cfg, &c, t);
    let kv = p
        .components
        .iter()
        .find(|x| x.name.starts_with("rollout KV"))
        .expect("kv line");
    let block_bytes = 2
        * (c.num_hidden_layers * c.num_key_value_heads * c.head_dim) as u64
        * 2
        * cfg.grpo.paging.block_size as u64;
    let mem = terse_rollout::paging::BudgetMemory::device(40 * gib, 140 * gib);
    let pool = terse_rollout::paging::budget_blocks(
        cfg.grpo.paging.kv_budget,
        block_bytes as usize,
        Some(mem),
    )
    .expect("blocks") as u64;
    assert_eq!(kv.bytes, pool * block_bytes, "{}", p.table());
    assert!(kv.bytes > 34 * gib, "a quarter of 140 GiB: {}", p.table());
}
