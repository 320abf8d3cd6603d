//! Accuracy at token budgets (`cargo xtask eval --budgets`): each completion, sampled once at
//! the largest budget, is cut at every budget B it runs past, the task's forced-answer text is
//! appended, and a short answer is decoded greedily from that prefix and scored; a completion
//! that finished within B is scored as it is. Data flow: mod.rs's samples and verdicts -> here
//! -> protocol.rs's accuracy-against-budget points (docs/methods.md, Evaluation metrics).

use crate::eval::LevelSamples;
use crate::load::encode;
use crate::task::AnswerForm;
use crate::task::Task;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use terse_model::Qwen3;
use terse_rollout::{generate, Finish, GenParams, Prompt, Sample, SamplingParams};

/// The text that forces an answer after a cut completion, and how many tokens the answer may
/// take after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedAnswer {
    pub text: String,
    pub answer_tokens: usize,
}

/// The forced-answer text for a completion cut to `prefix` (its text so far). It closes the
/// thinking span unless the prefix already did, then opens the answer the task reads:
///
/// - testbed: ` </think> <answer>`, then up to 3 tokens (`d </answer> <|im_end|>`);
/// - `<answer>` tags: `\n</think>\n<answer>`, then up to 64 tokens (a K&K answer names every
///   person);
/// - boxed math: `\n</think>\n\nThe final answer is \boxed{`, then up to 32 tokens (the
///   answer-extraction phrase efficient-reasoning evaluations append after `</think>`).
///
/// A prefix that already opened the answer gets no text: the model only finishes it.
pub fn forced_answer(form: AnswerForm, prefix: &str) -> ForcedAnswer {
    let closed = prefix.contains("</think>");
    let (text, answer_tokens) = match form {
        AnswerForm::Testbed if prefix.contains("<answer>") => ("", 3),
        AnswerForm::Testbed if closed => (" <answer>", 3),
        AnswerForm::Testbed => (" </think> <answer>", 3),
        AnswerForm::AnswerTag if prefix.contains("<answer>") => ("", 64),
        AnswerForm::AnswerTag if closed => ("\n<answer>", 64),
        AnswerForm::AnswerTag => ("\n</think>\n<answer>", 64),
        AnswerForm::Boxed if closed => ("\n\nThe final answer is \\boxed{", 32),
        AnswerForm::Boxed => ("\n</think>\n\nThe final answer is \\boxed{", 32),
    };
    ForcedAnswer {
        text: text.to_string(),
        answer_tokens,
    }
}

/// The tokens a forced answer is decoded after (the prompt excluded): the completion's first
/// `budget` tokens, then the forced-answer text's tokens.
pub fn forced_prefix(
    tok: &tokenizers::Tokenizer,
    form: AnswerForm,
    completion: &[u32],
    budget: usize,
) -> Result<(Vec<u32>, ForcedAnswer)> {
    let cut = &completion[..budget.min(completion.len())];
    let text = tok.decode(cut, false).unwrap_or_default();
    let forced = forced_answer(form, &text);
    let mut ids = cut.to_vec();
    ids.extend(encode(tok, &forced.text)?);
    Ok((ids, forced))
}

/// Whether `s` ended by itself within `budget` tokens (scored as it is at that budget).
pub fn finished_within(s: &Sample, budget: usize) -> bool {
    matches!(s.finish, Finish::Eos | Finish::Stop) && s.tokens.len() <= budget
}

/// One sample at one budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AtBudget {
    pub correct: bool,
    /// It was cut and its answer forced.
    pub forced: bool,
    /// Tokens it spent: its length, or the cut, the forced text and the decoded answer.
    pub tokens: usize,
}

/// What forcing answers needs: the task (its scorer), its answer form, the model and tokenizer,
/// and the sampling settings whose end tokens and cache settings the greedy answers share.
pub struct Forcing<'a> {
    pub task: &'a Task,
    pub form: AnswerForm,
    pub model: &'a Qwen3,
    pub tok: &'a tokenizers::Tokenizer,
    pub gen: &'a GenParams,
}

impl Forcing<'_> {
    /// Every sample of `level` at every budget (`[budget][sample]`), from its completion and
    /// its verdict (`verdicts`, as eval::verdicts gives them). The forced answers of one budget
    /// are decoded together, greedily.
    pub fn at_budgets(
        &self,
        level: &LevelSamples,
        verdicts: &[(String, bool)],
        budgets: &[usize],
    ) -> Result<Vec<Vec<AtBudget>>> {
        let Forcing {
            task,
            form,
            model,
            tok,
            gen,
        } = *self;
        let n = level.samples.len() / level.items.len().max(1);
        let detok = |ids: &[u32]| tok.decode(ids, false).unwrap_or_default();
        budgets
            .iter()
            .map(|&budget| {
                let mut out: Vec<AtBudget> = level
                    .samples
                    .iter()
                    .zip(verdicts)
                    .map(|(s, v)| AtBudget {
                        correct: v.1,
                        forced: false,
                        tokens: s.tokens.len(),
                    })
                    .collect();
                let mut heads = vec![];
                let mut prompts = vec![];
                for (i, s) in level.samples.iter().enumerate() {
                    if finished_within(s, budget) {
                        continue;
                    }
                    let (head, forced) = forced_prefix(tok, form, &s.tokens, budget)?;
                    let mut tokens = level.prompts[i / n.max(1)].tokens.clone();
                    tokens.extend(&head);
                    prompts.push(Prompt {
                        id: i as u64,
                        tokens,
                    });
                    heads.push((i, head, forced.answer_tokens));
                }
                if prompts.is_empty() {
                    return Ok(out);
                }
                // One decode length for the budget: every form's answer fits its own bound, and
                // the end token stops each answer where it ends.
                let mut params = gen.clone();
                params.sampling = SamplingParams::greedy();
                params.max_new_tokens = heads.iter().map(|h| h.2).max().unwrap_or(1);
                params.step_exit = None;
                let answers = generate(model, &prompts, 1, &params, 0, &detok)?;
                for ((i, mut head, _), a) in heads.into_iter().zip(answers) {
                    head.extend(&a.tokens);
                    let item = &level.items[i / n.max(1)];
                    out[i] = AtBudget {
                        correct: task.score(item, &detok(&head)).correct,
                        forced: true,
                        tokens: head.len(),
                    };
                }
                Ok(out)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terse_tasks::testbed;

    fn testbed_tok() -> tokenizers::Tokenizer {
        testbed::tokenizer_json()
            .parse()
            .expect("testbed tokenizer")
    }

    /// The cut text of a hand-made testbed completion is exactly its first B tokens followed by
    /// the forced-answer prompt, before and after its `</think>`.
    #[test]
    fn the_cut_is_the_first_b_tokens_and_the_forced_answer() {
        let tok = testbed_tok();
        let text =
            "7 + 1 = 8 ; 8 + 2 = 0 ; Wait 8 + 2 = 0 ; </think> <answer> 0 </answer> <|im_end|>";
        let ids = encode(&tok, text).expect("encode");
        assert_eq!(ids.len(), 24);
        let cut = |b| {
            let (head, forced) = forced_prefix(&tok, AnswerForm::Testbed, &ids, b).expect("cut");
            (tok.decode(&head, false).expect("decode"), forced)
        };
        let (t, f) = cut(10);
        assert_eq!(t, "7 + 1 = 8 ; 8 + 2 = </think> <answer>");
        assert_eq!(f.answer_tokens, 3);
        // The first 10 tokens, then the 2 tokens of the forced prompt.
        let (head, _) = forced_prefix(&tok, AnswerForm::Testbed, &ids, 10).expect("cut");
        assert_eq!(&head[..10], &ids[..10]);
        assert_eq!(
            head[10..],
            encode(&tok, "</think> <answer>").expect("e")[..]
        );
        // Cut after `</think>`: only the answer is opened; after `<answer>`: nothing is added.
        assert_eq!(
            cut(20).0,
            "7 + 1 = 8 ; 8 + 2 = 0 ; Wait 8 + 2 = 0 ; </think> <answer>"
        );
        assert_eq!(
            cut(21).0,
            "7 + 1 = 8 ; 8 + 2 = 0 ; Wait 8 + 2 = 0 ; </think> <answer>"
        );
        assert_eq!(cut(21).1.text, "");
        // A budget past the end cuts nothing.
        assert_eq!(
            forced_prefix(&tok, AnswerForm::Testbed, &ids, 99)
                .expect("c")
                .0,
            ids
        );
    }

    /// The forced text of each form, in thinking and after it.
    #[test]
    fn forced_answer_texts() {
        let f = |form, prefix| forced_answer(form, prefix).text;
        assert_eq!(
            f(AnswerForm::Boxed, "so x = 2"),
            "\n</think>\n\nThe final answer is \\boxed{"
        );
        assert_eq!(
            f(AnswerForm::Boxed, "so x = 2\n</think>\n\nThus"),
            "\n\nThe final answer is \\boxed{"
        );
        assert_eq!(
            f(AnswerForm::AnswerTag, "Zoey lies"),
            "\n</think>\n<answer>"
        );
        assert_eq!(f(AnswerForm::AnswerTag, "</think>\n"), "\n<answer>");
        assert_eq!(f(AnswerForm::AnswerTag, "</think>\n<answer>(1)"), "");
        // A boxed answer forced and finished is what the boxed scorer reads.
        let done = format!("{}7}}", f(AnswerForm::Boxed, "so x = 7"));
        assert_eq!(
            terse_tasks::math::extract_final_boxed(&done).as_deref(),
            Some("7")
        );
    }

    /// A testbed completion forced at a budget scores as the verifier reads it.
    #[test]
    fn a_forced_testbed_answer_verifies() {
        let tok = testbed_tok();
        let ids = encode(&tok, "7 + 1 = 8 ; 8 + 2 = 0 ; Wait").expect("encode");
        let (mut head, _) = forced_prefix(&tok, AnswerForm::Testbed, &ids, 12).expect("cut");
        head.extend(encode(&tok, "0 </answer> <|im_end|>").expect("answer"));
        let text = tok.decode(&head, false).expect("decode");
        assert!(testbed::verify(&text, 0).correct, "{text}");
    }
}
