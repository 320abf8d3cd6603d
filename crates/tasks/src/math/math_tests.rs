//! Tests of the math verifier: answer extraction, equivalence (the original 64-case table,
//! updated where the verifier's rules changed: decimals written by the ground truth are
//! approximate, exact ground truths are exact), and the Short-RL / EasyR1 scorers. The graded
//! table of issue 21 is in graded_tests.rs.

use super::*;

#[test]
fn extraction() {
    assert_eq!(
        extract_boxed("so \\boxed{\\frac{1}{2}} and \\boxed{x^{2}+1}").as_deref(),
        Some("x^{2}+1")
    );
    assert_eq!(extract_boxed("\\boxed 5$").as_deref(), Some("5"));
    assert_eq!(extract_boxed("\\boxed{unbalanced"), None);
    assert_eq!(extract_boxed("no box"), None);
    // Deep nesting is rejected, not a stack overflow.
    assert_eq!(numeric_value(&"(".repeat(100_000)), None);
    assert_eq!(
        numeric_value(&format!("{}1", "-".repeat(100_001))),
        Some(-1.0)
    );
    assert_eq!(numeric_value(&"2^".repeat(100_000)), None);
    assert_eq!(extract_gsm8k("work\n#### 1,234").as_deref(), Some("1,234"));
    assert_eq!(
        extract_answer_tag("<answer>1</answer> <answer> 2 </answer>").as_deref(),
        Some("2")
    );
}

/// (answer, reference, equivalent?)
const TABLE: &[(&str, &str, bool)] = &[
    ("42", "42", true),
    ("42.0", "42", true),
    ("042", "42", true),
    ("-7", "-7", true),
    ("- 7", "-7", true),
    ("3.14", "3.140", true),
    ("0.5", "\\frac{1}{2}", true),
    ("\\frac12", "0.5", true),
    ("\\dfrac{3}{4}", "0.75", true),
    ("\\tfrac{3}{4}", "\\frac{3}{4}", true),
    ("3/4", "\\frac{3}{4}", true),
    ("\\frac{6}{8}", "\\frac{3}{4}", true),
    ("-\\frac{1}{3}", "\\frac{-1}{3}", true),
    ("1,000", "1000", true),
    ("1,234,567", "1234567", true),
    ("12,5", "12.5", false),
    ("50\\%", "50", true),
    ("50%", "50", true),
    ("\\$5", "5", true),
    ("$5.00$", "5", true),
    ("90^\\circ", "90", true),
    ("90^{\\circ}", "90", true),
    ("\\text{5 apples}", "5", true),
    ("5 \\text{ squared}", "5", false),
    ("12 cm", "12", true),
    ("12 \\text{ cm}", "12", true),
    ("5 dollars", "5", true),
    ("x = 3", "3", true),
    ("y=-2", "-2", true),
    ("\\left(1, 2\\right)", "(1,2)", true),
    ("(1, 2)", "(2, 1)", false),
    ("[0, 1)", "[0,1)", true),
    ("[0, 1]", "[0, 1)", false),
    ("(\\frac{1}{2}, 3)", "(0.5, 3.0)", true),
    ("1, 2, 3", "1,2,3", true),
    ("\\sqrt{2}", "\\sqrt2", true),
    ("2\\sqrt{2}", "\\sqrt{8}", true),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", true),
    ("2^{10}", "1024", true),
    ("2^3", "8", true),
    ("3\\pi", "3\\pi", true),
    // A decimal ground truth is written approximately: π rounds to it at five places.
    ("\\pi", "3.14159", true),
    ("\\pi", "3.1416", true),
    ("\\pi", "3.1417", false),
    ("2\\times 3", "6", true),
    ("2 \\cdot 3", "6", true),
    ("(2+3)*4", "20", true),
    ("10^{-2}", "0.01", true),
    ("1e3", "1000", true),
    ("\\boxed{7}", "7", true),
    ("7.", "7", true),
    ("\\,7\\,", "7", true),
    ("\\!7", "7", true),
    ("~7", "7", true),
    ("(B)", "B", true),
    ("B", "C", false),
    ("x^2+1", "x^2+1", true),
    ("x^2 + 1", "x^{2}+1", true),
    ("\\mathrm{m}", "m", true),
    ("41", "42", false),
    ("0.333", "\\frac{1}{3}", false),
    // An exact ground truth: a decimal answer is not it, however close.
    ("0.3333333333", "\\frac{1}{3}", false),
    ("\\frac{1}{3}", "0.333", true),
    ("", "0", false),
    ("\\frac{1}{0}", "0", false),
    ("abc", "abd", false),
    ("1000000", "10^6", true),
    ("-0", "0", true),
];

#[test]
fn equivalence_table() {
    assert!(TABLE.len() >= 60);
    let failures: Vec<_> = TABLE
        .iter()
        .filter(|(a, b, want)| equivalent(a, b) != *want)
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn short_rl_math_scorer() {
    let ok =
        |ans: &str| format!("<|im_start|>assistant\n<think> work </think><answer>{ans}</answer>");
    assert_eq!(
        score_short_rl(&ok("\\frac{1}{2}"), "\\boxed{0.5}"),
        (3.0, true)
    );
    assert_eq!(score_short_rl(&ok("3"), "0.5"), (-0.5, false));
    assert_eq!(score_short_rl(&ok(""), "0.5"), (-3.0, false));
    assert_eq!(score_short_rl(&ok("1"), ""), (-3.0, false));
    assert_eq!(
        score_short_rl("<|im_start|>assistant\n<think> w </think> 0.5", "0.5"),
        (-3.0, false)
    );
    assert_eq!(
        score_short_rl("no marker <think></think><answer>0.5</answer>", "0.5"),
        (-3.0, false)
    );
}

#[test]
fn easyr1_math_scorer() {
    let (o, a, f) = score_easyr1("<think> w </think> so \\boxed{12}", "12", 0.1);
    assert_eq!((a, f), (1.0, 1.0));
    assert!((o - 1.0).abs() < 1e-12);
    assert_eq!(
        score_easyr1("< think > w < / think > \\boxed{3}", "12", 0.1).2,
        1.0
    );
    let (o, a, f) = score_easyr1("\\boxed{12}", "12", 0.1);
    assert_eq!((a, f), (1.0, 0.0));
    assert!((o - 0.9).abs() < 1e-12);
    assert_eq!(score_easyr1("<think></think> 12", "12", 0.1).0, 0.0);
}

/// The verdict behind `equivalent`: normal answers are equal or not, as before; what the
/// budget refuses is unverifiable, never equal (issue 42).
#[test]
fn verdicts_and_the_budget() {
    assert_eq!(check("\\boxed{\\frac{1}{2}}", "0.5"), Verdict::Equal);
    assert_eq!(check("x^2 + 2x + 1", "(x+1)^2"), Verdict::Equal);
    assert_eq!(check("3", "4"), Verdict::NotEqual);
    assert_eq!(check("", "4"), Verdict::NotEqual);
    let over = Verdict::Unverifiable(Unverifiable::BudgetExceeded);
    // 0.1^99999999 is a positive rational too large to compute exactly, not 0: refused, and
    // the float path does not round it to 0 instead.
    assert_eq!(check("0.1^{99999999}", "0"), over);
    assert_eq!(check("0", "0.1^{99999999}"), over);
    assert!(!equivalent("0.1^{99999999}", "0"));
    assert_eq!(check("0.1^{3}", "0.001"), Verdict::Equal);
    assert_eq!(check("1^{99999999}", "1"), Verdict::Equal);
    // Exact values stop at MAX_BITS; a float that overflows is refused, not ∞ = ∞.
    assert_eq!(check("2^{2048}", "2^{2048} + 1"), Verdict::NotEqual);
    assert_eq!(check("2^{5000}", "3^{5000}"), over);
    assert_eq!(check("\\pi^{1000}", "\\pi^{1001}"), over);
    // The size budget reads the extracted answer, not the completion around it.
    let long = format!("{} \\boxed{{12}}", "reasoning ".repeat(5000));
    assert_eq!(check(&long, "12"), Verdict::Equal);
    assert_eq!(check(&"1".repeat(MAX_ANSWER_CHARS + 1), "1"), over);
    assert_eq!(
        score_short_rl_checked(
            "Assistant: <think></think><answer>0.1^{99999999}</answer>",
            "0"
        ),
        (-0.5, false, Some(Unverifiable::BudgetExceeded))
    );
    assert_eq!(
        score_easyr1_checked("<think></think>\\boxed{0.1^{99999999}}", "0", 0.1),
        (0.1, 0.0, 1.0, Some(Unverifiable::BudgetExceeded))
    );
}
