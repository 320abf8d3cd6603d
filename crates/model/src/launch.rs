//! One launch description per kernel entry point of kernels/*.cu: the kernel's name, its grid
//! and block, and its argument list in order (buffers by their position in the caller's list,
//! scalars by value). The CUDA launches (fused/cuda.rs, flash/cuda.rs) push exactly these
//! arguments with exactly this geometry, and crates/simt runs the same description on the CPU
//! through the SIMT shim, so a swapped argument or a wrong grid fails a CPU test.
//!
//! Each constructor documents the buffers it expects, in order. Shapes are checked by
//! kernel_checks.rs before a description is built; these functions only lay out the launch.

use crate::kernel_checks::{
    DECODE_WARPS, FLASH_TC_WARPS, FLASH_WARPS, LOGPROB_BLOCK, RMSNORM_BLOCK,
};

/// The storage type a kernel is instantiated for: the entry point's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
}

impl Storage {
    pub fn suffix(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::Bf16 => "bf16",
        }
    }
}

/// One argument of a launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// The caller's buffer at this position.
    Buf(usize),
    I32(i32),
    U32(u32),
    F32(f32),
    U64(u64),
}

/// A kernel launch: what cudarc's `launch` and the CPU shim both run.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The entry point, e.g. `rmsnorm_fwd_bf16`.
    pub kernel: String,
    /// The kernels/ file (stem) the entry point is in: the PTX module on CUDA.
    pub module: &'static str,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory (kernels/mma.cuh's `TERSE_DYNAMIC_SHARED`); above 48 KB
    /// the CUDA launch raises the function's limit first (fused/launching.rs).
    pub shared: u32,
    pub args: Vec<Arg>,
}

/// One block of `block` threads per row.
fn per_row(
    kernel: String,
    module: &'static str,
    rows: usize,
    block: u32,
    args: Vec<Arg>,
) -> Launch {
    Launch {
        kernel,
        module,
        grid: (rows as u32, 1, 1),
        block: (block, 1, 1),
        shared: 0,
        args,
    }
}

/// One thread per element, blocks of 1024 (cudarc's `LaunchConfig::for_num_elems`).
fn elementwise(kernel: String, module: &'static str, n: usize, args: Vec<Arg>) -> Launch {
    Launch {
        kernel,
        module,
        grid: ((n as u32).div_ceil(1024), 1, 1),
        block: (1024, 1, 1),
        shared: 0,
        args,
    }
}

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

fn bufs(n: usize) -> impl Iterator<Item = Arg> {
    (0..n).map(Arg::Buf)
}

fn ints(xs: &[usize]) -> impl Iterator<Item = Arg> + '_ {
    xs.iter().map(|&x| Arg::I32(x as i32))
}

/// Buffers: x (rows, cols), w (cols), y (rows, cols), rstd (rows, f32).
pub fn rmsnorm_fwd(s: Storage, rows: usize, cols: usize, eps: f32) -> Launch {
    let args = bufs(4)
        .chain([Arg::I32(cols as i32), Arg::F32(eps)])
        .collect();
    per_row(
        format!("rmsnorm_fwd_{}", s.suffix()),
        "rmsnorm",
        rows,
        RMSNORM_BLOCK,
        args,
    )
}

/// f32 only. Buffers: x, w, rstd (from `rmsnorm_fwd`), dy, dx (rows, cols), dw (cols, zeroed:
/// the kernel accumulates into it).
pub fn rmsnorm_bwd(rows: usize, cols: usize) -> Launch {
    let args = bufs(6).chain([Arg::I32(cols as i32)]).collect();
    per_row(
        "rmsnorm_bwd_f32".into(),
        "rmsnorm",
        rows,
        RMSNORM_BLOCK,
        args,
    )
}

/// Rotate-half RoPE over x (B, H, T, D) (`inverse`: the backward). Buffers: x, cos, sin
/// (B, T, D/2), y.
pub fn rope(s: Storage, inverse: bool, [b, h, t, d]: [usize; 4]) -> Launch {
    let dir = if inverse { "bwd" } else { "fwd" };
    let args = bufs(4).chain(ints(&[b, h, t, d])).collect();
    elementwise(
        format!("rope_{dir}_{}", s.suffix()),
        "rope",
        b * h * t * d / 2,
        args,
    )
}

/// f32. Buffers: logits (n, v), targets (n, u32), stats (n, 3).
pub fn logprob_fwd(n: usize, v: usize) -> Launch {
    let args = bufs(3).chain([Arg::I32(v as i32)]).collect();
    per_row("logprob_fwd_f32".into(), "logprob", n, LOGPROB_BLOCK, args)
}

/// f32, in place. Buffers: logits (n, v) -> gradient, targets (n, u32), lse_g (n, 2).
pub fn logprob_bwd(n: usize, v: usize) -> Launch {
    let args = bufs(3).chain([Arg::I32(v as i32)]).collect();
    per_row("logprob_bwd_f32".into(), "logprob", n, LOGPROB_BLOCK, args)
}

/// One slot of the preallocated cache. Buffers: src (B, Hkv, 1, D), cache (B, Hkv, cap, D).
pub fn kv_write(s: Storage, [b, hkv, cap, d]: [usize; 4], slot: usize) -> Launch {
    let args = bufs(2).chain(ints(&[b, hkv, cap, d, slot])).collect();
    elementwise(
        format!("kv_write_{}", s.suffix()),
        "kv_cache",
        b * hkv * d,
        args,
    )
}

/// Single-query attention over the preallocated cache. Buffers: q (B, Hq, D), k and v caches
/// (B, Hkv, cap, D), valid (B, cap, u8), out (B, Hq, D).
pub fn decode_attention(s: Storage, [b, hq, hkv, cap, d]: [usize; 5], len: usize) -> Launch {
    let scale = 1.0f32 / (d as f32).sqrt();
    let args = bufs(5)
        .chain(ints(&[hq, hkv, cap, len, d]))
        .chain([Arg::F32(scale)])
        .collect();
    per_row(
        format!("decode_attention_{}", s.suffix()),
        "kv_cache",
        b * hq,
        32 * DECODE_WARPS,
        args,
    )
}

/// Each new token's K or V row into its slot of the block pool. Buffers: src (B, Hkv, D),
/// pool (blocks, Hkv, bs, D), slots (B, i32: block * bs + offset).
pub fn paged_kv_write(s: Storage, [b, hkv, bs, d]: [usize; 4]) -> Launch {
    let args = bufs(3).chain(ints(&[b, hkv, bs, d])).collect();
    elementwise(
        format!("paged_kv_write_{}", s.suffix()),
        "paged_attention",
        b * hkv * d,
        args,
    )
}

/// Single-query attention over block tables. Buffers: q (B, Hq, D), k and v pools, tables
/// (B, maxb, i32), lens (B, i32), out (B, Hq, D).
pub fn paged_decode_attention(s: Storage, [b, hq, hkv, bs, maxb, d]: [usize; 6]) -> Launch {
    let scale = 1.0f32 / (d as f32).sqrt();
    let args = bufs(6)
        .chain(ints(&[hq, hkv, bs, maxb, d]))
        .chain([Arg::F32(scale)])
        .collect();
    per_row(
        format!("paged_decode_attention_{}", s.suffix()),
        "paged_attention",
        b * hq,
        32 * DECODE_WARPS,
        args,
    )
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

/// Keys per tile of `flash_fa2_fwd_*`: kernels/flash_fa2.cu's `FA2_KEYS` (crates/simt's
/// tests check the two agree).
pub const FLASH_FA2_KEYS: usize = 64;

/// Dynamic shared memory of `flash_fa2_fwd_d{d}`: 2 stages x (K, V) x FLASH_FA2_KEYS rows of
/// d + 8 bf16 (the padded rows of kernels/flash_fa2.cu): 36,864 bytes at d = 64, 69,632 at 128.
pub fn flash_fa2_shared(d: usize) -> u32 {
    (2 * 2 * FLASH_FA2_KEYS * (d + 8) * 2) as u32
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_and_argument_order_are_laid_out_once() {
        let l = rmsnorm_fwd(Storage::Bf16, 10, 64, 1e-6);
        assert_eq!(l.kernel, "rmsnorm_fwd_bf16");
        assert_eq!((l.grid, l.block), ((10, 1, 1), (RMSNORM_BLOCK, 1, 1)));
        assert_eq!(l.args[4], Arg::I32(64));
        let dm = FlashDims {
            b: 2,
            hq: 4,
            hkv: 2,
            t: 9,
            d: 64,
            scale: 0.125,
        };
        let f = flash_bwd_dkdv(Storage::F32, dm);
        assert_eq!(f.grid, (3, 4, 1), "ceil(9 / 4) key-row tiles x B * Hkv");
        assert_eq!(f.args.len(), 14);
        assert_eq!(rope(Storage::F32, true, [1, 2, 3, 4]).grid, (1, 1, 1));
    }
}
