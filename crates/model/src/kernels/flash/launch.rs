//! Flash attention's launch descriptions (kernels/flash_attn.cu, the tensor-core kernels of
//! kernels/flash_tc.cu and FlashAttention-2's of kernels/flash_fa2.cu and flash_fa2_bwd.cu): the shape of a
//! call (`FlashDims`, one type for the launches and the CPU path) and one description per entry
//! point, which cuda.rs launches and crates/simt runs.

use crate::kernels::describe::{bufs, ints, Arg, Launch, Storage};
use crate::kernels::geometry::{FLASH_TC_WARPS, FLASH_WARPS};

/// One warp per row, `FLASH_WARPS` rows per block; `heads` blocks along y.
fn flash_rows(kernel: String, rows: usize, heads: usize, args: Vec<Arg>) -> Launch {
    Launch {
        kernel,
        module: "flash_attn",
        grid: (rows.div_ceil(FLASH_WARPS as usize) as u32, heads as u32, 1),
        block: (32 * FLASH_WARPS, 1, 1),
        shared: 0,
        args,
    }
}

/// The shape of a flash launch: batch, query heads, KV heads, tokens, head size, and the
/// softmax scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlashDims {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub t: usize,
    pub d: usize,
    pub scale: f32,
}

impl FlashDims {
    /// The shape with attention's usual softmax scale, 1 / sqrt(d).
    pub fn new(b: usize, hq: usize, hkv: usize, t: usize, d: usize) -> Self {
        Self {
            b,
            hq,
            hkv,
            t,
            d,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    fn tail(&self) -> impl Iterator<Item = Arg> {
        let d = *self;
        ints(&[d.hq, d.hkv, d.t, d.d])
            .collect::<Vec<_>>()
            .into_iter()
            .chain([Arg::F32(d.scale)])
    }
}

/// Buffers: q (B, Hq, T, D), k and v (B, Hkv, T, D), starts (B, T, u32: each row's first key),
/// out (B, Hq, T, D, f32), lse (B, Hq, T, f32).
pub fn flash_fwd(s: Storage, dm: FlashDims) -> Launch {
    let args = bufs(6).chain(dm.tail()).collect();
    flash_rows(
        format!("flash_fwd_{}", s.suffix()),
        dm.t,
        dm.b * dm.hq,
        args,
    )
}

/// f32. delta = rowsum(dO * O) over `rows` rows of size d. Buffers: out, dout, delta (rows).
pub fn flash_delta(rows: usize, d: usize) -> Launch {
    let args = bufs(3)
        .chain([Arg::U64(rows as u64), Arg::I32(d as i32)])
        .collect();
    flash_rows("flash_delta_f32".into(), rows, 1, args)
}

/// Buffers: q, k, v, starts, lse, delta, dout (f32), dq (B, Hq, T, D, f32).
pub fn flash_bwd_dq(s: Storage, dm: FlashDims) -> Launch {
    let args = bufs(8).chain(dm.tail()).collect();
    flash_rows(
        format!("flash_bwd_dq_{}", s.suffix()),
        dm.t,
        dm.b * dm.hq,
        args,
    )
}

/// Buffers: q, k, v, starts, lse, delta, dout, dk, dv (B, Hkv, T, D, f32).
pub fn flash_bwd_dkdv(s: Storage, dm: FlashDims) -> Launch {
    let args = bufs(9).chain(dm.tail()).collect();
    flash_rows(
        format!("flash_bwd_dkdv_{}", s.suffix()),
        dm.t,
        dm.b * dm.hkv,
        args,
    )
}

/// The head sizes the tensor-core flash kernels are instantiated for.
pub const FLASH_TC_HEAD_DIMS: [usize; 2] = [64, 128];

/// Whether the tensor-core kernels (kernels/flash_tc.cu) cover a call: bf16 in, head size 64 or
/// 128. Everything else takes the scalar kernels of flash_attn.cu.
pub fn flash_tc_covers(s: Storage, d: usize) -> bool {
    s == Storage::Bf16 && FLASH_TC_HEAD_DIMS.contains(&d)
}

/// 16 x FLASH_TC_WARPS rows per block, `heads` blocks along y.
fn flash_tc_rows(kernel: String, t: usize, heads: usize, args: Vec<Arg>) -> Launch {
    let rows = 16 * FLASH_TC_WARPS as usize;
    Launch {
        kernel,
        module: "flash_tc",
        grid: (t.div_ceil(rows) as u32, heads as u32, 1),
        block: (32 * FLASH_TC_WARPS, 1, 1),
        shared: 0,
        args,
    }
}

/// The scalars of a tensor-core flash launch (the head size is in the kernel's name).
fn tc_tail(dm: &FlashDims) -> impl Iterator<Item = Arg> {
    ints(&[dm.hq, dm.hkv, dm.t])
        .collect::<Vec<_>>()
        .into_iter()
        .chain([Arg::F32(dm.scale)])
}

/// bf16, head size 64 or 128 (`flash_tc_covers`). Buffers as `flash_fwd`.
pub fn flash_tc_fwd(dm: FlashDims) -> Launch {
    let args = bufs(6).chain(tc_tail(&dm)).collect();
    flash_tc_rows(format!("flash_tc_fwd_d{}", dm.d), dm.t, dm.b * dm.hq, args)
}

/// bf16, head size 64 or 128. Buffers as `flash_bwd_dq`.
pub fn flash_tc_bwd_dq(dm: FlashDims) -> Launch {
    let args = bufs(8).chain(tc_tail(&dm)).collect();
    flash_tc_rows(
        format!("flash_tc_bwd_dq_d{}", dm.d),
        dm.t,
        dm.b * dm.hq,
        args,
    )
}

/// bf16, head size 64 or 128: blocks of 16 x FLASH_TC_WARPS key rows. Buffers as
/// `flash_bwd_dkdv`.
pub fn flash_tc_bwd_dkdv(dm: FlashDims) -> Launch {
    let args = bufs(9).chain(tc_tail(&dm)).collect();
    flash_tc_rows(
        format!("flash_tc_bwd_dkdv_d{}", dm.d),
        dm.t,
        dm.b * dm.hkv,
        args,
    )
}

/// Keys per tile of the `flash_fa2_*` kernels: kernels/fa2.cuh's `FA2_KEYS` (crates/simt's
/// tests check the two agree).
pub const FLASH_FA2_KEYS: usize = 64;

/// Dynamic shared memory of `flash_fa2_fwd_d{d}`: 2 stages x (K, V) x FLASH_FA2_KEYS rows of
/// d bf16 (the swizzled rows of kernels/fa2.cuh): 32,768 bytes at d = 64, 65,536 at 128.
pub fn flash_fa2_shared(d: usize) -> u32 {
    (2 * 2 * FLASH_FA2_KEYS * d * 2) as u32
}

/// bf16, head size 64 or 128 (`flash_tc_covers`): the forward in FlashAttention-2's structure
/// (kernels/flash_fa2.cu), rows and grid as `flash_tc_fwd`. Buffers as `flash_fwd`.
pub fn flash_fa2_fwd(dm: FlashDims) -> Launch {
    let args = bufs(6).chain(tc_tail(&dm)).collect();
    Launch {
        module: "flash_fa2",
        shared: flash_fa2_shared(dm.d),
        ..flash_tc_rows(format!("flash_fa2_fwd_d{}", dm.d), dm.t, dm.b * dm.hq, args)
    }
}

/// Queries per step of `flash_fa2_bwd_dkdv_d{d}`: kernels/flash_fa2_bwd.cu's `FA2_BWD_QT_D64`
/// and `FA2_BWD_QT_D128` (crates/simt's tests check they agree): 32 at d = 64, 16 at 128.
pub fn flash_fa2_bwd_queries(d: usize) -> usize {
    if d == 64 {
        32
    } else {
        16
    }
}

/// Dynamic shared memory of `flash_fa2_bwd_dkdv_d{d}`: the block's K and V (FLASH_FA2_KEYS
/// rows), 2 stages of Q and dO (`flash_fa2_bwd_queries` rows), all of d bf16 (swizzled), dS^T
/// as FLASH_FA2_KEYS x (queries + 8) bf16 (padded), and per stage the queries' lse, delta and
/// starts (4 bytes each): 38,656 bytes at d = 64, 52,608 at 128.
pub fn flash_fa2_bwd_dkdv_shared(d: usize) -> u32 {
    let qt = flash_fa2_bwd_queries(d);
    let bf16s = 2 * FLASH_FA2_KEYS * d + 4 * qt * d + FLASH_FA2_KEYS * (qt + 8);
    (bf16s * 2 + 3 * 2 * qt * 4) as u32
}

/// bf16, head size 64 or 128: FlashAttention-2's deterministic dQ (kernels/flash_fa2_bwd.cu),
/// rows, grid and shared memory as `flash_fa2_fwd`. Buffers: q, k, v, starts, lse, delta,
/// dout (bf16), dq (B, Hq, T, D, f32).
pub fn flash_fa2_bwd_dq(dm: FlashDims) -> Launch {
    let args = bufs(8).chain(tc_tail(&dm)).collect();
    Launch {
        module: "flash_fa2_bwd",
        shared: flash_fa2_shared(dm.d),
        ..flash_tc_rows(
            format!("flash_fa2_bwd_dq_d{}", dm.d),
            dm.t,
            dm.b * dm.hq,
            args,
        )
    }
}

/// bf16, head size 64 or 128: FlashAttention-2's dK/dV (kernels/flash_fa2_bwd.cu), blocks of
/// FLASH_FA2_KEYS keys, `B * Hkv` along y. Buffers: q, k, v, starts, lse, delta, dout (bf16),
/// dq (f32, added to with atomics when `dq_atomic`, so zeroed first; untouched otherwise), dk,
/// dv (B, Hkv, T, D, f32).
pub fn flash_fa2_bwd_dkdv(dm: FlashDims, dq_atomic: bool) -> Launch {
    let args = bufs(10)
        .chain(tc_tail(&dm))
        .chain([Arg::I32(dq_atomic as i32)])
        .collect();
    Launch {
        module: "flash_fa2_bwd",
        shared: flash_fa2_bwd_dkdv_shared(dm.d),
        ..flash_tc_rows(
            format!("flash_fa2_bwd_dkdv_d{}", dm.d),
            dm.t,
            dm.b * dm.hkv,
            args,
        )
    }
}

/// `flash_fa2_fwd` in the projections' rows (the written layer backward's): q (B, T, Hq, D), k
/// and v (B, T, Hkv, D) bf16, starts, out (B, T, Hq, D) bf16, lse (B, Hq, T) f32.
pub fn flash_fa2_fwd_rows(dm: FlashDims) -> Launch {
    let l = flash_fa2_fwd(dm);
    Launch {
        kernel: format!("flash_fa2_fwd_rows_d{}", dm.d),
        ..l
    }
}

/// `flash_fa2_bwd_dq` in the projections' rows, delta computed and written by the kernel.
/// Buffers: q, k, v, starts, lse, delta (B, Hq, T, f32, written), dout, dq (B, T, Hq, D, bf16),
/// the forward's out (B, T, Hq, D, bf16). Runs before `flash_fa2_bwd_dkdv_rows`, which reads
/// its delta.
pub fn flash_fa2_bwd_dq_rows(dm: FlashDims) -> Launch {
    let args = bufs(9).chain(tc_tail(&dm)).collect();
    Launch {
        kernel: format!("flash_fa2_bwd_dq_rows_d{}", dm.d),
        args,
        ..flash_fa2_bwd_dq(dm)
    }
}

/// `flash_fa2_bwd_dkdv` in the projections' rows, without the atomic dQ. Buffers: q, k, v,
/// starts, lse, delta, dout, dk, dv (B, T, Hkv, D, bf16).
pub fn flash_fa2_bwd_dkdv_rows(dm: FlashDims) -> Launch {
    let args = bufs(9).chain(tc_tail(&dm)).collect();
    Launch {
        kernel: format!("flash_fa2_bwd_dkdv_rows_d{}", dm.d),
        args,
        ..flash_fa2_bwd_dkdv(dm, false)
    }
}
