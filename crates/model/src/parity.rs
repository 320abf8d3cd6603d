//! GPU parity, in groups of rows (name, max |difference|, tolerance): each fused op (fused.rs)
//! on a device against its CPU reference (kernels.rs), forward and backward, in f32 and in bf16
//! (the dtype the model computes in on CUDA: inputs rounded to bf16, the reference run in f32
//! on the rounded values); a small random Qwen3 decoding 16 steps through the kernels against
//! the composite path on the same device; and the training path's log-probs and gradients in
//! bf16 against f32; flash attention forward and backward against its CPU implementation.
//! `cargo xtask gpu-check` runs the groups one at a time (a failing row is recorded and the
//! check goes on, xtask/src/gpu_plan.rs); the `cuda` integration test runs them all.
//! On the CPU every group runs too, its "device" side on the CPU, so the code stays exercised.

use crate::fused;
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

/// Every group, in the order gpu-check runs them: first what a training run executes (bf16
/// flash attention, the paged rollout, a whole model decoding and training), then the rest.
pub fn groups() -> Vec<Group> {
    vec![
        ("flash attention bf16", flash_bf16),
        ("paged attention bf16", super::parity_paged::paged_bf16),
        ("model decode bf16", model_decode),
        ("model training bf16 vs f32", model_training),
        ("kv cache bf16", kv_cache_bf16),
        ("rmsnorm bf16", rmsnorm_bf16),
        ("rope bf16", rope_bf16),
        ("flash attention f32", flash_f32),
        ("paged attention f32", super::parity_paged::paged_f32),
        ("kv cache f32", kv_cache_f32),
        ("rmsnorm f32", rmsnorm_f32),
        ("rope f32", rope_f32),
        ("logprob f32", logprob_f32),
    ]
}

/// Every row of every group (the integration test's view).
pub fn check(dev: &Device) -> Result<Vec<Row>> {
    let mut out = vec![];
    for (_, g) in groups() {
        out.extend(g(dev)?);
    }
    Ok(out)
}

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
/// magnitude (tested on the CPU in fused_tests.rs).
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
fn on_dev(t: &Tensor, dev: &Device) -> Result<Tensor> {
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    t.to_device(dev)?.to_dtype(dt)
}

fn grad(g: &candle_core::backprop::GradStore, v: &Var, what: &str) -> Result<Tensor> {
    g.get(v)
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg(format!("parity: no gradient for {what}")))
}

/// RMSNorm forward and backward (rows 64 x 1024).
fn rmsnorm_f32(dev: &Device) -> Result<Vec<Row>> {
    let (x, w, dy) = (rnd(&[64, 1024], 1)?, rnd(&[1024], 2)?, rnd(&[64, 1024], 3)?);
    let both = |d: &Device| -> Result<(Tensor, Tensor, Tensor)> {
        let (xv, wv) = (
            Var::from_tensor(&x.to_device(d)?)?,
            Var::from_tensor(&w.to_device(d)?)?,
        );
        let y = fused::rms_norm(&xv, &wv, 1e-6)?;
        let g = (&y * dy.to_device(d)?)?.sum_all()?.backward()?;
        Ok((y, grad(&g, &xv, "x")?, grad(&g, &wv, "w")?))
    };
    let (c, g) = (both(&Device::Cpu)?, both(dev)?);
    Ok(vec![
        row("rmsnorm fwd", &g.0, &c.0, 1e-5)?,
        row("rmsnorm bwd dx", &g.1, &c.1, 1e-4)?,
        row("rmsnorm bwd dw", &g.2, &c.2, 1e-3)?,
    ])
}

fn rope_inputs() -> Result<(Tensor, Tensor, Tensor)> {
    let x = rnd(&[2, 8, 64, 128], 4)?;
    let pos = Tensor::arange(0u32, 128, &Device::Cpu)?.reshape((2, 64))?;
    let (c, s) = crate::ops::rope_tables(&pos, 128, 1e6, DType::F32)?;
    Ok((x, c, s))
}

/// RoPE forward and backward (B 2, H 8, T 64, D 128).
fn rope_f32(dev: &Device) -> Result<Vec<Row>> {
    let (x, c, s) = rope_inputs()?;
    let run = |d: &Device| -> Result<(Tensor, Tensor)> {
        let xv = Var::from_tensor(&x.to_device(d)?)?;
        let y = fused::rope(&xv, &c.to_device(d)?, &s.to_device(d)?)?;
        let g = y.sqr()?.sum_all()?.backward()?;
        Ok((y, grad(&g, &xv, "x")?))
    };
    let (rc, rg) = (run(&Device::Cpu)?, run(dev)?);
    Ok(vec![
        row("rope fwd", &rg.0, &rc.0, 1e-5)?,
        row("rope bwd", &rg.1, &rc.1, 1e-4)?,
    ])
}

/// Log-prob epilogue (n 64, V 151936) forward and backward.
fn logprob_f32(dev: &Device) -> Result<Vec<Row>> {
    let cpu = Device::Cpu;
    let v = 151_936;
    let logits = (rnd(&[64, v], 5)? * 8.0)?;
    let targets = Tensor::from_vec(
        (0..64u32).map(|i| i * 2371 % v as u32).collect::<Vec<_>>(),
        64,
        &cpu,
    )?;
    let lg = rnd(&[64, 2], 6)?;
    let st = |d: &Device| fused::logprob_stats(&logits.to_device(d)?, &targets.to_device(d)?);
    let (sc, sg) = (st(&cpu)?, st(dev)?);
    let lse_g = Tensor::cat(&[&sc.narrow(1, 1, 1)?, &lg.narrow(1, 1, 1)?], 1)?;
    let bw = |d: &Device| {
        fused::logprob_grad(
            &logits.to_device(d)?,
            &targets.to_device(d)?,
            &lse_g.to_device(d)?,
        )
    };
    Ok(vec![
        row("logprob fwd [logp, lse, entropy]", &sg, &sc, 1e-3)?,
        row("logprob bwd", &bw(dev)?, &bw(&cpu)?, 1e-5)?,
    ])
}

/// KV-cache writes then decode attention (B 4, Hq 16, Hkv 8, C 256, D 128, 200 slots used, a
/// different run of padding slots per row), with the cache and inputs in `dt` on `dev`.
fn kv_attention(dev: &Device, dt: DType, round: bool) -> Result<Tensor> {
    let (b, hq, hkv, cap, d, len) = (4, 16, 8, 256, 128, 200);
    let prep = |t: Tensor| -> Result<Tensor> {
        let t = if round { bf16_round(&t)? } else { t };
        t.to_device(dev)?.to_dtype(dt)
    };
    let k = Tensor::zeros((b, hkv, cap, d), dt, dev)?;
    let vc = Tensor::zeros((b, hkv, cap, d), dt, dev)?;
    for slot in 0..len {
        fused::kv_write(&k, &prep(rnd(&[b, hkv, d], 10 + slot as u64)?)?, slot)?;
        fused::kv_write(&vc, &prep(rnd(&[b, hkv, d], 900 + slot as u64)?)?, slot)?;
    }
    let valid: Vec<u8> = (0..b * cap)
        .map(|i| u8::from(i % cap >= (i / cap) * 7))
        .collect();
    let valid = Tensor::from_vec(valid, b * cap, dev)?;
    fused::decode_attention(&prep(rnd(&[b, hq, d], 7)?)?, &k, &vc, &valid, len)
}

fn kv_cache_f32(dev: &Device) -> Result<Vec<Row>> {
    let (g, c) = (
        kv_attention(dev, DType::F32, false)?,
        kv_attention(&Device::Cpu, DType::F32, false)?,
    );
    Ok(vec![row("kv write + decode attention", &g, &c, 1e-4)?])
}

/// `kv_write_bf16` + `decode_attention_bf16` against the f32 reference on bf16-rounded inputs.
fn kv_cache_bf16(dev: &Device) -> Result<Vec<Row>> {
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let c = kv_attention(&Device::Cpu, DType::F32, true)?;
    let g = kv_attention(dev, dt, true)?;
    Ok(vec![row(
        "bf16 kv write + decode attention",
        &g,
        &c,
        bf16_tolerance(&c)?,
    )?])
}

/// `rmsnorm_fwd_bf16` against the f32 reference on bf16-rounded inputs.
fn rmsnorm_bf16(dev: &Device) -> Result<Vec<Row>> {
    let (x, w) = (
        bf16_round(&rnd(&[64, 1024], 1)?)?,
        bf16_round(&rnd(&[1024], 2)?)?,
    );
    let c = fused::rms_norm(&x, &w, 1e-6)?;
    let g = fused::rms_norm(&on_dev(&x, dev)?, &on_dev(&w, dev)?, 1e-6)?;
    Ok(vec![row("bf16 rmsnorm fwd", &g, &c, bf16_tolerance(&c)?)?])
}

/// `rope_{fwd,bwd}_bf16` against the f32 reference on bf16-rounded inputs.
fn rope_bf16(dev: &Device) -> Result<Vec<Row>> {
    let (x, c, s) = rope_inputs()?;
    let (x, c, s) = (bf16_round(&x)?, bf16_round(&c)?, bf16_round(&s)?);
    let want = fused::rope(&x, &c, &s)?;
    let (xd, cd, sd) = (on_dev(&x, dev)?, on_dev(&c, dev)?, on_dev(&s, dev)?);
    let got = fused::rope(&xd, &cd, &sd)?;
    // The backward is the inverse rotation: applied to the output it gives x back.
    let xv = Var::from_tensor(&xd)?;
    let y = fused::rope(&xv, &cd, &sd)?;
    let back = grad(&(&y * &got.detach())?.sum_all()?.backward()?, &xv, "x")?;
    let x_back = fused::rope(&want, &c, &s.neg()?)?;
    Ok(vec![
        row("bf16 rope fwd", &got, &want, bf16_tolerance(&want)?)?,
        row(
            "bf16 rope bwd",
            &back,
            &x_back,
            2.0 * bf16_tolerance(&x_back)?,
        )?,
    ])
}

/// A small random Qwen3 with the GPU shapes that matter (head size 128, GQA 2:1).
fn small_config() -> Result<crate::Config> {
    crate::Config::synthetic(1024, 256, 512, 2, 4, 2, 128, true)
}

/// Prefill + 16 greedy decode steps through the kernels (`DecodePath::Kernels`) and through the
/// composite ops (`DecodePath::Composite`) on the same device, the same tokens fed to both:
/// the logits' max difference and how many steps pick a different token.
fn model_decode(dev: &Device) -> Result<Vec<Row>> {
    use crate::cached::DecodePath;
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let model = crate::Qwen3::random(small_config()?, 7, dev, dt)?;
    let prompts: Vec<Vec<u32>> = vec![(1..9).collect(), (20..25).collect()];
    let batch = crate::Batch::from_rows(&prompts, 0, crate::Padding::Left, dev)?;
    let (b, t) = batch.input_ids.dims2()?;
    let mask = batch.mask.clone();
    let mut caches = [model.new_cache(b, t + 17)?, model.new_cache(b, t + 17)?];
    let paths = [DecodePath::Kernels, DecodePath::Composite];
    let snap = model.decode_weights();
    // The prefill (several slots per row) runs the composite ops on either path.
    let mut logits = vec![];
    for c in caches.iter_mut() {
        let (ids, pos) = (&batch.input_ids, &batch.position_ids);
        logits.push(model.forward_cached_with(DecodePath::Composite, &snap, c, ids, pos, &mask)?);
    }
    let mut pos: Vec<u32> = prompts.iter().map(|p| p.len() as u32).collect();
    let (mut worst, mut disagree) = (0.0f64, 0usize);
    for _ in 0..16 {
        let next: Vec<u32> = logits[1].argmax(1)?.to_vec1::<u32>()?;
        let other: Vec<u32> = logits[0].argmax(1)?.to_vec1::<u32>()?;
        disagree += next.iter().zip(&other).filter(|(a, b)| a != b).count();
        let ids = Tensor::from_vec(next.clone(), (b, 1), dev)?;
        let p = Tensor::from_vec(pos.clone(), (b, 1), dev)?;
        for (i, (c, path)) in caches.iter_mut().zip(paths).enumerate() {
            logits[i] = model.forward_cached_with(path, &snap, c, &ids, &p, &vec![1; b])?;
        }
        worst = worst.max(diff(&logits[0], &logits[1])?);
        if worst.is_nan() {
            break;
        }
        pos.iter_mut().for_each(|x| *x += 1);
    }
    let tol = if dev.is_cuda() { 0.1 } else { 2e-4 };
    Ok(vec![
        Row {
            name: "model decode logits, kernels vs composite (16 steps)".into(),
            max_diff: worst,
            tolerance: tol,
        },
        Row {
            name: "model decode greedy tokens that differ (of 32)".into(),
            max_diff: disagree as f64,
            tolerance: if dev.is_cuda() { 1.0 } else { 0.0 },
        },
    ])
}

/// The training path (token log-probs through the fused head, backward to every weight) in
/// bf16 against f32 on the same device: log-prob difference and the relative difference of
/// the global gradient norm.
fn model_training(dev: &Device) -> Result<Vec<Row>> {
    let low = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let rows: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            (0..48)
                .map(|j| ((i * 131 + j * 17) % 1000) as u32)
                .collect()
        })
        .collect();
    let run = |dt: DType| -> Result<(Tensor, f64)> {
        let model = crate::Qwen3::random(small_config()?, 11, dev, dt)?;
        let batch = crate::Batch::from_rows(&rows, 0, crate::Padding::Right, dev)?;
        let sel: Vec<u32> = (0..4u32)
            .flat_map(|r| (0..47).map(move |j| r * 48 + j))
            .collect();
        let tgt: Vec<u32> = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
        let lp = model.token_logprobs(&batch, &sel, &tgt, true)?;
        let g = lp.sum_all()?.backward()?;
        let mut sq = 0.0f64;
        for v in model.vars().values() {
            if let Some(t) = g.get(v) {
                sq += f64::from(
                    t.to_dtype(DType::F32)?
                        .sqr()?
                        .sum_all()?
                        .to_scalar::<f32>()?,
                );
            }
        }
        Ok((lp.to_dtype(DType::F32)?, sq.sqrt()))
    };
    let (lp_hi, n_hi) = run(DType::F32)?;
    let (lp_lo, n_lo) = run(low)?;
    let rel = (n_hi - n_lo).abs() / n_hi.max(1e-12);
    let (tol_lp, tol_g) = if dev.is_cuda() {
        (0.1, 0.05)
    } else {
        (0.0, 0.0)
    };
    Ok(vec![
        row("training log-probs bf16 vs f32", &lp_lo, &lp_hi, tol_lp)?,
        Row {
            name: "training gradient norm bf16 vs f32 (relative)".into(),
            max_diff: if n_lo.is_finite() { rel } else { f64::NAN },
            tolerance: tol_g,
        },
    ])
}

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

    fn ranges(self, t: usize, on: &Device) -> Result<crate::flash::KeyRanges> {
        let mut mask = vec![1u8; 2 * t];
        match self {
            Mask::Left => mask[..17].fill(0),
            Mask::Right => mask[t + 101..].fill(0),
            Mask::Packed => return crate::flash::KeyRanges::packed(&[37, 27, 1, t - 65], t, on),
        }
        match crate::flash::KeyRanges::from_mask(&mask, 2, t, on)? {
            Some(r) => Ok(r),
            None => candle_core::bail!("parity: flash mask not contiguous"),
        }
    }
}

fn flash(dev: &Device, dt: DType, kind: Mask) -> Result<Vec<Row>> {
    let (b, hq, hkv, t, d) = (kind.rows(), 8, 2, 150, 128);
    let round = |x: Tensor| {
        if dt == DType::BF16 {
            bf16_round(&x)
        } else {
            Ok(x)
        }
    };
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
        let out = crate::flash::attention(
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
    let sfx = if dt == DType::BF16 { "bf16" } else { "f32" };
    ["out", "dq", "dk", "dv"]
        .iter()
        .zip(got.iter().zip(&want))
        .map(|(name, (a, c))| {
            // Padding rows (17 of row 0) are don't-cares in the output and dq: both paths give 0.
            let tol = if dt == DType::BF16 {
                bf16_tolerance(c)?
            } else {
                1e-4
            };
            row(
                &format!("flash attention {name} {sfx} ({kind:?})"),
                a,
                c,
                tol,
            )
        })
        .collect()
}

/// Every mask kind in `dt`.
fn flash_all(dev: &Device, dt: DType) -> Result<Vec<Row>> {
    let mut rows = vec![];
    for kind in [Mask::Left, Mask::Right, Mask::Packed] {
        rows.extend(flash(dev, dt, kind)?);
    }
    Ok(rows)
}

fn flash_f32(dev: &Device) -> Result<Vec<Row>> {
    flash_all(dev, DType::F32)
}

fn flash_bf16(dev: &Device) -> Result<Vec<Row>> {
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
