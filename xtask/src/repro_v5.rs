//! `cargo xtask repro --testbed v5`: study v5 as docs/v5/plan.md fixes it. For each checkpoint k
//! of the range, a fresh SFT checkpoint from configs/v5.toml at SFT seed 500 + k
//! (runs/repro-v5/ck<k>/sft), its one base evaluation (the row `base`: 0 GRPO steps at the 4x
//! evaluation) and every row x GRPO seed 200 + i from it; the runs' metrics.jsonl then become
//! the per-checkpoint tables and results.md (report_v5.rs). SFT and GRPO runs are child
//! `xtask sft` / `xtask train` processes, two at a time on one thread each (repro.rs's
//! run_children); the test runs the same jobs in process.

use anyhow::{bail, Context, Result};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::methods::{merge, Testbed};
use crate::report_v5::{Plan, Written, PLANNED_CHECKPOINTS};
use crate::repro::{method_config, Args};

/// The first SFT seed (section 3).
const SFT_SEED: u64 = 500;

/// `--checkpoints`: `N` (0..N) or `a-b` (inclusive).
pub fn parse_range(s: &str) -> Result<Range<usize>> {
    let bad = || format!("--checkpoints `{s}`: expected a count N or a range a-b");
    let r = match s.split_once('-') {
        Some((a, b)) => {
            let (a, b): (usize, usize) =
                (a.parse().with_context(bad)?, b.parse().with_context(bad)?);
            a..b + 1
        }
        None => 0..s.parse::<usize>().with_context(bad)?,
    };
    if r.is_empty() {
        bail!("{}: no checkpoint", bad());
    }
    Ok(r)
}

fn table(text: &str, what: &str) -> Result<toml::Table> {
    toml::from_str(text).with_context(|| format!("parsing {what}"))
}

/// Checkpoint k's SFT config: configs/v5.toml's with run.dir runs/repro-v5 (the base config's
/// run.dir), run.name ck<k>, run.seed 500 + k (and `sft_steps` with its schedule, a smoke run).
pub fn sft_config(sft: &str, dir: &Path, k: usize, sft_steps: Option<u64>) -> Result<String> {
    let mut doc = table(sft, "the SFT config")?;
    let mut over = format!(
        "[run]\ndir = \"{}\"\nname = \"ck{k}\"\nseed = {}\n",
        dir.display(),
        SFT_SEED + k as u64
    );
    if let Some(n) = sft_steps {
        over.push_str(&format!(
            "[sft]\nsteps = {n}\nschedule = {{ peak_lr = 3e-3, warmup_steps = 0, decay = \"constant\", total_steps = {n}, min_lr = 3e-3 }}\n"
        ));
    }
    merge(&mut doc, table(&over, "the SFT overrides")?);
    Ok(toml::to_string(&doc)?)
}

/// The GRPO base config of checkpoint k: model.path its SFT checkpoint, run.dir its folder
/// (and `steps` GRPO steps, a smoke run).
pub fn ck_base(base: &str, dir: &Path, k: usize, steps: Option<u64>) -> Result<String> {
    let mut doc = table(base, "the base config")?;
    let ck = dir.join(format!("ck{k}"));
    let mut over = format!(
        "[run]\ndir = \"{}\"\n[model]\npath = \"{}\"\n",
        ck.display(),
        ck.join("sft").display()
    );
    if let Some(n) = steps {
        over.push_str(&format!(
            "[grpo]\nsteps = {n}\nschedule = {{ peak_lr = 3e-4, warmup_steps = 0, decay = \"constant\", total_steps = {n}, min_lr = 3e-4 }}\n"
        ));
    }
    merge(&mut doc, table(&over, "the checkpoint overrides")?);
    Ok(toml::to_string(&doc)?)
}

/// The base evaluation's config: checkpoint k's base config with 0 GRPO steps (one evaluation
/// of the SFT checkpoint, eval.at_start = false), run `base-s0`.
pub fn base_eval_config(ck_base: &str) -> Result<String> {
    let mut doc = table(ck_base, "the checkpoint's base config")?;
    let over = "[run]\nname = \"base-s0\"\n[grpo]\nsteps = 0\n[eval]\nat_start = false\n";
    merge(&mut doc, table(over, "the base-run overrides")?);
    Ok(toml::to_string(&doc)?)
}

/// A job list: run names and config paths, run by `xtask <cmd>` (or in process by the test).
pub type Jobs = Vec<(String, PathBuf)>;

/// Writes every config of `plan` under `dir` and returns the SFT jobs and the GRPO jobs (the base
/// evaluations first): with `keep`, a finished run of the same config is left out, and a
/// checkpoint whose SFT config is unchanged and whose model exists is not trained again.
pub fn jobs(base: &str, sft: &str, dir: &Path, plan: &Plan, keep: bool) -> Result<(Jobs, Jobs)> {
    let (mut sfts, mut runs) = (vec![], vec![]);
    let mut evals = vec![];
    for k in plan.checkpoints.clone() {
        let ck = dir.join(format!("ck{k}"));
        let cfgs = ck.join("configs");
        std::fs::create_dir_all(&cfgs).with_context(|| format!("creating {}", cfgs.display()))?;
        let text = sft_config(sft, dir, k, plan.sft_steps)?;
        let path = cfgs.join("sft.toml");
        let model = ck.join("sft").join("model.safetensors");
        let same = std::fs::read_to_string(&path).is_ok_and(|t| t == text);
        if !(keep && same && model.is_file()) {
            std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
            sfts.push((format!("ck{k}-sft"), path));
        }
        let b = ck_base(base, dir, k, plan.steps)?;
        let one = |name: &str, text: String, steps: u64, to: &mut Jobs| -> Result<()> {
            let path = cfgs.join(format!("{name}.toml"));
            let run_dir = ck.join(name);
            if keep && crate::repro::finished(&path, &text, &run_dir, steps) {
                return Ok(());
            }
            if run_dir.exists() {
                std::fs::remove_dir_all(&run_dir)
                    .with_context(|| format!("removing {}", run_dir.display()))?;
            }
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            to.push((format!("ck{k}-{name}"), path));
            Ok(())
        };
        one("base-s0", base_eval_config(&b)?, 0, &mut evals)?;
        for m in &plan.methods {
            for i in 0..plan.seeds {
                let text = method_config(&b, m, (i, Testbed::V5.run_seed(i)), false)?;
                let steps = terse_train::RunConfig::from_toml(&text, Path::new(m.name))?
                    .grpo
                    .steps;
                one(&format!("{}-s{i}", m.name), text, steps, &mut runs)?;
            }
        }
    }
    evals.extend(runs);
    Ok((sfts, evals))
}

/// The study's plan from the flags.
fn plan(a: &Args) -> Result<Plan> {
    Ok(Plan {
        checkpoints: match &a.checkpoints {
            Some(s) => parse_range(s)?,
            None => 0..PLANNED_CHECKPOINTS,
        },
        seeds: a.seeds.unwrap_or(Testbed::V5.default_seeds()).max(1),
        methods: crate::methods::select(&a.methods, Testbed::V5)?,
        steps: a.steps,
        sft_steps: a.sft_steps,
    })
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let t0 = Instant::now();
    let config = a
        .config
        .clone()
        .unwrap_or_else(|| Testbed::V5.config().into());
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let base = read(&config)?;
    let sft_path = PathBuf::from(Testbed::V5.sft().context("v5 has an SFT config")?);
    let sft = read(&sft_path)?;
    let dir = terse_train::RunConfig::from_toml(&base, &config)?.run.dir;
    let plan = plan(a)?;
    let out = a.out.clone().unwrap_or_else(|| Testbed::V5.out().into());
    let (mut sfts, mut runs) = (vec![], vec![]);
    if !a.report_only {
        (sfts, runs) = jobs(&base, &sft, &dir, &plan, a.keep)?;
        eprintln!(
            "v5: {} checkpoint(s), {} SFT and {} GRPO/base runs to train (the plan's study: about 260 min on 2 cores)",
            plan.checkpoints.len(),
            sfts.len(),
            runs.len()
        );
        if !sfts.is_empty() {
            crate::repro::run_children(&sfts, a.jobs.max(1), &dir, "sft")?;
        }
        if !runs.is_empty() {
            crate::repro::run_children(&runs, a.jobs.max(1), &dir, "train")?;
        }
    }
    match crate::report_v5::write(&dir, &plan, &sft, &out)? {
        Written::Report(md) => println!("wrote {}", md.display()),
        Written::Waiting(missing) => println!(
            "wrote the tables of checkpoint(s) {:?} under {}; results.md waits for the plan's {} (none yet: {missing:?})",
            plan.checkpoints,
            crate::report_v5::out_dir(&plan, &out).join("checkpoints").display(),
            PLANNED_CHECKPOINTS
        ),
    }
    if !a.report_only {
        println!(
            "{} SFT and {} runs in {:.1} min ({} at a time, one thread each)",
            sfts.len(),
            runs.len(),
            t0.elapsed().as_secs_f64() / 60.0,
            a.jobs
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests;
