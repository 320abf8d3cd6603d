//! A decoder layer's backward written out, without candle's autograd: the checkpointed
//! backward's recompute keeps what each op's adjoint reads, then the adjoints run in reverse.
//! Each gradient is written once by the op that owns it (no zero-fill and add per graph edge,
//! no cast node per weight use), the fused blocks' own backward kernels do the work (RMSNorm,
//! RoPE's inverse rotation, flash attention, SwiGLU), and every weight is read once as a
//! detached compute-dtype copy. Attention and RoPE work in the projections' rows (B, T, H, D),
//! so no transposing copy or cast runs around them (kernels/flash/rows.rs). The autograd path through `Qwen3::layer` stays as its
//! reference (the test below) and runs wherever this one does not apply.
//!
//! Data flow: backward.rs's checkpointed loop -> `layer_grad` (when `written_backward`) ->
//! (the input's gradient, the layer's weight gradients by HF key) -> the gradient map.

use super::Qwen3;
use crate::kernels as fused;
use crate::kernels::flash::KeyRanges;
use crate::profile::{span, Category as C};
use candle_core::{Result, Tensor};

/// x (N, In) @ W^T with W (Out, In) -> (N, Out).
fn mm_t(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    span(x.device(), C::Matmul, || x.matmul(&w.t()?))
}

/// The gradients of y = x W^T for dy (N, Out): (dx (N, In), dW (Out, In)).
fn linear_grad(x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    span(x.device(), C::Matmul, || {
        Ok((dy.matmul(w)?, dy.t()?.matmul(x)?))
    })
}

/// A decoder layer's weights in the compute dtype, detached: cast once per training step and
/// read by both the forward and the recompute (no cast per use).
pub(crate) struct LayerWeights {
    l: usize,
    wn1: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    /// Qwen2's q/k/v biases.
    bias: Option<[Tensor; 3]>,
    /// Qwen3's q_norm and k_norm.
    norms: Option<[Tensor; 2]>,
    wo: Tensor,
    wn2: Tensor,
    wg: Tensor,
    wu: Tensor,
    wd: Tensor,
}

/// What the forward keeps for the adjoints, rows flattened (N = B * T), and the output y.
pub(crate) struct Saved {
    x: Tensor,
    h: Tensor,
    q: Tensor,
    k: Tensor,
    /// q and k rotated, v and attention's output a, all in the rows (B, T, H, D).
    qr: Tensor,
    kr: Tensor,
    v: Tensor,
    a: Tensor,
    /// Attention's log-sum-exp per (batch, query head, row), for its backward.
    lse: Tensor,
    x1: Tensor,
    h2: Tensor,
    g: Tensor,
    u: Tensor,
    act: Tensor,
    /// The layer's output (B, T, H).
    pub(crate) y: Tensor,
}

impl Qwen3 {
    /// Whether the checkpointed backward writes each layer's backward out (`layer_grad`): on
    /// CUDA with the fused blocks (`TERSE_FUSED=0` keeps the autograd path, the baseline) and no
    /// LoRA, whose adapters build their delta with a graph (the caller also needs flash
    /// attention's key ranges).
    pub(crate) fn written_backward(&self) -> bool {
        self.device.is_cuda()
            && crate::device::fused()
            && self.lora.is_none()
            && fused::flash::supported(&self.device, self.compute_dtype)
    }

    /// Layer l's weights in the compute dtype (one cast each).
    pub(crate) fn layer_weights(&self, l: usize) -> Result<LayerWeights> {
        let c = &self.config;
        let w = |name: &str| {
            let key = format!("model.layers.{l}.{name}");
            span(&self.device, C::Cast, || self.w(&key, false))
        };
        Ok(LayerWeights {
            l,
            wn1: w("input_layernorm.weight")?,
            wq: w("self_attn.q_proj.weight")?,
            wk: w("self_attn.k_proj.weight")?,
            wv: w("self_attn.v_proj.weight")?,
            bias: if c.qkv_bias {
                Some([
                    w("self_attn.q_proj.bias")?,
                    w("self_attn.k_proj.bias")?,
                    w("self_attn.v_proj.bias")?,
                ])
            } else {
                None
            },
            norms: if c.qk_norm {
                Some([w("self_attn.q_norm.weight")?, w("self_attn.k_norm.weight")?])
            } else {
                None
            },
            wo: w("self_attn.o_proj.weight")?,
            wn2: w("post_attention_layernorm.weight")?,
            wg: w("mlp.gate_proj.weight")?,
            wu: w("mlp.up_proj.weight")?,
            wd: w("mlp.down_proj.weight")?,
        })
    }

    /// The layer's forward (B, T, H) -> (B, T, H) by the ops `layer` runs on CUDA, without a
    /// graph, keeping what the adjoints read: the checkpointed step's first pass (its `y`)
    /// and `layer_grad`'s recompute.
    pub(crate) fn layer_forward(
        &self,
        lw: &LayerWeights,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        ranges: &KeyRanges,
    ) -> Result<Saved> {
        let c = &self.config;
        let (b, t, hid) = x.dims3()?;
        let n = b * t;
        let (hq, hkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps as f32;
        let x = x.detach().contiguous()?;
        let dev = x.device();
        let h = span(dev, C::Norm, || fused::rms_norm(&x, &lw.wn1, eps))?.reshape((n, hid))?; // (N, H)
        let (mut q, mut k, mut v) = (mm_t(&h, &lw.wq)?, mm_t(&h, &lw.wk)?, mm_t(&h, &lw.wv)?); // (N, Hq*D), (N, Hkv*D) x 2
        if let Some([bq, bk, bv]) = &lw.bias {
            (q, k, v) = span(dev, C::Elementwise, || {
                Ok((
                    q.broadcast_add(bq)?,
                    k.broadcast_add(bk)?,
                    v.broadcast_add(bv)?,
                ))
            })?;
        }
        let (qn, kn) = match &lw.norms {
            Some([a, bn]) => span(dev, C::Norm, || {
                Ok((
                    fused::rms_norm(&q.reshape((n, hq, hd))?, a, eps)?, // (N, Hq, D)
                    fused::rms_norm(&k.reshape((n, hkv, hd))?, bn, eps)?, // (N, Hkv, D)
                ))
            })?,
            None => (q.clone(), k.clone()),
        };
        // RoPE and attention in the projections' rows: no transposing copy, no cast.
        let rot = |x: &Tensor, h: usize| {
            let x = x.reshape((b, t, h, hd))?; // (B, T, H, D)
            span(dev, C::Rope, || {
                fused::rope_laid_out(&x, cos, sin, false, [true; 2])
            })
        };
        let (qr, kr) = (rot(&qn, hq)?, rot(&kn, hkv)?); // (B, T, Hq, D), (B, T, Hkv, D)
        let v = v.reshape((b, t, hkv, hd))?; // (B, T, Hkv, D)
        let (o, lse) = span(dev, C::FlashForward, || {
            fused::flash::attention_rows(&qr, &kr, &v, ranges)
        })?; // (B, T, Hq, D)
        let a = o.reshape((n, hq * hd))?; // (N, Hq*D)
                                          // The residual add and the post-attention norm in one pass.
        let (xr, ao) = (x.reshape((n, hid))?, mm_t(&a, &lw.wo)?); // (N, H) x 2
        let (x1, h2) = span(dev, C::Norm, || {
            fused::rms_norm_residual(&xr, &ao, &lw.wn2, eps)
        })?; // (N, H) x 2
        let (g, u) = (mm_t(&h2, &lw.wg)?, mm_t(&h2, &lw.wu)?); // (N, I)
        let act = span(dev, C::Elementwise, || fused::swiglu(&g, &u))?; // (N, I)
        let down = mm_t(&act, &lw.wd)?; // (N, H)
        let y = span(dev, C::Elementwise, || &x1 + &down)?.reshape((b, t, hid))?; // (B, T, H)
        Ok(Saved {
            x,
            h,
            q,
            k,
            qr,
            kr,
            v,
            a,
            lse,
            x1,
            h2,
            g,
            u,
            act,
            y,
        })
    }

    /// Layer lw.l's backward for the gradient dy (B, T, H) of its output at input x (B, T, H):
    /// (dx, the gradient of each of its weights by HF key, in the master dtype). The same
    /// function as `layer(l, x, ..., Some(Mask::Ranges(ranges)), None, true)` differentiated by
    /// autograd, to float rounding.
    pub(crate) fn layer_grad(
        &self,
        lw: &LayerWeights,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        ranges: &KeyRanges,
        dy: &Tensor,
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let s = self.layer_forward(lw, x, cos, sin, ranges)?;
        self.layer_grad_saved(lw, &s, cos, sin, ranges, dy)
    }

    /// `layer_grad` from the state `layer_forward` kept: a layer the checkpointed step did not
    /// drop (`ForwardOptions::keep_layers`) is differentiated without its recompute.
    pub(crate) fn layer_grad_saved(
        &self,
        lw: &LayerWeights,
        s: &Saved,
        cos: &Tensor,
        sin: &Tensor,
        ranges: &KeyRanges,
        dy: &Tensor,
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let c = &self.config;
        let p = format!("model.layers.{}", lw.l);
        let (b, t, hid) = s.x.dims3()?;
        let n = b * t;
        let (hq, hkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps as f32;

        // The adjoints, from the output back.
        let dev = s.x.device();
        let dy = dy.to_dtype(s.x.dtype())?.reshape((n, hid))?; // (N, H)
        let mut grads = Vec::with_capacity(14);
        let mut put = |name: &str, g: Tensor| -> Result<()> {
            let key = format!("{p}.{name}");
            let master = match self.vars.get(&key) {
                Some(v) => v.dtype(),
                None => crate::fail!("internal: weight `{key}` missing"),
            };
            grads.push((key, span(dev, C::Cast, || g.to_dtype(master))?));
            Ok(())
        };
        let (dact, dwd) = linear_grad(&s.act, &lw.wd, &dy)?;
        put("mlp.down_proj.weight", dwd)?;
        let (dg, du) = span(dev, C::Elementwise, || {
            fused::swiglu_grad(&s.g, &s.u, &dact)
        })?; // (N, I) each
        let (dh2g, dwg) = linear_grad(&s.h2, &lw.wg, &dg)?;
        let (dh2u, dwu) = linear_grad(&s.h2, &lw.wu, &du)?;
        put("mlp.gate_proj.weight", dwg)?;
        put("mlp.up_proj.weight", dwu)?;
        // The residual passes dy to x1 too: added inside the norm's backward.
        let dh2 = span(dev, C::Elementwise, || dh2g + dh2u)?; // (N, H)
        let (dx1, dwn2) = span(dev, C::Norm, || {
            fused::rms_norm_grad(&s.x1, &lw.wn2, &dh2, eps, Some(&dy))
        })?; // (N, H)
        put("post_attention_layernorm.weight", dwn2)?;
        let (da, dwo) = linear_grad(&s.a, &lw.wo, &dx1)?;
        put("self_attn.o_proj.weight", dwo)?;
        let do_ = da.reshape((b, t, hq, hd))?; // (B, T, Hq, D)
        let out = s.a.reshape((b, t, hq, hd))?; // (B, T, Hq, D)
        let (dqr, dkr, dv) = span(dev, C::FlashBackward, || {
            fused::flash::attention_rows_grad(&s.qr, &s.kr, &s.v, ranges, (&out, &s.lse), &do_)
        })?;
        let unrot = |d: &Tensor, h: usize| {
            span(dev, C::Rope, || {
                fused::rope_laid_out(d, cos, sin, true, [true; 2])
            })?
            .reshape((n, h * hd))
        };
        let (dqn, dkn) = (unrot(&dqr, hq)?, unrot(&dkr, hkv)?); // (N, Hq*D), (N, Hkv*D)
        let dv = dv.reshape((n, hkv * hd))?; // (N, Hkv*D)
        let (dq, dk) = match &lw.norms {
            Some([a, bn]) => {
                let (sq, gq) = (s.q.reshape((n, hq, hd))?, dqn.reshape((n, hq, hd))?); // (N, Hq, D)
                let (sk, gk) = (s.k.reshape((n, hkv, hd))?, dkn.reshape((n, hkv, hd))?); // (N, Hkv, D)
                let (dq, dqw) = span(dev, C::Norm, || {
                    fused::rms_norm_grad(&sq, a, &gq, eps, None)
                })?;
                let (dk, dkw) = span(dev, C::Norm, || {
                    fused::rms_norm_grad(&sk, bn, &gk, eps, None)
                })?;
                put("self_attn.q_norm.weight", dqw)?;
                put("self_attn.k_norm.weight", dkw)?;
                (dq.reshape((n, hq * hd))?, dk.reshape((n, hkv * hd))?)
            }
            None => (dqn, dkn),
        };
        if lw.bias.is_some() {
            put("self_attn.q_proj.bias", dq.sum(0)?)?;
            put("self_attn.k_proj.bias", dk.sum(0)?)?;
            put("self_attn.v_proj.bias", dv.sum(0)?)?;
        }
        let (dhq, dwq) = linear_grad(&s.h, &lw.wq, &dq)?;
        let (dhk, dwk) = linear_grad(&s.h, &lw.wk, &dk)?;
        let (dhv, dwv) = linear_grad(&s.h, &lw.wv, &dv)?;
        put("self_attn.q_proj.weight", dwq)?;
        put("self_attn.k_proj.weight", dwk)?;
        put("self_attn.v_proj.weight", dwv)?;
        let dh = span(dev, C::Elementwise, || (dhq + dhk)? + dhv)?.reshape((b, t, hid))?; // (B, T, H)
        let dx1 = dx1.reshape((b, t, hid))?; // (B, T, H)
        let (dx, dwn1) = span(dev, C::Norm, || {
            fused::rms_norm_grad(&s.x, &lw.wn1, &dh, eps, Some(&dx1))
        })?; // (B, T, H)
        put("input_layernorm.weight", dwn1)?;
        Ok((dx, grads))
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::flash::KeyRanges;
    use crate::{Config, Qwen3};
    use candle_core::{DType, Device, Tensor, Var};

    /// Max |a - b| over max |b|.
    fn rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).and_then(|d| d.abs()).and_then(|d| d.max_all());
        let s = b.abs().and_then(|s| s.max_all());
        let f =
            |t: candle_core::Result<Tensor>| t.and_then(|t| t.to_scalar::<f32>()).expect("scalar");
        f(d) / f(s).max(1e-12)
    }

    /// The written-out backward equals autograd through `layer` (the surrogate sum(y * dy)):
    /// the input's gradient and every weight's, on a packed batch of two sequences, for the
    /// testbed's shape, a Qwen3-0.6B slice and the slice as Qwen2 (biases, no q/k norms).
    #[test]
    fn the_written_backward_equals_autograd_through_the_layer() {
        let dev = Device::Cpu;
        let slice = Config::synthetic(96, 256, 384, 2, 16, 8, 128, false).expect("config");
        let shapes = [
            Config::synthetic(64, 64, 128, 2, 4, 2, 16, true).expect("config"),
            slice.clone(),
            slice.as_qwen2().expect("qwen2"),
        ];
        for (i, cfg) in shapes.into_iter().enumerate() {
            let m = Qwen3::random(cfg.clone(), 7 + i as u64, &dev, DType::F32).expect("model");
            let (b, t, hid) = (1, 11, cfg.hidden_size);
            let ranges = KeyRanges::packed(&[7, 4], t, &dev).expect("ranges");
            let pos: Vec<u32> = (0..7).chain(0..4).collect();
            let pos = Tensor::from_vec(pos, (b, t), &dev).expect("pos");
            let (cos, sin) =
                crate::ops::rope_tables(&pos, cfg.head_dim, cfg.rope_theta, DType::F32)
                    .expect("tables");
            let x = Tensor::randn(0f32, 1.0, (b, t, hid), &dev).expect("x");
            let dy = Tensor::randn(0f32, 1.0, (b, t, hid), &dev).expect("dy");

            let leaf = Var::from_tensor(&x).expect("leaf");
            let mask = super::super::forward::Mask::Ranges(&ranges);
            let y = m
                .layer(1, leaf.as_tensor(), &cos, &sin, Some(mask), None, true)
                .expect("layer");
            let y_ref = y.detach();
            let store = (y * &dy)
                .and_then(|s| s.sum_all())
                .expect("surrogate")
                .backward()
                .expect("backward");
            let lw = m.layer_weights(1).expect("weights");
            let y_written = m
                .layer_forward(&lw, &x, &cos, &sin, &ranges)
                .expect("forward")
                .y;
            assert!(rel(&y_written, &y_ref) < 1e-6, "shape {i}: the forward");
            let (dx, grads) = m
                .layer_grad(&lw, &x, &cos, &sin, &ranges, &dy)
                .expect("layer_grad");
            let e = rel(&dx, store.get(leaf.as_tensor()).expect("dx"));
            assert!(e < 1e-5, "shape {i}: dx {e}");
            let mut keys = vec![];
            for (k, g) in &grads {
                let want = store.get(m.vars()[k].as_tensor()).expect(k);
                let e = rel(g, want);
                assert!(e < 1e-5, "shape {i}: {k} {e}");
                keys.push(k.clone());
            }
            // Every weight of layer 1 has its gradient, once.
            let mut want: Vec<String> = m
                .vars()
                .keys()
                .filter(|k| k.starts_with("model.layers.1."))
                .cloned()
                .collect();
            keys.sort();
            want.sort();
            assert_eq!(keys, want, "shape {i}");
        }
    }

    /// A profile of the written layer backward sees every category of its ops (issue 57's
    /// `profile` step reads the same spans from CUDA events), and its recompute's casts of
    /// the layer's weights; off, the same call records nothing.
    #[test]
    fn a_profile_sees_each_category_of_the_written_layer() {
        use crate::profile::{finish, start, Category as C};
        let dev = Device::Cpu;
        let cfg = Config::synthetic(64, 64, 128, 2, 4, 2, 16, true).expect("config");
        let m = Qwen3::random(cfg.clone(), 3, &dev, DType::F32).expect("model");
        let t = 9;
        let ranges = KeyRanges::packed(&[5, 4], t, &dev).expect("ranges");
        let pos: Vec<u32> = (0..5).chain(0..4).collect();
        let pos = Tensor::from_vec(pos, (1, t), &dev).expect("pos");
        let (cos, sin) = crate::ops::rope_tables(&pos, cfg.head_dim, cfg.rope_theta, DType::F32)
            .expect("tables");
        let x = Tensor::randn(0f32, 1.0, (1, t, cfg.hidden_size), &dev).expect("x");
        let run = || {
            let lw = m.layer_weights(0).expect("weights");
            m.layer_grad(&lw, &x, &cos, &sin, &ranges, &x)
                .expect("layer_grad")
        };
        start();
        run();
        let totals = finish(&dev).expect("finish");
        let spans = |c: C| totals.iter().find(|x| x.category == c).map(|x| x.spans);
        // 7 projections forward and 7 backward; norms: 3 spans forward (q and k norms in one),
        // 4 backward.
        assert_eq!(spans(C::Matmul), Some(14), "{totals:?}");
        assert_eq!(spans(C::FlashForward), Some(1));
        assert_eq!(spans(C::FlashBackward), Some(1));
        assert_eq!(spans(C::Rope), Some(4));
        assert_eq!(spans(C::Norm), Some(7));
        assert!(spans(C::Elementwise).is_some_and(|n| n >= 4), "{totals:?}");
        assert!(spans(C::Cast).is_some_and(|n| n >= 11), "{totals:?}");
        run();
        assert!(finish(&dev).expect("off").is_empty());
    }
}
