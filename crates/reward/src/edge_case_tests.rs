//! One test per edge case of each method (Short-RL, GRPO-λ, CARE, Step-GRPO, the baselines; the
//! cases are listed with each method in docs/methods.md).

use crate::baselines::{Alp, DapoOverlong, Dast, Kimi, L1Mode, L1};
use crate::care::{signal_stability, Care};
use crate::grpo_lambda::{GrpoLambda, Rounding, TieBreak};
use crate::short_rl::{ShortRl, ShortRlState};
use crate::step_grpo::{count_steps, default_triggers, AlphaOn, StepBaseline, StepGrpo, StepScope};
use crate::tests::{check, group, shape, spec_group};
use crate::*;
use rand::SeedableRng;

// ---- Short-RL edge cases (docs/methods.md, Short-RL) ----

fn short_terms(g: Group, tau_len: f64) -> Vec<f64> {
    ShortRl {
        tau_len,
        ..Default::default()
    }
    .length_terms(&[g], &mut ShortRlState::default())
    .0
    .remove(0)
}

#[test]
fn short_rl_edge_cases() {
    // No correct completion: every term 0.
    check(
        &short_terms(group(&[10, 20], &[false, false]), 0.0),
        &[0.0, 0.0],
    );
    // Exactly one correct: +0.5.
    check(
        &short_terms(group(&[10, 20], &[false, true]), 0.0),
        &[0.0, 0.5],
    );
    // All correct of equal length: all +0.5 (also with τ = 0).
    check(
        &short_terms(group(&[30, 30, 30], &[true, true, true]), 0.0),
        &[0.5, 0.5, 0.5],
    );
    // Spread smaller than τ: all inside the nucleus.
    check(
        &short_terms(group(&[100, 150, 250], &[true, true, true]), 200.0),
        &[0.5, 0.5, 0.5],
    );
    // Truncated but correct counts with its length.
    let mut g = group(&[100, 4096], &[true, true]);
    g.samples[1].truncated = true;
    check(&short_terms(g, 0.0), &[0.5, 0.5 - 3996.0 / (3996.0 + 1e-5)]);
}

#[test]
fn short_rl_gate_tracks_acc_max_and_zero_correct_batch() {
    let s = ShortRl {
        tau_len: 0.0,
        tau_acc: 0.05,
        ..Default::default()
    };
    let mut st = ShortRlState::default();
    // First batch: gate on, acc_max updated before the test.
    let good = group(&[10, 20, 30, 40], &[true, true, true, false]);
    let out = s.shape(&[good], &mut st);
    assert_eq!((out.diagnostics["gate_on"], st.acc_max), (1.0, 0.75));
    // A worse batch: gate off, γ_ℓ = −1, rewards are the base rewards.
    let bad = group(&[10, 20, 30, 40], &[true, false, false, false]);
    let out = s.shape(&[bad], &mut st);
    assert_eq!(
        (out.diagnostics["gate_on"], out.diagnostics["gamma_l"]),
        (0.0, -1.0)
    );
    check(&out.rewards[0], &[3.0, -0.5, -0.5, -0.5]);
    // A batch with no correct completion: gate off here, and no effect either way.
    let none = group(&[10, 20], &[false, false]);
    let out = s.shape(&[none], &mut st);
    check(&out.rewards[0], &[-0.5, -0.5]);
    // τ_acc = 1 keeps the gate always on (the dense reward); presets match the paper.
    assert_eq!(
        ShortRl::preset("D1"),
        Some(ShortRl {
            tau_len: 0.0,
            tau_acc: 1.0,
            ..Default::default()
        })
    );
    assert!(ShortRl::preset("D2").is_none());
    // Switching D3 off keeps the reward on after the bad batch; switching D2 off ignores τ_ℓ.
    let no_gate = ShortRl {
        acc_gate: false,
        ..s.clone()
    };
    let out = no_gate.shape(
        &[group(&[10, 20, 30, 40], &[true, true, false, false])],
        &mut st,
    );
    assert_eq!(out.diagnostics["gate_on"], 1.0);
    let no_nucleus = ShortRl {
        tau_len: 1000.0,
        nucleus: false,
        ..Default::default()
    };
    let (t, _, _) = no_nucleus.length_terms(
        &[group(&[10, 20], &[true, true])],
        &mut ShortRlState::default(),
    );
    check(&t[0], &[0.5, 0.5 - 10.0 / (10.0 + 1e-5)]);
}

// ---- GRPO-λ edge cases (docs/methods.md, GRPO-λ) ----

#[test]
fn grpo_lambda_selection_count_ties_and_unsolved_groups() {
    let groups: Vec<Group> = (0..128)
        .map(|k| group(&[10, 20], &[k % 3 != 0, k % 2 == 0]))
        .collect();
    let g = GrpoLambda::default();
    let ctx = StepCtx { step: 3, seed: 7 };
    assert_eq!(g.selected(&groups, &ctx).len(), 26);
    assert_eq!(
        GrpoLambda {
            rounding: Rounding::Floor,
            ..g.clone()
        }
        .selected(&groups, &ctx)
        .len(),
        25
    );
    assert_eq!(
        GrpoLambda {
            rounding: Rounding::Ceil,
            ..g.clone()
        }
        .selected(&groups, &ctx)
        .len(),
        26
    );
    // Seeded tie-break: reproducible for a seed, different across seeds, always top-ranked first.
    let a = g.selected(&groups, &ctx);
    assert_eq!(a, g.selected(&groups, &ctx));
    assert_ne!(a, g.selected(&groups, &StepCtx { step: 4, seed: 7 }));
    assert!(a.iter().all(|&k| groups[k].accuracy() == 1.0));
    // Groups with no correct answer are never selected.
    let unsolved = vec![group(&[1, 2], &[false, false]); 10];
    assert!(GrpoLambda {
        lambda: 1.0,
        ..g.clone()
    }
    .selected(&unsolved, &ctx)
    .is_empty());
}

#[test]
fn grpo_lambda_reward_edge_cases() {
    let all_e = GrpoLambda {
        lambda: 1.0,
        ..Default::default()
    };
    // One correct: z = 0 -> 0.9; equal correct lengths: all 0.9; truncated counts as wrong.
    check(
        &shape(
            Method::GrpoLambda(all_e.clone()),
            &[group(&[5, 9], &[true, false])],
        )
        .rewards[0],
        &[0.9, 0.0],
    );
    check(
        &shape(
            Method::GrpoLambda(all_e.clone()),
            &[group(&[7, 7], &[true, true])],
        )
        .rewards[0],
        &[0.9, 0.9],
    );
    let mut g = group(&[5, 4096], &[true, true]);
    g.samples[1].truncated = true;
    check(
        &shape(Method::GrpoLambda(all_e), &[g]).rewards[0],
        &[0.9, 0.0],
    );
    // Groups outside E keep the plain 0/1 reward.
    let none = GrpoLambda {
        lambda: 0.0,
        ..Default::default()
    };
    check(
        &shape(Method::GrpoLambda(none), &[group(&[5, 9], &[true, false])]).rewards[0],
        &[1.0, 0.0],
    );
}

// ---- CARE edge cases (docs/methods.md, CARE) ----

#[test]
fn care_edge_cases() {
    let care = Care {
        l_max: 100,
        tie_break: TieBreak::Index,
        ..Default::default()
    };
    // All correct: d = 0, r = y.
    check(
        &shape(
            Method::Care(care.clone()),
            &[group(&[10, 50], &[true, true])],
        )
        .rewards[0],
        &[1.0, 1.0],
    );
    // Odd G: the median is in neither half but still gets the term.
    let odd = group(&[10, 50, 90], &[false, true, true]);
    check(
        &shape(Method::Care(care.clone()), &[odd]).rewards[0],
        &[0.1, 1.5, 1.9],
    );
    // G = 1: d = 0.
    check(
        &shape(Method::Care(care.clone()), &[group(&[10], &[true])]).rewards[0],
        &[1.0],
    );
    // Lengths above L_max clamp to 1; fixed directions are the short/long proxies.
    let short = Care {
        fixed_direction: Some(-1),
        ..care.clone()
    };
    check(
        &shape(Method::Care(short), &[group(&[50, 500], &[true, false])]).rewards[0],
        &[0.5, -1.0],
    );
    // Ties at the split: seeded keys decide, reproducibly.
    let tied = group(&[10, 10, 10, 10], &[true, false, true, false]);
    let seeded = Care {
        l_max: 100,
        ..Default::default()
    };
    let ctx = StepCtx { step: 1, seed: 2 };
    let a = seeded.shape(std::slice::from_ref(&tied), &ctx);
    assert_eq!(a, seeded.shape(std::slice::from_ref(&tied), &ctx));
    assert!(Care {
        fixed_direction: Some(0),
        ..care
    }
    .validate()
    .is_err());
}

#[test]
fn care_signal_stability_is_exact_when_subsample_is_the_group() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let (p, nz) = signal_stability(&spec_group(), 8, 20, &mut rng);
    assert_eq!((p, nz), (1.0, Some(1.0)));
    let (p4, _) = signal_stability(&spec_group(), 4, 200, &mut rng);
    assert!(p4 > 0.0 && p4 < 1.0, "{p4}");
}

// ---- Step-GRPO (docs/methods.md, Step-GRPO) ----

#[test]
fn step_grpo_edge_cases() {
    let g = |k: &[usize], c: &[bool]| {
        Group::new(
            0,
            k.iter()
                .zip(c)
                .map(|(&k, &c)| SampleStat {
                    steps: k,
                    ..SampleStat::new(1, c, 0.0)
                })
                .collect(),
        )
    };
    // No correct: the bracket is dropped, R = α·format.
    check(
        &StepGrpo::default()
            .shape(&[g(&[1, 9], &[false, false])])
            .rewards[0],
        &[0.1, 0.1],
    );
    // α on accuracy (the notes' reading) and the all-sample baseline.
    let notes = StepGrpo {
        alpha_on: AlphaOn::Accuracy,
        ..Default::default()
    };
    check(
        &notes.shape(&[g(&[2, 2], &[true, false])]).rewards[0],
        &[1.0, 0.9],
    );
    let all = StepGrpo {
        baseline: StepBaseline::All,
        ..Default::default()
    };
    let r = all.shape(&[g(&[1, 3], &[true, false])]).rewards[0][0];
    assert!((r - (0.9 * (1.0 - 0.5 * (-0.5f64).tanh()) + 0.1)).abs() < 1e-12);
    // w/o step reward: EasyR1 overall.
    let off = StepGrpo {
        step_reward: false,
        ..Default::default()
    };
    check(
        &off.shape(&[g(&[1, 9], &[true, true])]).rewards[0],
        &[1.0, 1.0],
    );
}

#[test]
fn step_counting_by_trigger_words() {
    let t = default_triggers();
    let check_k = |text: &str, scope, k| assert_eq!(count_steps(text, &t, scope), k, "{text:?}");
    check_k(
        "Let x = 2. Wait, no. Alternatively x = 3. Wait.",
        StepScope::Thinking,
        4,
    );
    check_k(
        "Waiting is not a trigger, nor is await or Wait_",
        StepScope::Thinking,
        1,
    );
    check_k("wait lower case is not counted", StepScope::Thinking, 1);
    check_k("A Wait</think>Wait after thinking", StepScope::Thinking, 2);
    check_k("A Wait</think>Wait after thinking", StepScope::Whole, 3);
    check_k("", StepScope::Thinking, 1);
    let multi = vec!["But wait".to_string(), "Wait".to_string()];
    assert_eq!(
        count_steps("Hmm. But wait, Wait!", &multi, StepScope::Whole),
        3
    );
}

// ---- Baselines (docs/methods.md, Baselines) ----

#[test]
fn baseline_edge_cases() {
    // Kimi: equal lengths give 0 (paper) or +0.5 (Short-RL's code); the warm-up step.
    let eq = group(&[5, 5], &[true, false]);
    check(&Kimi::default().terms(&eq), &[0.0, 0.0]);
    check(
        &Kimi {
            equal_len_zero: false,
            ..Default::default()
        }
        .terms(&eq),
        &[0.5, 0.0],
    );
    let k = Kimi {
        start_step: 10,
        ..Default::default()
    };
    check(
        &k.rewards(&spec_group(), 9),
        &spec_group()
            .samples
            .iter()
            .map(|s| s.base_reward)
            .collect::<Vec<_>>(),
    );
    // DAPO validation: L_cache = 0 and L_cache > L_max are rejected with the value named.
    let e = DapoOverlong {
        l_max: 10,
        l_cache: 0,
        factor: 1.0,
    }
    .validate()
    .expect_err("zero");
    assert!(e.contains("l_cache") && e.contains('0'), "{e}");
    assert!(DapoOverlong {
        l_max: 10,
        l_cache: 20,
        factor: 1.0
    }
    .validate()
    .is_err());
    // DAST with no correct answer: budget = L_max, no NaN.
    let none = group(&[100, 200], &[false, false]);
    assert_eq!(Dast { l_max: 1000 }.budget(&none), 1000.0);
    check(&Dast { l_max: 1000 }.rewards(&none), &[-0.91, -0.82]);
    // ALP: per-token cost β/N·max(p, 1/K).
    check(
        &Alp {
            beta: 1.0,
            l_max: 1000,
        }
        .rewards(&group(&[100, 200], &[true, false])),
        &[1.0 - 0.05, -0.1],
    );
    check(
        &Alp {
            beta: 1.0,
            l_max: 1000,
        }
        .rewards(&group(&[100], &[false])),
        &[-0.1],
    );
    // L1 exact and max, and a missing target is an error naming the prompt.
    check(
        &[
            L1 {
                mode: L1Mode::Exact,
            }
            .reward(1300, true, 1000),
            L1 { mode: L1Mode::Max }.reward(1300, true, 1000),
        ],
        &[0.9, 0.2],
    );
    let err = RewardConfig {
        shaper: Method::L1(L1::default()),
        overlong: None,
    }
    .shape(
        &[spec_group()],
        &StepCtx::default(),
        &mut ShaperState::default(),
    )
    .expect_err("no target");
    assert!(err.to_string().contains("prompt 0"), "{err}");
}

#[test]
fn overlong_combines_with_any_method() {
    let cfg = RewardConfig {
        shaper: Method::ShortRl(ShortRl::default()),
        overlong: Some(DapoOverlong {
            l_max: 4096,
            l_cache: 1024,
            factor: 1.0,
        }),
    };
    let r = cfg
        .shape(
            &[spec_group()],
            &StepCtx::default(),
            &mut ShaperState::default(),
        )
        .expect("shape");
    assert!((r.rewards[0][7] - (-0.5 - 1.0)).abs() < 1e-12);
}
