//! RMSNorm, RoPE and the log-prob epilogue through the shim against their CPU references.

use super::{bf16_tol, close, from_bf16, go, rand_vec, to_bf16};
use crate::Buf;
use terse_model::launch::{self, Storage};
use terse_model::testing::references as r;

#[test]
fn rmsnorm_forward_and_backward() {
    // cols 300: more than a block of 256 threads (the stride loop); 64: fewer.
    for (rows, cols) in [(5, 300), (3, 64), (1, 1)] {
        let (x, w, dy) = (
            rand_vec(rows * cols, 1),
            rand_vec(cols, 2),
            rand_vec(rows * cols, 3),
        );
        let eps = 1e-6;
        let (want_y, want_rstd) = r::rmsnorm_fwd(&x, &w, cols, eps);
        let (mut y, mut rstd) = (vec![0f32; rows * cols], vec![0f32; rows]);
        let (mut xs, mut ws) = (x.clone(), w.clone());
        go(
            &launch::rmsnorm_fwd(Storage::F32, rows, cols, eps),
            vec![
                Buf::F32(&mut xs),
                Buf::F32(&mut ws),
                Buf::F32(&mut y),
                Buf::F32(&mut rstd),
            ],
        );
        close("rmsnorm fwd y", &y, &want_y, 1e-4);
        close("rmsnorm fwd rstd", &rstd, &want_rstd, 1e-4);

        // The backward recomputes the row statistic; with `residual` it adds dres into dx.
        let (want_dx, want_dw) = r::rmsnorm_bwd(&x, &w, &want_rstd, &dy, cols);
        let dres = rand_vec(rows * cols, 5);
        for residual in [false, true] {
            let (mut dx, mut dw) = (vec![f32::NAN; rows * cols], vec![0f32; cols]);
            let (mut dys, mut rs) = (dy.clone(), dres.clone());
            go(
                &launch::rmsnorm_bwd(Storage::F32, rows, cols, eps, residual),
                vec![
                    Buf::F32(&mut xs),
                    Buf::F32(&mut ws),
                    Buf::F32(&mut dys),
                    Buf::F32(&mut rs),
                    Buf::F32(&mut dx),
                    Buf::F32(&mut dw),
                ],
            );
            let want: Vec<f32> = match residual {
                true => want_dx.iter().zip(&dres).map(|(a, b)| a + b).collect(),
                false => want_dx.clone(),
            };
            close(&format!("rmsnorm bwd dx ({residual})"), &dx, &want, 1e-4);
            close("rmsnorm bwd dw", &dw, &want_dw, 1e-4);
        }

        // bf16: the reference on the rounded inputs.
        let ((mut xb, xr), (mut wb, wr)) = (to_bf16(&x), to_bf16(&w));
        let (want, _) = r::rmsnorm_fwd(&xr, &wr, cols, eps);
        let (mut yb, mut rstd) = (vec![0u16; rows * cols], vec![0f32; rows]);
        go(
            &launch::rmsnorm_fwd(Storage::Bf16, rows, cols, eps),
            vec![
                Buf::Bf16(&mut xb),
                Buf::Bf16(&mut wb),
                Buf::Bf16(&mut yb),
                Buf::F32(&mut rstd),
            ],
        );
        close("bf16 rmsnorm fwd", &from_bf16(&yb), &want, bf16_tol(&want));
        // bf16 backward with the residual, against the reference on the rounded values.
        let ((mut gb, gr), (mut rb, rr)) = (to_bf16(&dy), to_bf16(&dres));
        let (_, rstd_r) = r::rmsnorm_fwd(&xr, &wr, cols, eps);
        let (dx_r, dw_r) = r::rmsnorm_bwd(&xr, &wr, &rstd_r, &gr, cols);
        let want: Vec<f32> = dx_r.iter().zip(&rr).map(|(a, b)| a + b).collect();
        let (mut dxb, mut dw) = (vec![0u16; rows * cols], vec![0f32; cols]);
        go(
            &launch::rmsnorm_bwd(Storage::Bf16, rows, cols, eps, true),
            vec![
                Buf::Bf16(&mut xb),
                Buf::Bf16(&mut wb),
                Buf::Bf16(&mut gb),
                Buf::Bf16(&mut rb),
                Buf::Bf16(&mut dxb),
                Buf::F32(&mut dw),
            ],
        );
        close(
            "bf16 rmsnorm bwd dx",
            &from_bf16(&dxb),
            &want,
            bf16_tol(&want),
        );
        close("bf16 rmsnorm bwd dw", &dw, &dw_r, 1e-3);
    }
}

/// The residual add fused in front of the norm: s = x + res and y = RMSNorm(s) * w, in f32
/// against the reference and in bf16 against the reference on the rounded sum.
#[test]
fn rmsnorm_with_the_residual_add() {
    for (rows, cols) in [(5, 300), (3, 64), (1, 1)] {
        let (x, res, w) = (
            rand_vec(rows * cols, 6),
            rand_vec(rows * cols, 7),
            rand_vec(cols, 8),
        );
        let eps = 1e-6;
        let sum: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
        let (want_y, _) = r::rmsnorm_fwd(&sum, &w, cols, eps);
        let (mut s, mut y) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows * cols]);
        let (mut xs, mut rs, mut ws) = (x.clone(), res.clone(), w.clone());
        go(
            &launch::rmsnorm_fwd_res(Storage::F32, rows, cols, eps),
            vec![
                Buf::F32(&mut xs),
                Buf::F32(&mut rs),
                Buf::F32(&mut ws),
                Buf::F32(&mut s),
                Buf::F32(&mut y),
            ],
        );
        close("rmsnorm res s", &s, &sum, 0.0);
        close("rmsnorm res y", &y, &want_y, 1e-4);

        let ((mut xb, xr), (mut rb, rr), (mut wb, wr)) = (to_bf16(&x), to_bf16(&res), to_bf16(&w));
        let sum16 = to_bf16(&xr.iter().zip(&rr).map(|(a, b)| a + b).collect::<Vec<_>>()).1;
        let (want_y, _) = r::rmsnorm_fwd(&sum16, &wr, cols, eps);
        let (mut sb, mut yb) = (vec![0u16; rows * cols], vec![0u16; rows * cols]);
        go(
            &launch::rmsnorm_fwd_res(Storage::Bf16, rows, cols, eps),
            vec![
                Buf::Bf16(&mut xb),
                Buf::Bf16(&mut rb),
                Buf::Bf16(&mut wb),
                Buf::Bf16(&mut sb),
                Buf::Bf16(&mut yb),
            ],
        );
        close("bf16 rmsnorm res s", &from_bf16(&sb), &sum16, 0.0);
        close(
            "bf16 rmsnorm res y",
            &from_bf16(&yb),
            &want_y,
            bf16_tol(&want_y),
        );
    }
}

#[test]
fn rope_forward_and_backward() {
    for dims @ [b, h, t, d] in [[2, 3, 5, 64], [1, 2, 3, 128], [1, 1, 1, 2]] {
        let x = rand_vec(b * h * t * d, 4);
        let (c, s) = (rand_vec(b * t * d / 2, 5), rand_vec(b * t * d / 2, 6));
        // Both layouts on each side: attention's (B, H, T, D) and the rows' (B, T, H, D).
        let layouts = [[false, false], [true, false], [false, true], [true, true]];
        for (inverse, tokens) in [false, true]
            .into_iter()
            .flat_map(|i| layouts.map(|l| (i, l)))
        {
            let what = format!("rope {dims:?} inverse={inverse} tokens={tokens:?}");
            let want = r::rope_laid_out(&x, &c, &s, dims, inverse, tokens);
            let (mut xs, mut cs, mut ss) = (x.clone(), c.clone(), s.clone());
            let mut y = vec![0f32; x.len()];
            go(
                &launch::rope(Storage::F32, inverse, dims, tokens),
                vec![
                    Buf::F32(&mut xs),
                    Buf::F32(&mut cs),
                    Buf::F32(&mut ss),
                    Buf::F32(&mut y),
                ],
            );
            close(&what, &y, &want, 1e-4);

            let ((mut xb, xr), (mut cb, cr), (mut sb, sr)) =
                (to_bf16(&x), to_bf16(&c), to_bf16(&s));
            let want = r::rope_laid_out(&xr, &cr, &sr, dims, inverse, tokens);
            let mut yb = vec![0u16; x.len()];
            go(
                &launch::rope(Storage::Bf16, inverse, dims, tokens),
                vec![
                    Buf::Bf16(&mut xb),
                    Buf::Bf16(&mut cb),
                    Buf::Bf16(&mut sb),
                    Buf::Bf16(&mut yb),
                ],
            );
            close(
                &format!("bf16 {what}"),
                &from_bf16(&yb),
                &want,
                bf16_tol(&want),
            );
        }
    }
}

#[test]
fn logprob_forward_and_backward() {
    // v 1000: more than a block of 512 threads; 7: fewer than a warp.
    for (n, v) in [(3, 1000), (4, 7)] {
        let logits: Vec<f32> = rand_vec(n * v, 7).iter().map(|x| 4.0 * x).collect();
        let mut targets: Vec<u32> = (0..n as u32).map(|i| (i * 5 + 2) % v as u32).collect();
        targets[0] = v as u32 - 1;
        let g: Vec<f32> = rand_vec(n, 8);
        // f32, then bf16 logits (the reference reads the same rounded values; the bf16 gradient
        // is rounded once).
        let (mut lb, lr) = to_bf16(&logits);
        for s in [Storage::F32, Storage::Bf16] {
            let x = if s == Storage::F32 { &logits } else { &lr };
            let (logp, lse, ent) = r::logprob_fwd(x, &targets, v);
            let mut stats = vec![0f32; 3 * n];
            let mut lf = logits.clone();
            go(
                &launch::logprob_fwd(s, n, v),
                vec![
                    typed(s, &mut lf, &mut lb),
                    Buf::U32(&mut targets),
                    Buf::F32(&mut stats),
                ],
            );
            let col = |k: usize| stats.iter().skip(k).step_by(3).copied().collect::<Vec<_>>();
            close("logprob fwd log p", &col(0), &logp, 1e-4);
            close("logprob fwd lse", &col(1), &lse, 1e-4);
            close("logprob fwd entropy", &col(2), &ent, 1e-4);

            let want = r::logprob_bwd(x, &targets, &lse, &g, v);
            let mut lse_g: Vec<f32> = lse.iter().zip(&g).flat_map(|(a, b)| [*a, *b]).collect();
            let (mut gf, mut gb) = (vec![0f32; n * v], vec![0u16; n * v]);
            go(
                &launch::logprob_bwd(s, n, v),
                vec![
                    typed(s, &mut lf, &mut lb),
                    Buf::U32(&mut targets),
                    Buf::F32(&mut lse_g),
                    typed(s, &mut gf, &mut gb),
                ],
            );
            match s {
                Storage::F32 => close("logprob bwd", &gf, &want, 1e-5),
                Storage::Bf16 => close("bf16 logprob bwd", &from_bf16(&gb), &want, bf16_tol(&want)),
            }
        }
    }
}

/// The f32 or the bf16 buffer, by the instantiation under test.
fn typed<'a>(s: Storage, f: &'a mut [f32], b: &'a mut [u16]) -> Buf<'a> {
    match s {
        Storage::F32 => Buf::F32(f),
        Storage::Bf16 => Buf::Bf16(b),
    }
}
