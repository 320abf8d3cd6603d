//! A task of your own: items (prompt, reference answer, level) and a verifier closure, trained
//! for a step with a built-in shaper. Here the items are testbed chains and the verifier reads
//! the last `<answer>` of the completion.
//!
//! `cargo run --release -p terse-train --example custom_task [MODEL_DIR]`

use std::path::Path;
use terse_reward::Outcome;
use terse_tasks::testbed::Problem;
use terse_train::config::Init;
use terse_train::task::{Item, Task};
use terse_train::{GrpoTrainer, RunConfig, StepReport};

pub fn run(model: &Path) -> anyhow::Result<StepReport> {
    let items: Vec<Item> = (0..16u64)
        .map(|i| {
            let p = Problem::generate(1 + (i % 3) as usize, 1000 + i);
            let (prompt, answer) = (p.prompt(), p.answer().to_string());
            Item {
                prompt,
                answer,
                level: p.level,
                row: None,
            }
        })
        .collect();
    // Right when the last <answer> holds the reference; well formatted when there is one.
    let verifier = |completion: &str, answer: &str| {
        let given = completion
            .rsplit("<answer>")
            .next()
            .and_then(|s| s.split_once("</answer>"));
        let correct = given.is_some_and(|(a, _)| a.trim() == answer);
        Outcome {
            correct,
            base_reward: f64::from(u8::from(correct)),
            format_ok: given.is_some(),
            ..Default::default()
        }
    };
    let task = Task::custom(items.clone(), items, verifier)?;

    let mut cfg = RunConfig::default();
    (cfg.model.path, cfg.model.init, cfg.sft.steps) = (model.to_path_buf(), Init::Checkpoint, 0);
    (cfg.grpo.prompts_per_step, cfg.grpo.group_size) = (2, 4);
    let mut trainer = GrpoTrainer::builder(cfg).task(task).build()?;
    trainer.step()
}

fn main() -> anyhow::Result<()> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or("tests/fixtures/testbed-sft".into());
    let r = run(model.as_ref())?;
    println!(
        "step {}: accuracy {:.2}, reward {:.3}",
        r.step, r.accuracy, r.reward
    );
    Ok(())
}
