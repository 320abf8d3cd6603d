//! gpu-check's parity groups for the paged cache's decode ops (`kernels::paged_kv_write`,
//! `kernels::paged_decode_attention`): K/V written token
//! by token into blocks scattered over the pool (four sequences growing in turn, so their
//! blocks interleave), then one decode attention over the block tables, on the device against
//! the CPU reference, in f32 and in bf16. Part of `parity::groups`.

use super::common::{bf16_round, bf16_tolerance, rnd, row, Row};
use crate::kernels::{paged_decode_attention, paged_kv_write, PagedMeta};
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

pub(crate) fn paged_f32(dev: &Device) -> Result<Vec<Row>> {
    let (g, c) = (
        paged_attention(dev, DType::F32, false)?,
        paged_attention(&Device::Cpu, DType::F32, false)?,
    );
    Ok(vec![row(
        "paged kv write + decode attention",
        &g,
        &c,
        1e-4,
    )?])
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
    Ok(vec![row(
        "bf16 paged kv write + decode attention",
        &g,
        &c,
        bf16_tolerance(&c)?,
    )?])
}
