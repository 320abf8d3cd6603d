//! `cargo xtask bench grpo-step`: seconds per GRPO step of the testbed (configs/default.toml's
//! GRPO settings: 8 prompts x G 8, at most 96 new tokens, from tests/fixtures/testbed-sft),
//! split into rollout / log-prob / update, for each training path (composite attention and
//! padded rows, as before flash attention; flash attention with packing, the default), and
//! TRL's GRPOTrainer on the same checkpoint and settings in the same run
//! (scripts/bench_trl_grpo.py, when the Python it is given has trl).

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, ExitCode};
use terse_train::config::{AttentionKind, Init};
use terse_train::{GrpoTrainer, RunConfig};

/// One step's seconds: total, rollout, reference log-probs, update.
type Times = (f64, f64, f64, f64);

/// Median seconds per step (and its parts) over `steps` steps after one warm-up step.
fn terse_steps(attention: AttentionKind, packing: bool, steps: usize) -> Result<Value> {
    let mut cfg = RunConfig::from_file(Path::new("configs/default.toml"))?;
    cfg.model.path = "tests/fixtures/testbed-sft".into();
    cfg.model.init = Init::Checkpoint;
    // The bench's fixed shape (the TRL script's too): testbed v1, the fixture's task, 8 x G 8.
    cfg.data = terse_train::config::DataSection::default();
    cfg.grpo.prompts_per_step = 8;
    cfg.grpo.group_size = 8;
    cfg.model.attention = attention;
    cfg.grpo.packing = packing;
    cfg.sft.steps = 0;
    let mut trainer = GrpoTrainer::builder(cfg).build()?;
    let mut times = vec![];
    for i in 0..=steps {
        let t0 = std::time::Instant::now();
        let r = trainer.step()?;
        let total = t0.elapsed().as_secs_f64();
        if i > 0 {
            times.push((total, r.time.rollout_s, r.time.logprob_s, r.time.update_s));
        }
    }
    let median = |f: fn(&Times) -> f64| {
        let mut v: Vec<f64> = times.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(
        json!({"s_per_step": median(|t| t.0), "rollout_s": median(|t| t.1),
              "logprob_s": median(|t| t.2), "update_s": median(|t| t.3)}),
    )
}

/// TRL's seconds per step through `python` (None when it cannot run, with the reason).
fn trl_steps(python: &str, steps: usize) -> Result<Value> {
    let out = Command::new(python)
        .args([
            "scripts/bench_trl_grpo.py",
            "tests/fixtures/testbed-sft",
            &steps.to_string(),
        ])
        .output()
        .with_context(|| format!("running {python} scripts/bench_trl_grpo.py"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        Some(v) if out.status.success() => Ok(v),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            anyhow::bail!(
                "TRL did not run: {}",
                err.lines().last().unwrap_or("no output")
            )
        }
    }
}

pub fn grpo_step(as_json: bool, python: &str, steps: usize) -> Result<ExitCode> {
    let before = terse_steps(AttentionKind::Composite, false, steps)?;
    let after = terse_steps(AttentionKind::Flash, true, steps)?;
    let s = |v: &Value| v["s_per_step"].as_f64().unwrap_or(f64::NAN);
    println!(
        "terse GRPO step (8 x 8, max 96 new): composite + padded {:.3} s, flash + packed {:.3} s (x{:.2}); update {:.3} s -> {:.3} s",
        s(&before), s(&after), s(&before) / s(&after),
        before["update_s"].as_f64().unwrap_or(0.0), after["update_s"].as_f64().unwrap_or(0.0)
    );
    let trl = match trl_steps(python, steps) {
        Ok(v) => {
            let t = v["trl_s_per_step"].as_f64().unwrap_or(f64::NAN);
            println!(
                "TRL GRPOTrainer: {t:.3} s per step; terse is x{:.2} faster",
                t / s(&after)
            );
            v
        }
        Err(e) => {
            println!("TRL skipped: {e:#}");
            json!({"skipped": format!("{e:#}")})
        }
    };
    if as_json {
        println!(
            "{}",
            json!({"composite_padded": before, "flash_packed": after, "trl": trl})
        );
    }
    Ok(ExitCode::SUCCESS)
}
