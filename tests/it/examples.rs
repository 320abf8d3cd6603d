//! The library examples of crates/train/examples run here, on the testbed SFT checkpoint: one
//! GRPO step through the step-level trainer with a closure reward, a custom task with a closure
//! verifier, and a custom advantage estimator.

#[allow(dead_code)]
#[path = "../../crates/train/examples/grpo_step.rs"]
mod grpo_step;

#[allow(dead_code)]
#[path = "../../crates/train/examples/custom_task.rs"]
mod custom_task;

#[allow(dead_code)]
#[path = "../../crates/train/examples/custom_advantage.rs"]
mod custom_advantage;

#[test]
fn the_library_examples_run_one_step_each() {
    let model = crate::fixture("testbed-sft");
    let r = grpo_step::run(&model).expect("grpo_step");
    assert_eq!((r.step, r.updates), (0, 1));
    assert!(r.grad_norm.is_finite() && r.grad_norm > 0.0, "{r:?}");
    // The SFT checkpoint solves easy chains: the custom verifier sees correct answers.
    let t = custom_task::run(&model).expect("custom_task");
    assert!(t.accuracy > 0.0 && t.format_ok > 0.5, "{t:?}");
    let a = custom_advantage::run(&model).expect("custom_advantage");
    assert!(a.loss.is_finite() && a.updates == 1, "{a:?}");
}

#[test]
fn a_custom_estimator_ranks_within_groups() {
    use terse_reward::{Group, SampleStat, Shaped};
    let g = Group::new(
        0,
        (0..4).map(|i| SampleStat::new(10 * i, true, 1.0)).collect(),
    );
    let shaped = Shaped {
        rewards: vec![vec![0.1, 0.5, 0.5, 0.9]],
        ..Default::default()
    };
    assert_eq!(
        custom_advantage::ranks(std::slice::from_ref(&g), &shaped),
        vec![vec![-1.0, 0.0, 0.0, 1.0]]
    );
}
