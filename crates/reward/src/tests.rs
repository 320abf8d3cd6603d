//! Spec §8 test vectors (to 1e-6) and one test per row of the spec's edge-case tables.

use crate::baselines::{Alp, CosFn, DapoOverlong, Dast, Efficient, Kimi, L1Mode, L1};
use crate::care::{direction, signal_stability, Care};
use crate::grpo_lambda::{GrpoLambda, Rounding, TieBreak};
use crate::metrics::*;
use crate::short_rl::{ShortRl, ShortRlState};
use crate::step_grpo::{count_steps, default_triggers, AlphaOn, StepBaseline, StepGrpo, StepScope};
use crate::*;
use rand::SeedableRng;

const L: [usize; 8] = [500, 650, 800, 1200, 900, 700, 3000, 4096];
const Y: [bool; 8] = [true, true, false, true, true, false, true, false];

fn group(lens: &[usize], correct: &[bool]) -> Group {
    Group::new(
        0,
        lens.iter()
            .zip(correct)
            .map(|(&l, &c)| SampleStat::new(l, c, if c { 3.0 } else { -0.5 }))
            .collect(),
    )
}

fn spec_group() -> Group {
    group(&L, &Y)
}

fn check(got: &[f64], expect: &[f64]) {
    assert_eq!(got.len(), expect.len(), "{got:?} vs {expect:?}");
    for (i, (g, e)) in got.iter().zip(expect).enumerate() {
        assert!(
            (g - e).abs() <= 1e-6,
            "entry {i}: got {g}, expected {e} (all: {got:?})"
        );
    }
}

fn shape(method: Method, groups: &[Group]) -> Shaped {
    let cfg = RewardConfig {
        shaper: method,
        overlong: None,
    };
    cfg.validate().expect("valid");
    cfg.shape(groups, &StepCtx::default(), &mut ShaperState::default())
        .expect("shape")
}

#[test]
fn short_rl_vector_and_gamma() {
    let mut st = ShortRlState::default();
    let (terms, gate, _) = ShortRl::default().length_terms(&[spec_group()], &mut st);
    assert!(gate);
    check(
        &terms[0],
        &[0.5, 0.5, 0.0, 0.22, 0.34, 0.0, -0.499999998, 0.0],
    );
    let s = shape(Method::ShortRl(ShortRl::default()), &[spec_group()]);
    check(
        &s.rewards[0],
        &[3.5, 3.5, -0.5, 3.22, 3.34, -0.5, 2.500000002, -0.5],
    );
    assert_eq!(s.diagnostics["gamma_l"], 0.6);
}

#[test]
fn kimi_vector() {
    check(
        &Kimi::default().terms(&spec_group()),
        &[0.5, 0.458287, 0.0, 0.305339, 0.388765, 0.0, -0.195217, -0.5],
    );
}

#[test]
fn grpo_lambda_and_efficient_vectors() {
    let g = GrpoLambda {
        lambda: 1.0,
        ..Default::default()
    };
    check(
        &shape(Method::GrpoLambda(g), &[spec_group()]).rewards[0],
        &[
            0.939154, 0.931932, 0.0, 0.902757, 0.919066, 0.0, 0.825346, 0.0,
        ],
    );
    check(
        &Efficient { alpha: 0.1 }.rewards(&spec_group()),
        &[
            0.969577, 0.965966, 0.0, 0.951378, 0.959533, 0.0, 0.912673, 0.0,
        ],
    );
}

#[test]
fn care_vectors() {
    let keyed: Vec<_> = L
        .iter()
        .zip(Y)
        .enumerate()
        .map(|(i, (&l, y))| (l, y, i as u64))
        .collect();
    assert_eq!(direction(&keyed), (1, 0.25));
    let care = Care {
        tie_break: TieBreak::Index,
        ..Default::default()
    };
    check(
        &shape(Method::Care(care.clone()), &[spec_group()]).rewards[0],
        &[
            1.081380, 1.105794, 0.130208, 1.195312, 1.146484, 0.113932, 1.488281, 0.666667,
        ],
    );
    let mag = Care {
        magnitude: true,
        ..care
    };
    check(
        &shape(Method::Care(mag), &[spec_group()]).rewards[0],
        &[
            1.020345, 1.026449, 0.032552, 1.048828, 1.036621, 0.028483, 1.122070, 0.166667,
        ],
    );
}

#[test]
fn cosfn_dapo_dast_vectors() {
    let c = CosFn::default();
    check(
        &L.iter()
            .zip(Y)
            .map(|(&l, y)| c.reward(l, y))
            .collect::<Vec<_>>(),
        &[
            1.997002, 1.994936, -9.923361, 1.982811, 1.990307, -9.941288, 1.895786, -8.117449,
        ],
    );
    assert_eq!(c.reward(14330, true), -10.0);
    let d = DapoOverlong {
        l_max: 4096,
        l_cache: 1024,
        factor: 1.0,
    };
    check(
        &L.iter().map(|&l| d.penalty(l)).collect::<Vec<_>>(),
        &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0],
    );
    let dast = Dast { l_max: 4096 };
    assert!((dast.budget(&spec_group()) - 2317.25).abs() < 1e-9);
    check(
        &dast.rewards(&spec_group()),
        &[
            0.892113, 0.859748, -0.689287, 0.741072, 0.805804, -0.728126, 0.352681, -0.1,
        ],
    );
}

#[test]
fn step_grpo_vector() {
    let steps = [3, 5, 9, 2, 4, 7, 1, 6];
    let correct = [true, true, false, true, false, false, true, true];
    let g = Group::new(
        0,
        steps
            .iter()
            .zip(correct)
            .map(|(&k, c)| SampleStat {
                steps: k,
                ..SampleStat::new(100, c, 0.0)
            })
            .collect(),
    );
    check(
        &StepGrpo::default().shape(&[g]).rewards[0],
        &[
            1.052698, 0.802596, 0.1, 1.175487, 0.1, 0.1, 1.273640, 0.710272,
        ],
    );
}

#[test]
fn pass_at_k_vectors() {
    check(
        &[pass_at_k(32, 5, 1), pass_at_k(32, 5, 8), pass_at_k(4, 1, 4)],
        &[0.15625, 0.788932, 1.0],
    );
}

// ---- Short-RL edge cases (spec §2.4) ----

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

// ---- GRPO-λ edge cases (spec §3.2) ----

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

// ---- CARE edge cases (spec §4.4) ----

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

// ---- Step-GRPO (spec §5.5–5.7) ----

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

// ---- Baselines (spec §6) ----

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

// ---- Advantages (spec §0.3) ----

#[test]
fn advantages() {
    let shaped = |r: Vec<f64>| Shaped {
        rewards: vec![r],
        ..Default::default()
    };
    let g3 = group(&[1, 2, 3], &[true, true, true]);
    let a = Advantage::default().compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]));
    check(
        &a.values[0],
        &[-1.0 / (1.0 + 1e-6), 0.0, 1.0 / (1.0 + 1e-6)],
    );
    let pop = Advantage::Grpo {
        std: true,
        ddof: 0,
        eps: 0.0,
    }
    .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]));
    check(&pop.values[0], &[-(1.5f64).sqrt(), 0.0, (1.5f64).sqrt()]);
    check(
        &Advantage::DrGrpo
            .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]))
            .values[0],
        &[-1.0, 0.0, 1.0],
    );
    check(
        &Advantage::Rloo
            .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]))
            .values[0],
        &[-1.5, 0.0, 1.5],
    );
    // Zero-variance group: advantage 0, counted.
    let z = Advantage::default().compute(std::slice::from_ref(&g3), &shaped(vec![2.0, 2.0, 2.0]));
    assert_eq!((z.values[0].clone(), z.zero_std_groups), (vec![0.0; 3], 1));
    // Singleton group (verl): mean 0, std 1.
    check(
        &Advantage::default()
            .compute(&[group(&[4], &[true])], &shaped(vec![0.5]))
            .values[0],
        &[0.5 / (1.0 + 1e-6)],
    );
    // Unscorable samples get 0 and stay out of the statistics.
    let mut gu = g3.clone();
    gu.samples[2].scorable = false;
    let u = Advantage::DrGrpo.compute(&[gu], &shaped(vec![1.0, 3.0, 100.0]));
    check(&u.values[0], &[-1.0, 1.0, 0.0]);
    // REINFORCE++: token-weighted whitening has token-weighted mean 0 and unit variance.
    let g = group(&[1, 3], &[true, false]);
    let r = Advantage::ReinforcePp { eps: 0.0 }
        .compute(std::slice::from_ref(&g), &shaped(vec![1.0, 0.0]));
    let (a0, a1) = (r.values[0][0], r.values[0][1]);
    assert!((a0 + 3.0 * a1).abs() < 1e-12);
    assert!(((a0 * a0 + 3.0 * a1 * a1) / 3.0 - 1.0).abs() < 1e-12);
}

// ---- Config: serde tag, unknown keys, validation ----

#[test]
fn config_from_toml_with_tag_defaults_and_errors() {
    let c: RewardConfig = toml::from_str(
        "[shaper]\nmethod = \"short_rl\"\ntau_len = 100\n[overlong]\nl_max = 4096\nl_cache = 512\n",
    )
    .expect("parse");
    assert_eq!(
        c.shaper,
        Method::ShortRl(ShortRl {
            tau_len: 100.0,
            ..Default::default()
        })
    );
    assert_eq!(c.overlong.as_ref().map(|o| o.factor), Some(1.0));
    let e = toml::from_str::<RewardConfig>("[shaper]\nmethod = \"short_rl\"\ntau_lenn = 100\n")
        .expect_err("unknown key")
        .to_string();
    assert!(e.contains("tau_lenn"), "{e}");
    let e = toml::from_str::<RewardConfig>("[shaper]\nmethod = \"kimmi\"\n")
        .expect_err("unknown method")
        .to_string();
    assert!(e.contains("kimmi"), "{e}");
    let e = toml::from_str::<RewardConfig>("[shaper]\nmethod = \"alp\"\nl_max = 10\n")
        .expect_err("beta required")
        .to_string();
    assert!(e.contains("beta"), "{e}");
    for (toml_text, key) in [
        (
            "[shaper]\nmethod = \"grpo_lambda\"\nlambda = 1.5\n",
            "lambda",
        ),
        ("[shaper]\nmethod = \"short_rl\"\ntau_len = -1\n", "tau_len"),
        ("[shaper]\nmethod = \"short_rl\"\ntau_acc = 2\n", "tau_acc"),
        ("[shaper]\nmethod = \"care\"\nl_max = 0\n", "l_max"),
        ("[overlong]\nl_max = 100\nl_cache = 0\n", "l_cache"),
    ] {
        let c: RewardConfig = toml::from_str(toml_text).expect("parse");
        let e = c.validate().expect_err("invalid");
        assert!(e.contains(key), "{e}");
    }
    let bad = Advantage::Grpo {
        std: true,
        ddof: 2,
        eps: 1e-6,
    }
    .validate()
    .expect_err("ddof");
    assert!(bad.contains("ddof") && bad.contains('2'));
}

// ---- Metrics (spec §7) ----

#[test]
fn metrics() {
    let s = length_stats(&[spec_group()]);
    assert_eq!(
        (s.min, s.max, s.mean_correct),
        (Some(500), Some(4096), Some(1250.0))
    );
    assert_eq!(length_stats(&[]).mean, None);
    assert_eq!(averaged_by_steps(&[1477.0, 889.0]), (1183.0, Some(889.0)));
    assert!((overall(&[47.0, 55.7, 53.6, 50.3, 56.9]) - 52.7).abs() < 1e-9);
    assert!((compression_rate(6906.54, 11077.81) - (1.0 - 0.3765)).abs() < 1e-3);
    assert_eq!(
        word_punct_tokens("Hello, World!! it's 3.5"),
        ["hello", "world", "!!", "it", "s", "3", "5"]
    );
    assert_eq!(distinct_n(&["a b a b"], 2), 2.0 / 3.0);
    assert_eq!(distinct_n(&[""], 1), 0.0);
    assert!(
        (lexical_diversity(&["a b c", "a b d"], 40_000, 42) - (4.0 / 6.0 + 3.0 / 4.0 + 1.0) / 3.0)
            .abs()
            < 1e-12
    );
    assert_eq!(
        [
            difficulty(0.0),
            difficulty(0.25),
            difficulty(0.26),
            difficulty(0.75),
            difficulty(0.76)
        ],
        [
            Difficulty::Hard,
            Difficulty::Hard,
            Difficulty::Partial,
            Difficulty::Partial,
            Difficulty::Easy
        ]
    );
    // z-score bins: correct lengths 10, 20, 30 (mean 20, std 8.165); a wrong sample at 40.
    let bins = zscore_bins(
        &[
            group(&[10, 20, 30, 40], &[true, true, true, false]),
            group(&[5, 5, 5], &[true, true, true]),
        ],
        0.5,
    );
    assert_eq!(bins.values().map(|v| v.1).sum::<usize>(), 4, "{bins:?}");
    assert_eq!(bins[&4], (0, 1)); // z = 2.449 -> bin 4
}
