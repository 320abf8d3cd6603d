//! gpu-check's data-parallel rows (GPU builds): the NCCL backend (`terse_dist::NcclGroup`) on
//! the machine's first GPU at world size 1, because the check runs on one GPU. Checks that each
//! collective gives its exact result (world 1: the identity), reports the staged all-reduce's
//! bandwidth against a plain host -> device -> host round trip of the same buffer, and trains 2
//! GRPO steps of the testbed fixture on the GPU through the NCCL ZeRO-2 path, against the same
//! 2 steps on the CPU without a collective (bf16 against f32: the weights agree to bf16's
//! resolution). With 2+ GPUs the launcher's `--nproc` runs the real exchange; not yet tried.

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use terse_dist::{Collective, NcclGroup, TcpGroup};

/// A world-1 NCCL group on CUDA device 0 (its TCP side is a group of one, on a thread).
fn group_of_one() -> Result<NcclGroup> {
    let mut out = TcpGroup::on_threads(1, Duration::from_secs(30), Ok);
    let tcp = out.pop().context("no rank")??;
    NcclGroup::new(tcp, 0, Duration::from_secs(60))
}

/// Seconds per call of `f`, after one warm-up call.
fn time(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

pub fn nccl(dev: &Device) -> Result<Value> {
    let mut g = group_of_one()?;
    // Exact results: at world 1 every collective is the identity.
    let len = 16 << 20; // 64 MiB of f32
    let data: Vec<f32> = (0..len).map(|i| (i % 1013) as f32 * 0.5).collect();
    let mut buf = data.clone();
    g.all_reduce_sum(&mut buf)?;
    let mut f64s = vec![0.1f64, 1e300, -3.0];
    g.all_reduce_sum_f64(&mut f64s)?;
    let scattered = g.reduce_scatter_sum(&data)?;
    let gathered = g.all_gather(&data)?;
    let exact = buf == data && f64s == [0.1, 1e300, -3.0] && scattered == data && gathered == data;
    if !exact {
        bail!("NCCL at world size 1 changed a buffer (all-reduce, reduce-scatter or all-gather)");
    }
    let ar = time(5, || g.all_reduce_sum(&mut buf))?;
    // The baseline: the same staging (host -> device -> host) with no NCCL call.
    let host = Tensor::from_slice(&data, len, &Device::Cpu)?;
    let round_trip = time(5, || {
        let back = host.to_device(dev)?.to_device(&Device::Cpu)?;
        drop(back);
        Ok(())
    })?;
    let gbs = |s: f64| (len * 4) as f64 / s / 1e9;
    Ok(json!({
        "world": 1,
        "exact": exact,
        "all_reduce_ms": ar * 1e3,
        "all_reduce_gbs": gbs(ar),
        "round_trip_ms": round_trip * 1e3,
        "all_reduce_over_round_trip": round_trip / ar,
        // Its own row: a failure here must not erase the collectives' figures above.
        "grpo": grpo_steps().unwrap_or_else(|e| json!({"error": format!("{e:#}")})),
    }))
}

/// 2 GRPO steps of the testbed fixture: on the GPU through the NCCL path (ZeRO-2 at world 1)
/// and on the CPU in one process; the largest relative weight difference and how far the GPU
/// run moved from the start.
fn grpo_steps() -> Result<Value> {
    let run = |device: &str, nccl: bool| -> Result<BTreeMap<String, Tensor>> {
        let mut cfg = terse_train::RunConfig::default();
        cfg.run.device = device.into();
        cfg.model.path = "tests/fixtures/testbed-sft".into();
        cfg.model.init = terse_train::config::Init::Checkpoint;
        cfg.sft.steps = 0;
        (cfg.grpo.prompts_per_step, cfg.grpo.group_size) = (4, 4);
        let mut b = terse_train::GrpoTrainer::builder(cfg);
        if nccl {
            b = b.collective(Box::new(group_of_one()?));
        }
        let mut t = b.build()?;
        for _ in 0..2 {
            t.step()?;
        }
        Ok(t.policy().tensors())
    };
    let start = terse_model::Qwen3::load(
        "tests/fixtures/testbed-sft".as_ref(),
        &Device::Cpu,
        candle_core::DType::F32,
    )?
    .tensors();
    let gpu = run("cuda:0", true)?;
    let cpu = run("cpu", false)?;
    let worst = |a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>| -> Result<f32> {
        let mut m = 0f32;
        for (k, x) in a {
            let y = b[k].to_device(&Device::Cpu)?;
            m = m.max(terse_model::testing::relative_diff(x, &y)?);
        }
        Ok(m)
    };
    let diff = worst(&cpu, &gpu)?;
    let moved = worst(&start, &gpu)?;
    Ok(json!({
        "steps": 2,
        "max_rel_diff_gpu_vs_cpu": diff,
        "gpu_moved_from_start": moved,
        "within_bf16": diff <= 1e-2,
    }))
}
