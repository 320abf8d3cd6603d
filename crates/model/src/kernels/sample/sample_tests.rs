//! The sampler op on the CPU: every row through `sample_rows` is the reference's draw bit for
//! bit (the path the CPU rollout could take and the ground truth of the kernel), and bad input
//! is a one-line error naming what is wrong.

use super::reference::{sample_row, Warpers};
use super::sample_rows;
use candle_core::{Device, Tensor};

/// (temperature, top-k, top-p, min-p): greedy, plain, every truncation, min-p alone.
fn warpers() -> Vec<Warpers> {
    [
        (0.0, 0, 1.0, 0.0),
        (1.0, 0, 1.0, 0.0),
        (0.7, 3, 0.8, 0.05),
        (1.2, 0, 1.0, 0.2),
    ]
    .into_iter()
    .map(|(temperature, top_k, top_p, min_p)| Warpers {
        temperature,
        top_k,
        top_p,
        min_p,
    })
    .collect()
}

#[test]
fn rows_sampled_together_are_the_reference_draws() -> candle_core::Result<()> {
    let (n, v) = (5, 37);
    let x: Vec<f32> = (0..n * v)
        .map(|i| ((i * 7919) % 97) as f32 / 13.0 - 3.0)
        .collect();
    let logits = Tensor::from_vec(x.clone(), (n, v), &Device::Cpu)?;
    let us: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
    for w in warpers() {
        let got = sample_rows(&logits, &us, &w)?;
        for (i, d) in got.iter().enumerate() {
            assert_eq!(
                *d,
                sample_row(&x[i * v..(i + 1) * v], &w, us[i]),
                "{w:?} row {i}"
            );
        }
    }
    Ok(())
}

#[test]
fn bad_input_is_refused_naming_it() -> candle_core::Result<()> {
    let logits = Tensor::zeros((2, 4), candle_core::DType::F32, &Device::Cpu)?;
    let w = warpers()[1];
    let e = sample_rows(&logits, &[0.5], &w)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("1 uniforms for 2 rows"), "{e}");
    let e = sample_rows(&logits, &[0.5, 1.0], &w)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("uniform 1 of row 1"), "{e}");
    let bad = Warpers { top_p: 0.0, ..w };
    let e = sample_rows(&logits, &[0.5, 0.5], &bad)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("warpers out of range"), "{e}");
    let flat = Tensor::zeros(8, candle_core::DType::F32, &Device::Cpu)?;
    let e = sample_rows(&flat, &[0.5], &w)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("must be (B, V)"), "{e}");
    assert!(sample_rows(&logits.narrow(0, 0, 0)?, &[], &w)?.is_empty());
    Ok(())
}
