//! One GRPO step from research code: load the testbed SFT checkpoint, sample G completions per
//! prompt, shape rewards with a closure, compute advantages and update the policy once.
//!
//! `cargo run --release -p terse-train --example grpo_step [MODEL_DIR]`

use std::path::Path;
use terse_reward::{Group, Shaped, StepCtx};
use terse_train::config::Init;
use terse_train::{GrpoTrainer, RunConfig, StepReport};

pub fn run(model: &Path) -> anyhow::Result<StepReport> {
    let mut cfg = RunConfig::default();
    cfg.model.path = model.to_path_buf();
    cfg.model.init = Init::Checkpoint;
    cfg.sft.steps = 0;
    (cfg.grpo.prompts_per_step, cfg.grpo.group_size) = (2, 4);
    // 1 per correct answer, minus 0.01 per token.
    let shaper = |groups: &[Group], _: &StepCtx| Shaped {
        rewards: groups
            .iter()
            .map(|g| {
                g.samples
                    .iter()
                    .map(|s| f64::from(u8::from(s.correct)) - 0.01 * s.len as f64)
                    .collect()
            })
            .collect(),
        ..Default::default()
    };
    let mut trainer = GrpoTrainer::builder(cfg).shaper(Box::new(shaper)).build()?;

    // G samples per prompt, scored by the task's verifier.
    let collected = trainer.rollout()?;
    let scored = trainer.score(&collected)?;
    let update = trainer.update(&collected, &scored.advantages)?;
    Ok(trainer.report(&collected, &scored, &update, Default::default()))
}

fn main() -> anyhow::Result<()> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or("tests/fixtures/testbed-sft".into());
    let r = run(model.as_ref())?;
    println!(
        "reward {:.3}, accuracy {:.2}, mean length {:.1}, grad norm {:.3}",
        r.reward,
        r.accuracy,
        r.len_mean.unwrap_or(0.0),
        r.grad_norm
    );
    Ok(())
}
