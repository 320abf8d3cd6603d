//! A decoding copy's stacked projections: each layer's q, k and v weights as one (Hq + 2 Hkv)
//! D x hidden matrix (and, for Qwen2, one bias), and its gate and up weights as one 2I x
//! hidden matrix, so that a decode step runs one GEMM where it ran three and one where it ran
//! two (each a node of the captured step, and each a read of the same input rows). Made once per
//! decoding copy on CUDA (`Qwen3::with_decoding_weights`), in place of the separate weights,
//! so that the copy's memory does not grow; the CPU and training keep the separate weights.
//!
//! Data flow: adapters.rs's `with_decoding_weights` -> `stack_projections` -> the copy's
//! variables under `STACKED_QKV` / `STACKED_GATE_UP` names -> model/forward.rs's `projections`
//! and `mlp_block`.

use super::Qwen3;
use crate::profile::{span, Category as C};
use candle_core::{Result, Tensor, Var};

/// The stacked q/k/v weight's name under a layer's prefix (bias: `.bias` in place of `.weight`).
pub(crate) const STACKED_QKV: &str = "self_attn.qkv_proj";
/// The stacked gate/up weight's name under a layer's prefix.
pub(crate) const STACKED_GATE_UP: &str = "mlp.gate_up_proj.weight";

/// A layer's attention projections of its normalised input: the stacked one's (B, T, (Hq + 2
/// Hkv) D), or the three (B, T, H D).
pub(crate) enum Projected {
    Stacked(Tensor),
    Split(Tensor, Tensor, Tensor),
}

impl Projected {
    /// As one (B, T, (Hq + 2 Hkv) D) tensor: the stacked GEMM's output, or the three joined.
    pub(crate) fn stacked(self) -> Result<Tensor> {
        match self {
            Projected::Stacked(qkv) => Ok(qkv),
            Projected::Split(q, k, v) => Tensor::cat(&[q, k, v], 2),
        }
    }

    /// As q (B, T, Hq, D), k and v (B, T, Hkv, D).
    pub(crate) fn split(self, [hq, hkv, d]: [usize; 3]) -> Result<(Tensor, Tensor, Tensor)> {
        let (q, k, v) = match self {
            Projected::Split(q, k, v) => (q, k, v),
            Projected::Stacked(qkv) => (
                qkv.narrow(2, 0, hq * d)?,
                qkv.narrow(2, hq * d, hkv * d)?,
                qkv.narrow(2, (hq + hkv) * d, hkv * d)?,
            ),
        };
        let (b, t, _) = q.dims3()?;
        Ok((
            q.reshape((b, t, hq, d))?,
            k.reshape((b, t, hkv, d))?,
            v.reshape((b, t, hkv, d))?,
        ))
    }
}

impl Qwen3 {
    /// Replaces each layer's q/k/v (weights and Qwen2's biases) and gate/up weights by their
    /// stacked matrices, on CUDA with the fused kernels on (`TERSE_FUSED` unset or 1); elsewhere
    /// nothing changes. For a decoding copy only: the stacked names are not HF's, so the copy is
    /// neither trained nor saved.
    pub(crate) fn stack_projections(&mut self) -> Result<()> {
        if !(self.device.is_cuda() && crate::device::fused()) {
            return Ok(());
        }
        self.stack_all()
    }

    /// `stack_projections` on any device (the CPU's tests of the stacked path).
    pub(crate) fn stack_all(&mut self) -> Result<()> {
        if self.lora.is_some() {
            crate::fail!("internal: a model with adapters is not a decoding copy to stack");
        }
        for l in 0..self.config.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut parts = vec![(
                format!("{p}.{STACKED_QKV}.weight"),
                ["q_proj", "k_proj", "v_proj"].map(|n| format!("{p}.self_attn.{n}.weight")),
            )];
            if self.config.qkv_bias {
                parts.push((
                    format!("{p}.{STACKED_QKV}.bias"),
                    ["q_proj", "k_proj", "v_proj"].map(|n| format!("{p}.self_attn.{n}.bias")),
                ));
            }
            for (to, from) in parts {
                self.stack(&to, &from)?;
            }
            let from = ["gate_proj", "up_proj"].map(|n| format!("{p}.mlp.{n}.weight"));
            self.stack(&format!("{p}.{STACKED_GATE_UP}"), &from)?;
        }
        Ok(())
    }

    /// `to` = the variables `from` joined along their first dimension; `from` removed.
    fn stack(&mut self, to: &str, from: &[String]) -> Result<()> {
        let mut parts = vec![];
        for name in from {
            match self.vars.remove(name) {
                Some(v) => parts.push(v.as_tensor().detach()),
                None => crate::fail!("internal: weight `{name}` missing to stack"),
            }
        }
        let joined = Tensor::cat(&parts, 0)?; // (sum of Out, In) or (sum of Out)
        self.vars.insert(to.to_string(), Var::from_tensor(&joined)?);
        Ok(())
    }

    /// Layer `p`'s attention projections of `h` (B, T, hidden): one GEMM (and one bias add)
    /// over the stacked weight where this copy has it, else three.
    pub(crate) fn projections(&self, p: &str, h: &Tensor, train: bool) -> Result<Projected> {
        let name = format!("{p}.{STACKED_QKV}");
        if !self.vars.contains_key(&format!("{name}.weight")) {
            let proj = |n: &str| self.qkv_proj(h, &format!("{p}.self_attn.{n}"), train);
            return Ok(Projected::Split(
                proj("q_proj")?,
                proj("k_proj")?,
                proj("v_proj")?,
            ));
        }
        Ok(Projected::Stacked(self.qkv_proj(h, &name, train)?))
    }

    /// Layer `p`'s SwiGLU of `h` (B, T, hidden) -> (B, T, I): over the stacked gate/up weight
    /// where this copy has it (one GEMM, then `swiglu_stacked` on CUDA), else `None`.
    pub(crate) fn stacked_swiglu(
        &self,
        p: &str,
        h: &Tensor,
        train: bool,
    ) -> Result<Option<Tensor>> {
        let name = format!("{p}.{STACKED_GATE_UP}");
        if !self.vars.contains_key(&name) {
            return Ok(None);
        }
        let gu = self.linear(h, &name, train)?; // (B, T, 2I)
        let act = span(&self.device, C::Elementwise, || {
            if gu.device().is_cuda() {
                crate::kernels::swiglu_stacked(&gu)
            } else {
                let i = gu.dim(2)? / 2;
                gu.narrow(2, 0, i)?.silu()? * gu.narrow(2, i, i)?
            }
        })?;
        Ok(Some(act))
    }
}
