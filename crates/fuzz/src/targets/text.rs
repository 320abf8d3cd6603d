//! The targets whose parsers take text: the TOML run config (parsed, validated, planned, and
//! its resolved form parsed back), the chat template (compiled from tokenizer_config.json and
//! rendered) and plain prompt templates, the K&K scorer and the math verifier (a completion
//! and a ground truth, both mutated).

use super::{split_pair, Ctx, Target};
use crate::corpus::Input;
use std::path::Path;
use terse_tasks::template::{render_plain, ChatTemplate, Message};
use terse_train::RunConfig;

/// config: the TOML run config.
pub fn config() -> Target {
    Target {
        name: "config",
        about: "RunConfig::from_toml (parse + validate), registry::check, configured_shaper, \
                ModelSection::forward_options, plan::plan, and the resolved config.toml a run \
                saves parsed back to the same config",
        dict: include_str!("../../dict/config.dict"),
        words: Some(method_names),
        max_len: 64 << 10,
        planted: false,
        builtin: &[],
        run: run_config,
    }
}

/// Every name `reward.shaper.method`, `advantage.estimator` and `grpo.loss` take, quoted as a
/// TOML string: the built-ins' enums list them (`terse_train::config::builtin_shapers` and its
/// siblings), so a new method reaches the dictionary without an edit here.
pub(super) fn method_names() -> Vec<String> {
    use terse_train::config::{builtin_estimators, builtin_losses, builtin_shapers};
    builtin_shapers()
        .iter()
        .chain(builtin_estimators())
        .chain(builtin_losses())
        .map(|n| format!("{n:?}"))
        .collect()
}

fn run_config(input: &Input, _: &Ctx) {
    let origin = Path::new("fuzz.toml");
    let Ok(cfg) = RunConfig::from_toml(&input.text(), origin) else {
        return;
    };
    let _ = terse_train::registry::check(&cfg);
    let _ = terse_train::registry::configured_shaper(&cfg);
    let _ = cfg.model.forward_options(&candle_core::Device::Cpu);
    // `xtask plan` and a GPU run's start plan memory from the config: sizes multiply there.
    let target = terse_train::planning::Target {
        cuda: true,
        device_bytes: Some(80 << 30),
        device_total: Some(80 << 30),
        gpus: 8,
        prompt_tokens: 1024,
    };
    let _ = terse_train::planning::plan(&cfg, &terse_model::Config::qwen3_0_6b(), target);
    // A run saves the resolved config as config.toml; what validated must parse back the same.
    // `to_toml` is what a run writes: registered methods' names go back where the file had them.
    let resolved = cfg
        .to_toml()
        .unwrap_or_else(|e| panic!("a valid config does not serialise: {e:#}"));
    let back = RunConfig::from_toml(&resolved, origin)
        .unwrap_or_else(|e| panic!("the resolved config does not parse back: {e:#}"));
    assert!(
        back == cfg,
        "the resolved config parses back to another config"
    );
}

/// template: the model's chat template, and the plain `{placeholder}` templates of prompts.
pub fn template() -> Target {
    Target {
        name: "template",
        about: "ChatTemplate::from_tokenizer_config and render (three conversations, generation \
                prompt and thinking on and off); render_plain for .txt seeds",
        dict: include_str!("../../dict/template.dict"),
        words: None,
        max_len: 64 << 10,
        planted: false,
        builtin: &[],
        run: run_template,
    }
}

fn run_template(input: &Input, _: &Ctx) {
    let text = input.text();
    if input.name.ends_with(".txt") {
        let _ = render_plain(&text, &[("quiz", "Q"), ("question", "Q"), ("prompt", "P")]);
        return;
    }
    let Ok(t) = ChatTemplate::from_tokenizer_config(&text) else {
        return;
    };
    let user = [Message::new("user", "What is 2+2?")];
    let turns = [
        Message::new("system", "Be brief."),
        Message::new("user", "What is 2+2?"),
        Message::new("assistant", "<think>\n2+2=4\n</think>\n\nThe answer is 4."),
        Message::new("user", "And 3+3?"),
    ];
    let odd = [Message::new("tool", ""), Message::new("", "{{ x }}")];
    let _ = t.render(&user, true, None);
    let _ = t.render(&turns, false, Some(false));
    let _ = t.render(&odd, true, Some(true));
}

/// kk: the Knights & Knaves scorer.
pub fn kk() -> Target {
    Target {
        name: "kk",
        about: "kk::score on a completion against a solution text, and kk::parse_solution",
        dict: include_str!("../../dict/kk.dict"),
        words: None,
        max_len: 64 << 10,
        planted: false,
        builtin: &[],
        run: run_kk,
    }
}

fn run_kk(input: &Input, _: &Ctx) {
    let text = input.text();
    let (completion, solution) = split_pair(&text);
    let _ = terse_tasks::kk::parse_solution(solution);
    let s = terse_tasks::kk::score(completion, solution);
    assert!(
        [3.0, -0.5, -1.0, -3.0].contains(&s.total),
        "K&K total {} is not one of Logic-RL's four",
        s.total
    );
}

/// math: the math verifier.
pub fn math() -> Target {
    Target {
        name: "math",
        about: "math::extract_boxed / extract_final_boxed / extract_gsm8k / extract_answer_tag, \
                normalize, numeric_value, equivalent, score_short_rl, score_easyr1",
        dict: include_str!("../../dict/math.dict"),
        words: None,
        max_len: 64 << 10,
        planted: false,
        builtin: &[],
        run: run_math,
    }
}

fn run_math(input: &Input, _: &Ctx) {
    use terse_tasks::math;
    let text = input.text();
    let (completion, truth) = split_pair(&text);
    let _ = math::extract_boxed(completion);
    let _ = math::extract_gsm8k(completion);
    let _ = math::extract_answer_tag(completion);
    let _ = math::normalize(truth);
    let _ = math::numeric_value(truth);
    if let Some(answer) = math::extract_final_boxed(completion) {
        let _ = math::normalize(&answer);
        let _ = math::numeric_value(&answer);
        let _ = math::equivalent(&answer, truth);
    }
    let (total, correct) = math::score_short_rl(completion, truth);
    assert!(
        [3.0, -0.5, -3.0].contains(&total) && correct == (total == 3.0),
        "Short-RL math reward ({total}, {correct}) is not one of its three"
    );
    let (overall, _, _) = math::score_easyr1(completion, truth, 0.1);
    assert!(
        (0.0..=1.0).contains(&overall),
        "EasyR1 reward {overall} outside [0, 1]"
    );
}
