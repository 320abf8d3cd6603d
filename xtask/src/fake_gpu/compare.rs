//! `cargo xtask fake-gpu --compare CONFIG`: one training config run by the `cuda` binary three
//! times, on the CPU, on the emulated `cuda:0` with f32 compute and with bf16 compute, and each
//! device run's metrics.jsonl held against the CPU's within the tolerances below (docs/gpu.md
//! derives them), then the f32 run again on 2 ranks over the emulated NCCL against 1. The
//! sampler-vs-trainer log-prob gap of each run is printed beside.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How far one device run may sit from the CPU run.
pub(super) struct Tolerance {
    pub name: &'static str,
    pub compute: &'static str,
    /// Relative difference allowed in the optimisation metrics (loss, grad_norm, entropy).
    pub rel: f64,
    /// Whether the rollout-side metrics (what was sampled and how it scored) must be equal.
    pub same_rollouts: bool,
    /// Largest mean |sampler − trainer| log-prob per token.
    pub logp_gap: f64,
}

/// f32: the same math in another summation order (warp trees, cuBLAS's blocking, no fused
/// multiply-add) moves each op by a few f32 ulps (~1e-7 relative); through 4 SFT and 3 GRPO
/// Adam steps the metrics moved by at most 1e-5 (bound 1e-4), and the sampler meets a near-tie
/// (the only way a token flips) with probability ~1e-6 per token, so the rollouts are the same;
/// the log-prob gap is f32 rounding (~3e-7; bound 1e-5). bf16: each matmul and norm rounds to 8 bits
/// (unit roundoff 2^-9 ≈ 2e-3); the loss, a mean over tokens, moves by a few of those (bound
/// 2e-2), a gradient norm, which sums squared per-weight errors through the backward, by more
/// (observed up to 12 %; bound 0.25), and a sampled token can flip, so the rollouts are not
/// held equal: their metrics are printed, and the log-prob gap is bounded instead.
pub(super) const TOLERANCES: [Tolerance; 2] = [
    Tolerance {
        name: "f32",
        compute: "f32",
        rel: 1e-4,
        same_rollouts: true,
        logp_gap: 1e-5,
    },
    Tolerance {
        name: "bf16",
        compute: "bf16",
        rel: 0.25,
        same_rollouts: false,
        logp_gap: 0.05,
    },
];

/// The metrics compared with a relative tolerance (the SFT loss is held to a tenth of it).
const OPTIM: [&str; 3] = ["loss", "grad_norm", "entropy"];
/// What the rollout sampled and how it scored.
const ROLLOUT: [&str; 9] = [
    "preemptions",
    "reward",
    "accuracy",
    "format_ok",
    "len_mean",
    "len_min",
    "len_max",
    "truncated",
    "zero_std_groups",
];

/// Every line of a run's metrics.jsonl.
pub(super) fn read_metrics(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))
        })
        .collect()
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-6)
}

/// The violations of `tol` by `dev` against `cpu` (empty: they agree), one line each naming the
/// phase, step, metric and both values.
pub(super) fn violations(cpu: &[Value], dev: &[Value], tol: &Tolerance) -> Vec<String> {
    let mut out = vec![];
    if cpu.len() != dev.len() {
        out.push(format!(
            "{}: {} metrics lines against the CPU's {}",
            tol.name,
            dev.len(),
            cpu.len()
        ));
    }
    for (c, d) in cpu.iter().zip(dev) {
        let phase = c["phase"].as_str().unwrap_or("?");
        let step = c["step"].as_u64().unwrap_or(0);
        let at = |k: &str| format!("{}: {phase} step {step}: {k}", tol.name);
        if d["phase"] != c["phase"] || d["step"] != c["step"] {
            out.push(format!(
                "{}: line for {phase} step {step} is {} step {}",
                tol.name, d["phase"], d["step"]
            ));
            continue;
        }
        for k in OPTIM {
            if let (Some(a), Some(b)) = (num(c, k), num(d, k)) {
                let limit = if phase == "sft" && k == "loss" {
                    tol.rel / 10.0
                } else {
                    tol.rel
                };
                if !b.is_finite() || rel(a, b) > limit {
                    out.push(format!(
                        "{}: {a} (cpu) vs {b}, relative {:.2e} > {limit:.0e}",
                        at(k),
                        rel(a, b)
                    ));
                }
            }
        }
        if tol.same_rollouts {
            for k in ROLLOUT {
                if num(c, k) != num(d, k) {
                    out.push(format!(
                        "{}: {:?} (cpu) vs {:?}",
                        at(k),
                        num(c, k),
                        num(d, k)
                    ));
                }
            }
        }
        if let Some(g) = num(d, "logp_gap") {
            if g.is_nan() || g > tol.logp_gap {
                out.push(format!("{}: {g} > {}", at("logp_gap"), tol.logp_gap));
            }
        }
    }
    out
}

/// `config` with `run.device`, `run.compute`, `run.resume` and `run.name` (the config's name,
/// the device, the compute and `label`) set, written under `dir`; returns the file and the run's
/// metrics path (a fresh run's directory is cleared first).
pub(super) fn variant(
    config: &Path,
    dir: &Path,
    device: &str,
    compute: &str,
    label: &str,
    resume: &str,
) -> Result<(PathBuf, PathBuf)> {
    let text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let mut doc: toml::Table = text
        .parse()
        .with_context(|| format!("{}: not TOML", config.display()))?;
    let run = doc
        .entry("run")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .with_context(|| format!("{}: [run] is not a table", config.display()))?;
    let base = run
        .get("name")
        .and_then(|v| v.as_str())
        .unwrap_or("default")
        .to_string();
    let name = format!("{base}-{}-{compute}-{label}", device.replace(':', ""));
    let runs = run
        .get("dir")
        .and_then(|v| v.as_str())
        .unwrap_or("runs")
        .to_string();
    run.insert("device".into(), device.into());
    run.insert("compute".into(), compute.into());
    run.insert("name".into(), name.clone().into());
    run.insert("resume".into(), resume.into());
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, toml::to_string(&doc)?)
        .with_context(|| format!("writing {}", file.display()))?;
    let run_dir = PathBuf::from(runs).join(&name);
    if resume == "never" && run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)
            .with_context(|| format!("clearing {}", run_dir.display()))?;
    }
    Ok((file, run_dir.join("metrics.jsonl")))
}

/// The comparison's table: per device run, the largest relative difference per optimisation
/// metric, whether the rollouts matched, and the largest log-prob gap.
pub(super) fn summary(cpu: &[Value], dev: &[Value], tol: &Tolerance) -> String {
    let mut worst = [0.0f64; 3];
    let mut same = true;
    let mut gap = 0.0f64;
    for (c, d) in cpu.iter().zip(dev) {
        for (i, k) in OPTIM.iter().enumerate() {
            if let (Some(a), Some(b)) = (num(c, k), num(d, k)) {
                worst[i] = worst[i].max(rel(a, b));
            }
        }
        same &= ROLLOUT.iter().all(|k| num(c, k) == num(d, k));
        gap = gap.max(num(d, "logp_gap").unwrap_or(0.0));
    }
    format!(
        "| {} | {:.1e} | {:.1e} | {:.1e} | {} | {:.1e} |",
        tol.name,
        worst[0],
        worst[1],
        worst[2],
        if same { "same" } else { "differ" },
        gap
    )
}

/// Two ranks against one on the same device (the CPU ranks test's rule, tests/it/ranks.rs): the
/// rollouts equal, the loss equal to float rounding (|Δ| ≤ 1e-6 · max(|loss|, 1); the gradient
/// sums run in another order).
pub(super) fn rank_violations(one: &[Value], two: &[Value]) -> Vec<String> {
    let mut out = vec![];
    if one.len() != two.len() {
        out.push(format!(
            "ranks: {} metrics lines against one rank's {}",
            two.len(),
            one.len()
        ));
    }
    for (a, b) in one.iter().zip(two) {
        let at = format!(
            "ranks: {} step {}",
            a["phase"].as_str().unwrap_or("?"),
            a["step"]
        );
        for k in ROLLOUT {
            if num(a, k) != num(b, k) {
                out.push(format!(
                    "{at}: {k} {:?} (one rank) vs {:?}",
                    num(a, k),
                    num(b, k)
                ));
            }
        }
        if let (Some(x), Some(y)) = (num(a, "loss"), num(b, "loss")) {
            let d = (x - y).abs();
            if d.is_nan() || d > 1e-6 * x.abs().max(1.0) {
                out.push(format!("{at}: loss {x} (one rank) vs {y}"));
            }
        }
    }
    out
}

/// A resumed run against the uninterrupted one: every line equal but its timing.
pub(super) fn resume_violations(whole: &[Value], resumed: &[Value]) -> Vec<String> {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.retain(|k, _| !k.contains("time") && !k.ends_with("_s"));
        }
        v
    };
    let mut out = vec![];
    if whole.len() != resumed.len() {
        out.push(format!(
            "resume: {} metrics lines against {}",
            resumed.len(),
            whole.len()
        ));
    }
    for (a, b) in whole.iter().zip(resumed) {
        if strip(a) != strip(b) {
            out.push(format!(
                "resume: {} step {} differs: {a} vs {b}",
                a["phase"], a["step"]
            ));
        }
    }
    out
}

pub(super) fn check(all: &[String]) -> Result<()> {
    if all.is_empty() {
        return Ok(());
    }
    bail!(
        "the emulated device's runs disagree with the CPU's:\n{}",
        all.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn within_and_beyond_the_tolerances() {
        let cpu = vec![
            json!({"phase": "sft", "step": 0, "loss": 1.0, "grad_norm": 2.0}),
            json!({"phase": "grpo", "step": 0, "loss": 0.5, "reward": 0.25, "logp_gap": 0.0}),
        ];
        let close = vec![
            json!({"phase": "sft", "step": 0, "loss": 1.000001, "grad_norm": 2.00001}),
            json!({"phase": "grpo", "step": 0, "loss": 0.50001, "reward": 0.25, "logp_gap": 1e-6}),
        ];
        assert!(violations(&cpu, &close, &TOLERANCES[0]).is_empty());
        let far = vec![
            json!({"phase": "sft", "step": 0, "loss": 1.01, "grad_norm": 2.0}),
            json!({"phase": "grpo", "step": 0, "loss": 0.5, "reward": 0.5, "logp_gap": 0.2}),
        ];
        let v = violations(&cpu, &far, &TOLERANCES[0]);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].contains("sft step 0: loss"), "{v:?}");
        assert!(
            v[1].contains("reward") && v[2].contains("logp_gap"),
            "{v:?}"
        );
        // bf16 lets the rollouts differ but not the log-prob gap.
        assert_eq!(violations(&cpu, &far, &TOLERANCES[1]).len(), 1);
        assert!(rank_violations(&cpu, &cpu).is_empty());
        assert!(resume_violations(&cpu, &cpu).is_empty());
        assert_eq!(resume_violations(&cpu, &close).len(), 2);
        assert_eq!(rank_violations(&cpu, &far).len(), 2);
        let short = &far[..1];
        assert!(violations(&cpu, short, &TOLERANCES[1])[0].contains("1 metrics lines"));
    }
}
