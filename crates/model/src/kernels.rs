//! CPU references of the CUDA kernels in kernels/*.cu, one function per kernel entry point,
//! written as plain loops in f32 with the kernels' layouts and accumulation order in mind. They
//! are the ground truth the GPU parity check (`cargo xtask gpu-check`) compares against, and
//! they are tested here against the composite candle ops the model's training path uses.

/// RMSNorm forward over rows of `cols`: y = w * x * rstd with rstd = 1/sqrt(mean(x²) + eps);
/// returns (y, rstd per row). kernels/rmsnorm.cu `rmsnorm_fwd_*`.
pub fn rmsnorm_fwd(x: &[f32], w: &[f32], cols: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
    let mut y = vec![0f32; x.len()];
    let mut rstd = vec![0f32; x.len() / cols];
    for (r, (xr, yr)) in x.chunks(cols).zip(y.chunks_mut(cols)).enumerate() {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let s = 1.0 / (ss / cols as f32 + eps).sqrt();
        rstd[r] = s;
        for ((yv, xv), wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = xv * s * wv;
        }
    }
    (y, rstd)
}

/// RMSNorm backward: dx = r·(dy⊙w) − x·r³/cols·Σ(dy⊙w⊙x) per row, dw = Σ_rows dy⊙x·r.
/// kernels/rmsnorm.cu `rmsnorm_bwd_*`.
pub fn rmsnorm_bwd(
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    dy: &[f32],
    cols: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut dx = vec![0f32; x.len()];
    let mut dw = vec![0f32; cols];
    for (r, ((xr, gr), dxr)) in x
        .chunks(cols)
        .zip(dy.chunks(cols))
        .zip(dx.chunks_mut(cols))
        .enumerate()
    {
        let s = rstd[r];
        let dot: f32 = (0..cols).map(|i| gr[i] * w[i] * xr[i]).sum();
        let c = dot * s * s * s / cols as f32;
        for i in 0..cols {
            dxr[i] = s * gr[i] * w[i] - xr[i] * c;
            dw[i] += gr[i] * xr[i] * s;
        }
    }
    (dx, dw)
}

/// Rotate-half RoPE on x (B, H, T, D) with half tables cos/sin (B, T, D/2); `inverse` applies
/// the transposed rotation (the backward: dy -> dx). kernels/rope.cu `rope_fwd_*`/`rope_bwd_*`.
pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], dims: [usize; 4], inverse: bool) -> Vec<f32> {
    let [b, heads, t, d] = dims;
    let h = d / 2;
    let sign = if inverse { -1.0 } else { 1.0 };
    let mut y = vec![0f32; x.len()];
    for bi in 0..b {
        for hi in 0..heads {
            for ti in 0..t {
                let base = ((bi * heads + hi) * t + ti) * d;
                for i in 0..h {
                    let tab = (bi * t + ti) * h + i;
                    let (c, s) = (cos[tab], sign * sin[tab]);
                    let (x1, x2) = (x[base + i], x[base + i + h]);
                    y[base + i] = x1 * c - x2 * s;
                    y[base + i + h] = x2 * c + x1 * s;
                }
            }
        }
    }
    y
}

/// The log-prob epilogue over logits (n, V): (log p(target), log Z, entropy) per row.
/// kernels/logprob.cu `logprob_fwd_f32`.
pub fn logprob_fwd(logits: &[f32], targets: &[u32], v: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = targets.len();
    let (mut logp, mut lse, mut ent) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    for (r, row) in logits.chunks(v).enumerate() {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (s, t) = row.iter().fold((0f32, 0f32), |(s, t), &x| {
            let e = (x - m).exp();
            (s + e, t + e * x)
        });
        let z = m + s.ln();
        lse[r] = z;
        logp[r] = row[targets[r] as usize] - z;
        ent[r] = z - t / s;
    }
    (logp, lse, ent)
}

/// The epilogue's backward: g · (onehot(target) − softmax) per row (the kernel writes it over
/// the logits). kernels/logprob.cu `logprob_bwd_f32`.
pub fn logprob_bwd(logits: &[f32], targets: &[u32], lse: &[f32], g: &[f32], v: usize) -> Vec<f32> {
    let mut out = vec![0f32; logits.len()];
    for (r, (row, o)) in logits.chunks(v).zip(out.chunks_mut(v)).enumerate() {
        for (i, (x, y)) in row.iter().zip(o.iter_mut()).enumerate() {
            let onehot = if i == targets[r] as usize { 1.0 } else { 0.0 };
            *y = g[r] * (onehot - (x - lse[r]).exp());
        }
    }
    out
}

/// Writes new (B, Hkv, D) into slot `slot` of a (B, Hkv, C, D) cache. kernels/kv_cache.cu
/// `kv_write_*`.
pub fn kv_write(src: &[f32], cache: &mut [f32], dims: [usize; 3], cap: usize, slot: usize) {
    let [b, hkv, d] = dims;
    for bh in 0..b * hkv {
        cache[(bh * cap + slot) * d..(bh * cap + slot + 1) * d]
            .copy_from_slice(&src[bh * d..(bh + 1) * d]);
    }
}

/// Writes new (B, Hkv, D) into a paged pool (NB, Hkv, BS, D): row b's token at slot
/// `slots[b]` (block id · BS + offset). kernels/paged_attention.cu `paged_kv_write_*`.
pub fn paged_kv_write(
    src: &[f32],
    pool: &mut [f32],
    slots: &[u32],
    hkv: usize,
    bs: usize,
    d: usize,
) {
    for (b, &slot) in slots.iter().enumerate() {
        let (blk, off) = (slot as usize / bs, slot as usize % bs);
        for h in 0..hkv {
            let at = ((blk * hkv + h) * bs + off) * d;
            pool[at..at + d].copy_from_slice(&src[(b * hkv + h) * d..][..d]);
        }
    }
}

/// Single-query attention of q (B, Hq, D) over the first `lens[b]` slots of row b's blocks
/// (`tables`, `maxb` per row) in paged pools (NB, Hkv, BS, D) -> (B, Hq, D).
/// kernels/paged_attention.cu `paged_decode_attention_*`.
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    tables: &[u32],
    maxb: usize,
    lens: &[u32],
    [hq, hkv, bs, d]: [usize; 4],
) -> Vec<f32> {
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    for (bi, &len) in lens.iter().enumerate() {
        for h in 0..hq {
            let g = h / (hq / hkv);
            let qr = &q[(bi * hq + h) * d..][..d];
            let at = |t: usize| ((tables[bi * maxb + t / bs] as usize * hkv + g) * bs + t % bs) * d;
            let scores: Vec<f32> = (0..len as usize)
                .map(|t| {
                    qr.iter()
                        .zip(&k[at(t)..at(t) + d])
                        .map(|(a, b)| a * scale * b)
                        .sum()
                })
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = scores.iter().map(|s| (s - m).exp()).sum();
            let o = &mut out[(bi * hq + h) * d..][..d];
            for (t, &s) in scores.iter().enumerate() {
                let p = (s - m).exp() / z;
                for (oi, vi) in o.iter_mut().zip(&v[at(t)..at(t) + d]) {
                    *oi += p * vi;
                }
            }
        }
    }
    out
}

/// Single-query attention over the first `len` slots of a (B, Hkv, C, D) cache, skipping slots
/// whose `valid` (B, C) flag is 0; q (B, Hq, D) -> (B, Hq, D); a row with no valid slot gives 0.
/// kernels/kv_cache.cu `decode_attention_*`.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    valid: &[u8],
    heads: [usize; 2],
    cap: usize,
    len: usize,
    d: usize,
) -> Vec<f32> {
    let [hq, hkv] = heads;
    let b = q.len() / (hq * d);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    for bi in 0..b {
        for h in 0..hq {
            let g = h / (hq / hkv);
            let qr = &q[(bi * hq + h) * d..(bi * hq + h + 1) * d];
            let slot = |t: usize| ((bi * hkv + g) * cap + t) * d;
            let scores: Vec<(usize, f32)> = (0..len)
                .filter(|&t| valid[bi * cap + t] != 0)
                .map(|t| {
                    let kr = &k[slot(t)..slot(t) + d];
                    (t, qr.iter().zip(kr).map(|(a, b)| a * scale * b).sum())
                })
                .collect();
            let m = scores.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = scores.iter().map(|s| (s.1 - m).exp()).sum();
            let o = &mut out[(bi * hq + h) * d..(bi * hq + h + 1) * d];
            for &(t, s) in &scores {
                let p = (s - m).exp() / z;
                for (oi, vi) in o.iter_mut().zip(&v[slot(t)..slot(t) + d]) {
                    *oi += p * vi;
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
