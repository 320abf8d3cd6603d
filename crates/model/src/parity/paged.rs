//! gpu-check's parity groups for the paged cache's decode ops (`kernels::paged_kv_write`,
//! `kernels::paged_decode_attention`, `kernels::paged_qkv`): a step's fused query, key and value
//! against the reference, then K/V written token
//! by token into blocks scattered over the pool (four sequences growing in turn, so their
//! blocks interleave), then one decode attention over the block tables, on the device against
//! the CPU reference, in f32 and in bf16; then rows of 1 to 8,300 slots in one batch (up to
//! flash-decoding's 32 splits) through the split kernels and through today's one-block-per-head
//! kernel (`TERSE_FLASH_DECODING=0`), and each row alone against the same row in the batch, bit
//! for bit. Part of `parity::groups`.

use super::common::{bf16_round, bf16_tolerance, rnd, row, Row};
use crate::kernels::paged_split::{reset_flash_decoding, set_flash_decoding};
use crate::kernels::{paged_decode_attention, paged_kv_write, paged_qkv, PagedMeta};
use crate::paged::{BlockTable, PagedKvCache};
use candle_core::{DType, Device, Result, Tensor};

/// B 4 sequences of 37, 64, 150 and 200 tokens, Hq 16, Hkv 8, D 128, 16-token blocks.
fn paged_attention(dev: &Device, dt: DType, round: bool) -> Result<Tensor> {
    let (hq, hkv, d, bs) = (16, 8, 128, 16);
    let lens = [37usize, 64, 150, 200];
    let prep = |t: Tensor| -> Result<Tensor> {
        let t = if round { bf16_round(&t)? } else { t };
        t.to_device(dev)?.to_dtype(dt)
    };
    let mut cache = PagedKvCache::new(1, hkv, d, bs, 64, dt, dev)?;
    let mut tables: Vec<BlockTable> = lens.iter().map(|_| BlockTable::default()).collect();
    let (pk, pv) = {
        let (k, v) = cache.layer(0);
        (k.clone(), v.clone())
    };
    for step in 0..*lens.iter().max().unwrap_or(&0) - 1 {
        let live: Vec<usize> = (0..lens.len()).filter(|&r| step < lens[r] - 1).collect();
        for &r in &live {
            if !cache.reserve(&mut tables[r], 1)? {
                crate::fail!("parity: pool too small");
            }
        }
        let refs: Vec<(&BlockTable, usize)> =
            live.iter().map(|&r| (&tables[r], tables[r].len)).collect();
        let meta = PagedMeta::new(&cache, &refs, dev)?;
        let n = live.len();
        paged_kv_write(&pk, &prep(rnd(&[n, hkv, d], 10 + step as u64)?)?, &meta)?;
        paged_kv_write(&pv, &prep(rnd(&[n, hkv, d], 900 + step as u64)?)?, &meta)?;
        for &r in &live {
            tables[r].len += 1;
        }
    }
    // The last token of each sequence is written and attended in the same step.
    for t in &mut tables {
        if !cache.reserve(t, 1)? {
            crate::fail!("parity: pool too small");
        }
    }
    let refs: Vec<(&BlockTable, usize)> = tables.iter().map(|t| (t, t.len)).collect();
    let meta = std::sync::Arc::new(PagedMeta::new(&cache, &refs, dev)?);
    paged_kv_write(&pk, &prep(rnd(&[4, hkv, d], 5000)?)?, &meta)?;
    paged_kv_write(&pv, &prep(rnd(&[4, hkv, d], 6000)?)?, &meta)?;
    paged_decode_attention(&prep(rnd(&[4, hq, d], 7)?)?, &pk, &pv, &meta)
}

/// Context lengths of the long step: one slot, one split exactly, one past it, several splits,
/// and more than 32 · 256 (the split count capped, longer splits).
const LONG: [usize; 5] = [1, 256, 257, 1500, 8300];

/// Slots per block of the long step's pool.
const LONG_BS: usize = 16;

/// Decode attention of rows `LONG[rows]` over pools of random K/V, each row's blocks scattered
/// over the pool (ids by a fixed permutation) -> (rows, Hq, D).
fn long_step(dev: &Device, dt: DType, round: bool, rows: std::ops::Range<usize>) -> Result<Tensor> {
    let (hq, hkv, d, bs) = (16, 8, 128, LONG_BS);
    let prep = |t: Tensor| -> Result<Tensor> {
        let t = if round { bf16_round(&t)? } else { t };
        t.to_device(dev)?.to_dtype(dt)
    };
    let used: Vec<usize> = LONG.iter().map(|l| l.div_ceil(bs)).collect();
    let nb = used.iter().sum::<usize>() + 1;
    let maxb = used.iter().copied().max().unwrap_or(1);
    let mut ids = (0..nb).map(|i| ((i * 7919 + 3) % nb) as u32);
    let all: Vec<Vec<u32>> = used
        .iter()
        .map(|&u| ids.by_ref().take(u).collect())
        .collect();
    let (mut tables, mut lens, mut slots) = (vec![], vec![], vec![]);
    for r in rows.clone() {
        let len = LONG[r];
        tables.extend(&all[r]);
        tables.extend(std::iter::repeat_n(0, maxb - all[r].len()));
        lens.push(len as u32);
        slots.push(all[r][(len - 1) / bs] * bs as u32 + ((len - 1) % bs) as u32);
    }
    let meta = PagedMeta::from_tables(tables, maxb, lens, slots, [nb, bs], dev)?;
    let k = prep(rnd(&[nb, hkv, bs, d], 31)?)?;
    let v = prep(rnd(&[nb, hkv, bs, d], 32)?)?;
    let q = prep(rnd(&[LONG.len(), hq, d], 33)?)?.narrow(0, rows.start, rows.len())?;
    let q = q.contiguous()?;
    paged_decode_attention(&q, &k, &v, &std::sync::Arc::new(meta))
}

/// The long step's rows with flash-decoding on or off (the process's setting put back after),
/// and with it on, each row alone (the same values, a batch of one) concatenated.
fn long_attention(
    dev: &Device,
    dt: DType,
    round: bool,
    flash: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    set_flash_decoding(flash);
    let run = || -> Result<(Tensor, Option<Tensor>)> {
        let batch = long_step(dev, dt, round, 0..LONG.len())?;
        if !flash {
            return Ok((batch, None));
        }
        let alone = (0..LONG.len())
            .map(|r| long_step(dev, dt, round, r..r + 1))
            .collect::<Result<Vec<_>>>()?;
        Ok((batch, Some(Tensor::cat(&alone, 0)?)))
    };
    let out = run();
    reset_flash_decoding();
    out
}

/// The long step's rows: each path against the CPU reference (1e-4, or bf16's tolerance on
/// rounded inputs), and flash-decoding's rows alone against the batch, exactly.
fn long_rows(dev: &Device, dt: DType, round: bool, what: &str) -> Result<Vec<Row>> {
    let c = long_step(&Device::Cpu, DType::F32, round, 0..LONG.len())?;
    let tol = if round { bf16_tolerance(&c)? } else { 1e-4 };
    let (flash, alone) = long_attention(dev, dt, round, true)?;
    let (today, _) = long_attention(dev, dt, round, false)?;
    let Some(alone) = alone else {
        crate::fail!("parity: flash-decoding's rows alone were not run");
    };
    Ok(vec![
        row(
            &format!("{what}paged flash-decoding, rows of 1 to 8300 slots"),
            &flash,
            &c,
            tol,
        )?,
        row(
            &format!("{what}paged one block per head, rows of 1 to 8300 slots"),
            &today,
            &c,
            tol,
        )?,
        row(
            &format!("{what}paged flash-decoding, each row alone = in the batch"),
            &alone,
            &flash,
            0.0,
        )?,
    ])
}

/// A decode step's fused query, key and value (`kernels::paged_qkv`) at Qwen3-0.6B's head layout
/// (Hq 16, Hkv 8, D 128, q_norm and k_norm), 5 rows writing scattered slots -> [q; the key pool;
/// the value pool], flat.
fn paged_qkv_step(dev: &Device, dt: DType, round: bool) -> Result<Tensor> {
    let (n, hq, hkv, d, bs, nb) = (5usize, 16, 8, 128, 16, 8);
    let prep = |t: Tensor| -> Result<Tensor> {
        let t = if round { bf16_round(&t)? } else { t };
        t.to_device(dev)?.to_dtype(dt)
    };
    // Row r attends len[r] slots of its one block tables[r] and writes the last.
    let (tables, lens) = (vec![7u32, 2, 5, 0, 3], vec![1u32, 16, 9, 4, 12]);
    let slots = tables
        .iter()
        .zip(&lens)
        .map(|(&t, &l)| t * bs as u32 + l - 1);
    let meta = PagedMeta::from_tables(
        tables.clone(),
        1,
        lens.clone(),
        slots.collect(),
        [nb, bs],
        dev,
    )?;
    let pos = Tensor::from_vec(vec![0u32, 15, 1000, 3, 40_000], (n, 1), &Device::Cpu)?;
    let (cos, sin) = crate::ops::rope_tables(&pos, d, 1e6, DType::F32)?; // (N, 1, D/2)
    let (cos, sin) = (prep(cos)?, prep(sin)?);
    let w = |seed| -> Result<Tensor> { prep(rnd(&[d], seed)?.affine(0.5, 1.0)?) };
    let (qn, kn) = (w(41)?, w(42)?);
    let (kpool, vpool) = (
        prep(rnd(&[nb, hkv, bs, d], 43)?)?,
        prep(rnd(&[nb, hkv, bs, d], 46)?)?,
    );
    let qkv = prep(rnd(&[n, (hq + 2 * hkv) * d], 44)?.affine(2.0, 0.0)?)?; // (N, (Hq + 2 Hkv) D)
    let tables = (&cos, &sin);
    let out = paged_qkv(
        &qkv,
        Some((&qn, &kn)),
        1e-6,
        tables,
        (&kpool, &vpool),
        &meta,
    )?;
    let flat = |t: &Tensor| {
        t.to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()
    };
    Tensor::cat(&[flat(&out)?, flat(&kpool)?, flat(&vpool)?], 0)
}

pub(crate) fn paged_f32(dev: &Device) -> Result<Vec<Row>> {
    let (g, c) = (
        paged_attention(dev, DType::F32, false)?,
        paged_attention(&Device::Cpu, DType::F32, false)?,
    );
    let mut rows = vec![row("paged kv write + decode attention", &g, &c, 1e-4)?];
    let (qg, qc) = (
        paged_qkv_step(dev, DType::F32, false)?,
        paged_qkv_step(&Device::Cpu, DType::F32, false)?,
    );
    rows.push(row(
        "paged qkv: norm + rope + cache writes [q; pools]",
        &qg,
        &qc,
        1e-5,
    )?);
    rows.extend(long_rows(dev, DType::F32, false, "")?);
    Ok(rows)
}

/// `paged_*_bf16` against the f32 reference on bf16-rounded inputs.
pub(crate) fn paged_bf16(dev: &Device) -> Result<Vec<Row>> {
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let c = paged_attention(&Device::Cpu, DType::F32, true)?;
    let g = paged_attention(dev, dt, true)?;
    let mut rows = vec![row(
        "bf16 paged kv write + decode attention",
        &g,
        &c,
        bf16_tolerance(&c)?,
    )?];
    let (qg, qc) = (
        paged_qkv_step(dev, dt, true)?,
        paged_qkv_step(&Device::Cpu, DType::F32, true)?,
    );
    // Three bf16 roundings on the device (the norm's two, as HF rounds, and the rotation's),
    // where the f32 reference rounds none: twice the one-rounding tolerance.
    rows.push(row(
        "bf16 paged qkv: norm + rope + cache writes [q; pools]",
        &qg,
        &qc,
        2.0 * bf16_tolerance(&qc)?,
    )?);
    rows.extend(long_rows(dev, dt, true, "bf16 ")?);
    Ok(rows)
}
