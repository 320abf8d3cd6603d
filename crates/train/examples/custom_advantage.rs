//! An advantage estimator of your own plugged into the step-level trainer: ranks within each
//! group, centred and scaled to [−1, 1] (ties share a rank), instead of GRPO's z-scores.
//!
//! `cargo run --release -p terse-train --example custom_advantage [MODEL_DIR]`

use std::path::Path;
use terse_reward::{Group, Shaped};
use terse_train::config::Init;
use terse_train::{GrpoTrainer, RunConfig, StepReport};

/// Per group: (rank − mean rank) / (G − 1) · 2, ranks by shaped reward.
pub fn ranks(groups: &[Group], shaped: &Shaped) -> Vec<Vec<f64>> {
    groups
        .iter()
        .zip(&shaped.rewards)
        .map(|(g, r)| {
            let n = g.samples.len().max(2) as f64;
            let rank = |x: f64| {
                r.iter().filter(|y| **y < x).count() as f64
                    + 0.5 * (r.iter().filter(|y| **y == x).count() as f64 - 1.0)
            };
            r.iter()
                .map(|x| 2.0 * (rank(*x) - (n - 1.0) / 2.0) / (n - 1.0))
                .collect()
        })
        .collect()
}

pub fn run(model: &Path) -> anyhow::Result<StepReport> {
    let mut cfg = RunConfig::default();
    (cfg.model.path, cfg.model.init, cfg.sft.steps) = (model.to_path_buf(), Init::Checkpoint, 0);
    (cfg.grpo.prompts_per_step, cfg.grpo.group_size) = (2, 4);
    let mut trainer = GrpoTrainer::builder(cfg)
        .estimator(Box::new(ranks))
        .build()?;
    trainer.step()
}

fn main() -> anyhow::Result<()> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or("tests/fixtures/testbed-sft".into());
    let r = run(model.as_ref())?;
    println!(
        "step {}: reward {:.3}, grad norm {:.3}",
        r.step, r.reward, r.grad_norm
    );
    Ok(())
}
