//! Regression tests for the defects an independent reward implementation found (issue 15,
//! items 1–6), each named by its item, plus property tests that the fixed behaviour holds on
//! random batches: equal-reward groups get 0 whatever ε, truncated = incorrect in GRPO-λ,
//! λ·B rounds like exact arithmetic, unscorable samples move nobody's reward, and a shaper's
//! output of the wrong shape is an error.

use crate::baselines::{CosFn, DapoOverlong, Kimi};
use crate::grpo_lambda::{GrpoLambda, Rounding, TieBreak};
use crate::short_rl::ShortRl;
use crate::tests::{check, group};
use crate::*;
use proptest::prelude::*;

fn one(r: Vec<f64>) -> Shaped {
    Shaped {
        rewards: vec![r],
        ..Default::default()
    }
}

fn grpo(eps: f64) -> Advantage {
    Advantage::Grpo {
        std: true,
        ddof: 1,
        eps,
        norm: Norm::Group,
        difficulty: None,
    }
}

#[test]
fn item1_eps_zero_equal_rewards_get_zero_not_nan() {
    let g2 = group(&[10, 20], &[true, true]);
    let a = grpo(0.0)
        .compute(&[g2], &one(vec![1.0, 1.0]))
        .expect("valid batch");
    assert_eq!(a.values[0], vec![0.0, 0.0]);
    assert_eq!(a.zero_std_groups, 1);
    // 0.1 three times: the mean is 0.1 + 2.8e-17, the std ~1.7e-17; before the fix −0.8165.
    let g3 = group(&[10, 20, 30], &[false, false, false]);
    for est in [
        grpo(0.0),
        grpo(1e-6),
        Advantage::DrGrpo,
        Advantage::Rloo,
        Advantage::ReinforcePp { eps: 0.0 },
    ] {
        let a = est
            .compute(std::slice::from_ref(&g3), &one(vec![0.1; 3]))
            .expect("valid batch");
        assert_eq!(a.values[0], vec![0.0; 3], "{est:?}");
    }
}

#[test]
fn item2_grpo_lambda_truncated_correct_counts_as_wrong() {
    let mut g = group(&[8192, 100, 200], &[true, true, false]);
    g.samples[0].truncated = true;
    let m = GrpoLambda {
        lambda: 0.0,
        ..Default::default()
    };
    let s = m.shape(std::slice::from_ref(&g), &StepCtx::default());
    assert_eq!(s.rewards[0], vec![0.0, 1.0, 0.0]);
    // A group whose only correct samples are truncated has p = 0: never selected.
    let mut all_trunc = group(&[50, 60], &[true, false]);
    all_trunc.samples[0].truncated = true;
    let good = group(&[50, 60], &[true, false]);
    let m = GrpoLambda {
        lambda: 0.5,
        tie_break: TieBreak::Index,
        ..Default::default()
    };
    assert_eq!(m.selected(&[all_trunc, good], &StepCtx::default()), vec![1]);
}

#[test]
fn item3_grpo_without_std_does_not_divide_a_singleton() {
    let a = Advantage::Grpo {
        std: false,
        ddof: 1,
        eps: 0.5,
        norm: Norm::Group,
        difficulty: None,
    }
    .compute(&[group(&[5], &[true])], &one(vec![3.0]))
    .expect("valid batch");
    assert_eq!(a.values[0], vec![3.0]);
    // With std (verl): mean 0, std 1.
    let a = grpo(0.5)
        .compute(&[group(&[5], &[true])], &one(vec![3.0]))
        .expect("valid batch");
    check(&a.values[0], &[2.0]);
}

#[test]
fn item4_grpo_lambda_group_count_is_exact() {
    let n = |lambda, rounding, b| {
        GrpoLambda {
            lambda,
            rounding,
            ..Default::default()
        }
        .group_count(b)
    };
    assert_eq!(n(0.29, Rounding::Floor, 100), 29);
    assert_eq!(n(0.58, Rounding::Round, 25), 15);
    assert_eq!(n(0.2, Rounding::Round, 128), 26);
    assert_eq!(n(0.29, Rounding::Ceil, 100), 29);
    assert_eq!(n(0.291, Rounding::Ceil, 100), 30);
}

#[test]
fn item5_unscorable_samples_move_no_reward() {
    // Kimi: a 0-length unscorable sample would widen the group's length range.
    let base = group(&[100, 200, 300], &[true, false, true]);
    let mut with = base.clone();
    let mut bad = SampleStat::new(0, false, 0.0);
    bad.scorable = false;
    with.samples.insert(1, bad);
    let kimi = RewardConfig {
        shaper: Method::Kimi(Kimi::default()),
        overlong: None,
    };
    let st = &mut ShaperState::default();
    let a = kimi
        .shape(std::slice::from_ref(&base), &StepCtx::default(), st)
        .expect("valid batch");
    let b = kimi
        .shape(std::slice::from_ref(&with), &StepCtx::default(), st)
        .expect("valid batch");
    let mut expect = a.rewards[0].clone();
    expect.insert(1, 0.0);
    assert_eq!(b.rewards[0], expect);
    // Short-RL: unscorable samples do not lower the batch accuracy, so the gate stays on.
    let cfg = RewardConfig {
        shaper: Method::ShortRl(ShortRl::default()),
        overlong: None,
    };
    let mut st = ShaperState::default();
    st.short_rl.acc_max = 2.0 / 3.0;
    let mut many_bad = base.clone();
    many_bad.samples.extend([bad; 5]);
    let s = cfg
        .shape(&[many_bad], &StepCtx::default(), &mut st)
        .expect("valid batch");
    assert_eq!(s.diagnostics["gate_on"], 1.0);
    check(&[s.diagnostics["acc"]], &[2.0 / 3.0]);
}

#[test]
fn item6_invalid_config_and_wrong_shapes_are_errors() {
    let cfg = RewardConfig {
        shaper: Method::None,
        overlong: Some(DapoOverlong {
            l_max: 100,
            l_cache: 200,
            factor: 1.0,
        }),
    };
    let g = group(&[10, 20], &[true, false]);
    let e = cfg
        .shape(
            std::slice::from_ref(&g),
            &StepCtx::default(),
            &mut ShaperState::default(),
        )
        .expect_err("must be an error");
    assert!(
        e.0.contains("l_cache (200) must not exceed l_max (100)"),
        "{e}"
    );
    // CosFn near usize::MAX: no overflow, the exceed reward.
    let c = CosFn::default();
    assert_eq!(c.reward(usize::MAX - 3, true), c.r_exceed);
    // A custom shaper returning too few groups, or a short row.
    let two = [g.clone(), g.clone()];
    let e = grpo(1e-6)
        .compute(&two, &one(vec![1.0, 0.0]))
        .expect_err("must be an error");
    assert!(e.0.contains("rewards for 1 groups, the batch has 2"), "{e}");
    let e = grpo(1e-6)
        .compute(std::slice::from_ref(&g), &one(vec![1.0]))
        .expect_err("must be an error");
    assert!(
        e.0.contains("1 rewards for prompt 0, which has 2 samples"),
        "{e}"
    );
    let e = shape_scorable(std::slice::from_ref(&g), |_| Ok(Shaped::default()))
        .expect_err("must be an error");
    assert!(e.0.contains("the batch has 1"), "{e}");
}

fn sample() -> impl Strategy<Value = SampleStat> {
    (
        0usize..5000,
        any::<bool>(),
        0u8..4,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(len, correct, r, truncated, scorable)| SampleStat {
            len,
            correct,
            // Few distinct rewards, so equal-reward groups are common.
            base_reward: [0.1, 1.0, -0.5, 3.0][r as usize],
            format_ok: true,
            steps: 1 + len % 7,
            truncated,
            scorable,
        })
}

fn batch() -> impl Strategy<Value = Vec<Group>> {
    prop::collection::vec(prop::collection::vec(sample(), 1..8), 1..6).prop_map(|gs| {
        gs.into_iter()
            .enumerate()
            .map(|(i, s)| Group {
                prompt_id: i as u64,
                samples: s,
                target_len: Some(500),
            })
            .collect()
    })
}

fn every_method() -> Vec<Method> {
    use crate::baselines::*;
    vec![
        Method::None,
        Method::Kimi(Kimi::default()),
        Method::ShortRl(ShortRl::default()),
        Method::GrpoLambda(GrpoLambda {
            lambda: 0.5,
            ..Default::default()
        }),
        Method::Care(Default::default()),
        Method::StepGrpo(Default::default()),
        Method::CosFn(CosFn::default()),
        Method::Efficient(Efficient::default()),
        Method::Alp(Alp {
            beta: 0.5,
            l_max: 4096,
        }),
        Method::Dast(Dast::default()),
        Method::L1(L1 { mode: L1Mode::Max }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Items 1 and 3: never NaN, equal-reward groups get exactly 0, for every ε ≥ 0.
    #[test]
    fn equal_groups_get_zero_for_any_eps(gs in batch(), eps in prop::sample::select(vec![0.0, 1e-12, 1e-6, 0.5])) {
        let shaped = Shaped::base(&gs);
        for est in [grpo(eps), Advantage::Grpo { std: true, ddof: 0, eps, norm: Norm::Group, difficulty: None }, Advantage::Grpo { std: false, ddof: 1, eps, norm: Norm::Group, difficulty: None }, Advantage::DrGrpo, Advantage::Rloo] {
            let a = est.compute(&gs, &shaped).expect("valid batch");
            for (g, v) in gs.iter().zip(&a.values) {
                prop_assert!(v.iter().all(|x| x.is_finite()));
                let r: Vec<f64> = g.samples.iter().filter(|s| s.scorable).map(|s| s.base_reward).collect();
                if r.len() > 1 && r.iter().all(|x| *x == r[0]) {
                    prop_assert!(v.iter().all(|x| *x == 0.0), "{est:?}: {v:?}");
                }
            }
        }
        let a = Advantage::ReinforcePp { eps }.compute(&gs, &shaped).expect("valid batch");
        prop_assert!(a.values.iter().flatten().all(|x| x.is_finite()));
    }

    /// Item 2: GRPO-λ on a batch equals GRPO-λ on the batch with truncated samples marked wrong.
    #[test]
    fn grpo_lambda_truncated_is_wrong(gs in batch(), lambda in 0.0f64..=1.0) {
        let m = GrpoLambda { lambda, ..Default::default() };
        let ctx = StepCtx { step: 3, seed: 9 };
        let marked: Vec<Group> = gs.iter().map(|g| Group { samples: g.samples.iter().map(|s| SampleStat { correct: s.correct && !s.truncated, ..*s }).collect(), ..g.clone() }).collect();
        prop_assert_eq!(m.shape(&gs, &ctx).rewards, m.shape(&marked, &ctx).rewards);
        for (g, r) in gs.iter().zip(&m.shape(&gs, &ctx).rewards) {
            for (s, x) in g.samples.iter().zip(r) {
                if s.truncated { prop_assert_eq!(*x, 0.0); }
            }
        }
    }

    /// Item 4: the group count equals integer arithmetic for λ in whole percent.
    #[test]
    fn group_count_matches_integers(pct in 0usize..=100, b in 0usize..600) {
        let n = |rounding| GrpoLambda { lambda: pct as f64 / 100.0, rounding, ..Default::default() }.group_count(b);
        prop_assert_eq!(n(Rounding::Floor), pct * b / 100);
        prop_assert_eq!(n(Rounding::Ceil), (pct * b).div_ceil(100));
        prop_assert_eq!(n(Rounding::Round), (2 * pct * b + 100) / 200);
    }

    /// Item 5: for every method, the scorable samples' rewards are those of the batch without
    /// the unscorable samples, and an unscorable sample's reward is 0.
    #[test]
    fn unscorable_samples_are_invisible(gs in batch()) {
        let kept: Vec<Group> = gs.iter().map(|g| Group { samples: g.samples.iter().filter(|s| s.scorable).copied().collect(), ..g.clone() }).collect();
        let ctx = StepCtx { step: 2, seed: 5 };
        for m in every_method() {
            let cfg = RewardConfig { shaper: m.clone(), overlong: None };
            let full = cfg.shape(&gs, &ctx, &mut ShaperState::default()).expect("valid batch");
            let part = cfg.shape(&kept, &ctx, &mut ShaperState::default()).expect("valid batch");
            prop_assert_eq!(&full.diagnostics, &part.diagnostics, "{:?}", m);
            for ((g, f), p) in gs.iter().zip(&full.rewards).zip(&part.rewards) {
                let mut p = p.iter();
                for (s, x) in g.samples.iter().zip(f) {
                    let want = if s.scorable { *p.next().expect("valid batch") } else { 0.0 };
                    prop_assert_eq!(*x, want, "{:?}", m);
                }
            }
        }
    }

    /// Item 6: a shaper that returns the wrong shape is an error, never a panic or a silent 0.
    #[test]
    fn wrong_shapes_are_errors(mut gs in batch(), drop_group in any::<bool>()) {
        // All scorable: `shape_scorable` checks against the groups the shaper saw.
        for s in gs.iter_mut().flat_map(|g| g.samples.iter_mut()) {
            s.scorable = true;
        }
        let mut s = Shaped::base(&gs);
        if drop_group { s.rewards.pop(); } else { s.rewards[0].pop(); }
        prop_assert!(grpo(1e-6).compute(&gs, &s).is_err());
        prop_assert!(shape_scorable(&gs, |_| Ok(s.clone())).is_err());
    }
}
