//! Data parallelism's gradient sums over a [`terse_dist::Collective`]: each rank computes the
//! gradients of its share of a mini-batch (with loss weights computed over the whole
//! mini-batch, so the shares add up to the global loss), then `all_reduce_grads` sums them
//! over ranks; every rank then holds the gradient a single process would compute for the whole
//! mini-batch (to float rounding). The tests here also check the split rollout (collect.rs)
//! and whole data-parallel steps (ZeRO-2 in zero.rs) against one process.

use crate::step::loss::LossStats;
use anyhow::{Context, Result};
use candle_core::{DType, Tensor, Var};
use std::collections::BTreeMap;
use terse_dist::Collective;
use terse_optim::Grads;

/// Sums `grads` over the ranks of `c`, parameter by parameter in key order (a parameter
/// without a gradient on some rank counts as zeros there). Every rank ends with the same bits.
pub fn all_reduce_grads(
    c: &mut dyn Collective,
    params: &BTreeMap<String, Var>,
    grads: &mut Grads,
) -> Result<()> {
    if c.world() == 1 {
        return Ok(());
    }
    let mut flat: Vec<f32> = Vec::new();
    let mut shapes = vec![];
    for (k, v) in params {
        let g = match grads.get(k) {
            Some(g) => g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
            None => vec![0.0; v.as_tensor().elem_count()],
        };
        shapes.push((
            k.clone(),
            v.as_tensor().shape().clone(),
            v.as_tensor().dtype(),
            g.len(),
        ));
        flat.extend(g);
    }
    c.all_reduce_sum(&mut flat)
        .with_context(|| format!("rank {}: summing gradients", c.rank()))?;
    let mut at = 0;
    for (k, shape, dtype, n) in shapes {
        let dev = params[&k].as_tensor().device().clone();
        let t = Tensor::from_slice(&flat[at..at + n], shape, &dev)?.to_dtype(dtype)?;
        grads.insert(k, t);
        at += n;
    }
    Ok(())
}

/// The loss statistics summed over ranks (in f64: counts and sums stay exact).
pub fn all_reduce_stats(c: &mut dyn Collective, st: LossStats) -> Result<LossStats> {
    let mut v = [
        st.loss,
        st.tokens as f64,
        st.clipped_low as f64,
        st.clipped_high as f64,
        st.kl_sum,
        st.logp_gap_sum,
    ];
    c.all_reduce_sum_f64(&mut v)
        .with_context(|| format!("rank {}: summing loss statistics", c.rank()))?;
    Ok(LossStats {
        loss: v[0],
        tokens: v[1] as usize,
        clipped_low: v[2] as usize,
        clipped_high: v[3] as usize,
        kl_sum: v[4],
        logp_gap_sum: v[5],
    })
}

/// Rollout correction's statistics over every rank: sums, and the largest ratio.
pub fn all_reduce_correction(
    c: &mut dyn Collective,
    st: crate::step::correction::CorrectionStats,
) -> Result<crate::step::correction::CorrectionStats> {
    let mut v = [st.gap_sum, st.tokens as f64, st.capped as f64];
    c.all_reduce_sum_f64(&mut v)
        .with_context(|| format!("rank {}: summing rollout-correction statistics", c.rank()))?;
    let maxima = c
        .all_gather(&[st.ratio_max as f32])
        .with_context(|| format!("rank {}: gathering the largest ratios", c.rank()))?;
    Ok(crate::step::correction::CorrectionStats {
        gap_sum: v[0],
        tokens: v[1] as usize,
        capped: v[2] as usize,
        ratio_max: maxima
            .iter()
            .fold(st.ratio_max, |m, &x| m.max(f64::from(x))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GrpoSection, LossAgg};
    use crate::step::batches::{gradients, MicroBatching, Objective, Seq};
    use crate::step::loss::{agg_weights, PpoParams};
    use std::time::Duration;
    use terse_dist::TcpGroup;
    use terse_model::testing::relative_diff;
    use terse_model::{Config, Qwen3};

    fn model() -> Qwen3 {
        let cfg = Config::synthetic(40, 32, 64, 2, 4, 2, 8, true).expect("config");
        Qwen3::random(cfg, 3, &candle_core::Device::Cpu, DType::F32).expect("model")
    }

    /// Eight sequences of mixed lengths with global token-mean weights.
    fn seqs() -> Vec<Seq> {
        let mut seqs: Vec<Seq> = (0..8usize)
            .map(|i| {
                let tokens: Vec<u32> = (0..6 + i)
                    .map(|j| ((i * 5 + j * 3) % 39 + 1) as u32)
                    .collect();
                let n = tokens.len() - 3;
                Seq {
                    tokens,
                    prompt_len: 3,
                    loss_mask: vec![true; n],
                    old_logp: vec![-3.0; n],
                    ref_logp: None,
                    is_weight: None,
                    advantage: i as f32 - 3.5,
                    weight: 0.0,
                }
            })
            .collect();
        let lens: Vec<usize> = seqs.iter().map(Seq::loss_tokens).collect();
        for (s, w) in seqs
            .iter_mut()
            .zip(agg_weights(LossAgg::TokenMean, &lens, 16))
        {
            s.weight = w as f32;
        }
        seqs
    }

    fn grads_of(m: &Qwen3, seqs: &[Seq]) -> Grads {
        let ppo = PpoParams::from(&GrpoSection::default());
        let how = MicroBatching {
            tokens: 64,
            packed: true,
        };
        gradients(m, seqs, Objective::Policy(&ppo), how)
            .expect("grads")
            .0
    }

    #[test]
    fn ranks_summing_their_shares_equal_one_process() {
        let whole = grads_of(&model(), &seqs());
        for world in [2usize, 4] {
            let out = TcpGroup::on_threads(world, Duration::from_secs(20), move |mut g| {
                let m = model();
                // Rank r's share: every world-th sequence from r.
                let r = g.rank();
                let mine: Vec<Seq> = seqs().into_iter().skip(r).step_by(world).collect();
                let mut grads = grads_of(&m, &mine);
                all_reduce_grads(&mut g, m.vars(), &mut grads)?;
                Ok(grads)
            });
            for (r, got) in out.into_iter().enumerate() {
                let got = got.expect("rank");
                for (k, a) in &whole {
                    let d = relative_diff(a, &got[k]).expect("diff");
                    assert!(d < 1e-6, "world {world} rank {r}: {k} differs by {d}");
                }
            }
        }
    }

    /// The testbed fixture with 4 prompts x 4 samples, dynamic sampling and Short-RL.
    fn small_run() -> crate::RunConfig {
        let mut cfg = crate::RunConfig::default();
        cfg.model.path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/testbed-sft"
        )
        .into();
        cfg.model.init = crate::config::Init::Checkpoint;
        cfg.sft.steps = 0;
        (
            cfg.grpo.prompts_per_step,
            cfg.grpo.group_size,
            cfg.grpo.max_new_tokens,
        ) = (4, 4, 32);
        cfg.grpo.dynamic_sampling = Some(crate::config::DynamicSampling { max_rounds: 2 });
        cfg.reward =
            toml::from_str("[shaper]\nmethod = \"short_rl\"\ntau_len = 2\n").expect("shaper");
        cfg
    }

    #[test]
    fn each_rank_rolls_out_its_share_and_sees_every_group() {
        for dynamic in [false, true] {
            let cfg = move || {
                let mut c = small_run();
                if !dynamic {
                    c.grpo.dynamic_sampling = None;
                }
                c
            };
            let one = crate::GrpoTrainer::builder(cfg())
                .build()
                .and_then(|mut t| t.rollout())
                .expect("one process");
            assert_eq!(one.held, (0..one.groups.len()).collect::<Vec<_>>());
            let world = 3;
            let out = TcpGroup::on_threads(world, Duration::from_secs(60), move |g| {
                let mut t = crate::GrpoTrainer::builder(cfg()).build()?;
                t.collective = Some(Box::new(g));
                t.rollout()
            });
            let mut held_by = vec![None; one.groups.len()];
            for (r, c) in out.into_iter().enumerate() {
                let c = c.expect("rank");
                // The statistics of every group, as one process has them.
                assert_eq!(c.groups, one.groups, "rank {r}");
                assert_eq!(c.extras, one.extras, "rank {r}");
                assert_eq!(c.prompts, one.prompts, "rank {r}");
                assert_eq!(
                    (c.cursor, c.rounds, c.dropped, c.generated_tokens),
                    (one.cursor, one.rounds, one.dropped, one.generated_tokens)
                );
                if !dynamic {
                    // One round of 4 groups: rank r rolls out every 3rd group from r.
                    let mine: Vec<usize> = (r..4).step_by(world).collect();
                    assert_eq!(c.held, mine, "rank {r}");
                }
                // The tokens of its own groups only, the same samples one process drew.
                let g = 4;
                for (i, &k) in c.held.iter().enumerate() {
                    assert_eq!(held_by[k].replace(r), None, "group {k} held twice");
                    assert_eq!(
                        c.samples[i * g..(i + 1) * g],
                        one.samples[k * g..(k + 1) * g]
                    );
                }
            }
            assert!(held_by.iter().all(Option::is_some), "{held_by:?}");
        }
    }

    /// Runs `steps` GRPO steps of the testbed fixture on `world` ranks (threads), through the
    /// collective when `grouped` (else as one plain process); returns rank 0's reports and
    /// final weights (after checking every rank ended with the same weights).
    fn grpo_run(
        world: usize,
        grouped: bool,
        steps: usize,
    ) -> (Vec<crate::StepReport>, BTreeMap<String, Tensor>) {
        let out = TcpGroup::on_threads(world, Duration::from_secs(60), move |g| {
            let cfg = small_run();
            let mut t = crate::GrpoTrainer::builder(cfg).build()?;
            if grouped {
                t.collective = Some(Box::new(g));
            }
            let reports = (0..steps)
                .map(|_| t.step())
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok((reports, t.policy.tensors()))
        });
        let mut out: Vec<_> = out.into_iter().map(|r| r.expect("rank")).collect();
        for (r, (_, w)) in out.iter().enumerate().skip(1) {
            for (k, a) in &out[0].1 {
                let d = (a - &w[k])
                    .and_then(|x| x.abs())
                    .and_then(|x| x.max_all())
                    .and_then(|x| x.to_scalar::<f32>());
                assert_eq!(
                    d.expect("d"),
                    0.0,
                    "rank {r} weight {k} differs from rank 0's"
                );
            }
        }
        out.swap_remove(0)
    }

    #[test]
    fn data_parallel_grpo_steps_equal_one_process() {
        let (one, w1) = grpo_run(1, false, 3);
        // World 1 with a collective takes the ZeRO-2 path too (what NCCL on one GPU runs).
        for world in [1, 2, 4] {
            let (many, w) = grpo_run(world, true, 3);
            for (a, b) in one.iter().zip(&many) {
                // What the rollout and shaping saw: identical (same samples on every rank).
                assert_eq!(
                    (a.reward, a.accuracy, a.len_mean, a.rounds),
                    (b.reward, b.accuracy, b.len_mean, b.rounds),
                    "world {world} step {}",
                    a.step
                );
                // What the summed gradients gave: equal to float rounding.
                assert!(
                    (a.loss - b.loss).abs() <= 1e-5 * a.loss.abs().max(1e-3),
                    "world {world}: loss {} vs {}",
                    a.loss,
                    b.loss
                );
                assert!(
                    (a.grad_norm - b.grad_norm).abs() <= 1e-5 * a.grad_norm,
                    "world {world}: grad norm {} vs {}",
                    a.grad_norm,
                    b.grad_norm
                );
            }
            for (k, a) in &w1 {
                let d = relative_diff(a, &w[k]).expect("diff");
                assert!(d < 1e-6, "world {world}: final {k} differs by {d}");
            }
        }
    }
}
