//! Gradient checks: every trainable op's autograd gradient against central finite differences
//! in f64, and a gradient reaching every parameter of the full model.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use terse_model::{logprob, ops, Batch, Config, Padding, Qwen3};

fn rand_tensor(rng: &mut ChaCha8Rng, shape: &[usize], scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| (rng.random::<f64>() * 2.0 - 1.0) * scale)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor")
}

/// Checks d f / d inputs against central differences on every element (inputs are small).
/// `f` must return a scalar.
fn gradcheck(name: &str, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).expect("var"))
        .collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = f(&ts).expect("f").backward().expect("backward");
    let eps = 1e-6;
    for (i, var) in vars.iter().enumerate() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: input {i} got no gradient"));
        let g = g.flatten_all().expect("f").to_vec1::<f64>().expect("v");
        let base = inputs[i]
            .flatten_all()
            .expect("f")
            .to_vec1::<f64>()
            .expect("v");
        for j in 0..base.len() {
            let eval = |d: f64| {
                let mut x = base.clone();
                x[j] += d;
                let mut args: Vec<Tensor> = inputs.to_vec();
                args[i] = Tensor::from_vec(x, inputs[i].shape(), &Device::Cpu).expect("t");
                f(&args).expect("f").to_scalar::<f64>().expect("scalar")
            };
            let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let tol = 1e-6 * (1.0 + fd.abs());
            assert!(
                (fd - g[j]).abs() < tol,
                "{name}: input {i} element {j}: autograd {} vs finite difference {fd}",
                g[j]
            );
        }
    }
}

/// Weighted sum so that every output element matters differently.
fn project(out: &Tensor, seed: u64) -> Result<Tensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let r = rand_tensor(&mut rng, out.dims(), 1.0);
    (out * r)?.sum_all()
}

#[test]
fn rms_norm_gradient() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let x = rand_tensor(&mut rng, &[2, 3, 6], 1.0);
    let w = rand_tensor(&mut rng, &[6], 1.0);
    gradcheck("rms_norm", &[x, w], |a| {
        project(&ops::rms_norm(&a[0], &a[1], 1e-6)?, 7)
    });
}

#[test]
fn rope_gradient() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let x = rand_tensor(&mut rng, &[2, 2, 3, 8], 1.0);
    let pos = Tensor::new(&[[0u32, 1, 2], [5, 9, 40]], &Device::Cpu).expect("pos");
    let (cos, sin) = ops::rope_tables(&pos, 8, 1e4, DType::F64).expect("tables");
    gradcheck("rope", &[x], |a| project(&ops::rope(&a[0], &cos, &sin)?, 8));
}

#[test]
fn gqa_attention_with_padding_gradient() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (b, hq, hkv, t, hd) = (2, 4, 2, 4, 3);
    let q = rand_tensor(&mut rng, &[b, hq, t, hd], 1.0);
    let k = rand_tensor(&mut rng, &[b, hkv, t, hd], 1.0);
    let v = rand_tensor(&mut rng, &[b, hkv, t, hd], 1.0);
    // Row 0 left-padded by one, row 1 right-padded by one.
    let batch = Batch::new(
        vec![0; b * t],
        vec![0, 1, 1, 1, 1, 1, 1, 0],
        b,
        t,
        &Device::Cpu,
    )
    .expect("batch");
    let bias = ops::attention_bias(&batch.causal_allowed(), b, t, t, DType::F64, &Device::Cpu)
        .expect("bias");
    // Only real query rows count, as in training.
    let keep = Tensor::from_vec(
        vec![0f64, 1., 1., 1., 1., 1., 1., 0.],
        (b, 1, t, 1),
        &Device::Cpu,
    )
    .expect("keep");
    gradcheck("attention", &[q, k, v], |a| {
        let out = ops::gqa_attention(&a[0], &a[1], &a[2], &bias)?.broadcast_mul(&keep)?;
        project(&out, 9)
    });
}

#[test]
fn mlp_gradient() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let x = rand_tensor(&mut rng, &[3, 5], 1.0);
    let wg = rand_tensor(&mut rng, &[7, 5], 0.5);
    let wu = rand_tensor(&mut rng, &[7, 5], 0.5);
    let wd = rand_tensor(&mut rng, &[5, 7], 0.5);
    gradcheck("mlp", &[x, wg, wu, wd], |a| {
        let h = (a[0].matmul(&a[1].t()?)?.silu()? * a[0].matmul(&a[2].t()?)?)?;
        project(&h.matmul(&a[3].t()?)?, 10)
    });
}

#[test]
fn fused_logprob_gradient() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let h = rand_tensor(&mut rng, &[5, 4], 1.0);
    let w = rand_tensor(&mut rng, &[9, 4], 1.0);
    let t = Tensor::new(&[0u32, 8, 3, 3, 5], &Device::Cpu).expect("targets");
    gradcheck("logprob", &[h, w], |a| {
        project(&logprob::token_logprobs(&a[0], &a[1], &t, 2)?, 11)
    });
}

fn tiny_model(seed: u64) -> Qwen3 {
    let cfg = Config::synthetic(13, 8, 12, 2, 4, 2, 4, false).expect("cfg");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tensors: BTreeMap<String, Tensor> = cfg
        .expected_tensors()
        .into_iter()
        .map(|(k, s)| {
            let t = rand_tensor(&mut rng, &s, 0.5);
            let t = if k.ends_with("norm.weight") {
                (t + 1.0).expect("shift")
            } else {
                t
            };
            (k, t)
        })
        .collect();
    Qwen3::from_tensors(cfg, tensors, DType::F64).expect("model")
}

fn padded_batch() -> Batch {
    let rows = vec![vec![3, 1, 4, 1, 5], vec![9, 2, 6], vec![5, 3, 5, 8]];
    Batch::from_rows(&rows, 0, Padding::Left, &Device::Cpu).expect("batch")
}

#[test]
fn every_parameter_receives_a_gradient() {
    let model = tiny_model(6);
    let batch = padded_batch();
    let (rows, targets) = batch.next_token_selection();
    let lp = model
        .token_logprobs(&batch, &rows, &targets, true)
        .expect("logp");
    let grads = lp.sum_all().expect("sum").backward().expect("backward");
    for (name, var) in model.vars() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm = g
            .sqr()
            .expect("sq")
            .sum_all()
            .expect("s")
            .to_scalar::<f64>()
            .expect("f");
        assert!(
            norm > 0.0 && norm.is_finite(),
            "gradient of {name} is {norm}"
        );
    }
}

/// The model's next-token log-probs of `batch` projected to a scalar (the loss the
/// finite-difference checks differentiate).
fn projected_logprobs(m: &Qwen3, batch: &Batch) -> Tensor {
    let (rows, targets) = batch.next_token_selection();
    let lp = m
        .token_logprobs(batch, &rows, &targets, true)
        .expect("logp");
    project(&lp, 12).expect("p")
}

#[test]
fn full_model_gradient_matches_finite_differences() {
    let model = tiny_model(7);
    let batch = Batch::from_rows(
        &[vec![3, 1, 4, 1, 5], vec![9, 2, 6]],
        0,
        Padding::Right,
        &Device::Cpu,
    )
    .expect("batch");
    let loss = |m: &Qwen3| -> f64 { projected_logprobs(m, &batch).to_scalar::<f64>().expect("f") };
    let grads = projected_logprobs(&model, &batch)
        .backward()
        .expect("backward");
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for (name, var) in model.vars() {
        let g = grads
            .get(var.as_tensor())
            .expect("grad")
            .flatten_all()
            .expect("f")
            .to_vec1::<f64>()
            .expect("v");
        for _ in 0..3 {
            let j = rng.random_range(0..g.len());
            let shifted = |d: f64| {
                let mut t = model.tensors();
                let mut x = t[name]
                    .flatten_all()
                    .expect("f")
                    .to_vec1::<f64>()
                    .expect("v");
                x[j] += d;
                t.insert(
                    name.clone(),
                    Tensor::from_vec(x, t[name].shape(), &Device::Cpu).expect("t"),
                );
                loss(&Qwen3::from_tensors(model.config.clone(), t, DType::F64).expect("model"))
            };
            let fd = (shifted(1e-6) - shifted(-1e-6)) / 2e-6;
            assert!(
                (fd - g[j]).abs() < 1e-6 * (1.0 + fd.abs()),
                "{name}[{j}]: autograd {} vs fd {fd}",
                g[j]
            );
        }
    }
}

/// LoRA (issue 35): the gradients of A and B (f64, B made non-zero so A gets one too) against
/// central finite differences of the loss, through the same training path; the frozen base
/// gets none.
#[test]
fn lora_adapter_gradients_match_finite_differences() {
    let mut model = tiny_model(7);
    let targets: Vec<String> = ["q", "v", "down"].map(String::from).to_vec();
    let lc = terse_model::LoraConfig::new(2, 4.0, &targets, terse_model::LoraInit::Gaussian)
        .expect("lora");
    model.add_lora(lc, 3).expect("add");
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for (k, v) in model.vars() {
        if k.contains("lora_B") {
            v.set(&rand_tensor(&mut rng, v.dims(), 0.3)).expect("B");
        }
    }
    let batch =
        Batch::from_rows(&[vec![3, 1, 4, 1, 5]], 0, Padding::Right, &Device::Cpu).expect("batch");
    let loss = |m: &Qwen3| -> f64 { projected_logprobs(m, &batch).to_scalar::<f64>().expect("f") };
    let grads = projected_logprobs(&model, &batch)
        .backward()
        .expect("backward");
    for v in model.base_vars().values() {
        assert!(
            grads.get(v.as_tensor()).is_none(),
            "the frozen base got a gradient"
        );
    }
    assert_eq!(model.vars().len(), 2 * 3 * 2);
    for (name, var) in model.vars() {
        let g = grads
            .get(var.as_tensor())
            .expect("grad")
            .flatten_all()
            .and_then(|t| t.to_vec1::<f64>())
            .expect("v");
        let x0 = var
            .as_tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f64>())
            .expect("x");
        for _ in 0..3 {
            let j = rng.random_range(0..g.len());
            let shifted = |d: f64| {
                let mut x = x0.clone();
                x[j] += d;
                var.set(&Tensor::from_vec(x, var.shape(), &Device::Cpu).expect("t"))
                    .expect("set");
                let l = loss(&model);
                var.set(&Tensor::from_vec(x0.clone(), var.shape(), &Device::Cpu).expect("t"))
                    .expect("restore");
                l
            };
            let fd = (shifted(1e-6) - shifted(-1e-6)) / 2e-6;
            assert!(
                (fd - g[j]).abs() < 1e-6 * (1.0 + fd.abs()),
                "{name}[{j}]: autograd {} vs fd {fd}",
                g[j]
            );
        }
    }
}
