//! The benchmarks of `cargo xtask gpu-check`, for the Qwen3-0.6B shape with random bf16
//! weights: decode tokens/s at batch 1/64/256 with the fraction of the HBM roofline, HF
//! transformers `generate` on the same shape (scripts/bench_hf_generate.py, through the torch
//! that machine has), forward+backward tokens/s, and the log-prob path fused vs naive.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};
use std::time::Instant;
use terse_model::{Batch, Padding, Qwen3};

/// H200 HBM3e bandwidth (bytes/s), for the roofline fraction.
const HBM_BYTES_PER_S: f64 = 4.8e12;

fn sync(dev: &Device) -> Result<()> {
    dev.synchronize()?;
    Ok(())
}

/// Decode tokens/s (prompt 32, 128 new) and the roofline: each decode step must read every
/// weight once plus the KV cache so far, so tokens/s ≤ B · bandwidth / bytes per step.
pub fn decode(dev: &Device, model: &Qwen3) -> Result<Value> {
    use terse_rollout::{generate, GenParams};
    let cfg = &model.config;
    let (layers, kv, hd) = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim);
    let v = cfg.vocab_size;
    let params_bytes: f64 = model
        .vars()
        .values()
        .map(|t| t.elem_count() as f64 * 2.0)
        .sum();
    let gen = GenParams::new(128);
    let mut rows = vec![];
    for b in [1usize, 64, 256] {
        let prompts = crate::bench_rollout::prompts(b, 32, v);
        let none = |_: &[u32]| String::new();
        generate(model, &prompts[..1], 1, &GenParams::new(4), 0, &none)?;
        sync(dev)?;
        let t0 = Instant::now();
        let s = generate(model, &prompts, 1, &gen, 0, &none)?;
        sync(dev)?;
        let secs = t0.elapsed().as_secs_f64();
        let toks: usize = s.iter().map(|x| x.tokens.len()).sum();
        let tps = toks as f64 / secs;
        // Mean context over the run: 32 + 64; K and V, bf16.
        let kv_bytes = b as f64 * (32.0 + 64.0) * (layers * kv * hd * 2 * 2) as f64;
        let roofline = b as f64 * HBM_BYTES_PER_S / (params_bytes + kv_bytes);
        println!(
            "decode batch {b:>3}: {tps:.0} tokens/s ({:.1}% of the HBM roofline {roofline:.0})",
            100.0 * tps / roofline
        );
        rows.push(json!({"batch": b, "tokens_per_s": tps, "roofline_tokens_per_s": roofline, "roofline_frac": tps / roofline}));
    }
    rows.push(sampler_share(dev, model, &gen)?);
    Ok(Value::Array(rows))
}

/// The device sampler against the host one (`TERSE_HOST_SAMPLER=1`, every logit copied to the
/// host) in the same run: batch 64, 16 new tokens each way; the step time each takes, the share
/// of the host path's step the device sampler removes, and the samples whose tokens differ
/// (ties only, kernels/sample.cu).
fn sampler_share(dev: &Device, model: &Qwen3, gen: &terse_rollout::GenParams) -> Result<Value> {
    use terse_rollout::generate;
    let (b, new) = (64usize, 16usize);
    let v = model.config.vocab_size;
    let prompts = crate::bench_rollout::prompts(b, 32, v);
    let mut gen = gen.clone();
    gen.max_new_tokens = new;
    let none = |_: &[u32]| String::new();
    let run = |host: bool| -> Result<(f64, Vec<Vec<u32>>)> {
        // Read when the scheduler starts (crates/rollout/src/draw.rs).
        std::env::set_var("TERSE_HOST_SAMPLER", if host { "1" } else { "0" });
        sync(dev)?;
        let t0 = Instant::now();
        let s = generate(model, &prompts, 1, &gen, 0, &none);
        sync(dev)?;
        std::env::remove_var("TERSE_HOST_SAMPLER");
        let s = s?;
        Ok((
            t0.elapsed().as_secs_f64() * 1e3 / new as f64,
            s.into_iter().map(|x| x.tokens).collect(),
        ))
    };
    run(false)?; // warm-up: the kernel's module loads
    let (device_ms, dt) = run(false)?;
    let (host_ms, ht) = run(true)?;
    let differ = dt.iter().zip(&ht).filter(|(a, b)| a != b).count();
    println!(
        "decode batch {b}, {new} tokens: {device_ms:.2} ms/step with the device sampler, {host_ms:.2} with the host's (x{:.1}; the sampler was {:.0} % of the host path's step); {differ} of {b} samples differ",
        host_ms / device_ms,
        100.0 * (1.0 - device_ms / host_ms)
    );
    Ok(
        json!({"sampler": {"batch": b, "new_tokens": new, "device_ms_per_step": device_ms, "host_ms_per_step": host_ms, "speedup": host_ms / device_ms, "host_sampler_share": 1.0 - device_ms / host_ms, "samples_differing": differ}}),
    )
}

/// HF `generate` on the same shape and device, through the machine's torch; an object with
/// "error" when it cannot run.
pub fn hf_generate() -> Value {
    torch_script(
        "scripts/bench_hf_generate.py",
        &["--gpu", "1", "64", "256"],
        120,
    )
}

/// torch's peers of the attention and training rows (scripts/bench_torch_peers.py): SDPA's
/// flash and cuDNN backends on the flash shapes, HF transformers' training step at 8k and 16k
/// tokens; an object with "error" when it cannot run.
pub fn torch_peers() -> Value {
    torch_script("scripts/bench_torch_peers.py", &[], 150)
}

/// A script of scripts/ run by the machine's torch (`TERSE_PYTHON`, else /opt/torch's venv,
/// else `python3`), from the repository root (where gpu-check runs), with a limit: a hung
/// import or a missing GPU stack must not eat the device session. Its output is printed and
/// its last line read as JSON.
fn torch_script(script: &str, args: &[&str], limit_s: u64) -> Value {
    let python = std::env::var("TERSE_PYTHON").unwrap_or_else(|_| {
        let venv = "/opt/torch/.venv/bin/python3";
        if std::path::Path::new(venv).is_file() {
            venv.into()
        } else {
            "python3".into()
        }
    });
    let path = std::env::current_dir().unwrap_or_default().join(script);
    if !path.is_file() {
        return json!({"error": format!("{} not found (run from the repository root)", path.display())});
    }
    let mut cmd = std::process::Command::new(&python);
    cmd.arg(&path).args(args);
    let out = crate::process::output_with_timeout(cmd, std::time::Duration::from_secs(limit_s));
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            print!("{text}");
            text.lines()
                .last()
                .and_then(|l| serde_json::from_str(l).ok())
                .unwrap_or_else(|| json!({"error": format!("{script}: no JSON on its last line")}))
        }
        Ok(o) => {
            json!({"error": String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default()})
        }
        Err(e) => json!({"error": format!("{python}: {e}")}),
    }
}

/// Training forward+backward tokens/s through the fused log-prob head (batch 8 x 1024).
pub fn fwd_bwd(dev: &Device, model: &Qwen3) -> Result<Value> {
    let v = model.config.vocab_size;
    let (b, t) = (8usize, 1024usize);
    let rows: Vec<Vec<u32>> = (0..b)
        .map(|i| {
            (0..t)
                .map(|j| ((i * 131 + j * 17) % (v - 1)) as u32)
                .collect()
        })
        .collect();
    let batch = Batch::from_rows(&rows, 0, Padding::Right, dev)?;
    let (sel, targets) = batch.next_token_selection();
    let step = || -> Result<()> {
        let lp = model.token_logprobs(&batch, &sel, &targets, true)?;
        lp.sum_all()?.backward()?;
        Ok(())
    };
    step()?;
    sync(dev)?;
    let t0 = Instant::now();
    for _ in 0..3 {
        step()?;
    }
    sync(dev)?;
    let tps = (3 * b * t) as f64 / t0.elapsed().as_secs_f64();
    println!("forward+backward: {tps:.0} tokens/s (batch {b} x {t})");
    Ok(json!({"batch": b, "seq": t, "tokens_per_s": tps}))
}

/// The log-prob of 8192 rows over the 151,936 vocabulary: fused (chunked) vs naive time, and
/// the largest temporary each needs (the naive path holds (N, V) logits and log-softmax in
/// f32; the fused one a (chunk, V) block), computed from the shapes.
pub fn logprob(dev: &Device) -> Result<Value> {
    use terse_model::logprob::{naive_token_logprobs, token_logprobs, DEFAULT_CHUNK_ROWS};
    let (n, h, v) = (8192usize, 1024usize, 151_936usize);
    let hidden = Tensor::randn(0f32, 1.0, (n, h), dev)?.to_dtype(DType::BF16)?;
    let w = (Tensor::randn(0f32, 1.0, (v, h), dev)? * 0.02)?.to_dtype(DType::BF16)?;
    let tg = Tensor::from_vec(
        (0..n as u32)
            .map(|i| i * 7919 % v as u32)
            .collect::<Vec<_>>(),
        n,
        dev,
    )?;
    let time = |f: &dyn Fn() -> candle_core::Result<Tensor>| -> Result<f64> {
        f()?;
        sync(dev)?;
        let t0 = Instant::now();
        f()?;
        sync(dev)?;
        Ok(t0.elapsed().as_secs_f64())
    };
    let fused = time(&|| token_logprobs(&hidden, &w, &tg, DEFAULT_CHUNK_ROWS))?;
    let naive = time(&|| naive_token_logprobs(&hidden, &w, &tg))?;
    let naive_bytes = 3.0 * (n * v * 4) as f64;
    let fused_bytes = 3.0 * (DEFAULT_CHUNK_ROWS * v * 4) as f64;
    println!("log-prob {n} rows: fused {fused:.3} s vs naive {naive:.3} s; temporaries {:.0} vs {:.0} MiB", fused_bytes / 1048576.0, naive_bytes / 1048576.0);
    Ok(
        json!({"rows": n, "fused_s": fused, "naive_s": naive, "fused_temp_mib": fused_bytes / 1048576.0, "naive_temp_mib": naive_bytes / 1048576.0, "memory_ratio": fused_bytes / naive_bytes}),
    )
}
