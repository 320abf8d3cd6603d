//! Flash attention against the composite `ops::gqa_attention` on the CPU in f32: outputs and
//! the gradients of q, k and v over random shapes (GQA ratios 1, 2, 4, 8; head_dim 64 and 128;
//! left and right padding; packed rows of mixed lengths, length 1 included).

use super::{attention, KeyRanges};
use crate::ops::{attention_bias, gqa_attention};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};

fn randn(rng: &mut rand_chacha::ChaCha8Rng, shape: (usize, usize, usize, usize)) -> Var {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let v: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    Var::from_tensor(&Tensor::from_vec(v, shape, &Device::Cpu).expect("t")).expect("var")
}

/// The "may attend" table of key ranges, for the composite reference.
fn allowed_of(r: &KeyRanges, b: usize, t: usize) -> Vec<u8> {
    let mut a = vec![0u8; b * t * t];
    for row in 0..b {
        for i in 0..t {
            for j in r.starts()[row * t + i] as usize..=i {
                a[(row * t + i) * t + j] = 1;
            }
        }
    }
    a
}

/// Max relative error over the rows that attend something (empty rows are don't-cares).
fn rel_err(a: &Tensor, b: &Tensor, live: &[bool], d: usize) -> f32 {
    let (a, b) = (
        a.flatten_all().and_then(|x| x.to_vec1::<f32>()).expect("a"),
        b.flatten_all().and_then(|x| x.to_vec1::<f32>()).expect("b"),
    );
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let mut worst = 0f32;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if live[(i / d) % live.len()] {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    worst
}

/// Compares out and (dq, dk, dv) for one shape; `live` marks the query rows (B * T, repeated
/// over heads) whose range is not empty.
fn check(seed: u64, b: usize, hq: usize, hkv: usize, t: usize, d: usize, ranges: &KeyRanges) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (q, k, v) = (
        randn(&mut rng, (b, hq, t, d)),
        randn(&mut rng, (b, hkv, t, d)),
        randn(&mut rng, (b, hkv, t, d)),
    );
    let g: Vec<f32> = (0..b * hq * t * d)
        .map(|_| rng.random::<f32>() - 0.5)
        .collect();
    let g = Tensor::from_vec(g, (b, hq, t, d), &Device::Cpu).expect("g");
    let bias =
        attention_bias(&allowed_of(ranges, b, t), b, t, t, DType::F32, &Device::Cpu).expect("bias");
    let reference = gqa_attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &bias).expect("ref");
    let flash = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), ranges).expect("flash");
    // Per (B, Hq, T) row: live when its range is not empty. Gradients of K/V need no mask:
    // dead query rows add nothing in either path once their output gradient is zeroed.
    let starts = ranges.starts();
    let live_q: Vec<bool> = (0..b * hq * t)
        .map(|x| {
            let (row, i) = (x / (hq * t), x % t);
            (starts[row * t + i] as usize) <= i
        })
        .collect();
    let mask: Vec<f32> = live_q
        .iter()
        .flat_map(|&l| vec![f32::from(u8::from(l)); d])
        .collect();
    let mask = Tensor::from_vec(mask, (b, hq, t, d), &Device::Cpu).expect("mask");
    let g = (g * &mask).expect("masked g");
    let e = rel_err(&flash, &reference, &live_q, d);
    assert!(e < 1e-5, "out: {e} (b {b} hq {hq} hkv {hkv} t {t} d {d})");
    let loss = |o: &Tensor| (o * &g).and_then(|x| x.sum_all()).expect("loss");
    let (gr, gf) = (
        loss(&reference).backward().expect("bwd ref"),
        loss(&flash).backward().expect("bwd flash"),
    );
    let all = vec![true; 1];
    for (name, var, live) in [("dq", &q, &live_q), ("dk", &k, &all), ("dv", &v, &all)] {
        let (a, r) = (
            gf.get(var.as_tensor()).expect("flash grad"),
            gr.get(var.as_tensor()).expect("ref grad"),
        );
        let e = rel_err(a, r, live, d);
        assert!(
            e < 1e-5,
            "{name}: {e} (b {b} hq {hq} hkv {hkv} t {t} d {d})"
        );
    }
}

#[test]
fn matches_the_composite_attention_and_its_gradients() {
    let dev = Device::Cpu;
    // GQA ratios 1, 2, 4, 8; head_dim 64 and 128; lengths around the 64-row tiles.
    for (i, &(hq, hkv, t, d)) in [
        (2, 2, 70, 64),
        (4, 2, 129, 128),
        (8, 2, 33, 64),
        (8, 1, 150, 64),
    ]
    .iter()
    .enumerate()
    {
        // Left padding (row 0: 5 pads), no padding (row 1), right padding (row 2).
        let b = 3;
        let mut mask = vec![1u8; b * t];
        mask[..5].fill(0);
        mask[3 * t - 7..].fill(0);
        let r = KeyRanges::from_mask(&mask, b, t, &dev)
            .expect("ranges")
            .expect("contiguous");
        check(i as u64, b, hq, hkv, t, d, &r);
    }
}

#[test]
fn packed_rows_never_attend_across_sequences() {
    let dev = Device::Cpu;
    // Mixed lengths, a length-1 sequence, a sequence across a tile boundary, padding at the end.
    let r = KeyRanges::packed(&[1, 40, 70, 1, 9], 130, &dev).expect("packed");
    check(7, 1, 4, 2, 130, 64, &r);
    let r = KeyRanges::packed(&[65, 64], 129, &dev).expect("packed");
    check(8, 1, 2, 1, 129, 128, &r);
}

#[test]
fn bad_ranges_and_shapes_are_refused() {
    let dev = Device::Cpu;
    let e = KeyRanges::new(vec![0, 3, 1], 1, 3, &dev).expect_err("out of range");
    assert!(e.to_string().contains("position 1"), "{e}");
    assert!(KeyRanges::from_mask(&[1, 0, 1], 1, 3, &dev)
        .expect("ok")
        .is_none());
    assert!(KeyRanges::packed(&[3, 2], 4, &dev).is_err());
    let q = Tensor::zeros((1, 3, 4, 8), DType::F32, &dev).expect("q");
    let k = Tensor::zeros((1, 2, 4, 8), DType::F32, &dev).expect("k");
    let r = KeyRanges::packed(&[4], 4, &dev).expect("r");
    assert!(
        attention(&q, &k, &k, &r).is_err(),
        "3 query heads over 2 kv heads"
    );
}
