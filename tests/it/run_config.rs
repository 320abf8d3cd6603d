//! Issue 59 items 1 and 3: a run's config is its own, and the context is respected. Two
//! starts on one run directory with different seeds: the second refuses naming `run.seed` and
//! the directory is a lone run's; the same config again changes nothing (unless evaluated
//! again, marked so); an allowed change is recorded in config_changes.jsonl; a prompt plus
//! `grpo.max_new_tokens` beyond the model's context is an error naming the row by default.

use crate::train::{deterministic_metrics, small_config};
use std::path::Path;
use terse_train::{GrpoTrainer, RunConfig, RunSummary};

fn one_line(r: anyhow::Result<RunSummary>) -> String {
    let e = format!("{:#}", r.expect_err("must fail"));
    assert_eq!(e.lines().count(), 1, "not one line: {e}");
    e
}

/// Every file under `dir` (paths relative to it) with its bytes, LOCK's text left out (it
/// names the last holder).
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).expect("under").display().to_string();
                let bytes = if rel == "LOCK" {
                    vec![]
                } else {
                    std::fs::read(&p).expect("read")
                };
                out.push((rel, bytes));
            }
        }
    }
    let mut out = vec![];
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn seeded(root: &Path, name: &str, seed: u64) -> RunConfig {
    let mut c = small_config(root, name, 2);
    c.run.seed = seed;
    c.run.lock_wait_s = 600.0;
    c
}

/// Two starts at once with seeds 0 and 1: one runs, the other waits for the lock and then
/// refuses naming run.seed with both values; config.toml is the winner's and metrics.jsonl
/// equals a lone run's of the winner's config. Started again, the loser still refuses and
/// the run directory stays byte for byte as it was.
#[test]
fn two_starts_with_different_seeds_the_second_refuses_naming_run_seed() {
    let root = crate::scratch("config-seeds");
    let starts: Vec<_> = [0, 1]
        .map(|seed| {
            let c = seeded(&root, "shared", seed);
            std::thread::spawn(move || terse_train::train(&c))
        })
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    let won: Vec<u64> = (0..2).filter(|&i| starts[i as usize].is_ok()).collect();
    assert_eq!(won.len(), 1, "exactly one start runs");
    let (winner, loser) = (won[0], 1 - won[0]);
    let mut starts = starts.into_iter();
    let (a, b) = (starts.next().expect("a"), starts.next().expect("b"));
    let e = one_line(if winner == 0 { b } else { a });
    assert!(
        e.contains(&format!("run.seed = {winner} in config.toml, {loser} now")),
        "{e}"
    );
    let dir = root.join("shared");
    let written = std::fs::read_to_string(dir.join("config.toml")).expect("config.toml");
    assert_eq!(
        written,
        seeded(&root, "shared", winner).to_toml().expect("toml")
    );
    let lone = terse_train::train(&seeded(&root, "lone", winner)).expect("lone");
    assert_eq!(
        deterministic_metrics(&dir),
        deterministic_metrics(&lone.dir)
    );
    assert!(!dir.join("config_changes.jsonl").exists());

    let before = snapshot(&dir);
    let e = one_line(terse_train::train(&seeded(&root, "shared", loser)));
    assert!(e.contains("run.seed"), "{e}");
    assert!(snapshot(&dir) == before, "a refused start changed the run");
}

/// A finished run started again with its own config exits 0, says it had finished and writes
/// nothing; keys that change no result may differ. Asked to evaluate again, it appends one
/// evaluation marked "again" and changes nothing else.
#[test]
fn a_finished_run_started_again_changes_nothing_unless_evaluated_again() {
    let root = crate::scratch("config-finished");
    let cfg = small_config(&root, "done", 2);
    let first = terse_train::train(&cfg).expect("run");
    let before = snapshot(&first.dir);
    let again = terse_train::train(&cfg).expect("again");
    assert!(again.already_finished && !first.already_finished);
    // The summary is the file's (which holds the figures, not the example completions).
    let json = |e: &Option<terse_train::evals::EvalReport>| serde_json::to_value(e).expect("json");
    assert_eq!(json(&Some(again.after)), json(&Some(first.after.clone())));
    assert_eq!(json(&again.before), json(&first.before));
    assert!(snapshot(&first.dir) == before, "a finished run was changed");
    let mut quiet = cfg.clone();
    quiet.eval.every = 1;
    quiet.run.lock_wait_s = 5.0;
    quiet.checkpoint.keep_last = 7;
    assert!(terse_train::train(&quiet).expect("quiet").already_finished);
    assert!(
        snapshot(&first.dir) == before,
        "a key that changes no result"
    );

    let metrics = std::fs::read_to_string(first.dir.join("metrics.jsonl")).expect("metrics");
    let s = GrpoTrainer::builder(cfg.clone())
        .eval_again(true)
        .run()
        .expect("eval again")
        .expect("summary");
    assert!(s.already_finished);
    let now = std::fs::read_to_string(first.dir.join("metrics.jsonl")).expect("metrics");
    let added = now.strip_prefix(&metrics).expect("appended only");
    let line: serde_json::Value = serde_json::from_str(added.trim_end()).expect("one line");
    assert_eq!(
        (line["phase"].as_str(), line["again"].as_bool()),
        (Some("eval"), Some(true))
    );
    assert_eq!(line["step"], 2);
    assert_eq!(
        s.after.accuracy,
        line["accuracy"].as_f64().expect("accuracy")
    );
    // The lines of an uninterrupted run carry no "again" key.
    assert!(!metrics.contains("\"again\""));
}

/// `allow_config_change` (`--allow-config-change`): a longer run resumes, each changed key
/// appended to config_changes.jsonl with the step; config.toml stays as created, and the next
/// start with the changed config finds it the run's own.
#[test]
fn an_allowed_change_is_appended_to_config_changes_jsonl() {
    let root = crate::scratch("config-allowed");
    let short = small_config(&root, "grown", 2);
    let dir = terse_train::train(&short).expect("short").dir;
    let created = std::fs::read(dir.join("config.toml")).expect("config.toml");
    let mut longer = small_config(&root, "grown", 3);
    longer.run.seed = 5;
    let e = one_line(terse_train::train(&longer));
    assert!(
        e.contains("grpo.steps = 2 in config.toml, 3 now")
            && e.contains("run.seed = 0 in config.toml, 5 now"),
        "{e}"
    );
    assert!(!dir.join("config_changes.jsonl").exists());
    let grown = crate::train::resume_changed(&longer).expect("allowed");
    assert!(!grown.already_finished);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("config_changes.jsonl"))
        .expect("config_changes.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(
        lines,
        [
            serde_json::json!({"step": 2, "key": "grpo.steps", "old": 2, "new": 3}),
            serde_json::json!({"step": 2, "key": "run.seed", "old": 0, "new": 5}),
        ]
    );
    assert_eq!(
        std::fs::read(dir.join("config.toml")).expect("config.toml"),
        created
    );
    let steps = terse_train::report::read_steps(&dir.join("metrics.jsonl")).expect("steps");
    assert_eq!(steps.iter().map(|s| s.step).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(terse_train::train(&longer).expect("same").already_finished);
}

/// A math dataset whose prompts (456 and 460 tokens) leave no room for 64 new tokens in the
/// testbed model's 512 positions.
fn overflowing(root: &Path, name: &str) -> RunConfig {
    let data = root.join("long.jsonl");
    let chain = |n: usize| "1 + 2 ;".repeat(n).replace(";1", "; 1");
    let (a, b) = (format!("{} 1 + 1 =", chain(113)), chain(115));
    std::fs::write(
        &data,
        format!(
            "{{\"problem\": \"{a}\", \"answer\": \"2\"}}\n{{\"problem\": \"{b}\", \"answer\": \"3\"}}\n"
        ),
    )
    .expect("data");
    let mut c = crate::from_sft(root, name, 1);
    c.data.task = terse_train::config::TaskKind::Math;
    c.data.train = Some(data.clone());
    c.data.eval = Some(data);
    c.data.columns.prompt = "problem".into();
    c.data.math_scorer = terse_train::config::MathScorer::Boxed;
    c.grpo.prompts_per_step = 2;
    c.grpo.group_size = 2;
    c.grpo.max_new_tokens = 64;
    c.eval.samples = 1;
    c
}

/// `data.context_overflow`: by default a prompt plus `grpo.max_new_tokens` past the model's
/// `max_position_embeddings` stops the start naming the row, before anything is written;
/// "truncate_generation" runs, each row's generation stopping at the context.
#[test]
fn a_context_overflow_is_an_error_naming_the_row_by_default() {
    let root = crate::scratch("config-overflow");
    let c = overflowing(&root, "overflow");
    let e = one_line(terse_train::train(&c));
    assert!(
        e.contains("long.jsonl row 2: a prompt of 460 tokens + grpo.max_new_tokens (64)")
            && e.contains("the longest of 4 such prompts")
            && e.contains("max_position_embeddings (512)")
            && e.contains("data.context_overflow"),
        "{e}"
    );
    assert!(!root.join("overflow/config.toml").exists());
    let mut t = overflowing(&root, "truncated");
    t.data.context_overflow = terse_train::config::ContextOverflow::TruncateGeneration;
    let s = terse_train::train(&t).expect("truncate_generation runs");
    let steps = terse_train::report::read_steps(&s.dir.join("metrics.jsonl")).expect("steps");
    assert!(
        steps.iter().all(|s| s.len_max.unwrap_or(0) <= 512 - 456),
        "a generation past the context"
    );
}
