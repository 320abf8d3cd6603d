//! Shape and bounds checks that run before every fused op (fused.rs), on every device: the
//! CUDA kernels of kernels/*.cu index raw buffers and would read or write past them on a
//! wrong shape, so a mismatch is an error naming the op and the shapes, never a launch. The
//! CPU references run the same checks, so `cargo test` covers what a GPU run relies on.
//! Also the launch geometry the kernels are compiled for (block sizes, the largest head
//! size), which build.rs passes to nvcc from here: one place for both sides.

use candle_core::Result;

/// Threads per block of `rmsnorm_{fwd,bwd}_*` (one block per row; a multiple of 32).
pub const RMSNORM_BLOCK: u32 = 256;
/// Threads per block of `logprob_{fwd,bwd}_f32` (one block per row; a multiple of 32).
pub const LOGPROB_BLOCK: u32 = 512;
/// Warps per block of `decode_attention_*` (one block per (row, query head)).
pub const DECODE_WARPS: u32 = 4;
/// The largest head size `decode_attention_*` keeps accumulators for (each lane D / 32).
pub const DECODE_MAX_HEAD_DIM: usize = 256;
/// Warps per block of `flash_*` (one warp per query or key row; head sizes up to
/// `DECODE_MAX_HEAD_DIM`).
pub const FLASH_WARPS: u32 = 4;
/// Warps per block of the tensor-core `flash_tc_*` kernels: each owns 16 rows (query rows in
/// the forward and dQ, key rows in dK/dV), so a block covers 16 x FLASH_TC_WARPS rows.
pub const FLASH_TC_WARPS: u32 = 4;
/// Keys per inner tile of `flash_tc_fwd_*` and `flash_tc_bwd_dq_*` (a multiple of 16).
pub const FLASH_TC_KEYS: u32 = 32;

/// The `-D` macros build.rs gives nvcc; kernels/common.cuh refuses to compile without each.
pub fn nvcc_defines() -> Vec<(&'static str, u64)> {
    vec![
        ("TERSE_RMSNORM_BLOCK", u64::from(RMSNORM_BLOCK)),
        ("TERSE_LOGPROB_BLOCK", u64::from(LOGPROB_BLOCK)),
        ("TERSE_DECODE_WARPS", u64::from(DECODE_WARPS)),
        ("TERSE_DECODE_MAX_HEAD_DIM", DECODE_MAX_HEAD_DIM as u64),
        ("TERSE_FLASH_WARPS", u64::from(FLASH_WARPS)),
        ("TERSE_FLASH_TC_WARPS", u64::from(FLASH_TC_WARPS)),
        ("TERSE_FLASH_TC_KEYS", u64::from(FLASH_TC_KEYS)),
    ]
}

/// RMSNorm: x (.., C) and w (C). Returns (rows, cols).
pub fn rmsnorm(x: &[usize], w: &[usize]) -> Result<(usize, usize)> {
    let cols = x.last().copied().unwrap_or(0);
    if w.len() != 1 || w[0] != cols || cols == 0 {
        crate::fail!("rmsnorm: weight {w:?} does not match the last dim of x {x:?}");
    }
    Ok((x.iter().product::<usize>() / cols, cols))
}

/// RoPE: x (B, H, T, D) with D even, cos and sin (B, T, D/2).
pub fn rope(x: &[usize], cos: &[usize], sin: &[usize]) -> Result<[usize; 4]> {
    let &[b, h, t, d] = x else {
        crate::fail!("rope: x must be (B, H, T, D), got {x:?}");
    };
    if d % 2 != 0 {
        crate::fail!("rope: head size {d} is odd (x {x:?}); rotate-half needs an even size");
    }
    let want = [b, t, d / 2];
    if cos != want || sin != want {
        crate::fail!(
            "rope: cos {cos:?} and sin {sin:?} must be (B, T, D/2) = {want:?} for x {x:?}"
        );
    }
    Ok([b, h, t, d])
}

/// The log-prob epilogue: logits (N, V), targets (N) with every target < V. Returns (N, V).
pub fn logprob(logits: &[usize], targets: &[usize], values: &[u32]) -> Result<(usize, usize)> {
    let &[n, v] = logits else {
        crate::fail!("logprob: logits must be (N, V), got {logits:?}");
    };
    if targets != [n] {
        crate::fail!("logprob: targets {targets:?} must be ({n}) for logits {logits:?}");
    }
    if let Some((i, t)) = values.iter().enumerate().find(|(_, t)| **t as usize >= v) {
        crate::fail!(
            "logprob: target {t} at row {i} is outside the vocabulary of {v} (logits {logits:?})"
        );
    }
    Ok((n, v))
}

/// The log-prob gradient: logits (N, V), targets (N), lse_g (N, 2).
pub fn logprob_grad(
    logits: &[usize],
    targets: &[usize],
    values: &[u32],
    lse_g: &[usize],
) -> Result<(usize, usize)> {
    let (n, v) = logprob(logits, targets, values)?;
    if lse_g != [n, 2] {
        crate::fail!("logprob grad: lse_g {lse_g:?} must be ({n}, 2) for logits {logits:?}");
    }
    Ok((n, v))
}

/// A KV-cache write: cache (B, Hkv, C, D), src (B, Hkv, D), slot < C.
pub fn kv_write(cache: &[usize], src: &[usize], slot: usize) -> Result<[usize; 4]> {
    let &[b, hkv, cap, d] = cache else {
        crate::fail!("kv write: the cache must be (B, Hkv, C, D), got {cache:?}");
    };
    if src != [b, hkv, d] || slot >= cap {
        crate::fail!("kv write: slot {slot} / src {src:?} do not fit cache {cache:?}");
    }
    Ok([b, hkv, cap, d])
}

/// The block tables of a paged decode step: each row's blocks (padded to `maxb` per row),
/// slots attended (`lens`, its new token included) and where its new token goes (`slots`), all
/// inside a pool of `nb` blocks of `bs` slots; every value fits an i32 (the kernels' type).
pub fn paged_tables(
    tables: &[u32],
    maxb: usize,
    lens: &[u32],
    slots: &[u32],
    [nb, bs]: [usize; 2],
) -> Result<()> {
    let b = lens.len();
    if tables.len() != b * maxb || slots.len() != b || nb * bs > i32::MAX as usize {
        crate::fail!(
            "paged tables: {} table entries, {} slots for {b} rows of {maxb} blocks (pool {nb} x {bs})",
            tables.len(),
            slots.len()
        );
    }
    if let Some(t) = tables.iter().find(|&&t| t as usize >= nb) {
        crate::fail!("paged tables: block {t} outside a pool of {nb} blocks");
    }
    for (r, (&len, &slot)) in lens.iter().zip(slots).enumerate() {
        let row = &tables[r * maxb..(r + 1) * maxb];
        let (len, slot) = (len as usize, slot as usize);
        if len == 0
            || len > maxb * bs
            || slot / bs >= nb
            || row[(len - 1) / bs] as usize != slot / bs
            || slot % bs != (len - 1) % bs
        {
            crate::fail!("paged tables: row {r} attends {len} slots and writes slot {slot}, which its table does not hold");
        }
    }
    Ok(())
}

/// Paged decode attention's shapes: q (B, Hq, D), pools (NB, Hkv, BS, D) alike, Hq a multiple of
/// Hkv, D even and at most [`DECODE_MAX_HEAD_DIM`], B rows of tables -> [B, Hq, Hkv, NB, BS, D].
pub fn paged_decode_attention(
    q: &[usize],
    k: &[usize],
    v: &[usize],
    rows: usize,
) -> Result<[usize; 6]> {
    let (&[b, hq, d], &[nb, hkv, bs, kd]) = (q, k) else {
        crate::fail!(
            "paged attention: q must be (B, Hq, D) and the pools (NB, Hkv, BS, D), got {q:?} and {k:?}"
        );
    };
    if k != v || kd != d || hkv == 0 || hq % hkv != 0 || b != rows {
        crate::fail!(
            "paged attention: q {q:?} does not fit the pools {k:?} / {v:?} and {rows} table rows"
        );
    }
    if d % 2 != 0 || d > DECODE_MAX_HEAD_DIM {
        crate::fail!(
            "paged attention: head size {d} must be even and at most {DECODE_MAX_HEAD_DIM}"
        );
    }
    Ok([b, hq, hkv, nb, bs, d])
}

/// A paged KV write: pool (NB, Hkv, BS, D), src (B, Hkv, D) -> [B, Hkv, NB, BS, D].
pub fn paged_kv_write(pool: &[usize], src: &[usize]) -> Result<[usize; 5]> {
    let (&[nb, hkv, bs, d], &[b, sh, sd]) = (pool, src) else {
        crate::fail!("paged kv write: pool must be (NB, Hkv, BS, D) and src (B, Hkv, D), got {pool:?} and {src:?}");
    };
    if sh != hkv || sd != d {
        crate::fail!("paged kv write: src {src:?} does not fit the pool {pool:?}");
    }
    Ok([b, hkv, nb, bs, d])
}

/// Decode attention: q (B, Hq, D), k and v (B, Hkv, C, D) with Hq a multiple of Hkv, D even and
/// at most [`DECODE_MAX_HEAD_DIM`], `len` ≤ C slots attended, one validity flag per (row, slot).
pub fn decode_attention(
    q: &[usize],
    k: &[usize],
    v: &[usize],
    valid: usize,
    len: usize,
) -> Result<[usize; 5]> {
    let (&[b, hq, d], &[kb, hkv, cap, kd]) = (q, k) else {
        crate::fail!(
            "decode attention: q must be (B, Hq, D) and k (B, Hkv, C, D), got {q:?} and {k:?}"
        );
    };
    if k != v {
        crate::fail!("decode attention: k {k:?} and v {v:?} differ");
    }
    if kb != b || kd != d || hkv == 0 || hq % hkv != 0 {
        crate::fail!(
            "decode attention: q {q:?} does not fit the cache {k:?} (rows, heads or head size)"
        );
    }
    if d % 2 != 0 || d > DECODE_MAX_HEAD_DIM {
        crate::fail!(
            "decode attention: head size {d} must be even and at most {DECODE_MAX_HEAD_DIM}"
        );
    }
    if len > cap || valid != b * cap {
        crate::fail!("decode attention: len {len} over a capacity of {cap}, or {valid} validity flags for {b} x {cap}");
    }
    Ok([b, hq, hkv, cap, d])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        let e = r.expect_err("must be refused").to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    }

    #[test]
    fn bad_shapes_are_refused_with_the_op_and_the_shapes() {
        assert_eq!(rmsnorm(&[2, 3, 8], &[8]).expect("ok"), (6, 8));
        assert!(err(rmsnorm(&[2, 8], &[7])).contains("rmsnorm: weight [7]"));
        assert_eq!(
            rope(&[2, 4, 5, 8], &[2, 5, 4], &[2, 5, 4]).expect("ok"),
            [2, 4, 5, 8]
        );
        // A (T, D/2) table would be read out of bounds for b > 0.
        assert!(err(rope(&[2, 4, 5, 8], &[5, 4], &[5, 4])).contains("must be (B, T, D/2)"));
        assert!(err(rope(&[1, 1, 1, 7], &[1, 1, 3], &[1, 1, 3])).contains("odd"));
        assert!(logprob(&[3, 10], &[3], &[0, 9, 4]).is_ok());
        assert!(err(logprob(&[3, 10], &[3], &[0, 10, 4])).contains("target 10 at row 1"));
        assert!(err(logprob(&[3, 10], &[2], &[0, 1])).contains("targets [2]"));
        assert!(err(logprob_grad(&[3, 10], &[3], &[0, 1, 2], &[3, 3])).contains("lse_g"));
        assert!(err(kv_write(&[2, 1, 4, 8], &[2, 1, 8], 4)).contains("slot 4"));
        assert!(kv_write(&[2, 1, 4, 8], &[2, 1, 8], 3).is_ok());
        let ok = decode_attention(&[2, 4, 8], &[2, 2, 6, 8], &[2, 2, 6, 8], 12, 6);
        assert_eq!(ok.expect("ok"), [2, 4, 2, 6, 8]);
        assert!(err(decode_attention(
            &[2, 4, 8],
            &[2, 2, 6, 8],
            &[2, 2, 6, 8],
            12,
            7
        ))
        .contains("len 7"));
        assert!(err(decode_attention(
            &[2, 4, 16],
            &[2, 2, 6, 8],
            &[2, 2, 6, 8],
            12,
            6
        ))
        .contains("does not fit"));
        assert!(err(decode_attention(
            &[2, 4, 8],
            &[2, 2, 6, 8],
            &[2, 2, 5, 8],
            12,
            5
        ))
        .contains("differ"));
        assert!(err(decode_attention(
            &[1, 2, 7],
            &[1, 1, 4, 7],
            &[1, 1, 4, 7],
            4,
            4
        ))
        .contains("even"));
        assert!(err(decode_attention(
            &[1, 2, 512],
            &[1, 1, 4, 512],
            &[1, 1, 4, 512],
            4,
            4
        ))
        .contains("at most 256"));
    }

    /// The geometry the kernels are compiled for comes from here: every macro kernels/common.cuh
    /// requires is one build.rs passes, and no kernel hard-codes a block size of its own.
    #[test]
    fn kernel_block_sizes_come_from_one_place() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let common = std::fs::read_to_string(dir.join("common.cuh")).expect("common.cuh");
        let defined: Vec<&str> = nvcc_defines().iter().map(|(k, _)| *k).collect();
        let required: Vec<&str> = common
            .lines()
            .filter_map(|l| l.trim().strip_prefix("#ifndef TERSE_"))
            .map(|rest| rest.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(
            required.len(),
            defined.len(),
            "common.cuh requires {required:?}"
        );
        for r in &required {
            assert!(
                defined.contains(&format!("TERSE_{r}").as_str()),
                "{r} not passed to nvcc"
            );
        }
        for (k, v) in nvcc_defines() {
            assert!(
                v > 0 && (k.ends_with("DIM") || v % 32 == 0 || k.ends_with("WARPS")),
                "{k} = {v}"
            );
        }
        for f in [
            "rmsnorm.cu",
            "logprob.cu",
            "kv_cache.cu",
            "flash_attn.cu",
            "paged_attention.cu",
        ] {
            let src = std::fs::read_to_string(dir.join(f)).expect("kernel");
            for l in src
                .lines()
                .filter(|l| l.trim_start().starts_with("#define"))
            {
                let value = l.split_whitespace().nth(2).unwrap_or("");
                assert!(
                    value.parse::<u64>().is_err(),
                    "{f}: `{l}` hard-codes a launch constant; take it from common.cuh"
                );
            }
        }
    }
}
