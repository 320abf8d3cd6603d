//! Decode steps in CUDA graphs: a step whose every row feeds one token and then samples (the
//! rollout's usual step) runs as one graph launch, one graph per batch-size bucket (powers of
//! two; rows past the batch pad the bucket, writing a block kept for them, their draws
//! dropped). The first step of a bucket runs uncaptured, which fills candle's caches of the
//! small uploads its ops make, and is then captured; each later step of that bucket is one
//! upload from pinned memory into the bucket's static input (token ids, positions, lengths,
//! write slots, uniforms, block tables), one graph launch (the layers, the head and the
//! sampler: `paged_rows`, `paged_head`, `sample_packed`, all reading the static input) and one
//! download of 16 bytes a row (token, both log-probs, entropy). A row's draw is the uncaptured
//! path's: the same kernels read the same values.
//!
//! `TERSE_CUDA_GRAPHS=0` turns graphs off (every step uncaptured: the baseline `cargo xtask
//! bench decode` measures in the same run). Off CUDA there are none (`DecodeGraphs::new` says
//! so), and the CPU's numbers never pass through here.
//!
//! Data flow: rollout scheduler -> `DecodeGraphs::fits` -> `Qwen3::decode_graphed` -> per
//! bucket: upload, graph launch (or run, then capture), download -> `Drawn` per row.

use super::{BlockTable, PagedKvCache, PagedSeq};
use crate::kernels::sample::{Drawn, Warpers};
use crate::model::Qwen3;
use candle_core::Result;

/// Whether decode graphs are on (`TERSE_CUDA_GRAPHS=0` turns them off).
fn enabled() -> bool {
    !std::env::var("TERSE_CUDA_GRAPHS").is_ok_and(|v| v == "0")
}

/// A rollout's decode graphs: their buckets, the table width they were captured for and the
/// block their padding rows write. Made per rollout (the graphs read its cache's pools and its
/// weights), given back with `release`.
pub struct DecodeGraphs {
    /// Blocks per table row: enough for the rollout's longest sequence.
    width: usize,
    block_size: usize,
    /// The padding rows' one block (slot 0 written, never read by a real row).
    pad: BlockTable,
    /// The largest bucket: `max_rows` rounded up to a power of two.
    max_bucket: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    warpers: Warpers,
    /// Captures so far (a bucket's first step runs uncaptured, then is captured).
    captures: usize,
    #[cfg(feature = "cuda")]
    buckets: Vec<cuda::Bucket>,
}

/// Device bytes a rollout's decode graphs hold, an estimate for the memory plan: each bucket's
/// graph keeps the memory its captured step allocates (CUDA's graph memory nodes reuse a freed
/// block within one graph, so a graph holds about its step's peak), and the buckets are the
/// powers of two up to `max_rows`'s, so they hold under twice the largest one's. CUDA may also
/// share physical memory between graphs launched on one stream, which this does not count on.
/// A step's peak per row, with `value_bytes` per compute value: the logits as the GEMM leaves
/// them and their f32 copy for the sampler (V each), flash-decoding's partials (Hq ·
/// `MAX_SPLITS` · (D + 2) f32), one layer's activations all live at once (6 hidden-sized, 3
/// query-sized, 2 KV-sized, 3 MLP-sized values) and the 16-byte draw.
pub fn decode_graph_bytes(c: &crate::Config, max_rows: usize, value_bytes: usize) -> u64 {
    use crate::kernels::paged_split::MAX_SPLITS;
    if max_rows == 0 {
        return 0;
    }
    let (h, i, d) = (c.hidden_size, c.intermediate_size, c.head_dim);
    let (hq, hkv) = (c.num_attention_heads, c.num_key_value_heads);
    // Saturating: a config beyond u64 bytes (the fuzzer's) plans as one that fits no device.
    let (v, b) = (value_bytes as u64, |x: usize| x as u64);
    let logits = b(c.vocab_size).saturating_mul(v + 4);
    let partials = b(hq * MAX_SPLITS).saturating_mul(b(d + 2) * 4);
    let values = (6 * b(h)).saturating_add((3 * b(hq) + 2 * b(hkv)).saturating_mul(b(d)));
    let layer = values.saturating_add(3 * b(i)).saturating_mul(v);
    let per_row = logits.saturating_add(partials).saturating_add(layer) + 16;
    // Buckets 1, 2, 4, ..., B hold 2B - 1 rows in all.
    let bucket = max_rows.checked_next_power_of_two().map_or(u64::MAX, b);
    let rows = bucket.saturating_mul(2) - 1;
    rows.saturating_mul(per_row)
}

impl DecodeGraphs {
    /// Graphs for steps of at most `max_rows` rows, each sequence at most `max_len` tokens,
    /// sampled with `warpers`; one block of `cache` is kept for padding rows. None where graphs
    /// do not apply: off CUDA, with `TERSE_CUDA_GRAPHS=0`, a cache not in the model's compute
    /// dtype (the composite path), or no block to spare.
    pub fn new(
        model: &Qwen3,
        cache: &mut PagedKvCache,
        max_rows: usize,
        max_len: usize,
        warpers: Warpers,
    ) -> Result<Option<Self>> {
        let on_cuda = cfg!(feature = "cuda") && model.device().is_cuda();
        if !on_cuda
            || !enabled()
            || max_rows == 0
            || cache.dtype() != model.compute_dtype()
            || cache.free_blocks() == 0
        {
            return Ok(None);
        }
        let mut pad = BlockTable::default();
        if !cache.reserve(&mut pad, 1)? {
            return Ok(None);
        }
        Ok(Some(Self {
            width: max_len.div_ceil(cache.block_size()).max(1),
            block_size: cache.block_size(),
            pad,
            max_bucket: max_rows.next_power_of_two(),
            warpers,
            captures: 0,
            #[cfg(feature = "cuda")]
            buckets: vec![],
        }))
    }

    /// Gives the padding block back to `cache`.
    pub fn release(mut self, cache: &mut PagedKvCache) {
        cache.release(&mut self.pad);
    }

    /// Graphs captured so far (one per bucket used).
    pub fn captures(&self) -> usize {
        self.captures
    }

    /// Whether a step of `seqs` can run as a graph: every sequence feeds one token, there are
    /// no more of them than the largest bucket, and each fits the captured table width.
    pub fn fits(&self, seqs: &[PagedSeq]) -> bool {
        let span = self.width * self.block_size;
        !seqs.is_empty()
            && seqs.len() <= self.max_bucket
            && seqs
                .iter()
                .all(|s| s.tokens.len() == 1 && s.table.len < span)
    }
}

impl Qwen3 {
    /// One decode step of `seqs` (each feeding one token; `graphs.fits` first) and their draws
    /// with `uniforms` (one per row, from each sample's own stream), through the step's bucket
    /// graph. Each table grows by its token, as with `forward_paged`.
    pub fn decode_graphed(
        &self,
        graphs: &mut DecodeGraphs,
        cache: &mut PagedKvCache,
        seqs: &mut [PagedSeq],
        uniforms: &[f64],
    ) -> Result<Vec<Drawn>> {
        if !graphs.fits(seqs) || uniforms.len() != seqs.len() {
            crate::fail!(
                "decode graph: {} rows ({} uniforms) do not fit the graphs (each row one token, at most {} rows of {} blocks)",
                seqs.len(),
                uniforms.len(),
                graphs.max_bucket,
                graphs.width
            );
        }
        {
            let tables: Vec<&BlockTable> = seqs.iter().map(|s| &*s.table).collect();
            cache.check_writable(&tables, &vec![1; seqs.len()])?;
        }
        let drawn = graphs.run(self, cache, seqs, uniforms)?;
        for s in seqs.iter_mut() {
            s.table.len += 1;
        }
        Ok(drawn)
    }
}

#[cfg(not(feature = "cuda"))]
impl DecodeGraphs {
    fn run(
        &mut self,
        _: &Qwen3,
        _: &PagedKvCache,
        _: &[PagedSeq],
        _: &[f64],
    ) -> Result<Vec<Drawn>> {
        crate::fail!("decode graphs need the cuda build")
    }
}

#[cfg(feature = "cuda")]
mod cuda;
