//! GPU parity of the fused ops (fused.rs): each op run on a device and on the CPU (its reference
//! in kernels.rs), forward and backward, as (name, max |difference|, tolerance). `cargo xtask
//! gpu-check` and the `cuda` integration tests call it; on the CPU it compares the CPU with
//! itself, which keeps the code path compiled and exercised everywhere.

use candle_core::Result;

/// Max |a − b| between a tensor computed on the GPU and on the CPU.
pub fn diff(gpu: &candle_core::Tensor, cpu: &candle_core::Tensor) -> Result<f64> {
    let g = gpu
        .to_device(&candle_core::Device::Cpu)?
        .to_dtype(candle_core::DType::F32)?;
    let c = cpu.to_dtype(candle_core::DType::F32)?;
    Ok(f64::from(
        (g - c)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?,
    ))
}

/// Every fused op on `dev` against its CPU reference, forward and backward: (name, max diff,
/// tolerance).
pub fn check(dev: &candle_core::Device) -> Result<Vec<(String, f64, f64)>> {
    use crate::fused;
    use candle_core::{Device, Tensor, Var};
    let cpu = Device::Cpu;
    let rnd = |shape: &[usize], seed: u64| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n as u64)
            .map(|i| (((i * 2654435761 + seed * 97) % 1000) as f32 / 500.0) - 1.0)
            .collect();
        Tensor::from_vec(v, shape, &cpu)
    };
    let mut out = vec![];
    let mut check = |name: &str, g: &Tensor, c: &Tensor, tol: f64| -> Result<()> {
        out.push((name.to_string(), diff(g, c)?, tol));
        Ok(())
    };
    // RMSNorm forward and backward (rows 64 x 1024).
    let (x, w, dy) = (rnd(&[64, 1024], 1)?, rnd(&[1024], 2)?, rnd(&[64, 1024], 3)?);
    let both = |d: &Device| -> Result<(Tensor, Tensor, Tensor)> {
        let (xv, wv) = (
            Var::from_tensor(&x.to_device(d)?)?,
            Var::from_tensor(&w.to_device(d)?)?,
        );
        let y = fused::rms_norm(&xv, &wv, 1e-6)?;
        let g = (&y * dy.to_device(d)?)?.sum_all()?.backward()?;
        let gx = g
            .get(&xv)
            .ok_or_else(|| candle_core::Error::Msg("no dx".into()))?
            .clone();
        let gw = g
            .get(&wv)
            .ok_or_else(|| candle_core::Error::Msg("no dw".into()))?
            .clone();
        Ok((y, gx, gw))
    };
    let (gc, gg) = (both(&cpu)?, both(dev)?);
    check("rmsnorm fwd", &gg.0, &gc.0, 1e-5)?;
    check("rmsnorm bwd dx", &gg.1, &gc.1, 1e-4)?;
    check("rmsnorm bwd dw", &gg.2, &gc.2, 1e-3)?;
    // RoPE forward and backward (B 2, H 8, T 64, D 128).
    let x = rnd(&[2, 8, 64, 128], 4)?;
    let pos = Tensor::arange(0u32, 128, &cpu)?.reshape((2, 64))?;
    let (c, s) = crate::ops::rope_tables(&pos, 128, 1e6, candle_core::DType::F32)?;
    let run = |d: &Device| -> Result<(Tensor, Tensor)> {
        let xv = Var::from_tensor(&x.to_device(d)?)?;
        let y = fused::rope(&xv, &c.to_device(d)?, &s.to_device(d)?)?;
        let g = y.sqr()?.sum_all()?.backward()?;
        Ok((
            y,
            g.get(&xv)
                .ok_or_else(|| candle_core::Error::Msg("no dx".into()))?
                .clone(),
        ))
    };
    let (rc, rg) = (run(&cpu)?, run(dev)?);
    check("rope fwd", &rg.0, &rc.0, 1e-5)?;
    check("rope bwd", &rg.1, &rc.1, 1e-4)?;
    // Log-prob epilogue (n 64, V 151936) forward and backward.
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
    check("logprob fwd [logp, lse, entropy]", &sg, &sc, 1e-3)?;
    let lse_g = Tensor::cat(&[&sc.narrow(1, 1, 1)?, &lg.narrow(1, 1, 1)?], 1)?;
    let bw = |d: &Device| {
        fused::logprob_grad(
            &logits.to_device(d)?,
            &targets.to_device(d)?,
            &lse_g.to_device(d)?,
        )
    };
    check("logprob bwd", &bw(dev)?, &bw(&cpu)?, 1e-5)?;
    // KV-cache write and decode attention (B 4, Hq 16, Hkv 8, C 256, D 128, 200 slots used).
    let (b, hq, hkv, cap, d, len) = (4, 16, 8, 256, 128, 200);
    let attn = |dv: &Device| -> Result<Tensor> {
        let k = Tensor::zeros((b, hkv, cap, d), candle_core::DType::F32, dv)?;
        let vc = Tensor::zeros((b, hkv, cap, d), candle_core::DType::F32, dv)?;
        for slot in 0..len {
            fused::kv_write(
                &k,
                &rnd(&[b, hkv, d], 10 + slot as u64)?.to_device(dv)?,
                slot,
            )?;
            fused::kv_write(
                &vc,
                &rnd(&[b, hkv, d], 900 + slot as u64)?.to_device(dv)?,
                slot,
            )?;
        }
        let valid: Vec<u8> = (0..b * cap)
            .map(|i| u8::from(i % cap >= (i / cap) * 7))
            .collect();
        fused::decode_attention(&rnd(&[b, hq, d], 7)?.to_device(dv)?, &k, &vc, valid, len)
    };
    check(
        "kv write + decode attention",
        &attn(dev)?,
        &attn(&cpu)?,
        1e-4,
    )?;
    Ok(out)
}
