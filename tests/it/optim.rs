//! AdamW and gradient clipping against torch.optim.AdamW + clip_grad_norm_ trajectories
//! (tests/fixtures/adamw, written by scripts/make_adamw_reference.py).

use crate::fixture;
use candle_core::{Device, Tensor, Var};
use std::collections::{BTreeMap, HashMap};
use terse_optim::{clip_grad_norm, AdamW, AdamWConfig, Grads};

const NAMES: [&str; 3] = ["a.weight", "b.bias", "c.norm"];

fn run(
    reference: &HashMap<String, Tensor>,
    clip: Option<f64>,
) -> (BTreeMap<String, Var>, Vec<f64>) {
    let params: BTreeMap<String, Var> = NAMES
        .iter()
        .map(|k| {
            (
                k.to_string(),
                Var::from_tensor(&reference[&format!("p0.{k}")]).expect("var"),
            )
        })
        .collect();
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::new(cfg, &params).expect("opt");
    let lrs = reference["lr"].to_vec1::<f64>().expect("lr");
    let mut norms = vec![];
    for (i, lr) in lrs.iter().enumerate() {
        let mut grads: Grads = NAMES
            .iter()
            .map(|k| (k.to_string(), reference[&format!("g{i}.{k}")].clone()))
            .collect();
        if let Some(max) = clip {
            norms.push(clip_grad_norm(&mut grads, max).expect("clip"));
        }
        opt.step(&params, &grads, *lr).expect("step");
    }
    (params, norms)
}

#[test]
fn adamw_with_and_without_clipping_matches_torch() {
    let bytes = std::fs::read(fixture("adamw").join("reference.safetensors")).expect("fixture");
    let reference = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).expect("load");
    for (variant, clip) in [("noclip", None), ("clip", Some(0.5))] {
        let (params, norms) = run(&reference, clip);
        for k in NAMES {
            let ours = params[k]
                .as_tensor()
                .flatten_all()
                .expect("f")
                .to_vec1::<f32>()
                .expect("v");
            let theirs = reference[&format!("final.{variant}.{k}")]
                .flatten_all()
                .expect("f")
                .to_vec1::<f32>()
                .expect("v");
            let d = ours
                .iter()
                .zip(&theirs)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!("{variant} {k}: max abs diff vs torch {d:e}");
            assert!(d < 1e-6, "{variant} {k}: max abs diff {d}");
        }
        if clip.is_some() {
            let theirs = reference[&format!("norms.{variant}")]
                .to_vec1::<f64>()
                .expect("norms");
            for (a, b) in norms.iter().zip(&theirs) {
                assert!((a - b).abs() < 1e-5 * b, "pre-clip norm {a} vs torch {b}");
            }
        }
    }
}
