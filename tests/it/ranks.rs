//! The whole run loop on data-parallel ranks (`GrpoTrainer::builder(cfg).collective(group).run()`, what `cargo xtask
//! train --nproc N` runs in each process), here on loopback threads: rank 0 writes the same
//! metrics, weights and optimizer state as one process with 2 and 4 ranks, and its checkpoints
//! hold the whole optimizer, so a run resumes on any number of ranks as if it had not stopped.

use std::path::Path;
use std::time::Duration;
use terse_dist::TcpGroup;
use terse_train::RunConfig;

/// `crate::from_sft` with dynamic sampling and Short-RL on, checkpoints every 2 steps.
fn cfg(root: &Path, name: &str, steps: u64) -> RunConfig {
    let mut c = crate::from_sft(root, name, steps);
    c.data.levels = vec![2, 3, 4, 5];
    c.grpo.max_new_tokens = 48;
    c.grpo.dynamic_sampling = Some(terse_train::config::DynamicSampling { max_rounds: 2 });
    c.reward = toml::from_str::<RunConfig>("[reward.shaper]\nmethod = \"short_rl\"\ntau_len = 4\n")
        .expect("shaper")
        .reward;
    c.checkpoint.every = 2;
    c.checkpoint.keep_last = 3;
    c
}

fn tensors(p: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(p, &candle_core::Device::Cpu).expect("safetensors")
}

/// max |a - b| over every f32 tensor of two safetensors files with the same names.
pub(crate) fn max_diff(a: &Path, b: &Path) -> f32 {
    let (a, b) = (tensors(a), tensors(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .filter(|(_, t)| t.dtype() == candle_core::DType::F32)
        .map(|(k, t)| crate::max_abs_diff(t, &b[k]))
        .fold(0.0, f32::max)
}

/// Runs `cfg` on `world` ranks (threads); rank 0's summary.
pub(crate) fn ranked(cfg: RunConfig, world: usize) -> terse_train::RunSummary {
    ranked_as(cfg, world, false)
}

/// `ranked`, resuming with a config other than the run's when `allow_config_change`.
pub(crate) fn ranked_as(
    cfg: RunConfig,
    world: usize,
    allow_config_change: bool,
) -> terse_train::RunSummary {
    let results = TcpGroup::on_threads(world, Duration::from_secs(300), move |g| {
        terse_train::GrpoTrainer::builder(cfg.clone())
            .allow_config_change(allow_config_change)
            .collective(Box::new(g))
            .run()
    });
    let mut results = results.into_iter();
    let summary = results
        .next()
        .expect("rank 0")
        .expect("rank 0 ran")
        .expect("a summary");
    for (r, other) in results.enumerate() {
        assert!(other.expect("rank ran").is_none(), "rank {} wrote", r + 1);
    }
    summary
}

pub(crate) fn steps_of(d: &Path) -> Vec<terse_train::StepReport> {
    terse_train::report::read_steps(&d.join("metrics.jsonl")).expect("metrics")
}

/// The rollout side of every step identical, the loss equal to float rounding (the gradient
/// sums run in another order), and the final weights and optimizer within 1e-5.
fn assert_same_run(one: &Path, other: &Path, what: &str) {
    let (a, b) = (steps_of(one), steps_of(other));
    assert_eq!(a.len(), 6, "{what}");
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.reward, x.accuracy, x.len_mean, x.rounds, x.dropped_groups),
            (y.reward, y.accuracy, y.len_mean, y.rounds, y.dropped_groups),
            "{what}: step {}",
            x.step
        );
        assert!(
            (x.loss - y.loss).abs() <= 1e-6 * x.loss.abs().max(1.0),
            "{what}: step {}: loss {} vs {}",
            x.step,
            x.loss,
            y.loss
        );
    }
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let d = max_diff(
            &one.join("step_000006").join(f),
            &other.join("step_000006").join(f),
        );
        assert!(d <= 1e-5, "{what}: {f}: {d}");
    }
}

#[test]
fn two_and_four_ranks_run_the_loop_like_one_process_and_resume_across_world_sizes() {
    let root = crate::scratch("ranks");
    let one = terse_train::train(&cfg(&root, "one", 6)).expect("one process");
    // Rank 0 alone writes the run; 2 and 4 ranks (each rolling out its share of the groups)
    // take the same steps as one process.
    for world in [2, 4] {
        let name = format!("world{world}");
        let many = ranked(cfg(&root, &name, 6), world);
        assert_same_run(&one.dir, &many.dir, &name);
    }
    // 2 ranks until the step-2 checkpoint, 1 process until step 4, then 4 ranks: the same
    // run as never stopping. (A stop is simulated by removing the later checkpoints.)
    let chain = ranked(cfg(&root, "chain", 6), 2).dir;
    for s in ["step_000004", "step_000006"] {
        std::fs::remove_dir_all(chain.join(s)).expect("drop a checkpoint");
    }
    terse_train::train(&cfg(&root, "chain", 6)).expect("resume on one rank");
    std::fs::remove_dir_all(chain.join("step_000006")).expect("drop step 6");
    ranked(cfg(&root, "chain", 6), 4);
    assert_same_run(&one.dir, &chain, "2 -> 1 -> 4 ranks");
}

#[test]
fn the_sft_warm_up_runs_on_every_rank_like_one_process() {
    let root = crate::scratch("ranks-sft");
    let warm = |name: &str| {
        let mut c = cfg(&root, name, 1);
        c.sft.steps = 3;
        c.sft.batch_size = 8;
        c
    };
    let one = terse_train::train(&warm("one")).expect("one process");
    let two = ranked(warm("two"), 2);
    // Step 0's checkpoint holds the warmed-up weights: each rank differentiated half of every
    // batch, so a rank that sat out would leave half the gradient.
    let w = |d: &Path| d.join("step_000000/model.safetensors");
    let d = max_diff(&w(&one.dir), &w(&two.dir));
    assert!(d <= 1e-5, "warmed-up weights differ by {d}");
    let moved = max_diff(
        &w(&one.dir),
        &crate::fixture("testbed-sft").join("model.safetensors"),
    );
    assert!(moved > 1e-4, "SFT did not move the weights ({moved})");
}
