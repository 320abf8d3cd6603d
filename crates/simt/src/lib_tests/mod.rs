//! The shim suite: every kernel entry point of kernels/*.cu, run on the CPU through the SIMT
//! shim from its launch description (terse_model::launch), against its CPU reference
//! (terse_model::testing::references) at gpu-check's parity tolerances
//! (crates/model/src/parity/): 1e-4 in f32, 2^-7 of the
//! largest value in bf16 (inputs rounded to bf16 for both sides). Shapes stay small; the
//! edge cases are what matters (padding, packed boundaries on and inside a 64-key tile, fully
//! masked rows, length-1 sequences, GQA 1-8, head sizes 64 and 128, forked and copy-on-write
//! blocks, flash-decoding's splits against today's paged kernel).

mod adamw;
mod coverage;
mod decode;
mod flash;
mod flash_fa2;
mod flash_fa2_bwd;
mod flash_fa2_rows;
mod fragments;
mod norm;
mod paged_qkv;
mod paged_split;
mod sample;
mod swiglu;

use crate::{run, Arg, Buf};
use rand::{Rng, SeedableRng};
use terse_model::launch::Launch;

/// Deadline of one launch's barriers: generous, for the sanitizer builds.
const DEADLINE_MS: u32 = 60_000;

/// Runs `l` with `bufs` (in the description's buffer order) on the shim.
pub(crate) fn launch(l: &Launch, bufs: Vec<Buf<'_>>) -> Result<(), String> {
    coverage::record(&l.kernel);
    let mut slots: Vec<Option<Buf<'_>>> = bufs.into_iter().map(Some).collect();
    let mut args = Vec::with_capacity(l.args.len());
    for a in &l.args {
        args.push(match *a {
            terse_model::launch::Arg::Buf(i) => Arg::Buf(
                slots
                    .get_mut(i)
                    .and_then(Option::take)
                    .unwrap_or_else(|| panic!("{}: buffer {i} missing or used twice", l.kernel)),
            ),
            terse_model::launch::Arg::I32(v) => Arg::I32(v),
            terse_model::launch::Arg::U32(v) => Arg::U32(v),
            terse_model::launch::Arg::F32(v) => Arg::F32(v),
            terse_model::launch::Arg::U64(v) => Arg::U64(v),
        });
    }
    run(&l.kernel, l.grid, l.block, l.shared, &mut args, DEADLINE_MS)
}

/// `launch`, panicking with the shim's error.
pub(crate) fn go(l: &Launch, bufs: Vec<Buf<'_>>) {
    if let Err(e) = launch(l, bufs) {
        panic!("{e}");
    }
}

/// `n` values uniform in [-1, 1) from `seed`.
pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

/// bf16 bits of each value (round to nearest even), and the values they hold.
pub(crate) fn to_bf16(x: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let back = bits
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    (bits, back)
}

pub(crate) fn from_bf16(x: &[u16]) -> Vec<f32> {
    x.iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect()
}

/// max |a − b|, infinite when either side holds a NaN or the lengths differ.
pub(crate) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter().zip(b).fold(0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

/// The bf16 tolerance: 2^-7 of the largest reference value, with a floor of 0.1 rather than 1
/// (a floor of 1 hid errors in outputs well below 1, such as an unrescaled half of O). The
/// floor is for gradients that are exactly zero, as dQ at T = 1: bf16 computes them as the
/// difference of two rounded values of order 1, a few 1e-4 at these inputs.
pub(crate) fn bf16_tol(reference: &[f32]) -> f32 {
    reference
        .iter()
        .fold(0f32, |m, x| if x.is_finite() { m.max(x.abs()) } else { m })
        .max(0.1)
        / 128.0
}

/// Asserts `got` matches `want` within `tol`.
#[track_caller]
pub(crate) fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let d = max_diff(got, want);
    assert!(d <= tol, "{what}: max |diff| {d:e} > {tol:e}");
}
