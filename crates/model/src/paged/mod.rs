//! The paged KV cache the rollout scheduler decodes through: one pool of fixed-size blocks per
//! layer, a block table per sequence, a free list and per-block reference counts, so the G
//! samples of a prompt share its prefix blocks (a write to a shared block copies it first) and
//! a finished sequence's blocks go straight to the next one.
//!
//! Data flow: rollout's scheduler reserves blocks (`reserve`), forks tables (`fork`, prompt
//! prefixes and Step-GRPO probes; `fork_prefix`, a probe that leaves out the trigger) and
//! releases them (`release`); `Qwen3::forward_paged` (forward.rs) writes each new token's
//! K/V into its table's blocks and attends over them, through the CPU step (decode/paged.rs),
//! the kernels (fused_step.rs, kernels/paged_attention.rs) or the composite reference; on CUDA
//! a pure decode step may run as a captured graph instead (graphs.rs, `Qwen3::decode_graphed`).

mod forward;
mod fused_step;
mod graphs;

pub use crate::kernels::paged_attention::PagedMeta;
pub use crate::kernels::paged_split::{reset_flash_decoding, set_flash_decoding};
use candle_core::{DType, Device, Result, Tensor};
pub(crate) use forward::PagedPath;
pub use forward::PagedSeq;
pub use graphs::{decode_graph_bytes, DecodeGraphs};

/// The blocks of one sequence, in order, and how many tokens they hold. Made empty
/// (`BlockTable::default`), grown by `PagedKvCache::reserve` + `forward_paged`, copied only by
/// `PagedKvCache::fork` (which counts the shared blocks), and given back by `release`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    pub(crate) blocks: Vec<u32>,
    pub(crate) len: usize,
}

impl BlockTable {
    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block ids, in sequence order.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }
}

/// Per-layer pools of `num_blocks` blocks, each (Hkv, block, D) for K and for V. A pool belongs
/// to the weights it was filled with: after an optimizer step, make a new one.
#[derive(Debug)]
pub struct PagedKvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Tables holding each block (0 = free).
    refs: Vec<u32>,
    /// Free blocks, the next to hand out last (so blocks go out in ascending order at first).
    free: Vec<u32>,
    block: usize,
    peak: usize,
}

impl PagedKvCache {
    /// A pool of `num_blocks` blocks of `block` tokens (a multiple of 16: the CPU kernels'
    /// chunks never cross a block; 64 makes their sums run exactly as over a contiguous cache).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block: usize,
        num_blocks: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if block == 0 || !block.is_multiple_of(16) {
            crate::fail!("paged kv cache: block size {block} is not a positive multiple of 16");
        }
        if num_blocks == 0 || num_blocks > u32::MAX as usize {
            crate::fail!("paged kv cache: {num_blocks} blocks is out of range");
        }
        let mk = || Tensor::zeros((num_blocks, kv_heads, block, head_dim), dtype, device);
        Ok(Self {
            k: (0..layers).map(|_| mk()).collect::<Result<_>>()?,
            v: (0..layers).map(|_| mk()).collect::<Result<_>>()?,
            refs: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            block,
            peak: 0,
        })
    }

    /// Bytes one block takes over all layers, K and V: (2 · layers · Hkv · block · D) elements.
    pub fn bytes_per_block(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block: usize,
        dtype: DType,
    ) -> usize {
        2 * layers * kv_heads * block * head_dim * dtype.size_in_bytes()
    }

    pub fn block_size(&self) -> usize {
        self.block
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.num_blocks() - self.free.len()
    }

    /// The most blocks in use at once since the pool was made.
    pub fn peak_blocks(&self) -> usize {
        self.peak
    }

    /// The dtype K and V are stored in.
    pub fn dtype(&self) -> DType {
        self.k.first().map_or(DType::F32, Tensor::dtype)
    }

    /// How many tables hold block b.
    pub fn refs(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }

    pub(crate) fn layer(&self, l: usize) -> (&Tensor, &Tensor) {
        (&self.k[l], &self.v[l])
    }

    pub(crate) fn layers(&self) -> usize {
        self.k.len()
    }

    /// Blocks `reserve(t, new)` would take from the free list: the new blocks past the table's
    /// last, plus a copy of its last block when that block is shared and gets written.
    pub fn blocks_needed(&self, t: &BlockTable, new: usize) -> usize {
        let have = t.blocks.len() * self.block;
        let grow = (t.len + new).saturating_sub(have).div_ceil(self.block);
        let partial = !t.len.is_multiple_of(self.block);
        let cow = new > 0 && partial && t.blocks.last().is_some_and(|&b| self.refs[b as usize] > 1);
        grow + usize::from(cow)
    }

    /// Makes room for `new` more tokens in `t`: copies a shared last block it will write into
    /// (copy-on-write) and appends blocks. False, changing nothing, when the free list is too
    /// short.
    pub fn reserve(&mut self, t: &mut BlockTable, new: usize) -> Result<bool> {
        if self.blocks_needed(t, new) > self.free.len() {
            return Ok(false);
        }
        if new > 0 && !t.len.is_multiple_of(self.block) {
            let i = t.len / self.block;
            let src = t.blocks[i];
            if self.refs[src as usize] > 1 {
                let dst = self.take()?;
                self.copy_block(src, dst)?;
                self.refs[src as usize] -= 1;
                t.blocks[i] = dst;
            }
        }
        while t.blocks.len() * self.block < t.len + new {
            let b = self.take()?;
            t.blocks.push(b);
        }
        Ok(true)
    }

    /// Reserves room for `n` more tokens and counts them as stored, with every new block's K/V
    /// set to `value` instead of a model's: for benchmarks that need a long context without
    /// paying for its prefill (written, so the memory is really read: untouched zeroed pages
    /// would all map to one page and read from cache). False, changing nothing, when the pool
    /// is too small.
    pub fn extend_filled(&mut self, t: &mut BlockTable, n: usize, value: f64) -> Result<bool> {
        let before = t.blocks.len();
        if !self.reserve(t, n)? {
            return Ok(false);
        }
        for &b in &t.blocks[before..] {
            for p in self.k.iter().chain(&self.v) {
                let (_, h, s, d) = p.dims4()?;
                let fill = Tensor::full(value, (1, h, s, d), p.device())?.to_dtype(p.dtype())?;
                p.slice_set(&fill, 0, b as usize)?;
            }
        }
        t.len += n;
        Ok(true)
    }

    /// A second table over the same tokens, sharing every block (counted).
    pub fn fork(&mut self, t: &BlockTable) -> BlockTable {
        for &b in &t.blocks {
            self.refs[b as usize] += 1;
        }
        BlockTable {
            blocks: t.blocks.clone(),
            len: t.len,
        }
    }

    /// A table over the first `len` tokens of `t` (all of them when `len` is larger), sharing
    /// the blocks that hold them (counted): a probe that continues from an earlier point of the
    /// sequence. Its first write into a partial shared block copies that block, as after `fork`.
    pub fn fork_prefix(&mut self, t: &BlockTable, len: usize) -> BlockTable {
        let len = len.min(t.len);
        let blocks = t.blocks[..len.div_ceil(self.block)].to_vec();
        for &b in &blocks {
            self.refs[b as usize] += 1;
        }
        BlockTable { blocks, len }
    }

    /// Gives the table's blocks back (each freed when no other table holds it); the table is
    /// left empty.
    pub fn release(&mut self, t: &mut BlockTable) {
        for b in t.blocks.drain(..) {
            let r = &mut self.refs[b as usize];
            *r -= 1;
            if *r == 0 {
                self.free.push(b);
            }
        }
        t.len = 0;
    }

    fn take(&mut self) -> Result<u32> {
        let Some(b) = self.free.pop() else {
            crate::fail!("paged kv cache: no free block");
        };
        self.refs[b as usize] = 1;
        self.peak = self.peak.max(self.used_blocks());
        Ok(b)
    }

    /// Copies block src's K and V into block dst, every layer.
    fn copy_block(&self, src: u32, dst: u32) -> Result<()> {
        for t in self.k.iter().chain(&self.v) {
            // (1, Hkv, block, D) in storage of its own: `copy` would clone the whole pool's
            // storage, an identity affine op copies the block's elements only (exactly: x·1 + 0).
            let from = t.narrow(0, src as usize, 1)?.affine(1.0, 0.0)?;
            t.slice_set(&from, 0, dst as usize)?;
        }
        Ok(())
    }

    /// Checks that the step may write `new[i]` tokens after `tables[i].len`: the blocks exist,
    /// and every block written is held by that table alone and by no other table of the step
    /// (the CPU step's threads write them in place, each its own sequences').
    pub(crate) fn check_writable(&self, tables: &[&BlockTable], new: &[usize]) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for (t, &n) in tables.iter().zip(new) {
            if t.blocks.len() * self.block < t.len + n {
                crate::fail!(
                    "paged kv cache: a table of {} blocks cannot take {} more tokens after {} (reserve first)",
                    t.blocks.len(),
                    n,
                    t.len
                );
            }
            if n == 0 {
                continue;
            }
            for i in t.len / self.block..=(t.len + n - 1) / self.block {
                let b = t.blocks[i];
                if self.refs[b as usize] != 1 || !seen.insert(b) {
                    crate::fail!(
                        "paged kv cache: block {b} is shared and cannot be written in place"
                    );
                }
            }
        }
        Ok(())
    }
}

/// A step's tables on the host: the flat padded tables, their width, the lengths, the slots.
pub(crate) type HostTables = (Vec<u32>, usize, Vec<u32>, Vec<u32>);

impl PagedMeta {
    /// One row per new token: `rows[i]` = (its sequence's table, its position). The row writes
    /// its K/V at that position and attends to positions 0..=it of its table, so a prefill
    /// chunk's tokens are rows of one batch beside the decodes (room reserved first).
    pub fn new(
        cache: &PagedKvCache,
        rows: &[(&BlockTable, usize)],
        device: &candle_core::Device,
    ) -> Result<Self> {
        let (flat, maxb, lens, slots) = Self::host_tables(cache, rows, 1)?;
        let up = |v: &[u32]| Tensor::from_slice(v, v.len(), device);
        let dev = [up(&flat)?, up(&lens)?, up(&slots)?];
        Ok(Self {
            tables: flat,
            maxb,
            lens,
            slots,
            dev,
        })
    }

    /// The step's tables on the host, checked: each row's blocks padded with block 0 to `maxb`
    /// (the most any row uses, at least `min_width`), the slots each attends, where each writes.
    pub(crate) fn host_tables(
        cache: &PagedKvCache,
        rows: &[(&BlockTable, usize)],
        min_width: usize,
    ) -> Result<HostTables> {
        let bs = cache.block_size();
        let maxb = rows
            .iter()
            .map(|(_, p)| (p + 1).div_ceil(bs))
            .max()
            .unwrap_or(1)
            .max(min_width);
        let mut flat = Vec::with_capacity(rows.len() * maxb);
        let (mut lens, mut slots) = (vec![], vec![]);
        for &(t, pos) in rows {
            let used = (pos + 1).div_ceil(bs);
            if t.blocks.len() < used {
                crate::fail!(
                    "paged step: a table of {} blocks has no room for position {pos}",
                    t.blocks.len()
                );
            }
            flat.extend_from_slice(&t.blocks[..used]);
            flat.extend(std::iter::repeat_n(0, maxb - used));
            lens.push((pos + 1) as u32);
            slots.push(t.blocks[pos / bs] * bs as u32 + (pos % bs) as u32);
        }
        crate::kernels::paged_attention::check::paged_tables(
            &flat,
            maxb,
            &lens,
            &slots,
            [cache.num_blocks(), bs],
        )?;
        Ok((flat, maxb, lens, slots))
    }
}
