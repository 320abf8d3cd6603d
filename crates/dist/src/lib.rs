//! The collective operations of data-parallel training behind one small boundary,
//! [`Collective`]: sum all-reduce, sum reduce-scatter, all-gather, broadcast. Every reduction
//! leaves the same bits on every rank; the CPU backend sums in rank order (rank 0 + rank 1 +
//! ...), so a run's numbers do not depend on timing either.
//!
//! Backends: [`Single`] (world size 1, no communication), [`TcpGroup`] (`tcp.rs`): processes
//! or threads over TCP in a star around rank 0, with a rendezvous and a timeout on every
//! exchange, for tests and CPU runs; and `NcclGroup` (`nccl.rs`, feature `nccl`): GPU ranks,
//! their communicator made from a unique id sent over a TcpGroup (NCCL chooses its own
//! reduction order; every rank still holds the same bits).
//!
//! Data flow: the trainer's per-rank gradients -> `reduce_scatter_sum` -> each rank's optimizer
//! shard -> `all_gather` of the new weights (terse-train's
//! crates/train/src/step/zero.rs); rollout statistics ->
//! `all_gather_bytes`; rank 0's start and checkpoints -> `broadcast`.

pub mod deadline;
#[cfg(feature = "nccl")]
mod nccl;
mod tcp;

#[cfg(feature = "nccl")]
pub use nccl::NcclGroup;
pub use tcp::TcpGroup;

use anyhow::{bail, Result};

/// A group of ranks that exchange f32 buffers.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Every rank's `buf` replaced by the element-wise sum over ranks (the same bits on every
    /// rank).
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()>;
    /// The same in f64 (statistics and counts, which f32 would round).
    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()>;
    /// Every rank's `parts` (world x n) summed over ranks; this rank gets part `rank` (n).
    fn reduce_scatter_sum(&mut self, parts: &[f32]) -> Result<Vec<f32>> {
        let n = shard_len(parts.len(), self.world())?;
        let mut all = parts.to_vec();
        self.all_reduce_sum(&mut all)?;
        let r = self.rank();
        Ok(all[r * n..(r + 1) * n].to_vec())
    }
    /// Every rank's `part` (n, the same n on every rank) concatenated in rank order.
    fn all_gather(&mut self, part: &[f32]) -> Result<Vec<f32>>;
    /// `root`'s bytes on every rank (the others' `buf` is replaced).
    fn broadcast(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()>;
    /// Every rank's `mine` (of any length) on every rank, in rank order: records that differ
    /// in size per rank, such as the per-sample statistics of each rank's share of a rollout.
    fn all_gather_bytes(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let mut mine = Some(mine);
        let mut all = Vec::with_capacity(self.world());
        for r in 0..self.world() {
            let mut buf = if r == self.rank() {
                mine.take().unwrap_or_default()
            } else {
                vec![]
            };
            self.broadcast(&mut buf, r)?;
            all.push(buf);
        }
        Ok(all)
    }
}

/// A held group lent to a function that takes `Option<&mut dyn Collective>`
/// (`as_deref_mut` keeps the box's `'static` bound, which such a parameter rejects).
pub fn lend(c: &mut Option<Box<dyn Collective>>) -> Option<&mut dyn Collective> {
    match c {
        Some(c) => Some(&mut **c),
        None => None,
    }
}

/// The length of each of `world` equal parts of `len`; an error when it does not divide.
pub fn shard_len(len: usize, world: usize) -> Result<usize> {
    if world == 0 || !len.is_multiple_of(world) {
        bail!("a buffer of {len} values does not split into {world} equal parts");
    }
    Ok(len / world)
}

/// World size 1: every operation is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_reduce_sum(&mut self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&mut self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn all_gather(&mut self, part: &[f32]) -> Result<Vec<f32>> {
        Ok(part.to_vec())
    }
    fn broadcast(&mut self, _buf: &mut Vec<u8>, root: usize) -> Result<()> {
        if root != 0 {
            bail!("broadcast from rank {root} in a group of 1");
        }
        Ok(())
    }
}
