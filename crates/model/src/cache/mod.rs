//! The preallocated KV cache the rollout sampler decodes through.
//!
//! One (B, Hkv, capacity, hd) K and V tensor per layer, written in place slot by slot. All rows
//! advance through the same slot index; rows at different positions are expressed by per-row
//! position ids and a per-row validity mask (left padding, injected or finished rows), so one
//! decode step is one batched forward. `select_rows` copies rows (a prompt's prefill into its G
//! samples) or drops them (finished samples stop costing compute). Its forward, `forward_cached`,
//! is forward.rs.

mod forward;

use candle_core::{DType, Device, Result, Tensor};
pub(crate) use forward::DecodePath;

/// Per-layer K/V buffers plus which slots of each row hold real tokens. A cache belongs to the
/// weights it was filled with: after an optimizer step, make a new one (and a new
/// `DecodeWeights`).
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// (B * capacity), 1 = the slot holds a real token.
    valid: Vec<u8>,
    b: usize,
    capacity: usize,
    len: usize,
}

impl KvCache {
    pub fn new(
        layers: usize,
        b: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mk = || Tensor::zeros((b, kv_heads, capacity, head_dim), dtype, device);
        let k = (0..layers).map(|_| mk()).collect::<Result<_>>()?;
        let v = (0..layers).map(|_| mk()).collect::<Result<_>>()?;
        Ok(Self::from_parts(
            k,
            v,
            vec![0; b * capacity],
            b,
            capacity,
            0,
        ))
    }

    /// A cache over given K/V tensors ((B, Hkv, capacity, D) per layer) whose first `len`
    /// slots are filled, `valid` (B * capacity) marking real tokens.
    pub(crate) fn from_parts(
        k: Vec<Tensor>,
        v: Vec<Tensor>,
        valid: Vec<u8>,
        b: usize,
        capacity: usize,
        len: usize,
    ) -> Self {
        Self {
            k,
            v,
            valid,
            b,
            capacity,
            len,
        }
    }

    /// Slots used so far (the same for every row).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn rows(&self) -> usize {
        self.b
    }

    /// The dtype K and V are stored in.
    pub fn dtype(&self) -> DType {
        self.k.first().map_or(DType::F32, Tensor::dtype)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// (B * capacity) slot validity, 1 = a real token.
    pub(crate) fn valid(&self) -> &[u8] {
        &self.valid
    }

    pub(crate) fn layer(&self, l: usize) -> (&Tensor, &Tensor) {
        (&self.k[l], &self.v[l])
    }

    /// Reserves `s` new slots and records their validity (B * S flags, 1 = real token).
    pub(crate) fn append_slots(&mut self, valid: &[u8], b: usize, s: usize) -> Result<()> {
        if b != self.b || valid.len() != b * s {
            crate::fail!(
                "kv cache holds {} rows; got {b} rows with {} validity flags for {s} slots",
                self.b,
                valid.len()
            );
        }
        if self.len + s > self.capacity {
            crate::fail!(
                "kv cache capacity {} exceeded ({} used + {s} new)",
                self.capacity,
                self.len
            );
        }
        let (off, total) = (self.len, self.len + s);
        for r in 0..b {
            self.valid[r * self.capacity + off..r * self.capacity + total]
                .copy_from_slice(&valid[r * s..(r + 1) * s]);
        }
        self.len = total;
        Ok(())
    }

    /// The (B, S, len) "may attend" table of the last `s` slots' queries: real
    /// earlier-or-same slots only.
    pub(crate) fn allowed(&self, s: usize) -> Vec<u8> {
        let (total, off) = (self.len, self.len - s);
        let mut allowed = vec![0u8; self.b * s * total];
        for r in 0..self.b {
            for i in 0..s {
                for j in 0..=off + i {
                    allowed[(r * s + i) * total + j] = self.valid[r * self.capacity + j];
                }
            }
        }
        allowed
    }

    /// Keeps (and possibly repeats) the given rows, in that order: row i of the result is row
    /// `rows[i]` of this cache.
    pub fn select_rows(&self, rows: &[usize]) -> Result<Self> {
        if let Some(r) = rows.iter().find(|&&r| r >= self.b) {
            crate::fail!("row {r} out of range for a cache of {} rows", self.b);
        }
        let dev = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &dev)?;
        let mut valid = Vec::with_capacity(rows.len() * self.capacity);
        for &r in rows {
            valid.extend_from_slice(&self.valid[r * self.capacity..(r + 1) * self.capacity]);
        }
        Ok(Self {
            k: self
                .k
                .iter()
                .map(|t| t.index_select(&idx, 0))
                .collect::<Result<_>>()?,
            v: self
                .v
                .iter()
                .map(|t| t.index_select(&idx, 0))
                .collect::<Result<_>>()?,
            valid,
            b: rows.len(),
            capacity: self.capacity,
            len: self.len,
        })
    }
}
