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
