//! The paged rollout scheduler: samples identical (tokens, finish, log-probs) under any memory
//! budget (preemption and recompute included), sequence cap, prefill chunk and batch
//! composition; Step-GRPO exits unchanged under memory pressure; a prompt's K/V stored once for
//! its G samples; a budget below one sequence refused in one line.

use crate::rollout::{no_text, params, tiny};
use crate::step_exit::{detok, markov_model, step_params};
use std::collections::BTreeMap;
use terse_rollout::*;

type Key = (u64, usize);

fn by_key(s: &[Sample]) -> BTreeMap<Key, &Sample> {
    s.iter().map(|x| ((x.prompt_id, x.index), x)).collect()
}

/// Every sample of `got` equals the one of `want` with the same (prompt id, index): tokens,
/// finish and Step-GRPO records exactly, log-probs within 1e-6.
fn same(want: &[Sample], got: &[Sample], what: &str) {
    let w = by_key(want);
    for (k, g) in by_key(got) {
        let r = w[&k];
        assert_eq!(g.tokens, r.tokens, "{what}: tokens of {k:?}");
        assert_eq!(
            (g.finish, g.judge_count, g.exit_step, &g.sampled),
            (r.finish, r.judge_count, r.exit_step, &r.sampled),
            "{what}: {k:?}"
        );
        for (a, b) in g.logp_sampled.iter().zip(&r.logp_sampled) {
            assert!((a - b).abs() <= 1e-6, "{what}: {k:?} log-prob {a} vs {b}");
        }
    }
}

fn prompts() -> Vec<Prompt> {
    (0..5u64)
        .map(|i| Prompt {
            id: 100 + i,
            tokens: (0..3 + 9 * i as usize)
                .map(|j| ((i as usize * 31 + j * 7) % 200 + 3) as u32)
                .collect(),
        })
        .collect()
}

#[test]
fn samples_do_not_depend_on_budget_preemption_or_batch() {
    let m = tiny();
    let ps = prompts();
    let mut p = params(40);
    p.paging.block_size = 16;
    let (base, st) = generate_with_stats(&m, &ps, 4, &p, 7, &no_text).expect("unbounded");
    assert_eq!(st.preemptions, 0);
    assert!(
        base.iter().any(|s| s.tokens.len() > 20),
        "some samples run long"
    );
    // A pool for little more than one sequence: running sequences get preempted and recomputed.
    let mut tight = p.clone();
    tight.paging.kv_budget = KvBudget::Blocks(9);
    let (got, st) = generate_with_stats(&m, &ps, 4, &tight, 7, &no_text).expect("tight");
    assert!(st.preemptions > 0, "the tight budget must preempt: {st:?}");
    assert!(st.peak_blocks <= 9);
    same(&base, &got, "tight budget");
    // Few sequences at once, prompts prefilled in chunks of 16.
    let mut narrow = p.clone();
    narrow.paging.max_num_seqs = 3;
    narrow.paging.prefill_chunk = 16;
    same(
        &base,
        &generate(&m, &ps, 4, &narrow, 7, &no_text).expect("narrow"),
        "3 seqs",
    );
    // Other batch compositions: reversed, a subset, and the default 64-token blocks.
    let rev: Vec<Prompt> = ps.iter().rev().cloned().collect();
    same(
        &base,
        &generate(&m, &rev, 4, &p, 7, &no_text).expect("rev"),
        "reversed",
    );
    same(
        &base,
        &generate(&m, &ps[2..4], 3, &p, 7, &no_text).expect("sub"),
        "subset",
    );
    same(
        &base,
        &generate(&m, &ps, 4, &params(40), 7, &no_text).expect("64"),
        "block 64",
    );
}

#[test]
fn step_grpo_exits_are_unchanged_under_memory_pressure() {
    let m = markov_model(0.9);
    let ps: Vec<Prompt> = (0..6u64)
        .map(|i| Prompt {
            id: i,
            tokens: vec![2; 8 + i as usize],
        })
        .collect();
    // δ below the probe's confidence (every sample exits at its first trigger), and above it
    // (every sample probes up to the judge cap and goes on).
    for (delta, exit) in [(0.85, true), (0.95, false)] {
        let mut p = step_params(delta, true);
        p.sampling.temperature = 1.5;
        p.paging.block_size = 16;
        let (base, st) = generate_with_stats(&m, &ps, 4, &p, 3, &detok).expect("unbounded");
        assert_eq!(st.preemptions, 0);
        let exits = base
            .iter()
            .filter(|s| s.finish == Finish::EarlyExit)
            .count();
        assert_eq!(exits == base.len(), exit, "δ {delta}: {exits} exits");
        assert!(
            base.iter().all(|s| s.judge_count > 0),
            "δ {delta}: every sample probes"
        );
        p.paging.kv_budget = KvBudget::Blocks(7);
        let (got, st) = generate_with_stats(&m, &ps, 4, &p, 3, &detok).expect("tight");
        assert!(exit || st.preemptions > 0, "δ {delta}: {st:?}");
        same(&base, &got, "step-grpo tight budget");
    }
}

#[test]
fn a_prompt_is_stored_once_for_its_samples() {
    let m = tiny();
    let prompt = [Prompt {
        id: 1,
        tokens: (0..100).map(|j| (j * 3 % 250 + 3) as u32).collect(),
    }];
    let g = 6;
    let mut p = params(3);
    p.eos_ids.clear();
    p.paging.block_size = 16;
    let (_, st) = generate_with_stats(&m, &prompt, g, &p, 0, &no_text).expect("gen");
    let prompt_blocks = 100usize.div_ceil(16); // 7: 6 full blocks and a partial one
                                               // The prompt's blocks once, plus one copied partial block per sample; without sharing,
                                               // every sample would hold its own 7.
    assert!(
        st.peak_blocks <= prompt_blocks + g,
        "peak {} blocks",
        st.peak_blocks
    );
    assert!(st.peak_blocks < g * prompt_blocks);
}

#[test]
fn a_budget_below_one_sequence_is_refused_in_one_line() {
    let m = tiny();
    let mut p = params(100);
    p.paging.kv_budget = KvBudget::Blocks(2);
    let e = generate(&m, &prompts(), 2, &p, 0, &no_text)
        .expect_err("too small")
        .to_string();
    assert!(
        e.contains("kv_budget") && e.contains("cannot hold one sequence"),
        "{e}"
    );
    assert!(!e.contains('\n'));
}

/// Issue 44: one `PoolPlan` serves the scheduler and the memory plan. With a budget above every
/// sequence at once, the pool the scheduler builds for a Step-GRPO rollout (probe blocks
/// included) is the bytes `xtask plan` counts for the same config and prompt length.
#[test]
fn the_memory_plan_counts_the_pool_the_scheduler_builds() {
    let m = markov_model(0.5);
    let ps: Vec<Prompt> = (0..3u64)
        .map(|i| Prompt {
            id: i,
            tokens: vec![2; 21],
        })
        .collect();
    let mut p = step_params(0.9, true);
    p.paging.block_size = 16;
    p.paging.kv_budget = KvBudget::Blocks(1 << 20);
    let (_, st) = generate_with_stats(&m, &ps, 4, &p, 3, &detok).expect("rollout");
    let se = p.step_exit.clone().expect("exit");
    let pool = paging::PoolPlan::new(
        [(21, 3)],
        4,
        p.max_new_tokens,
        Some(&se),
        m.config.max_position_embeddings,
        16,
    );
    assert!(pool.probe_blocks > 0);
    assert_eq!(st.pool_blocks, pool.worst, "{pool:?}");

    let mut cfg = terse_train::RunConfig::default();
    cfg.grpo.prompts_per_step = 3;
    cfg.grpo.group_size = 4;
    cfg.grpo.max_new_tokens = p.max_new_tokens;
    cfg.grpo.paging = p.paging.clone();
    cfg.grpo.step_triggers = se.triggers.clone();
    cfg.grpo.step_exit = Some(se);
    let target = terse_train::planning::Target {
        cuda: false,
        device_bytes: None,
        device_total: None,
        gpus: 1,
        prompt_tokens: 21,
    };
    let plan = terse_train::planning::plan(&cfg, &m.config, target);
    let kv = plan
        .components
        .iter()
        .find(|c| c.name.starts_with("rollout KV"))
        .expect("the pool's line");
    assert_eq!(
        kv.bytes,
        (st.pool_blocks * st.block_bytes) as u64,
        "{}",
        plan.table()
    );
}
