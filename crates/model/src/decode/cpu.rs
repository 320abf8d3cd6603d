//! The CPU decode step: one new token per row through every layer, over raw f32 slices.
//!
//! Data flow: rollout's `generate` -> `Qwen3::forward_cached` (one slot, f32, CPU) -> here ->
//! (B, V) logits. The composite candle forward spends a decode step of a small model in ~25
//! allocating ops per layer, an attention bias over the whole cache and a (B, Hq, 1, S) score
//! matrix. This path splits the batch's rows into parts (one per thread when the weights fit in
//! cache); each part runs every layer on its own (rows never interact in a forward), so a
//! step is one fork-join with every layer's cache locked for it: projections (`matmul`), norm /
//! RoPE / SiLU loops (`rows`), K/V written into the cache slot in place, attention over the
//! unmasked slots (`avx512`, else `avx2`), scratch reused. Same math as `Qwen3::layer` (tested).

use super::common::Kv;
use super::matmul::{matmul_wt, pack_panels, Packed};
use super::rows::{self as rows, simd_dispatch, CacheRow};
use crate::cache::KvCache;
use crate::config::Config;
use candle_core::{CpuStorage, InplaceOp1, Layout, Result, Storage, StorageRef, Tensor};
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

/// Borrowed f32 weights of one model, in HF layout ((out, in) row-major).
struct Weights<'a> {
    guards: Vec<(StorageRef<'a>, &'a Layout)>,
}

impl<'a> Weights<'a> {
    fn lock(tensors: &'a [Tensor]) -> Self {
        Self {
            guards: tensors.iter().map(|t| t.storage_and_layout()).collect(),
        }
    }

    fn get(&self, i: usize) -> Result<&[f32]> {
        let (s, l) = &self.guards[i];
        match (&**s, l.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => Ok(&v[a..b]),
            _ => crate::fail!("decode: weight {i} is not a contiguous f32 CPU tensor"),
        }
    }
}

/// The contents of one KV cache tensor (or a part's rows of it), as stored.
enum KvMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

impl<'a> KvMut<'a> {
    fn view(&self) -> Kv<'_> {
        match self {
            KvMut::F32(x) => Kv::F32(x),
            KvMut::F16(x) => Kv::F16(x),
        }
    }

    /// Splits a (B, ...) buffer of `block` elements per row into the parts' row ranges.
    fn split_rows(self, parts: &[Rows], block: usize) -> Vec<KvMut<'a>> {
        fn split<'s, T>(mut all: &'s mut [T], parts: &[Rows], block: usize) -> Vec<&'s mut [T]> {
            parts
                .iter()
                .map(|r| {
                    let (mine, rest) = std::mem::take(&mut all).split_at_mut(r.n * block);
                    all = rest;
                    mine
                })
                .collect()
        }
        match self {
            KvMut::F32(x) => split(x, parts, block).into_iter().map(KvMut::F32).collect(),
            KvMut::F16(x) => split(x, parts, block).into_iter().map(KvMut::F16).collect(),
        }
    }

    /// Writes a part's new K or V (n, s, Hkv, D) into slots `off..off + s` of its (n, Hkv, C,
    /// D) cache (rounded to f16 in an f16 cache).
    fn write_slots(&mut self, src: &[f32], dims: [usize; 4], off: usize) {
        let [s, hkv, cap, d] = dims;
        for (t, head) in src.chunks_exact(d).enumerate() {
            let (tok, h) = (t / hkv, t % hkv);
            let (row, j) = (tok / s, tok % s);
            let at = ((row * hkv + h) * cap + off + j) * d;
            match self {
                KvMut::F32(c) => c[at..][..d].copy_from_slice(head),
                KvMut::F16(c) => {
                    for (o, &x) in c[at..][..d].iter_mut().zip(head) {
                        *o = f16::from_f32(x);
                    }
                }
            }
        }
    }
}

/// Mutable access to the contents of a contiguous CPU tensor (the KV cache) through candle's
/// in-place op, which takes the storage's write lock for the call.
struct MutAccess<'a> {
    f: std::cell::RefCell<&'a mut SliceFn<'a>>,
}

type SliceFn<'a> = dyn FnMut(KvMut<'_>) -> Result<()> + 'a;

impl InplaceOp1 for MutAccess<'_> {
    fn name(&self) -> &'static str {
        "terse-decode-cache-access"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        match (s, l.is_contiguous() && l.start_offset() == 0) {
            (CpuStorage::F32(c), true) => (self.f.borrow_mut())(KvMut::F32(c)),
            (CpuStorage::F16(c), true) => (self.f.borrow_mut())(KvMut::F16(c)),
            _ => crate::fail!("decode: the KV cache must be a contiguous f32 or f16 CPU tensor"),
        }
    }
}

fn with_mut(t: &Tensor, f: &mut dyn FnMut(KvMut<'_>) -> Result<()>) -> Result<()> {
    t.inplace_op1(&MutAccess {
        f: std::cell::RefCell::new(f),
    })
}

/// Runs `f` with mutable access to the contents of all `tensors` at once (in order), holding
/// each one's write lock for the call.
fn with_all_mut<'h>(
    tensors: &[&Tensor],
    held: Vec<KvMut<'h>>,
    f: &mut dyn FnMut(Vec<KvMut<'_>>) -> Result<()>,
) -> Result<()> {
    let Some((t, rest)) = tensors.split_first() else {
        return f(held);
    };
    let mut held = Some(held);
    with_mut(t, &mut |s| {
        let Some(mut h) = held.take() else {
            crate::fail!("decode: cache access re-entered");
        };
        h.push(s);
        with_all_mut(rest, h, f)
    })
}

/// Weight order in the locked list: embedding, final norm, head, then 11 per layer.
pub(super) const PER_LAYER: [&str; 11] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// Indices in `PER_LAYER` of the projections (the rest are norms).
const PROJECTIONS: [usize; 7] = [1, 2, 3, 6, 8, 9, 10];

/// Dimensions of one decode step.
struct Dims {
    hs: usize,
    hkv: usize,
    d: usize,
    qd: usize,
    kvd: usize,
    inter: usize,
    vocab: usize,
    eps: f32,
}

thread_local! {
    /// The last step's row parts, reused by the next step of the same shape.
    static SCRATCH: std::cell::RefCell<Vec<Rows>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows [start, start + n) of the batch with their scratch: one unit of parallel work.
struct Rows {
    start: usize,
    n: usize,
    /// New slots per row this step (1 when decoding; the prompt length in a prefill).
    s: usize,
    /// Residual stream (n * s, H): token j of row i at i * s + j.
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Rotary tables (n * s, d/2).
    cos: Vec<f32>,
    sin: Vec<f32>,
    scores: Vec<f32>,
    /// (n, V) for each row's last new slot, filled after the last layer.
    logits: Vec<f32>,
    /// Padding slots of each row (row i: masked[masked_at[i]..masked_at[i + 1]]), this step.
    masked: Vec<u32>,
    masked_at: Vec<usize>,
}

impl Rows {
    fn new(start: usize, n: usize, s: usize, dm: &Dims) -> Self {
        let z = |w: usize| vec![0f32; n * s * w];
        Self {
            start,
            n,
            s,
            x: z(dm.hs),
            h: z(dm.hs),
            q: z(dm.qd),
            k: z(dm.kvd),
            v: z(dm.kvd),
            att: z(dm.qd),
            o: z(dm.hs),
            gate: z(dm.inter),
            up: z(dm.inter),
            cos: z(dm.d / 2),
            sin: z(dm.d / 2),
            scores: vec![],
            logits: vec![],
            masked: vec![],
            masked_at: vec![],
        }
    }

    /// Embedding rows and rotary tables (f32, as `ops::rope_tables` computes them); ids and
    /// positions are (B, s).
    fn embed(&mut self, embed: &[f32], ids: &[u32], pos: &[u32], theta: f64, dm: &Dims) {
        let (hs, half) = (dm.hs, dm.d / 2);
        for (r, row) in self.x.chunks_exact_mut(hs).enumerate() {
            let id = ids[self.start * self.s + r] as usize;
            row.copy_from_slice(&embed[id * hs..(id + 1) * hs]);
            let p = pos[self.start * self.s + r] as f32;
            for i in 0..half {
                let inv = (1.0 / theta.powf((2 * i) as f64 / dm.d as f64)) as f32;
                self.cos[r * half + i] = (p * inv).cos();
                self.sin[r * half + i] = (p * inv).sin();
            }
        }
    }
}

simd_dispatch!(
    /// RMSNorm, the q/k/v projections, the q/k head norms and RoPE of one layer.
    fn qkv(r: &mut Rows, lw: &[&[f32]], lt: &[Option<&[f32]>], dm: &Dims, par: bool) => qkv_body
);

#[inline(always)]
fn qkv_body(r: &mut Rows, lw: &[&[f32]], lt: &[Option<&[f32]>], dm: &Dims, par: bool) {
    let n = r.n * r.s; // tokens
    r.h.copy_from_slice(&r.x);
    rows::rms_norm_rows(&mut r.h, lw[0], dm.eps);
    matmul_wt(&r.h, lw[1], lt[1], &mut r.q, n, dm.hs, dm.qd, par); // (n, Hq*D)
    matmul_wt(&r.h, lw[2], lt[2], &mut r.k, n, dm.hs, dm.kvd, par); // (n, Hkv*D)
    matmul_wt(&r.h, lw[3], lt[3], &mut r.v, n, dm.hs, dm.kvd, par);
    rows::rms_norm_rows(&mut r.q, lw[4], dm.eps);
    rows::rms_norm_rows(&mut r.k, lw[5], dm.eps);
    let half = dm.d / 2;
    for i in 0..n {
        let (c, s) = (&r.cos[i * half..][..half], &r.sin[i * half..][..half]);
        rows::rope_row(&mut r.q[i * dm.qd..][..dm.qd], c, s);
        rows::rope_row(&mut r.k[i * dm.kvd..][..dm.kvd], c, s);
    }
}

simd_dispatch!(
    /// Attention over this layer's cache, the output projection and the MLP block, both with
    /// their residual adds.
    fn attend_mlp(
        r: &mut Rows,
        lw: &[&[f32]],
        lt: &[Option<&[f32]>],
        cache: &LayerCache,
        dm: &Dims,
        par: bool,
    ) => attend_mlp_body
);

#[inline(always)]
fn attend_mlp_body(
    r: &mut Rows,
    lw: &[&[f32]],
    lt: &[Option<&[f32]>],
    cache: &LayerCache,
    dm: &Dims,
    par: bool,
) {
    let (n, cap) = (r.n * r.s, cache.cap);
    let block = dm.hkv * cap * dm.d;
    for i in 0..n {
        // Token j of row `row`: causal, it sees the slots up to its own.
        let (row, j) = (i / r.s, i % r.s);
        let cr = CacheRow {
            k: cache.k.slice(row * block, block),
            v: cache.v.slice(row * block, block),
            masked: &r.masked[r.masked_at[row]..r.masked_at[row + 1]],
            cap,
            len: cache.len - r.s + j + 1,
            hkv: dm.hkv,
        };
        let q = &r.q[i * dm.qd..][..dm.qd];
        rows::attend_row(
            q,
            &cr,
            dm.d,
            &mut r.att[i * dm.qd..][..dm.qd],
            &mut r.scores,
            false,
        );
    }
    matmul_wt(&r.att, lw[6], lt[6], &mut r.o, n, dm.qd, dm.hs, par);
    r.x.iter_mut().zip(&r.o).for_each(|(a, y)| *a += y);
    r.h.copy_from_slice(&r.x);
    rows::rms_norm_rows(&mut r.h, lw[7], dm.eps);
    matmul_wt(&r.h, lw[8], lt[8], &mut r.gate, n, dm.hs, dm.inter, par); // (n, I)
    matmul_wt(&r.h, lw[9], lt[9], &mut r.up, n, dm.hs, dm.inter, par);
    rows::silu_mul(&mut r.gate, &r.up);
    matmul_wt(&r.gate, lw[10], lt[10], &mut r.o, n, dm.inter, dm.hs, par);
    r.x.iter_mut().zip(&r.o).for_each(|(a, y)| *a += y);
}

simd_dispatch!(
    /// The final norm of the rows' residual streams, in place.
    fn final_norm(x: &mut [f32], w: &[f32], eps: f32) => rows::rms_norm_rows
);

/// One part's rows of a layer's cache: k/v (n, Hkv, C, D), `len` slots in use.
struct LayerCache<'a> {
    k: Kv<'a>,
    v: Kv<'a>,
    len: usize,
    cap: usize,
}

/// Weights above this size (bytes) stream from memory: split the matmuls' columns across
/// threads (every thread reads a part of W) instead of the batch's rows (every thread reads
/// all of W).
const ROW_SPLIT_MAX_WEIGHTS: usize = 16 << 20;

/// One forward over `slots` new slots per row (1 when decoding, the prompt in a prefill):
/// ids/positions (B, slots) for the cache's last `slots` slots (already appended), `weights`
/// in `weight_names` order -> logits (B, V) of each row's last slot.
pub(crate) fn step(
    c: &Config,
    weights: &[Tensor],
    snapshot: &super::DecodeWeights,
    cache: &KvCache,
    ids: &[u32],
    positions: &[u32],
    slots: usize,
) -> Result<Tensor> {
    let locked = Weights::lock(weights);
    let w = (0..weights.len())
        .map(|i| locked.get(i))
        .collect::<Result<Vec<_>>>()?;
    let (hq, hkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let dm = Dims {
        hs: c.hidden_size,
        hkv,
        d,
        qd: hq * d,
        kvd: hkv * d,
        inter: c.intermediate_size,
        vocab: c.vocab_size,
        eps: c.rms_norm_eps as f32,
    };
    let b = ids.len() / slots;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= dm.vocab) {
        crate::fail!(
            "decode: token id {id} out of range for vocabulary {}",
            dm.vocab
        );
    }
    // Rows split across threads when the weights stay in cache (one fork-join per step is
    // worth it from two rows on).
    let threads = rayon::current_num_threads();
    let small = 4 * c.num_parameters() <= ROW_SPLIT_MAX_WEIGHTS;
    let parts = if small { b.clamp(1, threads) } else { 1 };
    let par = !small && threads > 1;
    // Small models' projections as outer products over weights packed once per snapshot, where
    // the CPU has the kernel: each row's sums then run in one order whatever the batch (a
    // sample's logits are bit-identical with more or fewer rows beside it).
    let packed = (small && super::matmul::available_512()).then(|| {
        let t = snapshot.packed.get_or_init(|| {
            // The head (2) and each layer's projections.
            let is_proj =
                |i: usize| i == 2 || i >= 3 && PROJECTIONS.contains(&((i - 3) % PER_LAYER.len()));
            Arc::new(Packed(
                weights
                    .iter()
                    .zip(&w)
                    .enumerate()
                    .map(|(i, (t, w))| {
                        let (n, k) = t.dims2().ok()?;
                        is_proj(i).then(|| pack_panels(w, n, k))
                    })
                    .collect(),
            ))
        });
        Arc::clone(t)
    });
    let t: Vec<Option<&[f32]>> = (0..w.len())
        .map(|i| packed.as_ref().and_then(|tr| tr.0[i].as_deref()))
        .collect();
    // Scratch from the previous step of this thread when the shapes match: fresh buffers every
    // step cost more in page faults (the allocator hands them back to the OS) than the step.
    let mut chunks = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let fits = |r: &Rows, i: usize| {
        let (lo, hi) = (i * b / parts, (i + 1) * b / parts);
        r.start == lo
            && r.n == hi - lo
            && r.s == slots
            && r.q.len() == r.n * slots * dm.qd
            && r.gate.len() == r.n * slots * dm.inter
    };
    if chunks.len() != parts || !chunks.iter().enumerate().all(|(i, r)| fits(r, i)) {
        chunks = (0..parts)
            .map(|i| {
                let (lo, hi) = (i * b / parts, (i + 1) * b / parts);
                Rows::new(lo, hi - lo, slots, &dm)
            })
            .collect();
    }
    // Rows never interact in a forward, so each part runs every layer (projections, its rows'
    // cache slots, attention, MLP) on its own: one fork-join per step, with every layer's
    // cache locked for the step.
    let (off, len, cap) = (cache.len() - slots, cache.len(), cache.capacity());
    let layers = c.num_hidden_layers;
    let block = hkv * cap * d;
    let part = |r: &mut Rows, kv: &mut [(KvMut, KvMut)]| {
        r.embed(w[0], ids, positions, c.rope_theta, &dm);
        let valid = &cache.valid()[r.start * cap..(r.start + r.n) * cap];
        r.masked.clear();
        r.masked_at.clear();
        r.masked_at.push(0);
        for row in valid.chunks_exact(cap) {
            rows::masked_slots(row, len, &mut r.masked);
            r.masked_at.push(r.masked.len());
        }
        for (l, (kp, vp)) in kv.iter_mut().enumerate() {
            let at = 3 + l * PER_LAYER.len()..3 + (l + 1) * PER_LAYER.len();
            let (lw, lt) = (&w[at.clone()], &t[at]);
            qkv(r, lw, lt, &dm, par);
            kp.write_slots(&r.k, [slots, hkv, cap, d], off);
            vp.write_slots(&r.v, [slots, hkv, cap, d], off);
            let lc = LayerCache {
                k: kp.view(),
                v: vp.view(),
                len,
                cap,
            };
            attend_mlp(r, lw, lt, &lc, &dm, par);
        }
        // Each row's last slot only: (n, H) -> (n, V).
        let mut last = Vec::with_capacity(r.n * dm.hs);
        for row in r.x.chunks_exact(slots * dm.hs) {
            last.extend_from_slice(&row[(slots - 1) * dm.hs..]);
        }
        final_norm(&mut last, w[1], dm.eps);
        r.logits.resize(r.n * dm.vocab, 0.0);
        matmul_wt(&last, w[2], t[2], &mut r.logits, r.n, dm.hs, dm.vocab, par); // (n, V)
    };
    let tensors: Vec<&Tensor> = (0..layers)
        .flat_map(|l| {
            let (k, v) = cache.layer(l);
            [k, v]
        })
        .collect();
    with_all_mut(&tensors, Vec::new(), &mut |all| {
        // all = [k0, v0, k1, v1, ...], each (B, Hkv, C, D): per part, its rows of each layer.
        let mut per_part: Vec<Vec<(KvMut, KvMut)>> =
            (0..parts).map(|_| Vec::with_capacity(layers)).collect();
        let mut it = all.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            let (ks, vs) = (k.split_rows(&chunks, block), v.split_rows(&chunks, block));
            for (p, kv) in per_part.iter_mut().zip(ks.into_iter().zip(vs)) {
                p.push(kv);
            }
        }
        let mut work: Vec<_> = chunks.iter_mut().zip(per_part).collect();
        match &mut work[..] {
            [(r, kv)] => part(r, kv),
            many => many.par_iter_mut().for_each(|(r, kv)| part(r, kv)),
        }
        Ok(())
    })?;
    let mut logits = Vec::with_capacity(b * dm.vocab);
    for r in &chunks {
        logits.extend_from_slice(&r.logits);
    }
    SCRATCH.with(|s| *s.borrow_mut() = chunks);
    Tensor::from_vec(logits, (b, dm.vocab), &candle_core::Device::Cpu) // (B, V)
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
