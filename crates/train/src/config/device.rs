//! `run.device` and `run.compute` read together: where the run's tensors live and the dtype its
//! forward computes in. Every part of a run (SFT, GRPO, ranks, eval) asks here, so the two keys
//! have one reader.

use super::{Compute, RunSection};
use anyhow::{bail, Result};
use candle_core::{DType, Device};

impl RunSection {
    /// The device and the forward's dtype: `device`'s default dtype (bf16 on CUDA, f32 on the
    /// CPU) unless `compute` sets one; bf16 compute on the CPU is refused.
    pub fn device_and_dtype(&self) -> Result<(Device, DType)> {
        let (dev, default) = terse_model::device::select(&self.device)?;
        Ok(match self.compute {
            Compute::Auto => (dev, default),
            Compute::F32 => (dev, DType::F32),
            Compute::Bf16 if dev.is_cuda() => (dev, DType::BF16),
            Compute::Bf16 => bail!(
                "run.compute = \"bf16\" needs a CUDA device (run.device = \"{}\")",
                self.device
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_overrides_the_device_default() {
        let mut run = RunSection::default();
        assert_eq!(run.device_and_dtype().expect("cpu").1, DType::F32);
        run.compute = Compute::F32;
        assert_eq!(run.device_and_dtype().expect("cpu f32").1, DType::F32);
        run.compute = Compute::Bf16;
        let e = run
            .device_and_dtype()
            .expect_err("bf16 on the cpu")
            .to_string();
        assert!(e.contains("run.compute") && e.contains("cpu"), "{e}");
    }
}
