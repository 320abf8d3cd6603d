//! Property tests: no parser or scorer panics on arbitrary strings.

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
