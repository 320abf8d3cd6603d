//! Math answers: extraction (`\boxed{}` with nested braces, GSM8K `####`, `<answer>` tags),
//! normalisation and equivalence (integers, decimals, fractions, `\frac`/`\dfrac`, percentages,
//! thousands separators, LaTeX spacing and `\text`, units, simple expressions, tuples), and the
//! scorers of spec §1.2 (Short-RL) and §1.3 (EasyR1). Unparsable input is "wrong", never a panic.

use regex::Regex;
use std::sync::OnceLock;

/// Content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced; `\boxed 5` also works.
pub fn extract_boxed(text: &str) -> Option<String> {
    let start = text
        .rfind("\\boxed")
        .map(|i| (i, "\\boxed"))
        .or_else(|| text.rfind("\\fbox").map(|i| (i, "\\fbox")))?;
    let rest = &text[start.0 + start.1.len()..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut depth = 1usize;
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(body[..i].to_string());
                    }
                }
                _ => {}
            }
        }
        None
    } else if let Some(body) = rest.strip_prefix(' ') {
        body.split(['$', ' ', '\n'])
            .next()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    } else {
        None
    }
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

fn strip_wrappers(s: &str, cmd: &str) -> String {
    // \text{abc} -> abc (balanced braces).
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(cmd) {
        out.push_str(&rest[..i]);
        let after = &rest[i + cmd.len()..];
        let Some(body) = after.strip_prefix('{') else {
            out.push_str(cmd);
            rest = after;
            continue;
        };
        let mut depth = 1;
        let mut end = body.len();
        for (j, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push_str(&body[..end]);
        rest = body.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// Canonical text of an answer: LaTeX spacing, `\text`, dollars, degrees, percent, units and
/// thousands separators removed; `\dfrac` -> `\frac`; `x = 3` -> `3`.
pub fn normalize(answer: &str) -> String {
    let mut s = answer.trim().to_string();
    if let Some(inner) = extract_boxed(&s) {
        s = inner;
    }
    for cmd in ["\\text", "\\textbf", "\\mathrm", "\\mbox", "\\mathbf"] {
        s = strip_wrappers(&s, cmd);
    }
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\ ", ""),
        ("~", ""),
        ("\\$", ""),
        ("$", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("°", ""),
        ("\\%", ""),
        ("%", ""),
        ("\\cdot", "*"),
        ("\\times", "*"),
        ("\\le", "<="),
        ("\\ge", ">="),
    ] {
        s = s.replace(from, to);
    }
    s = s.trim().trim_end_matches('.').trim().to_string();
    // "x = 3" -> "3" (a single variable on the left).
    static ASSIGN: OnceLock<Regex> = OnceLock::new();
    let assign = ASSIGN.get_or_init(|| Regex::new(r"^[a-zA-Z]\s*=\s*(.+)$").expect("regex"));
    if let Some(c) = assign.captures(&s) {
        s = c[1].to_string();
    }
    // Units and words after a number: "12 cm", "5 dollars", "3 apples".
    static UNIT: OnceLock<Regex> = OnceLock::new();
    let unit = UNIT.get_or_init(|| {
        Regex::new(r"^(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?:\^?\{?[0-9]\}?)?\s*[a-zA-Z][a-zA-Z ]*$")
            .expect("regex")
    });
    if let Some(c) = unit.captures(&s) {
        s = c[1].to_string();
    }
    s.retain(|c| !c.is_whitespace());
    // Thousands separators: 1,234,567.5 -> 1234567.5.
    static THOUSANDS: OnceLock<Regex> = OnceLock::new();
    let th = THOUSANDS.get_or_init(|| Regex::new(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$").expect("regex"));
    if th.is_match(&s) {
        s = s.replace(',', "");
    }
    // \frac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2}.
    static FRAC: OnceLock<Regex> = OnceLock::new();
    let frac = FRAC.get_or_init(|| Regex::new(r"\\frac(\d)(\d)").expect("regex"));
    s = frac.replace_all(&s, "\\frac{$1}{$2}").into_owned();
    static SQRT: OnceLock<Regex> = OnceLock::new();
    let sqrt = SQRT.get_or_init(|| Regex::new(r"\\sqrt(\d+)").expect("regex"));
    s = sqrt.replace_all(&s, "\\sqrt{$1}").into_owned();
    // A lone choice letter in parentheses: "(B)" -> "B".
    if s.len() == 3
        && s.starts_with('(')
        && s.ends_with(')')
        && s.as_bytes()[1].is_ascii_alphabetic()
    {
        s = s[1..2].to_string();
    }
    s
}

/// A tiny evaluator for numeric expressions: + - * / ^, parentheses, unary minus, decimals,
/// `\frac{a}{b}`, `\sqrt{x}`, `\pi`, implicit multiplication by a following bracket or `\`.
struct Eval<'a> {
    s: &'a [u8],
    i: usize,
    /// Nesting depth, bounded so hostile input cannot overflow the stack.
    depth: usize,
}

impl Eval<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn eat_str(&mut self, t: &str) -> bool {
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Option<f64> {
        self.depth += 1;
        if self.depth > 64 {
            return None;
        }
        let v = self.sum();
        self.depth -= 1;
        v
    }

    fn sum(&mut self) -> Option<f64> {
        let mut v = self.term()?;
        loop {
            if self.eat(b'+') {
                v += self.term()?;
            } else if self.eat(b'-') {
                v -= self.term()?;
            } else {
                return Some(v);
            }
        }
    }

    fn term(&mut self) -> Option<f64> {
        let mut v = self.unary()?;
        loop {
            if self.eat(b'*') {
                v *= self.unary()?;
            } else if self.eat(b'/') {
                v /= self.unary()?;
            } else if matches!(self.peek(), Some(b'(') | Some(b'\\')) {
                v *= self.unary()?;
            } else {
                return Some(v);
            }
        }
    }

    fn unary(&mut self) -> Option<f64> {
        // Signs iteratively: "-------1" must not recurse per sign.
        let mut sign = 1.0;
        loop {
            if self.eat(b'-') {
                sign = -sign;
            } else if !self.eat(b'+') {
                break;
            }
        }
        Some(sign * self.power()?)
    }

    fn power(&mut self) -> Option<f64> {
        let base = self.atom()?;
        if self.eat(b'^') {
            let e = if self.eat(b'{') {
                let e = self.expr()?;
                self.eat(b'}').then_some(e)?
            } else {
                self.atom()?
            };
            return Some(base.powf(e));
        }
        Some(base)
    }

    fn group(&mut self) -> Option<f64> {
        if !self.eat(b'{') {
            return None;
        }
        let v = self.expr()?;
        self.eat(b'}').then_some(v)
    }

    fn atom(&mut self) -> Option<f64> {
        if self.eat(b'(') {
            let v = self.expr()?;
            return self.eat(b')').then_some(v);
        }
        if matches!(self.peek(), Some(b'{')) {
            return self.group();
        }
        if self.eat_str("\\frac") {
            let (a, b) = (self.group()?, self.group()?);
            return Some(a / b);
        }
        if self.eat_str("\\sqrt") {
            return Some(self.group()?.sqrt());
        }
        if self.eat_str("\\pi") {
            return Some(std::f64::consts::PI);
        }
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9') | Some(b'.')) {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()?
            .parse()
            .ok()
    }
}

/// The numeric value of a normalised answer, if it is a closed numeric expression.
pub fn numeric_value(s: &str) -> Option<f64> {
    let mut e = Eval {
        s: s.as_bytes(),
        i: 0,
        depth: 0,
    };
    let v = e.expr()?;
    (e.i == s.len() && v.is_finite()).then_some(v)
}

fn split_top_level(s: &str) -> Vec<&str> {
    let (mut depth, mut last, mut parts) = (0i32, 0usize, vec![]);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[last..i]);
                last = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[last..]);
    parts
}

fn equal_normalized(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (numeric_value(a), numeric_value(b)) {
        return (x - y).abs() <= 1e-9 * y.abs().max(1.0);
    }
    // Tuples and intervals: same brackets, elementwise equal.
    let brackets = |s: &str| -> Option<(char, char, String)> {
        let (f, l) = (s.chars().next()?, s.chars().last()?);
        (matches!(f, '(' | '[') && matches!(l, ')' | ']') && s.len() >= 2)
            .then(|| (f, l, s[1..s.len() - 1].to_string()))
    };
    match (brackets(a), brackets(b)) {
        (Some((fa, la, ia)), Some((fb, lb, ib))) if fa == fb && la == lb => {
            let (pa, pb) = (split_top_level(&ia), split_top_level(&ib));
            pa.len() > 1
                && pa.len() == pb.len()
                && pa.iter().zip(&pb).all(|(x, y)| equal_normalized(x, y))
        }
        _ => {
            // Bare comma lists ("1, 2").
            let (pa, pb) = (split_top_level(a), split_top_level(b));
            pa.len() > 1
                && pa.len() == pb.len()
                && pa.iter().zip(&pb).all(|(x, y)| equal_normalized(x, y))
        }
    }
}

/// Whether two answers are mathematically the same (after normalisation).
pub fn equivalent(answer: &str, reference: &str) -> bool {
    let (a, b) = (normalize(answer), normalize(reference));
    !a.is_empty() && equal_normalized(&a, &b)
}

/// Short-RL's math reward (spec §1.2): four-tag format, answer in the last `<answer>` block.
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

/// EasyR1's math reward (spec §1.3): overall = (1 − w)·accuracy + w·format, w = 0.1 by default.
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
        extract_boxed(response).is_some_and(|a| equivalent(&a, ground_truth)),
    ));
    (
        (1.0 - format_weight) * accuracy + format_weight * format,
        accuracy,
        format,
    )
}

#[cfg(test)]
#[path = "math_tests.rs"]
mod tests;
