//! Tasks against references: the Qwen3 chat template rendered by minijinja equals the strings
//! HF transformers' apply_chat_template produced (scripts/make_chat_fixtures.py).

use crate::fixture;
use std::path::PathBuf;
use terse_tasks::template::{ChatTemplate, Message};

#[test]
fn qwen3_chat_template_matches_transformers_byte_for_byte() {
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/qwen3-tokenizer/tokenizer_config.json");
    let t = ChatTemplate::from_tokenizer_config(&std::fs::read_to_string(cfg).expect("config"))
        .expect("template");
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("chat_template").join("cases.json")).expect("cases"),
    )
    .expect("json");
    let cases = cases.as_array().expect("array");
    assert_eq!(cases.len(), 30);
    for c in cases {
        let messages: Vec<Message> =
            serde_json::from_value(c["messages"].clone()).expect("messages");
        let got = t
            .render(
                &messages,
                c["add_generation_prompt"].as_bool().expect("bool"),
                c["enable_thinking"].as_bool(),
            )
            .expect("render");
        assert_eq!(
            got,
            c["expected"].as_str().expect("str"),
            "case {} agp={} thinking={}",
            c["name"],
            c["add_generation_prompt"],
            c["enable_thinking"]
        );
    }
}

#[test]
fn datasets_load_from_jsonl_and_parquet_with_named_columns() {
    use terse_tasks::dataset::{load, Columns, PromptText};
    let cols = Columns {
        prompt: "question".into(),
        answer: "answer".into(),
        extra: vec!["level".into()],
    };
    let (j, _) = load(&fixture("datasets").join("flat.jsonl"), &cols, false).expect("jsonl");
    let (p, _) = load(&fixture("datasets").join("flat.parquet"), &cols, false).expect("parquet");
    assert_eq!(j.len(), 5);
    assert_eq!(
        j.iter().map(|r| (&r.prompt, &r.answer)).collect::<Vec<_>>(),
        p.iter().map(|r| (&r.prompt, &r.answer)).collect::<Vec<_>>()
    );
    assert_eq!(p[3].answer, "6");
    assert_eq!(p[2].extra[0].1, serde_json::json!(2));
    // verl layout: chat prompt, nested ground truth, zstd compression.
    let verl = Columns {
        prompt: "prompt".into(),
        answer: "reward_model.ground_truth".into(),
        extra: vec![],
    };
    let (v, _) = load(&fixture("datasets").join("verl.parquet"), &verl, false).expect("verl");
    assert_eq!(v.len(), 4);
    assert!(
        matches!(&v[1].prompt, PromptText::Chat(m) if m[0].content == "Puzzle 1" && m[0].role == "user")
    );
    assert_eq!(v[1].answer, "(1) Zoey is a knight");
}

#[test]
fn bad_dataset_rows_name_file_and_line_or_are_skipped_and_reported() {
    use terse_tasks::dataset::{load, Columns};
    let cols = Columns {
        prompt: "question".into(),
        answer: "answer".into(),
        extra: vec![],
    };
    let path = fixture("datasets").join("bad.jsonl");
    let e = load(&path, &cols, false).expect_err("bad row");
    assert!(
        e.contains("bad.jsonl") && e.contains("line 2") && e.contains("invalid JSON"),
        "{e}"
    );
    let (rows, report) = load(&path, &cols, true).expect("skipping");
    assert_eq!(rows.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 6]);
    assert_eq!(
        report.skipped.iter().map(|s| s.0).collect::<Vec<_>>(),
        [2, 3, 5]
    );
    assert!(
        report.skipped[1].1.contains("`answer` is missing"),
        "{:?}",
        report.skipped
    );
    assert!(
        report.skipped[2].1.contains("`question` must be a string"),
        "{:?}",
        report.skipped
    );
    let e = load(&fixture("datasets").join("nope.csv"), &cols, false).expect_err("format");
    assert!(
        e.contains("nope.csv") && e.contains("unknown dataset format"),
        "{e}"
    );
    let e = load(
        &fixture("datasets").join("flat.jsonl"),
        &Columns {
            prompt: "q".into(),
            answer: "answer".into(),
            extra: vec![],
        },
        false,
    )
    .expect_err("column");
    assert!(e.contains("line 1") && e.contains("`q` is missing"), "{e}");
}

#[test]
fn testbed_recipe_is_committed_loads_and_covers_every_trace() {
    use rand::SeedableRng;
    use terse_tasks::testbed::{model_config_json, tokenizer_json, Problem, Teacher, MAX_LEVEL};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/testbed");
    // The committed files are exactly what `cargo xtask make-testbed` writes.
    assert_eq!(
        std::fs::read_to_string(dir.join("tokenizer.json")).expect("tokenizer"),
        tokenizer_json()
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("config.json")).expect("config"),
        model_config_json()
    );
    let cfg = terse_model::Config::from_file(&dir.join("config.json")).expect("config parses");
    assert!(
        (500_000..1_500_000).contains(&cfg.num_parameters()),
        "{}",
        cfg.num_parameters()
    );
    let tok =
        tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizers loads it");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let v2 = Teacher {
        version: terse_tasks::testbed::Version::V2,
        recheck_prob: 0.5,
        hard_rate: 0.1,
        ..Teacher::default()
    };
    for (level, teacher) in (1..=MAX_LEVEL).flat_map(|l| [(l, Teacher::default()), (l, v2.clone())])
    {
        let p = Problem::generate(level, 7);
        let text = format!("{} {}", p.prompt(), teacher.trace(&p, &mut rng).text);
        let enc = tok.encode(text.as_str(), false).expect("encode");
        assert!(!enc.get_ids().contains(&1), "unknown token in {text}");
        assert_eq!(enc.get_ids().len(), text.split_whitespace().count());
        assert!(enc.get_ids().iter().all(|&i| (i as usize) < cfg.vocab_size));
        let back = tok.decode(enc.get_ids(), false).expect("decode");
        assert_eq!(back, text);
    }
}

#[test]
fn testbed_v2_problems_are_the_same_for_sft_training_and_evaluation_and_harder_by_level() {
    use terse_tasks::testbed::{Version, HARD_OPERANDS};
    use terse_train::config::DataSection;
    let data = DataSection {
        testbed: Version::V2,
        recheck_prob: 0.3,
        hard_rate: 0.08,
        ..DataSection::default()
    };
    let task = terse_train::task::Task::new(&data, &fixture("testbed-v2-sft"), 0).expect("task");
    let operands = |prompt: &str| -> Vec<u8> {
        let expr = prompt
            .split(" user ")
            .nth(1)
            .expect("user")
            .split(" mod")
            .next()
            .expect("mod");
        expr.split(" + ")
            .skip(1)
            .map(|d| d.parse().expect("operand"))
            .collect()
    };
    let mut hard_by_level = [0usize; 7];
    for (level, items) in task.eval_items(40).expect("eval items") {
        for it in items {
            let ops = operands(&it.prompt);
            assert_eq!(ops.len(), level, "{}", it.prompt);
            hard_by_level[level] += ops.iter().filter(|d| HARD_OPERANDS.contains(d)).count();
        }
    }
    assert_eq!(hard_by_level[1] + hard_by_level[2], 0, "{hard_by_level:?}");
    assert!(
        hard_by_level[3] > 0 && hard_by_level[3] < hard_by_level[6],
        "{hard_by_level:?}"
    );
    // SFT draws its problems from the same distribution as the GRPO steps (the teacher's).
    let teacher = data.teacher();
    let sft_hard: usize = (0..600)
        .map(|i| {
            let (p, trace) = terse_train::step::sft_example(0, i, &data.levels, &teacher);
            assert!(trace.ends_with("</answer> <|im_end|>"));
            p.ops
                .iter()
                .filter(|o| HARD_OPERANDS.contains(&o.1))
                .count()
        })
        .sum();
    let train_hard: usize = (0..600)
        .map(|i| {
            let it = task.train_item(i).expect("item");
            operands(&it.prompt)
                .iter()
                .filter(|d| HARD_OPERANDS.contains(d))
                .count()
        })
        .sum();
    assert!(
        sft_hard > 100 && train_hard > 100,
        "{sft_hard} {train_hard}"
    );
    // v1 (the default of an unset key) never has a hard operation.
    let v1 = terse_train::task::Task::new(&DataSection::default(), &fixture("testbed-sft"), 0)
        .expect("v1");
    assert!(
        (0..300).all(|i| operands(&v1.train_item(i).expect("item").prompt)
            .iter()
            .all(|d| !HARD_OPERANDS.contains(d)))
    );
}
