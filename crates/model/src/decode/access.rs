//! Mutable access to KV cache tensors for the CPU decode step: candle's in-place op takes each
//! storage's write lock for the call; `KvMut` is a tensor's contents as stored (f32 or f16),
//! split into the step's row parts (the preallocated cache) or shared as raw pointers (the
//! paged pool, `PoolPtr`).
//!
//! Data flow: `cpu::step` / `paged::step` -> `with_all_mut` over every layer's K and V -> the
//! parts' writes and attention reads.

use super::common::{Kv, PoolPtr};
use candle_core::{CpuStorage, InplaceOp1, Layout, Result, Tensor};
use half::f16;

/// The contents of one KV cache tensor (or a part's rows of it), as stored.
pub(super) enum KvMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

impl<'a> KvMut<'a> {
    /// The whole buffer as a raw pointer (the paged pool, shared by the step's threads).
    pub(super) fn ptr(&mut self) -> (*mut u8, usize, bool) {
        match self {
            KvMut::F32(x) => (x.as_mut_ptr().cast(), x.len(), false),
            KvMut::F16(x) => (x.as_mut_ptr().cast(), x.len(), true),
        }
    }

    pub(super) fn view(&self) -> Kv<'_> {
        match self {
            KvMut::F32(x) => Kv::F32(x),
            KvMut::F16(x) => Kv::F16(x),
        }
    }

    /// Splits a (B, ...) buffer of `block` elements per row into parts of `rows[i]` rows.
    pub(super) fn split_rows(self, rows: &[usize], block: usize) -> Vec<KvMut<'a>> {
        fn split<'s, T>(mut all: &'s mut [T], rows: &[usize], block: usize) -> Vec<&'s mut [T]> {
            rows.iter()
                .map(|&n| {
                    let (mine, rest) = std::mem::take(&mut all).split_at_mut(n * block);
                    all = rest;
                    mine
                })
                .collect()
        }
        match self {
            KvMut::F32(x) => split(x, rows, block).into_iter().map(KvMut::F32).collect(),
            KvMut::F16(x) => split(x, rows, block).into_iter().map(KvMut::F16).collect(),
        }
    }

    /// Writes a part's new K or V (n, s, Hkv, D) into slots `off..off + s` of its (n, Hkv, C,
    /// D) cache (rounded to f16 in an f16 cache).
    pub(super) fn write_slots(&mut self, src: &[f32], dims: [usize; 4], off: usize) {
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
pub(super) fn with_all_mut<'h>(
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

/// The K and V pools of one layer as shared pointers.
pub(super) fn pool_ptr(k: &mut KvMut, v: &mut KvMut) -> PoolPtr {
    let ((kp, n, f16), (vp, _, _)) = (k.ptr(), v.ptr());
    PoolPtr {
        k: kp,
        v: vp,
        n,
        f16,
    }
}

/// Writes one token's (Hkv, D) keys or values `src` into slot `slot` of block `blk` of a paged
/// pool (NB, Hkv, block, D), rounded to f16 in an f16 pool.
///
/// # Safety
/// No other thread reads or writes that block during the call (the pool's ownership rule).
#[allow(unsafe_code)]
pub(super) unsafe fn write_paged(
    base: *mut u8,
    n: usize,
    is_f16: bool,
    src: &[f32],
    [blk, slot, block, d]: [usize; 4],
) {
    let hkv = src.len() / d;
    for (h, head) in src.chunks_exact(d).enumerate() {
        let at = ((blk * hkv + h) * block + slot) * d;
        assert!(at + d <= n, "paged cache write out of range");
        // SAFETY: in bounds (asserted); the caller owns the block for the call.
        unsafe {
            if is_f16 {
                let dst = std::slice::from_raw_parts_mut(base.cast::<f16>().add(at), d);
                for (o, &x) in dst.iter_mut().zip(head) {
                    *o = f16::from_f32(x);
                }
            } else {
                std::slice::from_raw_parts_mut(base.cast::<f32>().add(at), d).copy_from_slice(head);
            }
        }
    }
}
