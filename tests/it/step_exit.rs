//! Step-GRPO's early exit in the rollout: exits exactly when the trial answer is confident, on a
//! constructed Markov-chain model, and scores the trial answer in the context the finished row
//! keeps (trigger kept or dropped, one- and two-token triggers), on a random model.

use crate::rollout::{tiny, trainer_gap};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use terse_model::{Batch, Config, Padding, Qwen3};
use terse_rollout::*;

const VOCAB: [&str; 8] = [
    "<pad>",
    "<eos>",
    " a",
    " Wait",
    " \\boxed{",
    "7",
    "}",
    "<close>",
];

pub(crate) fn detok(ids: &[u32]) -> String {
    ids.iter().map(|&i| VOCAB[i as usize]).collect()
}

/// A one-layer Qwen3 whose attention and MLP are zero, so the next-token logits depend only on
/// the current token: logits(t -> u) = lm_head[u, t] · sqrt(H). `p7` is p("7" | "\boxed{").
pub(crate) fn markov_model(p7: f64) -> Qwen3 {
    let v = VOCAB.len();
    let cfg = Config::synthetic(v, v, 4, 1, 2, 1, 4, false).expect("cfg");
    let mut m = vec![vec![0f64; v]; v]; // m[t][u]: logit of u after t
    m[2][3] = 12.0; // " a" -> " Wait"
    m[3][2] = 12.0; // " Wait" -> " a"
    m[4][5] = (p7 / (1.0 - p7) * (v - 1) as f64).ln(); // "\boxed{" -> "7" with probability p7
    m[5][6] = 12.0; // "7" -> "}"
    let scale = (v as f64).sqrt();
    let mut t: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, shape) in cfg.expected_tensors() {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else if name == "model.embed_tokens.weight" {
            (0..n)
                .map(|i| f32::from(u8::from(i / v == i % v)))
                .collect()
        } else if name == "lm_head.weight" {
            (0..n).map(|i| (m[i % v][i / v] / scale) as f32).collect()
        } else {
            vec![0.0; n]
        };
        t.insert(
            name,
            Tensor::from_vec(data, shape, &Device::Cpu).expect("t"),
        );
    }
    Qwen3::from_tensors(cfg, t, DType::F32).expect("model")
}

pub(crate) fn step_params(delta: f64, include_trigger: bool) -> GenParams {
    let mut p = GenParams::new(12);
    p.eos_ids = vec![1];
    p.step_exit = Some(StepExit {
        triggers: vec!["Wait".into()],
        induction: String::new(),
        close: String::new(),
        induction_ids: vec![4],
        close_ids: vec![7],
        answer_stops: vec!["}".into()],
        max_ans_tokens: 5,
        delta,
        confidence: ConfidencePolicy::GeoMean,
        skip_first_token: false,
        max_judge_steps: 3,
        include_trigger_on_exit: include_trigger,
        probe_without_trigger: false,
    });
    p
}

#[test]
fn step_grpo_exits_exactly_when_confident_and_masks_injected_tokens() {
    let m = markov_model(0.97);
    let prompt = [Prompt {
        id: 0,
        tokens: vec![2],
    }];
    // The probe's confidence is p("7" | "\boxed{") as the model computes it.
    let conf = {
        let b = Batch::from_rows(&[vec![2, 3, 4]], 0, Padding::Left, &Device::Cpu).expect("b");
        let l = m
            .logits(&b)
            .expect("logits")
            .get(0)
            .expect("r")
            .get(2)
            .expect("t");
        let p = candle_core::Tensor::exp(
            &(&l - l.max(0).expect("m").to_scalar::<f32>().expect("s") as f64).expect("s"),
        )
        .expect("e");
        let p = (&p / p.sum_all().expect("s").to_scalar::<f32>().expect("s") as f64).expect("n");
        f64::from(p.to_vec1::<f32>().expect("v")[5])
    };
    assert!((conf - 0.97).abs() < 1e-3, "{conf}");

    // δ just below the confidence: exit at the first trigger.
    let out = generate(&m, &prompt, 2, &step_params(conf - 1e-4, true), 1, &detok).expect("gen");
    for s in &out {
        assert_eq!(s.finish, Finish::EarlyExit);
        assert_eq!(s.tokens, [3, 4, 5, 7], "{}", detok(&s.tokens));
        assert_eq!(s.sampled, [true, false, true, false]);
        assert_eq!(
            (s.judge_count, s.exit_step, s.exit_token, s.len()),
            (1, Some(1), Some(1), 2)
        );
        assert_eq!(s.logp_plain[1], 0.0);
        assert!((f64::from(s.logp_plain[2]).exp() - conf).abs() < 1e-5);
    }
    // Dropping the trigger on exit (DEER's convention).
    let out = generate(&m, &prompt, 1, &step_params(conf - 1e-4, false), 1, &detok).expect("gen");
    assert_eq!(out[0].tokens, [4, 5, 7]);
    assert_eq!(out[0].sampled, [false, true, false]);
    // Keeping the trigger but probing without it: the answer is injected, not trained.
    let mut p = step_params(conf - 1e-4, true);
    p.step_exit.as_mut().expect("se").probe_without_trigger = true;
    let out = generate(&m, &prompt, 1, &p, 1, &detok).expect("gen");
    assert_eq!(out[0].tokens, [3, 4, 5, 7]);
    assert_eq!(out[0].sampled, [true, false, false, false]);

    // δ just above: never exits; judges up to the cap, and the random stream is untouched, so the
    // tokens equal a run without Step-GRPO.
    let stay = generate(&m, &prompt, 2, &step_params(conf + 1e-4, true), 1, &detok).expect("gen");
    let mut plain = step_params(0.0, true);
    plain.step_exit = None;
    let reference = generate(&m, &prompt, 2, &plain, 1, &detok).expect("gen");
    for (s, r) in stay.iter().zip(&reference) {
        assert_eq!(s.finish, Finish::Length);
        assert_eq!(s.tokens, r.tokens);
        assert!(s.sampled.iter().all(|x| *x));
        assert_eq!((s.judge_count, s.exit_step), (3, None));
    }
}

/// Reads every fifth token as " Wait", and 1 and 2 (mod 5) as " Wa" and "it": a trigger that
/// takes one token or two.
fn split_wait(ids: &[u32]) -> String {
    ids.iter()
        .map(|&i| match i % 5 {
            0 => " Wait",
            1 => " Wa",
            2 => "it",
            _ => " x",
        })
        .collect()
}

#[test]
fn step_grpo_trial_answers_are_scored_in_the_context_the_row_keeps() {
    let m = tiny();
    let prompt = [Prompt {
        id: 3,
        tokens: vec![7, 8, 9],
    }];
    let run = |keep_trigger: bool, probe_without: bool| {
        let mut p = step_params(0.0, keep_trigger); // δ = 0: exit at the first trigger
        p.step_exit.as_mut().expect("se").probe_without_trigger = probe_without;
        p.max_new_tokens = 24;
        p.eos_ids.clear();
        p.sampling.temperature = 1.0;
        let se = p.step_exit.as_mut().expect("step exit");
        se.induction_ids = vec![13, 14];
        se.close_ids = vec![18];
        let out = generate(&m, &prompt, 24, &p, 5, &split_wait).expect("gen");
        for s in out.iter().filter(|s| s.finish == Finish::EarlyExit) {
            // The answer's log-probs are the policy's given the kept path and the induction.
            let gap = trainer_gap(&m, &prompt[0].tokens, s);
            assert!(
                gap < 1e-4,
                "keep {keep_trigger}: gap {gap} in {:?}",
                s.tokens
            );
        }
        out
    };
    let (kept, dropped) = (run(true, false), run(false, false));
    // Kept trigger, probed without it: the kept run's path with the dropped run's answer, and
    // that answer (scored in another context) out of the loss.
    let mixed = run(true, true);
    for ((x, k), d) in mixed.iter().zip(&kept).zip(&dropped) {
        assert_eq!(x.finish, k.finish);
        if x.finish != Finish::EarlyExit {
            continue;
        }
        let e = x.exit_token.expect("exit");
        assert_eq!(&x.tokens[..e], &k.tokens[..k.exit_token.expect("exit")]);
        let d_answer = &d.tokens[d.exit_token.expect("exit")..];
        assert_eq!(&x.tokens[e..], d_answer);
        assert!(x.sampled[e..].iter().all(|s| !s), "{:?}", x.sampled);
    }
    let mut dropped_tokens = vec![];
    for (k, d) in kept.iter().zip(&dropped) {
        assert_eq!(k.finish, d.finish, "the same path reaches the same trigger");
        if k.finish != Finish::EarlyExit {
            continue;
        }
        // The sampled path is the same; dropping removes exactly the trigger's tokens.
        let (pk, pd) = (
            &k.tokens[..k.exit_token.expect("exit")],
            &d.tokens[..d.exit_token.expect("exit")],
        );
        assert!(pk.starts_with(pd) && split_wait(pk).ends_with("Wait"));
        let trigger_len = match pk.last() {
            Some(t) if t % 5 == 0 => 1, // " Wait"
            _ => 2,                     // " Wa" "it"
        };
        assert_eq!(pk.len() - pd.len(), trigger_len, "{}", split_wait(pk));
        dropped_tokens.push(trigger_len);
    }
    assert!(
        dropped_tokens.contains(&1) && dropped_tokens.contains(&2),
        "both trigger shapes exited: {dropped_tokens:?}"
    );
}
