//! The whole run loop on data-parallel ranks (`terse_train::train_ranked`, what `cargo xtask
//! train --nproc N` runs in each process), here on loopback threads: rank 0 writes the same
//! metrics, weights and optimizer state as one process, and its checkpoints hold the whole
//! optimizer, so a 2-rank run resumes on 1 rank as if it had not stopped.

use std::path::Path;
use std::time::Duration;
use terse_dist::TcpGroup;
use terse_reward::BuiltinShaper;
use terse_train::RunConfig;

fn cfg(root: &Path, name: &str, steps: u64) -> RunConfig {
    let mut c = RunConfig::default();
    c.run.dir = root.to_path_buf();
    c.run.name = name.into();
    c.model.path = crate::fixture("testbed-sft");
    c.model.init = terse_train::config::Init::Checkpoint;
    c.sft.steps = 0;
    c.data.levels = vec![2, 3, 4, 5];
    c.grpo.steps = steps;
    c.grpo.prompts_per_step = 4;
    c.grpo.group_size = 4;
    c.grpo.max_new_tokens = 48;
    c.grpo.dynamic_sampling = Some(terse_train::config::DynamicSampling { max_rounds: 2 });
    c.reward = toml::from_str::<RunConfig>("[reward.shaper]\nmethod = \"short_rl\"\ntau_len = 4\n")
        .expect("shaper")
        .reward;
    c.checkpoint.every = 2;
    c.checkpoint.keep_last = 3;
    c.eval.per_level = 2;
    c.eval.samples = 1;
    c
}

fn tensors(p: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(p, &candle_core::Device::Cpu).expect("safetensors")
}

/// max |a - b| over every f32 tensor of two safetensors files with the same names.
fn max_diff(a: &Path, b: &Path) -> f32 {
    let (a, b) = (tensors(a), tensors(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .filter(|(_, t)| t.dtype() == candle_core::DType::F32)
        .map(|(k, t)| crate::max_abs_diff(t, &b[k]))
        .fold(0.0, f32::max)
}

#[test]
fn two_ranks_run_the_loop_like_one_process_and_resume_on_one() {
    let root = crate::scratch("ranks");
    let one = terse_train::train(&cfg(&root, "one", 4)).expect("one process");
    let two = cfg(&root, "two", 4);
    let results = TcpGroup::on_threads(2, Duration::from_secs(300), move |g| {
        let mut shaper = BuiltinShaper {
            config: two.reward.clone(),
            state: Default::default(),
        };
        terse_train::train_ranked(&two, &mut shaper, Box::new(g))
    });
    let mut results = results.into_iter();
    let summary = results
        .next()
        .expect("rank 0")
        .expect("rank 0 ran")
        .expect("a summary");
    assert!(results
        .next()
        .expect("rank 1")
        .expect("rank 1 ran")
        .is_none());
    // Rank 0 alone wrote the run; its steps equal one process's (the same samples, the
    // gradient sums in another order).
    let read =
        |d: &Path| terse_train::report::read_steps(&d.join("metrics.jsonl")).expect("metrics");
    let (a, b) = (read(&one.dir), read(&summary.dir));
    assert_eq!(a.len(), 4);
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.reward, x.accuracy, x.len_mean, x.rounds),
            (y.reward, y.accuracy, y.len_mean, y.rounds)
        );
        assert!(
            (x.loss - y.loss).abs() <= 1e-6 * x.loss.abs().max(1.0),
            "{} vs {}",
            x.loss,
            y.loss
        );
    }
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let d = max_diff(
            &one.dir.join("step_000004").join(f),
            &summary.dir.join("step_000004").join(f),
        );
        assert!(d <= 1e-5, "{f}: {d}");
    }
    // Resume the 2-rank run from its step-2 checkpoint on one process: as if it had not stopped.
    std::fs::remove_dir_all(summary.dir.join("step_000004")).expect("drop step 4");
    let resumed = terse_train::train(&cfg(&root, "two", 4)).expect("resume on one rank");
    let d = max_diff(
        &one.dir.join("step_000004/model.safetensors"),
        &resumed.dir.join("step_000004/model.safetensors"),
    );
    assert!(d <= 1e-5, "resumed weights: {d}");
    let c = read(&resumed.dir);
    assert_eq!(c.len(), 4);
    assert_eq!(c[3].reward, a[3].reward);
}
