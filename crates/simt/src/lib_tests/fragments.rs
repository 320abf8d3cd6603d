//! The shim's twin of kernels/mma.cuh against the PTX ISA: the fragment mapping of mma.sync
//! m16n8k16 (bf16) and ldmatrix m8n8, written here again from the ISA's tables (not from the
//! shim's code), checked through the probes of crates/simt/fragments.cu; an mma of known
//! matrices and one fed by ldmatrix as the flash kernels feed Q K^T and P V, against a plain
//! matmul; cp.async's data arriving only at its wait; dynamic shared memory; and the faults.

use super::{close, rand_vec, to_bf16, DEADLINE_MS};
use crate::{run, Arg, Buf};

/// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.bf16): the
/// (row, column) of element j of a lane's A fragment (a0..a7; register i holds a(2i) in its
/// low half and a(2i+1) in its high half). groupID = lane >> 2, threadID_in_group = lane % 4;
/// row = groupID for a0, a1, a4, a5 and groupID + 8 for a2, a3, a6, a7; col =
/// threadID_in_group * 2 + (j & 1) for a0..a3 and that + 8 for a4..a7.
fn a_elem(lane: usize, j: usize) -> (usize, usize) {
    let (group, tig) = (lane >> 2, lane % 4);
    let row = if matches!(j, 0 | 1 | 4 | 5) {
        group
    } else {
        group + 8
    };
    let col = tig * 2 + (j & 1) + if j < 4 { 0 } else { 8 };
    (row, col)
}

/// The same section, B (16 x 8): b0..b3; row = threadID_in_group * 2 + (j & 1) for b0, b1 and
/// that + 8 for b2, b3; col = groupID.
fn b_elem(lane: usize, j: usize) -> (usize, usize) {
    let (group, tig) = (lane >> 2, lane % 4);
    (tig * 2 + (j & 1) + if j < 2 { 0 } else { 8 }, group)
}

/// The same section, C and D (16 x 8, f32): c0..c3; row = groupID for c0, c1 and groupID + 8
/// for c2, c3; col = threadID_in_group * 2 + (j & 1).
fn c_elem(lane: usize, j: usize) -> (usize, usize) {
    let (group, tig) = (lane >> 2, lane % 4);
    (if j < 2 { group } else { group + 8 }, tig * 2 + (j & 1))
}

/// Per-lane registers of a 16 x 16 A (row-major bf16 bits) and a 16 x 8 B (B[k][n] at k*8+n).
fn pack(a: &[u16], b: &[u16]) -> (Vec<u32>, Vec<u32>) {
    let mut ra = vec![0u32; 32 * 4];
    let mut rb = vec![0u32; 32 * 2];
    for lane in 0..32 {
        for j in 0..8 {
            let (r, c) = a_elem(lane, j);
            ra[lane * 4 + j / 2] |= u32::from(a[r * 16 + c]) << (16 * (j % 2));
        }
        for j in 0..4 {
            let (r, c) = b_elem(lane, j);
            rb[lane * 2 + j / 2] |= u32::from(b[r * 8 + c]) << (16 * (j % 2));
        }
    }
    (ra, rb)
}

/// probe_mma: D of every lane's fragments, as a 16 x 8 row-major matrix (by the ISA's C map),
/// with C given the same way.
fn mma(a: &[u16], b: &[u16], c: &[f32]) -> Vec<f32> {
    let (mut ra, mut rb) = pack(a, b);
    let mut rc = vec![0f32; 128];
    for lane in 0..32 {
        for j in 0..4 {
            let (r, col) = c_elem(lane, j);
            rc[lane * 4 + j] = c[r * 8 + col];
        }
    }
    let mut rd = vec![0f32; 128];
    let mut args = vec![
        Arg::Buf(Buf::U32(&mut ra)),
        Arg::Buf(Buf::U32(&mut rb)),
        Arg::Buf(Buf::F32(&mut rc)),
        Arg::Buf(Buf::F32(&mut rd)),
    ];
    run(
        "probe_mma",
        (1, 1, 1),
        (32, 1, 1),
        0,
        &mut args,
        DEADLINE_MS,
    )
    .expect("probe_mma");
    let mut d = vec![f32::NAN; 128];
    for lane in 0..32 {
        for j in 0..4 {
            let (r, col) = c_elem(lane, j);
            d[r * 8 + col] = rd[lane * 4 + j];
        }
    }
    d
}

fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// C + A B in f32, A 16 x 16, B 16 x 8, row-major.
fn matmul(a: &[f32], b: &[f32], c: &[f32], n: usize) -> Vec<f32> {
    (0..16 * n)
        .map(|i| {
            let (r, col) = (i / n, i % n);
            c[i] + (0..16).map(|k| a[r * 16 + k] * b[k * n + col]).sum::<f32>()
        })
        .collect()
}

/// Each lane's D registers name their (row, column): A holds its own index (16 r + k, exact
/// in bf16), B selects columns kk..kk+8 of A, and C holds 1024 (8 r + n); every value of D
/// decodes to the position the ISA's C map gives the register it came back in.
#[test]
fn mma_fragments_follow_the_isa_mapping() {
    let a: Vec<u16> = (0..256).map(|i| bf16_bits(i as f32)).collect();
    let c: Vec<f32> = (0..128).map(|i| 1024.0 * i as f32).collect();
    for kk in [0usize, 8] {
        let b: Vec<u16> = (0..128)
            .map(|i| bf16_bits(if i / 8 == kk + i % 8 { 1.0 } else { 0.0 }))
            .collect();
        let d = mma(&a, &b, &c);
        for (i, &v) in d.iter().enumerate() {
            let (r, n) = (i / 8, i % 8);
            let v = v as usize;
            assert_eq!(
                (v / 1024, (v % 1024) / 16, v % 16),
                (r * 8 + n, r, kk + n),
                "D[{r}][{n}] with the columns from {kk}"
            );
        }
    }
}

#[test]
fn mma_of_known_matrices_is_the_plain_matmul() {
    let (a, af) = to_bf16(&rand_vec(256, 31));
    let (b, bf) = to_bf16(&rand_vec(128, 32));
    let c = rand_vec(128, 33);
    close("mma.sync", &mma(&a, &b, &c), &matmul(&af, &bf, &c, 8), 1e-4);
}

/// ldmatrix of a 16 x 16 tile whose element e holds e: lane l's register i is matrix i's row
/// l / 4, columns 2 (l % 4) and + 1 (.trans: column l / 4, rows 2 (l % 4) and + 1), where the
/// probe's matrix i is the quarter at rows 8 (i & 1), columns 8 (i >> 1).
#[test]
fn ldmatrix_follows_the_isa_mapping() {
    let mut tile: Vec<u32> = (0..256).collect();
    let mut out = vec![0u32; 4 * 32 * 4];
    let mut args = vec![Arg::Buf(Buf::U32(&mut tile)), Arg::Buf(Buf::U32(&mut out))];
    run(
        "probe_ldmatrix",
        (1, 1, 1),
        (32, 1, 1),
        0,
        &mut args,
        DEADLINE_MS,
    )
    .expect("probe");
    for (variant, count, trans) in [(0, 4, false), (1, 4, true), (2, 2, false), (3, 2, true)] {
        for lane in 0..32 {
            for m in 0..4 {
                let got = out[(variant * 32 + lane) * 4 + m];
                if m >= count {
                    assert_eq!(got, 0, "variant {variant}: register {m} is not loaded");
                    continue;
                }
                let want = |h: usize| {
                    let (r, c) = if trans {
                        (2 * (lane % 4) + h, lane / 4)
                    } else {
                        (lane / 4, 2 * (lane % 4) + h)
                    };
                    ((r + 8 * (m & 1)) * 16 + c + 8 * (m >> 1)) as u32
                };
                assert_eq!(
                    (got & 0xffff, got >> 16),
                    (want(0), want(1)),
                    "ldmatrix x{count} trans {trans}: lane {lane} register {m}"
                );
            }
        }
    }
}

/// Q K^T and P V as the flash kernels load them: A by ldmatrix.x4, B once from [n][k] (K's
/// layout) by ldmatrix.x2 and once from [k][n] (V's) by ldmatrix.x2.trans.
#[test]
fn ldmatrix_operands_feed_mma_as_q_k_and_v() {
    let (a, af) = to_bf16(&rand_vec(256, 41));
    let (bk, bkf) = to_bf16(&rand_vec(128, 42));
    // B^T: bt[n][k] = bk[k][n].
    let mut bt: Vec<u32> = (0..128)
        .map(|i| u32::from(bk[(i % 16) * 8 + i / 16]))
        .collect();
    let mut a32: Vec<u32> = a.iter().map(|&x| u32::from(x)).collect();
    let mut bk32: Vec<u32> = bk.iter().map(|&x| u32::from(x)).collect();
    let mut d = vec![0f32; 256];
    let mut args = vec![
        Arg::Buf(Buf::U32(&mut a32)),
        Arg::Buf(Buf::U32(&mut bt)),
        Arg::Buf(Buf::U32(&mut bk32)),
        Arg::Buf(Buf::F32(&mut d)),
    ];
    run(
        "probe_mma_smem",
        (1, 1, 1),
        (32, 1, 1),
        0,
        &mut args,
        DEADLINE_MS,
    )
    .expect("probe");
    let want = matmul(&af, &bkf, &[0f32; 128], 8);
    close("B from [n][k] by ldmatrix", &d[..128], &want, 1e-4);
    close("B from [k][n] by ldmatrix.trans", &d[128..], &want, 1e-4);
}

/// A cp.async destination holds the source only once a wait covers its group: before, the
/// shim's 0xff bytes; after wait_group 1, the first of two groups; after wait_group 0, both.
#[test]
fn cp_async_completes_at_its_wait() {
    let mut src: Vec<u32> = (0..256).map(|i| i * 7 + 1).collect();
    let want = src.clone();
    let mut out = vec![0u32; 3 * 256];
    let mut args = vec![Arg::Buf(Buf::U32(&mut src)), Arg::Buf(Buf::U32(&mut out))];
    run(
        "probe_cp_async",
        (1, 1, 1),
        (32, 1, 1),
        0,
        &mut args,
        DEADLINE_MS,
    )
    .expect("probe");
    for lane in 0..32 {
        for i in 0..8 {
            let at = lane * 8 + i;
            assert_eq!(out[at], u32::MAX, "lane {lane} word {i} before any wait");
            let mid = if i < 4 { want[at] } else { u32::MAX };
            assert_eq!(
                out[256 + at],
                mid,
                "lane {lane} word {i} after wait_group 1"
            );
            assert_eq!(
                out[512 + at],
                want[at],
                "lane {lane} word {i} after wait_group 0"
            );
        }
    }
}

/// Dynamic shared memory of the launch's size, undefined (NaN here) at every block's start;
/// a kernel that uses it under a launch that gave none fails naming that.
#[test]
fn dynamic_shared_memory_has_the_launch_s_size() {
    let (blocks, n) = (2usize, 64usize);
    let mut x = rand_vec(blocks * n, 51);
    let mut out = vec![0f32; blocks * 2 * n];
    let bytes = (2 * n * 4) as u32;
    let mut args = vec![Arg::Buf(Buf::F32(&mut x)), Arg::Buf(Buf::F32(&mut out))];
    let (grid, block) = ((blocks as u32, 1, 1), (n as u32, 1, 1));
    run(
        "probe_dynamic_shared",
        grid,
        block,
        bytes,
        &mut args,
        DEADLINE_MS,
    )
    .expect("probe");
    for b in 0..blocks {
        for t in 0..n {
            assert_eq!(
                out[b * 2 * n + t],
                x[b * n + n - 1 - t],
                "block {b} thread {t}"
            );
            assert!(
                out[b * 2 * n + n + t].is_nan(),
                "block {b}: word {t} was not fresh"
            );
        }
    }
    let mut args = vec![Arg::Buf(Buf::F32(&mut x)), Arg::Buf(Buf::F32(&mut out))];
    let e = run(
        "probe_dynamic_shared",
        grid,
        block,
        0,
        &mut args,
        DEADLINE_MS,
    )
    .expect_err("0 B");
    assert!(e.contains("gave it 0 bytes"), "{e}");
}

#[test]
fn misaligned_ldmatrix_and_cp_async_fail_the_launch() {
    for (name, what) in [
        ("fault_ldmatrix_misaligned", "ldmatrix row address"),
        ("fault_cp_async_misaligned", "cp.async with an address"),
    ] {
        let mut out = vec![0f32; 64 * 8];
        let mut args = vec![Arg::Buf(Buf::F32(&mut out))];
        let e = run(name, (1, 1, 1), (32, 1, 1), 0, &mut args, DEADLINE_MS).expect_err(name);
        assert!(e.contains(what) && e.contains(name), "{e}");
    }
}
