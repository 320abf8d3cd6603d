//! The policy losses and rollout correction end to end (issue 35): GSPO trains the testbed
//! from the SFT checkpoint, and rollout correction is a bit-exact no-op when the sampler's
//! log-probs are the trainer's and engages when they are not (an f16 KV cache).

use terse_train::config::{CorrectionLevel, CorrectionMethod, PolicyLossKind, RolloutCorrection};
use terse_train::step::{logprobs, MicroBatching};
use terse_train::{GrpoTrainer, RunConfig};

/// A GSPO run of 20 steps raises the mean reward (first 5 steps against the last 5), with the
/// paper's clip range and aggregation; GSPO-token takes the same first step to 1e-6.
#[test]
fn a_gspo_run_raises_the_reward_and_gspo_token_steps_alike() {
    let root = crate::scratch("losses-gspo");
    let mut c = crate::from_sft(&root, "gspo", 20);
    c.grpo.loss = PolicyLossKind::Gspo.into();
    c.grpo.loss_agg = terse_train::config::LossAgg::SeqMeanTokenMean;
    (c.grpo.prompts_per_step, c.grpo.group_size) = (4, 8);
    c.grpo.max_new_tokens = 96;
    c.data.levels = vec![3, 4, 5, 6];
    c.checkpoint.every = 0;
    c.reward = toml::from_str("[shaper]\nmethod = \"none\"\n").expect("reward");
    let mut t = GrpoTrainer::builder(c.clone()).build().expect("trainer");
    let rewards: Vec<f64> = (0..20).map(|_| t.step().expect("step").reward).collect();
    let first = rewards[..5].iter().sum::<f64>() / 5.0;
    let last = rewards[15..].iter().sum::<f64>() / 5.0;
    println!("GSPO mean reward: first 5 steps {first:.3}, last 5 steps {last:.3}");
    assert!(last > first, "GSPO did not learn: {rewards:?}");

    let mut one = c.clone();
    one.grpo.steps = 1;
    let step = |kind| {
        let mut c = one.clone();
        c.grpo.loss = terse_train::config::Chosen::Builtin(kind);
        let mut t = GrpoTrainer::builder(c).build().expect("trainer");
        t.step().expect("step");
        t.policy().tensors()["model.norm.weight"]
            .to_vec1::<f32>()
            .expect("w")
    };
    let (a, b) = (step(PolicyLossKind::Gspo), step(PolicyLossKind::GspoToken));
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(d < 1e-6, "GSPO and GSPO-token diverge by {d}");
}

/// One step's update of `cfg` from the SFT checkpoint, on a rollout whose sampler log-probs
/// are replaced by the trainer's own when `exact`; returns the report and the new weights.
fn update(cfg: RunConfig, exact: bool) -> (terse_train::StepReport, Vec<f32>) {
    let mut t = GrpoTrainer::builder(cfg.clone()).build().expect("trainer");
    let mut c = t.rollout().expect("rollout");
    if exact {
        let scored = t.score(&c).expect("score");
        let seqs = terse_train::step::sequences(&c, &scored.advantages.values, cfg.grpo.group_size);
        let how = MicroBatching::for_model(cfg.grpo.micro_batch_tokens, false, t.policy());
        let lp = logprobs(t.policy(), &seqs, how).expect("log-probs");
        for (s, lp) in c.samples.iter_mut().zip(lp) {
            let mut k = 0;
            for (m, old) in s.sampled.iter().zip(s.logp_plain.iter_mut()) {
                if *m {
                    *old = lp[k];
                    k += 1;
                }
            }
        }
    }
    let scored = t.score(&c).expect("score");
    let up = t.update(&c, &scored.advantages).expect("update");
    let report = t.report(&c, &scored, &up, Default::default());
    let w = t.policy().tensors()["model.layers.0.self_attn.q_proj.weight"]
        .flatten_all()
        .and_then(|x| x.to_vec1::<f32>())
        .expect("w");
    (report, w)
}

#[test]
fn rollout_correction_is_a_bit_exact_no_op_on_identical_numerics_and_engages_on_an_f16_cache() {
    let root = crate::scratch("losses-rc");
    let mut base = crate::from_sft(&root, "rc", 1);
    base.grpo.packing = false;
    let on = |mut c: RunConfig, method, level, cap| {
        c.grpo.rollout_correction = Some(RolloutCorrection { method, cap, level });
        c
    };
    // Identical numerics (the sampler's log-probs are the trainer's): every method and level
    // leaves the update bit for bit as it is without the correction.
    let (plain, w_off) = update(base.clone(), true);
    assert_eq!(plain.rc_logp_gap, None, "written without the correction");
    for method in [CorrectionMethod::Tis, CorrectionMethod::Mis] {
        for level in [CorrectionLevel::Token, CorrectionLevel::Sequence] {
            let (r, w) = update(on(base.clone(), method, level, 2.0), true);
            assert_eq!(w, w_off, "{method:?}/{level:?} changed the update");
            assert_eq!(
                (r.rc_logp_gap, r.rc_capped, r.rc_ratio_max),
                (Some(0.0), Some(0.0), Some(1.0))
            );
        }
    }
    // An f16 KV cache: the sampler's log-probs are not the trainer's, so the correction sees a
    // gap, caps ratios above a cap just over 1, and changes the update.
    let mut f16 = base.clone();
    f16.grpo.kv_cache = terse_rollout::KvCacheDtype::F16;
    let (_, w_f16) = update(f16.clone(), false);
    let (r, w) = update(
        on(f16, CorrectionMethod::Tis, CorrectionLevel::Token, 1.0001),
        false,
    );
    let gap = r.rc_logp_gap.expect("gap");
    let capped = r.rc_capped.expect("capped");
    println!(
        "f16 cache: mean |Δlogp| {gap:.2e}, capped {capped:.3}, max ratio {:?}",
        r.rc_ratio_max
    );
    assert!(gap > 1e-6, "no gap seen: {gap}");
    assert!(capped > 0.0 && capped < 1.0, "capped share {capped}");
    assert!(r.rc_ratio_max.expect("max") > 1.0001);
    assert_ne!(w, w_f16, "the correction did not change the update");
}
