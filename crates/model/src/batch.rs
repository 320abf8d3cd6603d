//! A padded batch of token rows as the model consumes it: ids, attention mask, per-row positions.
//!
//! Built by the trainer (prompt + completion rows, usually right-padded) and by rollout prefill
//! (prompts, left-padded). Positions restart at 0 on each row's first real token, as in
//! transformers (`cumsum(mask) - 1`, clamped at 0).

use candle_core::{Device, Result, Tensor};

/// Which side of a row padding goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    Left,
    Right,
}

/// Token ids (B, T) with the host-side mask the attention bias is built from.
#[derive(Debug, Clone)]
pub struct Batch {
    /// (B, T) u32.
    pub input_ids: Tensor,
    /// (B, T) u32, restarting at 0 on the first real token of each row.
    pub position_ids: Tensor,
    /// B*T entries, 1 = real token.
    pub mask: Vec<u8>,
    /// The ids on the host, B*T.
    pub ids: Vec<u32>,
    pub b: usize,
    pub t: usize,
    /// Packed sequences: one row holding sequences of these lengths one after another
    /// (positions restart at each; attention never crosses them). None for padded rows.
    pub segments: Option<Vec<usize>>,
}

impl Batch {
    /// From flat (B*T) ids and mask; positions are derived from the mask.
    pub fn new(ids: Vec<u32>, mask: Vec<u8>, b: usize, t: usize, device: &Device) -> Result<Self> {
        let mut pos = vec![0u32; b * t];
        for r in 0..b {
            let mut c = 0u32;
            for j in 0..t {
                c += u32::from(mask[r * t + j] != 0);
                pos[r * t + j] = c.saturating_sub(1);
            }
        }
        Self::with_positions(ids, mask, pos, b, t, device)
    }

    /// From flat ids, mask and explicit positions.
    pub fn with_positions(
        ids: Vec<u32>,
        mask: Vec<u8>,
        positions: Vec<u32>,
        b: usize,
        t: usize,
        device: &Device,
    ) -> Result<Self> {
        if ids.len() != b * t || mask.len() != b * t || positions.len() != b * t {
            crate::fail!(
                "batch of {b}x{t} needs {} ids, mask entries and positions",
                b * t
            );
        }
        Ok(Self {
            input_ids: Tensor::from_vec(ids.clone(), (b, t), device)?,
            ids,
            position_ids: Tensor::from_vec(positions, (b, t), device)?,
            mask,
            b,
            t,
            segments: None,
        })
    }

    /// Sequences packed into one row, no padding: positions restart at 0 on each sequence and
    /// the attention stays inside each (`segments`).
    pub fn packed(rows: &[Vec<u32>], device: &Device) -> Result<Self> {
        let ids: Vec<u32> = rows.iter().flatten().copied().collect();
        let positions: Vec<u32> = rows.iter().flat_map(|r| 0..r.len() as u32).collect();
        let t = ids.len();
        let mut batch = Self::with_positions(ids, vec![1; t], positions, 1, t, device)?;
        batch.segments = Some(rows.iter().map(Vec::len).collect());
        Ok(batch)
    }

    /// The flat index (r * T + t form) of sequence `seq`'s first token: row `seq` of a padded
    /// batch, or the sequence's offset in a packed row. Right padding assumed for rows.
    pub fn seq_start(&self, seq: usize) -> usize {
        match &self.segments {
            Some(lens) => lens[..seq].iter().sum(),
            None => seq * self.t,
        }
    }

    /// Pads rows of different lengths to the longest with `pad_id`.
    pub fn from_rows(
        rows: &[Vec<u32>],
        pad_id: u32,
        padding: Padding,
        device: &Device,
    ) -> Result<Self> {
        let b = rows.len();
        let t = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = vec![pad_id; b * t];
        let mut mask = vec![0u8; b * t];
        for (r, row) in rows.iter().enumerate() {
            let off = match padding {
                Padding::Left => t - row.len(),
                Padding::Right => 0,
            };
            ids[r * t + off..r * t + off + row.len()].copy_from_slice(row);
            mask[r * t + off..r * t + off + row.len()].fill(1);
        }
        Self::new(ids, mask, b, t, device)
    }

    /// The causal "may attend" table (B, T, T): query i sees real key j <= i.
    pub fn causal_allowed(&self) -> Vec<u8> {
        let (b, t) = (self.b, self.t);
        let mut a = vec![0u8; b * t * t];
        if let Some(lens) = &self.segments {
            // Block-diagonal: each packed sequence attends causally within itself.
            let mut at = 0;
            for &n in lens {
                for i in at..at + n {
                    a[i * t + at..=i * t + i].fill(1);
                }
                at += n;
            }
            return a;
        }
        for r in 0..b {
            for i in 0..t {
                for j in 0..=i {
                    a[(r * t + i) * t + j] = self.mask[r * t + j];
                }
            }
        }
        a
    }

    /// Flat row indices (r * T + t) and targets for every position whose next token is real:
    /// the selection `Qwen3::token_logprobs` takes to score a whole batch.
    pub fn next_token_selection(&self) -> (Vec<u32>, Vec<u32>) {
        let (mut rows, mut targets) = (vec![], vec![]);
        if let Some(lens) = &self.segments {
            let mut at = 0;
            for &n in lens {
                for i in at..(at + n).saturating_sub(1) {
                    rows.push(i as u32);
                    targets.push(self.ids[i + 1]);
                }
                at += n;
            }
            return (rows, targets);
        }
        for r in 0..self.b {
            for j in 0..self.t.saturating_sub(1) {
                let (i0, i1) = (r * self.t + j, r * self.t + j + 1);
                if self.mask[i0] != 0 && self.mask[i1] != 0 {
                    rows.push(i0 as u32);
                    targets.push(self.ids[i1]);
                }
            }
        }
        (rows, targets)
    }
}
