//! `bench rollout`'s paged-cache parts: tokens/s and peak KV memory of a GRPO-shaped rollout
//! (prompts × G samples) with an unbounded budget and with 1/8 of its peak, prompt KV memory
//! with and without sharing, HF transformers' `generate` on the testbed shape (same run), and
//! the decode attention's share of this machine's streaming bandwidth at long contexts.
//!
//! Data flow: `bench::rollout` -> `paged`, `hf_generate`, `attention_bandwidth` -> rows of the
//! printed table and the JSON object.

use anyhow::Result;
use candle_core::{DType, Device};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::time::Instant;
use terse_model::{BlockTable, Config, PagedSeq, Qwen3};
use terse_rollout::{generate_with_stats, GenParams, KvBudget, Prompt};

/// Sampling at temperature 1 without EOS: every sample runs to `new` tokens.
pub fn params(new: usize, budget: KvBudget) -> GenParams {
    let mut p = GenParams::new(new);
    p.paging.kv_budget = budget;
    p
}

/// `b` prompts of `len` tokens over a vocabulary of `v`.
pub fn prompts(b: usize, len: usize, v: usize) -> Vec<Prompt> {
    (0..b)
        .map(|i| Prompt {
            id: i as u64,
            tokens: (0..len)
                .map(|j| ((i * 31 + j * 7) % (v - 1) + 1) as u32)
                .collect(),
        })
        .collect()
}

const GIB: f64 = (1u64 << 30) as f64;

/// One GRPO-shaped rollout per budget: unbounded, then 1/8 of the unbounded peak.
pub fn paged(quick: bool, tiny_only: bool) -> Result<Value> {
    let none = |_: &[u32]| String::new();
    let shapes = [
        (
            "testbed",
            Config::synthetic(64, 128, 384, 4, 4, 2, 32, true)?,
            if quick { (16, 4, 64) } else { (64, 8, 256) },
        ),
        (
            "qwen3_0_6b",
            Config::qwen3_0_6b(),
            if quick { (2, 2, 4) } else { (4, 4, 32) },
        ),
    ];
    let mut out = serde_json::Map::new();
    for (label, cfg, (np, g, new)) in shapes.into_iter().take(if tiny_only { 1 } else { 2 }) {
        let v = cfg.vocab_size;
        let m = Qwen3::random(cfg, 0, &Device::Cpu, DType::F32)?;
        let ps = prompts(np, 32, v);
        let run = |budget| -> Result<(f64, terse_rollout::RolloutStats)> {
            let t0 = Instant::now();
            let (s, st) = generate_with_stats(&m, &ps, g, &params(new, budget), 0, &none)?;
            let toks: usize = s.iter().map(|x| x.tokens.len()).sum();
            Ok((toks as f64 / t0.elapsed().as_secs_f64(), st))
        };
        let (full_tps, full) = run(KvBudget::Auto)?;
        // 1/8 of the peak, but at least what one sequence needs (its blocks and a copied one).
        let eighth = (full.peak_blocks / 8).max((32 + new).div_ceil(full.block_size) + 1);
        let (small_tps, small) = run(KvBudget::Blocks(eighth))?;
        // Prompt storage: a rollout of one token per sample peaks at the prompts' blocks (stored
        // once per prompt) plus each sample's copy of its prompt's partial last block.
        let (_, prompt_only) =
            generate_with_stats(&m, &ps, g, &params(1, KvBudget::Auto), 0, &none)?;
        let per_prompt = 32usize.div_ceil(full.block_size);
        let unshared = np * g * per_prompt * full.block_bytes;
        let gib = |b: usize| b as f64 / GIB;
        println!(
            "rollout {label}: {np} prompts x G {g}, prompt 32 + {new} new: unbounded {full_tps:.0} tokens/s, peak KV {:.3} GiB; budget 1/8 ({eighth} blocks, {:.3} GiB) {small_tps:.0} tokens/s (x{:.2} of unbounded, {} preemptions)",
            gib(full.peak_bytes()),
            gib(small.pool_blocks * small.block_bytes),
            small_tps / full_tps,
            small.preemptions
        );
        println!(
            "rollout {label}: prompt KV {:.4} GiB shared vs {:.4} GiB as separate copies (x{:.2})",
            gib(prompt_only.peak_bytes()),
            gib(unshared),
            unshared as f64 / prompt_only.peak_bytes() as f64
        );
        out.insert(
            label.into(),
            json!({
                "prompts": np, "g": g, "new_tokens": new,
                "unbounded": {"tokens_per_s": full_tps, "peak_kv_bytes": full.peak_bytes(), "steps": full.steps},
                "budget_eighth": {"tokens_per_s": small_tps, "pool_bytes": small.pool_blocks * small.block_bytes,
                    "peak_kv_bytes": small.peak_bytes(), "preemptions": small.preemptions, "steps": small.steps},
                "throughput_ratio": small_tps / full_tps,
                "prompt_kv_bytes_shared": prompt_only.peak_bytes(),
                "prompt_kv_bytes_unshared": unshared,
            }),
        );
    }
    Ok(Value::Object(out))
}

/// HF transformers' `generate` tokens/s at batch 64 on the testbed shape through `python`
/// (scripts/bench_hf_generate.py); an object with "skipped" when it cannot run.
pub fn hf_generate(python: &str) -> Value {
    let out = std::process::Command::new(python)
        .args(["scripts/bench_hf_generate.py", "64"])
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return json!({"skipped": format!("{python}: {e}")}),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        Some(v) if out.status.success() => v,
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            json!({"skipped": err.lines().last().unwrap_or("no output").to_string()})
        }
    }
}

/// Bytes/s of a parallel streaming read (sum of a 1 GiB f32 buffer), best of 3.
fn stream_bandwidth() -> f64 {
    let buf = vec![1.0f32; 1 << 28];
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        // 16 independent partial sums per chunk, so the loop vectorises and the read, not the
        // adds, is the limit.
        let s: f32 = buf
            .par_chunks(1 << 16)
            .map(|c| {
                let mut acc = [0f32; 16];
                for x in c.chunks_exact(16) {
                    for i in 0..16 {
                        acc[i] += x[i];
                    }
                }
                acc.iter().sum::<f32>()
            })
            .sum();
        std::hint::black_box(s);
        best = best.max((buf.len() * 4) as f64 / t0.elapsed().as_secs_f64());
    }
    best
}

/// Decode steps of the testbed model over a paged cache at contexts 4k and 16k (batch 16, f32
/// and f16 caches): K/V bytes read per step over the step time, as a share of the streaming
/// bandwidth. The step also runs the (small) projections, so the share is a lower bound.
pub fn attention_bandwidth(quick: bool) -> Result<Value> {
    let bw = stream_bandwidth();
    println!("streaming read bandwidth: {:.1} GB/s", bw / 1e9);
    let cfg = Config::synthetic(64, 128, 384, 4, 4, 2, 32, true)?;
    let mut rows = vec![];
    let m = Qwen3::random(
        Config {
            max_position_embeddings: 1 << 15,
            ..cfg
        },
        0,
        &Device::Cpu,
        DType::F32,
    )?;
    let (b, steps) = (16usize, if quick { 2 } else { 8 });
    let ctxs: &[usize] = if quick { &[4096] } else { &[4096, 16384] };
    for &dtype in &[DType::F32, DType::F16] {
        for &ctx in ctxs {
            let per_block = ctx.div_ceil(64) + 1;
            let mut cache = m.new_paged_cache(64, b * per_block, dtype)?;
            let mut tables: Vec<BlockTable> = (0..b).map(|_| BlockTable::default()).collect();
            for t in &mut tables {
                anyhow::ensure!(cache.extend_filled(t, ctx, 0.01)?, "pool too small");
            }
            let snap = m.decode_weights();
            let mut times = vec![];
            for step in 0..=steps {
                let ids: Vec<[u32; 1]> = (0..b).map(|i| [((i + step) % 63 + 1) as u32]).collect();
                for t in &mut tables {
                    anyhow::ensure!(cache.reserve(t, 1)?, "pool too small");
                }
                let mut seqs: Vec<PagedSeq> = tables
                    .iter_mut()
                    .zip(&ids)
                    .map(|(t, id)| PagedSeq {
                        table: t,
                        tokens: id,
                    })
                    .collect();
                let t0 = Instant::now();
                m.forward_paged(&snap, &mut cache, &mut seqs)?;
                if step > 0 {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            let per_token = m.kv_bytes_per_token(dtype);
            let bytes = (b * (ctx + steps / 2) * per_token) as f64;
            let share = bytes / t / bw;
            println!(
                "decode attention, batch {b}, context {ctx}, {dtype:?} cache: {:.1} ms/step, {:.1} GB/s of K/V = {:.0} % of streaming bandwidth",
                t * 1e3,
                bytes / t / 1e9,
                share * 100.0
            );
            rows.push(json!({"dtype": format!("{dtype:?}"), "context": ctx, "batch": b, "ms_per_step": t * 1e3, "kv_gb_per_s": bytes / t / 1e9, "bandwidth_share": share}));
        }
    }
    Ok(json!({"stream_gb_per_s": bw / 1e9, "rows": rows}))
}
