//! The CPU testbed: a generated task family small enough for a ~1M-parameter Qwen3 to learn on
//! two cores, built so that length pressure is meaningful (see models/testbed/README.md).
//!
//! A problem of level L is a start digit and L operations `+ d` (d in 1..=3) modulo 10. Every
//! trace writes each intermediate result (`a + d = r ;`): these L steps are NECESSARY, because a
//! tiny model cannot add L digits in one token. The two teachers ([`teacher`]) differ in what a
//! `Wait` re-check is worth: in v1 it never changes the answer (pure overthinking); in v2 the
//! teacher slips on steps at a rate that grows with the level and a re-check corrects the slip,
//! so reflection pays on hard problems and is wasted on easy ones, as in the papers' models.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

mod reflect;
pub mod teacher;
pub use teacher::{Teacher, Trace, Version, EASY_LEVELS, HARD_OPERANDS};

/// The highest level; levels are 1..=MAX_LEVEL operations.
pub const MAX_LEVEL: usize = 8;

/// Operations add 1..=MAX_STEP (mod 10).
pub const MAX_STEP: u8 = 3;

/// Every token of the testbed vocabulary, in id order.
pub const VOCAB: [&str; 30] = [
    "<pad>",
    "<unk>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "user",
    "assistant",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "+",
    "-",
    "=",
    ";",
    "Wait",
    "mod",
    "10",
    "?",
    "\n",
];

/// One problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub level: usize,
    pub start: u8,
    /// (is_plus, digit)
    pub ops: Vec<(bool, u8)>,
}

impl Problem {
    pub fn generate(level: usize, seed: u64) -> Self {
        assert!(
            (1..=MAX_LEVEL).contains(&level),
            "testbed levels are 1..={MAX_LEVEL}, got {level}"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Self {
            level,
            start: rng.random_range(0..10),
            // Small steps (+1..+3) keep the step table at 30 facts, which a ~1M-parameter model
            // learns within a CPU SFT budget (with +/-1..9 it copied the structure but not the sums).
            ops: (0..level)
                .map(|_| (true, rng.random_range(1..=MAX_STEP)))
                .collect(),
        }
    }

    /// A testbed v2 problem: like [`Problem::generate`], but each operation is hard (a big operand,
    /// see [`teacher::HARD_OPERANDS`]) with probability `hard_prob`.
    pub fn generate_v2(level: usize, seed: u64, hard_prob: f64) -> Self {
        assert!(
            (1..=MAX_LEVEL).contains(&level),
            "testbed levels are 1..={MAX_LEVEL}, got {level}"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let start = rng.random_range(0..10);
        let ops = (0..level)
            .map(|_| {
                let d = if rng.random_bool(hard_prob) {
                    rng.random_range(teacher::HARD_OPERANDS)
                } else {
                    rng.random_range(1..=MAX_STEP)
                };
                (true, d)
            })
            .collect();
        Self { level, start, ops }
    }

    /// Intermediate results after each operation.
    pub fn partials(&self) -> Vec<u8> {
        let mut v = self.start;
        (0..self.ops.len())
            .map(|i| {
                v = self.apply(i, v);
                v
            })
            .collect()
    }

    pub fn answer(&self) -> u8 {
        self.partials().last().copied().unwrap_or(self.start)
    }

    fn expr(&self) -> String {
        let mut s = self.start.to_string();
        for &(plus, d) in &self.ops {
            s.push_str(&format!(" {} {d}", if plus { "+" } else { "-" }));
        }
        s
    }

    /// The prompt, ending in the open thinking span.
    pub fn prompt(&self) -> String {
        format!(
            "<|im_start|> user {} mod 10 ? <|im_end|> <|im_start|> assistant <think>",
            self.expr()
        )
    }

    /// The result of operation `i` applied to `value`.
    pub(crate) fn apply(&self, i: usize, value: u8) -> u8 {
        let (plus, d) = self.ops[i];
        if plus {
            (value + d) % 10
        } else {
            (value + 10 - d) % 10
        }
    }

    /// Step `i` written from `before` with result `result` (`a + d = r ;`).
    pub(crate) fn step_text(&self, i: usize, before: u8, result: u8) -> String {
        let (plus, d) = self.ops[i];
        format!("{before} {} {d} = {result} ;", if plus { "+" } else { "-" })
    }

    /// Step `i` of the correct chain.
    pub(crate) fn step(&self, i: usize) -> String {
        let partials = self.partials();
        let before = if i == 0 { self.start } else { partials[i - 1] };
        self.step_text(i, before, partials[i])
    }
}

/// The verifier's verdict on a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub correct: bool,
    pub format_ok: bool,
    /// 1 when correct, else 0.
    pub reward: f64,
    pub reason: &'static str,
}

/// Checks a completion (text after the prompt): `</think>` once, then `<answer> d </answer>`.
pub fn verify(completion: &str, answer: u8) -> Verdict {
    let v = |correct: bool, format_ok: bool, reason| Verdict {
        correct,
        format_ok,
        reward: f64::from(u8::from(correct)),
        reason,
    };
    let Some((_, after)) = completion.split_once("</think>") else {
        return v(false, false, "no </think>");
    };
    if after.contains("</think>") || completion.contains("<think>") {
        return v(false, false, "think tags repeated");
    }
    let Some(body) = after
        .split_once("<answer>")
        .and_then(|(_, r)| r.split_once("</answer>"))
        .map(|(a, _)| a.trim())
    else {
        return v(false, false, "no <answer>...</answer> after </think>");
    };
    match body.parse::<u8>() {
        Ok(d) if d == answer => v(true, true, "correct"),
        Ok(_) => v(false, true, "wrong answer"),
        Err(_) => v(false, true, "answer is not a digit"),
    }
}

/// tokenizer.json for the testbed: a WordLevel model over `VOCAB`, split on whitespace, with
/// the chat markers as special tokens. Loadable by the `tokenizers` crate and by transformers.
pub fn tokenizer_json() -> String {
    // The first nine vocabulary entries are the special tokens.
    let special = &VOCAB[..9];
    let added: Vec<serde_json::Value> = special
        .iter()
        .map(|t| {
            let id = VOCAB.iter().position(|v| v == t).unwrap_or_default();
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> = VOCAB
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i.into()))
        .collect();
    let tok = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    serde_json::to_string_pretty(&tok).unwrap_or_default() + "\n"
}

/// config.json of the testbed Qwen3 (~0.8M parameters, tied embeddings).
pub fn model_config_json() -> String {
    let cfg = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB.len(),
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "use_sliding_window": false,
        "bos_token_id": 3,
        "eos_token_id": 4,
        "pad_token_id": 0,
        "dtype": "float32"
    });
    serde_json::to_string_pretty(&cfg).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_verifier() {
        let p = Problem {
            level: 3,
            start: 7,
            ops: vec![(true, 5), (false, 9), (true, 1)],
        };
        assert_eq!(p.partials(), [2, 3, 4]);
        assert_eq!(
            p.prompt(),
            "<|im_start|> user 7 + 5 - 9 + 1 mod 10 ? <|im_end|> <|im_start|> assistant <think>"
        );
        let check = |c: &str, correct, format_ok| {
            let v = verify(c, 4);
            assert_eq!((v.correct, v.format_ok), (correct, format_ok), "{c}: {v:?}");
        };
        check(
            "7 + 5 = 2 ; </think> <answer> 4 </answer> <|im_end|>",
            true,
            true,
        );
        check("</think> <answer> 4 </answer>", true, true);
        check("</think> <answer> 5 </answer>", false, true);
        check("</think> <answer> + </answer>", false, true);
        check("<answer> 4 </answer>", false, false);
        check("</think> </think> <answer> 4 </answer>", false, false);
        check("</think> 4", false, false);
    }
}
