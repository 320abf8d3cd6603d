//! What keeps the suite honest: every entry point of kernels/*.cu is launched by a test, the
//! kernels stay within the portable subset the shim runs, a launch that disagrees with the
//! kernel's signature or geometry fails, and the shim reports broken synchronisation (a
//! divergent barrier, a shuffle in a partial warp, a barrier no one completes) as an error
//! naming the kernel, the block and the line, never a hang.

use super::{close, go, rand_vec};
use crate::{run, Arg, Buf, KERNELS};
use terse_model::launch::{self as describe, Storage};

/// crates/simt's own test kernels (build.rs compiles them beside kernels/*.cu): not kernels/'s.
const FIXTURES: [&str; 2] = ["faulty.cu", "fragments.cu"];

/// Set by the coverage test for the suite it runs: the file each launch appends its kernel's
/// name to (`record`).
const LAUNCHED: &str = "TERSE_SIMT_LAUNCHED";

/// Notes that the suite launched `kernel`, when the coverage test is listening.
pub(crate) fn record(kernel: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os(LAUNCHED) else {
        return;
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("coverage record {}: {e}", path.to_string_lossy()));
    // One write per line: parallel tests append whole lines.
    f.write_all(format!("{kernel}\n").as_bytes())
        .unwrap_or_else(|e| panic!("coverage record: {e}"));
}

/// A kernel in kernels/ that no test launches fails here. The entry points are build.rs's
/// table (`KERNELS`, read from the sources), and the launched ones are what the rest of this
/// suite launches when run again in a child process, so neither side is a hand list.
#[test]
fn every_kernel_entry_point_has_a_shim_test() {
    let me = "every_kernel_entry_point_has_a_shim_test";
    if std::env::var_os(LAUNCHED).is_some() {
        return;
    }
    let file = std::env::temp_dir().join(format!("terse-simt-launched-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--skip", me, "--quiet"])
        .env(LAUNCHED, &file)
        .output()
        .expect("running the suite");
    let launched = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    let launched: std::collections::BTreeSet<&str> = launched.lines().collect();
    let missing: Vec<&str> = KERNELS
        .iter()
        .filter(|k| !FIXTURES.contains(&k.file) && !launched.contains(k.name))
        .map(|k| k.name)
        .collect();
    assert!(
        missing.is_empty(),
        "kernels/*.cu entry points no shim test launches: {missing:?} (the suite's run: {}; {})",
        out.status,
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("FAILED") || l.contains("panicked"))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

/// The one header that may hold inline PTX (its shim twin is kernels/shim/mma_sync.h).
const PTX_HEADER: &str = "mma.cuh";

/// The PTX instructions PTX_HEADER may use: those the shim emulates (kernels/shim/mma_sync.h).
const PTX_ALLOWED: [&str; 8] = [
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ",
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16 ",
    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 ",
    "ldmatrix.sync.aligned.m8n8.x2.shared.b16 ",
    "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 ",
    "cp.async.cg.shared.global [%0], [%1], 16;",
    "cp.async.commit_group;",
    "cp.async.wait_group %0;",
];

/// An `asm` line of PTX_HEADER: one string literal holding exactly one allowed instruction.
fn allowed_ptx(code: &str) -> bool {
    let Some(text) = code.split('"').nth(1) else {
        return false;
    };
    let text = text.trim_end_matches("\\n");
    PTX_ALLOWED.iter().any(|a| text.starts_with(a)) && text.matches(';').count() == 1
}

/// The portable subset: what the shim cannot run must not appear in kernels/; WMMA is in it
/// (kernels/shim/wmma.h), used only through its layout-free operations. Inline PTX, cp.async
/// and dynamic shared memory are in it only through PTX_HEADER, and only the instructions the
/// shim's twin emulates (PTX_ALLOWED).
#[test]
fn kernels_stay_within_the_portable_subset() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    let mut checked = 0;
    let mut ptx = 0;
    for e in std::fs::read_dir(&dir).expect("kernels/") {
        let p = e.expect("entry").path();
        if !p.extension().is_some_and(|x| x == "cu" || x == "cuh") {
            continue;
        }
        let header = p.file_name().is_some_and(|n| n == PTX_HEADER);
        let text = std::fs::read_to_string(&p).expect("read");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let at = format!("{}:{}", p.display(), i + 1);
            if header {
                if code.contains("asm") {
                    assert!(
                        allowed_ptx(code),
                        "{at}: inline PTX other than {PTX_ALLOWED:?}"
                    );
                    ptx += 1;
                }
                continue;
            }
            for banned in [
                "asm(",
                "asm volatile",
                "cp.async",
                "cooperative_groups",
                "extern __shared__",
                "__activemask",
                "__ballot_sync",
                "__any_sync",
                "__all_sync",
                "__match_",
                "__nanosleep",
                "clock64",
                "atomicCAS",
                "__ldg",
                "__cvta_generic_to_shared",
                "asm ",
            ] {
                assert!(
                    !code.contains(banned),
                    "{at}: `{banned}` is outside the portable subset"
                );
            }
            // WMMA fragments are opaque: only load/store/fill/mma_sync and element-wise loops
            // over x[i] up to num_elements (uniform over the elements, whatever the layout).
            assert!(
                !code.contains(".at("),
                "{at}: `.at(` is the shim's accessor, not CUDA's"
            );
            if code.contains(".x[") {
                let uniform = code.contains("num_elements") && code.contains(".x[i]");
                assert!(
                    uniform,
                    "{at}: a fragment element by position (layout-dependent)"
                );
            }
            // Collectives only with the full mask.
            for c in [
                "__shfl_xor_sync(",
                "__shfl_sync(",
                "__shfl_down_sync(",
                "__syncwarp(",
            ] {
                if let Some(rest) = code.split(c).nth(1) {
                    let mask = rest.split([',', ')']).next().unwrap_or_default().trim();
                    assert!(
                        mask.is_empty() || mask == "0xffffffff" || mask == "0xFFFFFFFF",
                        "{at}: `{c}` with mask `{mask}`: only full-mask collectives"
                    );
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 6, "{checked} kernel files");
    assert_eq!(ptx, PTX_ALLOWED.len(), "asm lines in {PTX_HEADER}");
}

/// The arguments are checked against the kernel's signature: a swapped pair (cols and eps) or
/// a missing one is an error naming it, not a wrong read.
#[test]
fn a_launch_that_disagrees_with_the_signature_is_refused() {
    let (rows, cols) = (2, 64);
    let (mut x, mut w, mut y, mut rstd) = (
        rand_vec(rows * cols, 1),
        rand_vec(cols, 2),
        vec![0f32; rows * cols],
        vec![0f32; rows],
    );
    let l = describe::rmsnorm_fwd(Storage::F32, rows, cols, 1e-6);
    let mut args = vec![
        Arg::Buf(Buf::F32(&mut x)),
        Arg::Buf(Buf::F32(&mut w)),
        Arg::Buf(Buf::F32(&mut y)),
        Arg::Buf(Buf::F32(&mut rstd)),
        Arg::F32(1e-6),
        Arg::I32(cols as i32),
    ];
    let e = run(&l.kernel, l.grid, l.block, l.shared, &mut args, 10_000).expect_err("swapped");
    assert!(e.contains("argument 4") && e.contains("I32"), "{e}");
    args.pop();
    let e = run(&l.kernel, l.grid, l.block, l.shared, &mut args, 10_000).expect_err("missing");
    assert!(e.contains("takes 6 arguments, got 5"), "{e}");
    let mut bf = vec![0u16; rows * cols];
    let mut args = vec![
        Arg::Buf(Buf::Bf16(&mut bf)),
        Arg::Buf(Buf::F32(&mut w)),
        Arg::Buf(Buf::F32(&mut y)),
        Arg::Buf(Buf::F32(&mut rstd)),
        Arg::I32(cols as i32),
        Arg::F32(1e-6),
    ];
    let e = run(&l.kernel, l.grid, l.block, l.shared, &mut args, 10_000).expect_err("dtype");
    assert!(e.contains("argument 0"), "{e}");
}

/// A wrong grid (one block short) leaves a row unwritten: the parity comparison catches it.
#[test]
fn a_wrong_grid_fails_the_comparison() {
    let (rows, cols) = (3, 64);
    let (x, w) = (rand_vec(rows * cols, 3), rand_vec(cols, 4));
    let (want, _) = terse_model::testing::references::rmsnorm_fwd(&x, &w, cols, 1e-6);
    let mut l = describe::rmsnorm_fwd(Storage::F32, rows, cols, 1e-6);
    l.grid.0 -= 1;
    let (mut xs, mut ws, mut y, mut rstd) = (x, w, vec![0f32; rows * cols], vec![0f32; rows]);
    go(
        &l,
        vec![
            Buf::F32(&mut xs),
            Buf::F32(&mut ws),
            Buf::F32(&mut y),
            Buf::F32(&mut rstd),
        ],
    );
    let d = super::max_diff(&y, &want);
    assert!(
        d > 1e-2,
        "a grid one block short matched the reference ({d})"
    );
    close(
        "the rows it did write",
        &y[..(rows - 1) * cols],
        &want[..(rows - 1) * cols],
        1e-4,
    );
}

fn fault(name: &str, block: u32, deadline_ms: u32) -> String {
    let mut out = vec![0f32; block as usize];
    let mut args = vec![Arg::Buf(Buf::F32(&mut out))];
    run(name, (2, 1, 1), (block, 1, 1), 0, &mut args, deadline_ms).expect_err(name)
}

#[test]
fn broken_synchronisation_is_an_error_naming_the_kernel_the_block_and_the_line() {
    let e = fault("fault_divergent_sync", 64, 20_000);
    assert!(
        e.contains("fault_divergent_sync") && e.contains("block (0,0,0)"),
        "{e}"
    );
    assert!(
        e.contains("__syncthreads") && e.contains("different lines"),
        "{e}"
    );
    let e = fault("fault_divergent_shuffle", 32, 20_000);
    assert!(
        e.contains("warp shuffle") && e.contains("different lines"),
        "{e}"
    );
    let e = fault("fault_partial_warp", 32, 20_000);
    assert!(e.contains("partial-warp"), "{e}");
    let e = fault("fault_wmma_misaligned", 32, 20_000);
    assert!(e.contains("not 32-byte aligned"), "{e}");
    let e = fault("fault_wmma_bad_ldm", 32, 20_000);
    assert!(e.contains("not a multiple of 16 bytes"), "{e}");
    let t0 = std::time::Instant::now();
    let e = fault("fault_deadline", 64, 300);
    assert!(
        e.contains("before the deadline") && e.contains("fault_deadline"),
        "{e}"
    );
    assert!(
        t0.elapsed().as_secs() < 20,
        "the deadline did not end the launch"
    );
    // The same shim runs a correct reduction with early-returning warps.
    let (blocks, threads) = (3usize, 128usize);
    let mut x = rand_vec(blocks * threads, 9);
    let want: Vec<f32> = x.chunks(threads).map(|c| c.iter().sum()).collect();
    let mut out = vec![0f32; blocks];
    let mut args = vec![Arg::Buf(Buf::F32(&mut x)), Arg::Buf(Buf::F32(&mut out))];
    run(
        "fault_none",
        (blocks as u32, 1, 1),
        (threads as u32, 1, 1),
        0,
        &mut args,
        20_000,
    )
    .expect("a correct kernel");
    close("block sums", &out, &want, 1e-4);
}
