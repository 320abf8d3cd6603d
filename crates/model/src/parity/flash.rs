//! Parity of flash attention: forward and backward on the device against the CPU
//! implementation, with left and right padding and packed boundaries; and the written layer
//! backward's attention in the projections' rows (kernels/flash/rows.rs: in bf16 on CUDA its
//! own kernels, delta computed inside) against the same CPU implementation.

use super::common::{bf16_round, bf16_tolerance, grad, rnd, row, Row};
use candle_core::{DType, Device, Result, Tensor, Var};

/// Flash attention on `dev` in `dt` against the CPU implementation in f32 on the same (rounded)
/// inputs: out, dq, dk, dv for GQA 4 with left padding in row 0 and packed-like short rows.
/// The masks the model makes: left padding (17 rows of row 0 attend nothing), right padding
/// (row 1 ends after 101 tokens), and one packed row whose sequences end inside a 64-key tile
/// (at 37), exactly on its edge (64), after one token (65), and at T.
#[derive(Debug, Clone, Copy)]
enum Mask {
    Left,
    Right,
    Packed,
}

impl Mask {
    fn rows(self) -> usize {
        match self {
            Mask::Packed => 1,
            _ => 2,
        }
    }

    fn ranges(self, t: usize, on: &Device) -> Result<crate::kernels::flash::KeyRanges> {
        let mut mask = vec![1u8; 2 * t];
        match self {
            Mask::Left => mask[..17].fill(0),
            Mask::Right => mask[t + 101..].fill(0),
            Mask::Packed => {
                return crate::kernels::flash::KeyRanges::packed(&[37, 27, 1, t - 65], t, on)
            }
        }
        match crate::kernels::flash::KeyRanges::from_mask(&mask, 2, t, on)? {
            Some(r) => Ok(r),
            None => candle_core::bail!("parity: flash mask not contiguous"),
        }
    }
}

/// x rounded to bf16 values when the device side runs in bf16 (the reference then sees the
/// same inputs).
fn rounded(x: Tensor, dt: DType) -> Result<Tensor> {
    match dt {
        DType::BF16 => bf16_round(&x),
        _ => Ok(x),
    }
}

fn flash(dev: &Device, dt: DType, kind: Mask) -> Result<Vec<Row>> {
    let (b, hq, hkv, t, d) = (kind.rows(), 8, 2, 150, 128);
    let round = |x: Tensor| rounded(x, dt);
    let q = round(rnd(&[b, hq, t, d], 1)?)?;
    let k = round(rnd(&[b, hkv, t, d], 2)?)?;
    let v = round(rnd(&[b, hkv, t, d], 3)?)?;
    let g = round(rnd(&[b, hq, t, d], 4)?)?;
    let run = |on: &Device, dt: DType| -> Result<Vec<Tensor>> {
        let vars = [&q, &k, &v]
            .iter()
            .map(|x| Var::from_tensor(&x.to_device(on)?.to_dtype(dt)?))
            .collect::<Result<Vec<_>>>()?;
        let ranges = kind.ranges(t, on)?;
        let out = crate::kernels::flash::attention(
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
            &ranges,
        )?;
        let gs = (out.to_dtype(DType::F32)? * g.to_device(on)?)?
            .sum_all()?
            .backward()?;
        let mut res = vec![out.to_dtype(DType::F32)?];
        for (x, name) in vars.iter().zip(["dq", "dk", "dv"]) {
            res.push(grad(&gs, x, name)?.to_dtype(DType::F32)?);
        }
        Ok(res)
    };
    let (got, want) = (run(dev, dt)?, run(&Device::Cpu, DType::F32)?);
    compared("flash attention", dt, kind, &got, &want)
}

/// The rows `{what} {out,dq,dk,dv} {dtype} ({kind})`: bf16's tolerance of the CPU side in bf16,
/// 1e-4 in f32. Padding rows (17 of row 0 with left padding) are don't-cares in the output and
/// dq: both paths give 0.
fn compared(
    what: &str,
    dt: DType,
    kind: Mask,
    got: &[Tensor],
    want: &[Tensor],
) -> Result<Vec<Row>> {
    let sfx = if dt == DType::BF16 { "bf16" } else { "f32" };
    ["out", "dq", "dk", "dv"]
        .iter()
        .zip(got.iter().zip(want))
        .map(|(name, (a, c))| {
            let tol = match dt {
                DType::BF16 => bf16_tolerance(c)?,
                _ => 1e-4,
            };
            row(&format!("{what} {name} {sfx} ({kind:?})"), a, c, tol)
        })
        .collect()
}

/// `attention_rows` and `attention_rows_grad` on `dev` in `dt` against the CPU in f32 on the
/// same rounded inputs, laid out (B, T, H, D): out, dq, dk, dv (bf16 results on CUDA, so the
/// tolerance is bf16's of the reference).
fn flash_rows(dev: &Device, dt: DType, kind: Mask) -> Result<Vec<Row>> {
    let (b, hq, hkv, t, d) = (kind.rows(), 8, 2, 150, 128);
    let round = |x: Tensor| rounded(x, dt);
    let q = round(rnd(&[b, t, hq, d], 11)?)?;
    let k = round(rnd(&[b, t, hkv, d], 12)?)?;
    let v = round(rnd(&[b, t, hkv, d], 13)?)?;
    let g = round(rnd(&[b, t, hq, d], 14)?)?;
    let run = |on: &Device, dt: DType| -> Result<Vec<Tensor>> {
        let put = |x: &Tensor| x.to_device(on)?.to_dtype(dt);
        let (q, k, v, g) = (put(&q)?, put(&k)?, put(&v)?, put(&g)?);
        let ranges = kind.ranges(t, on)?;
        let (out, lse) = crate::kernels::flash::attention_rows(&q, &k, &v, &ranges)?;
        let (dq, dk, dv) =
            crate::kernels::flash::attention_rows_grad(&q, &k, &v, &ranges, (&out, &lse), &g)?;
        [out, dq, dk, dv]
            .iter()
            .map(|x| x.to_dtype(DType::F32))
            .collect()
    };
    let (got, want) = (run(dev, dt)?, run(&Device::Cpu, DType::F32)?);
    compared("flash attention rows", dt, kind, &got, &want)
}

/// Every mask kind in `dt`, in attention's layout and in the rows.
fn flash_all(dev: &Device, dt: DType) -> Result<Vec<Row>> {
    let mut rows = vec![];
    for kind in [Mask::Left, Mask::Right, Mask::Packed] {
        rows.extend(flash(dev, dt, kind)?);
    }
    for kind in [Mask::Left, Mask::Packed] {
        rows.extend(flash_rows(dev, dt, kind)?);
    }
    Ok(rows)
}

pub(super) fn flash_f32(dev: &Device) -> Result<Vec<Row>> {
    flash_all(dev, DType::F32)
}

pub(super) fn flash_bf16(dev: &Device) -> Result<Vec<Row>> {
    // The CPU implementation is f32 only; on the CPU this group compares f32 with itself.
    flash_all(
        dev,
        if dev.is_cuda() {
            DType::BF16
        } else {
            DType::F32
        },
    )
}
