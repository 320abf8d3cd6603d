//! `cargo xtask bench collective`: the data-parallel exchange of the CPU backend (`TcpGroup`
//! over loopback, ranks on threads) at 2 and 4 ranks: sum all-reduce of a gradient-sized
//! buffer and ZeRO-2's pair (reduce-scatter of the gradients, all-gather of the new weights),
//! as algorithm and bus bandwidth (NCCL's convention: bus = algorithm x 2(n-1)/n for an
//! all-reduce, x (n-1)/n for each half), against a plain copy of the same buffer measured in
//! the same run. NCCL ranks would report the same figures from gpu-check.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use terse_dist::{Collective, TcpGroup};

/// Seconds per operation of each kind on `world` ranks, rank 0's clock (the slowest rank
/// bounds every collective, so one clock suffices), over `iters` timed rounds after one
/// warm-up: (all-reduce, reduce-scatter + all-gather).
fn exchange_seconds(world: usize, len: usize, iters: usize) -> Result<(f64, f64)> {
    let out = TcpGroup::on_threads(world, Duration::from_secs(120), move |mut g| {
        let mut buf: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
        let time = |g: &mut TcpGroup, buf: &mut Vec<f32>, pair: bool| -> Result<f64> {
            let t0 = Instant::now();
            for _ in 0..iters {
                if pair {
                    let mine = g.reduce_scatter_sum(buf)?;
                    *buf = g.all_gather(&mine)?;
                } else {
                    g.all_reduce_sum(buf)?;
                }
            }
            Ok(t0.elapsed().as_secs_f64() / iters as f64)
        };
        g.all_reduce_sum(&mut buf)?; // warm-up: connections and page faults
        let all_reduce = time(&mut g, &mut buf, false)?;
        let pair = time(&mut g, &mut buf, true)?;
        Ok((all_reduce, pair))
    });
    out.into_iter()
        .next()
        .context("no rank 0")?
        .context("rank 0 of the bench group")
}

/// Seconds to copy `len` f32 once (the baseline: memory bandwidth of this machine).
fn copy_seconds(len: usize, iters: usize) -> f64 {
    let src: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let mut dst = vec![0f32; len];
    dst.copy_from_slice(&src); // warm-up: page faults
    let t0 = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    t0.elapsed().as_secs_f64() / iters as f64
}

pub fn collective(json: bool, mib: usize) -> Result<ExitCode> {
    // A multiple of 4 ranks' shards (reduce-scatter needs equal parts).
    let len = (mib.max(1) << 20) / 4 / 4 * 4;
    let bytes = (len * 4) as f64;
    let gbs = |secs: f64, factor: f64| bytes * factor / secs / 1e9;
    let iters = 5;
    let copy = copy_seconds(len, iters);
    let copy_gbs = gbs(copy, 1.0);
    println!("collective exchange of {mib} MiB of f32 over loopback TCP (ranks on threads)");
    println!("baseline: one copy of the buffer, {copy_gbs:.2} GB/s");
    println!("| ranks | op | ms | algorithm GB/s | bus GB/s | bus / copy |");
    println!("|---|---|---|---|---|---|");
    let mut rows: Vec<Value> = vec![];
    for world in [2usize, 4] {
        let (ar, pair) = exchange_seconds(world, len, iters)?;
        let n = world as f64;
        for (op, secs, bus) in [
            ("all-reduce", ar, 2.0 * (n - 1.0) / n),
            ("reduce-scatter + all-gather", pair, 2.0 * (n - 1.0) / n),
        ] {
            let (alg, busbw) = (gbs(secs, 1.0), gbs(secs, bus));
            println!(
                "| {world} | {op} | {:.1} | {alg:.2} | {busbw:.2} | {:.2} |",
                secs * 1e3,
                busbw / copy_gbs
            );
            rows.push(json!({
                "ranks": world, "op": op, "ms": secs * 1e3,
                "algorithm_gbs": alg, "bus_gbs": busbw, "bus_over_copy": busbw / copy_gbs,
            }));
        }
    }
    if json {
        println!(
            "{}",
            json!({"bench": "collective", "mib": mib, "copy_gbs": copy_gbs, "rows": rows})
        );
    }
    Ok(ExitCode::SUCCESS)
}
