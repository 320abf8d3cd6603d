//! `cargo xtask bench decode`: what one rollout decode step asks of the device and how much host
//! time it costs, for the new path and, in the same run, the old one (`OLD_PATH`: the logits
//! copied to the host and sampled there, every master weight cast at each use), per batch size. Meant for the emulated
//! device (`cargo xtask fake-gpu -- bench decode --skeleton --json`), whose libcuda counts
//! launches, driver calls, syncs, allocations and bytes each way and the time spent inside the
//! emulated libraries (fake_gpu/fake_gpu.h's counters); elsewhere (a real GPU, the CPU) it says
//! the counters are unavailable and reports wall time only.
//!
//! Per batch, three rollouts of the same prompts: with one new token (prefill and the first
//! draw), with two (adding the first decode step, which on CUDA runs uncaptured and is then
//! captured into its bucket's graph) and with `--new-tokens`; the difference of the last two
//! over the difference in `RolloutStats::steps` is the steady decode step (on CUDA a graph
//! launch), and that of the first two is reported as `first_decode_step`. Host time is the wall time minus the time
//! inside the libraries (which on the emulated device includes the kernels themselves), and,
//! resolving to microseconds on a loaded machine, the rollout thread's CPU time outside them
//! (`host_cpu_ms_per_step`: neither the emulated kernels nor time descheduled count).
//!
//! Data flow: `decode` -> `measure` (per batch and path: `run` twice) -> `figures` -> the
//! printed lines and the JSON object.

use anyhow::{bail, Context, Result};
use candle_core::Device;
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use terse_model::{Config, Qwen3};
use terse_rollout::{generate_with_stats, KvBudget};

/// fake_gpu.h's `Counter` then `Reading`, in order: the names of `terse_fake_gpu_counters`'
/// fields. The last two are the reading thread's CPU clock and its share inside API calls.
pub const FIELDS: [&str; 18] = [
    "launches",
    "graph_launches",
    "driver_calls",
    "syncs",
    "allocs",
    "h2d_bytes",
    "d2h_bytes",
    "inside_ns",
    "library_calls",
    "library_launches",
    "frees",
    "alloc_bytes",
    "pool_releases",
    "graph_steps",
    "graph_step_host_ns",
    "graph_kernels",
    "thread_cpu_ns",
    "thread_inside_cpu_ns",
];

/// One reading of the emulated device's counters (`FIELDS` order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts(pub [u64; FIELDS.len()]);

impl Counts {
    /// The field `name` (one of `FIELDS`).
    pub fn get(&self, name: &str) -> u64 {
        FIELDS
            .iter()
            .position(|f| *f == name)
            .map_or(0, |i| self.0[i])
    }

    /// `self - earlier`, field by field (counters only grow).
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut d = [0u64; FIELDS.len()];
        for (i, v) in d.iter_mut().enumerate() {
            *v = self.0[i].saturating_sub(earlier.0[i]);
        }
        Counts(d)
    }
}

/// The signature of libcuda's `terse_fake_gpu_counters`.
type ReadFn = unsafe extern "C" fn(*mut u64, usize) -> usize;

/// The emulated driver's counters, read through its exported C function.
pub struct Counters {
    read: ReadFn,
    /// Keeps the library (and so `read`) loaded.
    _lib: libloading::Library,
}

impl Counters {
    /// Opens `lib` (the process's libcuda.so.1) and finds `terse_fake_gpu_counters`; the error
    /// is one line saying why there are no counters (no such library, or a real driver).
    #[allow(unsafe_code)] // dlopen of a driver library and the C function it exports
    pub fn open(lib: &str) -> std::result::Result<Counters, String> {
        // SAFETY: loading libcuda runs its initialisers, as cudarc's own dlopen of it does.
        let handle = unsafe { libloading::Library::new(lib) }
            .map_err(|e| format!("{lib} cannot be opened ({e})"))?;
        // SAFETY: fake_gpu/diagnostics.cpp defines the symbol with this C signature.
        let read = unsafe { handle.get::<ReadFn>(b"terse_fake_gpu_counters\0") }
            .map(|s| *s)
            .map_err(|_| format!("{lib} has no terse_fake_gpu_counters (a real driver)"))?;
        Ok(Counters { read, _lib: handle })
    }

    /// The counters now.
    #[allow(unsafe_code)] // a call of the emulated driver's C function
    pub fn read(&self) -> Counts {
        let mut out = [0u64; FIELDS.len()];
        // SAFETY: the function writes at most `out.len()` values into `out`.
        unsafe { (self.read)(out.as_mut_ptr(), out.len()) };
        Counts(out)
    }
}

/// What one rollout used: its steps, wall time and the counters' growth (None without them).
#[derive(Clone, Debug)]
pub struct Run {
    pub steps: usize,
    pub wall_ns: u64,
    pub counts: Option<Counts>,
}

/// The decode step's figures: `long` beyond `short` (the same prompts with one new token),
/// divided by the steps between them. Counter figures are null when `counts` are absent.
pub fn figures(long: &Run, short: &Run) -> Result<Value> {
    let steps = long.steps.saturating_sub(short.steps);
    if steps == 0 {
        bail!(
            "bench decode: the long rollout took {} steps and the one-token rollout {}: no decode step to measure",
            long.steps,
            short.steps
        );
    }
    let n = steps as f64;
    let wall_ns = long.wall_ns.saturating_sub(short.wall_ns) as f64;
    let d = match (long.counts, short.counts) {
        (Some(l), Some(s)) => Some(l.since(&s)),
        _ => None,
    };
    let mut out = serde_json::Map::new();
    out.insert("decode_steps".into(), json!(steps));
    out.extend(per_step(d.as_ref(), n, wall_ns));
    Ok(Value::Object(out))
}

/// The counters' growth `d` over `n` steps of `wall_ns` in all, per step (bench decode's decode
/// step, bench model's training step): wall time, launches as a GPU counts them, each counter,
/// and host time: wall minus the time inside the libraries, and the calling thread's CPU time
/// outside them (`host_cpu_ms_per_step`, the one that resolves a millisecond when the emulated
/// kernels take seconds). Counter figures are null without `d`.
pub fn per_step(d: Option<&Counts>, n: f64, wall_ns: f64) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    out.insert("wall_ms_per_step".into(), json!(wall_ns / n / 1e6));
    let per = |f: &dyn Fn(&Counts) -> f64| d.map_or(Value::Null, |d| json!(f(d) / n));
    let g = |name: &'static str| move |d: &Counts| d.get(name) as f64;
    // Graph launches and the libraries' kernels (GEMMs, ...) are launches as a GPU counts them.
    out.insert(
        "launches_per_step".into(),
        per(&|d| (d.get("launches") + d.get("graph_launches") + d.get("library_launches")) as f64),
    );
    for (key, field) in [
        ("kernel_launches_per_step", "launches"),
        ("graph_launches_per_step", "graph_launches"),
        ("graph_kernels_per_step", "graph_kernels"),
        ("library_launches_per_step", "library_launches"),
        ("driver_calls_per_step", "driver_calls"),
        ("library_calls_per_step", "library_calls"),
        ("d2h_bytes_per_step", "d2h_bytes"),
        ("h2d_bytes_per_step", "h2d_bytes"),
        ("syncs_per_step", "syncs"),
        ("allocs_per_step", "allocs"),
        ("alloc_bytes_per_step", "alloc_bytes"),
        ("frees_per_step", "frees"),
        ("pool_releases_per_step", "pool_releases"),
    ] {
        out.insert(key.into(), per(&g(field)));
    }
    out.insert(
        "inside_ms_per_step".into(),
        per(&|d| d.get("inside_ns") as f64 / 1e6),
    );
    out.insert(
        "host_ms_per_step".into(),
        per(&|d| (wall_ns - d.get("inside_ns") as f64).max(0.0) / 1e6),
    );
    out.insert(
        "host_cpu_ms_per_step".into(),
        per(&|d| {
            d.get("thread_cpu_ns")
                .saturating_sub(d.get("thread_inside_cpu_ns")) as f64
                / 1e6
        }),
    );
    // A replayed step's own host work, launch to launch of one graph: the measure that
    // resolves well under a millisecond, since nothing run once (prefill, capture) enters it.
    out.insert(
        "host_cpu_ms_per_graph_step".into(),
        match d {
            Some(d) if d.get("graph_steps") > 0 => {
                json!(d.get("graph_step_host_ns") as f64 / d.get("graph_steps") as f64 / 1e6)
            }
            _ => Value::Null,
        },
    );
    out
}

/// `baseline / new` for `key`, null when either is missing or `new` is 0.
pub fn ratio(baseline: &Value, new: &Value, key: &str) -> Value {
    match (baseline[key].as_f64(), new[key].as_f64()) {
        (Some(b), Some(n)) if n > 0.0 => json!(b / n),
        _ => Value::Null,
    }
}

/// The skeleton: Qwen3-0.6B's layers, head layout and vocabulary with a tiny hidden size (64)
/// and intermediate size (128), so that the CPU (and the emulated device) can run it.
pub fn skeleton() -> Result<Config> {
    let q = Config::qwen3_0_6b();
    Ok(Config::synthetic(
        q.vocab_size,
        64,
        128,
        q.num_hidden_layers,
        q.num_attention_heads,
        q.num_key_value_heads,
        q.head_dim,
        q.tie_word_embeddings,
    )?)
}

/// Sets (or, with None, removes) an environment variable, returning its previous value.
pub fn set_env(key: &str, value: Option<&str>) -> Option<String> {
    let old = std::env::var(key).ok();
    match value {
        Some(v) => std::env::set_var(key, v),
        None => std::env::remove_var(key),
    }
    old
}

/// KV blocks of 16 tokens (the default is 64): a block of the skeleton is 1.8 MB, and a batch of
/// 256 short rows then fits the emulated device's 16 GiB with the rest of the rollout.
const BLOCK_SIZE: usize = 16;

/// The settings of one measurement: prompt and completion lengths, and the counters if any.
pub struct Setup<'a> {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub counters: Option<&'a dyn Fn() -> Counts>,
}

/// One rollout of `b` prompts with `new` tokens each: steps, wall time, counters' growth.
fn run(m: &Qwen3, b: usize, new: usize, setup: &Setup) -> Result<Run> {
    let none = |_: &[u32]| String::new();
    let ps = crate::bench_rollout::prompts(b, setup.prompt_tokens, m.config.vocab_size);
    let mut params = crate::bench_rollout::params(new, KvBudget::Auto);
    params.paging.block_size = BLOCK_SIZE;
    let before = setup.counters.map(|c| c());
    let t0 = Instant::now();
    let (samples, stats) = generate_with_stats(m, &ps, 1, &params, 0, &none)?;
    let wall_ns = t0.elapsed().as_nanos() as u64;
    let after = setup.counters.map(|c| c());
    let tokens: usize = samples.iter().map(|s| s.tokens.len()).sum();
    if tokens != b * new {
        bail!(
            "bench decode: batch {b} made {tokens} tokens, not {}",
            b * new
        );
    }
    Ok(Run {
        steps: stats.steps,
        wall_ns,
        counts: before.zip(after).map(|(b, a)| a.since(&b)),
    })
}

/// The switches that turn the new decode path into the old one, with the old path's values:
/// the host sampler, every master weight cast at each use, no CUDA graphs (for when they exist).
const OLD_PATH: [(&str, &str); 3] = [
    ("TERSE_HOST_SAMPLER", "1"),
    ("TERSE_DECODE_CASTS", "1"),
    ("TERSE_CUDA_GRAPHS", "0"),
];

/// Per batch: the new decode step, then the old path's (`OLD_PATH`) as "baseline", and
/// baseline/new ratios.
pub fn measure(m: &Qwen3, batches: &[usize], setup: &Setup) -> Result<Value> {
    let path = |host: bool, b: usize, new: usize| -> Result<Run> {
        let saved: Vec<_> = OLD_PATH
            .iter()
            .map(|&(k, v)| (k, set_env(k, host.then_some(v))))
            .collect();
        let r = run(m, b, new, setup);
        for (k, old) in saved {
            set_env(k, old.as_deref());
        }
        r
    };
    // Module loads, handles and first allocations happen here, outside the figures.
    for host in [false, true] {
        path(host, 1, 2)?;
    }
    let mut out = serde_json::Map::new();
    for &b in batches {
        let mut sides = vec![];
        for host in [false, true] {
            let one = path(host, b, 1)?;
            let two = path(host, b, 2)?;
            let long = path(host, b, setup.new_tokens)?;
            let mut steady = figures(&long, &two)?;
            steady["first_decode_step"] = figures(&two, &one)?;
            sides.push(steady);
        }
        let [new, baseline]: [Value; 2] = sides.try_into().map_err(|_| {
            anyhow::anyhow!("bench decode: batch {b} lacks the new path or the baseline")
        })?;
        let ratios = json!({
            "d2h_bytes": ratio(&baseline, &new, "d2h_bytes_per_step"),
            "launches": ratio(&baseline, &new, "launches_per_step"),
            "host_ms": ratio(&baseline, &new, "host_ms_per_step"),
            "host_cpu_ms": ratio(&baseline, &new, "host_cpu_ms_per_step"),
            // The graph step's own host work against the uncaptured step's (the baseline has
            // no graph: its host CPU time per step).
            "host_cpu_ms_graph": match (baseline["host_cpu_ms_per_step"].as_f64(), new["host_cpu_ms_per_graph_step"].as_f64()) {
                (Some(b), Some(n)) if n > 0.0 => json!(b / n),
                _ => Value::Null,
            },
        });
        let Value::Object(mut new) = new else {
            bail!("bench decode: the new path's figures are not an object");
        };
        new.insert("baseline".into(), baseline);
        new.insert("baseline_over_new".into(), ratios);
        out.insert(b.to_string(), Value::Object(new));
    }
    Ok(Value::Object(out))
}

/// `cargo xtask bench decode`.
pub fn decode(
    as_json: bool,
    skeleton_shape: bool,
    batches: &[usize],
    new_tokens: usize,
    prompt_tokens: usize,
    out: Option<&Path>,
) -> Result<ExitCode> {
    if batches.is_empty() || batches.contains(&0) {
        bail!("--batches {batches:?}: give batch sizes of at least 1, e.g. --batches 1,64,256");
    }
    if new_tokens < 3 {
        bail!(
            "--new-tokens {new_tokens}: at least 3 (a decode step after the first, which captures)"
        );
    }
    if prompt_tokens == 0 {
        bail!("--prompt-tokens 0: a prompt needs at least one token");
    }
    let spec = if cfg!(feature = "cuda") {
        "cuda:0"
    } else {
        "cpu"
    };
    let (dev, dtype) = terse_model::device::select(spec)?;
    let cfg = if skeleton_shape {
        skeleton()?
    } else {
        Config::qwen3_0_6b()
    };
    let shape = json!({"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
        "intermediate": cfg.intermediate_size, "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab": cfg.vocab_size});
    let m = Qwen3::random(cfg, 0, &dev, dtype)?;
    let counters = match &dev {
        Device::Cpu => Err("the device is the CPU".to_string()),
        _ => Counters::open("libcuda.so.1"),
    };
    let reader = counters.as_ref().ok().map(|c| move || c.read());
    if let Err(why) = &counters {
        println!("bench decode: no device counters ({why}): wall time only");
    }
    let setup = Setup {
        prompt_tokens,
        new_tokens,
        counters: reader.as_ref().map(|r| r as &dyn Fn() -> Counts),
    };
    let rows = measure(&m, batches, &setup)?;
    for b in batches {
        print_row(*b, &rows[b.to_string()]);
    }
    let source = match &counters {
        Ok(_) => Value::from("fake-gpu"),
        Err(why) => Value::from(why.as_str()),
    };
    let report = json!({
        "bench": "decode", "device": spec, "compute_dtype": format!("{dtype:?}"),
        "shape": if skeleton_shape { "skeleton" } else { "qwen3_0_6b" }, "model": shape,
        "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
        "counters": source,
        "graphs": "the new path: one CUDA graph per batch bucket (powers of two), captured at the bucket's first decode step (first_decode_step); the baseline: none (TERSE_CUDA_GRAPHS=0)",
        "batches": rows,
    });
    emit(&report, out, as_json)
}

/// A bench's JSON report: written to `out` (pretty) and/or printed on one line.
pub fn emit(report: &Value, out: Option<&Path>, as_json: bool) -> Result<ExitCode> {
    if let Some(path) = out {
        std::fs::write(path, format!("{report:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if as_json {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One batch's line: the new path's figures and the baseline's, side by side.
fn print_row(b: usize, row: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
    let ms3 = |v: &Value| {
        let at = |k: &str| v[k].as_f64().map(|x| format!("{x:.3}"));
        match (at("host_cpu_ms_per_step"), at("host_cpu_ms_per_graph_step")) {
            (Some(a), Some(g)) => format!("{a}; {g} launch to launch"),
            (a, _) => a.unwrap_or_else(|| "-".to_string()),
        }
    };
    let base = &row["baseline"];
    println!(
        "decode batch {b}: per step {} ms wall, {} ms host ({} ms of host CPU), {} launches, {} driver calls, {} syncs, {} allocs, {} B down, {} B up; baseline {} ms wall, {} ms host ({} ms of host CPU), {} launches, {} B down (x{} fewer bytes down, x{} fewer launches)",
        f(row, "wall_ms_per_step"), f(row, "host_ms_per_step"), ms3(row), f(row, "launches_per_step"),
        f(row, "driver_calls_per_step"), f(row, "syncs_per_step"), f(row, "allocs_per_step"),
        f(row, "d2h_bytes_per_step"), f(row, "h2d_bytes_per_step"),
        f(base, "wall_ms_per_step"), f(base, "host_ms_per_step"), ms3(base), f(base, "launches_per_step"),
        f(base, "d2h_bytes_per_step"),
        f(&row["baseline_over_new"], "d2h_bytes"), f(&row["baseline_over_new"], "launches"),
    );
}

#[cfg(test)]
#[path = "bench_decode_tests.rs"]
mod tests;
