//! Parity of the fused ops one at a time: RMSNorm, RoPE, the log-prob epilogue, the KV
//! cache's write and decode attention (in f32 and in bf16), the sampler, and SwiGLU with its
//! backward.

use super::common::{bf16_round, bf16_tolerance, grad, on_dev, rnd, row, Row};
use crate::kernels as fused;
use candle_core::{DType, Device, Result, Tensor, Var};

/// RMSNorm forward and backward (rows 64 x 1024).
pub(super) fn rmsnorm_f32(dev: &Device) -> Result<Vec<Row>> {
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
pub(super) fn rope_f32(dev: &Device) -> Result<Vec<Row>> {
    let (x, c, s) = rope_inputs()?;
    let run = |d: &Device| -> Result<(Tensor, Tensor)> {
        let xv = Var::from_tensor(&x.to_device(d)?)?;
        let y = fused::rope(&xv, &c.to_device(d)?, &s.to_device(d)?)?;
        let g = y.sqr()?.sum_all()?.backward()?;
        Ok((y, grad(&g, &xv, "x")?))
    };
    let (rc, rg) = (run(&Device::Cpu)?, run(dev)?);
    let mut rows = vec![
        row("rope fwd", &rg.0, &rc.0, 1e-5)?,
        row("rope bwd", &rg.1, &rc.1, 1e-4)?,
    ];
    rows.extend(rope_layouts(dev, false, &x, &c, &s, |_| Ok(1e-5))?);
    Ok(rows)
}

/// RoPE between layouts (`rope_laid_out`: from the rows (B, T, H, D) into attention's layout,
/// the inverse back, and rows to rows as the written layer backward runs it) on `dev` (in bf16
/// there with `bf16`, the values already rounded) against the CPU on the same values, `tol` of
/// the CPU side.
fn rope_layouts(
    dev: &Device,
    bf16: bool,
    x: &Tensor,
    c: &Tensor,
    s: &Tensor,
    tol: impl Fn(&Tensor) -> Result<f64>,
) -> Result<Vec<Row>> {
    let rows_layout = x.transpose(1, 2)?.contiguous()?; // (B, T, H, D)
    let tag = if bf16 { "bf16 " } else { "" };
    let run = |d: &Device| -> Result<(Tensor, Tensor, Tensor)> {
        let put = |t: &Tensor| if bf16 { on_dev(t, d) } else { t.to_device(d) };
        let (cd, sd) = (put(c)?, put(s)?);
        let heads = fused::rope_laid_out(&put(&rows_layout)?, &cd, &sd, false, [true, false])?;
        let back = fused::rope_laid_out(&put(x)?, &cd, &sd, true, [false, true])?;
        let within = fused::rope_laid_out(&put(&rows_layout)?, &cd, &sd, false, [true, true])?;
        Ok((heads, back, within))
    };
    let (want, got) = (run(&Device::Cpu)?, run(dev)?);
    Ok(vec![
        row(
            &format!("{tag}rope rows to heads"),
            &got.0,
            &want.0,
            tol(&want.0)?,
        )?,
        row(
            &format!("{tag}rope inverse heads to rows"),
            &got.1,
            &want.1,
            tol(&want.1)?,
        )?,
        row(
            &format!("{tag}rope rows to rows"),
            &got.2,
            &want.2,
            tol(&want.2)?,
        )?,
    ])
}

/// Log-prob epilogue (n 64, V 151936) forward and backward.
pub(super) fn logprob_f32(dev: &Device) -> Result<Vec<Row>> {
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

/// The written log-prob head's pieces in bf16, each against the f32 reference on the rounded
/// values: the epilogue on bf16 logits (n 64, V 151936; the stats in f32, the gradient in bf16)
/// and the weight gradient's accumulating GEMM (acc (4096, 128) f32 += aᵀ b over 64 bf16 rows,
/// run twice so that the second call must add to the first).
pub(super) fn logprob_bf16(dev: &Device) -> Result<Vec<Row>> {
    let cpu = Device::Cpu;
    let v = 151_936;
    let logits = bf16_round(&(rnd(&[64, v], 5)? * 8.0)?)?;
    let targets = Tensor::from_vec(
        (0..64u32).map(|i| i * 2371 % v as u32).collect::<Vec<_>>(),
        64,
        &cpu,
    )?;
    let st = |d: &Device| fused::logprob_stats(&on_dev(&logits, d)?, &targets.to_device(d)?);
    let (sc, sg) = (st(&cpu)?, st(dev)?);
    let lse_g = Tensor::cat(&[&sc.narrow(1, 1, 1)?, &rnd(&[64, 1], 6)?], 1)?;
    let bw = |d: &Device| {
        fused::logprob_grad(
            &on_dev(&logits, d)?,
            &targets.to_device(d)?,
            &lse_g.to_device(d)?,
        )
    };
    let (bc, bg) = (bw(&cpu)?, bw(dev)?);
    let (a, b) = (
        bf16_round(&rnd(&[64, 4096], 11)?)?,
        bf16_round(&rnd(&[64, 128], 12)?)?,
    );
    let acc = |d: &Device| -> Result<Tensor> {
        let acc = rnd(&[4096, 128], 13)?.to_device(d)?;
        for _ in 0..2 {
            fused::gemm::accumulate_at_b(&acc, &on_dev(&a, d)?, &on_dev(&b, d)?)?;
        }
        Ok(acc)
    };
    Ok(vec![
        // log Z near 15 over 151,936 f32 terms summed in another order than the reference's:
        // 2e-3 is 1.3e-4 of it (the f32 row's 1e-3 reads 0.9e-3 on the emulated device).
        row("bf16 logprob fwd [logp, lse, entropy]", &sg, &sc, 2e-3)?,
        row("bf16 logprob bwd", &bg, &bc, bf16_tolerance(&bc)?)?,
        row(
            "bf16 head gradient GEMM, beta 1, twice",
            &acc(dev)?,
            &acc(&cpu)?,
            1e-3,
        )?,
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

pub(super) fn kv_cache_f32(dev: &Device) -> Result<Vec<Row>> {
    let (g, c) = (
        kv_attention(dev, DType::F32, false)?,
        kv_attention(&Device::Cpu, DType::F32, false)?,
    );
    Ok(vec![row("kv write + decode attention", &g, &c, 1e-4)?])
}

/// `kv_write_bf16` + `decode_attention_bf16` against the f32 reference on bf16-rounded inputs.
pub(super) fn kv_cache_bf16(dev: &Device) -> Result<Vec<Row>> {
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

/// `rmsnorm_fwd_bf16`, `rmsnorm_fwd_res_bf16` (the residual add in front) and
/// `rmsnorm_bwd_bf16` with a residual gradient added into dx (the written layer backward's),
/// against the f32 reference on bf16-rounded inputs.
pub(super) fn rmsnorm_bf16(dev: &Device) -> Result<Vec<Row>> {
    let (x, w) = (
        bf16_round(&rnd(&[64, 1024], 1)?)?,
        bf16_round(&rnd(&[1024], 2)?)?,
    );
    let (dy, res) = (
        bf16_round(&rnd(&[64, 1024], 3)?)?,
        bf16_round(&rnd(&[64, 1024], 4)?)?,
    );
    let c = fused::rms_norm(&x, &w, 1e-6)?;
    let g = fused::rms_norm(&on_dev(&x, dev)?, &on_dev(&w, dev)?, 1e-6)?;
    let (dxc, dwc) = fused::rms_norm_grad(&x, &w, &dy, 1e-6, Some(&res))?;
    let put = |t: &Tensor| on_dev(t, dev);
    let (dxg, dwg) =
        fused::rms_norm_grad(&put(&x)?, &put(&w)?, &put(&dy)?, 1e-6, Some(&put(&res)?))?;
    // The device rounds the sum to bf16 before the norm, as a bf16 add would.
    let yc = fused::rms_norm(&bf16_round(&(&x + &res)?)?, &w, 1e-6)?;
    let (_, yg) = fused::rms_norm_residual(&put(&x)?, &put(&res)?, &put(&w)?, 1e-6)?;
    Ok(vec![
        row("bf16 rmsnorm fwd", &g, &c, bf16_tolerance(&c)?)?,
        row(
            "bf16 residual add + rmsnorm",
            &yg,
            &yc,
            bf16_tolerance(&yc)?,
        )?,
        row(
            "bf16 rmsnorm bwd dx + residual",
            &dxg,
            &dxc,
            bf16_tolerance(&dxc)?,
        )?,
        // dw sums f32 products of the same rounded values: only the order of the sum differs.
        row(
            "bf16 rmsnorm bwd dw",
            &dwg,
            &dwc,
            bf16_tolerance(&dwc)? / 8.0,
        )?,
    ])
}

/// `rope_{fwd,bwd}_bf16` against the f32 reference on bf16-rounded inputs.
pub(super) fn rope_bf16(dev: &Device) -> Result<Vec<Row>> {
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
    let mut rows = vec![
        row("bf16 rope fwd", &got, &want, bf16_tolerance(&want)?)?,
        row(
            "bf16 rope bwd",
            &back,
            &x_back,
            2.0 * bf16_tolerance(&x_back)?,
        )?,
    ];
    rows.extend(rope_layouts(dev, true, &x, &c, &s, bf16_tolerance)?);
    Ok(rows)
}

/// The device sampler (16 rows, V 151936) against the CPU sampler on the same logits and
/// uniforms, per warper setting: the drawn token's logit (equal logits are a tie, not a
/// difference), and both log-probs and the entropy.
pub(super) fn sample_f32(dev: &Device) -> Result<Vec<Row>> {
    use crate::kernels::sample::{sample_rows, Warpers};
    let (n, v) = (16, 151_936);
    let logits = (rnd(&[n, v], 7)? * 12.0)?;
    let host = logits.to_vec2::<f32>()?;
    let us: Vec<f64> = (0..n).map(|i| (i as f64 * 0.618_034) % 1.0).collect();
    let settings = [
        (
            "greedy",
            Warpers {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
            },
        ),
        (
            "t 1",
            Warpers {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
            },
        ),
        (
            "t 0.6 top-p 0.95",
            Warpers {
                temperature: 0.6,
                top_k: 0,
                top_p: 0.95,
                min_p: 0.0,
            },
        ),
        (
            "top-k 50 min-p 0.05",
            Warpers {
                temperature: 1.0,
                top_k: 50,
                top_p: 1.0,
                min_p: 0.05,
            },
        ),
    ];
    let mut rows = vec![];
    for (name, w) in settings {
        let (g, c) = (
            sample_rows(&logits.to_device(dev)?, &us, &w)?,
            sample_rows(&logits, &us, &w)?,
        );
        let mut d = 0f64;
        for (i, (a, b)) in g.iter().zip(&c).enumerate() {
            let logit = |t: u32| f64::from(host[i][t as usize]);
            for (x, y) in [
                (logit(a.token), logit(b.token)),
                (f64::from(a.logp_sampled), f64::from(b.logp_sampled)),
                (f64::from(a.logp_plain), f64::from(b.logp_plain)),
                (f64::from(a.entropy), f64::from(b.entropy)),
            ] {
                d = if (x - y).is_nan() {
                    f64::NAN
                } else {
                    d.max((x - y).abs())
                };
            }
        }
        rows.push(Row {
            name: format!("sample {name}: drawn logit, log-probs, entropy"),
            max_diff: d,
            tolerance: 1e-4,
        });
    }
    Ok(rows)
}

/// SwiGLU forward and its one-kernel backward (rows 64 x 1536, gates in [-4, 4)), on the device
/// against the CPU reference: in f32 (`f32`), or in bf16 on bf16-rounded inputs.
fn swiglu(dev: &Device, bf16: bool) -> Result<Vec<Row>> {
    let round = |t: Tensor| if bf16 { bf16_round(&t) } else { Ok(t) };
    let (g, u, dy) = (
        round((rnd(&[64, 1536], 7)? * 4.0)?)?,
        round(rnd(&[64, 1536], 8)?)?,
        round(rnd(&[64, 1536], 9)?)?,
    );
    let run = |d: &Device| -> Result<(Tensor, Tensor, Tensor)> {
        let put = |t: &Tensor| if bf16 { on_dev(t, d) } else { t.to_device(d) };
        let (gv, uv) = (Var::from_tensor(&put(&g)?)?, Var::from_tensor(&put(&u)?)?);
        let y = fused::swiglu(&gv, &uv)?;
        let grads = (&y * put(&dy)?)?.sum_all()?.backward()?;
        Ok((y, grad(&grads, &gv, "g")?, grad(&grads, &uv, "u")?))
    };
    let (c, d) = (run(&Device::Cpu)?, run(dev)?);
    let tol = |t: &Tensor, f32_tol: f64| if bf16 { bf16_tolerance(t) } else { Ok(f32_tol) };
    let tag = if bf16 { "bf16 " } else { "" };
    Ok(vec![
        row(&format!("{tag}swiglu fwd"), &d.0, &c.0, tol(&c.0, 1e-5)?)?,
        // bf16: dy * y's product is rounded before the backward sees it.
        row(
            &format!("{tag}swiglu bwd dg"),
            &d.1,
            &c.1,
            2.0 * tol(&c.1, 1e-5)?,
        )?,
        row(
            &format!("{tag}swiglu bwd du"),
            &d.2,
            &c.2,
            2.0 * tol(&c.2, 1e-5)?,
        )?,
    ])
}

pub(super) fn swiglu_f32(dev: &Device) -> Result<Vec<Row>> {
    swiglu(dev, false)
}

pub(super) fn swiglu_bf16(dev: &Device) -> Result<Vec<Row>> {
    swiglu(dev, true)
}
