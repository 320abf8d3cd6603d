//! What every parity group shares: the row a comparison makes (`Row`, `row`, NaN fails it),
//! the max difference between a device tensor and a CPU one, seeded random inputs, the bf16
//! rounding and tolerance, and the device side's dtype.

use candle_core::{DType, Device, Result, Tensor, Var};

/// One comparison: NaN anywhere fails it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub max_diff: f64,
    pub tolerance: f64,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.max_diff <= self.tolerance
    }
}

/// A named group of rows, run on one device.
pub type Group = (&'static str, fn(&Device) -> Result<Vec<Row>>);

/// Max |a − b| between a tensor computed on the device and on the CPU; NaN if either holds one.
pub fn diff(gpu: &Tensor, cpu: &Tensor) -> Result<f64> {
    let g = gpu.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let c = cpu.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let d = (g - c)?.abs()?.flatten_all()?.to_vec1::<f32>()?;
    Ok(d.iter().fold(0.0f64, |m, x| {
        if x.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(f64::from(*x))
        }
    }))
}

pub(crate) fn row(name: &str, g: &Tensor, c: &Tensor, tolerance: f64) -> Result<Row> {
    Ok(Row {
        name: name.to_string(),
        max_diff: diff(g, c)?,
        tolerance,
    })
}

/// Deterministic values in [−1, 1).
pub(crate) fn rnd(shape: &[usize], seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n as u64)
        .map(|i| (((i * 2654435761 + seed * 97) % 1000) as f32 / 500.0) - 1.0)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// bf16 rounding, back in f32: what the bf16 kernels read.
pub(crate) fn bf16_round(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
}

/// The tolerance of a bf16 output against the f32 reference on the same rounded inputs: the
/// output's own rounding (2^-8 relative) plus accumulation order, as 2^-7 of the largest
/// magnitude (tested on the CPU in kernels/ops_tests.rs).
pub fn bf16_tolerance(reference: &Tensor) -> Result<f64> {
    let m = reference
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F32)?
        .to_scalar::<f32>()?;
    Ok(f64::from(m.max(1.0)) / 128.0)
}

/// The side that runs on `dev`: in bf16 on a GPU, in f32 on the CPU (whose references are f32).
pub(crate) fn on_dev(t: &Tensor, dev: &Device) -> Result<Tensor> {
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    t.to_device(dev)?.to_dtype(dt)
}

pub(crate) fn grad(g: &candle_core::backprop::GradStore, v: &Var, what: &str) -> Result<Tensor> {
    g.get(v)
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg(format!("parity: no gradient for {what}")))
}
