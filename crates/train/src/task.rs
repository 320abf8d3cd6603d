//! What a run trains on: the configured task turned into prompts with reference answers (`Item`s,
//! keyed by a data cursor) and a scorer for completions. Sits between the config and the rollout:
//! step/collect.rs asks for items, the sampler completes them, `Task::score` judges them.

use crate::config::{DataSection, MathScorer, TaskKind};
use crate::data;
use crate::task::score_fault::quiet_catch;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use terse_reward::{CompletionReward, Outcome, RewardFn, SampleStat, ScoreFault};
use terse_tasks::template::ChatTemplate;
use terse_tasks::{kk, math, testbed};

// The seeded draws behind a run's items, for tools that re-derive a run's prompts (the
// teacher premise of terse-study).
pub use crate::data::{mix, problem, TRAIN};

/// One prompt with its reference answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub prompt: String,
    pub answer: String,
    /// Difficulty level (testbed chain length, K&K people, a dataset's level column; 0 = none).
    pub level: usize,
    /// The dataset row it came from (None for generated items), for error messages.
    pub row: Option<usize>,
}

/// The longest dataset prompt of a task (`Task::check_context_longest`): where it is (file and
/// row), its tokens, and how many rows' prompts plus the generation limit pass the context.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LongestPrompt {
    pub at: String,
    pub tokens: usize,
    pub over: usize,
}

/// How a task's completion ends with its answer, which decides the text that forces one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerForm {
    /// The testbed: `</think> <answer> d </answer>` (testbed::verify reads nothing else, so
    /// v3's inline `= r ;` is not an answer there).
    Testbed,
    /// `</think>` then `<answer> ... </answer>`: Knights & Knaves and Short-RL's math rule.
    AnswerTag,
    /// `</think>` then a final `\boxed{...}`: EasyR1's and the plain boxed math scorers.
    Boxed,
}

#[derive(Clone)]
enum Scorer {
    Testbed,
    Kk,
    MathShortRl,
    MathEasyR1,
    MathBoxed,
    /// Research code's verifier (`Task::custom`): completion + reference -> `Outcome`.
    Custom(Arc<dyn RewardFn>),
}

impl Scorer {
    fn is(&self, other: &Scorer) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl std::fmt::Debug for Scorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scorer::Custom(_) => f.write_str("Custom"),
            Scorer::Testbed => f.write_str("Testbed"),
            Scorer::Kk => f.write_str("Kk"),
            Scorer::MathShortRl => f.write_str("MathShortRl"),
            Scorer::MathEasyR1 => f.write_str("MathEasyR1"),
            Scorer::MathBoxed => f.write_str("MathBoxed"),
        }
    }
}

/// The task of a run, with any dataset already loaded.
#[derive(Debug, Clone)]
pub struct Task {
    scorer: Scorer,
    levels: Vec<usize>,
    /// Rows of `data.train` / `data.eval` (empty for generated tasks).
    train: Vec<Item>,
    eval: Vec<Item>,
    /// The text template (preset resolved) for generated K&K puzzles.
    kk_template: String,
    /// The testbed version and its problem distribution (the SFT teacher's settings).
    testbed: testbed::Teacher,
    seed: u64,
    /// Research code's per-completion rewards with their weights (the builder's `.reward`),
    /// added to the verifier's base reward (`completion_reward`).
    rewards: Rewards,
}

/// TRL-shaped rewards with their weights, in the order given.
#[derive(Clone, Default)]
struct Rewards(Vec<(Arc<dyn CompletionReward>, f64)>);

impl std::fmt::Debug for Rewards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} weighted rewards", self.0.len())
    }
}

impl Task {
    /// A task of research code's own: training and evaluation items (prompt, reference
    /// answer, level) and any verifier, a closure `Fn(&str, &str) -> Outcome` included. The
    /// outcome's `correct`, `base_reward` and `format_ok` feed the shapers as the built-in
    /// scorers' do. Evaluation groups `eval` by level.
    pub fn custom(
        train: Vec<Item>,
        eval: Vec<Item>,
        verifier: impl RewardFn + 'static,
    ) -> Result<Self> {
        if train.is_empty() {
            bail!("Task::custom: no training items");
        }
        Ok(Task {
            scorer: Scorer::Custom(Arc::new(verifier)),
            levels: vec![],
            train,
            eval,
            kk_template: String::new(),
            testbed: testbed::Teacher::default(),
            seed: 0,
            rewards: Rewards::default(),
        })
    }

    /// Builds the task of `data`; datasets are loaded now, so a missing file fails before training.
    pub fn new(data: &DataSection, model_dir: &Path, seed: u64) -> Result<Self> {
        let scorer = match (data.task, data.math_scorer) {
            (TaskKind::Testbed, _) => Scorer::Testbed,
            (TaskKind::Kk, _) => Scorer::Kk,
            (TaskKind::Math, MathScorer::ShortRl) => Scorer::MathShortRl,
            (TaskKind::Math, MathScorer::EasyR1) => Scorer::MathEasyR1,
            (TaskKind::Math, MathScorer::Boxed) => Scorer::MathBoxed,
        };
        let mut task = Task {
            scorer: scorer.clone(),
            levels: data.levels.clone(),
            train: vec![],
            eval: vec![],
            kk_template: text_template(&data.template).to_string(),
            testbed: data.teacher(),
            seed,
            rewards: Rewards::default(),
        };
        if scorer.is(&Scorer::Testbed) {
            return Ok(task);
        }
        let chat = if data.template == "chat" {
            let p = model_dir.join("tokenizer_config.json");
            let json = std::fs::read_to_string(&p)
                .with_context(|| format!("data.template = \"chat\" needs {}", p.display()))?;
            Some(
                ChatTemplate::from_tokenizer_config(&json)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
            )
        } else {
            None
        };
        if scorer.is(&Scorer::Kk) && data.template == "chat" && data.train.is_none() {
            bail!("data.template: generated K&K puzzles need a text template with `{{prompt}}`");
        }
        match &data.train {
            Some(path) => task.train = load(path, data, chat.as_ref())?,
            None if scorer.is(&Scorer::Kk) => {}
            None => bail!(
                "data.train: the `{:?}` task needs a dataset file",
                data.task
            ),
        }
        if let Some(path) = &data.eval {
            task.eval = load(path, data, chat.as_ref())?;
        }
        Ok(task)
    }

    /// Adds a TRL-shaped per-completion reward with its weight (`GrpoTrainer::builder`'s
    /// `.reward`).
    pub(crate) fn add_reward(&mut self, f: Arc<dyn CompletionReward>, weight: f64) {
        self.rewards.0.push((f, weight));
    }

    /// The base reward the shaper sees for a completion the verifier gave `stat`: the
    /// verifier's plus each weighted per-completion reward
    /// (`terse_reward::combined_base_reward`); the verifier's own with none.
    pub(crate) fn completion_reward(
        &self,
        completion: &str,
        answer: &str,
        stat: &SampleStat,
    ) -> f64 {
        terse_reward::combined_base_reward(&self.rewards.0, completion, answer, stat)
    }

    /// Training item `index` of the data cursor (datasets wrap around).
    pub fn train_item(&self, index: u64) -> Result<Item> {
        if !self.train.is_empty() {
            return Ok(self.train[(index % self.train.len() as u64) as usize].clone());
        }
        self.generated(data::TRAIN, index)
    }

    /// The evaluation items by level: `per_level` held-out problems for each generated level, or
    /// the eval dataset grouped by its level column (all of it under level 0 when it has none).
    pub fn eval_items(&self, per_level: usize) -> Result<Vec<(usize, Vec<Item>)>> {
        if self.scorer.is(&Scorer::Testbed) || (self.scorer.is(&Scorer::Kk) && self.eval.is_empty())
        {
            return self
                .levels
                .iter()
                .map(|&l| {
                    let items = (0..per_level as u64)
                        .map(|j| self.generated_at(data::EVAL, data::eval_index(l, j), l))
                        .collect::<Result<_>>()?;
                    Ok((l, items))
                })
                .collect();
        }
        let mut by: std::collections::BTreeMap<usize, Vec<Item>> = Default::default();
        for it in &self.eval {
            by.entry(it.level).or_default().push(it.clone());
        }
        Ok(by.into_iter().collect())
    }

    fn generated(&self, stream: u64, index: u64) -> Result<Item> {
        let level = data::level_at(&self.levels, index);
        self.generated_at(stream, index, level)
    }

    fn generated_at(&self, stream: u64, index: u64, level: usize) -> Result<Item> {
        let seed = data::mix(self.seed, stream, index);
        Ok(match self.scorer {
            Scorer::Testbed => {
                let p = self.testbed.problem(level, seed);
                Item {
                    prompt: p.prompt(),
                    answer: p.answer().to_string(),
                    level,
                    row: None,
                }
            }
            _ => {
                let p = kk::generate(level, seed);
                Item {
                    prompt: fill(&self.kk_template, &p.quiz())
                        .map_err(|e| anyhow::anyhow!("data.template: {e}"))?,
                    answer: p.solution_text(),
                    level,
                    row: None,
                }
            }
        })
    }

    /// Scores `completion` (the text after the prompt). An unparsable completion is a zero (or
    /// the scorer's format penalty) with `format_ok = false`, never an error; so is one the
    /// scorer (built-in or research code's) panics on, with one warning naming the item.
    pub fn score(&self, item: &Item, completion: &str) -> Outcome {
        match quiet_catch(|| self.score_unguarded(item, completion)) {
            Ok(s) => s,
            Err(why) => {
                let row = item
                    .row
                    .map_or("a generated item".to_string(), |r| format!("row {r}"));
                tracing::warn!(
                    "the {:?} scorer panicked on {row} (level {}): {why}; scored as wrong",
                    self.scorer,
                    item.level
                );
                Outcome {
                    correct: false,
                    base_reward: 0.0,
                    format_ok: false,
                    fault: Some(ScoreFault::Panicked),
                    ..Default::default()
                }
            }
        }
    }

    fn score_unguarded(&self, item: &Item, completion: &str) -> Outcome {
        match &self.scorer {
            Scorer::Testbed => {
                let v = item
                    .answer
                    .parse::<u8>()
                    .map(|a| testbed::verify(completion, a));
                match v {
                    Ok(v) => Outcome {
                        correct: v.correct,
                        base_reward: v.reward,
                        format_ok: v.format_ok,
                        ..Default::default()
                    },
                    Err(_) => Outcome {
                        correct: false,
                        base_reward: 0.0,
                        format_ok: false,
                        ..Default::default()
                    },
                }
            }
            // Logic-RL and Short-RL score prompt ⊕ response (they split on the assistant marker).
            Scorer::Kk => {
                let s = kk::score(&format!("{}{completion}", item.prompt), &item.answer);
                Outcome {
                    correct: s.correct,
                    base_reward: s.total,
                    format_ok: s.format_score > 0.0,
                    ..Default::default()
                }
            }
            Scorer::MathShortRl => {
                let (r, correct, why) = math::score_short_rl_checked(
                    &format!("{}{completion}", item.prompt),
                    &item.answer,
                );
                Outcome {
                    correct,
                    base_reward: r,
                    format_ok: r > -3.0,
                    fault: why.map(crate::task::score_fault::of_unverifiable),
                    ..Default::default()
                }
            }
            Scorer::MathEasyR1 => {
                // EasyR1 scores the response with the opening <think> the prompt ends with.
                let response = if item.prompt.trim_end().ends_with("<think>") {
                    format!("<think>{completion}")
                } else {
                    completion.to_string()
                };
                let (overall, acc, format, why) =
                    math::score_easyr1_checked(&response, &item.answer, 0.1);
                Outcome {
                    correct: acc > 0.0,
                    base_reward: overall,
                    format_ok: format > 0.0,
                    fault: why.map(crate::task::score_fault::of_unverifiable),
                    ..Default::default()
                }
            }
            Scorer::Custom(f) => f.score(completion, &item.answer),
            // GRPO-λ's and CARE's plain 0/1 correctness of the final \boxed{} answer(s).
            Scorer::MathBoxed => {
                let boxed = math::extract_final_boxed(completion);
                let verdict = boxed.as_deref().map(|a| math::check(a, &item.answer));
                let correct = verdict.is_some_and(math::Verdict::is_equal);
                Outcome {
                    correct,
                    base_reward: f64::from(u8::from(correct)),
                    format_ok: boxed.is_some(),
                    fault: verdict
                        .and_then(math::Verdict::unverifiable)
                        .map(crate::task::score_fault::of_unverifiable),
                    ..Default::default()
                }
            }
        }
    }

    /// Dataset prompts that leave no room for a completion in the model's context (`max_pos`
    /// positions) are an error naming the file and row, or with `data.skip_bad_rows` dropped
    /// with a warning. Generated prompts are short by construction. Returns the rows dropped.
    pub fn check_context(
        &mut self,
        data: &DataSection,
        count_tokens: impl Fn(&str) -> Result<usize>,
        max_pos: usize,
    ) -> Result<usize> {
        self.check_context_longest(data, count_tokens, max_pos, 0)
            .map(|(dropped, _)| dropped)
    }

    /// `check_context`, also returning the longest prompt kept, with the number of kept rows
    /// whose prompt plus `max_new` tokens pass `max_pos` (start.rs: `data.context_overflow`).
    pub(crate) fn check_context_longest(
        &mut self,
        data: &DataSection,
        count_tokens: impl Fn(&str) -> Result<usize>,
        max_pos: usize,
        max_new: usize,
    ) -> Result<(usize, Option<LongestPrompt>)> {
        let mut longest: Option<LongestPrompt> = None;
        let mut over = 0;
        let mut dropped = 0;
        for (items, file) in [(&mut self.train, &data.train), (&mut self.eval, &data.eval)] {
            let file = file
                .as_ref()
                .map_or("dataset".into(), |p| p.display().to_string());
            let mut keep = Vec::with_capacity(items.len());
            let before = dropped;
            for (i, it) in items.drain(..).enumerate() {
                let n = count_tokens(&it.prompt)?;
                if n < max_pos {
                    over += usize::from(n + max_new > max_pos);
                    if longest.as_ref().is_none_or(|l| n > l.tokens) {
                        longest = Some(LongestPrompt {
                            at: match it.row {
                                Some(r) => format!("{file} row {r}"),
                                None => format!("{file} item {}", i + 1),
                            },
                            tokens: n,
                            over: 0,
                        });
                    }
                    keep.push(it);
                    continue;
                }
                if !data.skip_bad_rows {
                    bail!(
                        "{file} row {}: the prompt has {n} tokens, no room for a completion within the model's max_position_embeddings ({max_pos}); shorten it or set data.skip_bad_rows = true",
                        it.row.unwrap_or_default()
                    );
                }
                dropped += 1;
            }
            if keep.is_empty() && dropped > before {
                bail!("{file}: every prompt is longer than the model's max_position_embeddings ({max_pos})");
            }
            *items = keep;
        }
        if dropped > 0 {
            tracing::warn!(
                "skipped {dropped} prompts longer than the model's max_position_embeddings ({max_pos})"
            );
        }
        Ok((dropped, longest.map(|l| LongestPrompt { over, ..l })))
    }

    /// How this task's completions end with an answer, for forcing one at a token budget
    /// (eval_budget.rs); None for research code's verifier, whose answer form terse cannot know.
    pub fn answer_form(&self) -> Option<AnswerForm> {
        match self.scorer {
            Scorer::Testbed => Some(AnswerForm::Testbed),
            Scorer::Kk | Scorer::MathShortRl => Some(AnswerForm::AnswerTag),
            Scorer::MathEasyR1 | Scorer::MathBoxed => Some(AnswerForm::Boxed),
            Scorer::Custom(_) => None,
        }
    }

    /// Rows of the training dataset (0 for generated tasks).
    pub fn train_rows(&self) -> usize {
        self.train.len()
    }
}

mod rows;
pub(crate) mod score_fault;
#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;

use rows::{fill, load, text_template};
