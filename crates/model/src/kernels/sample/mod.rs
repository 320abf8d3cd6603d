//! Sampling on the device (kernels/sample.cu), everything about it in one place: the candle op
//! (a row of logits and its uniform in, 16 bytes out: token, both log-probs, entropy), its
//! checks, its CPU reference (the sampler itself, `reference.rs`), its launch description and
//! its CUDA launch.
//!
//! Data flow: the rollout scheduler (terse-rollout) -> [`sample_rows`] -> the reference (CPU)
//! or `sample_f32` (CUDA). The uniforms are drawn by the caller from each sample's own stream,
//! so a sample's draws never depend on the batch.

pub mod reference;

use super::cpu::{f32s, u32s};
use super::op::{apply2, Arg, Kernel};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Result, Shape, Tensor};
pub use reference::{Drawn, Warpers};

/// One token per row of `logits` (B, V) f32 with that row's uniform in [0, 1): on a CUDA device
/// the kernel, elsewhere the reference. Per call: the uniforms go up (8 bytes a row) and the
/// draws come down (16 bytes a row); the logits stay where they are.
pub fn sample_rows(logits: &Tensor, uniforms: &[f64], w: &Warpers) -> Result<Vec<Drawn>> {
    let (n, _) = check::sample(logits.dims(), uniforms, w)?;
    if n == 0 {
        return Ok(vec![]);
    }
    let bits: Vec<u32> = uniforms.iter().flat_map(|&u| uniform_words(u)).collect();
    let up = Tensor::from_vec(bits, (n, 2), logits.device())?;
    let out = sample_packed(logits, &up, w)?; // (B, 4) u32
    Ok(unpack(&out.flatten_all()?.to_vec1::<u32>()?))
}

/// A uniform as the kernel reads it: its f64 bits, low word first.
pub fn uniform_words(u: f64) -> [u32; 2] {
    let b = u.to_bits();
    [b as u32, (b >> 32) as u32]
}

/// The draws of logits (B, V) f32 with uniforms (B, 2) u32 (`uniform_words`), left on the
/// device: (B, 4) u32, a row's token, both log-probs and entropy (`unpack` reads them). What a
/// decode graph captures (paged/graphs.rs): it uploads and downloads nothing.
pub fn sample_packed(logits: &Tensor, uniforms: &Tensor, w: &Warpers) -> Result<Tensor> {
    crate::profile::span(logits.device(), crate::profile::Category::Sample, || {
        apply2(&logits.contiguous()?, uniforms, Sample(*w)) // (B, 4) u32
    })
}

/// `sample_packed`'s rows, read back (4 words a row).
pub fn unpack(words: &[u32]) -> Vec<Drawn> {
    words
        .chunks_exact(4)
        .map(|o| Drawn {
            token: o[0],
            logp_sampled: f32::from_bits(o[1]),
            logp_plain: f32::from_bits(o[2]),
            entropy: f32::from_bits(o[3]),
        })
        .collect()
}

struct Sample(Warpers);

impl Kernel<2> for Sample {
    const NAME: &'static str = "terse-sample";

    fn cpu(&self, [(s1, l1), (s2, l2)]: [Arg<CpuStorage>; 2]) -> Result<(CpuStorage, Shape)> {
        let (n, v) = l1.shape().dims2()?;
        let (x, u) = (f32s(s1, l1, "logits")?, u32s(s2, l2, "uniforms")?);
        let out: Vec<u32> = (0..n)
            .flat_map(|i| {
                let ui = f64::from_bits(u64::from(u[2 * i]) | (u64::from(u[2 * i + 1]) << 32));
                let d = reference::sample_row(&x[i * v..(i + 1) * v], &self.0, ui);
                [
                    d.token,
                    d.logp_sampled.to_bits(),
                    d.logp_plain.to_bits(),
                    d.entropy.to_bits(),
                ]
            })
            .collect();
        Ok((CpuStorage::U32(out), Shape::from((n, 4))))
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, [(s1, l1), (s2, l2)]: [Arg<CudaStorage>; 2]) -> Result<(CudaStorage, Shape)> {
        cuda::sample(s1, l1, s2, l2, &self.0)
    }
}

/// Checks run before every launch, on every device.
pub(crate) mod check {
    use crate::kernels::sample::Warpers;
    use candle_core::Result;

    /// Logits (B, V) with 0 < V < 2^31, one uniform in [0, 1) per row, valid warpers.
    pub fn sample(logits: &[usize], uniforms: &[f64], w: &Warpers) -> Result<(usize, usize)> {
        let &[n, v] = logits else {
            crate::fail!("sample: logits must be (B, V), got {logits:?}");
        };
        if uniforms.len() != n {
            crate::fail!("sample: {} uniforms for {n} rows of logits", uniforms.len());
        }
        if v == 0 || v > i32::MAX as usize {
            crate::fail!("sample: a vocabulary of {v} (1 to 2^31 - 1)");
        }
        if let Some((i, u)) = uniforms
            .iter()
            .enumerate()
            .find(|(_, u)| !(0.0..1.0).contains(*u))
        {
            crate::fail!("sample: uniform {u} of row {i} is outside [0, 1)");
        }
        let valid = w.temperature >= 0.0
            && w.temperature.is_finite()
            && w.top_p > 0.0
            && w.top_p <= 1.0
            && (0.0..=1.0).contains(&w.min_p);
        if !valid {
            crate::fail!("sample: warpers out of range: {w:?}");
        }
        Ok((n, v))
    }
}

/// The launch description (kernel name, grid, block, arguments in order): the CUDA launch below
/// pushes exactly these, and crates/simt runs them on the CPU.
pub mod launch {
    use crate::kernels::describe::{bufs, per_row, Arg, Launch};
    use crate::kernels::geometry::SAMPLE_BLOCK;
    use crate::kernels::sample::Warpers;

    /// Buffers: logits (n, v) f32, uniforms (n, 2) u32 (each row's f64 as low, high bits), out
    /// (n, 4) u32. Scalars: v, top-k (capped at v: k >= v keeps every token), then temperature,
    /// top-p and min-p as f64 bits.
    pub fn sample(n: usize, v: usize, w: &Warpers) -> Launch {
        let args = bufs(3)
            .chain([
                Arg::I32(v as i32),
                Arg::I32(w.top_k.min(v) as i32),
                Arg::U64(w.temperature.to_bits()),
                Arg::U64(w.top_p.to_bits()),
                Arg::U64(w.min_p.to_bits()),
            ])
            .collect();
        per_row("sample_f32".into(), "sample", n, SAMPLE_BLOCK, args)
    }
}

/// The CUDA launch (the `cuda` feature only), through its launch description.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // a kernel launch and an uninitialised device buffer the kernel fills
mod cuda {
    use crate::kernels::launching::{func, view, Described};
    use crate::kernels::sample::{launch, Warpers};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape};

    pub fn sample(
        l: &CudaStorage,
        ll: &Layout,
        u: &CudaStorage,
        lu: &Layout,
        w: &Warpers,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = l.device();
        let (n, v) = ll.shape().dims2()?;
        let lau = launch::sample(n, v, w);
        let f = func!(dev, lau)?;
        let (lv, uv) = (
            view::<f32>(l, ll, "logits")?,
            view::<u32>(u, lu, "uniforms")?,
        );
        // SAFETY: thread 0 of every row's block writes its four words.
        let mut out = unsafe { dev.alloc::<u32>(n * 4)? };
        let mut d = Described::new(f.builder(), &lau);
        d.buf(0, &lv)?.buf(1, &uv)?.buf(2, &mut out)?;
        // SAFETY: logits hold n x v elements, uniforms n x 2, out n x 4.
        unsafe { d.launch() }?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((n, 4)),
        ))
    }
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
