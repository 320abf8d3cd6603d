//! gpu-check's parity group for decode graphs (paged/graphs.rs): a small random Qwen3 decoding
//! five sequences of different lengths through its bucket graphs (`Qwen3::decode_graphed`)
//! and, on a second cache, through the uncaptured step (`forward_paged`, then `sample_rows`)
//! with the same uniforms; one sequence stops halfway, so two buckets are captured, one with
//! padding rows. Rows: draws that differ (token or log-probs, bit for bit) and captures made.
//! Off CUDA there are no graphs: both sides run uncaptured. Part of `parity::groups`.

use super::common::Row;
use crate::kernels::sample::{sample_rows, Warpers};
use crate::paged::{BlockTable, DecodeGraphs, PagedKvCache, PagedSeq};
use candle_core::{DType, Device, Result};

/// Prompts of 3, 9, 17, 30 and 41 tokens, 12 decode steps, the fourth sequence done after 6.
pub(super) fn decode_graphs(dev: &Device) -> Result<Vec<Row>> {
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let config = crate::Config::synthetic(512, 128, 256, 2, 4, 2, 64, true)?;
    // The decoding copy rollout reads: on CUDA, projections stacked (model/stacked.rs).
    let mut model = crate::Qwen3::random(config, 11, dev, dt)?.merged()?;
    model.stack_projections()?;
    let snap = model.decode_weights();
    let prompts: Vec<Vec<u32>> = [3u32, 9, 17, 30, 41]
        .iter()
        .map(|&n| (0..n).map(|i| (i * 7 + n) % 512).collect())
        .collect();
    let new_cache = || model.new_paged_cache(16, 64, dt);
    let (mut a, mut b): (PagedKvCache, PagedKvCache) = (new_cache()?, new_cache()?);
    let w = Warpers {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        min_p: 0.0,
    };
    let mut graphs = DecodeGraphs::new(&model, &mut a, 8, 64, w)?;
    let mut tables: [Vec<BlockTable>; 2] = Default::default();
    let mut last = vec![];
    // The prompts, prefilled the same way into both caches.
    for (side, cache) in [&mut a, &mut b].into_iter().enumerate() {
        for p in &prompts {
            let mut t = BlockTable::default();
            if !cache.reserve(&mut t, p.len())? {
                crate::fail!("parity: decode graph pool too small");
            }
            let mut s = [PagedSeq {
                table: &mut t,
                tokens: p,
            }];
            let logits = model.forward_paged(&snap, cache, &mut s)?; // (1, V)
            if side == 0 {
                last.push(sample_rows(&logits, &[0.25], &w)?[0].token);
            }
            tables[side].push(t);
        }
    }
    let (mut differ, mut rows_drawn) = (0usize, 0usize);
    for step in 0..12u64 {
        let live: Vec<usize> = (0..prompts.len()).filter(|&r| r != 3 || step < 6).collect();
        let us: Vec<f64> = live
            .iter()
            .map(|&r| ((step * 31 + r as u64 * 17) % 97) as f64 / 97.0)
            .collect();
        let ids: Vec<[u32; 1]> = live.iter().map(|&r| [last[r]]).collect();
        let [ta, tb] = &mut tables;
        let mut draws = vec![];
        for (side, (cache, ts)) in [(&mut a, ta), (&mut b, tb)].into_iter().enumerate() {
            let mut seqs = vec![];
            for (r, t) in ts.iter_mut().enumerate() {
                let Some(k) = live.iter().position(|&l| l == r) else {
                    continue;
                };
                if !cache.reserve(t, 1)? {
                    crate::fail!("parity: decode graph pool too small");
                }
                seqs.push(PagedSeq {
                    table: t,
                    tokens: &ids[k],
                });
            }
            let d = match (side, graphs.as_mut()) {
                (0, Some(g)) if g.fits(&seqs) => model.decode_graphed(g, cache, &mut seqs, &us)?,
                _ => {
                    let logits = model.forward_paged(&snap, cache, &mut seqs)?; // (B, V)
                    sample_rows(&logits, &us, &w)?
                }
            };
            draws.push(d);
        }
        for (i, (g, u)) in draws[0].iter().zip(&draws[1]).enumerate() {
            let same = g.token == u.token
                && g.logp_sampled.to_bits() == u.logp_sampled.to_bits()
                && g.logp_plain.to_bits() == u.logp_plain.to_bits();
            differ += usize::from(!same);
            rows_drawn += 1;
            // Both sides go on with the uncaptured draw, so one difference does not spread.
            last[live[i]] = u.token;
        }
    }
    let captures = graphs.as_ref().map_or(0, DecodeGraphs::captures);
    if let Some(g) = graphs {
        g.release(&mut a);
    }
    Ok(vec![
        Row {
            name: format!("decode graph draws that differ from uncaptured ones (of {rows_drawn})"),
            max_diff: differ as f64,
            tolerance: 0.0,
        },
        Row {
            name: "decode graph buckets captured, short of the 2 expected (cuda)".into(),
            max_diff: if dev.is_cuda() {
                2.0 - captures as f64
            } else {
                0.0
            },
            tolerance: 0.0,
        },
    ])
}
