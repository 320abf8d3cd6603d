//! One sampling step of one sequence: its drawn token recorded (draw.rs draws every ready
//! row's at once), the stop logic (EOS, stop strings, length, the model's context) and
//! Step-GRPO's probe at a trigger (`try_exit`, over a fork of the sequence's block table;
//! probes never touch a sample's random stream). The scheduler calls them for every running
//! sequence.

use crate::sampling::Drawn;
use crate::step_exit::{confidence, StepExit};
use crate::types::{Detokenizer, Finish, GenParams, Row};
use candle_core::{Result, Tensor, D};
use terse_model::{BlockTable, DecodeWeights, PagedKvCache, PagedSeq, Qwen3};

/// How many trailing tokens to decode for stop strings and triggers.
const TAIL: usize = 24;

fn tail(tokens: &[u32]) -> &[u32] {
    &tokens[tokens.len().saturating_sub(TAIL)..]
}

/// What follows a sampled token.
pub(crate) enum Next {
    /// The sample is finished (EOS, stop string, length).
    Done,
    /// Feed this token and go on.
    Feed(u32),
    /// This token completed a Step-GRPO trigger: probe before feeding it.
    Probe(u32),
}

/// Records a row's drawn token (drawn from its logits with its own uniform, the scheduler's
/// batch of draws) and says whether the sample stops, goes on, or reached a Step-GRPO trigger.
/// `plen` is the prompt's length; `limit` the model's context.
pub(crate) fn record_next(
    row: &mut Row,
    d: Drawn,
    params: &GenParams,
    detok: &dyn Detokenizer,
    plen: usize,
    limit: usize,
) -> Next {
    row.out.push(d.token, true, d.logp_sampled, d.logp_plain);
    row.out.entropy_sum += f64::from(d.entropy);
    row.out.entropy_tokens += 1;
    // Position of the sampled token, were it fed.
    let pos = plen + row.out.tokens.len() - 1;
    let text_now = || detok.decode(tail(&row.out.tokens));
    if params.eos_ids.contains(&d.token) {
        row.out.finish = Finish::Eos;
        return Next::Done;
    }
    if !params.stop_strings.is_empty() && {
        let now = text_now();
        let before = detok.decode(tail(&row.out.tokens[..row.out.tokens.len() - 1]));
        params
            .stop_strings
            .iter()
            .any(|s| now.contains(s.as_str()) && !before.contains(s.as_str()))
    } {
        row.out.finish = Finish::Stop;
        return Next::Done;
    }
    if row.out.tokens.len() >= params.max_new_tokens || pos + 1 >= limit {
        // pos + 1 tokens in the sequence now: the context is full.
        row.out.finish = Finish::Length;
        return Next::Done;
    }
    if let Some(se) = &params.step_exit {
        let probe_len = 1 + se.induction_ids.len() + se.max_ans_tokens + se.close_ids.len();
        if row.out.judge_count < se.max_judge_steps
            && pos + probe_len < limit
            && se.trigger_at_end(&text_now()).is_some()
        {
            row.out.judge_count += 1;
            return Next::Probe(d.token);
        }
    }
    Next::Feed(d.token)
}

/// Runs one Step-GRPO probe for a sequence (its table holds everything before its last sampled
/// token, at position `pos`) whose last token completed a trigger: fork its table, feed the
/// induction text, decode a greedy trial answer, and on confidence > δ finish the row with
/// path ⊕ induction ⊕ answer ⊕ close. The probe sees the path as the finished row keeps it: with
/// the trigger (Step-GRPO's text) or without (DEER's), so the answer's log-probs are the policy's
/// in the context it is trained in; with `probe_without_trigger` the row keeps the trigger the
/// probe did not see, and its answer is kept out of the loss. The probe's blocks are freed on return; the row's
/// random stream is not touched.
#[allow(clippy::too_many_arguments)]
pub(crate) fn try_exit(
    model: &Qwen3,
    snap: &DecodeWeights,
    cache: &mut PagedKvCache,
    table: &BlockTable,
    row: &mut Row,
    pos: u32,
    se: &StepExit,
    detok: &dyn Detokenizer,
) -> Result<bool> {
    debug_assert_eq!(table.len(), pos as usize);
    let probe_sees_trigger = se.include_trigger_on_exit && !se.probe_without_trigger;
    // The trigger's tokens, left out of the probe's context unless it sees the trigger.
    let strip = if probe_sees_trigger {
        0
    } else {
        trigger_tokens(&row.out.tokens, se, detok)
    };
    // ... and out of the kept path when the trigger is dropped.
    let drop = if se.include_trigger_on_exit { 0 } else { strip };
    // The path the probe continues: the table plus the last sampled token, less the trigger's
    // tokens when they are stripped (the table ends `strip - 1` tokens into the trigger).
    let last = row.out.tokens.len().saturating_sub(1);
    let (mut probe, lead) = match strip {
        0 => (cache.fork(table), &row.out.tokens[last..]),
        d => (cache.fork_prefix(table, pos as usize + 1 - d), &[][..]),
    };
    let out = probe_answer(model, snap, cache, &mut probe, lead, se, detok);
    cache.release(&mut probe);
    let (ans, lps) = out?;
    if confidence(&lps, se.confidence, se.skip_first_token) <= se.delta {
        return Ok(false);
    }
    let out = &mut row.out;
    let keep = out.tokens.len() - drop;
    out.tokens.truncate(keep);
    out.sampled.truncate(keep);
    out.logp_sampled.truncate(keep);
    out.logp_plain.truncate(keep);
    out.exit_step = Some(out.judge_count);
    out.exit_token = Some(out.tokens.len());
    for &t in &se.induction_ids {
        out.push(t, false, 0.0, 0.0);
    }
    // The answer is trained only where it was scored: in the context the row keeps.
    let scored_in_kept_context = strip == drop;
    for (&t, &lp) in ans.iter().zip(&lps) {
        if scored_in_kept_context {
            out.push(t, true, lp, lp);
        } else {
            out.push(t, false, 0.0, 0.0);
        }
    }
    for &t in &se.close_ids {
        out.push(t, false, 0.0, 0.0);
    }
    out.finish = Finish::EarlyExit;
    Ok(true)
}

/// How many trailing tokens the trigger that ends `tokens` spans: the fewest whose text covers
/// it (a trigger split over two tokens drops both). 0 when the tokens end with no trigger.
fn trigger_tokens(tokens: &[u32], se: &StepExit, detok: &dyn Detokenizer) -> usize {
    let Some(trigger) = se.trigger_at_end(&detok.decode(tail(tokens))) else {
        return 0;
    };
    let most = tokens.len().min(TAIL);
    (1..=most)
        .find(|&k| detok.decode(&tokens[tokens.len() - k..]).len() >= trigger.len())
        .unwrap_or(most)
}

/// The probe's greedy trial answer and its log-probs, decoded through the forked table after
/// `lead` (the path tokens the table does not hold yet) and the induction text.
fn probe_answer(
    model: &Qwen3,
    snap: &DecodeWeights,
    cache: &mut PagedKvCache,
    probe: &mut BlockTable,
    lead: &[u32],
    se: &StepExit,
    detok: &dyn Detokenizer,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let feed = |cache: &mut PagedKvCache, probe: &mut BlockTable, ids: &[u32]| {
        // The scheduler keeps enough blocks free for one probe.
        if !cache.reserve(probe, ids.len())? {
            return Err(candle_core::Error::Msg(
                "rollout: no kv block left for a Step-GRPO probe".into(),
            ));
        }
        let mut s = [PagedSeq {
            table: probe,
            tokens: ids,
        }];
        model.forward_paged(snap, cache, &mut s)?.squeeze(0) // (V)
    };
    let ids = [lead, &se.induction_ids].concat();
    let mut logits = feed(cache, probe, &ids)?;
    let (mut ans, mut lps) = (vec![], vec![]);
    for _ in 0..se.max_ans_tokens {
        let tok = logits.argmax(D::Minus1)?.to_scalar::<u32>()?;
        let lse = log_sum_exp(&logits)?;
        let lp = logits.get(tok as usize)?.to_scalar::<f32>()? - lse;
        ans.push(tok);
        let text = detok.decode(&ans);
        if se.answer_stops.iter().any(|s| text.contains(s.as_str())) {
            ans.pop();
            break;
        }
        lps.push(lp);
        logits = feed(cache, probe, &[tok])?;
    }
    Ok((ans, lps))
}

fn log_sum_exp(x: &Tensor) -> Result<f32> {
    let m = x.max(D::Minus1)?.to_scalar::<f32>()?;
    Ok(m + (x - f64::from(m))?
        .exp()?
        .sum_all()?
        .to_scalar::<f32>()?
        .ln())
}
