//! The multi-tensor AdamW (`adamw_*`) through the shim against its CPU reference, bit for bit:
//! tensors of 1 element, fewer than a block's threads, exactly one chunk, one past a chunk and
//! several chunks, in one launch, over three steps (the moments carry over); and clipping's
//! sum of squares over the same table (`grad_sumsq_f32`).

use super::{from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::adamw::{step_scalars, Scalars};
use terse_model::launch::{self, Storage};
use terse_model::testing::references as r;

const SIZES: [usize; 5] = [1, 200, 4096, 4097, 9000];

/// One tensor's state on the host: the master (or f32 parameter), its bf16 copy, moments.
struct Tensor {
    w: Vec<f32>,
    bf16: Vec<u16>,
    m: Vec<f32>,
    v: Vec<f32>,
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Three steps of `adamw_{f32,bf16}` over every size at once against the reference per tensor.
fn run(storage: Storage) {
    let (lr, b1, b2) = (3e-3, 0.9, 0.999);
    let h = Scalars::new(lr, b1, b2, 1e-8, 0.01);
    let fresh = |i: usize, n: usize| {
        let w = rand_vec(n, 10 + i as u64);
        let (bf16, w) = match storage {
            Storage::F32 => (vec![], w),
            Storage::Bf16 => to_bf16(&w),
        };
        Tensor {
            w,
            bf16,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    };
    let mut dev: Vec<Tensor> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| fresh(i, n))
        .collect();
    let mut want: Vec<Tensor> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| fresh(i, n))
        .collect();
    for step in 1..=3u64 {
        // The gradients in the parameters' dtype (bf16 grads: the reference reads them rounded).
        let mut grads: Vec<(Vec<f32>, Vec<u16>)> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let g = rand_vec(n, 100 * step + i as u64);
                match storage {
                    Storage::F32 => (g, vec![]),
                    Storage::Bf16 => {
                        let (b, g) = to_bf16(&g);
                        (g, b)
                    }
                }
            })
            .collect();
        let sc = step_scalars(lr, b1, b2, step);
        let mut scal: Vec<f32> = SIZES.iter().flat_map(|_| sc).collect();
        for (t, (g, _)) in want.iter_mut().zip(&grads) {
            r::adamw(&mut t.w, &mut t.m, &mut t.v, g, &h, sc);
        }
        let rows: Vec<([u64; 5], usize)> = dev
            .iter_mut()
            .zip(grads.iter_mut())
            .map(|(t, (g, gb))| {
                let a = |p: *mut u8| p as u64;
                let ptrs = match storage {
                    Storage::F32 => [
                        a(t.w.as_mut_ptr().cast()),
                        0,
                        a(t.m.as_mut_ptr().cast()),
                        a(t.v.as_mut_ptr().cast()),
                        a(g.as_mut_ptr().cast()),
                    ],
                    Storage::Bf16 => [
                        a(t.bf16.as_mut_ptr().cast()),
                        a(t.w.as_mut_ptr().cast()),
                        a(t.m.as_mut_ptr().cast()),
                        a(t.v.as_mut_ptr().cast()),
                        a(gb.as_mut_ptr().cast()),
                    ],
                };
                (ptrs, t.w.len())
            })
            .collect();
        let (mut table, blocks) = launch::adamw_table(&rows);
        go(
            &launch::adamw(storage, rows.len(), blocks, &h),
            vec![Buf::U64(&mut table), Buf::F32(&mut scal)],
        );
        for (n, (d, w)) in SIZES.iter().zip(dev.iter().zip(&want)) {
            assert_eq!(
                bits(&d.w),
                bits(&w.w),
                "{storage:?} size {n} step {step}: weights"
            );
            assert_eq!(
                bits(&d.m),
                bits(&w.m),
                "{storage:?} size {n} step {step}: exp_avg"
            );
            assert_eq!(
                bits(&d.v),
                bits(&w.v),
                "{storage:?} size {n} step {step}: exp_avg_sq"
            );
            if storage == Storage::Bf16 {
                let (_, rounded) = to_bf16(&w.w);
                assert_eq!(
                    bits(&from_bf16(&d.bf16)),
                    bits(&rounded),
                    "size {n} step {step}: the bf16 parameter is the rounded master"
                );
            }
        }
    }
}

#[test]
fn adamw_f32_matches_the_reference_bit_for_bit() {
    run(Storage::F32);
}

#[test]
fn adamw_bf16_matches_the_reference_bit_for_bit() {
    run(Storage::Bf16);
}

/// `grad_sumsq_f32` over every size in one launch: each block's partial sum equals the
/// reference's for its chunk, bit for bit.
#[test]
fn grad_sumsq_matches_the_reference_bit_for_bit() {
    let mut grads: Vec<Vec<f32>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| rand_vec(n, 300 + i as u64))
        .collect();
    let want: Vec<u64> = grads
        .iter()
        .flat_map(|g| r::grad_sumsq(g))
        .map(f64::to_bits)
        .collect();
    let rows: Vec<([u64; 5], usize)> = grads
        .iter_mut()
        .map(|g| ([0, 0, 0, 0, g.as_mut_ptr() as u64], g.len()))
        .collect();
    let (mut table, blocks) = launch::adamw_table(&rows);
    assert_eq!(blocks, want.len());
    let mut partial = vec![u64::MAX; blocks]; // f64 bits; every block overwrites its own
    go(
        &launch::grad_sumsq(rows.len(), blocks),
        vec![Buf::U64(&mut table), Buf::U64(&mut partial)],
    );
    assert_eq!(partial, want);
}
