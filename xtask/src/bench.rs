//! `cargo xtask bench model`: training forward+backward throughput on a testbed-sized and a
//! Qwen3-0.6B-shaped model (random weights), and the peak memory and time of the fused log-prob
//! path against the naive full-vocabulary log-softmax, measured in the same run; `bench optim`:
//! the AdamW step against a plain SGD update; `bench rollout`: decode with and without the KV
//! cache; `bench collective` (bench_collective.rs): the CPU data-parallel exchange; `bench
//! verify` (bench_verify.rs): the math verifier on its adversarial corpus; `bench decode`
//! (bench_decode.rs): a decode step's launches, syncs, bytes and host time on the emulated device;
//! `bench model --skeleton` (bench_train.rs): a training step's launches and bytes allocated there.

use crate::mem;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Instant;
use terse_model::{logprob, Batch, Config, Padding, Qwen3};

#[derive(clap::Subcommand)]
pub enum What {
    /// Model forward+backward tokens/s and log-prob path memory.
    Model {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Smaller sizes (a smoke run of the bench itself).
        #[arg(long)]
        quick: bool,
        /// Instead: one training step of a Qwen3-0.6B-shaped skeleton (hidden size 64), its
        /// launches and bytes allocated on the emulated device's counters (`cargo xtask
        /// fake-gpu -- bench model --skeleton`), for the new path and, in the same run, the
        /// composite one (`TERSE_FUSED=0`) as the baseline (bench_train.rs).
        #[arg(long)]
        skeleton: bool,
        /// With --skeleton: also write the JSON object (pretty) to this file.
        #[arg(long, requires = "skeleton")]
        out: Option<std::path::PathBuf>,
    },
    /// Decode tokens/s with and without the KV cache; a GRPO-shaped rollout unbounded and at 1/8
    /// of its KV memory; HF generate's ratio; decode attention's share of memory bandwidth.
    Rollout {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Smaller sizes (a smoke run of the bench itself).
        #[arg(long)]
        quick: bool,
        /// Only the testbed-sized model (skip the Qwen3-0.6B shape).
        #[arg(long)]
        tiny_only: bool,
        /// A Python with torch and transformers, for HF generate's ratio
        /// (scripts/bench_hf_generate.py).
        #[arg(long, default_value = "python3")]
        python: String,
    },
    /// Training forward+backward peak memory and tokens/s of a Qwen3-0.6B slice at 1k..16k
    /// tokens: composite attention with every activation kept vs flash + layer checkpointing.
    TrainMemory {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// The longest sequence (doubling from 1024).
        #[arg(long, default_value_t = 16384)]
        max_t: usize,
    },
    /// Seconds per testbed GRPO step (before/after flash attention and packing) and TRL's
    /// GRPOTrainer on the same checkpoint and settings.
    GrpoStep {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// A Python with torch, transformers and trl (scripts/bench_trl_grpo.py says how).
        #[arg(long, default_value = "python3")]
        python: String,
        /// Timed steps (after one warm-up step).
        #[arg(long, default_value_t = 5)]
        steps: usize,
    },
    /// AdamW step time for ~1M and ~100M parameters against a plain SGD update.
    Optim {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
    /// The CPU data-parallel backend's all-reduce and reduce-scatter + all-gather bandwidth at 2
    /// and 4 ranks, against a copy of the same buffer.
    Collective {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Buffer size in MiB (a gradient of ~mib/4 M parameters).
        #[arg(long, default_value_t = 64)]
        mib: usize,
    },
    /// What a rollout decode step asks of the device (launches, driver calls, syncs,
    /// allocations, bytes each way; host time = wall - time inside the libraries) on the
    /// emulated device's counters (`cargo xtask fake-gpu -- bench decode --skeleton`), for the
    /// device sampler and, in the same run, the host sampler (`TERSE_HOST_SAMPLER=1`) as the
    /// baseline; elsewhere wall time only.
    Decode {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Qwen3-0.6B's layers, heads and vocabulary with hidden size 64 (default: the whole
        /// Qwen3-0.6B shape).
        #[arg(long)]
        skeleton: bool,
        /// Batch sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,64,256")]
        batches: Vec<usize>,
        /// New tokens per sample (the steady decode steps measured are all but the first two).
        #[arg(long, default_value_t = 4)]
        new_tokens: usize,
        /// Prompt tokens per sample.
        #[arg(long, default_value_t = 8)]
        prompt_tokens: usize,
        /// Also write the JSON object (pretty) to this file.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// The math verifier on its adversarial corpus: worst time per completion and per 1k
    /// characters against a normal answer (target: ≤ 10 ms for 40k characters; fails above).
    Verify {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(w: &What) -> Result<ExitCode> {
    match w {
        What::Model {
            json,
            skeleton: true,
            out,
            ..
        } => crate::bench_train::train_step(*json, out.as_deref()),
        What::Model { json, quick, .. } => model(*json, *quick),
        What::Optim { json } => optim(*json),
        What::Collective { json, mib } => crate::bench_collective::collective(*json, *mib),
        What::Verify { json } => crate::bench_verify::verify(*json),
        What::Decode {
            json,
            skeleton,
            batches,
            new_tokens,
            prompt_tokens,
            out,
        } => crate::bench_decode::decode(
            *json,
            *skeleton,
            batches,
            *new_tokens,
            *prompt_tokens,
            out.as_deref(),
        ),
        What::GrpoStep {
            json,
            python,
            steps,
        } => crate::bench_step::grpo_step(*json, python, *steps),
        What::TrainMemory { json, max_t } => crate::bench_memory::train_memory(*json, *max_t),
        What::Rollout {
            json,
            quick,
            tiny_only,
            python,
        } => rollout(*json, *quick, *tiny_only, python),
    }
}

/// Which head the loss goes through.
#[derive(Clone, Copy)]
enum Head {
    Fused,
    Naive,
}

/// Seconds per forward+backward of a summed token log-prob loss over a (b, t) batch.
fn fwd_bwd_seconds(model: &Qwen3, b: usize, t: usize, head: Head, iters: usize) -> Result<f64> {
    let v = model.config.vocab_size as u32;
    let rows: Vec<Vec<u32>> = (0..b)
        .map(|r| (0..t).map(|j| ((r * 131 + j * 17) as u32) % v).collect())
        .collect();
    let batch = Batch::from_rows(&rows, 0, Padding::Right, model.device())?;
    let (sel, targets) = batch.next_token_selection();
    let step = || -> Result<()> {
        let lp = match head {
            Head::Fused => model.token_logprobs(&batch, &sel, &targets, true)?,
            Head::Naive => {
                let h = model.hidden_states(&batch, true)?;
                let (bb, tt, hs) = h.dims3()?;
                let idx = Tensor::from_slice(&sel, sel.len(), model.device())?;
                let hsel = h.reshape((bb * tt, hs))?.index_select(&idx, 0)?; // (N, H)
                let name = if model.config.tie_word_embeddings {
                    "model.embed_tokens.weight"
                } else {
                    "lm_head.weight"
                };
                let tg = Tensor::from_slice(&targets, targets.len(), model.device())?;
                logprob::naive_token_logprobs(&hsel, model.vars()[name].as_tensor(), &tg)?
            }
        };
        let grads = lp.sum_all()?.backward()?;
        drop(grads);
        Ok(())
    };
    step()?; // warm-up
    let t0 = Instant::now();
    for _ in 0..iters {
        step()?;
    }
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

/// Peak extra heap bytes and seconds of forward+backward through one log-prob path.
fn logprob_path(n: usize, h: usize, v: usize, head: Head) -> Result<(usize, f64)> {
    let dev = Device::Cpu;
    let hid = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (n, h), &dev)? * 0.1)?)?;
    let w = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (v, h), &dev)? * 0.02)?)?;
    let tg = Tensor::from_vec(
        (0..n as u32)
            .map(|i| (i * 7919) % v as u32)
            .collect::<Vec<_>>(),
        n,
        &dev,
    )?;
    let base = mem::reset_peak();
    let t0 = Instant::now();
    let lp = match head {
        Head::Fused => logprob::token_logprobs(
            hid.as_tensor(),
            w.as_tensor(),
            &tg,
            logprob::DEFAULT_CHUNK_ROWS,
        )?,
        Head::Naive => logprob::naive_token_logprobs(hid.as_tensor(), w.as_tensor(), &tg)?,
    };
    let grads = lp.sum_all()?.backward()?;
    let secs = t0.elapsed().as_secs_f64();
    let peak = mem::peak_above(base);
    drop(grads);
    Ok((peak, secs))
}

fn model(as_json: bool, quick: bool) -> Result<ExitCode> {
    let dev = Device::Cpu;
    let mut out = serde_json::Map::new();
    out.insert("device".into(), json!("cpu"));
    out.insert(
        "threads".into(),
        json!(candle_core::utils::get_num_threads()),
    );

    // Testbed-sized model (~1M parameters).
    let tiny = Config::synthetic(64, 128, 384, 4, 4, 2, 32, true)?;
    let tiny_params = tiny.num_parameters();
    let mut m = Qwen3::random(tiny, 0, &dev, DType::F32)?;
    let (b, t) = if quick { (4, 64) } else { (8, 128) };
    let iters = if quick { 2 } else { 5 };
    let s = fwd_bwd_seconds(&m, b, t, Head::Fused, iters)?;
    // The composite attention (the path before flash attention) in the same run.
    m.options.flash = false;
    let sc = fwd_bwd_seconds(&m, b, t, Head::Fused, iters)?;
    let (tiny_tps, composite_tps) = ((b * t) as f64 / s, (b * t) as f64 / sc);
    println!(
        "tiny ({tiny_params} params) fwd+bwd  batch {b}x{t}: {tiny_tps:.0} tokens/s flash, {composite_tps:.0} composite (x{:.2})",
        tiny_tps / composite_tps
    );
    out.insert(
        "tiny".into(),
        json!({"params": tiny_params, "batch": b, "seq": t, "fwd_bwd_tokens_per_s": tiny_tps,
               "composite_tokens_per_s": composite_tps}),
    );
    drop(m);

    // Qwen3-0.6B shape, random weights; a small batch because this is a CPU.
    let cfg = if quick {
        Config::synthetic(151_936, 1024, 3072, 2, 16, 8, 128, true)?
    } else {
        Config::qwen3_0_6b()
    };
    let layers = cfg.num_hidden_layers;
    let m = Qwen3::random(cfg, 0, &dev, DType::F32)?;
    let (b, t) = if quick { (1, 32) } else { (2, 64) };
    let sf = fwd_bwd_seconds(&m, b, t, Head::Fused, 1)?;
    let sn = fwd_bwd_seconds(&m, b, t, Head::Naive, 1)?;
    let (tf, tn) = ((b * t) as f64 / sf, (b * t) as f64 / sn);
    println!("qwen3-0.6b shape ({layers} layers) fwd+bwd batch {b}x{t}: fused head {tf:.1} tokens/s, naive head {tn:.1} tokens/s (x{:.2})", tf / tn);
    out.insert("qwen3_0_6b".into(), json!({"layers": layers, "batch": b, "seq": t, "fused_tokens_per_s": tf, "naive_tokens_per_s": tn, "speedup": tf / tn}));
    drop(m);

    // The log-prob path alone at Qwen3 vocabulary size.
    let (n, h, v) = if quick {
        (256, 256, 151_936)
    } else {
        (2048, 1024, 151_936)
    };
    let (pf, sf) = logprob_path(n, h, v, Head::Fused)?;
    let (pn, sn) = logprob_path(n, h, v, Head::Naive)?;
    let mib = |x: usize| x as f64 / (1 << 20) as f64;
    println!(
        "log-prob fwd+bwd N={n} H={h} V={v}: fused {:.0} MiB peak {:.2}s, naive {:.0} MiB peak {:.2}s (memory x{:.2} less)",
        mib(pf), sf, mib(pn), sn, pn as f64 / pf as f64
    );
    out.insert(
        "logprob".into(),
        json!({"rows": n, "hidden": h, "vocab": v, "chunk_rows": logprob::DEFAULT_CHUNK_ROWS,
               "fused_peak_mib": mib(pf), "naive_peak_mib": mib(pn), "memory_ratio": pn as f64 / pf as f64,
               "fused_s": sf, "naive_s": sn}),
    );
    if as_json {
        println!("{}", Value::Object(out));
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench optim`: seconds per AdamW step (with global-norm clipping) for ~1M and ~100M f32
/// parameters, against a plain SGD update over the same tensors as the baseline.
pub fn optim(as_json: bool) -> Result<ExitCode> {
    use std::collections::BTreeMap;
    use terse_optim::{clip_grad_norm, AdamW, AdamWConfig, Grads};
    let dev = Device::Cpu;
    let mut out = serde_json::Map::new();
    for (label, n_tensors, size) in [("1m", 8usize, 131_072usize), ("100m", 24, 4_194_304)] {
        let params: BTreeMap<String, Var> = (0..n_tensors)
            .map(|i| {
                Ok((
                    format!("p{i:02}"),
                    Var::from_tensor(&Tensor::randn(0f32, 1.0, size, &dev)?)?,
                ))
            })
            .collect::<Result<_>>()?;
        let grads: Grads = params
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().randn_like(0.0, 1e-3)?)))
            .collect::<Result<_>>()?;
        let mut opt = AdamW::new(AdamWConfig::default(), &params)?;
        let iters = if size > 1_000_000 { 3 } else { 20 };
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            f()?;
            let t0 = Instant::now();
            for _ in 0..iters {
                f()?;
            }
            Ok(t0.elapsed().as_secs_f64() / iters as f64)
        };
        let adamw = time(&mut || {
            let mut g = grads.clone();
            clip_grad_norm(&mut g, 1.0)?;
            opt.step(&params, &g, 1e-4)?;
            Ok(())
        })?;
        let sgd = time(&mut || {
            for (k, v) in &params {
                v.set(&(v.as_tensor() - (&grads[k] * 1e-4)?)?)?;
            }
            Ok(())
        })?;
        let n = n_tensors * size;
        println!("optim {label} ({n} params): adamw+clip {:.2} ms/step, sgd baseline {:.2} ms/step (x{:.2})", adamw * 1e3, sgd * 1e3, adamw / sgd);
        out.insert(label.into(), json!({"params": n, "adamw_clip_ms": adamw * 1e3, "sgd_ms": sgd * 1e3, "ratio": adamw / sgd}));
    }
    if as_json {
        println!("{}", Value::Object(out));
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench rollout`: decode tokens/s with the KV cache and without it, for a testbed-sized and a
/// Qwen3-0.6B-shaped model (random weights); then `bench_rollout`'s paged-cache rows.
pub fn rollout(as_json: bool, quick: bool, tiny_only: bool, python: &str) -> Result<ExitCode> {
    use crate::bench_rollout::prompts;
    use terse_rollout::{generate, greedy_no_cache, KvBudget, KvCacheDtype};
    let dev = Device::Cpu;
    let none = |_: &[u32]| String::new();
    let params = |n: usize| crate::bench_rollout::params(n, KvBudget::Auto);
    let mut out = serde_json::Map::new();
    let shapes = [
        (
            "tiny",
            Config::synthetic(64, 128, 384, 4, 4, 2, 32, true)?,
            if quick { vec![1, 16] } else { vec![1, 16, 64] },
            if quick { 64 } else { 256 },
        ),
        (
            "qwen3_0_6b",
            Config::qwen3_0_6b(),
            vec![1, 16],
            if quick { 4 } else { 16 },
        ),
    ];
    for (label, cfg, batches, new) in shapes.into_iter().take(if tiny_only { 1 } else { 2 }) {
        let v = cfg.vocab_size;
        let m = Qwen3::random(cfg, 0, &dev, DType::F32)?;
        let mut rows = vec![];
        for b in batches {
            let ps = prompts(b, 32, v);
            let t0 = Instant::now();
            let s = generate(&m, &ps, 1, &params(new), 0, &none)?;
            let secs = t0.elapsed().as_secs_f64();
            let toks: usize = s.iter().map(|x| x.tokens.len()).sum();
            // Without the cache: a full forward per token (fewer tokens: it is quadratic).
            let nc_new = (new / 8).max(2);
            let raw: Vec<Vec<u32>> = ps.iter().map(|p| p.tokens.clone()).collect();
            let t1 = Instant::now();
            greedy_no_cache(&m, &raw, nc_new, &dev)?;
            let nc = (b * nc_new) as f64 / t1.elapsed().as_secs_f64();
            let tps = toks as f64 / secs;
            println!("rollout {label} batch {b:>2}: prompt 32 + {new} new: {tps:.0} tokens/s with KV cache, {nc:.0} tokens/s without ({nc_new} new) (x{:.1})", tps / nc);
            rows.push(json!({"batch": b, "new_tokens": new, "kv_tokens_per_s": tps, "no_cache_tokens_per_s": nc, "speedup": tps / nc}));
        }
        out.insert(label.into(), Value::Array(rows));
    }
    // Batch 64 again with the opt-in f16 KV cache.
    let m = Qwen3::random(
        Config::synthetic(64, 128, 384, 4, 4, 2, 32, true)?,
        0,
        &dev,
        DType::F32,
    )?;
    if !quick {
        let ps = prompts(64, 32, 64);
        let mut p = params(256);
        p.kv_cache = KvCacheDtype::F16;
        let t0 = Instant::now();
        let s = generate(&m, &ps, 1, &p, 0, &none)?;
        let toks: usize = s.iter().map(|x| x.tokens.len()).sum();
        let tps = toks as f64 / t0.elapsed().as_secs_f64();
        println!("rollout tiny batch 64, f16 KV cache: {tps:.0} tokens/s");
        out.insert(
            "tiny_f16_cache".into(),
            json!({"batch": 64, "kv_tokens_per_s": tps}),
        );
    }
    // The paged cache under a budget, HF's generate for the ratio, and the attention's share of
    // the memory bandwidth at long contexts.
    out.insert(
        "paged".into(),
        crate::bench_rollout::paged(quick, tiny_only)?,
    );
    if !quick {
        let hf = crate::bench_rollout::hf_generate(python);
        let ours = out["tiny"]
            .as_array()
            .and_then(|r| r.iter().find(|x| x["batch"] == 64))
            .and_then(|x| x["kv_tokens_per_s"].as_f64());
        let theirs = hf["hf_generate_tokens_per_s"]["64"].as_f64();
        match (ours, theirs) {
            (Some(a), Some(b)) => println!(
                "HF transformers generate, testbed shape, batch 64: {b:.0} tokens/s; terse x{:.1}",
                a / b
            ),
            _ => println!("HF transformers generate skipped: {}", hf["skipped"]),
        }
        out.insert("hf_generate".into(), hf);
    }
    out.insert(
        "attention_bandwidth".into(),
        crate::bench_rollout::attention_bandwidth(quick)?,
    );
    if as_json {
        println!("{}", Value::Object(out));
    }
    Ok(ExitCode::SUCCESS)
}
