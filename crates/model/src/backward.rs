//! The training step's forward and backward in one call, `Qwen3::logprob_backward`: token log-probs
//! at selected rows, a loss the caller computes from them, and the gradient of every parameter.
//! With `options.checkpoint_layers` the forward keeps only each decoder layer's input (B, T, H),
//! dropping each layer's graph as soon as it has run; the backward then walks the layers from the
//! last, recomputing one layer's forward with a graph, pulling the incoming gradient through it
//! (the surrogate sum(y * dy) has gradient dy in y) and handing the input's gradient down.
//! Activation memory is then (layers + 1) inputs plus one layer's working set. Where the layer
//! backward is written out (CUDA), the last layers may keep their whole forward state instead,
//! as many as `options.keep_layers` allows (model/keep.rs: by default on CUDA, what the free
//! memory holds), and skip their recompute.
//!
//! Data flow: trainer `gradients` -> here -> `Qwen3::layer` (model/forward.rs) per layer ->
//! gradients by HF key.

use crate::batch::Batch;
use crate::model::forward::MaskOwned;
use crate::model::Qwen3;
use crate::ops::rms_norm;
use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};
use std::collections::BTreeMap;

/// Gradients by HF parameter key.
pub type Gradients = BTreeMap<String, Tensor>;

impl Qwen3 {
    /// log p(targets) at the flat rows `rows` of the batch, `loss` of them (a scalar), and the
    /// gradient of that loss in every parameter that receives one. Checkpointed or not
    /// (`options.checkpoint_layers`), the same function to float rounding.
    pub fn logprob_backward(
        &self,
        batch: &Batch,
        rows: &[u32],
        targets: &[u32],
        loss: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
    ) -> Result<Gradients> {
        if !self.options.checkpoint_layers {
            let logp = self.token_logprobs(batch, rows, targets, true)?;
            let store = loss(&logp)?.backward()?;
            let mut grads = Gradients::new();
            self.collect(&store, &mut grads)?;
            return Ok(grads);
        }
        let c = &self.config;
        let (cos, sin, mask) = self.sequence_inputs(batch)?;
        // Where it applies (CUDA, fused blocks), each layer's backward is written out
        // (model/layer_grad.rs) and its weights are cast to the compute dtype once here.
        let ranges = match &mask {
            MaskOwned::Ranges(r) if self.written_backward() => Some(r),
            _ => None,
        };
        let mut weights = match ranges {
            Some(_) => (0..c.num_hidden_layers)
                .map(|l| self.layer_weights(l))
                .collect::<Result<Vec<_>>>()?,
            None => vec![],
        };
        // Written out, the last `keep` layers keep their forward's state, so their backward
        // recomputes nothing: as many as the options allow (`Auto`: the device's free memory,
        // model/keep.rs).
        let keep = match ranges {
            Some(_) => self.kept_layers(batch)?,
            None => 0,
        };
        let mut kept = Vec::with_capacity(keep);
        // The forward keeping each layer's input only: every layer runs the training ops (the
        // inference ones round differently) and its graph is dropped at once by `detach`.
        let mut inputs = vec![self.embed(&batch.input_ids, true)?.detach()];
        for l in 0..c.num_hidden_layers {
            let x = match ranges {
                Some(r) => {
                    let s = self.layer_forward(&weights[l], &inputs[l], &cos, &sin, r)?;
                    let y = s.y.clone();
                    if l + keep >= c.num_hidden_layers {
                        kept.push(s);
                    }
                    y
                }
                None => self.layer(l, &inputs[l], &cos, &sin, Some(mask.as_mask()), None, true)?,
            };
            inputs.push(x.detach());
        }
        // The head: final norm, log-probs and the loss, with a graph from the last output.
        let last = leaf(&inputs[c.num_hidden_layers])?;
        let h = rms_norm(
            last.as_tensor(),
            &self.w("model.norm.weight", true)?,
            c.rms_norm_eps,
        )?;
        let logp = self.head_logprobs(&h, rows, targets, true)?;
        let store = loss(&logp)?.backward()?;
        let mut grads = Gradients::new();
        self.collect(&store, &mut grads)?;
        let mut dy = input_grad(&store, &last)?;
        // The layers from the last: recompute with a graph, pull dy through; or the layer's
        // backward written out.
        for l in (0..c.num_hidden_layers).rev() {
            if let (Some(r), Some(lw)) = (ranges, weights.pop()) {
                let (dx, layer) = match kept.pop() {
                    Some(s) => self.layer_grad_saved(&lw, &s, &cos, &sin, r, &dy)?,
                    None => self.layer_grad(&lw, &inputs[l], &cos, &sin, r, &dy)?,
                };
                inputs.truncate(l);
                for (k, g) in layer {
                    add_grad(&mut grads, k, g)?;
                }
                dy = dx;
                continue;
            }
            let x = leaf(&inputs[l])?;
            inputs.truncate(l);
            let y = self.layer(
                l,
                x.as_tensor(),
                &cos,
                &sin,
                Some(mask.as_mask()),
                None,
                true,
            )?;
            let store = surrogate(&y, &dy)?.backward()?;
            self.collect(&store, &mut grads)?;
            dy = input_grad(&store, &x)?;
        }
        // The embedding (tied heads add to the head's gradient).
        let e = self.embed(&batch.input_ids, true)?;
        let store = surrogate(&e, &dy)?.backward()?;
        self.collect(&store, &mut grads)?;
        Ok(grads)
    }

    /// The layers this step keeps rather than recomputes (`ForwardOptions::keep_layers`), for
    /// the batch's tokens in the compute dtype, beside f32 gradients of every parameter.
    fn kept_layers(&self, batch: &Batch) -> Result<usize> {
        let tokens = batch.input_ids.elem_count() as u64;
        let value = self.compute_dtype.size_in_bytes() as u64;
        let memory = match self.options.keep_layers {
            crate::KeepLayers::Auto => crate::device::memory(&self.device),
            crate::KeepLayers::Count(_) => None,
        };
        Ok(crate::model::keep::resolve(
            self.options.keep_layers,
            &self.config,
            tokens,
            value,
            4,
            memory,
        ))
    }

    /// Adds every parameter's gradient in `store` to `grads`.
    fn collect(&self, store: &GradStore, grads: &mut Gradients) -> Result<()> {
        for (k, v) in self.vars() {
            if let Some(g) = store.get(v.as_tensor()) {
                add_grad(grads, k.clone(), g.detach())?;
            }
        }
        Ok(())
    }
}

/// Adds g to the gradient of `key` in `grads` (inserts it when there is none yet).
fn add_grad(grads: &mut Gradients, key: String, g: Tensor) -> Result<()> {
    let sum = match grads.remove(&key) {
        Some(a) => (a + g)?,
        None => g,
    };
    grads.insert(key, sum);
    Ok(())
}

/// A graph leaf holding x's values (a copy), whose gradient the backward reports.
fn leaf(x: &Tensor) -> Result<Var> {
    Var::from_tensor(&x.detach())
}

/// sum(y * dy) in f32: its gradient in y is dy, so its backward carries dy into the layer.
fn surrogate(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    (y.to_dtype(DType::F32)? * dy.to_dtype(DType::F32)?.detach())?.sum_all()
}

/// The gradient a backward left on a leaf (zeros when the loss does not reach it).
fn input_grad(store: &GradStore, x: &Var) -> Result<Tensor> {
    match store.get(x.as_tensor()) {
        Some(g) => Ok(g.detach()),
        None => x.as_tensor().zeros_like(),
    }
}

#[cfg(test)]
mod tests {
    use crate::{Batch, Config, Padding, Qwen3};
    use candle_core::{DType, Device, Result, Tensor};

    /// Gradients of a weighted log-prob sum over right-padded rows of mixed lengths, with
    /// the given options.
    fn grads(m: &mut Qwen3, flash: bool, checkpoint: bool) -> super::Gradients {
        m.options.flash = flash;
        m.options.checkpoint_layers = checkpoint;
        let v = m.config.vocab_size as u32;
        let rows: Vec<Vec<u32>> = [37usize, 5, 1, 70]
            .iter()
            .enumerate()
            .map(|(r, &n)| {
                (0..n as u32)
                    .map(|j| (j * 7 + r as u32 * 13 + 1) % v)
                    .collect()
            })
            .collect();
        let batch = Batch::from_rows(&rows, 0, Padding::Right, &Device::Cpu).expect("batch");
        let (sel, targets) = batch.next_token_selection();
        let w: Vec<f32> = (0..sel.len())
            .map(|i| 1.0 + (i % 5) as f32 * 0.25)
            .collect();
        let w = Tensor::from_vec(w, sel.len(), &Device::Cpu).expect("w");
        let mut loss = |lp: &Tensor| -> Result<Tensor> { (lp * &w)?.sum_all()?.neg() };
        m.logprob_backward(&batch, &sel, &targets, &mut loss)
            .expect("backward")
    }

    fn max_rel(a: &super::Gradients, b: &super::Gradients) -> f32 {
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        a.iter()
            .map(|(k, x)| {
                let y = &b[k];
                let scale = y
                    .abs()
                    .and_then(|t| t.max_all())
                    .and_then(|t| t.to_scalar::<f32>());
                let d = (x - y).and_then(|t| t.abs()).and_then(|t| t.max_all());
                d.and_then(|t| t.to_scalar::<f32>()).expect("d") / scale.expect("s").max(1e-12)
            })
            .fold(0.0, f32::max)
    }

    fn check(mut m: Qwen3, what: &str) {
        let plain = grads(&mut m, false, false);
        let flash = grads(&mut m, true, false);
        let ckpt = grads(&mut m, true, true);
        let ckpt_composite = grads(&mut m, false, true);
        let (e1, e2, e3) = (
            max_rel(&flash, &plain),
            max_rel(&ckpt, &flash),
            max_rel(&ckpt_composite, &plain),
        );
        assert!(e1 < 1e-5, "{what}: flash vs composite gradients {e1}");
        assert!(e2 < 1e-6, "{what}: checkpointed vs plain (flash) {e2}");
        assert!(e3 < 1e-6, "{what}: checkpointed vs plain (composite) {e3}");
    }

    #[test]
    fn checkpointed_and_flash_gradients_equal_the_plain_path() {
        let dev = Device::Cpu;
        // The testbed's shape (tied head, GQA 2) and a Qwen3-0.6B slice: its head counts and
        // head_dim (16 query heads, 8 KV heads, 128), 2 layers, a small vocabulary.
        let testbed = Config::synthetic(64, 64, 128, 2, 4, 2, 16, true).expect("config");
        check(
            Qwen3::random(testbed, 3, &dev, DType::F32).expect("model"),
            "testbed",
        );
        let slice = Config::synthetic(96, 256, 384, 2, 16, 8, 128, false).expect("config");
        check(
            Qwen3::random(slice.clone(), 5, &dev, DType::F32).expect("model"),
            "0.6B slice",
        );
        // Qwen2's biases and missing q/k norms through the same paths.
        check(
            Qwen3::random(slice.as_qwen2().expect("qwen2"), 5, &dev, DType::F32).expect("model"),
            "0.6B slice as Qwen2",
        );
    }

    /// `flash_min_tokens` (what `model.attention = "auto"` sets on CUDA): a batch shorter than
    /// it takes the composite attention, bit for bit; one at least as long takes flash.
    #[test]
    fn batches_below_flash_min_tokens_take_the_composite_path() {
        let cfg = Config::synthetic(64, 64, 128, 2, 4, 2, 16, true).expect("config");
        let mut m = Qwen3::random(cfg, 3, &Device::Cpu, DType::F32).expect("model");
        let composite = grads(&mut m, false, false);
        let flash = grads(&mut m, true, false);
        m.options.flash_min_tokens = 71; // the batch's rows are 70 tokens
        let short = grads(&mut m, true, false);
        let same = |a: &super::Gradients, b: &super::Gradients| {
            a.iter().all(|(k, x)| {
                let flat = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>());
                let (x, y) = (flat(x), flat(&b[k]));
                x.is_ok() && x.ok() == y.ok()
            })
        };
        assert!(
            same(&short, &composite),
            "below the threshold: the composite path"
        );
        assert!(
            !same(&short, &flash),
            "flash and composite differ in the last bits"
        );
        m.options.flash_min_tokens = 70;
        assert!(
            same(&grads(&mut m, true, false), &flash),
            "at the threshold: flash"
        );
    }
}
