//! A decode step's draws, all at once: every ready row's logits gathered where they are (on a
//! GPU they never leave it), one uniform per row from the row's own stream (drawn by the
//! scheduler), and one `terse_model::sample::sample_rows` call: 8 bytes a row up, 16 down.
//! `TERSE_HOST_SAMPLER=1` keeps the old path on a GPU for comparison: the logits copied to the
//! host and sampled there row by row. Both give a row the same token (ties aside, see
//! kernels/sample.cu), and on the CPU the two are one path.
//!
//! Data flow: scheduler.rs `forward` -> `RowLogits` per sequence -> `draw` in `sample_ready`.

use crate::sampling::Drawn;
use candle_core::{Device, Result, Tensor};
use std::rc::Rc;
use terse_model::sample::{reference, sample_rows, Warpers};

/// A row of logits: row `row` of a step's (B, V) output, which that step's sequences share.
#[derive(Clone)]
pub(crate) struct RowLogits {
    src: Rc<Tensor>,
    row: usize,
}

impl RowLogits {
    /// Each row of a step's logits (B, V).
    pub(crate) fn of_step(logits: Tensor) -> Vec<RowLogits> {
        let src = Rc::new(logits);
        (0..src.dims()[0])
            .map(|row| RowLogits {
                src: src.clone(),
                row,
            })
            .collect()
    }

    /// The row in a tensor of its own (1, V): what a prompt's cached prefix keeps, so that a
    /// long-lived prefix holds one row, not its whole step's logits.
    pub(crate) fn own(&self) -> Result<RowLogits> {
        Ok(RowLogits {
            // force_contiguous: `copy` would clone the whole (B, V) storage behind the view.
            src: Rc::new(self.src.narrow(0, self.row, 1)?.force_contiguous()?), // (1, V)
            row: 0,
        })
    }
}

/// Whether the host samples (the pre-device-sampler path; `TERSE_HOST_SAMPLER=1`).
pub(crate) fn host_sampler() -> bool {
    std::env::var("TERSE_HOST_SAMPLER").is_ok_and(|v| v == "1")
}

/// One token per row, row i drawn with `us[i]`.
pub(crate) fn draw(rows: &[RowLogits], us: &[f64], w: &Warpers, host: bool) -> Result<Vec<Drawn>> {
    if rows.is_empty() {
        return Ok(vec![]);
    }
    let logits = gather(rows)?; // (R, V)
    if host && !logits.device().is_cpu() {
        let host = logits.to_device(&Device::Cpu)?.to_vec2::<f32>()?;
        return Ok(host
            .iter()
            .zip(us)
            .map(|(x, &u)| reference::sample_row(x, w, u))
            .collect());
    }
    sample_rows(&logits, us, w)
}

/// The rows as one (R, V) tensor in order: a step's own logits as they are when every row of it
/// is drawn in order (the usual decode step), else one index_select per source, concatenated.
fn gather(rows: &[RowLogits]) -> Result<Tensor> {
    let mut parts: Vec<Tensor> = vec![];
    let mut at = 0;
    while at < rows.len() {
        let src = &rows[at].src;
        let run = rows[at..]
            .iter()
            .take_while(|r| Rc::ptr_eq(&r.src, src))
            .count();
        let ids: Vec<u32> = rows[at..at + run].iter().map(|r| r.row as u32).collect();
        let whole =
            ids.len() == src.dims()[0] && ids.iter().enumerate().all(|(i, &r)| i == r as usize);
        parts.push(if whole {
            (**src).clone()
        } else {
            src.index_select(&Tensor::new(ids, src.device())?, 0)? // (run, V)
        });
        at += run;
    }
    if parts.len() == 1 {
        Ok(parts.pop().expect("one part"))
    } else {
        Tensor::cat(&parts, 0) // (R, V)
    }
}
