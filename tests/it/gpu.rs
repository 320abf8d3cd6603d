//! GPU parity of the CUDA kernels against their CPU references (terse_model::parity), run by
//! `cargo test --features cuda` on a machine with a GPU. Elsewhere it says why it is skipped.

#[test]
fn cuda_kernels_match_their_cpu_references() {
    let dev = match terse_model::device::select("cuda") {
        Ok((dev, _)) if dev.is_cuda() => dev,
        Ok(_) => return println!("skipped: the CUDA device is not a GPU"),
        Err(e) => return println!("skipped: no CUDA device here ({e})"),
    };
    let checks = terse_model::testing::parity::check(&dev).expect("parity run");
    for r in &checks {
        println!(
            "{}: max diff {:.2e} (tolerance {:.0e})",
            r.name, r.max_diff, r.tolerance
        );
    }
    let bad: Vec<_> = checks.iter().filter(|r| !r.ok()).collect();
    assert!(bad.is_empty(), "kernels off their references: {bad:?}");
}
