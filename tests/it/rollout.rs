//! Rollout: greedy against the transformers fixture, the sampler's distribution (chi-square),
//! seed and batch-composition invariance, sampler-vs-trainer log-probs and stops (Step-GRPO's
//! early exit is in step_exit.rs).

use crate::fixture;
use candle_core::{DType, Device};
use rand::SeedableRng;
use terse_model::{Batch, Padding, Qwen3};
use terse_rollout::sampling::{distribution, uniform};
use terse_rollout::*;

pub(crate) fn tiny() -> Qwen3 {
    Qwen3::load(&fixture("qwen3-tiny"), &Device::Cpu, DType::F32).expect("load")
}

pub(crate) fn no_text(_: &[u32]) -> String {
    String::new()
}

#[test]
fn greedy_generation_equals_transformers() {
    for name in ["qwen3-tiny", "qwen3-untied-1kv", "qwen2-tiny"] {
        let m = Qwen3::load(&fixture(name), &Device::Cpu, DType::F32).expect("load");
        let bytes = std::fs::read(fixture(name).join("reference.safetensors")).expect("ref");
        let r = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).expect("ref");
        let ids = |k: &str| -> Vec<u32> {
            r[k].flatten_all()
                .expect("f")
                .to_vec1::<i64>()
                .expect("v")
                .into_iter()
                .map(|x| x as u32)
                .collect()
        };
        let (prompt, full) = (ids("greedy_prompt"), ids("greedy_output"));
        assert_eq!(
            greedy(&m, &prompt, full.len() - prompt.len()).expect("greedy"),
            full[prompt.len()..],
            "{name}"
        );
        let nc =
            greedy_no_cache(&m, std::slice::from_ref(&prompt), 5, &Device::Cpu).expect("no cache");
        assert_eq!(nc[0], full[..prompt.len() + 5], "{name} without cache");
    }
}

/// Regularised upper incomplete gamma Q(a, x) (Numerical Recipes), for chi-square p-values.
fn gamma_q(a: f64, x: f64) -> f64 {
    let ln_gamma = |z: f64| {
        let c = [
            76.18009172947146,
            -86.50532032941677,
            24.01409824083091,
            -1.231739572450155,
            0.1208650973866179e-2,
            -0.5395239384953e-5,
        ];
        let mut y = z;
        let t = z + 5.5 - (z + 0.5) * (z + 5.5).ln();
        let s = c.iter().fold(1.000000000190015, |s, ci| {
            y += 1.0;
            s + ci / y
        });
        -t + (2.5066282746310005 * s / z).ln()
    };
    if x < a + 1.0 {
        let (mut sum, mut del, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..500 {
            ap += 1.0;
            del *= x / ap;
            sum += del;
        }
        1.0 - sum * (-x + a * x.ln() - ln_gamma(a)).exp()
    } else {
        let (mut b, mut c, mut d) = (x + 1.0 - a, 1e300, 1.0 / (x + 1.0 - a));
        let mut h = d;
        for i in 1..500 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            c = b + an / c;
            d = 1.0 / d;
            h *= d * c;
        }
        (-x + a * x.ln() - ln_gamma(a)).exp() * h
    }
}

/// Expected probabilities written out independently of the sampler's code.
fn expected(logits: &[f64], t: f64, keep: &[usize]) -> Vec<f64> {
    let w: Vec<f64> = logits
        .iter()
        .enumerate()
        .map(|(i, x)| {
            if keep.contains(&i) {
                (x / t).exp()
            } else {
                0.0
            }
        })
        .collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

#[test]
fn sampler_matches_softmax_and_truncations_by_chi_square() {
    let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0, -3.0];
    let l64: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    let all: Vec<usize> = (0..6).collect();
    // softmax(x / 0.8) = [.606, .174, .093, .050, .014, .001]; cumulative .606, .780, .873
    let cases = [
        (sampling(1.0, 0, 1.0, 0.0), expected(&l64, 1.0, &all)),
        (sampling(0.8, 0, 1.0, 0.0), expected(&l64, 0.8, &all)),
        (sampling(0.8, 3, 1.0, 0.0), expected(&l64, 0.8, &[0, 1, 2])),
        (sampling(0.8, 0, 0.85, 0.0), expected(&l64, 0.8, &[0, 1, 2])),
        (sampling(0.8, 0, 1.0, 0.1), expected(&l64, 0.8, &[0, 1, 2])),
        (sampling(1.0, 4, 0.9, 0.0), expected(&l64, 1.0, &[0, 1, 2])),
    ];
    for (i, (p, probs)) in cases.iter().enumerate() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
        let n = 20_000;
        let mut counts = [0usize; 6];
        for _ in 0..n {
            counts[sample_row(&logits, p, uniform(&mut rng)).token as usize] += 1;
        }
        let support: Vec<usize> = (0..6).filter(|&k| probs[k] > 0.0).collect();
        assert!(
            counts
                .iter()
                .enumerate()
                .all(|(k, &c)| probs[k] > 0.0 || c == 0),
            "case {i}: sampled outside the support {counts:?}"
        );
        let chi2: f64 = support
            .iter()
            .map(|&k| (counts[k] as f64 - n as f64 * probs[k]).powi(2) / (n as f64 * probs[k]))
            .sum();
        let pval = gamma_q((support.len() - 1) as f64 / 2.0, chi2 / 2.0);
        assert!(
            pval > 0.001,
            "case {i}: chi2 {chi2:.2}, p = {pval:.2e}, counts {counts:?}, expected {probs:?}"
        );
        // The reported sampled log-prob is the truncated distribution's.
        let d = sample_row(&logits, p, 0.0);
        assert!(
            (f64::from(d.logp_sampled) - probs[d.token as usize].ln()).abs() < 1e-6,
            "case {i}"
        );
    }
    assert_eq!(
        distribution(&logits, &SamplingParams::greedy()).0,
        vec![(0, 1.0)]
    );
    // A deliberately wrong expectation is rejected, so the test has teeth.
    assert!(gamma_q(2.5, 40.0 / 2.0) < 0.001);
}

pub(crate) fn params(max_new: usize) -> GenParams {
    let mut p = GenParams::new(max_new);
    p.eos_ids = vec![2];
    p
}

/// Sampling settings as a library user builds them: the defaults, then fields set.
fn sampling(temperature: f64, top_k: usize, top_p: f64, min_p: f64) -> SamplingParams {
    let mut s = SamplingParams::default();
    s.temperature = temperature;
    s.top_k = top_k;
    s.top_p = top_p;
    s.min_p = min_p;
    s
}

#[test]
fn samples_depend_only_on_seed_prompt_and_index() {
    let m = tiny();
    let a = Prompt {
        id: 11,
        tokens: vec![5, 9, 33, 100],
    };
    let b = Prompt {
        id: 12,
        tokens: vec![7, 8, 9, 10, 11, 12, 13, 14],
    };
    let c = Prompt {
        id: 13,
        tokens: vec![200],
    };
    let p = params(12);
    let alone = generate(&m, std::slice::from_ref(&a), 3, &p, 42, &no_text).expect("gen");
    let again = generate(&m, std::slice::from_ref(&a), 3, &p, 42, &no_text).expect("gen");
    assert_eq!(alone, again);
    let mixed = generate(&m, &[c.clone(), a.clone(), b], 3, &p, 42, &no_text).expect("gen");
    let a_in_mixed: Vec<_> = mixed
        .iter()
        .filter(|s| s.prompt_id == 11)
        .map(|s| s.tokens.clone())
        .collect();
    assert_eq!(
        a_in_mixed,
        alone.iter().map(|s| s.tokens.clone()).collect::<Vec<_>>()
    );
    let fewer = generate(&m, std::slice::from_ref(&a), 2, &p, 42, &no_text).expect("gen");
    assert_eq!(fewer[1].tokens, alone[1].tokens);
    let other_seed = generate(&m, &[a], 3, &p, 43, &no_text).expect("gen");
    assert_ne!(
        other_seed.iter().map(|s| &s.tokens).collect::<Vec<_>>(),
        alone.iter().map(|s| &s.tokens).collect::<Vec<_>>()
    );
}

#[test]
fn sampler_logprobs_equal_the_trainers_recomputation_and_stops_work() {
    let m = tiny();
    let prompts = [
        Prompt {
            id: 1,
            tokens: vec![5, 9, 33],
        },
        Prompt {
            id: 2,
            tokens: vec![60, 61, 62, 63, 64],
        },
    ];
    let mut p = params(16);
    p.sampling.temperature = 1.0;
    let out = generate(&m, &prompts, 4, &p, 7, &no_text).expect("gen");
    assert_eq!(out.len(), 8);
    for s in &out {
        let gap = trainer_gap(&m, &prompts[(s.prompt_id - 1) as usize].tokens, s);
        assert!(gap < 1e-4, "sampler vs trainer log-prob gap {gap}");
        assert!(
            s.logp_sampled
                .iter()
                .zip(&s.logp_plain)
                .all(|(a, b)| (a - b).abs() < 1e-5),
            "untruncated: same distribution"
        );
        match s.finish {
            Finish::Eos => assert_eq!(s.tokens.last(), Some(&2)),
            Finish::Length => assert_eq!(s.tokens.len(), 16),
            f => panic!("unexpected finish {f:?}"),
        }
    }
    // Stop strings: the fixture's decoder here maps every token to "x", so "xxx" stops at 3.
    let mut p = params(16);
    p.eos_ids.clear();
    p.stop_strings = vec!["xxx".into()];
    let xs = |ids: &[u32]| "x".repeat(ids.len());
    let out = generate(&m, &prompts[..1], 2, &p, 7, &xs).expect("gen");
    assert!(
        out.iter()
            .all(|s| s.finish == Finish::Stop && s.tokens.len() == 3),
        "{out:?}"
    );
}

/// The largest |sampler - trainer| log-prob over a sample's sampled tokens, the trainer
/// recomputing them with a full forward.
pub(crate) fn trainer_gap(m: &Qwen3, prompt: &[u32], s: &Sample) -> f32 {
    let row: Vec<u32> = prompt.iter().chain(&s.tokens).copied().collect();
    let batch = Batch::from_rows(std::slice::from_ref(&row), 0, Padding::Right, &Device::Cpu)
        .expect("batch");
    let sel: Vec<u32> = (prompt.len() - 1..row.len() - 1)
        .map(|i| i as u32)
        .collect();
    let lp = m
        .token_logprobs(&batch, &sel, &s.tokens, false)
        .expect("lp")
        .to_vec1::<f32>()
        .expect("v");
    // Injected tokens (Step-GRPO's induction and close) were not sampled and carry no log-prob.
    lp.iter()
        .zip(&s.logp_plain)
        .zip(&s.sampled)
        .filter(|(_, sampled)| **sampled)
        .map(|((a, b), _)| (a - b).abs())
        .fold(0f32, f32::max)
}

#[test]
fn an_f16_kv_cache_samples_near_the_trainers_policy() {
    let m = tiny();
    let prompt = vec![5, 9, 33, 100, 7];
    let prompts = [Prompt {
        id: 1,
        tokens: prompt.clone(),
    }];
    let mut p = params(24);
    p.kv_cache = KvCacheDtype::F16;
    let out = generate(&m, &prompts, 8, &p, 3, &no_text).expect("gen");
    let gap = out
        .iter()
        .map(|s| trainer_gap(&m, &prompt, s))
        .fold(0f32, f32::max);
    // K and V rounded to f16: the sampler's log-probs move off the trainer's, a little.
    assert!(
        gap > 1e-6 && gap < 2e-2,
        "f16 cache vs trainer log-prob gap {gap}"
    );
    let again = generate(&m, &prompts, 8, &p, 3, &no_text).expect("gen");
    assert_eq!(out, again, "an f16 cache samples deterministically too");
}
