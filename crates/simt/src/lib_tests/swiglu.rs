//! SwiGLU (`swiglu_fwd_*`, `swiglu_bwd_*`, `swiglu_stacked_*`) through the shim against its CPU
//! reference, in f32 and in bf16 (inputs rounded for both sides), at one element, a partial
//! block and several; the stacked forward bit for bit against the plain one.

use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, Storage};
use terse_model::testing::references as r;

#[test]
fn swiglu_forward_and_backward() {
    for n in [1usize, 1000, 2050] {
        let g: Vec<f32> = rand_vec(n, 21).iter().map(|x| 4.0 * x).collect();
        let (u, dy) = (rand_vec(n, 22), rand_vec(n, 23));
        let (want_y, want_b) = (r::swiglu_fwd(&g, &u), r::swiglu_bwd(&g, &u, &dy));
        let (mut gs, mut us, mut dys) = (g.clone(), u.clone(), dy.clone());
        let (mut y, mut both) = (vec![0f32; n], vec![0f32; 2 * n]);
        go(
            &launch::swiglu_fwd(Storage::F32, n),
            vec![Buf::F32(&mut gs), Buf::F32(&mut us), Buf::F32(&mut y)],
        );
        close("swiglu fwd", &y, &want_y, 1e-5);
        go(
            &launch::swiglu_bwd(Storage::F32, n),
            vec![
                Buf::F32(&mut gs),
                Buf::F32(&mut us),
                Buf::F32(&mut dys),
                Buf::F32(&mut both),
            ],
        );
        close("swiglu bwd [dg; du]", &both, &want_b, 1e-5);

        let ((mut gb, gr), (mut ub, ur), (mut db, dr)) = (to_bf16(&g), to_bf16(&u), to_bf16(&dy));
        let (want_y, want_b) = (r::swiglu_fwd(&gr, &ur), r::swiglu_bwd(&gr, &ur, &dr));
        let (mut y, mut both) = (vec![0u16; n], vec![0u16; 2 * n]);
        go(
            &launch::swiglu_fwd(Storage::Bf16, n),
            vec![Buf::Bf16(&mut gb), Buf::Bf16(&mut ub), Buf::Bf16(&mut y)],
        );
        close(
            "bf16 swiglu fwd",
            &from_bf16(&y),
            &want_y,
            bf16_tol(&want_y),
        );
        go(
            &launch::swiglu_bwd(Storage::Bf16, n),
            vec![
                Buf::Bf16(&mut gb),
                Buf::Bf16(&mut ub),
                Buf::Bf16(&mut db),
                Buf::Bf16(&mut both),
            ],
        );
        close(
            "bf16 swiglu bwd",
            &from_bf16(&both),
            &want_b,
            bf16_tol(&want_b),
        );
    }
}

/// The stacked forward (rows [g | u]) gives the plain forward's bits, f32 and bf16, at a row
/// narrower than a block, rows that straddle blocks, and a wide row.
#[test]
fn swiglu_stacked_equals_the_plain_forward() {
    for (rows, width) in [(1usize, 3usize), (5, 300), (2, 3072)] {
        let n = rows * width;
        let g: Vec<f32> = rand_vec(n, 24).iter().map(|x| 4.0 * x).collect();
        let u = rand_vec(n, 25);
        let gu: Vec<f32> = (0..rows)
            .flat_map(|r| {
                let row = r * width..(r + 1) * width;
                g[row.clone()]
                    .iter()
                    .chain(&u[row])
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        let want = r::swiglu_fwd(&g, &u);
        assert_eq!(r::swiglu_stacked(&gu, width), want, "reference");
        let (mut gus, mut y) = (gu.clone(), vec![0f32; n]);
        go(
            &launch::swiglu_stacked(Storage::F32, n, width),
            vec![Buf::F32(&mut gus), Buf::F32(&mut y)],
        );
        let (mut gs, mut us, mut plain) = (g.clone(), u.clone(), vec![0f32; n]);
        go(
            &launch::swiglu_fwd(Storage::F32, n),
            vec![Buf::F32(&mut gs), Buf::F32(&mut us), Buf::F32(&mut plain)],
        );
        close("swiglu stacked", &y, &want, 1e-5);
        assert_eq!(y, plain, "stacked against plain, f32, {rows} x {width}");

        let ((mut gub, _), (mut gb, _), (mut ub, _)) = (to_bf16(&gu), to_bf16(&g), to_bf16(&u));
        let (mut y, mut plain) = (vec![0u16; n], vec![0u16; n]);
        go(
            &launch::swiglu_stacked(Storage::Bf16, n, width),
            vec![Buf::Bf16(&mut gub), Buf::Bf16(&mut y)],
        );
        go(
            &launch::swiglu_fwd(Storage::Bf16, n),
            vec![
                Buf::Bf16(&mut gb),
                Buf::Bf16(&mut ub),
                Buf::Bf16(&mut plain),
            ],
        );
        assert_eq!(y, plain, "stacked against plain, bf16, {rows} x {width}");
    }
}
