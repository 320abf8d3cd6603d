//! SwiGLU (`swiglu_fwd_*`, `swiglu_bwd_*`) through the shim against its CPU reference, in f32
//! and in bf16 (inputs rounded for both sides), at one element, a partial block and several.

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
