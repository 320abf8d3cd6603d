//! How many decoder layers a checkpointed training step keeps instead of recomputing: what one
//! layer's kept state costs (`layer_grad.rs`'s `Saved`), what the rest of the step still needs,
//! and the decision from the device's free memory. A pure function of those numbers, so the
//! memory plan (crates/train/src/plan/memory.rs, `cargo xtask plan`) prints the same decision the
//! step makes.
//!
//! Data flow: `Qwen3::logprob_backward` (backward.rs) at a step's start -> `kept_layers` with
//! the device's free memory -> the last k layers keep their `Saved`, the rest recompute.

use super::KeepLayers;
use crate::Config;

/// Bytes one layer's kept forward state holds per token beyond its input and output (which the
/// checkpointed step keeps anyway): the norms' outputs and the residual (3 H), q, its RoPE and
/// the attention rows (3 Hq D), k, its RoPE and v (3 Hkv D), the gate, up and SwiGLU (3 I), in
/// the compute dtype of `value_bytes`; and flash attention's f32 output and log-sum-exp.
pub fn layer_state_bytes_per_token(c: &Config, value_bytes: u64) -> u64 {
    let (h, i) = (c.hidden_size as u64, c.intermediate_size as u64);
    let q = (c.num_attention_heads * c.head_dim) as u64;
    let kv = (c.num_key_value_heads * c.head_dim) as u64;
    value_bytes * (3 * h + 3 * q + 3 * kv + 3 * i) + 4 * (q + c.num_attention_heads as u64)
}

/// What the rest of a step of `tokens` tokens needs beside kept layers, in bytes: the
/// checkpointed inputs (layers + 1 hidden rows a token), three layers' working sets (the one
/// being built or differentiated and its flash buffers), the log-prob head (the weight in the
/// compute dtype, its f32 gradient, two chunks of logits), every parameter's gradient in the
/// master's `master_bytes`, and a sixteenth of the device (`total`) against fragmentation.
pub fn step_reserve_bytes(
    c: &Config,
    tokens: u64,
    value_bytes: u64,
    master_bytes: u64,
    total: u64,
) -> u64 {
    let (h, v, l) = (
        c.hidden_size as u64,
        c.vocab_size as u64,
        c.num_hidden_layers as u64,
    );
    // Saturating: a fuzzed shape or token count plans as a reserve no device has.
    let layer = layer_state_bytes_per_token(c, value_bytes).saturating_mul(tokens);
    let chunk = crate::logprob::DEFAULT_CHUNK_ROWS as u64;
    let head = (v * h * (value_bytes + 4)).saturating_add(2 * chunk * v * value_bytes);
    let inputs = ((l + 1) * h * value_bytes).saturating_mul(tokens);
    let grads = (c.num_parameters() as u64).saturating_mul(master_bytes);
    [
        inputs,
        layer.saturating_mul(3),
        head,
        grads,
        (total / 16).max(256 << 20),
    ]
    .into_iter()
    .fold(0u64, u64::saturating_add)
}

/// The layers to keep (from the last) out of `layers`, each costing `per_layer` bytes, when
/// `free` bytes are free and the rest of the step needs `reserve`.
pub fn kept_layers(free: u64, reserve: u64, per_layer: u64, layers: usize) -> usize {
    match free.checked_sub(reserve) {
        Some(room) if per_layer > 0 => (room / per_layer).min(layers as u64) as usize,
        Some(_) => layers,
        None => 0,
    }
}

/// The count a step keeps under `keep`: `Count` as given (at most `layers`), `Auto` from the
/// device's memory (`free`, `total`; none without them: the CPU, or a device that cannot say).
pub(crate) fn resolve(
    keep: KeepLayers,
    c: &Config,
    tokens: u64,
    value_bytes: u64,
    master_bytes: u64,
    memory: Option<(u64, u64)>,
) -> usize {
    let layers = c.num_hidden_layers;
    match (keep, memory) {
        (KeepLayers::Count(k), _) => k.min(layers),
        (KeepLayers::Auto, None) => 0,
        (KeepLayers::Auto, Some((free, total))) => kept_layers(
            free,
            step_reserve_bytes(c, tokens, value_bytes, master_bytes, total),
            layer_state_bytes_per_token(c, value_bytes).saturating_mul(tokens),
            layers,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_fills_the_room_and_no_more() {
        assert_eq!(kept_layers(100, 40, 20, 28), 3);
        assert_eq!(kept_layers(100, 40, 20, 2), 2);
        assert_eq!(kept_layers(30, 40, 20, 28), 0);
        assert_eq!(kept_layers(40, 40, 20, 28), 0);
        assert_eq!(kept_layers(u64::MAX, 0, 1, 28), 28);
    }

    #[test]
    fn a_qwen3_0_6b_step_of_16k_tokens_keeps_every_layer_on_141_gb_and_some_on_24() {
        let c = Config::named("qwen3-0.6b").expect("shape");
        let per = layer_state_bytes_per_token(&c, 2);
        // 3 x 1024 + 3 x 2048 + 3 x 1024 + 3 x 3072 values of 2 bytes, and 4 x (2048 + 16).
        assert_eq!(
            per,
            2 * (3 * 1024 + 3 * 2048 + 3 * 1024 + 3 * 3072) + 4 * (2048 + 16)
        );
        let gib = 1u64 << 30;
        let keep = |free: u64| {
            resolve(
                KeepLayers::Auto,
                &c,
                16_384,
                2,
                4,
                Some((free * gib, free * gib)),
            )
        };
        assert_eq!(keep(141), 28);
        let some = keep(24);
        assert!(some > 0 && some < 28, "{some}");
        assert_eq!(keep(4), 0);
        assert_eq!(resolve(KeepLayers::Auto, &c, 16_384, 2, 4, None), 0);
        assert_eq!(resolve(KeepLayers::Count(99), &c, 16_384, 2, 4, None), 28);
    }
}
