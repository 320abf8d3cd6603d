//! Tests of the kernel families' ops: each op's forward (the CPU reference) and backward
//! against the composite candle ops, the one-op RMSNorm backward, the in-place KV write.

use super::*;
use crate::ops;
use candle_core::{DType, Device, Tensor, Var};

fn vals(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).expect("t")
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .expect("d")
        .abs()
        .expect("a")
        .flatten_all()
        .expect("f")
        .max(0)
        .expect("m")
        .to_scalar()
        .expect("s")
}

/// The ops' forward (the CPU reference) and backward (recorded by the op) against the
/// composite candle ops of the training path.
#[test]
fn fused_ops_and_their_backward_equal_the_composite_ops() {
    let x = Var::from_tensor(&vals(&[3, 4, 16], 1)).expect("x");
    let w = Var::from_tensor(&vals(&[16], 2)).expect("w");
    let g = vals(&[3, 4, 16], 3);
    let grads = |y: Tensor| {
        (y * &g)
            .expect("m")
            .sum_all()
            .expect("s")
            .backward()
            .expect("b")
    };
    let (a, b) = (
        rms_norm(&x, &w, 1e-6).expect("f"),
        ops::rms_norm_composite(&x, &w, 1e-6).expect("c"),
    );
    assert!(max_diff(&a, &b) < 1e-5);
    let (ga, gb) = (grads(a), grads(b));
    for v in [&x, &w] {
        let d = max_diff(ga.get(v).expect("g"), gb.get(v).expect("g"));
        assert!(d < 1e-4, "rmsnorm grad {d}");
    }
    // The graph-free backward (what CUDA runs) on its CPU reference, and with a residual
    // stream's gradient added into dx.
    let (dx, dw) = rms_norm_grad(&x, &w, &g, 1e-6, None).expect("bwd");
    assert!(max_diff(&dx, gb.get(&x).expect("g")) < 1e-4);
    assert!(max_diff(&dw, gb.get(&w).expect("g")) < 1e-4);
    let res = vals(&[3, 4, 16], 5);
    let (dxr, dwr) = rms_norm_grad(&x, &w, &g, 1e-6, Some(&res)).expect("bwd");
    assert_eq!(max_diff(&dxr, &(&dx + &res).expect("add")), 0.0);
    assert_eq!(max_diff(&dwr, &dw), 0.0);

    let x = Var::from_tensor(&vals(&[2, 3, 4, 8], 4)).expect("x");
    let pos = Tensor::from_vec(vec![0u32, 1, 2, 3, 7, 8, 9, 10], (2, 4), &Device::Cpu).expect("p");
    let (c, s) = ops::rope_tables(&pos, 8, 1e4, DType::F32).expect("t");
    let g = vals(&[2, 3, 4, 8], 5);
    let grads = |y: Tensor| {
        (y * &g)
            .expect("m")
            .sum_all()
            .expect("s")
            .backward()
            .expect("b")
    };
    let (a, b) = (
        rope(&x, &c, &s).expect("f"),
        ops::rope_composite(&x, &c, &s).expect("c"),
    );
    assert!(max_diff(&a, &b) < 1e-6);
    let d = max_diff(grads(a).get(&x).expect("g"), grads(b).get(&x).expect("g"));
    assert!(d < 1e-6, "rope grad {d}");

    // From the rows' layout (B, T, H, D) into attention's and back: the same numbers as a
    // transposing copy and the plain rotation, bit for bit, and the inverse undoes it.
    let rows = vals(&[2, 4, 3, 8], 6); // (B, T, H, D)
    let heads = rows.transpose(1, 2).expect("t").contiguous().expect("c"); // (B, H, T, D)
    let want = rope(&heads, &c, &s).expect("plain");
    let got = rope_laid_out(&rows, &c, &s, false, [true, false]).expect("to heads");
    assert_eq!(got.dims(), [2, 3, 4, 8]);
    assert_eq!(max_diff(&got, &want), 0.0);
    let back = rope_laid_out(&got, &c, &s, true, [false, true]).expect("back");
    assert_eq!(back.dims(), [2, 4, 3, 8]);
    assert!(max_diff(&back, &rows) < 1e-6);
    let inverse = rope_laid_out(&heads, &c, &s, true, [false, true]).expect("inverse");
    let plain = ops::rope_composite(&heads, &c, &s.neg().expect("n")).expect("c");
    let plain = plain.transpose(1, 2).expect("t").contiguous().expect("c");
    assert!(max_diff(&inverse, &plain) < 1e-6);
    // Rows to rows (the written layer backward's), both ways.
    let within = rope_laid_out(&rows, &c, &s, false, [true, true]).expect("rows");
    let want_rows = want.transpose(1, 2).expect("t").contiguous().expect("c");
    assert_eq!(max_diff(&within, &want_rows), 0.0);
    let undone = rope_laid_out(&within, &c, &s, true, [true, true]).expect("rows back");
    assert!(max_diff(&undone, &rows) < 1e-6);
}

#[test]
fn kv_write_fills_one_slot_in_place() {
    let cache = Tensor::zeros((2, 1, 3, 2), DType::F32, &Device::Cpu).expect("c");
    kv_write(&cache, &vals(&[2, 1, 2], 6), 1).expect("write");
    let flat = cache.flatten_all().expect("f").to_vec1::<f32>().expect("v");
    let src = vals(&[2, 1, 2], 6)
        .flatten_all()
        .expect("f")
        .to_vec1::<f32>()
        .expect("v");
    assert_eq!(
        flat,
        [0.0, 0.0, src[0], src[1], 0.0, 0.0, 0.0, 0.0, src[2], src[3], 0.0, 0.0]
    );
    assert!(
        kv_write(&cache, &vals(&[2, 1, 2], 6), 3).is_err(),
        "slot out of range"
    );
}

/// Every parity group runs on the CPU (its "device" side on the CPU too) and passes; the row
/// names gpu-check reports include the bf16 kernels and the whole-model rows.
#[test]
fn parity_groups_run_on_the_cpu() {
    let rows = crate::testing::parity::check(&Device::Cpu).expect("parity");
    for r in &rows {
        assert!(r.ok(), "{r:?}");
    }
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    for want in [
        "bf16 rmsnorm fwd",
        "bf16 rope fwd",
        "bf16 rope bwd",
        "bf16 kv write + decode attention",
        "model decode logits, kernels vs composite (16 steps)",
        "training gradient norm bf16 vs f32 (relative)",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
}

/// The bf16 tolerance gpu-check states: a correct bf16 kernel is the f32 reference on the
/// bf16-rounded inputs with its output rounded to bf16; that is within the tolerance, and the
/// rounded-input reference is near the f32 one (so the rows compare what matters).
#[test]
fn bf16_references_stay_within_the_stated_tolerance() {
    let round = |t: &Tensor| {
        t.to_dtype(DType::BF16)
            .and_then(|t| t.to_dtype(DType::F32))
            .expect("round")
    };
    let (x, w) = (vals(&[16, 256], 1), vals(&[256], 2));
    let exact = rms_norm(&x, &w, 1e-6).expect("f32");
    let on_rounded = rms_norm(&round(&x), &round(&w), 1e-6).expect("rounded");
    let kernel_like = round(&on_rounded);
    let tol = crate::testing::parity::bf16_tolerance(&on_rounded).expect("tol");
    assert!(crate::testing::parity::diff(&kernel_like, &on_rounded).expect("d") <= tol);
    assert!(crate::testing::parity::diff(&on_rounded, &exact).expect("d") <= 4.0 * tol);
    // And a NaN anywhere fails a row.
    let nan = Tensor::new(&[1.0f32, f32::NAN], &Device::Cpu).expect("t");
    let one = Tensor::new(&[1.0f32, 1.0], &Device::Cpu).expect("t");
    assert!(crate::testing::parity::diff(&nan, &one)
        .expect("d")
        .is_nan());
}

/// The checks run through the public ops (the path a launch takes), and empty inputs return
/// without running anything.
#[test]
fn ops_refuse_bad_shapes_and_pass_empty_inputs_through() {
    let x = vals(&[2, 1, 3, 4], 1);
    let table = vals(&[3, 2], 2); // (T, D/2): would be read out of bounds for row 1
    let e = rope(&x, &table, &table)
        .expect_err("2-d tables")
        .to_string();
    assert!(e.contains("rope: cos [3, 2]"), "{e}");
    let logits = vals(&[2, 5], 3);
    let t = Tensor::new(&[1u32, 5], &Device::Cpu).expect("t");
    let e = logprob_stats(&logits, &t)
        .expect_err("target 5 of 5")
        .to_string();
    assert!(e.contains("target 5 at row 1"), "{e}");
    let empty = Tensor::zeros((0, 4), DType::F32, &Device::Cpu).expect("e");
    let w = vals(&[4], 4);
    assert_eq!(rms_norm(&empty, &w, 1e-6).expect("empty").dims(), [0, 4]);
    let none = Tensor::zeros(0, DType::U32, &Device::Cpu).expect("t");
    let z = Tensor::zeros((0, 5), DType::F32, &Device::Cpu).expect("z");
    assert_eq!(logprob_stats(&z, &none).expect("empty").dims(), [0, 3]);
}

/// SwiGLU's forward (the CPU reference) equals candle's silu(g) * u, and its own backward
/// (`SwigluBwd`, what CUDA runs as one kernel) matches central finite differences of the loss
/// sum(swiglu(g, u) * w) in every element of g and u.
#[test]
fn swiglu_and_its_backward_pass_a_finite_difference_check() {
    let shape = [3, 7];
    let g0 = (vals(&shape, 4) * 4.0).expect("g"); // gates in [-4, 4): both tails of the sigmoid
    let u0 = vals(&shape, 5);
    let w = vals(&shape, 6);
    let (g, u) = (
        Var::from_tensor(&g0).expect("g"),
        Var::from_tensor(&u0).expect("u"),
    );
    let y = swiglu(&g, &u).expect("fwd");
    let composite = (g.silu().expect("silu") * u.as_tensor()).expect("mul");
    assert!(max_diff(&y, &composite) < 1e-6);
    let grads = (y * &w)
        .expect("m")
        .sum_all()
        .expect("s")
        .backward()
        .expect("b");
    let loss = |g: &Tensor, u: &Tensor| -> f64 {
        let y = swiglu(g, u).expect("fwd");
        let v = (y * &w).expect("m").flatten_all().expect("f");
        // The sum in f64, so the differences below are the op's, not the sum's rounding.
        v.to_vec1::<f32>()
            .expect("v")
            .iter()
            .map(|&x| f64::from(x))
            .sum()
    };
    let h = 1e-2f32;
    for (which, analytic) in [(0, grads.get(&g)), (1, grads.get(&u))] {
        let analytic = analytic
            .expect("a gradient")
            .flatten_all()
            .expect("f")
            .to_vec1::<f32>()
            .expect("v");
        let base = [&g0, &u0][which]
            .flatten_all()
            .expect("f")
            .to_vec1::<f32>()
            .expect("v");
        for i in 0..base.len() {
            let at = |d: f32| {
                let mut v = base.clone();
                v[i] += d;
                let t = Tensor::from_vec(v, &shape[..], &Device::Cpu).expect("t");
                if which == 0 {
                    loss(&t, &u0)
                } else {
                    loss(&g0, &t)
                }
            };
            let numeric = (at(h) - at(-h)) / (2.0 * f64::from(h));
            let d = (numeric - f64::from(analytic[i])).abs();
            assert!(
                d < 1e-3,
                "swiglu d{} [{i}]: analytic {} vs finite difference {numeric}",
                ["g", "u"][which],
                analytic[i]
            );
        }
    }
}

/// The stacked SwiGLU (rows [g | u]) is the plain op on the two halves, bit for bit, and refuses
/// an odd row in one line.
#[test]
fn swiglu_stacked_equals_swiglu_of_the_halves() {
    let (g, u) = (
        vals(&[2, 3, 5], 1).affine(3.0, 0.0).expect("g"),
        vals(&[2, 3, 5], 2),
    );
    let gu = Tensor::cat(&[&g, &u], 2).expect("cat"); // (2, 3, 10)
    let want = swiglu(&g, &u).expect("plain");
    let got = swiglu_stacked(&gu).expect("stacked");
    assert_eq!(got.dims(), &[2, 3, 5]);
    assert_eq!(max_diff(&got, &want), 0.0);
    let odd = swiglu_stacked(&vals(&[2, 7], 3))
        .expect_err("odd")
        .to_string();
    assert!(
        odd.starts_with("swiglu stacked:") && !odd.contains('\n'),
        "{odd}"
    );
}

/// A paged step's fused query, key and value (the CPU reference behind the op) equal the plain
/// sequence it stands for: candle's norm and rotation, then the two cache writes; with and
/// without head norms; and bad shapes are refused in one line naming the op.
#[test]
fn paged_qkv_equals_the_plain_norm_rope_and_writes() {
    let (n, hq, hkv, nb, bs, d) = (3, 4, 2, 4, 16, 32);
    let meta = PagedMeta::from_tables(
        vec![0, 1, 2],
        1,
        vec![6, 16, 1],
        vec![5, 16 + 15, 32],
        [nb, bs],
        &Device::Cpu,
    )
    .expect("meta");
    let qkv = vals(&[n, (hq + 2 * hkv) * d], 4); // (N, (Hq + 2 Hkv) D)
    let part = |from: usize, h: usize| {
        qkv.narrow(1, from * d, h * d)
            .expect("narrow")
            .reshape((n, h, d))
            .expect("r") // (N, H, D)
    };
    let (q, k, v) = (part(0, hq), part(hq, hkv), part(hq + hkv, hkv));
    let (qn, kn) = (
        vals(&[d], 6).affine(0.5, 1.0).expect("w"),
        vals(&[d], 7).affine(0.5, 1.0).expect("w"),
    );
    let pos = Tensor::from_vec(vec![5u32, 31, 0], (n, 1), &Device::Cpu).expect("pos");
    let (cos, sin) = ops::rope_tables(&pos, d, 1e6, DType::F32).expect("tables"); // (N, 1, D/2)
    for norm in [true, false] {
        let plain = (vals(&[nb, hkv, bs, d], 8), vals(&[nb, hkv, bs, d], 9));
        let fused = (plain.0.copy().expect("copy"), plain.1.copy().expect("copy"));
        let head = |x: &Tensor, w: &Tensor, h: usize| {
            let x = match norm {
                true => ops::rms_norm(x, w, 1e-6).expect("norm"),
                false => x.clone(),
            };
            let x = x.reshape((n, h, 1, d)).expect("r"); // (N, H, 1, D)
            ops::rope(&x, &cos, &sin)
                .expect("rope")
                .reshape((n, h, d))
                .expect("r")
        };
        let want_q = head(&q, &qn, hq);
        paged_kv_write(&plain.0, &head(&k, &kn, hkv), &meta).expect("write");
        paged_kv_write(&plain.1, &v, &meta).expect("write");
        let norms = norm.then_some((&qn, &kn));
        let got_q =
            paged_qkv(&qkv, norms, 1e-6, (&cos, &sin), (&fused.0, &fused.1), &meta).expect("qkv");
        assert!(max_diff(&got_q, &want_q) < 1e-5, "q, norm {norm}");
        assert!(max_diff(&fused.0, &plain.0) < 1e-5, "keys, norm {norm}");
        assert!(max_diff(&fused.1, &plain.1) == 0.0, "values, norm {norm}");
    }
    let pools = (vals(&[nb, hkv, bs, d], 8), vals(&[nb, hkv, bs, d], 9));
    // One query head for two key heads: not a whole group.
    let narrow = qkv.narrow(1, 0, (1 + 2 * hkv) * d).expect("narrow");
    let bad = paged_qkv(
        &narrow,
        None,
        1e-6,
        (&cos, &sin),
        (&pools.0, &pools.1),
        &meta,
    )
    .expect_err("a query head short")
    .to_string();
    assert!(
        bad.starts_with("paged qkv:") && !bad.contains('\n'),
        "{bad}"
    );
    let shared = paged_qkv(&qkv, None, 1e-6, (&cos, &sin), (&pools.0, &pools.0), &meta)
        .expect_err("one pool twice")
        .to_string();
    assert!(
        shared.contains("shares a storage") && !shared.contains('\n'),
        "{shared}"
    );
}
