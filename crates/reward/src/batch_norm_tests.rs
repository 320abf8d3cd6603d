//! DLER's batch normalisation (batch_norm.rs) through `Advantage::compute`, with the arithmetic
//! written out, and its TOML face.

use crate::advantage::Advantage;
use crate::batch_norm::{batch_std, centred, Norm};
use crate::Group;
use crate::{SampleStat, Shaped};

fn groups(rewards: &[&[f64]]) -> (Vec<Group>, Shaped) {
    let gs = rewards
        .iter()
        .enumerate()
        .map(|(k, r)| {
            Group::new(
                k as u64,
                r.iter().map(|&x| SampleStat::new(10, x > 0.0, x)).collect(),
            )
        })
        .collect();
    let shaped = Shaped {
        rewards: rewards.iter().map(|r| r.to_vec()).collect(),
        ..Default::default()
    };
    (gs, shaped)
}

fn batch(ddof: usize, eps: f64) -> Advantage {
    Advantage::Grpo {
        std: true,
        ddof,
        eps,
        norm: Norm::Batch,
        difficulty: None,
    }
}

#[test]
fn centred_rewards_over_the_batch_and_their_std() {
    // Group A [1, 0, 0, 1]: mean 0.5, centred ±0.5. Group B [1, 0, 0, 0]: mean 0.25,
    // centred 0.75, −0.25 ×3. Group C [1, 1, 1, 1]: all equal, exact zeros.
    let (gs, sh) = groups(&[&[1.0, 0.0, 0.0, 1.0], &[1.0, 0.0, 0.0, 0.0], &[1.0; 4]]);
    let c = centred(&gs, &sh);
    assert_eq!(
        c,
        [0.5, -0.5, -0.5, 0.5, 0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]
    );
    // Mean of the 12 values: (0 + 0 + 0) / 12 = 0. Sum of squares: 4·0.25 + 0.5625 +
    // 3·0.0625 = 1.75. Population (ddof 0): sqrt(1.75 / 12) = 0.381881; ddof 1:
    // sqrt(1.75 / 11) = 0.398862.
    assert!((batch_std(&gs, &sh, 0) - 0.381881).abs() < 1e-6);
    assert!((batch_std(&gs, &sh, 1) - 0.398862).abs() < 1e-6);
    // The advantages divide by it: A's right ones 0.5 / 0.398862 = 1.253566, B's right one
    // 0.75 / 0.398862 = 1.880349; C's stay exactly 0.
    let a = batch(1, 0.0).compute(&gs, &sh).expect("advantages");
    assert!((a.values[0][0] - 1.253566).abs() < 1e-6);
    assert!((a.values[1][0] - 1.880349).abs() < 1e-6);
    assert!((a.values[1][1] + 0.626783).abs() < 1e-6);
    assert_eq!(a.values[2], [0.0; 4]);
    assert_eq!(a.zero_std_groups, 1);
    // Group normalisation divides A by its own std (ddof 1: sqrt(1 / 3) = 0.57735):
    // 0.5 / 0.57735 = 0.866025, a different number.
    let g = Advantage::default().compute(&gs, &sh).expect("advantages");
    assert!((g.values[0][0] - 0.866025).abs() < 1e-5);
}

/// Existing configs parse to what they always did; the new keys parse and are checked.
#[test]
fn the_toml_face_keeps_old_configs_and_names_bad_values() {
    let old = "estimator = \"grpo\"\nstd = true\nddof = 1\neps = 1e-6\n";
    let a: Advantage = toml::from_str(old).expect("old config");
    assert_eq!(a, Advantage::default());
    let new = format!("{old}norm = \"batch\"\ndifficulty = {{}}\n");
    let a: Advantage = toml::from_str(&new).expect("new keys");
    assert_eq!(
        a,
        Advantage::Grpo {
            std: true,
            ddof: 1,
            eps: 1e-6,
            norm: Norm::Batch,
            difficulty: Some(crate::lead::DifficultyWeight::default()),
        }
    );
    let e = toml::from_str::<Advantage>(&format!("{old}norm = \"global\"\n"))
        .expect_err("unknown norm")
        .to_string();
    assert!(e.contains("global"), "{e}");
    let no_std = Advantage::Grpo {
        std: false,
        ddof: 1,
        eps: 1e-6,
        norm: Norm::Batch,
        difficulty: None,
    };
    let e = no_std.validate().expect_err("batch without std");
    assert!(
        e.starts_with("advantage.norm = \"batch\" needs advantage.std = true"),
        "{e}"
    );
}

#[test]
fn edge_cases_one_sample_groups_all_equal_batches_and_unscorable() {
    // A one-sample group contributes its reward (mean 0), as GRPO's singleton rule.
    let (gs, sh) = groups(&[&[2.0], &[1.0, 0.0]]);
    assert_eq!(centred(&gs, &sh), [2.0, 0.5, -0.5]);
    // Every group all-equal: the batch std is 0 and every advantage exactly 0 (never NaN),
    // with ε = 0 too.
    let (gs, sh) = groups(&[&[1.0, 1.0], &[0.0, 0.0]]);
    assert_eq!(batch_std(&gs, &sh, 1), 0.0);
    let a = batch(1, 0.0).compute(&gs, &sh).expect("advantages");
    assert_eq!(a.values, [[0.0, 0.0], [0.0, 0.0]]);
    // An unscorable sample enters neither its group's mean nor the batch std, and keeps 0.
    let (mut gs, sh) = groups(&[&[1.0, 0.0, 5.0]]);
    gs[0].samples[2].scorable = false;
    assert_eq!(centred(&gs, &sh), [0.5, -0.5]);
    let a = batch(0, 0.0).compute(&gs, &sh).expect("advantages");
    // Population std of ±0.5 is 0.5: advantages ±1.
    assert_eq!(a.values[0], [1.0, -1.0, 0.0]);
}
