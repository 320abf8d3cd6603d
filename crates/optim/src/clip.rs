//! Gradients by parameter name: collected from candle's GradStore, accumulated across
//! micro-batches, and clipped by global norm (torch.nn.utils.clip_grad_norm_ semantics).

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};
use std::collections::BTreeMap;

/// Gradients keyed by HF parameter name, in sorted order.
pub type Grads = BTreeMap<String, Tensor>;

/// The gradients of `params` from a backward pass; parameters the loss did not reach are absent.
pub fn collect_grads(params: &BTreeMap<String, Var>, store: &GradStore) -> Grads {
    params
        .iter()
        .filter_map(|(k, v)| store.get(v.as_tensor()).map(|g| (k.clone(), g.detach())))
        .collect()
}

/// acc += new, name by name (gradient accumulation over micro-batches).
pub fn accumulate(acc: &mut Grads, new: Grads) -> Result<()> {
    for (k, g) in new {
        let sum = match acc.remove(&k) {
            Some(a) => (a + g)?,
            None => g,
        };
        acc.insert(k, sum);
    }
    Ok(())
}

/// Scales all gradients so their global L2 norm is at most `max_norm` and returns the norm
/// before clipping (torch: coef = max_norm / (norm + 1e-6), applied only when < 1). A non-finite
/// norm is returned as is and nothing is scaled: the caller decides to stop or skip the step.
pub fn clip_grad_norm(grads: &mut Grads, max_norm: f64) -> Result<f64> {
    let Some(dev) = grads.values().next().map(|g| g.device().clone()) else {
        return Ok(0.0);
    };
    use terse_model::profile::{span, Category};
    span(&dev, Category::Optimizer, || clip_in_place(grads, max_norm))
}

/// `clip_grad_norm` on a non-empty set.
fn clip_in_place(grads: &mut Grads, max_norm: f64) -> Result<f64> {
    let norm = sum_of_squares(grads)?.sqrt();
    if !norm.is_finite() {
        return Ok(norm);
    }
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for g in grads.values_mut() {
            // torch multiplies by the coefficient held as an f32 tensor.
            *g = (&*g * f64::from(coef as f32))?;
        }
    }
    Ok(norm)
}

/// The gradients' sum of squares in f64. On CUDA with f32 gradients (unless `TERSE_FUSED=0`)
/// terse_model's `adamw::grad_sumsq`: one launch and one download for all of them, where the
/// composite sum takes three launches and a synchronising download per tensor; the CPU keeps
/// the composite sum (its numbers do not move).
fn sum_of_squares(grads: &Grads) -> Result<f64> {
    let fused = grads
        .values()
        .all(|g| g.device().is_cuda() && g.dtype() == DType::F32 && g.is_contiguous())
        && !grads.is_empty()
        && terse_model::device::fused();
    if fused {
        let all: Vec<&Tensor> = grads.values().collect();
        return terse_model::adamw::grad_sumsq(&all);
    }
    let mut sq = 0f64;
    for g in grads.values() {
        sq += g
            .to_dtype(DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?;
    }
    Ok(sq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn grads(v: &[(&str, Vec<f32>)]) -> Grads {
        v.iter()
            .map(|(k, x)| {
                (
                    k.to_string(),
                    Tensor::new(x.as_slice(), &Device::Cpu).expect("t"),
                )
            })
            .collect()
    }

    #[test]
    fn clipping_scales_only_above_the_limit_and_reports_the_pre_clip_norm() {
        let mut g = grads(&[("a", vec![3.0]), ("b", vec![4.0])]);
        assert_eq!(clip_grad_norm(&mut g, 10.0).expect("clip"), 5.0);
        assert_eq!(g["a"].to_vec1::<f32>().expect("v"), [3.0]);
        assert_eq!(clip_grad_norm(&mut g, 1.0).expect("clip"), 5.0);
        let a = g["a"].to_vec1::<f32>().expect("v")[0];
        assert!((a - 0.6).abs() < 1e-6, "{a}");
    }

    #[test]
    fn non_finite_norm_is_reported_and_nothing_changes() {
        let mut g = grads(&[("a", vec![f32::NAN]), ("b", vec![4.0])]);
        assert!(clip_grad_norm(&mut g, 1.0).expect("clip").is_nan());
        assert_eq!(g["b"].to_vec1::<f32>().expect("v"), [4.0]);
    }

    #[test]
    fn accumulation_sums_by_name() {
        let mut acc = grads(&[("a", vec![1.0])]);
        accumulate(&mut acc, grads(&[("a", vec![2.0]), ("b", vec![5.0])])).expect("acc");
        assert_eq!(acc["a"].to_vec1::<f32>().expect("v"), [3.0]);
        assert_eq!(acc["b"].to_vec1::<f32>().expect("v"), [5.0]);
    }
}
