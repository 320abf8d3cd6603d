//! What both CPU decode steps (cpu.rs over the preallocated cache, paged.rs over block
//! tables) share: the borrowed f32 weights and their per-layer order, the per-part scratch
//! rows, the layer bodies (q/k/v with norm and RoPE; attention, output projection and MLP),
//! the packed weights of a step and the one fork-join over the parts of a batch.
//!
//! Data flow: `cpu::step` / `paged::step` -> `with_weights` -> `scratch` -> `run_parts` (per
//! part: `qkv`, the cache write, `attend_mlp` per layer) -> `finish` -> (B, V) logits.

use super::rows::{self as rows, simd_dispatch, CacheRow};
use super::{matmul::matmul_wt, panels::pack_panels, panels::Packed};
use crate::config::Config;
use candle_core::{CpuStorage, Layout, Result, Storage, StorageRef, Tensor};
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

/// Weight order in the locked list: embedding, final norm, head, then 14 per layer. A weight
/// the architecture lacks (Qwen2's q/k norms, Qwen3's q/k/v biases) is an empty slice, and the
/// step skips it.
pub(super) const PER_LAYER: [&str; 14] = [
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
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
];

/// Indices in `PER_LAYER` of the projections (the rest are norms).
const PROJECTIONS: [usize; 7] = [1, 2, 3, 6, 8, 9, 10];

/// Dimensions of one decode step.
pub(super) struct Dims {
    pub hs: usize,
    pub hkv: usize,
    pub d: usize,
    pub qd: usize,
    pub kvd: usize,
    pub inter: usize,
    pub vocab: usize,
    pub eps: f32,
    pub theta: f64,
}

thread_local! {
    /// The last step's row parts, reused by the next step of the same shape.
    static SCRATCH: std::cell::RefCell<Vec<Rows>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows [start, start + n) of the batch with their scratch: one unit of parallel work. Row i
/// of the part has tokens ends[i - 1]..ends[i] (ends[-1] = 0) of the part, which start at token
/// `tok0` of the batch's flattened ids.
pub(super) struct Rows {
    pub start: usize,
    pub n: usize,
    pub tok0: usize,
    pub ends: Vec<usize>,
    /// Residual stream (tokens, H).
    pub x: Vec<f32>,
    h: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Rotary tables (tokens, d/2).
    cos: Vec<f32>,
    sin: Vec<f32>,
    pub scores: Vec<f32>,
    /// (n, V) for each row's last new token, filled after the last layer.
    pub logits: Vec<f32>,
    /// Padding slots of each row (row i: masked[masked_at[i]..masked_at[i + 1]]), this step.
    pub masked: Vec<u32>,
    pub masked_at: Vec<usize>,
}

impl Rows {
    pub(super) fn new(start: usize, tok0: usize, ends: Vec<usize>, dm: &Dims) -> Self {
        let tokens = ends.last().copied().unwrap_or(0);
        let z = |w: usize| vec![0f32; tokens * w];
        Self {
            start,
            n: ends.len(),
            tok0,
            ends,
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

    /// Tokens in this part.
    pub(super) fn tokens(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether this scratch serves the given part (reused from the previous step).
    pub(super) fn fits(&self, start: usize, tok0: usize, ends: &[usize], dm: &Dims) -> bool {
        self.start == start
            && self.tok0 == tok0
            && self.ends == ends
            && self.q.len() == self.tokens() * dm.qd
            && self.gate.len() == self.tokens() * dm.inter
    }

    /// Embedding rows and rotary tables (f32, as `ops::rope_tables` computes them) of the
    /// part's tokens; ids and positions are the whole batch's, flattened.
    pub(super) fn embed(&mut self, embed: &[f32], ids: &[u32], pos: &[u32], theta: f64, dm: &Dims) {
        let (hs, half) = (dm.hs, dm.d / 2);
        for (r, row) in self.x.chunks_exact_mut(hs).enumerate() {
            let id = ids[self.tok0 + r] as usize;
            row.copy_from_slice(&embed[id * hs..(id + 1) * hs]);
            let p = pos[self.tok0 + r] as f32;
            for i in 0..half {
                let inv = (1.0 / theta.powf((2 * i) as f64 / dm.d as f64)) as f32;
                self.cos[r * half + i] = (p * inv).cos();
                self.sin[r * half + i] = (p * inv).sin();
            }
        }
    }

    /// The final norm and the head over each row's last token: (n, H) -> logits (n, V).
    pub(super) fn head(
        &mut self,
        norm: &[f32],
        w: &[f32],
        wt: Option<&[f32]>,
        dm: &Dims,
        par: bool,
    ) {
        let mut last = Vec::with_capacity(self.n * dm.hs);
        for &e in &self.ends {
            last.extend_from_slice(&self.x[(e - 1) * dm.hs..e * dm.hs]);
        }
        final_norm(&mut last, norm, dm.eps);
        self.logits.resize(self.n * dm.vocab, 0.0);
        matmul_wt(&last, w, wt, &mut self.logits, self.n, dm.hs, dm.vocab, par);
        // (n, V)
    }
}

simd_dispatch!(
    /// RMSNorm, the q/k/v projections, the q/k head norms and RoPE of one layer.
    pub(super) fn qkv(r: &mut Rows, lw: &[&[f32]], lt: &[Option<&[f32]>], dm: &Dims, par: bool) => qkv_body
);

#[inline(always)]
fn qkv_body(r: &mut Rows, lw: &[&[f32]], lt: &[Option<&[f32]>], dm: &Dims, par: bool) {
    let n = r.tokens();
    r.h.copy_from_slice(&r.x);
    rows::rms_norm_rows(&mut r.h, lw[0], dm.eps);
    matmul_wt(&r.h, lw[1], lt[1], &mut r.q, n, dm.hs, dm.qd, par); // (n, Hq*D)
    matmul_wt(&r.h, lw[2], lt[2], &mut r.k, n, dm.hs, dm.kvd, par); // (n, Hkv*D)
    matmul_wt(&r.h, lw[3], lt[3], &mut r.v, n, dm.hs, dm.kvd, par);
    for (y, b) in [(&mut r.q, lw[11]), (&mut r.k, lw[12]), (&mut r.v, lw[13])] {
        if !b.is_empty() {
            rows::add_bias_rows(y, b);
        }
    }
    if !lw[4].is_empty() {
        rows::rms_norm_rows(&mut r.q, lw[4], dm.eps);
        rows::rms_norm_rows(&mut r.k, lw[5], dm.eps);
    }
    let half = dm.d / 2;
    for i in 0..n {
        let (c, s) = (&r.cos[i * half..][..half], &r.sin[i * half..][..half]);
        rows::rope_row(&mut r.q[i * dm.qd..][..dm.qd], c, s);
        rows::rope_row(&mut r.k[i * dm.kvd..][..dm.kvd], c, s);
    }
}

simd_dispatch!(
    /// Attention of each token over its cache view (`views[i]` for token i), the output
    /// projection and the MLP block, both with their residual adds.
    pub(super) fn attend_mlp(
        r: &mut Rows,
        lw: &[&[f32]],
        lt: &[Option<&[f32]>],
        views: &[CacheRow],
        dm: &Dims,
        par: bool,
    ) => attend_mlp_body
);

#[inline(always)]
fn attend_mlp_body(
    r: &mut Rows,
    lw: &[&[f32]],
    lt: &[Option<&[f32]>],
    views: &[CacheRow],
    dm: &Dims,
    par: bool,
) {
    let n = r.tokens();
    for (i, cr) in views.iter().enumerate() {
        let q = &r.q[i * dm.qd..][..dm.qd];
        rows::attend_row(
            q,
            cr,
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

/// Weights above this size (bytes) stream from memory: split the matmuls' columns across
/// threads (every thread reads a part of W) instead of the batch's rows (every thread reads
/// all of W).
const ROW_SPLIT_MAX_WEIGHTS: usize = 16 << 20;

/// What a step's parts share: the weights in `weight_names` order (`w`), their packed panels
/// where the CPU has the kernel (`t`), the dimensions, whether rows split across threads
/// (`parts` at most) and whether the matmuls do (`par`).
pub(super) struct StepWeights<'a> {
    pub w: Vec<&'a [f32]>,
    pub t: Vec<Option<&'a [f32]>>,
    pub dm: Dims,
    pub max_parts: usize,
    pub par: bool,
}

impl StepWeights<'_> {
    /// Layer l's weights (in `PER_LAYER` order) and their panels.
    pub(super) fn layer(&self, l: usize) -> (&[&[f32]], &[Option<&[f32]>]) {
        let at = 3 + l * PER_LAYER.len()..3 + (l + 1) * PER_LAYER.len();
        (&self.w[at.clone()], &self.t[at])
    }
}

/// Locks the weights, packs the snapshot's panels on first use, and runs `f` with them.
pub(super) fn with_weights<R>(
    c: &Config,
    weights: &[Tensor],
    snapshot: &super::DecodeWeights,
    f: impl FnOnce(&StepWeights) -> Result<R>,
) -> Result<R> {
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
        theta: c.rope_theta,
    };
    // Rows split across threads when the weights stay in cache (one fork-join per step is
    // worth it from two rows on).
    let threads = rayon::current_num_threads();
    let small = 4 * c.num_parameters() <= ROW_SPLIT_MAX_WEIGHTS;
    // Small models' projections as outer products over weights packed once per snapshot (AVX-512
    // or AVX2): each row's sums then run in one order whatever the batch (a
    // sample's logits are bit-identical with more or fewer rows beside it).
    let packed = (small && super::panels::available_packed()).then(|| {
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
    f(&StepWeights {
        w,
        t,
        dm,
        max_parts: if small { threads } else { 1 },
        par: !small && threads > 1,
    })
}

/// Scratch for `parts` parts of the batch, part i holding the rows `bounds(i)` = (first row,
/// first token, per-row token ends): the previous step's from this thread when the shapes
/// match (fresh buffers every step cost more in page faults, as the allocator hands them back
/// to the OS, than the step).
pub(super) fn scratch(
    parts: usize,
    bounds: impl Fn(usize) -> (usize, usize, Vec<usize>),
    dm: &Dims,
) -> Vec<Rows> {
    let chunks = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let want: Vec<_> = (0..parts).map(bounds).collect();
    if chunks.len() == parts
        && chunks
            .iter()
            .zip(&want)
            .all(|(r, (s, t, e))| r.fits(*s, *t, e, dm))
    {
        return chunks;
    }
    want.into_iter()
        .map(|(s, t, e)| Rows::new(s, t, e, dm))
        .collect()
}

/// The parts' logits (B, V) in row order; their scratch is kept for the next step.
pub(super) fn finish(chunks: Vec<Rows>, dm: &Dims) -> Result<Tensor> {
    let b: usize = chunks.iter().map(|r| r.n).sum();
    let mut logits = Vec::with_capacity(b * dm.vocab);
    for r in &chunks {
        logits.extend_from_slice(&r.logits);
    }
    SCRATCH.with(|s| *s.borrow_mut() = chunks);
    Tensor::from_vec(logits, (b, dm.vocab), &candle_core::Device::Cpu) // (B, V)
}

/// Runs `part` on each of the parts (in parallel when there are several).
pub(super) fn run_parts<P: Send>(
    work: &mut [(&mut Rows, P)],
    part: impl Fn(&mut Rows, &mut P) + Sync,
) {
    match work {
        [(r, p)] => part(r, p),
        many => many.par_iter_mut().for_each(|(r, p)| part(r, p)),
    }
}

/// A one-line error for a token id outside the vocabulary.
pub(super) fn check_ids(ids: &[u32], vocab: usize) -> Result<()> {
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        crate::fail!("decode: token id {id} out of range for vocabulary {vocab}");
    }
    Ok(())
}
