//! The CPU references of the kernel families against the composite candle ops (ops.rs).
use super::references::*;
use crate::ops;
use candle_core::{DType, Device, Tensor, Var};

fn vals(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
        .collect()
}

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(d < tol, "{what}: max diff {d}");
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().expect("f").to_vec1::<f32>().expect("v")
}

#[test]
fn rmsnorm_matches_the_composite_op_and_its_gradient() {
    let (rows, cols) = (5, 24);
    let dev = Device::Cpu;
    let x = Var::from_vec(vals(rows * cols, 1), (rows, cols), &dev).expect("x");
    let w = Var::from_vec(vals(cols, 2), cols, &dev).expect("w");
    let dy = vals(rows * cols, 3);
    let y = ops::rms_norm(&x, &w, 1e-6).expect("y");
    let loss = (&y * Tensor::from_vec(dy.clone(), (rows, cols), &dev).expect("g"))
        .expect("m")
        .sum_all()
        .expect("s");
    let grads = loss.backward().expect("bwd");
    let (yr, rstd) = rmsnorm_fwd(&flat(&x), &flat(&w), cols, 1e-6);
    close(&yr, &flat(&y), 1e-5, "rmsnorm y");
    let (dx, dw) = rmsnorm_bwd(&flat(&x), &flat(&w), &rstd, &dy, cols);
    close(&dx, &flat(grads.get(&x).expect("dx")), 1e-5, "rmsnorm dx");
    close(&dw, &flat(grads.get(&w).expect("dw")), 1e-5, "rmsnorm dw");
}

#[test]
fn rope_matches_the_composite_op_and_its_gradient() {
    let (b, h, t, d) = (2, 3, 4, 8);
    let dev = Device::Cpu;
    let x = Var::from_vec(vals(b * h * t * d, 4), (b, h, t, d), &dev).expect("x");
    let pos = Tensor::from_vec(vec![0u32, 1, 2, 3, 5, 6, 7, 9], (b, t), &dev).expect("p");
    let (c, s) = ops::rope_tables(&pos, d, 1e4, DType::F32).expect("tables");
    let y = ops::rope(&x, &c, &s).expect("rope");
    let dy = vals(b * h * t * d, 5);
    let loss = (&y * Tensor::from_vec(dy.clone(), (b, h, t, d), &dev).expect("g"))
        .expect("m")
        .sum_all()
        .expect("s");
    let grads = loss.backward().expect("bwd");
    let dims = [b, h, t, d];
    close(
        &rope(&flat(&x), &flat(&c), &flat(&s), dims, false),
        &flat(&y),
        1e-6,
        "rope y",
    );
    let dx = rope(&dy, &flat(&c), &flat(&s), dims, true);
    close(&dx, &flat(grads.get(&x).expect("dx")), 1e-6, "rope dx");
}

#[test]
fn logprob_epilogue_matches_the_naive_path_and_its_gradient() {
    let (n, v) = (4, 50);
    let dev = Device::Cpu;
    let logits = Var::from_vec(
        vals(n * v, 6).iter().map(|x| 4.0 * x).collect::<Vec<_>>(),
        (n, v),
        &dev,
    )
    .expect("l");
    let targets = vec![3u32, 49, 0, 17];
    let tg = Tensor::from_vec(targets.clone(), n, &dev).expect("t");
    let lsm = candle_nn::ops::log_softmax(&logits, 1).expect("lsm");
    let naive = lsm
        .gather(&tg.unsqueeze(1).expect("u"), 1)
        .expect("g")
        .squeeze(1)
        .expect("s");
    let g = vec![1.0f32, -0.5, 2.0, 0.25];
    let loss = (&naive * Tensor::from_vec(g.clone(), n, &dev).expect("g"))
        .expect("m")
        .sum_all()
        .expect("s");
    let grads = loss.backward().expect("bwd");
    let (logp, lse, ent) = logprob_fwd(&flat(&logits), &targets, v);
    close(&logp, &flat(&naive), 1e-5, "logp");
    let p = lsm.exp().expect("p");
    let h = (&p * &lsm).expect("m").sum(1).expect("s").neg().expect("n");
    close(&ent, &flat(&h), 1e-5, "entropy");
    let d = logprob_bwd(&flat(&logits), &targets, &lse, &g, v);
    close(&d, &flat(grads.get(&logits).expect("dl")), 1e-5, "dlogits");
}

#[test]
fn decode_attention_over_a_written_cache_matches_gqa_attention() {
    let (b, hq, hkv, cap, d, len) = (2, 4, 2, 6, 8, 5);
    let dev = Device::Cpu;
    let mut kc = vec![0f32; b * hkv * cap * d];
    let mut vc = vec![0f32; b * hkv * cap * d];
    for slot in 0..len {
        kv_write(
            &vals(b * hkv * d, 10 + slot),
            &mut kc,
            [b, hkv, d],
            cap,
            slot,
        );
        kv_write(
            &vals(b * hkv * d, 20 + slot),
            &mut vc,
            [b, hkv, d],
            cap,
            slot,
        );
    }
    // Row 0 left-padded by one slot; row 1 has all five.
    let mut valid = vec![0u8; b * cap];
    for t in 0..len {
        valid[t] = u8::from(t >= 1);
        valid[cap + t] = 1;
    }
    let q = vals(b * hq * d, 7);
    let out = decode_attention(&q, &kc, &vc, &valid, [hq, hkv], cap, len, d);
    let allowed: Vec<u8> = (0..b)
        .flat_map(|r| valid[r * cap..r * cap + len].to_vec())
        .collect();
    let bias = ops::attention_bias(&allowed, b, 1, len, DType::F32, &dev).expect("bias");
    let t = |x: &[f32], s: (usize, usize, usize, usize)| Tensor::from_vec(x.to_vec(), s, &dev);
    let kt = t(&kc, (b, hkv, cap, d))
        .expect("k")
        .narrow(2, 0, len)
        .expect("n");
    let vt = t(&vc, (b, hkv, cap, d))
        .expect("v")
        .narrow(2, 0, len)
        .expect("n");
    let reference =
        ops::gqa_attention(&t(&q, (b, hq, 1, d)).expect("q"), &kt, &vt, &bias).expect("attn");
    close(&out, &flat(&reference), 1e-5, "decode attention");
}
