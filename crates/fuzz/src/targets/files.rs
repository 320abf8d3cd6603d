//! The targets whose parsers read a file by path: dataset rows (JSONL and Parquet, with the
//! column layouts terse's configs use), tokenizer.json (through the project's
//! `load_tokenizer`, then encoding and decoding), and the metrics reader behind the plots,
//! the repro summary and a resume (terse-train's crates/train/src/report.rs, the record flattening
//! of crates/train/src/records/tensorboard.rs, and crates/train/src/records/metrics.rs).

use super::{subdir, Ctx, Target};
use crate::corpus::Input;
use terse_tasks::dataset::{load, Columns};

/// dataset: JSONL and Parquet rows.
pub fn dataset() -> Target {
    Target {
        name: "dataset",
        about: "dataset::load of .jsonl and .parquet files with three column layouts (flat, \
                verl's nested ground truth, Logic-RL's K&K), bad rows refused and skipped",
        dict: include_str!("../../dict/dataset.dict"),
        words: None,
        max_len: 256 << 10,
        planted: false,
        builtin: &[],
        run: run_dataset,
    }
}

fn columns(prompt: &str, answer: &str, extra: &[&str]) -> Columns {
    Columns {
        prompt: prompt.into(),
        answer: answer.into(),
        extra: extra.iter().map(|e| e.to_string()).collect(),
    }
}

fn run_dataset(input: &Input, ctx: &Ctx) {
    let ext = if input.name.ends_with(".parquet") {
        "parquet"
    } else {
        "jsonl"
    };
    let path = ctx.file(&format!("rows.{ext}"), &input.bytes);
    let layouts = [
        (columns("question", "answer", &["level"]), false),
        (
            columns(
                "prompt",
                "reward_model.ground_truth",
                &["extra_info.index", "data_source"],
            ),
            true,
        ),
        (columns("quiz", "solution_text_format", &[]), true),
    ];
    for (cols, skip_bad_rows) in &layouts {
        let _ = load(&path, cols, *skip_bad_rows);
    }
}

/// tokenizer: tokenizer.json.
pub fn tokenizer() -> Target {
    Target {
        name: "tokenizer",
        about: "load::load_tokenizer (tokenizers::Tokenizer from tokenizer.json), then \
                load::encode of chat text, decode of the ids and of ids past the vocabulary",
        dict: include_str!("../../dict/tokenizer.dict"),
        words: None,
        max_len: 256 << 10,
        planted: false,
        builtin: &[],
        run: run_tokenizer,
    }
}

/// Texts every run encodes: a chat prompt with special tokens, a testbed problem, Unicode.
const SAMPLES: &[&str] = &[
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "Q x = 3 ; x + 4 ; x * 2 = ? A 14 Wait x + 4 = 7 <|endoftext|>",
    "caf\u{e9} \u{221a}2 \u{1f600} \t\r\n  \u{0}",
];

fn run_tokenizer(input: &Input, ctx: &Ctx) {
    let dir = subdir(ctx, "model");
    ctx.file("model/tokenizer.json", &input.bytes);
    let Ok(tok) = terse_train::step::load_tokenizer(&dir) else {
        return;
    };
    for s in SAMPLES {
        if let Ok(ids) = terse_train::step::encode(&tok, s) {
            let _ = tok.decode(&ids, false);
            let _ = tok.decode(&ids, true);
        }
    }
    let _ = tok.token_to_id("<|im_end|>");
    let _ = tok.get_vocab_size(true);
    // The rollout decodes whatever ids the model samples, up to the config's vocab_size, which
    // may exceed the tokenizer's.
    let _ = tok.decode(&[0, 1, 2, 29, 30, 151_643, 151_936, u32::MAX], false);
}

/// metrics: metrics.jsonl.
pub fn metrics() -> Target {
    Target {
        name: "metrics",
        about: "report::read_metrics / read_steps / read_evals / read_sft (what the plots and the \
                repro summary read), tensorboard::scalars_of per record, and MetricsWriter::open \
                of a resume keeping the lines it will not write again",
        dict: include_str!("../../dict/metrics.dict"),
        words: None,
        max_len: 256 << 10,
        planted: false,
        builtin: &[],
        run: run_metrics,
    }
}

fn run_metrics(input: &Input, ctx: &Ctx) {
    use terse_train::records::{MetricsWriter, Start};
    use terse_train::report;
    let path = ctx.file("metrics.jsonl", &input.bytes);
    if let Ok(lines) = report::read_metrics(&path) {
        for l in &lines {
            let _ = terse_train::records::scalars_of(l);
        }
    }
    let _ = report::read_steps(&path);
    let _ = report::read_evals(&path);
    let _ = report::read_sft(&path);
    let start = Start::Resumed {
        start: 2,
        steps: 4,
        eval_every: 1,
    };
    let _ = MetricsWriter::open(&path, start);
}
