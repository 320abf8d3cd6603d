//! Parity of the multi-tensor AdamW (kernels/adamw.cu, through `adamw::step`): three steps of
//! one launch over tensors of 1 element, fewer than a block, several chunks and one past a
//! chunk, on the device against the same steps on the CPU (the reference), in f32 parameters
//! and in bf16 ones with f32 masters; and clipping's sum of squares over those tensors.
//! Tolerance 0: both are bit-identical by design.

use super::common::{rnd, row, Row};
use crate::kernels::adamw::{step, step_scalars, Scalars, Slot};
use candle_core::{DType, Device, Result, Tensor};

const SHAPES: [&[usize]; 4] = [&[1], &[200], &[64, 70], &[2, 4097]];

/// One parameter's tensors on a device: param, master (bf16 only), exp_avg, exp_avg_sq.
type State = (Tensor, Option<Tensor>, Tensor, Tensor);

/// Three steps on `dev` with parameters in `dt`; the final tensors on the CPU.
fn run(dev: &Device, dt: DType) -> Result<Vec<State>> {
    let (lr, b1, b2) = (3e-3, 0.9, 0.999);
    let h = Scalars::new(lr, b1, b2, 1e-8, 0.01);
    let mut state: Vec<State> = vec![];
    for (i, shape) in SHAPES.iter().enumerate() {
        let w = rnd(shape, 10 + i as u64)?.to_device(dev)?;
        let zeros = || Tensor::zeros(*shape, DType::F32, dev);
        let master = (dt == DType::BF16).then(|| w.copy()).transpose()?;
        state.push((w.to_dtype(dt)?.copy()?, master, zeros()?, zeros()?));
    }
    for s in 1..=3u64 {
        let grads = SHAPES
            .iter()
            .enumerate()
            .map(|(i, shape)| rnd(shape, 100 * s + i as u64)?.to_dtype(dt)?.to_device(dev))
            .collect::<Result<Vec<_>>>()?;
        let slots: Vec<Slot> = state
            .iter()
            .zip(&grads)
            .map(|((p, master, m, v), g)| Slot {
                name: "parity",
                param: p,
                master: master.as_ref(),
                exp_avg: m,
                exp_avg_sq: v,
                grad: g,
                scalars: step_scalars(lr, b1, b2, s),
            })
            .collect();
        step(&slots, &h)?;
    }
    state
        .into_iter()
        .map(|(p, master, m, v)| {
            let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
            Ok((
                cpu(&p)?,
                master.as_ref().map(cpu).transpose()?,
                cpu(&m)?,
                cpu(&v)?,
            ))
        })
        .collect()
}

fn rows(dev: &Device, dt: DType, tag: &str) -> Result<Vec<Row>> {
    let (d, c) = (run(dev, dt)?, run(&Device::Cpu, dt)?);
    let mut out = vec![];
    for (shape, (d, c)) in SHAPES.iter().zip(d.iter().zip(&c)) {
        out.push(row(
            &format!("adamw {tag} {shape:?} param"),
            &d.0,
            &c.0,
            0.0,
        )?);
        out.push(row(
            &format!("adamw {tag} {shape:?} exp_avg"),
            &d.2,
            &c.2,
            0.0,
        )?);
        out.push(row(
            &format!("adamw {tag} {shape:?} exp_avg_sq"),
            &d.3,
            &c.3,
            0.0,
        )?);
        if let (Some(dm), Some(cm)) = (&d.1, &c.1) {
            out.push(row(&format!("adamw {tag} {shape:?} master"), dm, cm, 0.0)?);
        }
    }
    if dt == DType::F32 {
        out.push(sumsq_row(dev)?);
    }
    Ok(out)
}

/// Clipping's sum of squares (`grad_sumsq`) over the shapes' tensors in one launch, on the
/// device and on the CPU (the reference's order): tolerance 0.
fn sumsq_row(dev: &Device) -> Result<Row> {
    let sum = |on: &Device| -> Result<f64> {
        let grads = SHAPES
            .iter()
            .enumerate()
            .map(|(i, shape)| rnd(shape, 700 + i as u64)?.to_device(on))
            .collect::<Result<Vec<_>>>()?;
        crate::kernels::adamw::grad_sumsq(&grads.iter().collect::<Vec<_>>())
    };
    Ok(Row {
        name: "grad_sumsq f32 (clipping)".into(),
        max_diff: (sum(dev)? - sum(&Device::Cpu)?).abs(),
        tolerance: 0.0,
    })
}

/// f32 parameters (their own masters).
pub(super) fn adamw_f32(dev: &Device) -> Result<Vec<Row>> {
    rows(dev, DType::F32, "f32")
}

/// bf16 parameters with f32 masters.
pub(super) fn adamw_bf16(dev: &Device) -> Result<Vec<Row>> {
    rows(dev, DType::BF16, "bf16")
}
