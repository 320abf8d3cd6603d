//! Checks a model against a reference file written by HF transformers (the layout of
//! tests/fixtures/qwen3-tiny/reference.safetensors, explained in its REFERENCE.json): logits on
//! real positions, token log-probs, per-step decode logits through the KV cache, and the greedy
//! continuation. Used by the golden tests and `cargo xtask check-model`.

use crate::{Batch, Qwen3};
use candle_core::{DType, Device, Error, Result, Tensor, D};
use std::collections::HashMap;
use std::path::Path;

/// Max absolute differences against the reference, and whether greedy decoding agreed.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub max_logit_diff: f64,
    pub max_logprob_diff: f64,
    pub max_step_logit_diff: f64,
    pub greedy_match: bool,
    /// Our greedy tokens (prompt excluded) and the reference's.
    pub greedy: Vec<u32>,
    pub reference_greedy: Vec<u32>,
}

impl Report {
    /// True when every difference is within `tol` and the greedy tokens agree.
    pub fn passes(&self, tol: f64) -> bool {
        self.greedy_match
            && self.max_logit_diff <= tol
            && self.max_logprob_diff <= tol
            && self.max_step_logit_diff <= tol
    }
}

fn get<'a>(m: &'a HashMap<String, Tensor>, path: &Path, k: &str) -> Result<&'a Tensor> {
    m.get(k).ok_or_else(|| {
        Error::Msg(format!(
            "{}: reference tensor `{k}` missing",
            path.display()
        ))
    })
}

fn ints(t: &Tensor) -> Result<Vec<u32>> {
    t.to_dtype(DType::I64)?
        .flatten_all()?
        .to_vec1::<i64>()?
        .into_iter()
        .map(|x| Ok(x as u32))
        .collect()
}

fn floats(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// The largest |a − b|: NaN when either side holds a NaN (`f64::max` would drop it and a NaN
/// model would pass), infinite when the lengths differ.
fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, worse)
}

/// The larger difference, NaN when either is NaN (`f64::max` returns the other one).
fn worse(m: f64, d: f64) -> f64 {
    if d.is_nan() || m.is_nan() {
        f64::NAN
    } else {
        m.max(d)
    }
}

/// Runs every check of the reference file against `model`.
pub fn check(model: &Qwen3, path: &Path) -> Result<Report> {
    let bytes = std::fs::read(path).map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
    let r = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .map_err(|e| Error::Msg(format!("{}: corrupt safetensors: {e}", path.display())))?;
    let dev = model.device().clone();
    let ids_t = get(&r, path, "input_ids")?;
    let (b, t) = ids_t.dims2()?;
    let ids = ints(ids_t)?;
    let mask: Vec<u8> = ints(get(&r, path, "attention_mask")?)?
        .into_iter()
        .map(|m| m as u8)
        .collect();
    let pos = ints(get(&r, path, "position_ids")?)?;
    let batch = Batch::with_positions(ids.clone(), mask.clone(), pos, b, t, &dev)?;

    // Logits on real positions only (padded rows are not meaningful in the reference).
    let ours = floats(&model.logits(&batch)?)?;
    let theirs = floats(get(&r, path, "logits")?)?;
    let v = model.config.vocab_size;
    if theirs.len() != b * t * v {
        crate::fail!(
            "{}: reference logits hold {} values, expected {b}x{t}x{v}",
            path.display(),
            theirs.len()
        );
    }
    // A reference with a NaN anywhere, padding rows included, is broken: it fails.
    let mut max_logit_diff = if theirs.iter().any(|x| x.is_nan()) {
        f64::NAN
    } else {
        0f64
    };
    for i in (0..b * t).filter(|&i| mask[i] != 0) {
        max_logit_diff = worse(
            max_logit_diff,
            max_diff(&ours[i * v..(i + 1) * v], &theirs[i * v..(i + 1) * v]),
        );
    }

    // Token log-probs through the fused path; the reference is zero where it is masked.
    let (rows, targets) = batch.next_token_selection();
    let lp = floats(&model.token_logprobs(&batch, &rows, &targets, false)?)?;
    let mut ours_lp = vec![0f64; b * (t - 1)];
    for (&row, x) in rows.iter().zip(lp) {
        let (r_, j) = (row as usize / t, row as usize % t);
        ours_lp[r_ * (t - 1) + j] = x;
    }
    let max_logprob_diff = max_diff(&ours_lp, &floats(get(&r, path, "token_logprobs")?)?);

    // Greedy decoding through the KV cache, teacher-forced on the reference tokens so one early
    // disagreement does not hide the per-step logit differences after it.
    let prompt = ints(get(&r, path, "greedy_prompt")?)?;
    let full = ints(get(&r, path, "greedy_output")?)?;
    let step_ref = floats(get(&r, path, "greedy_step_logits")?)?;
    let steps = full.len() - prompt.len();
    let mut cache = model.new_cache(1, full.len())?;
    let snap = model.decode_weights();
    let p = prompt.len();
    let positions: Vec<u32> = (0..p as u32).collect();
    let mut logits = model.forward_cached(
        &snap,
        &mut cache,
        &Tensor::from_vec(prompt.clone(), (1, p), &dev)?,
        &Tensor::from_vec(positions, (1, p), &dev)?,
        &vec![1; p],
    )?;
    let (mut greedy, mut max_step_logit_diff) = (vec![], 0f64);
    for s in 0..steps {
        let row = floats(&logits)?;
        max_step_logit_diff = worse(
            max_step_logit_diff,
            max_diff(&row, &step_ref[s * v..(s + 1) * v]),
        );
        greedy.push(logits.argmax(D::Minus1)?.to_vec1::<u32>()?[0]);
        let next = full[p + s];
        if s + 1 < steps {
            logits = model.forward_cached(
                &snap,
                &mut cache,
                &Tensor::from_vec(vec![next], (1, 1), &dev)?,
                &Tensor::from_vec(vec![(p + s) as u32], (1, 1), &dev)?,
                &[1],
            )?;
        }
    }
    let reference_greedy = full[p..].to_vec();
    Ok(Report {
        max_logit_diff,
        max_logprob_diff,
        max_step_logit_diff,
        greedy_match: greedy == reference_greedy,
        greedy,
        reference_greedy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15 item 8: NaN anywhere fails the check (before: PASS with NaN logits).
    #[test]
    fn item8_nan_logits_fail_the_check() {
        assert!(max_diff(&[1.0, f64::NAN, 2.0], &[1.0, 0.0, 2.0]).is_nan());
        assert!(max_diff(&[1.0, 0.0], &[f64::NAN, 0.0]).is_nan());
        assert_eq!(max_diff(&[1.0, 0.5], &[1.0, 0.0]), 0.5);
        assert_eq!(max_diff(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        let r = Report {
            max_logit_diff: f64::NAN,
            max_logprob_diff: 0.0,
            max_step_logit_diff: 0.0,
            greedy_match: true,
            greedy: vec![],
            reference_greedy: vec![],
        };
        assert!(!r.passes(1e-4));
    }
}
