//! Property tests: for arbitrary finite inputs no shaper returns NaN or inf, the methods' bounds
//! hold, and order-free methods are invariant to the order of samples in a group.

use crate::baselines::*;
use crate::care::Care;
use crate::grpo_lambda::{GrpoLambda, TieBreak};
use crate::short_rl::ShortRl;
use crate::step_grpo::StepGrpo;
use crate::*;
use proptest::prelude::*;

fn sample() -> impl Strategy<Value = SampleStat> {
    (
        0usize..20_000,
        any::<bool>(),
        -5.0f64..5.0,
        any::<bool>(),
        1usize..40,
        any::<bool>(),
    )
        .prop_map(
            |(len, correct, base_reward, format_ok, steps, truncated)| SampleStat {
                len,
                correct,
                base_reward,
                format_ok,
                steps,
                truncated,
                scorable: true,
            },
        )
}

fn groups() -> impl Strategy<Value = Vec<Group>> {
    prop::collection::vec(prop::collection::vec(sample(), 1..10), 1..6).prop_map(|gs| {
        gs.into_iter()
            .enumerate()
            .map(|(i, s)| Group {
                prompt_id: i as u64,
                samples: s,
                target_len: Some(1000 + i * 100),
            })
            .collect()
    })
}

fn methods() -> Vec<Method> {
    vec![
        Method::None,
        Method::Kimi(Kimi::default()),
        Method::Kimi(Kimi {
            equal_len_zero: false,
            ..Default::default()
        }),
        Method::ShortRl(ShortRl::default()),
        Method::ShortRl(ShortRl {
            correct_only: false,
            ..Default::default()
        }),
        Method::GrpoLambda(GrpoLambda {
            lambda: 0.5,
            ..Default::default()
        }),
        Method::Care(Care::default()),
        Method::Care(Care {
            magnitude: true,
            ..Default::default()
        }),
        Method::StepGrpo(StepGrpo::default()),
        Method::CosFn(CosFn::default()),
        Method::Efficient(Efficient::default()),
        Method::Alp(Alp {
            beta: 0.5,
            l_max: 16384,
        }),
        Method::Dast(Dast::default()),
        Method::L1(L1 {
            mode: L1Mode::Exact,
        }),
        Method::L1(L1 { mode: L1Mode::Max }),
    ]
}

fn run(m: &Method, gs: &[Group]) -> Shaped {
    let cfg = RewardConfig {
        shaper: m.clone(),
        overlong: Some(DapoOverlong {
            l_max: 16384,
            l_cache: 4096,
            factor: 1.0,
        }),
    };
    cfg.shape(
        gs,
        &StepCtx { step: 1, seed: 2 },
        &mut ShaperState::default(),
    )
    .expect("shape")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_shaper_and_estimator_is_finite(gs in groups()) {
        for m in methods() {
            let s = run(&m, &gs);
            prop_assert!(s.rewards.iter().flatten().all(|x| x.is_finite()), "{m:?}: {:?}", s.rewards);
            prop_assert!(s.diagnostics.values().all(|x| x.is_finite()));
            for est in [Advantage::default(), Advantage::DrGrpo, Advantage::Rloo, Advantage::ReinforcePp { eps: 1e-8 }] {
                let a = est.compute(&gs, &s).expect("valid batch");
                prop_assert!(a.values.iter().flatten().all(|x| x.is_finite()), "{m:?} {est:?}");
            }
        }
    }

    #[test]
    fn spec_bounds_hold(gs in groups()) {
        let mut st = crate::short_rl::ShortRlState::default();
        let (terms, _, _) = ShortRl::default().length_terms(&gs, &mut st);
        for (g, t) in gs.iter().zip(&terms) {
            for (s, x) in g.samples.iter().zip(t) {
                let ok = if s.correct { (-0.5..=0.5).contains(x) } else { *x == 0.0 };
                prop_assert!(ok, "short-rl term {} for {:?}", x, s);
            }
        }
        let cfg = |m| RewardConfig { shaper: m, overlong: None };
        let ctx = StepCtx::default();
        let shaped = |m| cfg(m).shape(&gs, &ctx, &mut ShaperState::default()).expect("shape").rewards.concat();
        let lam = shaped(Method::GrpoLambda(GrpoLambda { lambda: 1.0, ..Default::default() }));
        prop_assert!(lam.iter().all(|x| (0.0..=1.0).contains(x)));
        prop_assert!(shaped(Method::Care(Care::default())).iter().all(|x| (-1.0..=2.0).contains(x)));
        prop_assert!(shaped(Method::StepGrpo(StepGrpo::default())).iter().all(|x| (0.0..=0.9 * 1.5 + 0.1).contains(x)));
        prop_assert!(shaped(Method::Kimi(Kimi::default())).iter().zip(gs.iter().flat_map(|g| &g.samples)).all(|(r, s)| (r - s.base_reward).abs() <= 0.5 + 1e-9));
        let d = DapoOverlong { l_max: 16384, l_cache: 4096, factor: 1.0 };
        prop_assert!(gs.iter().flat_map(|g| &g.samples).all(|s| (-1.0..=0.0).contains(&d.penalty(s.len))));
    }

    #[test]
    fn order_free_methods_ignore_sample_order(gs in groups(), rot in 0usize..10) {
        // Rotate every group's samples; distinct lengths keep CARE's split free of ties.
        let distinct: Vec<Group> = gs.iter().map(|g| {
            let mut g = g.clone();
            for (i, s) in g.samples.iter_mut().enumerate() { s.len = s.len * 16 + i; }
            g
        }).collect();
        let rotated: Vec<Group> = distinct.iter().map(|g| {
            let mut g = g.clone();
            let k = rot % g.samples.len();
            g.samples.rotate_left(k);
            g
        }).collect();
        let mut ms = methods();
        ms.push(Method::Care(Care { tie_break: TieBreak::Index, ..Default::default() }));
        for m in ms {
            let a = run(&m, &distinct);
            let b = run(&m, &rotated);
            for (k, g) in distinct.iter().enumerate() {
                let n = g.samples.len();
                let r = rot % n;
                for i in 0..n {
                    prop_assert!((a.rewards[k][(i + r) % n] - b.rewards[k][i]).abs() < 1e-12, "{m:?}");
                }
            }
        }
    }
}
