//! Qwen3 and Qwen2 (Qwen2, Qwen2.5, DeepSeek-R1-Distill-Qwen) hyper-parameters read from an HF
//! `config.json`; the first thing loading a checkpoint touches.
//!
//! The raw JSON is kept next to the parsed fields so that saving writes back exactly what
//! transformers wrote (plus the storage dtype), and unsupported features are rejected here, once,
//! instead of silently producing a different model.

mod presets;

use candle_core::Result;
use serde_json::Value;
use std::path::Path;

/// The parsed, validated architecture of a Qwen3ForCausalLM or a Qwen2ForCausalLM. The two
/// differ only in the attention's projections: Qwen2 adds a bias to q, k and v and has no
/// RMSNorm on q and k; Qwen3 the reverse.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Independent of hidden_size / num_attention_heads (Qwen3-0.6B: 1024 / 16 heads, head_dim 128).
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (`model_type = "qwen2"`, or Qwen3's `attention_bias`).
    pub qkv_bias: bool,
    /// RMSNorm over each head of q and k before RoPE (Qwen3; not Qwen2).
    pub qk_norm: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// The file as written by transformers; saving writes it back with only the dtype updated.
    pub raw: Value,
}

fn usize_key(v: &Value, key: &str) -> Result<usize> {
    match v.get(key) {
        Some(x) => match x.as_u64() {
            Some(n) => Ok(n as usize),
            None => crate::fail!("config key `{key}` must be a non-negative integer, got {x}"),
        },
        None => crate::fail!("config is missing required key `{key}`"),
    }
}

fn opt_u32(v: &Value, key: &str) -> Result<Option<u32>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_u64() {
            Some(n) => Ok(Some(n as u32)),
            None => crate::fail!("config key `{key}` must be a token id, got {x}"),
        },
    }
}

/// An optional key: absent or null is `None`; present with the wrong type is an error (a
/// string "1e-2" must not silently become the default).
fn opt_typed<'a, T>(
    v: &'a Value,
    key: &str,
    what: &str,
    get: impl Fn(&'a Value) -> Option<T>,
) -> Result<Option<T>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match get(x) {
            Some(t) => Ok(Some(t)),
            None => crate::fail!("config key `{key}` must be {what}, got {x}"),
        },
    }
}

fn opt_bool(v: &Value, key: &str) -> Result<Option<bool>> {
    opt_typed(v, key, "true or false", Value::as_bool)
}

fn opt_str<'a>(v: &'a Value, key: &str) -> Result<Option<&'a str>> {
    opt_typed(v, key, "a string", Value::as_str)
}

/// Bounds on a config.json, far above any real model (see `Config::validate`).
const MAX_LAYERS: usize = 1024;
const MAX_PARAMETERS: u128 = 1 << 40;

impl Config {
    /// Reads and validates `config.json`; errors name the file and the offending key.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| {
            candle_core::Error::Msg(format!("{}: invalid JSON: {e}", path.display()))
        })?;
        Self::from_json(raw)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Parses an already-loaded config object.
    pub fn from_json(raw: Value) -> Result<Self> {
        if !raw.is_object() {
            crate::fail!("config must be a JSON object");
        }
        let qwen2 = match opt_str(&raw, "model_type")? {
            None | Some("qwen3") => false,
            Some("qwen2") => true,
            Some(mt) => {
                crate::fail!("model_type `{mt}` is not supported (only `qwen3` and `qwen2`)")
            }
        };
        if opt_bool(&raw, "use_sliding_window")? == Some(true) {
            crate::fail!("sliding-window attention (`use_sliding_window: true`) is not supported");
        }
        if let Some(types) = raw.get("layer_types").and_then(Value::as_array) {
            if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                crate::fail!("layer type {t} is not supported (only `full_attention`)");
            }
        }
        // Qwen2's q/k/v always carry a bias (its config has no key for it); Qwen3's only with
        // `attention_bias`, which also puts one on o_proj: not supported.
        if !qwen2 && opt_bool(&raw, "attention_bias")? == Some(true) {
            crate::fail!("`attention_bias: true` is not supported for qwen3");
        }
        if let Some(act) = opt_str(&raw, "hidden_act")? {
            if act != "silu" {
                crate::fail!("hidden_act `{act}` is not supported (only `silu`)");
            }
        }
        let rope_theta = rope_theta(&raw)?;
        let hidden_size = usize_key(&raw, "hidden_size")?;
        let num_attention_heads = usize_key(&raw, "num_attention_heads")?;
        let num_key_value_heads = match raw.get("num_key_value_heads") {
            None | Some(Value::Null) => num_attention_heads,
            Some(_) => usize_key(&raw, "num_key_value_heads")?,
        };
        let head_dim = match raw.get("head_dim") {
            None | Some(Value::Null) => hidden_size / num_attention_heads.max(1),
            Some(_) => usize_key(&raw, "head_dim")?,
        };
        let eos_token_ids = match raw.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|n| n as u32))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    candle_core::Error::Msg("config key `eos_token_id` must hold token ids".into())
                })?,
            Some(_) => opt_u32(&raw, "eos_token_id")?.into_iter().collect(),
        };
        let cfg = Config {
            vocab_size: usize_key(&raw, "vocab_size")?,
            hidden_size,
            intermediate_size: usize_key(&raw, "intermediate_size")?,
            num_hidden_layers: usize_key(&raw, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: opt_typed(&raw, "rms_norm_eps", "a number", Value::as_f64)?
                .unwrap_or(1e-6),
            rope_theta,
            tie_word_embeddings: opt_bool(&raw, "tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: qwen2,
            qk_norm: !qwen2,
            max_position_embeddings: opt_typed(
                &raw,
                "max_position_embeddings",
                "a non-negative integer",
                Value::as_u64,
            )?
            .unwrap_or(32768) as usize,
            bos_token_id: opt_u32(&raw, "bos_token_id")?,
            eos_token_ids,
            pad_token_id: opt_u32(&raw, "pad_token_id")?,
            raw,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        for (k, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ] {
            if v == 0 {
                crate::fail!("config key `{k}` must be positive, got 0");
            }
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            crate::fail!(
                "config key `head_dim` must be a positive even number, got {}",
                self.head_dim
            );
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            crate::fail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            crate::fail!("rope_theta must be positive, got {}", self.rope_theta);
        }
        // A corrupt config.json is an error, not hours in `expected_tensors` (fuzzing found
        // num_hidden_layers = 2^31) or an overflow in `num_parameters`: bounds far above any
        // real model (the largest dense ones have ~130 layers and ~4e11 parameters).
        let params = self.parameters_saturating();
        if self.num_hidden_layers > MAX_LAYERS || params > MAX_PARAMETERS {
            crate::fail!(
                "config describes {} layers and {params} parameters: at most {MAX_LAYERS} and 2^40",
                self.num_hidden_layers
            );
        }
        Ok(())
    }

    /// `num_parameters` in saturating u128 arithmetic, from the sizes (no tensor list).
    fn parameters_saturating(&self) -> u128 {
        let m = |a: u128, b: u128| a.saturating_mul(b);
        let [v, h, hd, i, l] = [
            self.vocab_size,
            self.hidden_size,
            self.head_dim,
            self.intermediate_size,
            self.num_hidden_layers,
        ]
        .map(|x| x as u128);
        let (q, kv) = (
            m(self.num_attention_heads as u128, hd),
            m(self.num_key_value_heads as u128, hd),
        );
        let heads = [
            m(2, hd) * u128::from(self.qk_norm),
            q.saturating_add(m(2, kv)) * u128::from(self.qkv_bias),
        ];
        let layer = [m(2, h), m(m(2, q), h), m(m(2, kv), h), m(m(3, i), h)]
            .into_iter()
            .chain(heads)
            .fold(0u128, u128::saturating_add);
        let embed = m(m(v, h), if self.tie_word_embeddings { 1 } else { 2 });
        embed.saturating_add(h).saturating_add(m(l, layer))
    }

    /// Every tensor the checkpoint must hold, with its HF key and shape, in sorted key order.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, hd, i) = (self.hidden_size, self.head_dim, self.intermediate_size);
        let (q, kv) = (self.num_attention_heads * hd, self.num_key_value_heads * hd);
        let mut out = vec![
            (
                "model.embed_tokens.weight".to_string(),
                vec![self.vocab_size, h],
            ),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![self.vocab_size, h]));
        }
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            out.extend([
                (format!("{p}.input_layernorm.weight"), vec![h]),
                (format!("{p}.post_attention_layernorm.weight"), vec![h]),
                (format!("{p}.self_attn.q_proj.weight"), vec![q, h]),
                (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.o_proj.weight"), vec![h, q]),
                (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
            ]);
            if self.qk_norm {
                out.extend([
                    (format!("{p}.self_attn.q_norm.weight"), vec![hd]),
                    (format!("{p}.self_attn.k_norm.weight"), vec![hd]),
                ]);
            }
            if self.qkv_bias {
                out.extend([
                    (format!("{p}.self_attn.q_proj.bias"), vec![q]),
                    (format!("{p}.self_attn.k_proj.bias"), vec![kv]),
                    (format!("{p}.self_attn.v_proj.bias"), vec![kv]),
                ]);
            }
        }
        out.sort();
        out
    }

    /// Number of parameters, counting tied embeddings once.
    pub fn num_parameters(&self) -> usize {
        self.expected_tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

/// `rope_theta` (transformers 4) or `rope_parameters.rope_theta` (transformers 5); only the
/// default rope type is supported.
fn rope_theta(raw: &Value) -> Result<f64> {
    for key in ["rope_scaling", "rope_parameters"] {
        if let Some(p) = raw.get(key).filter(|p| !p.is_null()) {
            let ty = p
                .get("rope_type")
                .or_else(|| p.get("type"))
                .and_then(Value::as_str);
            if let Some(ty) = ty {
                if ty != "default" {
                    crate::fail!(
                        "rope scaling `{key}.rope_type = {ty}` is not supported (only `default`)"
                    );
                }
            }
        }
    }
    if let Some(t) = opt_typed(raw, "rope_theta", "a number", Value::as_f64)? {
        return Ok(t);
    }
    if let Some(t) = raw
        .pointer("/rope_parameters/rope_theta")
        .and_then(Value::as_f64)
    {
        return Ok(t);
    }
    Ok(10_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4})
    }

    /// Issue 15 item 16: a present optional key of the wrong type is an error, not the default.
    #[test]
    fn item16_wrong_typed_optional_keys_are_errors() {
        check_err(
            json!({"rms_norm_eps": "1e-2"}),
            "config key `rms_norm_eps` must be a number, got \"1e-2\"",
        );
        check_err(
            json!({"max_position_embeddings": "512"}),
            "`max_position_embeddings` must be a non-negative integer",
        );
        check_err(
            json!({"tie_word_embeddings": "true"}),
            "`tie_word_embeddings` must be true or false",
        );
        check_err(
            json!({"rope_theta": "1e6"}),
            "`rope_theta` must be a number",
        );
        check_err(
            json!({"attention_bias": 0}),
            "`attention_bias` must be true or false",
        );
        let mut v = base();
        v["rms_norm_eps"] = json!(1e-2);
        v["max_position_embeddings"] = json!(512);
        let c = Config::from_json(v).expect("typed keys parse");
        assert_eq!((c.rms_norm_eps, c.max_position_embeddings), (1e-2, 512));
    }

    fn check_err(patch: Value, expect: &str) {
        let mut v = base();
        for (k, x) in patch.as_object().expect("object").iter() {
            v[k] = x.clone();
        }
        let err = Config::from_json(v).expect_err("must fail").to_string();
        assert!(err.contains(expect), "{err:?} does not mention {expect:?}");
    }

    #[test]
    fn head_dim_is_independent_and_theta_has_two_homes() {
        let c = Config::from_json(base()).expect("ok");
        assert_eq!((c.head_dim, c.rope_theta), (4, 10_000.0));
        let mut v = base();
        v["rope_parameters"] = json!({"rope_theta": 1e6, "rope_type": "default"});
        assert_eq!(Config::from_json(v).expect("ok").rope_theta, 1e6);
        let mut v = base();
        v["rope_theta"] = json!(5e5);
        assert_eq!(Config::from_json(v).expect("ok").rope_theta, 5e5);
    }

    #[test]
    fn unsupported_features_are_named() {
        check_err(json!({"use_sliding_window": true}), "sliding-window");
        check_err(
            json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
            "yarn",
        );
        check_err(
            json!({"num_key_value_heads": 3}),
            "multiple of num_key_value_heads",
        );
        check_err(json!({"hidden_size": "big"}), "`hidden_size`");
        // Fuzzing (terse-fuzz, target checkpoint): 2^31 layers hung in `expected_tensors`.
        check_err(
            json!({"num_hidden_layers": 1u64 << 31}),
            "at most 1024 and 2^40",
        );
        check_err(
            json!({"vocab_size": u64::MAX, "hidden_size": u64::MAX}),
            "2^40",
        );
        for name in ["qwen3-8b", "qwen2.5-7b"] {
            let c = Config::named(name).expect("built in");
            assert_eq!(
                c.parameters_saturating(),
                c.num_parameters() as u128,
                "{name}"
            );
        }
        check_err(json!({"model_type": "llama"}), "llama");
    }

    #[test]
    fn expected_tensors_follow_tying() {
        let tied = Config::synthetic(10, 8, 12, 2, 2, 1, 4, true).expect("ok");
        let untied = Config::synthetic(10, 8, 12, 2, 2, 1, 4, false).expect("ok");
        assert_eq!(tied.expected_tensors().len(), 2 + 2 * 11);
        assert_eq!(untied.expected_tensors().len(), 3 + 2 * 11);
        assert_eq!(untied.num_parameters() - tied.num_parameters(), 80);
    }
}
