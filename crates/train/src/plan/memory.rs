//! The memory plan of a run (`cargo xtask plan`, and `xtask train` before it loads anything
//! on a GPU): every component a step holds, from the model shape and the run config, whether
//! the total fits the device, and the largest micro-batch token budget that does.
//!
//! The activation figures count what the training graph keeps: per decoder layer and token,
//! about 10 hidden-sized, 10.5 query-sized, 10.5 KV-sized and 4 MLP-sized values (the norms',
//! projections', RoPE's and the SwiGLU's intermediates; with flash attention nothing
//! T x T), plus one such layer of gradients in flight during the backward. Layer checkpointing
//! keeps (layers + 1) hidden-sized inputs and two layers' working sets instead.
//! `bench train-memory` prints this estimate beside the measured peak.

use crate::config::RunConfig;
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use terse_model::Config;

/// Where the run will live: bytes per compute value, whether checkpointing is on, the
/// device memory (None: unknown), the world size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub cuda: bool,
    /// The memory the run may use (free memory at start-up; `xtask plan`: the device's size).
    pub device_bytes: Option<u64>,
    /// The device's size, what a `kv_budget = "N%"` is a share of.
    pub device_total: Option<u64>,
    pub gpus: usize,
    /// Prompt tokens the rollout plans for (the config does not bound prompts).
    pub prompt_tokens: usize,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Component {
    pub name: String,
    pub bytes: u64,
    pub note: String,
}

/// The plan: components, their total, and the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub components: Vec<Component>,
    pub total: u64,
    pub device_bytes: Option<u64>,
    /// The largest `grpo.micro_batch_tokens` whose activations fit beside everything else.
    pub max_micro_batch_tokens: Option<u64>,
    pub checkpointing: bool,
    /// The last layers whose forward state fits beside everything else, kept rather than
    /// recomputed (CUDA, `model.checkpoint_layers = "auto"`).
    pub kept_layers: usize,
}

impl Plan {
    pub fn fits(&self) -> bool {
        self.device_bytes.is_none_or(|d| self.total <= d)
    }

    /// The plan as a table, one component per line.
    pub fn table(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut s = String::new();
        for c in &self.components {
            let _ = writeln!(s, "  {:<34} {:>10.2} GiB  {}", c.name, gib(c.bytes), c.note);
        }
        let _ = writeln!(s, "  {:<34} {:>10.2} GiB", "total", gib(self.total));
        match self.device_bytes {
            Some(d) => {
                let verdict = if self.fits() { "fits" } else { "does NOT fit" };
                let _ = writeln!(s, "  device: {:.2} GiB per GPU -> {verdict}", gib(d));
            }
            None => {
                let _ = writeln!(s, "  device memory unknown (pass --gpu-mem)");
            }
        }
        match self.max_micro_batch_tokens {
            Some(0) => {
                let _ = writeln!(s, "  no micro-batch fits beside the rest");
            }
            Some(t) => {
                let _ = writeln!(s, "  largest grpo.micro_batch_tokens that fits: {t}");
            }
            None => {}
        }
        s
    }
}

/// Per decoder layer and token, the values the training graph keeps (see the module docs).
fn layer_values_per_token(c: &Config) -> f64 {
    let (h, q, kv, i) = (
        c.hidden_size as f64,
        (c.num_attention_heads * c.head_dim) as f64,
        (c.num_key_value_heads * c.head_dim) as f64,
        c.intermediate_size as f64,
    );
    10.0 * h + 10.5 * q + 10.5 * kv + 4.0 * i
}

/// Activation bytes of one micro-batch of `tokens` tokens.
pub fn activation_bytes(c: &Config, tokens: u64, value_bytes: u64, checkpointing: bool) -> u64 {
    let layer = layer_values_per_token(c) * value_bytes as f64 * tokens as f64;
    let hidden = c.hidden_size as f64 * tokens as f64 * value_bytes as f64;
    let l = c.num_hidden_layers as f64;
    let kept = if checkpointing {
        (l + 1.0) * hidden + 2.0 * layer
    } else {
        l * layer + layer
    };
    // The embedding output and the final norm's intermediates (`as` saturates: a micro-batch
    // budget beyond u64 bytes plans as u64::MAX, which fits no device).
    (kept + 4.0 * hidden) as u64
}

/// The weights, the optimizer state, the gradients and the KL reference: every weight trained,
/// or with LoRA the adapters alone beside the frozen base; and the rollout's copy in the compute
/// dtype (merged with LoRA).
fn weights(
    cfg: &RunConfig,
    c: &Config,
    t: Target,
    checkpointing: bool,
    add: &mut dyn FnMut(&str, u64, String),
) {
    let params = c.num_parameters() as u64;
    let g = &cfg.grpo;
    let world = t.gpus.max(1) as u64;
    let value = if t.cuda { 2 } else { 4 };
    let shard = |b: u64| b.div_ceil(world);
    let sharded = if world > 1 {
        format!(", 1/{world} per GPU (ZeRO-2)")
    } else {
        String::new()
    };
    // What the optimizer trains: every weight, or with LoRA the adapters alone.
    let lora = cfg.model.lora.as_ref().and_then(|l| l.to_config().ok());
    let trained = match &lora {
        Some(l) => {
            let n = l.parameters(c) as u64;
            add(
                "frozen base weights",
                params * value,
                format!("{params} parameters in the compute dtype (LoRA), on every GPU"),
            );
            add(
                "LoRA merged rollout copy",
                params * value,
                "base + adapters, made once per step for the rollout".into(),
            );
            // One layer's merged weights and their gradient in the backward (f32), two with
            // checkpointing (the recomputed layer and the next).
            let layer: u64 = c
                .expected_tensors()
                .iter()
                .filter(|(k, _)| k.starts_with("model.layers.0.") && k.ends_with("_proj.weight"))
                .map(|(_, s)| (s[0] * s[1]) as u64)
                .sum();
            add(
                "LoRA merge transients",
                layer * 8 * if checkpointing { 2 } else { 1 },
                "a layer's W + (α/r)·BA and its gradient, f32".into(),
            );
            n
        }
        None => params,
    };
    let what = ["parameter", "adapter"][usize::from(lora.is_some())];
    add(
        "f32 master weights",
        shard(trained.saturating_mul(4)),
        format!("{trained} {what}s{sharded}"),
    );
    if t.cuda && lora.is_none() {
        add(
            "bf16 compute weights",
            params * 2,
            "the forward's copy, kept for the backward".into(),
        );
        add(
            "bf16 rollout copy",
            params * 2,
            "the master weights cast once per step for the rollout".into(),
        );
    }
    add(
        "AdamW moments",
        shard(trained.saturating_mul(8)),
        format!("two f32 per {what}{sharded}"),
    );
    add(
        "f32 gradients",
        shard(trained.saturating_mul(4)).saturating_add(trained.saturating_mul(4)),
        format!("accumulated{sharded}, and one micro-batch's in flight"),
    );
    if crate::load::needs_reference(cfg) {
        add(
            "KL reference model",
            params * 4,
            format!("kl_coef {}", g.kl_coef),
        );
    }
}

/// The plan of `cfg` for model shape `c` on `t`.
pub fn plan(cfg: &RunConfig, c: &Config, t: Target) -> Plan {
    let g = &cfg.grpo;
    let world = t.gpus.max(1) as u64;
    let value = if t.cuda { 2 } else { 4 };
    let checkpointing = cfg.model.forward_options_for(t.cuda).checkpoint_layers;
    let mut comps = vec![];
    let mut add = |name: &str, bytes: u64, note: String| {
        comps.push(Component {
            name: name.into(),
            bytes,
            note,
        });
    };
    weights(cfg, c, t, checkpointing, &mut add);
    let mb = g.micro_batch_tokens as u64;
    let act = activation_bytes(c, mb, value, checkpointing);
    add(
        "activations",
        act,
        format!(
            "{mb} tokens, {}; without checkpointing {:.2} GiB",
            if checkpointing {
                "checkpointed"
            } else {
                "not checkpointed"
            },
            activation_bytes(c, mb, value, false) as f64 / (1u64 << 30) as f64
        ),
    );
    let chunk = terse_model::logprob::DEFAULT_CHUNK_ROWS as u64;
    add(
        "log-prob chunks",
        3 * chunk * c.vocab_size as u64 * 4,
        format!("{chunk} rows x vocabulary {}, f32", c.vocab_size),
    );
    // The rollout's paged KV pool: each prompt stored once and shared by its samples, each
    // sample's completion (and its copy of the prompt's partial last block) on top; the pool is
    // the budget, capped at that worst case. "auto" sizes it from the memory left at rollout
    // time, so the plan counts what one sequence needs (the scheduler runs fewer at once, never
    // out of memory).
    let prompts = (g.prompts_per_step as u64).div_ceil(world);
    // Sizes multiply config numbers: saturating, so a config beyond u64 bytes plans as one
    // that fits no device (fuzzing found the overflows) instead of panicking.
    let rows = prompts.saturating_mul(g.group_size as u64);
    let kv_value = match g.kv_cache {
        terse_rollout::KvCacheDtype::F16 => 2,
        terse_rollout::KvCacheDtype::Model => value,
    };
    let per_token =
        2 * (c.num_hidden_layers * c.num_key_value_heads * c.head_dim) as u64 * kv_value;
    let block = g.paging.block_size as u64;
    let pt = t.prompt_tokens as u64;
    // The scheduler's own figures (terse_rollout::paging::PoolPlan), Step-GRPO's exit tokens
    // and probe blocks included. Every prompt plans the same blocks, so one prompt's count
    // times the prompts (summing them one by one ran for hours on a fuzzed prompts_per_step
    // of 4e11).
    let pool_plan = terse_rollout::paging::PoolPlan::new(
        [(
            t.prompt_tokens,
            usize::try_from(prompts).unwrap_or(usize::MAX),
        )],
        g.group_size,
        g.max_new_tokens,
        g.step_exit().as_ref(),
        c.max_position_embeddings,
        g.paging.block_size,
    );
    let (worst, one) = (pool_plan.worst as u64, pool_plan.one as u64);
    let block_bytes = block.saturating_mul(per_token);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    // The rollout's own conversion (paging::budget_blocks); "auto" is what is left then.
    let mem = t.device_total.map(|total| {
        terse_rollout::paging::BudgetMemory::device(t.device_bytes.unwrap_or(total), total)
    });
    let budget = match g.paging.kv_budget {
        terse_rollout::KvBudget::Auto => None,
        b => terse_rollout::paging::budget_blocks(b, block_bytes as usize, mem).map(|n| n as u64),
    };
    let pool = budget.map_or(one, |b| b.min(worst));
    add(
        "rollout KV cache (paged)",
        pool.saturating_mul(block_bytes),
        format!(
            "{rows} sequences x (prompt {pt} shared + {} new){}; all at once {:.2} GiB; budget {}{}",
            g.max_new_tokens,
            match pool_plan.probe_blocks {
                0 => String::new(),
                n => format!(", {n} blocks kept for a probe"),
            },
            gib(worst.saturating_mul(block_bytes)),
            match budget {
                None => "auto: the memory left at rollout time (counted here: one sequence)".into(),
                Some(b) => format!("{:.2} GiB", gib(b.saturating_mul(block_bytes))),
            },
            if pool < one {
                " -- below one sequence: the rollout will refuse it"
            } else {
                ""
            }
        ),
    );
    if t.cuda {
        // The rollout's decode graphs, one per bucket of at most max_num_seqs rows at once.
        let most = g
            .paging
            .max_num_seqs
            .min(usize::try_from(rows).unwrap_or(usize::MAX));
        add(
            "decode graphs",
            terse_model::paged::decode_graph_bytes(c, most, value as usize),
            match most.checked_next_power_of_two() {
                Some(b) => format!("buckets up to {b} rows, each holding its step's peak (logits, attention partials, a layer)"),
                None => format!("{most} rows at once: past any bucket"),
            },
        );
    }
    let total = comps.iter().fold(0u64, |t, x| t.saturating_add(x.bytes));
    // Activations are linear in the token budget: the largest budget that fits is where the
    // rest plus activation(T) meets the device.
    let max_micro_batch_tokens = t.device_bytes.map(|d| {
        let rest = total - act;
        let (mut lo, mut hi) = (0u64, 1u64 << 24);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if rest.saturating_add(activation_bytes(c, mid, value, checkpointing)) <= d {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    });
    // Written out on CUDA ("auto"), the last layers keep their forward state where the memory
    // left holds it (terse_model::keep, the function the step calls with its free memory).
    let keeps = cfg.model.forward_options_for(t.cuda).keep_layers == terse_model::KeepLayers::Auto;
    let mut total = total;
    let kept_layers = match t.device_bytes {
        Some(d) if checkpointing && t.cuda && keeps => {
            let per_layer =
                terse_model::keep::layer_state_bytes_per_token(c, value).saturating_mul(mb);
            let k = terse_model::keep::kept_layers(d, total, per_layer, c.num_hidden_layers);
            let bytes = per_layer.saturating_mul(k as u64);
            comps.push(Component {
                name: "kept layer states".into(),
                bytes,
                note: format!(
                    "the last {k} of {} layers skip their recompute ({:.2} GiB a layer); the step decides from its free memory",
                    c.num_hidden_layers,
                    per_layer as f64 / (1u64 << 30) as f64
                ),
            });
            total = total.saturating_add(bytes);
            k
        }
        _ => 0,
    };
    Plan {
        components: comps,
        total,
        device_bytes: t.device_bytes,
        max_micro_batch_tokens,
        checkpointing,
        kept_layers,
    }
}

/// Before a GPU run loads anything: the plan against the device's free memory; a run that
/// cannot fit stops here, the table in the log and one line naming the totals. Returns the
/// plan's total.
pub fn check_device(cfg: &RunConfig, prompt_tokens: usize, free: u64, total: u64) -> Result<u64> {
    let shape = model_shape(cfg)?;
    let target = Target {
        cuda: true,
        device_bytes: Some(free),
        device_total: Some(total),
        gpus: 1,
        prompt_tokens,
    };
    let p = plan(cfg, &shape, target);
    if p.fits() {
        tracing::info!("memory plan:\n{}", p.table());
        return Ok(p.total);
    }
    tracing::error!("memory plan of {}:\n{}", cfg.run.name, p.table());
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    bail!(
        "the run needs {:.1} GiB but the GPU has {:.1} GiB free (the plan above; `cargo xtask plan` prints it too)",
        gib(p.total),
        gib(free)
    )
}

/// The model shape of a run: `<model.path>/config.json`, or, where that file is absent (a
/// paper config before its weights are downloaded), the Qwen3 or Qwen2 model the directory is
/// named after.
pub fn model_shape(cfg: &RunConfig) -> Result<Config> {
    let path = cfg.model.path.join("config.json");
    if path.is_file() {
        return Config::from_file(&path).with_context(|| path.display().to_string());
    }
    let name = cfg
        .model
        .path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    Config::named(&name).with_context(|| {
        format!(
            "{} does not exist and `{name}` is not a known model (qwen3-0.6b, -1.7b, -4b, -8b; qwen2.5-0.5b, -1.5b, -7b; deepseek-r1-distill-qwen-1.5b, -7b)",
            path.display()
        )
    })
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
