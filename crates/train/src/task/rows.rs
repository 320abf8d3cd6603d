//! Dataset files into `Item`s: a row's prompt rendered (the model's chat template, or a
//! `{prompt}` text template), its reference answer, and its level (`data.level_column`, or a
//! benchmark layout's own). The text templates' presets and `fill` are shared with the
//! generated tasks of task.rs.

use super::Item;
use crate::config::DataSection;
use anyhow::{bail, Result};
use std::path::Path;
use terse_tasks::dataset::{self, PromptText};
use terse_tasks::template::{render_plain, ChatTemplate, Message};

/// A text template's preset name resolved to its text (anything else is the template itself).
pub(super) fn text_template(name: &str) -> &str {
    match name {
        "logic_rl_base" => terse_tasks::template::LOGIC_RL_BASE,
        "logic_rl_qwen_instruct" => terse_tasks::template::LOGIC_RL_QWEN_INSTRUCT,
        other => other,
    }
}

/// Fills a text template's `{prompt}` (or Logic-RL's `{quiz}`) with the question.
pub(super) fn fill(template: &str, question: &str) -> Result<String, String> {
    render_plain(template, &[("prompt", question), ("quiz", question)])
}

/// A row's prompt as the model reads it: a chat row through the chat template (or, without
/// one, its last message through the text template); a text row through `data.user_template`
/// and the chat template, or through the text template.
fn render(
    prompt: &PromptText,
    data: &DataSection,
    chat: Option<&ChatTemplate>,
) -> Result<String, String> {
    match (prompt, chat) {
        (PromptText::Chat(m), Some(t)) => t.render(m, true, None),
        (PromptText::Text(s), Some(t)) => fill(&data.user_template, s)
            .and_then(|u| t.render(&[Message::new("user", &u)], true, None)),
        (PromptText::Chat(m), None) => fill(
            text_template(&data.template),
            m.last().map_or("", |m| m.content.as_str()),
        ),
        (PromptText::Text(s), None) => fill(text_template(&data.template), s),
    }
}

/// Loads a benchmark in its published layout (`data.layout`, terse_tasks::bench): the question
/// rendered as a text row's, the reference answer and level the layout's.
fn load_bench(
    path: &Path,
    layout: terse_tasks::bench::Layout,
    data: &DataSection,
    chat: Option<&ChatTemplate>,
) -> Result<Vec<Item>> {
    let rows = terse_tasks::bench::load(path, layout).map_err(anyhow::Error::msg)?;
    rows.into_iter()
        .map(|r| {
            let prompt = render(&PromptText::Text(r.question), data, chat)
                .map_err(|e| anyhow::anyhow!("{} row {}: {e}", path.display(), r.index))?;
            Ok(Item {
                prompt,
                answer: r.answer,
                level: r.level,
                row: Some(r.index),
            })
        })
        .collect()
}

/// Loads a dataset file into items: prompts rendered (chat template or `{prompt}` text
/// template), the level from `data.level_column` when set.
pub(super) fn load(
    path: &Path,
    data: &DataSection,
    chat: Option<&ChatTemplate>,
) -> Result<Vec<Item>> {
    if !path.is_file() {
        bail!("dataset {} does not exist", path.display());
    }
    if let Some(layout) = data.layout {
        return load_bench(path, layout, data, chat);
    }
    let mut cols = data.columns.clone();
    if let Some(l) = &data.level_column {
        cols.extra.push(l.clone());
    }
    let (rows, report) =
        dataset::load(path, &cols, data.skip_bad_rows).map_err(anyhow::Error::msg)?;
    if !report.skipped.is_empty() {
        tracing::warn!(
            "{}: skipped {} bad rows",
            path.display(),
            report.skipped.len()
        );
    }
    if rows.is_empty() {
        bail!("dataset {} has no usable rows", path.display());
    }
    rows.into_iter()
        .map(|r| {
            let prompt = render(&r.prompt, data, chat)
                .map_err(|e| anyhow::anyhow!("{} row {}: {e}", path.display(), r.index))?;
            let level = r
                .extra
                .iter()
                .find(|(k, _)| Some(k) == data.level_column.as_ref())
                .and_then(|(_, v)| {
                    v.as_u64()
                        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                })
                .unwrap_or(0) as usize;
            Ok(Item {
                prompt,
                answer: r.answer,
                level,
                row: Some(r.index),
            })
        })
        .collect()
}
