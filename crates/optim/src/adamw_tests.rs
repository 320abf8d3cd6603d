//! adamw.rs's tests: save and resume bit-identical, bf16 parameters' f32 masters, refused state
//! files, and the device update's reference held to the per-tensor update bit for bit.

use super::*;

fn params(v: &[(&str, &[f32])]) -> BTreeMap<String, Var> {
    v.iter()
        .map(|(k, x)| (k.to_string(), Var::new(*x, &Device::Cpu).expect("var")))
        .collect()
}

fn grads(p: &BTreeMap<String, Var>, step: usize) -> Grads {
    p.iter()
        .map(|(k, v)| {
            let n = v.elem_count();
            let g: Vec<f32> = (0..n).map(|i| ((i + 3 * step) % 7) as f32 - 3.0).collect();
            (k.clone(), Tensor::from_vec(g, n, &Device::Cpu).expect("g"))
        })
        .collect()
}

fn values(p: &BTreeMap<String, Var>) -> Vec<u32> {
    p.values()
        .flat_map(|v| v.as_tensor().to_vec1::<f32>().expect("v"))
        .map(f32::to_bits)
        .collect()
}

#[test]
fn save_after_k_steps_then_continue_is_bit_identical() {
    let init: &[(&str, &[f32])] = &[("b", &[1.0, 2.0, 3.0]), ("a", &[-1.0, 0.5])];
    let cfg = AdamWConfig::default();
    let p1 = params(init);
    let mut o1 = AdamW::new(cfg.clone(), &p1).expect("opt");
    for s in 0..6 {
        o1.step(&p1, &grads(&p1, s), 1e-2).expect("step");
    }
    let p2 = params(init);
    let mut o2 = AdamW::new(cfg.clone(), &p2).expect("opt");
    for s in 0..3 {
        o2.step(&p2, &grads(&p2, s), 1e-2).expect("step");
    }
    let bytes = o2.to_safetensors().expect("save");
    let mut o3 = AdamW::from_safetensors(cfg, &p2, &bytes).expect("load");
    assert_eq!(o3.steps(), 3);
    for s in 3..6 {
        o3.step(&p2, &grads(&p2, s), 1e-2).expect("step");
    }
    assert_eq!(values(&p1), values(&p2));
}

/// The device update's reference (terse_model's `adamw`, what kernels/adamw.cu equals bit
/// for bit) is this per-tensor update bit for bit, in f32 parameters and in bf16 ones with
/// f32 masters, over steps whose moments carry over.
#[test]
fn the_device_updates_reference_is_the_per_tensor_update_bit_for_bit() {
    use terse_model::adamw::{step_scalars, Scalars};
    use terse_model::testing::references::adamw as reference;
    let cfg = AdamWConfig::default();
    let lr = 3e-3;
    for dt in [DType::F32, DType::BF16] {
        let init: Vec<f32> = (0..300)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let w = Tensor::new(init.as_slice(), &Device::Cpu).expect("w");
        let p: BTreeMap<String, Var> = [(
            "w".to_string(),
            Var::from_tensor(&w.to_dtype(dt).expect("dt")).expect("var"),
        )]
        .into();
        let mut o = AdamW::new(cfg.clone(), &p).expect("opt");
        let h = Scalars::new(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
        let mut want = w
            .to_dtype(dt)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .expect("w");
        let (mut m, mut v) = (vec![0f32; 300], vec![0f32; 300]);
        for step in 1..=4u64 {
            let g: Vec<f32> = (0..300)
                .map(|i| ((i * 13 + step as usize * 7) % 17) as f32 / 4.0 - 2.0)
                .collect();
            let gt = Tensor::new(g.as_slice(), &Device::Cpu).expect("g");
            let gt = gt.to_dtype(dt).expect("g dt");
            let g = gt
                .to_dtype(DType::F32)
                .and_then(|t| t.to_vec1::<f32>())
                .expect("g");
            o.step(&p, &[("w".to_string(), gt)].into(), lr)
                .expect("step");
            let sc = step_scalars(lr, cfg.beta1, cfg.beta2, step);
            reference(&mut want, &mut m, &mut v, &g, &h, sc);
            let st = &o.state["w"];
            let got = |t: &Tensor| t.to_vec1::<f32>().expect("v");
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got(&st.exp_avg)),
                bits(&m),
                "{dt:?} step {step}: exp_avg"
            );
            assert_eq!(
                bits(&got(&st.exp_avg_sq)),
                bits(&v),
                "{dt:?} step {step}: exp_avg_sq"
            );
            let master = st
                .master
                .clone()
                .unwrap_or_else(|| p["w"].as_tensor().clone());
            assert_eq!(
                bits(&got(&master)),
                bits(&want),
                "{dt:?} step {step}: weights"
            );
            let param = p["w"].as_tensor().to_dtype(DType::F32).expect("f32");
            let rounded = Tensor::new(want.as_slice(), &Device::Cpu)
                .and_then(|t| t.to_dtype(dt))
                .and_then(|t| t.to_dtype(DType::F32))
                .expect("rounded");
            assert_eq!(
                bits(&got(&param)),
                bits(&got(&rounded)),
                "{dt:?} step {step}: param"
            );
        }
    }
}

#[test]
fn bf16_parameters_keep_f32_master_weights() {
    let p: BTreeMap<String, Var> = [(
        "w".to_string(),
        Var::from_tensor(
            &Tensor::new(&[1.0f32], &Device::Cpu)
                .expect("t")
                .to_dtype(DType::BF16)
                .expect("bf16"),
        )
        .expect("var"),
    )]
    .into();
    let mut o = AdamW::new(
        AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        },
        &p,
    )
    .expect("opt");
    // Updates of 1e-4 are below bf16 resolution at 1.0 but must accumulate in the master.
    for _ in 0..100 {
        let g = [(
            "w".to_string(),
            Tensor::new(&[1.0f32], &Device::Cpu).expect("g"),
        )]
        .into();
        o.step(&p, &g, 1e-4).expect("step");
    }
    let master = o.state["w"]
        .master
        .as_ref()
        .expect("master")
        .to_vec1::<f32>()
        .expect("v")[0];
    assert!((master - 0.99).abs() < 1e-5, "{master}");
    let w = p["w"]
        .as_tensor()
        .to_dtype(DType::F32)
        .expect("f32")
        .to_vec1::<f32>()
        .expect("v")[0];
    assert!((w - 0.99).abs() < 4e-3, "{w}");
}

#[test]
fn load_rejects_mismatched_names_and_shapes() {
    let p = params(&[("a", &[1.0, 2.0])]);
    let bytes = AdamW::new(AdamWConfig::default(), &p)
        .expect("opt")
        .to_safetensors()
        .expect("save");
    let other = params(&[("z", &[1.0, 2.0])]);
    let e = AdamW::from_safetensors(AdamWConfig::default(), &other, &bytes)
        .expect_err("names")
        .to_string();
    assert!(e.contains("`z.exp_avg`"), "{e}");
    let wider = params(&[("a", &[1.0, 2.0, 3.0])]);
    let e = AdamW::from_safetensors(AdamWConfig::default(), &wider, &bytes)
        .expect_err("shape")
        .to_string();
    assert!(
        e.contains("`a.exp_avg`") && e.contains("[2]") && e.contains("[3]"),
        "{e}"
    );
    let two = params(&[("a", &[1.0, 2.0]), ("b", &[1.0])]);
    let bytes2 = AdamW::new(AdamWConfig::default(), &two)
        .expect("opt")
        .to_safetensors()
        .expect("save");
    let e = AdamW::from_safetensors(AdamWConfig::default(), &p, &bytes2)
        .expect_err("extra")
        .to_string();
    assert!(e.contains("`b.exp_avg"), "{e}");
    assert!(AdamW::from_safetensors(AdamWConfig::default(), &p, b"garbage").is_err());
}

/// A profile (terse_model::profile) sees clipping and the update as one `Optimizer` span each,
/// and the update's numbers are the same with the profile on.
#[test]
fn a_profile_sees_the_optimizer() {
    use terse_model::profile::{finish, start, Category};
    let run = |profiled: bool| {
        let p = params(&[("a", &[1.0, 2.0, 3.0]), ("b", &[0.5])]);
        let mut opt = AdamW::new(AdamWConfig::default(), &p).expect("opt");
        let mut g = grads(&p, 1);
        if profiled {
            start();
        }
        crate::clip_grad_norm(&mut g, 1.0).expect("clip");
        opt.step(&p, &g, 1e-2).expect("step");
        let totals = finish(&Device::Cpu).expect("finish");
        let a = p["a"].as_tensor().to_vec1::<f32>().expect("a");
        (totals, a)
    };
    let (totals, a) = run(true);
    let spans: Vec<(Category, usize)> = totals.iter().map(|t| (t.category, t.spans)).collect();
    assert_eq!(spans, [(Category::Optimizer, 2)]);
    let (none, b) = run(false);
    assert!(none.is_empty());
    assert_eq!(a, b);
}
