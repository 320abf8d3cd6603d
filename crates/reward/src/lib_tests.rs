//! Spec the test vectors (crates/reward/src/lib_tests.rs) test vectors (to 1e-6), advantages, config parsing and metrics. The edge-case rows
//! of the methods' edge cases are in `edge_case_tests.rs`.

use crate::baselines::{CosFn, DapoOverlong, Dast, Efficient, Kimi};
use crate::care::{direction, Care};
use crate::grpo_lambda::{GrpoLambda, TieBreak};
use crate::metrics::*;
use crate::short_rl::{ShortRl, ShortRlState};
use crate::step_grpo::StepGrpo;
use crate::*;

pub(crate) const L: [usize; 8] = [500, 650, 800, 1200, 900, 700, 3000, 4096];
pub(crate) const Y: [bool; 8] = [true, true, false, true, true, false, true, false];

pub(crate) fn group(lens: &[usize], correct: &[bool]) -> Group {
    Group::new(
        0,
        lens.iter()
            .zip(correct)
            .map(|(&l, &c)| SampleStat::new(l, c, if c { 3.0 } else { -0.5 }))
            .collect(),
    )
}

pub(crate) fn spec_group() -> Group {
    group(&L, &Y)
}

pub(crate) fn check(got: &[f64], expect: &[f64]) {
    assert_eq!(got.len(), expect.len(), "{got:?} vs {expect:?}");
    for (i, (g, e)) in got.iter().zip(expect).enumerate() {
        assert!(
            (g - e).abs() <= 1e-6,
            "entry {i}: got {g}, expected {e} (all: {got:?})"
        );
    }
}

pub(crate) fn shape(method: Method, groups: &[Group]) -> Shaped {
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

// ---- Advantages (docs/methods.md, Advantage estimators) ----

#[test]
fn advantages() {
    let shaped = |r: Vec<f64>| Shaped {
        rewards: vec![r],
        ..Default::default()
    };
    let g3 = group(&[1, 2, 3], &[true, true, true]);
    let a = Advantage::default()
        .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]))
        .expect("valid batch");
    check(
        &a.values[0],
        &[-1.0 / (1.0 + 1e-6), 0.0, 1.0 / (1.0 + 1e-6)],
    );
    let pop = Advantage::Grpo {
        std: true,
        ddof: 0,
        eps: 0.0,
        norm: Norm::Group,
        difficulty: None,
    }
    .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]))
    .expect("valid batch");
    check(&pop.values[0], &[-(1.5f64).sqrt(), 0.0, (1.5f64).sqrt()]);
    check(
        &Advantage::DrGrpo
            .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]))
            .expect("valid batch")
            .values[0],
        &[-1.0, 0.0, 1.0],
    );
    check(
        &Advantage::Rloo
            .compute(std::slice::from_ref(&g3), &shaped(vec![1.0, 2.0, 3.0]))
            .expect("valid batch")
            .values[0],
        &[-1.5, 0.0, 1.5],
    );
    // Zero-variance group: advantage 0, counted.
    let z = Advantage::default()
        .compute(std::slice::from_ref(&g3), &shaped(vec![2.0, 2.0, 2.0]))
        .expect("valid batch");
    assert_eq!((z.values[0].clone(), z.zero_std_groups), (vec![0.0; 3], 1));
    // Singleton group (verl): mean 0, std 1.
    check(
        &Advantage::default()
            .compute(&[group(&[4], &[true])], &shaped(vec![0.5]))
            .expect("valid batch")
            .values[0],
        &[0.5 / (1.0 + 1e-6)],
    );
    // Unscorable samples get 0 and stay out of the statistics.
    let mut gu = g3.clone();
    gu.samples[2].scorable = false;
    let u = Advantage::DrGrpo
        .compute(&[gu], &shaped(vec![1.0, 3.0, 100.0]))
        .expect("valid batch");
    check(&u.values[0], &[-1.0, 1.0, 0.0]);
    // REINFORCE++: token-weighted whitening has token-weighted mean 0 and unit variance.
    let g = group(&[1, 3], &[true, false]);
    let r = Advantage::ReinforcePp { eps: 0.0 }
        .compute(std::slice::from_ref(&g), &shaped(vec![1.0, 0.0]))
        .expect("valid batch");
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
        norm: Norm::Group,
        difficulty: None,
    }
    .validate()
    .expect_err("ddof");
    assert!(bad.contains("ddof") && bad.contains('2'));
}

// ---- Metrics (docs/methods.md, Evaluation metrics) ----

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
