//! `cargo xtask repro`: every length method side by side on the CPU testbed. From one SFT
//! checkpoint, each method x seed trains as a child `xtask train` process (one thread each, so
//! the numbers do not depend on the machine's core count); the runs' metrics.jsonl files then
//! become docs/results.md (summary/) and PNG curves.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::methods::{merge, Method, Testbed};

#[derive(clap::Args)]
pub struct Args {
    /// The testbed: v2 (every method, docs/results.md), v3 (the four papers' length methods
    /// on reflection that can overturn an answer, docs/v3/results.md; its SFT checkpoint is
    /// trained first when missing), v4 (the confirmatory study of docs/v4/plan.md on v3's
    /// design, seeds 100-108, docs/v4/results.md and seeds.csv) or v4-care (v4's CARE premise
    /// condition, docs/v4/care/).
    #[arg(long, value_enum, default_value = "v2")]
    pub testbed: Testbed,
    /// Base run config; each method adds its overrides [default: the testbed's,
    /// configs/repro.toml, configs/repro-v3.toml, configs/repro-v4.toml or
    /// configs/repro-v4-care.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seeds per method [default: 5 for v2 and v3 (the claims' paired t intervals need
    /// several; 5 fit in 30 minutes), 9 for v4 (its plan fixes them)]. Another count writes
    /// results-seeds<N>.md, so results.md stays the default study's.
    #[arg(long)]
    pub seeds: Option<u64>,
    /// Runs trained at once (each on one thread).
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Where results.md and the curves go [default: the testbed's, docs, docs/v3, docs/v4 or
    /// docs/v4/care].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A smaller study for a quick look: 1 seed, 12 steps, 4 problems per level; writes
    /// results-quick.md instead of results.md.
    #[arg(long)]
    quick: bool,
    /// Only rewrite the report from the runs already under the study's run directory (a v4
    /// study with none finished there, a fresh clone's, rewrites from its committed
    /// seeds.csv and trajectory.csv).
    #[arg(long)]
    pub report_only: bool,
    /// Study only these methods (comma-separated names, e.g. `standard,cos_fn`); the report
    /// goes to results-focus.md, so more seeds for one claim leave results.md as it is.
    /// `all`: every method and variant, reported in results-all.md. `v4-new`: v4's five newer
    /// methods with Standard (`--testbed v4 --methods v4-new --keep` after the default v4
    /// study; v4's report reads every finished run of its run directory).
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// Keep a run that already finished with the same config (the study's configs/<run>.toml
    /// is byte-identical and its last evaluation is at the last step) instead of training it
    /// again: runs are deterministic on the CPU, so `--seeds 10` after a 5-seed study trains
    /// seeds 5..9 only. Runs from an older build are trusted as they are.
    #[arg(long)]
    pub keep: bool,
    /// A robustness cell of docs/v4/plan.md section 8 (with `--testbed v4`): Standard and
    /// P1-P4 on seeds 100-108 from another SFT checkpoint (sft1, sft2), with one knob of the
    /// sensitivity grid moved (overturn-mid, overturn-flat, rounds1, rounds3, g16), or on v3's
    /// designs 1-2 (v3-design1, v3-design2); its own run directory
    /// (runs/repro-v4-<cell>) and report (docs/v4/robust/<cell>), its SFT checkpoint trained
    /// first when it needs one and it is missing. Exploratory: Holm within the cell.
    #[arg(long, value_enum)]
    cell: Option<crate::cells::Cell>,
    /// v5 only: the fresh SFT checkpoints, a count `N` (0..N-1) or a range `a-b` [default: the
    /// plan's 14, 0-13]; SFT seed 500 + k.
    #[arg(long)]
    pub checkpoints: Option<String>,
    /// v5 only: GRPO steps per run (a smoke run; the plan's 60 otherwise).
    #[arg(long)]
    pub steps: Option<u64>,
    /// v5 only: SFT steps per checkpoint (a smoke run; configs/v5.toml's otherwise).
    #[arg(long)]
    pub sft_steps: Option<u64>,
}

/// The run config TOML of `method`'s run `index` (named `<method>-s<index>`, the pairing key
/// the reports read) with GRPO seed `seed`: base ⊕ overrides ⊕ run name/seed (⊕ quick).
pub fn method_config(
    base: &str,
    m: &Method,
    (index, seed): (u64, u64),
    quick: bool,
) -> Result<String> {
    let mut doc: toml::Table = toml::from_str(base).context("parsing the base config")?;
    // Quick runs live in a directory of their own, so they never replace the full study's
    // runs (a later --report-only would mix them).
    let base_cfg = terse_train::RunConfig::from_toml(base, Path::new("base config"))?;
    let dir = base_cfg.run.dir;
    // Length-limited methods (CosFn, CARE, DAPO) read the limit the base config samples with.
    let overrides = m.resolved(base_cfg.grpo.max_new_tokens);
    let mut extra: toml::Table =
        toml::from_str(&overrides).with_context(|| format!("overrides of method {}", m.name))?;
    let run = extra
        .entry("run")
        .or_insert_with(|| toml::Value::Table(Default::default()));
    if let toml::Value::Table(t) = run {
        t.insert("name".into(), format!("{}-s{index}", m.name).into());
        t.insert("seed".into(), (seed as i64).into());
        if quick {
            t.insert("dir".into(), dir.join("quick").display().to_string().into());
        }
    }
    if quick {
        let q: toml::Table =
            toml::from_str("[grpo]\nsteps = 12\n[eval]\nper_level = 4\nsamples = 2\n")?;
        merge(&mut extra, q);
    }
    merge(&mut doc, extra);
    Ok(toml::to_string(&doc)?)
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let t0 = Instant::now();
    let config = a
        .config
        .clone()
        .unwrap_or_else(|| a.testbed.config().into());
    let cell = a.cell.map(|c| c.spec());
    if cell.is_some() && a.testbed != Testbed::V4 {
        bail!(
            "repro --cell: a robustness cell is a variant of `--testbed v4`, not {:?}",
            a.testbed
        );
    }
    let out = a.out.clone().unwrap_or_else(|| match &cell {
        Some(c) => c.out().into(),
        None => a.testbed.out().into(),
    });
    let mut base = std::fs::read_to_string(&config)
        .with_context(|| format!("reading {}", config.display()))?;
    let mut sft = a.testbed.sft().map(PathBuf::from);
    let config = match &cell {
        None => config,
        Some(c) => {
            // The cell's configs are derived, written beside its runs, and read from there.
            let sft_path = sft.clone().context("testbed v4 has an SFT config")?;
            let sft_text = std::fs::read_to_string(&sft_path)
                .with_context(|| format!("reading {}", sft_path.display()))?;
            let (cell_base, cell_sft) = c.configs(&base, &sft_text)?;
            let dir = PathBuf::from(format!("runs/repro-v4-{}", c.name));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if let Some(text) = cell_sft {
                let path = dir.join("sft.toml");
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                sft = Some(path);
            }
            let path = dir.join("base.toml");
            std::fs::write(&path, &cell_base)
                .with_context(|| format!("writing {}", path.display()))?;
            base = cell_base;
            path
        }
    };
    let base_cfg = terse_train::RunConfig::from_toml(&base, &config)?;
    if let (Some(c), false) = (&cell, a.report_only) {
        eprintln!(
            "robustness cell {} ({}): about {} min on 2 cores",
            c.name, c.what, c.minutes
        );
    }
    if !a.report_only {
        ensure_sft(sft.as_deref(), &base_cfg.model.path)?;
    }
    let root = if a.quick {
        base_cfg.run.dir.join("quick")
    } else {
        base_cfg.run.dir.clone()
    };
    let seeds = if a.quick {
        1
    } else {
        a.seeds.unwrap_or(a.testbed.default_seeds()).max(1)
    };
    let methods = match &cell {
        Some(_) if a.methods.is_empty() => {
            crate::methods::select(&crate::cells::ROWS.map(String::from), a.testbed)?
        }
        _ => crate::methods::select(&a.methods, a.testbed)?,
    };
    let cfg_dir = root.join("configs");
    std::fs::create_dir_all(&cfg_dir).with_context(|| format!("creating {}", cfg_dir.display()))?;

    // Every (method, seed) run, fresh: a stale run directory is removed first.
    let (mut jobs, mut kept): (Vec<(String, PathBuf)>, usize) = (vec![], 0);
    let to_train: &[&Method] = if a.report_only { &[] } else { &methods };
    for &m in to_train {
        for seed in 0..seeds {
            let text = method_config(&base, m, (seed, a.testbed.run_seed(seed)), a.quick)?;
            let cfg = terse_train::RunConfig::from_toml(&text, Path::new(m.name))?;
            let run_dir = cfg.run.dir.join(&cfg.run.name);
            let path = cfg_dir.join(format!("{}.toml", cfg.run.name));
            if a.keep && finished(&path, &text, &run_dir, cfg.grpo.steps) {
                kept += 1;
                continue;
            }
            if run_dir.exists() {
                std::fs::remove_dir_all(&run_dir)
                    .with_context(|| format!("removing {}", run_dir.display()))?;
            }
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            jobs.push((cfg.run.name.clone(), path));
        }
    }
    if !jobs.is_empty() {
        run_children(&jobs, a.jobs.max(1), &root, "train")?;
    }
    let elapsed = t0.elapsed().as_secs_f64();

    let study = crate::summary::Study {
        testbed: a.testbed,
        config: &config,
        l_max: base_cfg.grpo.max_new_tokens,
        seeds,
        quick: a.quick,
    };
    let md = if a.testbed.is_v4() {
        let steps = if a.quick { 12 } else { base_cfg.grpo.steps };
        crate::report_v4::write(&root, &study, steps, &out, a.cell)?
    } else {
        crate::summary::write(&root, &methods, &study, &out)?
    };
    println!("wrote {}", md.display());
    if !a.report_only {
        println!(
            "{} runs in {:.1} min ({} at a time, one thread each){}",
            jobs.len(),
            elapsed / 60.0,
            a.jobs,
            if kept > 0 {
                format!("; {kept} finished runs kept")
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Trains the study's SFT checkpoint with the SFT config `sft` (`xtask sft`, logged to the
/// console) when the base config starts from one that is not there yet.
fn ensure_sft(sft: Option<&Path>, model: &Path) -> Result<()> {
    let Some(sft) = sft else {
        return Ok(());
    };
    let sft = sft.display();
    if model.join("model.safetensors").is_file() {
        return Ok(());
    }
    eprintln!(
        "{} is missing: training it with `xtask sft --config {sft}` first",
        model.display()
    );
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let status = Command::new(&exe)
        .args(["sft", "--config", &sft.to_string()])
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("starting {}", exe.display()))?;
    if !status.success() {
        bail!("xtask sft --config {sft} failed ({status})");
    }
    if !model.join("model.safetensors").is_file() {
        bail!(
            "xtask sft --config {sft} finished but {} has no model.safetensors: the SFT config's run.dir/run.name must name it",
            model.display()
        );
    }
    Ok(())
}

/// Whether the run at `run_dir` already finished from exactly `text` (see `--keep`).
pub fn finished(cfg_path: &Path, text: &str, run_dir: &Path, steps: u64) -> bool {
    let same = std::fs::read_to_string(cfg_path).is_ok_and(|t| t == text);
    same && terse_train::report::read_evals(&run_dir.join("metrics.jsonl"))
        .is_ok_and(|e| e.last().is_some_and(|l| l.step == steps))
}

/// Runs `xtask <cmd> --config` (`train` or `sft`) for every job, `jobs` at a time, logs in
/// `<root>/logs`.
pub fn run_children(jobs: &[(String, PathBuf)], max: usize, root: &Path, cmd: &str) -> Result<()> {
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut queue = jobs.iter();
    let mut running: Vec<(String, Child)> = vec![];
    let mut done = 0;
    loop {
        while running.len() < max {
            let Some((name, cfg)) = queue.next() else {
                break;
            };
            let log = std::fs::File::create(logs.join(format!("{name}.log")))?;
            let child = Command::new(&exe)
                .args([cmd, "--config"])
                .arg(cfg)
                .env("RAYON_NUM_THREADS", "1")
                .stdout(log.try_clone()?)
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", exe.display()))?;
            running.push((name.clone(), child));
        }
        if running.is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            if let Some(status) = running[i].1.try_wait()? {
                let (name, _) = running.swap_remove(i);
                if !status.success() {
                    bail!(
                        "run {name} failed ({status}); see {}",
                        logs.join(format!("{name}.log")).display()
                    );
                }
                done += 1;
                eprintln!("[{done}/{}] {name} done", jobs.len());
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method and variant, on every testbed's base config, is a valid run config (the
    /// overrides name real keys, and `{l_max…}` fractions fit the limits they are checked
    /// against, as ThinkPrune's rounds are); v4's runs carry the plan's seeds under the
    /// index's name, and every testbed's SFT config is a valid config too.
    #[test]
    fn every_method_config_validates_on_every_testbed() {
        use clap::ValueEnum;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for &testbed in Testbed::value_variants() {
            let base = std::fs::read_to_string(root.join(testbed.config())).expect("base config");
            for m in crate::methods::nameable() {
                let text =
                    method_config(&base, m, (8, testbed.run_seed(8)), false).expect("merged");
                let cfg = terse_train::RunConfig::from_toml(&text, Path::new(m.name))
                    .unwrap_or_else(|e| panic!("{} on {testbed:?}: {e:#}", m.name));
                assert_eq!(cfg.run.name, format!("{}-s8", m.name));
                assert_eq!(cfg.run.seed, testbed.run_seed(8));
            }
            if let Some(sft) = testbed.sft() {
                let text = std::fs::read_to_string(root.join(sft)).expect("sft config");
                let cfg = terse_train::RunConfig::from_toml(&text, Path::new(sft)).expect(sft);
                // The base config starts from the checkpoint the SFT config writes.
                // v5 derives each checkpoint's configs (repro_v5.rs's test checks them).
                if testbed == Testbed::V5 {
                    continue;
                }
                let base_cfg =
                    terse_train::RunConfig::from_toml(&base, Path::new("base")).expect("base");
                assert_eq!(
                    base_cfg.model.path,
                    cfg.run.dir.join(&cfg.run.name).join("sft"),
                    "{testbed:?}"
                );
                // ... and draws its problems from the testbed that checkpoint learned.
                assert_eq!(base_cfg.data.teacher(), cfg.data.teacher(), "{testbed:?}");
                assert_eq!(base_cfg.data.levels, cfg.data.levels, "{testbed:?}");
            }
        }
        let v4 = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        // v4's main design is v3's base config but for its run directory (plan section 7a).
        let (v3, main) = (v4("configs/repro-v3.toml"), v4("configs/repro-v4.toml"));
        let body = |t: &str| t[t.find("[run]").expect("[run]")..].to_string();
        assert_eq!(
            body(&main).replace("runs/repro-v4\"", "runs/repro-v3\""),
            body(&v3)
        );
        let care =
            terse_train::RunConfig::from_toml(&v4("configs/repro-v4-care.toml"), Path::new("care"))
                .expect("care");
        let g16 = method_config(
            &v4("configs/repro-v4-care.toml"),
            crate::methods::select(&["care_g16".into()], Testbed::V4Care).expect("g16")[0],
            (0, 100),
            false,
        )
        .expect("merged");
        let g16 = terse_train::RunConfig::from_toml(&g16, Path::new("g16")).expect("g16");
        assert_eq!((care.grpo.group_size, g16.grpo.group_size), (6, 16));
    }

    #[test]
    fn keep_takes_only_a_finished_run_of_the_same_config() {
        let dir = std::env::temp_dir().join(format!("terse-repro-keep-{}", std::process::id()));
        let run = dir.join("standard-s0");
        std::fs::create_dir_all(&run).expect("temp dir");
        let cfg = dir.join("standard-s0.toml");
        std::fs::write(&cfg, "a = 1\n").expect("temp dir");
        let eval = |step: u64| {
            format!(
                "{{\"phase\":\"eval\",\"step\":{step},\"accuracy\":0.5,\"len_mean\":9.0,\
                 \"by_level\":[{{\"level\":1,\"pass1\":0.5,\"pass_k\":1.0,\"len_mean\":9.0,\
                 \"reflections_mean\":0.0}}]}}\n"
            )
        };
        let metrics = run.join("metrics.jsonl");
        assert!(!finished(&cfg, "a = 1\n", &run, 60), "no metrics yet");
        std::fs::write(&metrics, eval(0) + &eval(40)).expect("temp dir");
        assert!(!finished(&cfg, "a = 1\n", &run, 60), "stopped at step 40");
        std::fs::write(&metrics, eval(0) + &eval(60)).expect("temp dir");
        assert!(finished(&cfg, "a = 1\n", &run, 60));
        assert!(!finished(&cfg, "a = 2\n", &run, 60), "another config");
        std::fs::remove_dir_all(&dir).expect("temp dir");
    }
}
