//! The step-time estimate of a run (`cargo xtask plan`, beside the memory plan): how long one
//! GRPO step should take on N H200s, from the model shape and the config. Estimates, not
//! measurements, and labelled so wherever they are printed: the rollout at the HBM roofline
//! (every decode step reads every weight once and each running sequence's KV cache so far),
//! the matmuls at a stated cuBLAS efficiency, attention at the FlashAttention-2 kernels'
//! estimate (`cargo xtask kernel-model`, docs/gpu.md). Every sample is assumed to run to `max_new_tokens`, so the
//! figures are upper bounds of a step's length; gpu-check measures the pieces.

use crate::config::RunConfig;
use std::fmt::Write as _;
use terse_model::Config;

/// The assumptions, one place (an H200 SXM).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assumptions {
    /// Dense bf16 tensor-core peak, FLOP/s.
    pub peak_flops: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// The fraction of peak the linear layers' matmuls reach (cuBLAS).
    pub matmul_efficiency: f64,
    /// The fractions of peak flash attention's forward and backward reach: `cargo xtask
    /// kernel-model`'s roofline for kernels/flash_fa2.cu and flash_fa2_bwd.cu at head size 128
    /// (deterministic dQ), an upper bound (latency and occupancy are not modelled).
    pub flash_fwd_efficiency: f64,
    pub flash_bwd_efficiency: f64,
    /// The fraction of the HBM roofline decode reaches.
    pub decode_efficiency: f64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Self {
            peak_flops: 989e12,
            hbm_bytes_per_s: 4.8e12,
            matmul_efficiency: 0.6,
            flash_fwd_efficiency: 0.31,
            flash_bwd_efficiency: 0.42,
            decode_efficiency: 0.7,
        }
    }
}

/// One step's estimated seconds per GPU, by phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    pub rollout_s: f64,
    /// The KL reference's log-probs (0 without a KL term).
    pub reference_s: f64,
    pub train_s: f64,
}

impl StepTime {
    pub fn total_s(&self) -> f64 {
        self.rollout_s + self.reference_s + self.train_s
    }

    /// The estimate as lines of text, labelled as one.
    pub fn table(&self, a: &Assumptions) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  step time (ESTIMATE, not measured; H200: {:.0} TFLOP/s bf16, {:.1} TB/s HBM):",
            a.peak_flops / 1e12,
            a.hbm_bytes_per_s / 1e12
        );
        let _ = writeln!(
            s,
            "    rollout   {:>9.1} s  (decode at {:.0} % of the HBM roofline, every sample to max_new_tokens)",
            self.rollout_s,
            100.0 * a.decode_efficiency
        );
        let _ = writeln!(
            s,
            "    reference {:>9.1} s  (KL log-probs)",
            self.reference_s
        );
        let _ = writeln!(
            s,
            "    training  {:>9.1} s  (matmuls at {:.0} % of peak, flash attention at {:.0} % / {:.0} %)",
            self.train_s,
            100.0 * a.matmul_efficiency,
            100.0 * a.flash_fwd_efficiency,
            100.0 * a.flash_bwd_efficiency
        );
        let _ = writeln!(s, "    total     {:>9.1} s per step", self.total_s());
        s
    }
}

/// Attention FLOPs of one causal forward over a sequence of `len` tokens, every layer: QK^T and
/// PV, 2 x 2 x d x Hq per (query, key) pair, half the pairs.
fn attention_fwd_flops(c: &Config, len: f64) -> f64 {
    4.0 * (c.num_attention_heads * c.head_dim) as f64 * len * len / 2.0 * c.num_hidden_layers as f64
}

/// The estimate for `cfg` on `gpus` data-parallel GPUs with prompts of `prompt_tokens`.
pub fn estimate(
    cfg: &RunConfig,
    c: &Config,
    gpus: usize,
    prompt_tokens: usize,
    a: &Assumptions,
) -> StepTime {
    let g = &cfg.grpo;
    let params = c.num_parameters() as f64;
    let seqs = ((g.prompts_per_step * g.group_size) as f64 / gpus.max(1) as f64).ceil();
    let (p, n) = (prompt_tokens as f64, g.max_new_tokens as f64);
    let len = p + n;
    // Rollout: decode steps in waves of at most max_num_seqs sequences; each step reads the
    // weights once and every running sequence's KV so far (half the new tokens on average).
    let per_token_kv =
        2.0 * (c.num_hidden_layers * c.num_key_value_heads * c.head_dim) as f64 * 2.0;
    let running = seqs.min(g.paging.max_num_seqs as f64).max(1.0);
    let waves = (seqs / running).ceil();
    let step_bytes = params * 2.0 + running * (p + n / 2.0) * per_token_kv;
    let decode_s = waves * n * step_bytes / (a.hbm_bytes_per_s * a.decode_efficiency);
    // Prefill: each prompt once (its samples share its blocks).
    let prompts = (g.prompts_per_step as f64 / gpus.max(1) as f64).ceil();
    let prefill_flops = 2.0 * params * p * prompts + attention_fwd_flops(c, p) * prompts;
    let rollout_s = decode_s + prefill_flops / (a.peak_flops * a.matmul_efficiency);
    // Training: every sequence forward and backward (6 x params per token, a recomputed
    // forward with layer checkpointing), attention at the flash estimates, per PPO epoch.
    let tokens = seqs * len;
    let epochs = g.epochs.max(1) as f64;
    let matmul = (6.0 + 2.0) * params * tokens;
    let attn_fwd = attention_fwd_flops(c, len) * seqs;
    let train_one = matmul / (a.peak_flops * a.matmul_efficiency)
        + 2.0 * attn_fwd / (a.peak_flops * a.flash_fwd_efficiency)
        + 2.0 * attn_fwd / (a.peak_flops * a.flash_bwd_efficiency);
    let reference_s = if g.kl_coef > 0.0 {
        2.0 * params * tokens / (a.peak_flops * a.matmul_efficiency)
            + attn_fwd / (a.peak_flops * a.flash_fwd_efficiency)
    } else {
        0.0
    };
    StepTime {
        rollout_s,
        reference_s,
        train_s: train_one * epochs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate scales as it should: data parallelism divides every phase, longer
    /// completions cost more decode, no KL term costs no reference pass.
    #[test]
    fn the_estimate_scales_with_gpus_lengths_and_the_kl_term() {
        let mut cfg = RunConfig::default();
        cfg.grpo.prompts_per_step = 128;
        cfg.grpo.group_size = 16;
        cfg.grpo.max_new_tokens = 4096;
        cfg.grpo.kl_coef = 0.0;
        let c = Config::qwen3_0_6b();
        let a = Assumptions::default();
        let one = estimate(&cfg, &c, 1, 512, &a);
        let eight = estimate(&cfg, &c, 8, 512, &a);
        assert_eq!(one.reference_s, 0.0);
        assert!(
            (one.train_s / eight.train_s - 8.0).abs() < 0.1,
            "{one:?} {eight:?}"
        );
        assert!(eight.rollout_s < one.rollout_s);
        cfg.grpo.max_new_tokens = 8192;
        let longer = estimate(&cfg, &c, 1, 512, &a);
        assert!(longer.rollout_s > 1.9 * one.rollout_s && longer.train_s > 2.0 * one.train_s);
        cfg.grpo.kl_coef = 0.01;
        assert!(estimate(&cfg, &c, 1, 512, &a).reference_s > 0.0);
        let text = one.table(&a);
        assert!(
            text.contains("ESTIMATE") && text.contains("per step"),
            "{text}"
        );
    }
}
