//! The kernel families' shape checks refuse bad shapes with one line naming the op and the
//! shapes, and their launch descriptions lay out each geometry and argument order once.

use super::kv_cache::check::{decode_attention, kv_write};
use super::logprob::check::{logprob, logprob_grad};
use super::rmsnorm::check::rmsnorm;
use super::rope::check::rope;
use candle_core::Result;

fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
    let e = r.expect_err("must be refused").to_string();
    assert_eq!(e.lines().count(), 1, "{e}");
    e
}

#[test]
fn bad_shapes_are_refused_with_the_op_and_the_shapes() {
    assert_eq!(rmsnorm(&[2, 3, 8], &[8]).expect("ok"), (6, 8));
    assert!(err(rmsnorm(&[2, 8], &[7])).contains("rmsnorm: weight [7]"));
    assert_eq!(
        rope(&[2, 4, 5, 8], &[2, 5, 4], &[2, 5, 4]).expect("ok"),
        [2, 4, 5, 8]
    );
    // A (T, D/2) table would be read out of bounds for b > 0.
    assert!(err(rope(&[2, 4, 5, 8], &[5, 4], &[5, 4])).contains("must be (B, T, D/2)"));
    assert!(err(rope(&[1, 1, 1, 7], &[1, 1, 3], &[1, 1, 3])).contains("odd"));
    assert!(logprob(&[3, 10], &[3], &[0, 9, 4]).is_ok());
    assert!(err(logprob(&[3, 10], &[3], &[0, 10, 4])).contains("target 10 at row 1"));
    assert!(err(logprob(&[3, 10], &[2], &[0, 1])).contains("targets [2]"));
    assert!(err(logprob_grad(&[3, 10], &[3], &[0, 1, 2], &[3, 3])).contains("lse_g"));
    assert!(err(kv_write(&[2, 1, 4, 8], &[2, 1, 8], 4)).contains("slot 4"));
    assert!(kv_write(&[2, 1, 4, 8], &[2, 1, 8], 3).is_ok());
    let ok = decode_attention(&[2, 4, 8], &[2, 2, 6, 8], &[2, 2, 6, 8], 12, 6);
    assert_eq!(ok.expect("ok"), [2, 4, 2, 6, 8]);
    assert!(err(decode_attention(
        &[2, 4, 8],
        &[2, 2, 6, 8],
        &[2, 2, 6, 8],
        12,
        7
    ))
    .contains("len 7"));
    assert!(err(decode_attention(
        &[2, 4, 16],
        &[2, 2, 6, 8],
        &[2, 2, 6, 8],
        12,
        6
    ))
    .contains("does not fit"));
    assert!(err(decode_attention(
        &[2, 4, 8],
        &[2, 2, 6, 8],
        &[2, 2, 5, 8],
        12,
        5
    ))
    .contains("differ"));
    assert!(err(decode_attention(
        &[1, 2, 7],
        &[1, 1, 4, 7],
        &[1, 1, 4, 7],
        4,
        4
    ))
    .contains("even"));
    assert!(err(decode_attention(
        &[1, 2, 512],
        &[1, 1, 4, 512],
        &[1, 1, 4, 512],
        4,
        4
    ))
    .contains("at most 256"));
}

mod launches {
    use crate::kernels::geometry::RMSNORM_BLOCK;
    use crate::kernels::launch::*;

    #[test]
    fn geometry_and_argument_order_are_laid_out_once() {
        let l = rmsnorm_fwd(Storage::Bf16, 10, 64, 1e-6);
        assert_eq!(l.kernel, "rmsnorm_fwd_bf16");
        assert_eq!((l.grid, l.block), ((10, 1, 1), (RMSNORM_BLOCK, 1, 1)));
        assert_eq!(l.args[4], Arg::I32(64));
        let dm = FlashDims {
            b: 2,
            hq: 4,
            hkv: 2,
            t: 9,
            d: 64,
            scale: 0.125,
        };
        let f = flash_bwd_dkdv(Storage::F32, dm);
        assert_eq!(f.grid, (3, 4, 1), "ceil(9 / 4) key-row tiles x B * Hkv");
        assert_eq!(f.args.len(), 14);
        assert_eq!(
            rope(Storage::F32, true, [1, 2, 3, 4], [true, false]).grid,
            (1, 1, 1)
        );
    }
}
