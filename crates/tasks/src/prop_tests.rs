//! Property tests: no parser or scorer panics on arbitrary strings (nor on deeply nested or
//! hostile LaTeX), and every well-formed generated math answer is equivalent to itself and to
//! its re-spacing.

use crate::{kk, math};
use proptest::prelude::*;

fn texty() -> impl Strategy<Value = String> {
    // Arbitrary unicode mixed with the syntax the parsers look for.
    prop::collection::vec(
        prop_oneof![
            any::<char>().prop_map(|c| c.to_string()),
            Just("\\boxed{".to_string()),
            Just("}".to_string()),
            Just("{".to_string()),
            Just("\\frac".to_string()),
            Just("<answer>".to_string()),
            Just("</answer>".to_string()),
            Just("<think>".to_string()),
            Just("</think>".to_string()),
            Just("<|im_start|>assistant".to_string()),
            Just(" is a knight".to_string()),
            Just("Zoey".to_string()),
            Just("^".to_string()),
            Just("(".to_string()),
            Just("####".to_string()),
        ],
        0..40,
    )
    .prop_map(|v| v.concat())
}

/// A well-formed LaTeX expression, defined for every value of its variables: numbers,
/// decimals, fractions, mixed numbers, variables, radicals, π, powers, sums, products.
fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        (0u32..1000).prop_map(|n| n.to_string()),
        (0u32..100, 1u32..100).prop_map(|(a, b)| format!("{a}.{b}")),
        (1u32..20, 1u32..20).prop_map(|(a, b)| format!("\\frac{{{a}}}{{{b}}}")),
        (1u32..9, 1u32..9, 2u32..9).prop_map(|(w, a, b)| format!("{w}\\frac{{{a}}}{{{b}}}")),
        prop::sample::select(vec!["x", "y", "n", "\\pi", "\\alpha"]).prop_map(str::to_string),
    ];
    leaf.prop_recursive(4, 24, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} + {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} - {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a})({b})")),
            // Denominators and radicands kept positive: every expression is defined everywhere.
            (inner.clone(), inner.clone())
                .prop_map(|(a, b)| format!("\\frac{{{a}}}{{({b})^2 + 1}}")),
            (inner.clone(), 2u32..4).prop_map(|(a, e)| format!("({a})^{{{e}}}")),
            inner.clone().prop_map(|a| format!("\\sqrt{{({a})^2 + 1}}")),
            inner.clone().prop_map(|a| format!("-({a})")),
        ]
    })
}

/// A well-formed answer: an expression, a list, a set, an interval, an equation or ±.
fn answer() -> impl Strategy<Value = String> {
    prop_oneof![
        expr(),
        (expr(), expr()).prop_map(|(a, b)| format!("{a}, {b}")),
        (expr(), expr()).prop_map(|(a, b)| format!("\\{{{a}, {b}\\}}")),
        (expr(), expr()).prop_map(|(a, b)| format!("[{a}, {b})")),
        expr().prop_map(|a| format!("x = {a}")),
        expr().prop_map(|a| format!("\\pm {a}")),
        expr().prop_map(|a| format!("x \\le {a}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_well_formed_answer_equals_itself(a in answer()) {
        prop_assert!(math::equivalent(&a, &a), "{a}");
        let spaced = a.replace(' ', "  ").replace('+', " + ");
        prop_assert!(math::equivalent(&spaced, &a), "{spaced} vs {a}");
        prop_assert!(math::equivalent(&format!("\\boxed{{{a}}}"), &a), "boxed {a}");
    }

    /// Rewritten forms of an expression are it; the expression plus one is not.
    #[test]
    fn rewritten_expressions_compare_by_value(a in expr()) {
        prop_assert!(math::equivalent(&format!("1 \\cdot ({a})"), &a), "1·({a})");
        prop_assert!(math::equivalent(&format!("{a} + 0"), &a), "{a} + 0");
        prop_assert!(math::equivalent(&format!("0 + {a}"), &a), "0 + {a}");
        // Floats tell x + 1 from x only while x is moderate (a documented limit of the
        // evaluation at points): check where |value| < 1e6 at a typical point.
        let at = a.replace("\\alpha", "1.3").replace(['x', 'y', 'n'], "1.3");
        if math::numeric_value(&at).is_some_and(|v| v.abs() < 1e6) {
            prop_assert!(!math::equivalent(&format!("({a}) + 1"), &a), "({a}) + 1 accepted for {a}");
        }
    }

    #[test]
    fn hostile_latex_never_panics(depth in 1usize..3000, c in prop::sample::select(vec!["{", "(", "\\frac", "\\sqrt", "2^", "-", "\\{", "[", "|"])) {
        let s = c.repeat(depth);
        let _ = math::equivalent(&s, "1");
        let _ = math::equivalent(&format!("{s}1"), &s);
        let _ = math::equivalent("9^{9^{9^{9}}}", "1");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn parsers_and_scorers_never_panic(a in texty(), b in texty()) {
        let _ = math::extract_boxed(&a);
        let _ = math::extract_gsm8k(&a);
        let _ = math::extract_answer_tag(&a);
        let _ = math::normalize(&a);
        let _ = math::numeric_value(&a);
        let _ = math::equivalent(&a, &b);
        let (total, _) = math::score_short_rl(&a, &b);
        prop_assert!([3.0, -0.5, -3.0].contains(&total));
        let (o, _, _) = math::score_easyr1(&a, &b, 0.1);
        prop_assert!((0.0..=1.0).contains(&o));
        let s = kk::score(&a, "(1) Zoey is a knight\n(2) Oliver is a knave");
        prop_assert!([3.0, -0.5, -1.0, -3.0].contains(&s.total));
        let _ = kk::parse_solution(&b);
        let v = crate::testbed::verify(&a, 3);
        prop_assert!(v.reward == 0.0 || v.reward == 1.0);
        let _ = crate::template::render_plain(&a, &[("quiz", "x")]);
    }
}
