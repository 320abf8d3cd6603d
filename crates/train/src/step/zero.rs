//! ZeRO-2 over a [`Collective`]: the parameters are split among the ranks in contiguous runs of
//! key order (`Partition`), each rank keeps AdamW state (moments, f32 master copies) for its own
//! parameters only, the gradients are reduce-scattered so each rank receives the sum of its
//! own, the clip uses the global norm (squared norms summed over ranks), each rank updates its
//! parameters, and the new values are all-gathered so every rank holds the whole model again.
//!
//! Data flow: `update::policy_update` (world > 1) -> `sharded_step` -> `Collective::
//! reduce_scatter_sum` / `all_reduce_sum_f64` / `all_gather` -> the rank's `AdamW` over its
//! parameters -> every `Var` set from the gathered values.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor, Var};
use std::collections::BTreeMap;
use terse_dist::Collective;
use terse_optim::{AdamW, Grads};

/// Which rank owns each parameter, and where it sits in the reduce-scatter buffer: rank r's
/// parameters fill part r (`len` values, zero-padded) in key order.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    pub world: usize,
    /// Values per part (the largest rank's share).
    pub len: usize,
    /// name -> (owner, offset within its owner's part, values).
    pub place: BTreeMap<String, (usize, usize, usize)>,
}

impl Partition {
    /// Contiguous runs of key order, cut where the running total crosses r / world of all
    /// values (a parameter goes to the rank its first value falls in).
    pub fn new(params: &BTreeMap<String, Var>, world: usize) -> Self {
        let total: usize = params.values().map(|v| v.elem_count()).sum();
        let mut place = BTreeMap::new();
        let (mut seen, mut fill) = (0usize, vec![0usize; world.max(1)]);
        for (k, v) in params {
            let n = v.elem_count();
            let owner = (seen * world)
                .checked_div(total)
                .unwrap_or(0)
                .min(world - 1);
            place.insert(k.clone(), (owner, fill[owner], n));
            fill[owner] += n;
            seen += n;
        }
        Self {
            world,
            len: fill.iter().copied().max().unwrap_or(0),
            place,
        }
    }

    /// Rank r's parameters.
    pub fn owned(&self, params: &BTreeMap<String, Var>, r: usize) -> BTreeMap<String, Var> {
        params
            .iter()
            .filter(|(k, _)| self.place.get(*k).is_some_and(|p| p.0 == r))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// One data-parallel optimizer step: `grads` are this rank's (its share of the mini-batch);
/// returns the global gradient norm before clipping. A non-finite norm (or `loss_ok` false)
/// returns before anything is updated, with the norm, so the caller can stop.
pub fn sharded_step(
    c: &mut dyn Collective,
    params: &BTreeMap<String, Var>,
    opt: &mut AdamW,
    grads: &Grads,
    max_norm: f64,
    lr: f64,
    loss_ok: bool,
) -> Result<f64> {
    let (rank, world) = (c.rank(), c.world());
    let part = Partition::new(params, world);
    // This rank keeps state for its parameters only (the first step drops the rest).
    opt.retain(|k| part.place.get(k).is_some_and(|p| p.0 == rank));
    let mut flat = vec![0f32; world * part.len];
    for (k, &(owner, off, n)) in &part.place {
        if let Some(g) = grads.get(k) {
            let g = g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            flat[owner * part.len + off..][..n].copy_from_slice(&g);
        }
    }
    let mine = c
        .reduce_scatter_sum(&flat)
        .with_context(|| format!("rank {rank}: reduce-scattering gradients"))?;
    // Which parameters have a gradient on some rank (AdamW leaves the others alone, weight
    // decay included, as one process would).
    let mut has: Vec<f64> = part
        .place
        .keys()
        .map(|k| f64::from(u8::from(grads.contains_key(k))))
        .collect();
    c.all_reduce_sum_f64(&mut has)
        .with_context(|| format!("rank {rank}: gathering which parameters have gradients"))?;
    let has: BTreeMap<&String, bool> = part
        .place
        .keys()
        .zip(has.iter().map(|&h| h > 0.0))
        .collect();
    // The global norm: each rank's squared sum (f64), summed over ranks.
    let mut sq = [mine
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()];
    c.all_reduce_sum_f64(&mut sq)
        .with_context(|| format!("rank {rank}: summing gradient norms"))?;
    let norm = sq[0].sqrt();
    if !norm.is_finite() || !loss_ok {
        return Ok(norm);
    }
    let coef = max_norm / (norm + 1e-6);
    // torch multiplies by the coefficient held as an f32 (terse_optim::clip_grad_norm).
    let scale = if coef < 1.0 { coef as f32 } else { 1.0 };
    let owned = part.owned(params, rank);
    let mut mine_grads = Grads::new();
    for (k, v) in &owned {
        let (_, off, n) = part.place[k];
        if has[k] {
            let vals: Vec<f32> = mine[off..off + n].iter().map(|x| x * scale).collect();
            let t = Tensor::from_vec(vals, v.as_tensor().shape(), v.device())?;
            mine_grads.insert(k.clone(), t);
        }
    }
    opt.step(&owned, &mine_grads, lr)?;
    // Every rank's new values, gathered; each parameter set from its owner's part.
    let mut out = vec![0f32; part.len];
    for (k, v) in &owned {
        let (_, off, n) = part.place[k];
        let vals = v
            .as_tensor()
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        out[off..off + n].copy_from_slice(&vals);
    }
    let all = c
        .all_gather(&out)
        .with_context(|| format!("rank {rank}: gathering updated parameters"))?;
    if all.len() != world * part.len {
        bail!(
            "rank {rank}: gathered {} values, expected {}",
            all.len(),
            world * part.len
        );
    }
    for (k, v) in params {
        let (owner, off, n) = part.place[k];
        if owner == rank {
            continue;
        }
        let vals = all[owner * part.len + off..][..n].to_vec();
        let t = Tensor::from_vec(vals, v.as_tensor().shape(), v.device())?;
        v.set(&t.to_dtype(v.dtype())?)?;
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::path::Path;
    use std::time::Duration;
    use terse_dist::TcpGroup;
    use terse_optim::clip_grad_norm;
    use terse_optim::AdamWConfig;

    fn params() -> BTreeMap<String, Var> {
        (0..5)
            .map(|i| {
                let n = [7usize, 130, 3, 64, 20][i];
                let v: Vec<f32> = (0..n).map(|j| ((i * 31 + j) as f32 * 0.37).sin()).collect();
                (
                    format!("p{i}"),
                    Var::from_tensor(&Tensor::new(v, &Device::Cpu).expect("t")).expect("v"),
                )
            })
            .collect()
    }

    /// Rank r's gradients: a rank-dependent share, so the sum over ranks is what counts.
    fn grads(p: &BTreeMap<String, Var>, r: usize, world: usize, step: usize) -> Grads {
        p.iter()
            .map(|(k, v)| {
                let n = v.elem_count();
                let g: Vec<f32> = (0..n)
                    .map(|j| ((j * 7 + r * 13 + step * 3) as f32 * 0.11).cos() / world as f32)
                    .collect();
                (k.clone(), Tensor::new(g, &Device::Cpu).expect("g"))
            })
            .collect()
    }

    #[test]
    fn partitions_cover_every_parameter_once_and_balance() {
        let p = params();
        for world in [1, 2, 3, 4] {
            let part = Partition::new(&p, world);
            let per_rank: Vec<usize> = (0..world)
                .map(|r| part.owned(&p, r).values().map(|v| v.elem_count()).sum())
                .collect();
            assert_eq!(per_rank.iter().sum::<usize>(), 224);
            assert_eq!(part.len, *per_rank.iter().max().expect("max"));
        }
    }

    #[test]
    fn sharded_steps_equal_one_full_adamw() {
        let cfg = AdamWConfig::default();
        // One process: summed gradients, clipped, a full AdamW, three steps.
        let full = params();
        let mut opt = AdamW::new(cfg.clone(), &full).expect("opt");
        for step in 0..3 {
            let mut sum: Grads = grads(&full, 0, 2, step);
            let other = grads(&full, 1, 2, step);
            for (k, g) in sum.iter_mut() {
                *g = (&*g + &other[k]).expect("add");
            }
            clip_grad_norm(&mut sum, 0.5).expect("clip");
            opt.step(&full, &sum, 1e-2).expect("step");
        }
        let out = TcpGroup::on_threads(2, Duration::from_secs(20), move |mut c| {
            let (r, p) = (c.rank(), params());
            let mut opt = AdamW::new(cfg.clone(), &p)?;
            for step in 0..3 {
                sharded_step(
                    &mut c,
                    &p,
                    &mut opt,
                    &grads(&p, r, 2, step),
                    0.5,
                    1e-2,
                    true,
                )?;
            }
            let w: BTreeMap<String, Tensor> = p
                .iter()
                .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
                .collect();
            Ok((w, opt.num_params()))
        });
        let mut states = 0;
        for o in out {
            let (w, n) = o.expect("rank");
            states += n;
            for (k, v) in &full {
                let d = terse_model::testing::relative_diff(v.as_tensor(), &w[k]).expect("diff");
                assert!(d < 1e-6, "{k}: {d}");
            }
        }
        // Each parameter's optimizer state lives on exactly one rank.
        assert_eq!(states, full.len());
    }

    /// Steps `from..to` of a sharded run on `world` ranks (threads), each rank's optimizer from
    /// the shards in `load` (else fresh) and saved into `save`; rank 0's gradients carry the
    /// whole step's (the others' are zero), so the sum is the same for any world size. Returns
    /// the final weights (every rank's, checked equal).
    fn sharded_run(
        world: usize,
        start: Option<&BTreeMap<String, Tensor>>,
        (from, to): (usize, usize),
        load: Option<&Path>,
        save: &Path,
    ) -> Result<BTreeMap<String, Tensor>> {
        let (start, load, save) = (
            start.cloned(),
            load.map(Path::to_path_buf),
            save.to_path_buf(),
        );
        let out = TcpGroup::on_threads(world, Duration::from_secs(20), move |mut c| {
            let (r, p) = (c.rank(), params());
            if let Some(w) = &start {
                for (k, v) in &p {
                    v.set(&w[k])?;
                }
            }
            let cfg = AdamWConfig::default();
            // As a resume does: the whole optimizer of the checkpoint, on any world size.
            let mut opt = match &load {
                Some(d) => AdamW::from_safetensors(
                    cfg.clone(),
                    &p,
                    &std::fs::read(d.join("optimizer.safetensors"))?,
                )?,
                None => AdamW::new(cfg.clone(), &p)?,
            };
            for step in from..to {
                let g = grads(&p, 0, 1, step);
                let g = if r == 0 {
                    g
                } else {
                    g.into_iter()
                        .map(|(k, t)| (k, t.zeros_like().expect("z")))
                        .collect()
                };
                sharded_step(&mut c, &p, &mut opt, &g, 0.5, 1e-2, true)?;
            }
            // As a checkpoint does (handoff::gather_optimizer): each rank's shard gathered and
            // merged at rank 0 into the whole optimizer.
            let part = Partition::new(&p, world);
            let mut mine = opt.clone();
            mine.retain(|k| part.place.get(k).is_some_and(|x| x.0 == r));
            let shards = c.all_gather_bytes(mine.to_safetensors()?)?;
            if r == 0 {
                let full = AdamW::from_shards(cfg, &p, &shards)?;
                std::fs::write(save.join("optimizer.safetensors"), full.to_safetensors()?)?;
            }
            Ok(p.iter()
                .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
                .collect::<BTreeMap<_, _>>())
        });
        let out: Vec<_> = out.into_iter().collect::<Result<_>>()?;
        for w in &out[1..] {
            for (k, a) in &out[0] {
                assert_eq!(
                    a.to_vec1::<f32>()?,
                    w[k].to_vec1::<f32>()?,
                    "ranks differ on {k}"
                );
            }
        }
        Ok(out.into_iter().next().expect("rank 0"))
    }

    #[test]
    fn resuming_on_other_world_sizes_equals_an_uninterrupted_run() {
        let root = std::env::temp_dir().join(format!("terse-zero-{}", std::process::id()));
        let dirs: Vec<_> = (0..4).map(|i| root.join(i.to_string())).collect();
        for d in &dirs {
            std::fs::create_dir_all(d).expect("dir");
        }
        let whole = sharded_run(2, None, (0, 6), None, &dirs[0]).expect("uninterrupted");
        // 2 ranks for two steps, then 1, then 4.
        let w = sharded_run(2, None, (0, 2), None, &dirs[1]).expect("2 ranks");
        let w = sharded_run(1, Some(&w), (2, 4), Some(&dirs[1]), &dirs[2]).expect("1 rank");
        let w = sharded_run(4, Some(&w), (4, 6), Some(&dirs[2]), &dirs[3]).expect("4 ranks");
        for (k, a) in &whole {
            let d = terse_model::testing::relative_diff(a, &w[k]).expect("diff");
            assert!(d < 1e-6, "{k}: {d}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
