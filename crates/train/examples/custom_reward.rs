//! Training with a reward written by the caller: GRPO on the CPU testbed from the committed SFT
//! checkpoint, with a length penalty of this file's own design instead of a built-in method.
//!
//! `cargo run --release -p terse-train --example custom_reward` (about a minute on 2 cores).

use anyhow::Context;
use terse_reward::{Group, Shaped, StepCtx};
use terse_train::{GrpoTrainer, RunConfig};

fn main() -> anyhow::Result<()> {
    let mut cfg = RunConfig::from_file("configs/repro.toml".as_ref())?;
    cfg.run.name = "custom-reward".into();
    cfg.run.dir = "runs".into();
    cfg.run.resume = terse_train::config::Resume::Auto;
    cfg.grpo.steps = 20;

    // Correct answers earn 1 minus 0.005 per token beyond the group's shortest correct answer;
    // wrong answers earn 0. Any `FnMut(&[Group], &StepCtx) -> Shaped` plugs in the same way.
    let mine = |groups: &[Group], _ctx: &StepCtx| {
        let rewards = groups
            .iter()
            .map(|g| {
                let shortest = g
                    .samples
                    .iter()
                    .filter(|s| s.correct)
                    .map(|s| s.len)
                    .min()
                    .unwrap_or(0);
                g.samples
                    .iter()
                    .map(|s| {
                        if s.correct {
                            1.0 - 0.005 * (s.len - shortest) as f64
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect();
        Shaped {
            rewards,
            ..Default::default()
        }
    };
    let s = GrpoTrainer::builder(cfg)
        .shaper(Box::new(mine))
        .run()?
        .context("one process has the summary")?;
    let before = s.before.as_ref().map_or(f64::NAN, |b| b.accuracy);
    println!(
        "pass@1 {before:.3} -> {:.3}; rollout length {:.1} -> {:.1}; run in {}",
        s.after.accuracy,
        s.len_first,
        s.len_last,
        s.dir.display()
    );
    Ok(())
}
