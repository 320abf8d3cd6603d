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
//!
//! Every comparison is bounded (budget.rs): extraction is linear in the completion, at most
//! [`MAX_ANSWER_CHARS`] of answer text per side is read, expressions nest and chain only so
//! deep (no input overflows a stack, a 256 KiB one included), the work is capped at
//! [`MAX_OPS`] units, exact values at [`MAX_BITS`] bits, and a float that overflows is
//! refused. What the budget refuses is [`Verdict::Unverifiable`], never rounded into a value:
//! `0.1^{99999999}` is not 0 (its exact value is refused, and the float path does not take
//! over). [`check`] gives the verdict; the scorers count an unverifiable answer as a wrong one
//! and their `_checked` forms say why. adversarial.rs holds the hostile inputs the tests and
//! `cargo xtask bench verify` run.

pub mod adversarial;
mod budget;
mod equiv;
mod expr;
mod lex;
mod parse;
mod parse_expr;
mod words;

pub use budget::{Unverifiable, Verdict, MAX_ANSWER_CHARS, MAX_BITS, MAX_OPS};

use budget::Budget;
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

/// Every `\boxed{...}` / `\fbox{...}` / `\boxed 5` in `text`: (start, end, content); a box
/// inside a box is part of its content. Linear in the text: the commands are found in one
/// pass and their braces matched in another (scanning from each command to its closing
/// brace is quadratic in a completion of unclosed boxes).
fn boxed_spans(text: &str) -> Vec<(usize, usize, String)> {
    // (start, where the body starts, the index of its opening brace among `opens`).
    let mut cmds = vec![];
    let mut opens = vec![];
    for (i, _) in text.match_indices('\\') {
        if let Some(c) = ["\\boxed", "\\fbox"]
            .iter()
            .find(|c| text[i..].starts_with(*c))
        {
            let body_at = i + c.len();
            let open = text[body_at..].starts_with('{').then(|| {
                opens.push(body_at);
                opens.len() - 1
            });
            cmds.push((i, body_at, open));
        }
    }
    let closes = closing_braces(text, &opens);
    let mut out = vec![];
    let mut from = 0;
    for (start, body_at, open) in cmds {
        if start < from {
            continue;
        }
        from = body_at;
        if let Some(k) = open {
            if let Some(close) = closes[k] {
                out.push((start, close + 1, text[body_at + 1..close].to_string()));
                from = close + 1;
            }
        } else if let Some(body) = text[body_at..].strip_prefix(' ') {
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

/// The index of the brace closing each opening brace at `opens` (ascending byte indices of
/// `{`), None when it never closes. One pass: a brace opened at depth d closes at the first
/// `}` that brings the depth back below d, so only the innermost pending one can close.
fn closing_braces(text: &str, opens: &[usize]) -> Vec<Option<usize>> {
    let mut closes = vec![None; opens.len()];
    let mut pending: Vec<(i64, usize)> = vec![];
    let (mut depth, mut next) = (0i64, 0);
    for (i, c) in text.bytes().enumerate() {
        match c {
            b'{' => {
                depth += 1;
                if opens.get(next) == Some(&i) {
                    pending.push((depth, next));
                    next += 1;
                }
            }
            b'}' => {
                if let Some(&(d, k)) = pending.last() {
                    if d == depth {
                        closes[k] = Some(i);
                        pending.pop();
                    }
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    closes
}

/// Whether `s` holds only what separates listed answers: spaces, punctuation, `$`, "and",
/// "or", `\text{ and }`, `\quad`. One pass, whatever the length.
fn only_separators(s: &str) -> bool {
    const WORDS: [&str; 9] = [
        "\\text", "\\quad", "\\qquad", "\\,", "\\;", "and", "or", "\\(", "\\)",
    ];
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if let Some(w) = WORDS.iter().find(|w| rest.starts_with(*w)) {
            rest = &rest[w.len()..];
            continue;
        }
        if !(c.is_whitespace() || ",;.$&{}()~".contains(c)) {
            return false;
        }
        rest = &rest[c.len_utf8()..];
    }
    true
}

/// The answer text the checker reads: the final boxed answer(s) when there are any.
fn answer_text(s: &str) -> String {
    extract_final_boxed(s).unwrap_or_else(|| s.trim().to_string())
}

/// A canonical text of an answer: its tokens (spacing, `$`, `\left`, degree and percent signs,
/// `\text` wrappers gone), for display and as the last-resort comparison of answers the
/// grammar does not read.
pub fn normalize(answer: &str) -> String {
    normalized(answer, &Budget::new())
}

fn normalized(answer: &str, b: &Budget) -> String {
    let text = answer_text(answer);
    match lex::lex(&text, b) {
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

fn parsed(text: &str, b: &Budget) -> Option<parse::Answer> {
    parse::parse(lex::lex(text, b)?, b)
}

/// The numeric value of an answer that is one closed expression (no variables), if any; None
/// too when reading it exceeds the verifier's budget.
pub fn numeric_value(s: &str) -> Option<f64> {
    let b = Budget::new();
    let a = parsed(s, &b)?;
    match a.items.as_slice() {
        [parse::Item::Expr(e)] => e.approx(&Default::default(), &b).filter(|v| v.is_finite()),
        _ => None,
    }
}

/// Whether `answer` is mathematically the ground truth `reference` (module docs and
/// equiv.rs say how), within the verifier's budget (budget.rs): an answer over it is
/// [`Verdict::Unverifiable`]. Never equal for an empty answer; unreadable input compares as
/// text.
pub fn check(answer: &str, reference: &str) -> Verdict {
    let (a, g) = (answer_text(answer), answer_text(reference));
    if a.is_empty() || g.is_empty() {
        return Verdict::NotEqual;
    }
    let over = Verdict::Unverifiable(Unverifiable::BudgetExceeded);
    if a.chars().count() > MAX_ANSWER_CHARS || g.chars().count() > MAX_ANSWER_CHARS {
        return over;
    }
    let b = Budget::new();
    // The same tokens are the same answer, defined or not ("1/0" is "1/0").
    let equal = normalized(&a, &b) == normalized(&g, &b)
        || match (parsed(&a, &b), parsed(&g, &b)) {
            (Some(pa), Some(pg)) => equiv::answers_eq(&pa, &pg, &b),
            _ => false,
        };
    // A refusal anywhere voids the verdict: what was refused might have decided it.
    if b.exceeded() {
        over
    } else if equal {
        Verdict::Equal
    } else {
        Verdict::NotEqual
    }
}

/// `check(answer, reference)` is [`Verdict::Equal`]: an unverifiable answer is not equivalent.
pub fn equivalent(answer: &str, reference: &str) -> bool {
    check(answer, reference).is_equal()
}

/// Short-RL's math reward (docs/methods.md, Base task rewards): four-tag format, answer in the last `<answer>` block.
/// Returns (total, correct): 3 / −0.5 / −3.
pub fn score_short_rl(solution_str: &str, ground_truth: &str) -> (f64, bool) {
    let (total, correct, _) = score_short_rl_checked(solution_str, ground_truth);
    (total, correct)
}

/// [`score_short_rl`] with the reason when the answer could not be checked: it scores as a
/// wrong answer (−0.5, the format was right).
pub fn score_short_rl_checked(
    solution_str: &str,
    ground_truth: &str,
) -> (f64, bool, Option<Unverifiable>) {
    let processed = solution_str
        .split_once("Assistant:")
        .or_else(|| solution_str.split_once("<|im_start|>assistant"))
        .map(|(_, r)| r);
    let Some(processed) = processed else {
        return (-3.0, false, None);
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
            match check(&ans, &gt) {
                Verdict::Equal => (3.0, true, None),
                v => (-0.5, false, v.unverifiable()),
            }
        }
        _ => (-3.0, false, None),
    }
}

/// EasyR1's math reward (docs/methods.md, Base task rewards): overall = (1 − w)·accuracy + w·format, w = 0.1 by default.
/// Returns (overall, accuracy, format).
pub fn score_easyr1(response: &str, ground_truth: &str, format_weight: f64) -> (f64, f64, f64) {
    let (overall, accuracy, format, _) =
        score_easyr1_checked(response, ground_truth, format_weight);
    (overall, accuracy, format)
}

/// [`score_easyr1`] with the reason when the boxed answer could not be checked: its accuracy
/// is 0, as a wrong answer's.
pub fn score_easyr1_checked(
    response: &str,
    ground_truth: &str,
    format_weight: f64,
) -> (f64, f64, f64, Option<Unverifiable>) {
    static WS: OnceLock<Regex> = OnceLock::new();
    static FMT: OnceLock<Regex> = OnceLock::new();
    let ws = WS.get_or_init(|| Regex::new(r"\s*(<|>|/)\s*").expect("regex"));
    let fmt =
        FMT.get_or_init(|| Regex::new(r"(?s)^<think>.*</think>.*\\boxed\{.*\}.*$").expect("regex"));
    let compact = ws.replace_all(response, "$1");
    let format = f64::from(u8::from(fmt.is_match(&compact)));
    let verdict = extract_final_boxed(response).map(|a| check(&a, ground_truth));
    let accuracy = f64::from(u8::from(verdict.is_some_and(Verdict::is_equal)));
    (
        (1.0 - format_weight) * accuracy + format_weight * format,
        accuracy,
        format,
        verdict.and_then(Verdict::unverifiable),
    )
}

#[cfg(test)]
#[path = "math_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "graded_tests.rs"]
mod graded;
