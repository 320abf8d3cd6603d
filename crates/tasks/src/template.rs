//! Prompt rendering: the model's own chat template (the Jinja in tokenizer_config.json, rendered
//! with minijinja the way transformers' apply_chat_template does) and plain `{placeholder}`
//! templates such as Logic-RL's.

use minijinja::{context, Environment};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

fn token_str(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) => o
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// From the text of a tokenizer_config.json (`chat_template` as a string, or a list of
    /// named templates of which "default" is used).
    pub fn from_tokenizer_config(json: &str) -> Result<Self, String> {
        let cfg: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| format!("tokenizer_config.json: invalid JSON: {e}"))?;
        let template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .ok_or("tokenizer_config.json: `chat_template` list has no \"default\" entry")?
                .to_string(),
            _ => return Err("tokenizer_config.json: no `chat_template` string".into()),
        };
        Self::new(
            &template,
            &token_str(cfg.get("bos_token")),
            &token_str(cfg.get("eos_token")),
        )
    }

    /// From Jinja source. Whitespace handling is transformers' (trim_blocks, lstrip_blocks).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("chat template: {e}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The prompt text for `messages`. `enable_thinking: None` leaves the variable undefined,
    /// as calling transformers without it does.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let base = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let ctx = match enable_thinking {
            Some(t) => context! { enable_thinking => t, ..base },
            None => base,
        };
        tmpl.render(ctx).map_err(|e| format!("chat template: {e}"))
    }
}

/// Fills `{name}` placeholders; an unknown placeholder is an error naming it. `{{` and `}}`
/// stand for literal braces.
pub fn render_plain(template: &str, vars: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(r) = tail.strip_prefix("{{").or_else(|| tail.strip_prefix("}}")) {
            out.push_str(&tail[..1]);
            rest = r;
            continue;
        }
        if tail.starts_with('}') {
            return Err(format!(
                "template: unmatched `}}` at byte {}",
                template.len() - tail.len()
            ));
        }
        let end = tail.find('}').ok_or_else(|| {
            format!(
                "template: unclosed `{{` at byte {}",
                template.len() - tail.len()
            )
        })?;
        let name = &tail[1..end];
        let value = vars
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("template: unknown placeholder `{{{name}}}`"))?;
        out.push_str(value);
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Logic-RL's prompt for base models (`template_type=base`), placeholder `{quiz}`.
pub const LOGIC_RL_BASE: &str = "The user asks a question, and the Assistant solves it.The assistant first thinks about the reasoning process in the mind and then provides the user with the final answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>. Now the user asks you to solve a logical reasoning problem. After thinking, when you finally reach a conclusion, clearly state the identity of each character within <answer> </answer> tags. List the identity of each person one by one, for example, <answer> (1) Zoey is a knight\n(2) Oliver is a knight\n(3)... </answer>.\n\nUser:{quiz}\nAssistant: <think>";

/// Logic-RL's prompt for instruct models (`template_type=qwen-instruct`), placeholder `{quiz}`;
/// it opens the thinking span, so the response must not emit another `<think>`.
pub const LOGIC_RL_QWEN_INSTRUCT: &str = "<|im_start|>system\nYou are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you finally reach a conclusion, clearly state the identity of each character within <answer> </answer> tags. i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>.\n<|im_end|>\n<|im_start|>user\n{quiz}\n<|im_end|>\n<|im_start|>assistant\n<think>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_templates() {
        assert_eq!(
            render_plain("Q: {quiz} {{x}}", &[("quiz", "who?")]).as_deref(),
            Ok("Q: who? {x}")
        );
        assert!(render_plain("{nope}", &[])
            .expect_err("unknown")
            .contains("`{nope}`"));
        assert!(render_plain("{open", &[]).is_err());
        let p = render_plain(LOGIC_RL_QWEN_INSTRUCT, &[("quiz", "QUIZ")]).expect("render");
        assert!(p.ends_with("<|im_start|>user\nQUIZ\n<|im_end|>\n<|im_start|>assistant\n<think>"));
    }

    #[test]
    fn a_small_template_renders_with_hf_whitespace_rules() {
        let t = ChatTemplate::new("{% for m in messages %}\n  [{{ m.role }}]{{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}", "", "").expect("compile");
        let out = t
            .render(&[Message::new("user", " hi ")], true, None)
            .expect("render");
        assert_eq!(out, "  [user]hi\n>"); // lstrip_blocks strips before tags, not before {{ }}
    }
}
