//! Math answers: the adversarial corpus, the completions that once stalled or crashed the
//! verifier (issue 42: a 10,000-factor product took 35 s, a 20,000-term sum overflowed the
//! stack) and their relatives: long sums, products, quotients and ± chains, nested brackets,
//! parentheses, braces, `\frac`s, `\sqrt`s and `\text`s, power towers, huge factorials,
//! binomials, powers and literals, long lists, million-character strings, and 40k-character
//! completions of each kind. The tests below run it on a 256 KiB stack; `cargo xtask bench
//! verify` times it against a normal answer.

use super::{Unverifiable, Verdict};

/// One hostile input: the completion, the reference it is checked against, and the verdict
/// the verifier must give (never `Equal`).
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub completion: String,
    pub reference: String,
    pub expect: Verdict,
}

const OVER: Verdict = Verdict::Unverifiable(Unverifiable::BudgetExceeded);

/// Characters of a long completion (the issue's measure: a model's longest outputs).
pub const LONG: usize = 40_000;

/// Answer characters just under the size budget: what the parser and evaluator must bound.
const NEAR: usize = super::MAX_ANSWER_CHARS - 100;

/// A unit of text repeated to about `chars` characters.
fn repeat_to(unit: &str, chars: usize) -> String {
    unit.repeat((chars / unit.len()).max(1))
}

/// `open` n times, `core`, `close` n times, about `chars` characters in all.
fn nest(open: &str, core: &str, close: &str, chars: usize) -> String {
    let n = chars / (open.len() + close.len()).max(1);
    format!("{}{core}{}", open.repeat(n), close.repeat(n))
}

/// The shapes of long answers, each generated to about `chars` characters.
fn shapes(chars: usize) -> Vec<(&'static str, String)> {
    vec![
        ("sum 1+1+…", format!("1{}", repeat_to("+1", chars))),
        ("product 2*2*…", format!("2{}", repeat_to("*2", chars))),
        ("implicit product π π …", repeat_to("\\pi ", chars)),
        ("quotient 1/2/2/…", format!("1{}", repeat_to("/2", chars))),
        ("± chain", format!("1{}", repeat_to(" \\pm 1", chars))),
        ("factorials 3!!!…", format!("3{}", repeat_to("!", chars))),
        ("parentheses", nest("(", "1", ")", chars)),
        ("brackets", nest("[", "1", "]", chars)),
        ("braces", nest("{", "1", "}", chars)),
        ("set braces", nest("\\{", "1", "\\}", chars)),
        ("\\frac nest", nest("\\frac{1}{", "2", "}", chars)),
        ("\\sqrt nest", nest("\\sqrt{", "2", "}", chars)),
        ("\\text nest", nest("\\text{", "1", "}", chars)),
        ("power tower", nest("2^{", "2", "}", chars)),
        ("digits", repeat_to("9", chars)),
        ("decimal", format!("0.{}1", repeat_to("0", chars))),
        ("list 1, 2, 3, …", list(chars, |k| k.to_string())),
        ("list x+1, x+2, …", list(chars, |k| format!("x+{k}"))),
        (
            "list \\sqrt{2}, \\sqrt{3}, …",
            list(chars, |k| format!("\\sqrt{{{k}}}")),
        ),
        (
            "list 1/2, 1/3, …",
            list(chars, |k| format!("\\frac{{1}}{{{k}}}")),
        ),
        ("list of ±", list(chars, |k| format!("{k} \\pm x"))),
    ]
}

/// `item(1), item(2), …` to about `chars` characters: distinct items, so removing duplicates
/// compares every pair.
fn list(chars: usize, item: fn(usize) -> String) -> String {
    let mut s = item(1);
    let mut k = 2;
    while s.len() + 2 + item(k).len() <= chars {
        s.push_str(", ");
        s.push_str(&item(k));
        k += 1;
    }
    s
}

/// Reasoning-like filler of about `chars` characters.
fn prose(chars: usize) -> String {
    repeat_to("We add the terms and check the result again. ", chars)
}

/// The corpus: every case must return quickly, whatever the stack, and never be judged equal.
pub fn corpus() -> Vec<Case> {
    let case = |name: String, completion: String, reference: &str, expect| Case {
        name,
        completion,
        reference: reference.into(),
        expect,
    };
    let mut out = vec![];
    for (shape, body) in shapes(LONG) {
        // The whole completion one answer: over the size budget before it is read.
        out.push(case(
            format!("{shape}, {LONG}-char answer"),
            format!("\\boxed{{{body}}}"),
            "7",
            OVER,
        ));
    }
    for (shape, body) in shapes(NEAR) {
        // Within the size budget, after 36k characters of reasoning: the depth, bit and
        // work limits decide.
        out.push(case(
            format!(
                "{shape}, {}-char answer in a {LONG}-char completion",
                body.len()
            ),
            format!("{}\\boxed{{{body}}}", prose(LONG - body.len())),
            "7",
            OVER,
        ));
    }
    let short = [
        ("huge factorial", "100000!", "1", OVER),
        ("huge binomial", "\\binom{10^9}{5*10^8}", "1", OVER),
        ("tiny power", "0.1^{99999999}", "0", OVER),
        ("power tower of 9s", "9^{9^{9^{9}}}", "1", OVER),
        ("power of 2^65536", "2^{2^{2^{2^{2}}}}", "1", OVER),
        ("float overflow", "\\pi^{1000}", "\\pi^{1001}", OVER),
        ("exponent literal", "1e-999999", "0", OVER),
        (
            "huge root index",
            "\\sqrt[1000000]{2}",
            "1",
            Verdict::NotEqual,
        ),
        (
            "signs",
            &*format!("{}1", "-".repeat(NEAR - 1)),
            "7",
            Verdict::NotEqual,
        ),
    ];
    for (name, answer, reference, expect) in short {
        out.push(case(
            name.into(),
            format!("\\boxed{{{answer}}}"),
            reference,
            expect,
        ));
    }
    let million = 1_000_000;
    out.push(case(
        "a million digits, no box".into(),
        repeat_to("1", million),
        "1",
        OVER,
    ));
    out.push(case(
        "a million unclosed boxes".into(),
        repeat_to("\\boxed{", million),
        "1",
        OVER,
    ));
    out.push(case(
        "a million characters of reasoning, a wrong box".into(),
        format!("{}\\boxed{{3}}", prose(million)),
        "4",
        Verdict::NotEqual,
    ));
    out.push(case(
        "a million characters of boxes".into(),
        repeat_to("\\boxed{1}", million),
        "2",
        Verdict::NotEqual,
    ));
    out.push(case(
        format!("{LONG}-char separators between two boxes"),
        format!("\\boxed{{1}}{}\\boxed{{1}}", repeat_to(" ,", LONG)),
        "2",
        Verdict::NotEqual,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::super::{check, score_easyr1_checked, score_short_rl_checked};
    use super::*;

    /// Every case returns its verdict on a 256 KiB stack (the parse, evaluation and drop of
    /// what it builds are bounded in depth), and no scorer counts it correct; an unverifiable
    /// answer is reported as such by the scorers that read it.
    #[test]
    fn the_corpus_is_bounded_never_correct_and_reported() {
        let run = || {
            for c in corpus() {
                let got = check(&c.completion, &c.reference);
                assert_eq!(got, c.expect, "{}", c.name);
                let (_, accuracy, _, why) = score_easyr1_checked(
                    &format!("<think></think>{}", c.completion),
                    &c.reference,
                    0.1,
                );
                assert_eq!(accuracy, 0.0, "{}", c.name);
                let answer = super::super::extract_final_boxed(&c.completion);
                let boxed = answer.as_deref().map(|a| check(a, &c.reference));
                assert_eq!(why, boxed.and_then(Verdict::unverifiable), "{}", c.name);
                let tagged = format!(
                    "Assistant: <think></think><answer>{}</answer>",
                    answer.as_deref().unwrap_or("none")
                );
                let (reward, correct, why) = score_short_rl_checked(&tagged, &c.reference);
                assert!(!correct && reward < 0.0, "{}", c.name);
                if answer.is_some() && c.expect == OVER {
                    assert_eq!(why, Some(Unverifiable::BudgetExceeded), "{}", c.name);
                }
            }
        };
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(run)
            .expect("spawn")
            .join()
            .expect("the corpus on a 256 KiB stack");
    }

    #[test]
    fn the_corpus_covers_the_issue() {
        let cases = corpus();
        assert!(cases.len() >= 40, "{}", cases.len());
        let long = cases.iter().filter(|c| c.completion.len() >= LONG).count();
        assert!(long >= 2 * shapes(10).len(), "{long} long completions");
        assert!(cases.iter().all(|c| c.expect != Verdict::Equal));
    }
}
