//! The CPU side of the custom ops' plumbing: a contiguous CPU tensor's values as a slice, with
//! a one-line error naming the input when it is not one. The fused ops, the paged ops and flash
//! attention read their CPU inputs through it.

use candle_core::{CpuStorage, Layout, Result};

/// The f32 slice of a contiguous CPU tensor (the custom ops' CPU inputs).
pub(crate) fn f32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => crate::fail!("{what}: expected a contiguous f32 tensor"),
    }
}

pub(crate) fn u32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [u32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::U32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => crate::fail!("{what}: expected a contiguous u32 tensor"),
    }
}
