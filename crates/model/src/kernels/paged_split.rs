//! Flash-decoding for the paged cache (kernels/paged_attention.cu `paged_decode_split_*` then
//! `paged_decode_merge_*`): a row's context is cut into splits of [`SPLIT_CHUNK`] slots (at most
//! [`MAX_SPLITS`]), each split's partial softmax (max, sum, unnormalised output) is written by
//! one of Y blocks of its (row, query head), and a second kernel merges them in split order.
//! Here: the switch (`TERSE_FLASH_DECODING=0` keeps `paged_decode_attention_*`, the reference
//! path), the `SplitPlan` (Y from the batch size and the SM count; a row's split count from its
//! own length), the launch descriptions and the CUDA launch. The f32 CPU reference is
//! paged_attention.rs's: the split changes the order of the sums, not what they compute.
//!
//! CUDA graphs: the grid (B · Hq, Y), the block and the partial buffers (B · Hq · MAX_SPLITS)
//! depend only on the batch size and fixed limits, and every per-step quantity (lengths,
//! tables) is read on the device, so one captured launch serves every step of a batch size.
//!
//! Data flow: `paged_decode_attention` (paged_attention.rs: the op, its checks and the step's
//! device tables; on CUDA with the switch on) -> here.

/// Slots per split (a row of `len` slots has ceil(len / SPLIT_CHUNK) splits, at most
/// [`MAX_SPLITS`]): 256 keeps a split's partial (D + 2 floats) below 1 % of the K/V it reads at
/// head size 128 in bf16 (64 KiB of K and V per split and KV head).
pub const SPLIT_CHUNK: usize = 256;

/// The most splits a row has: rows longer than MAX_SPLITS · SPLIT_CHUNK (8k) get longer splits.
/// It sizes the partial buffers, (B · Hq, MAX_SPLITS, D + 2) f32.
pub const MAX_SPLITS: usize = 32;

/// Blocks the split kernel aims to have per SM (4 warps each: 16 fill an SM's 64 warps).
const BLOCKS_PER_SM: usize = 16;

/// Whether CUDA paged decode attention takes the split kernels; from `TERSE_FLASH_DECODING`
/// (`0` keeps the one-block-per-head reference kernel for the whole process); gpu-check's
/// `decode_long` switches it to time both in one run.
fn flag() -> &'static std::sync::atomic::AtomicBool {
    static FLAG: std::sync::OnceLock<std::sync::atomic::AtomicBool> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        std::sync::atomic::AtomicBool::new(flash_decoding_by_default(
            std::env::var("TERSE_FLASH_DECODING").ok().as_deref(),
        ))
    })
}

/// `TERSE_FLASH_DECODING`'s reading: unset or anything but `0` keeps flash-decoding on.
pub fn flash_decoding_by_default(var: Option<&str>) -> bool {
    var.is_none_or(|v| v.trim() != "0")
}

/// Routes CUDA paged decode attention to the split kernels (`true`) or to the reference one;
/// for benchmarks and parity, which put back the process's setting after
/// (`reset_flash_decoding`).
pub fn set_flash_decoding(on: bool) {
    flag().store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Puts back the process's setting (`TERSE_FLASH_DECODING`) after `set_flash_decoding`.
pub fn reset_flash_decoding() {
    set_flash_decoding(flash_decoding_by_default(
        std::env::var("TERSE_FLASH_DECODING").ok().as_deref(),
    ));
}

/// Whether the split kernels are selected (`set_flash_decoding`, `TERSE_FLASH_DECODING`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn flash_decoding() -> bool {
    flag().load(std::sync::atomic::Ordering::Relaxed)
}

/// How one launch splits: `chunk` slots per split and at most `max_splits` per row (fixed
/// limits: a row's result depends on these and its own length only), computed by `blocks`
/// blocks per (row, query head) (the grid's y, from the batch size and the SM count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    pub chunk: usize,
    pub max_splits: usize,
    pub blocks: usize,
}

impl SplitPlan {
    /// The plan for `rows` (row, query head) pairs on a GPU of `sms` SMs: enough blocks per pair
    /// that the grid holds about BLOCKS_PER_SM blocks per SM, never more than a row's splits.
    pub fn new(sms: usize, rows: usize) -> Self {
        let want = (BLOCKS_PER_SM * sms.max(1)).div_ceil(rows.max(1));
        Self {
            chunk: SPLIT_CHUNK,
            max_splits: MAX_SPLITS,
            blocks: want.clamp(1, MAX_SPLITS),
        }
    }

    /// The splits of a row attending `len` slots: kernels/paged_attention.cu's `split_count`.
    pub fn count(&self, len: usize) -> usize {
        len.div_ceil(self.chunk).min(self.max_splits)
    }
}

/// The launch descriptions of the two kernels (crates/simt runs them on the CPU).
pub mod launch {
    use crate::kernels::describe::{bufs, ints, per_row, Arg, Launch, Storage};
    use crate::kernels::geometry::DECODE_WARPS;
    use crate::kernels::paged_split::SplitPlan;

    /// The splits' partials. Buffers: q (B, Hq, D), k and v pools (NB, Hkv, BS, D), tables
    /// (B, maxb, i32), lens (B, i32), part_o (B · Hq, max_splits, D) f32, part_ms
    /// (B · Hq, max_splits, 2) f32. Grid (B · Hq, plan.blocks).
    pub fn paged_decode_split(
        s: Storage,
        [b, hq, hkv, bs, maxb, d]: [usize; 6],
        plan: SplitPlan,
    ) -> Launch {
        let scale = 1.0f32 / (d as f32).sqrt();
        let args = bufs(7)
            .chain(ints(&[hq, hkv, bs, maxb, d]))
            .chain([Arg::F32(scale)])
            .chain(ints(&[plan.max_splits, plan.chunk]))
            .collect();
        let mut l = per_row(
            format!("paged_decode_split_{}", s.suffix()),
            "paged_attention",
            b * hq,
            32 * DECODE_WARPS,
            args,
        );
        l.grid.1 = plan.blocks as u32;
        l
    }

    /// The merge of each (row, head)'s splits. Buffers: part_o, part_ms (as the split's), lens
    /// (B, i32), out (B, Hq, D).
    pub fn paged_decode_merge(s: Storage, [b, hq, d]: [usize; 3], plan: SplitPlan) -> Launch {
        let args = bufs(4)
            .chain(ints(&[hq, d, plan.max_splits, plan.chunk]))
            .collect();
        per_row(
            format!("paged_decode_merge_{}", s.suffix()),
            "paged_attention",
            b * hq,
            32 * DECODE_WARPS,
            args,
        )
    }
}

/// The CUDA launch (the `cuda` feature only): both kernels through their descriptions, on the
/// views paged_attention.rs made of a checked step (its shapes, block tables and lengths).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill
pub(crate) mod cuda {
    use crate::kernels::launching::{by_dtype, func, store, view, Described};
    use crate::kernels::paged_split::{launch, SplitPlan};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::CudaView;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result};

    /// The device's SM count, read once (a driver call per launch would count in every step).
    fn sm_count(dev: &CudaDevice) -> Result<usize> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
        use candle_core::cuda_backend::WrapErr;
        static SMS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        if let Some(&n) = SMS.get() {
            return Ok(n);
        }
        let n = dev
            .cuda_stream()
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .w()?;
        Ok(*SMS.get_or_init(|| n.max(1) as usize))
    }

    /// q (B, Hq, D) over the pools -> (B, Hq, D); `dims` [B, Hq, Hkv, BS, maxb, D] and the
    /// tables and lengths as paged_attention.rs checked them.
    pub fn paged_decode_attention(
        (q, lq): (&CudaStorage, &Layout),
        (k, lk): (&CudaStorage, &Layout),
        (v, lv): (&CudaStorage, &Layout),
        dims: [usize; 6],
        tables: &CudaView<'_, u32>,
        lens: &CudaView<'_, u32>,
    ) -> Result<CudaStorage> {
        let dev: &CudaDevice = q.device();
        let [b, hq, _, _, _, d] = dims;
        let plan = SplitPlan::new(sm_count(dev)?, b * hq);
        let st = store(q.dtype(), "paged attention")?;
        let ls = launch::paged_decode_split(st, dims, plan);
        let lm = launch::paged_decode_merge(st, [b, hq, d], plan);
        let (fs, fm) = (func!(dev, ls)?, func!(dev, lm)?);
        let parts = b * hq * plan.max_splits;
        // SAFETY: the merge reads only the splits each row's length gives, which the split
        // kernel writes.
        let (mut part_o, mut part_ms) =
            unsafe { (dev.alloc::<f32>(parts * d)?, dev.alloc::<f32>(parts * 2)?) };
        Ok(by_dtype!(q.dtype(), "paged attention", T => {
            let (qv, kv, vv) = (
                view::<T>(q, lq, "q")?,
                view::<T>(k, lk, "k pool")?,
                view::<T>(v, lv, "v pool")?,
            );
            let mut dsc = Described::new(fs.builder(), &ls);
            dsc.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &vv)?
                .buf(3, tables)?
                .buf(4, lens)?
                .buf(5, &mut part_o)?
                .buf(6, &mut part_ms)?;
            // SAFETY: the tables were checked to hold blocks of the pool and lengths within
            // them; the partials hold max_splits per (row, head).
            unsafe { dsc.launch() }?;
            // SAFETY: every element is written by the merge.
            let mut out = unsafe { dev.alloc::<T>(b * hq * d)? };
            let mut dsc = Described::new(fm.builder(), &lm);
            dsc.buf(0, &part_o)?
                .buf(1, &part_ms)?
                .buf(2, lens)?
                .buf(3, &mut out)?;
            // SAFETY: as above; out is (B, Hq, D).
            unsafe { dsc.launch() }?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::paged_split::{
        flash_decoding_by_default, SplitPlan, MAX_SPLITS, SPLIT_CHUNK,
    };

    /// TERSE_FLASH_DECODING=0 (with or without spaces) keeps the reference kernel; unset or 1
    /// takes the split kernels.
    #[test]
    fn only_zero_turns_flash_decoding_off() {
        for (v, on) in [
            (None, true),
            (Some("1"), true),
            (Some("0"), false),
            (Some(" 0 "), false),
        ] {
            assert_eq!(flash_decoding_by_default(v), on, "{v:?}");
        }
    }

    /// A row's split count follows its length alone; the blocks per (row, head) fill an H200's
    /// 132 SMs at small batches and drop to one at large ones, within [1, MAX_SPLITS].
    #[test]
    fn the_plan_fills_the_sms_and_a_row_splits_by_its_length() {
        let small = SplitPlan::new(132, 16);
        let large = SplitPlan::new(132, 64 * 16);
        let huge = SplitPlan::new(132, 256 * 16);
        assert_eq!(small.blocks, MAX_SPLITS);
        assert_eq!(large.blocks, 3, "ceil(16 * 132 / 1024)");
        assert_eq!(huge.blocks, 1);
        for p in [small, large, huge] {
            assert_eq!(p.count(0), 0);
            assert_eq!(p.count(1), 1);
            assert_eq!(p.count(SPLIT_CHUNK), 1);
            assert_eq!(p.count(SPLIT_CHUNK + 1), 2);
            assert_eq!(p.count(8192), 32);
            assert_eq!(p.count(40_960), MAX_SPLITS);
        }
        assert_eq!(SplitPlan::new(0, 0).blocks, MAX_SPLITS.min(16));
    }
}
