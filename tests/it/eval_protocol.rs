//! `cargo xtask eval`'s library path (terse_train::evals::run) on the committed testbed
//! SFT checkpoint: R1's sampling, accuracy at token budgets with the curve PNG, the efficiency
//! and AES tables against a base; and the benchmark configs of configs/eval/ loading their
//! layouts' fixtures into chat prompts.

use crate::{fixture, scratch, train::repo};
use terse_tasks::bench::Layout;
use terse_train::config::TaskKind;
use terse_train::evals::AesWeights;
use terse_train::evals::{run, EvalOptions, Protocol};
use terse_train::RunConfig;

/// What `xtask eval` builds from its testbed flags: levels 1-2 (whose completions end well
/// under 64 tokens), 8 problems each, 4 samples.
fn testbed_cfg() -> RunConfig {
    let mut cfg = RunConfig::default();
    cfg.data.levels = vec![1, 2];
    cfg.eval.per_level = 8;
    cfg.eval.samples = 4;
    cfg.grpo.max_new_tokens = 112;
    cfg
}

/// `--protocol r1 --budgets 16,32,64` with the checkpoint as its own base: the curve PNG is
/// written, AES is 0 with pass@k retention 1, and since no completion reaches 64 tokens the
/// accuracy at 64 is the accuracy of a run without budgets (its samples stop at 112).
#[test]
fn r1_with_budgets_against_itself() {
    let dir = scratch("eval-protocol");
    let sft = fixture("testbed-sft");
    let cfg = testbed_cfg();
    let opts = EvalOptions {
        protocol: Some(Protocol::R1),
        budgets: vec![16, 32, 64],
        plots: Some(dir.clone()),
        ..Default::default()
    };
    let o = run(&cfg, &sft, Some(&sft), &opts).expect("eval");
    let s = &o.setup;
    assert_eq!((s.sampling.temperature, s.sampling.top_p), (0.6, 0.95));
    assert_eq!((s.samples, s.max_new_tokens), (4, 64));
    assert_eq!(s.aes, AesWeights::default());

    let png = dir.join("eval_budgets.png");
    assert!(o.plots.contains(&png), "{:?}", o.plots);
    let bytes = std::fs::read(&png).expect("the curve");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{}",
        bytes.len()
    );

    let v = o.vs_base.expect("a base");
    let aes = v.aes.expect("defined");
    assert_eq!((aes.delta_len, aes.delta_acc, aes.score), (0.0, 0.0, 0.0));
    assert_eq!(v.pass_k_retention, Some(1.0));
    let md = terse_train::evals::markdown(&o);
    assert!(
        md.starts_with("protocol r1: temperature 0.6, top-p 0.95"),
        "{md}"
    );
    assert!(md.contains("α = 1, β+ = 3, β− = 5"), "{md}");
    assert!(
        md.contains("| model | 0.000 | 0.000 | 0.000 | 1.000 | 100.0% |"),
        "{md}"
    );

    let b = &o.model.budgets;
    assert_eq!(b.iter().map(|p| p.budget).collect::<Vec<_>>(), [16, 32, 64]);
    // Level 1's completions run about 17 tokens: the 16-token budget cuts most of them.
    assert!(b[0].forced_rate > 0.5, "{b:?}");
    assert!(b[0].accuracy < b[2].accuracy, "{b:?}");
    // No completion reaches the largest budget (nothing forced there), so at 64 every sample
    // is scored as sampled.
    assert_eq!(b[2].forced_rate, 0.0, "{b:?}");
    assert_eq!(o.model.efficiency.truncation_rate, 0.0);
    let plain = EvalOptions {
        protocol: Some(Protocol::R1),
        ..Default::default()
    };
    let p = run(&cfg, &sft, None, &plain).expect("eval without budgets");
    assert_eq!(p.setup.max_new_tokens, 112);
    assert!(p.model.budgets.is_empty() && p.vs_base.is_none());
    assert_eq!(b[2].accuracy, p.model.efficiency.accuracy);
    assert_eq!(o.model.report, p.model.report);
}

/// Every configs/eval/*.toml validates with R1's sampling, its benchmark's layout and
/// data/<bench>.jsonl; pointed at the layout's fixture, it renders chat prompts with the
/// instruction and reads the reference answers.
#[test]
fn eval_configs_load_their_layouts() {
    let cases = [
        ("aime2024", Layout::Aime2024, 2, "41"),
        ("aime2025", Layout::Aime2025, 2, "60"),
        ("amc23", Layout::Amc23, 2, "27"),
        ("math500", Layout::Math500, 3, "21"),
        ("minerva", Layout::Minerva, 2, "4.9"),
        ("olympiadbench", Layout::OlympiadBench, 2, "3, -3"),
        ("gsm8k", Layout::Gsm8k, 3, "1200"),
    ];
    let files = std::fs::read_dir(repo("configs/eval"))
        .expect("configs/eval")
        .count();
    assert_eq!(files, cases.len());
    for (name, layout, rows, first_answer) in cases {
        let mut c = RunConfig::from_file(&repo(&format!("configs/eval/{name}.toml")))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        c.validate().unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!((c.data.task, c.data.layout), (TaskKind::Math, Some(layout)));
        let data = format!("data/{name}.jsonl");
        assert_eq!(c.data.eval.as_deref(), Some(std::path::Path::new(&data)));
        let s = &c.grpo.sampling;
        assert_eq!(
            (s.temperature, s.top_p, c.grpo.max_new_tokens),
            (0.6, 0.95, 32768)
        );
        let f = fixture("datasets/bench").join(format!("{name}.jsonl"));
        c.data.train = Some(f.clone());
        c.data.eval = Some(f);
        let task = terse_train::task::Task::new(&c.data, &repo("models/qwen3-tokenizer"), 0)
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let items: Vec<_> = task
            .eval_items(0)
            .expect("items")
            .into_iter()
            .flat_map(|(_, v)| v)
            .collect();
        assert_eq!(items.len(), rows, "{name}");
        let first = items.iter().find(|i| i.row == Some(1)).expect("line 1");
        assert_eq!(first.answer, first_answer, "{name}");
        assert!(
            first.prompt.contains("<|im_start|>user")
                && first
                    .prompt
                    .contains("put your final answer within \\boxed{}"),
            "{name}: {}",
            first.prompt
        );
    }
}
