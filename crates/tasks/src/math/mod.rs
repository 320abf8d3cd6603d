//! Math answers: extraction (`\boxed{}` with nested braces, several boxed answers, GSM8K
//! `####`, `<answer>` tags), equivalence, and the scorers of docs/methods.md, Base task rewards (Short-RL) and docs/methods.md, Base task rewards
//! (EasyR1). Unparsable input is "wrong", never a panic.
//!
//! Equivalence reads both answers into a small expression form and compares values, never a
//! loosened text: lex.rs (LaTeX, Unicode and plain text -> tokens) -> parse.rs (tokens ->
//! lists, sets, tuples, intervals, relations, expressions; units dropped only when they are
//! units) -> equiv.rs (exact big-rational arithmetic where the values are rational, evaluation
//! at fixed points for expressions with variables, and one tolerance: a ground truth written as
//! a decimal accepts an irrational or non-terminating answer that rounds to it). Written here
//! rather than with a LaTeX crate: none on crates.io parses the answer forms graders meet
//! (mixed numbers, units, `\pm`, "or" lists, intervals) into values; num-rational and
//! num-bigint do the exact arithmetic.

mod equiv;
mod expr;
mod lex;
mod parse;
mod parse_expr;
mod words;

use regex::Regex;
use std::sync::OnceLock;

/// Content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced; `\boxed 5` also works.
pub fn extract_boxed(text: &str) -> Option<String> {
    boxed_spans(text).pop().map(|(_, _, body)| body)
}

/// GSM8K: the text after the last "####".
pub fn extract_gsm8k(text: &str) -> Option<String> {
    text.rfind("####")
        .map(|i| text[i + 4..].trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The content of the last `<answer>...</answer>`.
pub fn extract_answer_tag(text: &str) -> Option<String> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r"(?s)<answer>(.*?)</answer>").expect("regex"));
    re.captures_iter(text)
        .last()
        .map(|c| c[1].trim().to_string())
}

/// The answers a completion ends with: the last `\boxed{}` together with the boxed answers
/// right before it that only separators part (`\boxed{3} and \boxed{-3}` gives "3, -3");
/// a boxed answer followed by other words ("\boxed{1}. Wait, no: \boxed{2}") is replaced,
/// not joined.
pub fn extract_final_boxed(text: &str) -> Option<String> {
    let spans = boxed_spans(text);
    let mut k = spans.len().checked_sub(1)?;
    let mut answers = vec![spans[k].2.clone()];
    while k > 0 && answers.len() < 16 && only_separators(&text[spans[k - 1].1..spans[k].0]) {
        k -= 1;
        answers.push(spans[k].2.clone());
    }
    answers.reverse();
    Some(answers.join(", "))
}

/// Every `\boxed{...}` / `\fbox{...}` / `\boxed 5` in `text`: (start, end, content).
fn boxed_spans(text: &str) -> Vec<(usize, usize, String)> {
    let mut out = vec![];
    let mut from = 0;
    while let Some((start, cmd)) = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|c| text[from..].find(c).map(|i| (from + i, *c)))
        .min()
    {
        let body_at = start + cmd.len();
        from = body_at;
        let rest = &text[body_at..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut depth = 1usize;
            for (i, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            let end = body_at + 1 + i + 1;
                            out.push((start, end, body[..i].to_string()));
                            from = end;
                            break;
                        }
                    }
                    _ => {}
                }
            }
        } else if let Some(body) = rest.strip_prefix(' ') {
            let word = body.split(['$', ' ', '\n']).next().unwrap_or("");
            if !word.is_empty() {
                let end = body_at + 1 + word.len();
                out.push((start, end, word.to_string()));
                from = end;
            }
        }
    }
    out
}

/// Whether `s` holds only what separates listed answers: spaces, punctuation, `$`, "and",
/// "or", `\text{ and }`, `\quad`.
fn only_separators(s: &str) -> bool {
    let mut t = s.to_string();
    for w in [
        "\\text", "\\quad", "\\qquad", "\\,", "\\;", "and", "or", "\\(", "\\)",
    ] {
        t = t.replace(w, "");
    }
    t.chars()
        .all(|c| c.is_whitespace() || ",;.$&{}()~".contains(c))
}

/// The answer text the checker reads: the final boxed answer(s) when there are any.
fn answer_text(s: &str) -> String {
    extract_final_boxed(s).unwrap_or_else(|| s.trim().to_string())
}

/// A canonical text of an answer: its tokens (spacing, `$`, `\left`, degree and percent signs,
/// `\text` wrappers gone), for display and as the last-resort comparison of answers the
/// grammar does not read.
pub fn normalize(answer: &str) -> String {
    let text = answer_text(answer);
    match lex::lex(&text) {
        Some(toks) => toks.iter().map(render).collect::<Vec<_>>().join(" "),
        None => text.split_whitespace().collect(),
    }
}

fn render(t: &lex::Tok) -> String {
    use lex::Tok;
    match t {
        Tok::Num {
            digits,
            decimals,
            exp,
        } => format!("{digits}/{decimals:?}/{exp}"),
        Tok::Word { w, .. } => w.clone(),
        Tok::Cmd(c) => format!("\\{c}"),
        Tok::Op(c) => c.to_string(),
        Tok::SetOpen => "\\{".into(),
        Tok::SetClose => "\\}".into(),
        Tok::ThinSpace | Tok::Gap => " ".into(),
    }
}

fn parsed(text: &str) -> Option<parse::Answer> {
    parse::parse(lex::lex(text)?)
}

/// The numeric value of an answer that is one closed expression (no variables), if any.
pub fn numeric_value(s: &str) -> Option<f64> {
    let a = parsed(s)?;
    match a.items.as_slice() {
        [parse::Item::Expr(e)] => e.approx(&Default::default()).filter(|v| v.is_finite()),
        _ => None,
    }
}

/// Whether `answer` is mathematically the ground truth `reference` (module docs and
/// equiv.rs say how). Never true for an empty answer; unreadable input compares as text.
pub fn equivalent(answer: &str, reference: &str) -> bool {
    let (a, g) = (answer_text(answer), answer_text(reference));
    if a.is_empty() || g.is_empty() {
        return false;
    }
    // The same tokens are the same answer, defined or not ("1/0" is "1/0").
    if normalize(&a) == normalize(&g) {
        return true;
    }
    match (parsed(&a), parsed(&g)) {
        (Some(pa), Some(pg)) => equiv::answers_eq(&pa, &pg),
        _ => false,
    }
}

/// Short-RL's math reward (docs/methods.md, Base task rewards): four-tag format, answer in the last `<answer>` block.
/// Returns (total, correct): 3 / −0.5 / −3.
pub fn score_short_rl(solution_str: &str, ground_truth: &str) -> (f64, bool) {
    let processed = solution_str
        .split_once("Assistant:")
        .or_else(|| solution_str.split_once("<|im_start|>assistant"))
        .map(|(_, r)| r);
    let Some(processed) = processed else {
        return (-3.0, false);
    };
    let tags = ["<think>", "</think>", "<answer>", "</answer>"];
    let once = tags.iter().all(|t| processed.matches(t).count() == 1);
    let pos: Vec<usize> = tags
        .iter()
        .map(|t| processed.find(t).unwrap_or(0))
        .collect();
    let ordered = pos.windows(2).all(|w| w[0] <= w[1]);
    let gt = extract_boxed(ground_truth).unwrap_or_else(|| ground_truth.to_string());
    match extract_answer_tag(processed) {
        Some(ans) if once && ordered && !ans.is_empty() && !gt.trim().is_empty() => {
            if equivalent(&ans, &gt) {
                (3.0, true)
            } else {
                (-0.5, false)
            }
        }
        _ => (-3.0, false),
    }
}

/// EasyR1's math reward (docs/methods.md, Base task rewards): overall = (1 − w)·accuracy + w·format, w = 0.1 by default.
/// Returns (overall, accuracy, format).
pub fn score_easyr1(response: &str, ground_truth: &str, format_weight: f64) -> (f64, f64, f64) {
    static WS: OnceLock<Regex> = OnceLock::new();
    static FMT: OnceLock<Regex> = OnceLock::new();
    let ws = WS.get_or_init(|| Regex::new(r"\s*(<|>|/)\s*").expect("regex"));
    let fmt =
        FMT.get_or_init(|| Regex::new(r"(?s)^<think>.*</think>.*\\boxed\{.*\}.*$").expect("regex"));
    let compact = ws.replace_all(response, "$1");
    let format = f64::from(u8::from(fmt.is_match(&compact)));
    let accuracy = f64::from(u8::from(
        extract_final_boxed(response).is_some_and(|a| equivalent(&a, ground_truth)),
    ));
    (
        (1.0 - format_weight) * accuracy + format_weight * format,
        accuracy,
        format,
    )
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod graded;
