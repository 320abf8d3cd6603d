//! Configs terse builds itself rather than reads: the built-in shapes by HF name (Qwen3 and
//! Qwen2 sizes, for the memory plan and the benchmarks' random weights), a synthetic shape from
//! a handful of numbers (benches, tests), and a shape's Qwen2-architecture twin. Each goes
//! through `Config::from_json`, so it is validated like a file.

use super::Config;
use candle_core::Result;

impl Config {
    /// Builds a config from the handful of numbers that define a Qwen3 shape (benches, tests).
    #[allow(clippy::too_many_arguments)]
    pub fn synthetic(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
        head_dim: usize,
        tie_word_embeddings: bool,
    ) -> Result<Self> {
        Self::from_json(serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": tie_word_embeddings,
            "max_position_embeddings": 40960,
            "attention_bias": false,
            "use_sliding_window": false,
            "dtype": "float32",
        }))
    }

    /// The same shape as a Qwen2-architecture model (q/k/v biases, no q/k norm; head_dim kept,
    /// which transformers' Qwen2 reads too): tests and benches of both architectures.
    pub fn as_qwen2(&self) -> Result<Self> {
        let mut raw = self.raw.clone();
        raw["model_type"] = "qwen2".into();
        raw["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        Self::from_json(raw)
    }

    /// The shape of Qwen3-0.6B (random weights are used for benchmarks).
    pub fn qwen3_0_6b() -> Self {
        Self::qwen3_named("Qwen3-0.6B").expect("a built-in shape")
    }

    /// The shape of a Qwen3 size by its HF name (Qwen3-0.6B, -1.7B, -4B, -8B; any case), from
    /// the HF configs: memory plans of runs whose weights are not downloaded yet.
    pub fn qwen3_named(name: &str) -> Option<Self> {
        // (vocab, hidden, intermediate, layers, heads, kv heads, head_dim, tied)
        let (v, h, i, l, hq, hkv, d, tied) = match name.to_lowercase().as_str() {
            "qwen3-0.6b" => (151_936, 1024, 3072, 28, 16, 8, 128, true),
            "qwen3-1.7b" => (151_936, 2048, 6144, 28, 16, 8, 128, true),
            "qwen3-4b" => (151_936, 2560, 9728, 36, 32, 8, 128, true),
            "qwen3-8b" => (151_936, 4096, 12288, 36, 32, 8, 128, false),
            _ => return None,
        };
        Self::synthetic(v, h, i, l, hq, hkv, d, tied).ok()
    }

    /// The shape of a Qwen2-architecture model by its HF name (the Short-RL papers' bases:
    /// Qwen2.5-7B and DeepSeek-R1-Distill-Qwen-1.5B, -7B; Qwen2.5-0.5B, -1.5B; any case).
    pub fn qwen2_named(name: &str) -> Option<Self> {
        // (vocab, hidden, intermediate, layers, heads, kv heads, tied, rope θ)
        let (v, h, i, l, hq, hkv, tied, theta) = match name.to_lowercase().as_str() {
            "qwen2.5-0.5b" | "qwen2.5-0.5b-instruct" => (151_936, 896, 4864, 24, 14, 2, true, 1e6),
            "qwen2.5-1.5b" | "qwen2.5-1.5b-instruct" => (151_936, 1536, 8960, 28, 12, 2, true, 1e6),
            "qwen2.5-7b" | "qwen2.5-7b-instruct" => (152_064, 3584, 18944, 28, 28, 4, false, 1e6),
            "deepseek-r1-distill-qwen-1.5b" => (151_936, 1536, 8960, 28, 12, 2, false, 1e4),
            "deepseek-r1-distill-qwen-7b" => (152_064, 3584, 18944, 28, 28, 4, false, 1e4),
            _ => return None,
        };
        Self::from_json(serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": v,
            "hidden_size": h,
            "intermediate_size": i,
            "num_hidden_layers": l,
            "num_attention_heads": hq,
            "num_key_value_heads": hkv,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": theta,
            "tie_word_embeddings": tied,
            "max_position_embeddings": 131072,
            "use_sliding_window": false,
            "dtype": "bfloat16",
        }))
        .ok()
    }

    /// A built-in shape by HF name, Qwen3 or Qwen2 (`qwen3_named`, `qwen2_named`).
    pub fn named(name: &str) -> Option<Self> {
        Self::qwen3_named(name).or_else(|| Self::qwen2_named(name))
    }
}
