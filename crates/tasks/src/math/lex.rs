//! Math answers, first stage: LaTeX / plain text / Unicode -> a flat token stream. Spacing
//! commands, `\left`/`\right`, `$` delimiters, degrees and percent signs disappear here;
//! `\text{...}`-like wrappers become words marked as text; numbers keep their exact digits
//! (thousands separators `1,234` / `10{,}000` / `1\,000` joined, scientific `2.5E-2` read).
//! The parser (parse.rs) turns the tokens into an expression form.

use super::budget::Budget;

/// One lexical unit of an answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Digits with an optional fraction and a decimal exponent: mantissa digits, the number of
    /// digits after the point (None: no point written), exponent.
    Num {
        digits: String,
        decimals: Option<usize>,
        exp: i32,
    },
    /// A run of ASCII letters; `text` when it came from `\text{...}` and the like.
    Word {
        w: String,
        text: bool,
    },
    /// A backslash command (`frac`, `sqrt`, `pi`, `le`, ...), by name.
    Cmd(String),
    /// One character of punctuation or an operator: + - * / ^ _ = < > ! ( ) [ ] { } , ; | :
    Op(char),
    /// `\{` and `\}`: set braces.
    SetOpen,
    SetClose,
    /// A gap the source marked with `\,` between two digit groups (`1\,000`): joins them.
    ThinSpace,
    /// Any other whitespace: keeps `1, 234` from reading as 1234. Dropped after joining.
    Gap,
}

/// Commands that are only spacing or sizing and vanish.
const SILENT: &[&str] = &[
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "displaystyle",
    "textstyle",
    "scriptstyle",
    "quad",
    "qquad",
    "limits",
    "nolimits",
    "middle",
];

/// Wrappers whose braced content is read as text words (units, "or", "yes").
const TEXT_WRAPPERS: &[&str] = &[
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mbox",
    "hbox",
    "operatorname",
    "boldsymbol",
    "mathbb",
];

/// Replaces the Unicode forms models and datasets write with their LaTeX spelling.
fn unicode_to_latex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\u{2212}' | '\u{2013}' | '\u{2014}' | '\u{2012}' => out.push('-'),
            '\u{00d7}' | '\u{22c5}' | '\u{00b7}' | '\u{2219}' => out.push_str(" \\cdot "),
            '\u{00f7}' | '\u{2215}' => out.push('/'),
            '\u{03c0}' => out.push_str(" \\pi "),
            '\u{221a}' => out.push_str("\\sqrt "),
            '\u{2264}' | '\u{2a7d}' => out.push_str(" \\le "),
            '\u{2265}' | '\u{2a7e}' => out.push_str(" \\ge "),
            '\u{2260}' => out.push_str(" \\ne "),
            '\u{00b1}' => out.push_str(" \\pm "),
            '\u{2213}' => out.push_str(" \\mp "),
            '\u{221e}' => out.push_str(" \\infty "),
            '\u{222a}' => out.push_str(" \\cup "),
            '\u{2208}' => out.push_str(" \\in "),
            '\u{2205}' => out.push_str(" \\emptyset "),
            '\u{00b0}' => {} // degrees: 90° is 90
            '\u{2032}' => out.push('\''),
            '\u{00a0}' | '\u{2009}' | '\u{202f}' => out.push(' '),
            '\u{00b2}' => out.push_str("^2"),
            '\u{00b3}' => out.push_str("^3"),
            c => out.push(c),
        }
    }
    out
}

/// `\text{\text{…}}` nested deeper than this is refused (a budget refusal): the lexer
/// recurses once per wrapper, and each level scans its body for the closing brace.
const MAX_WRAPPERS: usize = 16;

/// The tokens of `src`, or None when it holds something no answer holds (an unbalanced
/// wrapper, a stray backslash) or wrappers nested past [`MAX_WRAPPERS`] (then `budget` is
/// marked exceeded).
pub(crate) fn lex(src: &str, budget: &Budget) -> Option<Vec<Tok>> {
    let s = unicode_to_latex(src);
    let s = s
        .replace("^{\\circ}", "")
        .replace("^\\circ", "")
        .replace("{,}", ",");
    let b: Vec<char> = s.chars().collect();
    let mut out = vec![];
    lex_into(&b, false, &mut out, MAX_WRAPPERS, budget)?;
    Some(join_numbers(out))
}

fn lex_into(
    b: &[char],
    text: bool,
    out: &mut Vec<Tok>,
    wrappers_left: usize,
    budget: &Budget,
) -> Option<()> {
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() || c == '~' {
            if out.last() != Some(&Tok::Gap) {
                out.push(Tok::Gap);
            }
            i += 1;
        } else if c == '$' || c == '%' {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && b.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let (tok, n) = number(&b[i..]);
            out.push(tok);
            i += n;
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            out.push(Tok::Word {
                w: b[start..i].iter().collect(),
                text,
            });
        } else if c == '\\' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && b[j].is_ascii_alphabetic() {
                j += 1;
            }
            if j == start {
                // A one-character command: \{ \} \, \; \! \: \  \% \$ \( \) \[ \] \\
                let &d = b.get(start)?;
                match d {
                    '{' => out.push(Tok::SetOpen),
                    '}' => out.push(Tok::SetClose),
                    ',' | ' ' => out.push(Tok::ThinSpace),
                    ';' | '!' | ':' => out.push(Tok::Gap),
                    '%' | '$' | '(' | ')' | '[' | ']' | '\\' => {}
                    _ => return None,
                }
                i = start + 1;
                continue;
            }
            let name: String = b[start..j].iter().collect();
            i = j;
            if SILENT.contains(&name.as_str()) {
                continue;
            }
            if TEXT_WRAPPERS.contains(&name.as_str()) {
                if wrappers_left == 0 {
                    return budget.refuse();
                }
                let (body, end) = braced(b, i)?;
                lex_into(body, true, out, wrappers_left - 1, budget)?;
                i = end;
                continue;
            }
            match name.as_str() {
                "dfrac" | "tfrac" | "cfrac" => out.push(Tok::Cmd("frac".into())),
                "leq" | "leqslant" | "le" => out.push(Tok::Cmd("le".into())),
                "geq" | "geqslant" | "ge" => out.push(Tok::Cmd("ge".into())),
                "neq" | "ne" => out.push(Tok::Cmd("ne".into())),
                "lt" => out.push(Tok::Op('<')),
                "gt" => out.push(Tok::Op('>')),
                "times" | "cdot" | "ast" => out.push(Tok::Op('*')),
                "div" => out.push(Tok::Op('/')),
                "degree" | "circ" => {}
                "varnothing" => out.push(Tok::Cmd("emptyset".into())),
                "lbrace" => out.push(Tok::SetOpen),
                "rbrace" => out.push(Tok::SetClose),
                _ => out.push(Tok::Cmd(name)),
            }
        } else if "+-*/^_=<>!()[]{},;|:'.".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else if c.is_alphabetic() {
            // Other scripts' letters: a one-letter variable name.
            out.push(Tok::Word {
                w: c.to_string(),
                text,
            });
            i += 1;
        } else {
            return None;
        }
    }
    Some(())
}

/// The body of the braced group opening at `b[i]` (spaces before it skipped) and the index
/// after its closing brace.
fn braced(b: &[char], mut i: usize) -> Option<(&[char], usize)> {
    while b.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if b.get(i) != Some(&'{') {
        return None;
    }
    let mut depth = 0usize;
    for (j, &c) in b.iter().enumerate().skip(i) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&b[i + 1..j], j + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// One number at the start of `b`: digits, an optional fraction, an optional exponent written
/// `e3` / `E-2` (only when a digit follows, so `2e` stays 2·e).
fn number(b: &[char]) -> (Tok, usize) {
    let mut i = 0;
    let mut digits = String::new();
    while i < b.len() && b[i].is_ascii_digit() {
        digits.push(b[i]);
        i += 1;
    }
    let mut decimals = None;
    if i < b.len() && b[i] == '.' && b.get(i + 1).is_some_and(char::is_ascii_digit) {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            digits.push(b[i]);
            i += 1;
        }
        decimals = Some(i - start);
    } else if i < b.len() && b[i] == '.' && !b.get(i + 1).is_some_and(|c| c.is_alphabetic()) {
        // "5." is 5 (a sentence's full stop or a bare point).
        i += 1;
    }
    let mut exp = 0i32;
    if i < b.len() && (b[i] == 'e' || b[i] == 'E') {
        let mut j = i + 1;
        let neg = b.get(j) == Some(&'-');
        if matches!(b.get(j), Some('-') | Some('+')) {
            j += 1;
        }
        let start = j;
        while j < b.len() && b[j].is_ascii_digit() && j - start < 6 {
            j += 1;
        }
        if j > start && !b.get(j).is_some_and(|c| c.is_ascii_alphanumeric()) {
            let e: i32 = b[start..j].iter().collect::<String>().parse().unwrap_or(0);
            exp = if neg { -e } else { e };
            i = j;
        }
    }
    (
        Tok::Num {
            digits,
            decimals,
            exp,
        },
        i,
    )
}

/// Joins thousands groups: `1,234,567` (a first group of one to three digits, then groups of
/// exactly three after a comma with no space, the last may carry decimals), `1\,000`,
/// `1\ 000` and `1 000 000` (one separator kind throughout: `1,000 000` is not joined).
/// `1, 234` stays a list of two numbers and `12 34` two numbers. Drops the spacing marks.
fn join_numbers(toks: Vec<Tok>) -> Vec<Tok> {
    let mut out: Vec<Tok> = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if let Tok::Num {
            digits,
            decimals: None,
            exp: 0,
        } = &toks[i]
        {
            if (1..=3).contains(&digits.len()) {
                let (mut joined, mut decimals, mut j) = (digits.clone(), None, i + 1);
                let mut kind = None;
                while decimals.is_none() {
                    let (
                        Some(sep),
                        Some(Tok::Num {
                            digits: g,
                            decimals: d,
                            exp: 0,
                        }),
                    ) = (toks.get(j), toks.get(j + 1))
                    else {
                        break;
                    };
                    // Commas, or spaces (thin or plain); never the two mixed.
                    let this = match sep {
                        Tok::Op(',') => ',',
                        Tok::ThinSpace | Tok::Gap => ' ',
                        _ => break,
                    };
                    if kind.is_some_and(|k| k != this) || g.len() - d.unwrap_or(0) != 3 {
                        break;
                    }
                    kind = Some(this);
                    joined.push_str(g);
                    decimals = *d;
                    j += 2;
                }
                if j > i + 1 {
                    out.push(Tok::Num {
                        digits: joined,
                        decimals,
                        exp: 0,
                    });
                    i = j;
                    continue;
                }
            }
        }
        if !matches!(toks[i], Tok::ThinSpace | Tok::Gap) {
            out.push(toks[i].clone());
        }
        i += 1;
    }
    out
}
