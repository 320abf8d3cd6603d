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

/// The most operators one `{{ }}` or `{% %}` tag may hold (see `ChatTemplate::new`); real
/// chat templates have at most a few dozen.
const MAX_OPERATORS_PER_TAG: usize = 1024;

/// The most operators (`+ - * / % ~ . | [ ( = < > !` outside string literals, and the words
/// `not and or in is`) in one tag of a Jinja source: each level of an expression's tree takes
/// at least one, so this bounds the depth minijinja's compiler recurses to.
fn most_operators_in_a_tag(source: &str) -> usize {
    let b = source.as_bytes();
    let (mut most, mut i) = (0, 0);
    while i + 1 < b.len() {
        if !(b[i] == b'{' && matches!(b[i + 1], b'{' | b'%')) {
            i += 1;
            continue;
        }
        let (mut ops, mut word) = (0, String::new());
        i += 2;
        while i < b.len() && !(matches!(b[i], b'}' | b'%') && b.get(i + 1) == Some(&b'}')) {
            let c = b[i];
            if c == b'\'' || c == b'"' {
                // A string literal: skip to its closing quote, over escapes.
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            } else if c.is_ascii_alphanumeric() || c == b'_' {
                word.push(c as char);
            } else {
                ops += usize::from(b"+-*/%~.|[(=<>!".contains(&c));
            }
            if !(c.is_ascii_alphanumeric() || c == b'_') || i + 1 >= b.len() {
                ops += usize::from(matches!(word.as_str(), "not" | "and" | "or" | "in" | "is"));
                word.clear();
            }
            i += 1;
        }
        ops += usize::from(matches!(word.as_str(), "not" | "and" | "or" | "in" | "is"));
        most = most.max(ops);
    }
    most
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
        // minijinja bounds its parser's nesting, but a chain of operators (`- - - x`,
        // `x+x+x`, `x.a.a`) parses into a tree as deep as the chain is long, which its compiler
        // walks recursively and in quadratic time: 32768 `-` overflowed an 8 MiB stack, and on
        // a larger stack took 7 s (found by fuzzing). No real template comes near the bound.
        let ops = most_operators_in_a_tag(source);
        if ops > MAX_OPERATORS_PER_TAG {
            return Err(format!(
                "chat template: a tag holds {ops} operators, more than {MAX_OPERATORS_PER_TAG}"
            ));
        }
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
        // minijinja 2.24 negates a slice step without a check (`messages[::-9223372036854775808]`,
        // found by fuzzing): where overflow checks are on (debug builds, tests) that panics, so a
        // panic while rendering is an error too.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tmpl.render(ctx)))
            .map_err(|p| {
                let msg = crate::panic_message(&*p);
                format!("chat template: the renderer panicked: {msg}")
            })?
            .map_err(|e| format!("chat template: {e}"))
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

    /// Fuzzing (terse-fuzz, target template): 32768 unary minuses in a row overflowed the
    /// stack in minijinja's compiler (an abort), and compile in quadratic time; a tag with more
    /// than MAX_OPERATORS_PER_TAG operators is an error, one at the bound compiles at once.
    #[test]
    fn a_tag_with_thousands_of_operators_is_an_error_not_an_overflow() {
        for chain in ["-", "not ", "x.a", "x+", "x|e"] {
            let src = format!("{{{{ {} x }}}}", chain.repeat(32768));
            let err = ChatTemplate::new(&src, "", "").expect_err("too deep");
            assert!(err.contains("operators, more than 1024"), "{err}");
            let started = std::time::Instant::now();
            let src = format!("{{{{ {} x }}}}", chain.repeat(MAX_OPERATORS_PER_TAG / 2));
            let t = ChatTemplate::new(&src, "", "");
            assert!(started.elapsed().as_secs_f64() < 1.0, "{chain}: slow");
            if let Ok(t) = t {
                let _ = t.render(&[], true, None);
            }
        }
        // Operators inside string literals and between tags do not count.
        let quoted = format!(
            "{{{{ '{}' ~ \"{}\" }}}}{}",
            "-".repeat(5000),
            "+".repeat(5000),
            "-".repeat(5000)
        );
        assert_eq!(most_operators_in_a_tag(&quoted), 1);
        assert_eq!(
            most_operators_in_a_tag("{% if not a and b.c %}x{% endif %}"),
            3
        );
    }

    /// Fuzzing (terse-fuzz, target template): Qwen3's `messages[::-1]` with the step mutated to
    /// -2^63 made minijinja overflow (a panic in debug builds); rendering is an error or, where
    /// overflow wraps, text, and never a panic.
    #[test]
    fn a_slice_step_of_minus_two_to_the_63_does_not_panic() {
        let t = ChatTemplate::new(
            "{% for m in messages[::-9223372036854775808] %}{{ m.content }}{% endfor %}",
            "",
            "",
        )
        .expect("compile");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.render(&[Message::new("user", "hi")], true, None)
        }));
        assert!(r.is_ok(), "render panicked");
    }
}
