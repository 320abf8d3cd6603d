//! `Task::score` under faults: an answer over the math verifier's budget scores as a wrong one
//! with its reason, and a research scorer that panics scores 0 while the step goes on
//! (task/score_fault.rs catches it).

use crate::config::{DataSection, MathScorer, TaskKind};
use crate::task::{Item, Task};
use terse_reward::Outcome;
use terse_reward::ScoreFault;

/// A math task of the flat fixture (answers 0, 2, 4, ...) with `scorer`.
fn math_task(scorer: MathScorer) -> Task {
    let data = DataSection {
        task: TaskKind::Math,
        math_scorer: scorer,
        train: Some(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/datasets/flat.jsonl"
            )
            .into(),
        ),
        columns: terse_tasks::dataset::Columns {
            prompt: "question".into(),
            answer: "answer".into(),
            extra: vec![],
        },
        template: "User: {prompt}\nAssistant: <think>".into(),
        ..Default::default()
    };
    Task::new(&data, std::path::Path::new("."), 0).expect("math task")
}

/// An answer over the verifier's budget scores as a wrong one, with the reason; a normal
/// one is unchanged.
#[test]
fn an_unverifiable_answer_scores_wrong_with_its_reason() {
    let over = format!("1{}", "+1".repeat(5000));
    let cases = [
        (MathScorer::Boxed, 0.0, 1.0),
        (MathScorer::ShortRl, -0.5, 3.0),
        (MathScorer::EasyR1, 0.1, 1.0),
    ];
    for (scorer, wrong, right) in cases {
        let task = math_task(scorer);
        let it = task.train_item(2).expect("item");
        let text = |a: &str| format!(" w </think> <answer>{a}</answer> \\boxed{{{a}}}");
        let s = task.score(&it, &text(&over));
        assert_eq!(
            (s.correct, s.base_reward, s.fault),
            (false, wrong, Some(ScoreFault::BudgetExceeded)),
            "{scorer:?}"
        );
        let s = task.score(&it, &text("4"));
        assert_eq!((s.correct, s.base_reward, s.fault), (true, right, None));
    }
}

#[test]
fn a_panicking_scorer_scores_wrong_and_the_step_goes_on() {
    let item = |row| Item {
        prompt: "q".into(),
        answer: "4".into(),
        level: 2,
        row,
    };
    let task = Task::custom(vec![item(Some(3))], vec![], |c: &str, a: &str| {
        assert!(c != "boom", "the verifier cannot read {c}");
        Outcome {
            correct: c == a,
            base_reward: 1.0,
            format_ok: true,
            ..Default::default()
        }
    })
    .expect("task");
    let s = task.score(&item(Some(3)), "boom");
    assert_eq!(
        (s.correct, s.base_reward, s.format_ok, s.fault),
        (false, 0.0, false, Some(ScoreFault::Panicked))
    );
    let s = task.score(&item(None), "4");
    assert_eq!((s.correct, s.fault), (true, None));
}
