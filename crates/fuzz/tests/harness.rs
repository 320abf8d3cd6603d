//! The harness can fail: the bin, run on the planted targets (the end of
//! crates/fuzz/src/targets/mod.rs), reports a panic, a hang, an abort, an allocation over the
//! limit and a stack overflow, each with its input saved, exits nonzero, and the saved input
//! replays the bug.
//! A real target on a few inputs exits zero.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_terse-fuzz")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("terse-fuzz-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn fuzz(target: &str, findings: &Path, extra: &[&str]) -> Output {
    Command::new(bin())
        .args(["--target", target, "--inputs", "120", "--max-findings", "2"])
        .arg("--findings")
        .arg(findings)
        .args(extra)
        .output()
        .expect("the bin runs")
}

/// Runs a planted target and checks the report: exit 1, a FINDING line of `kind` naming a
/// saved file under findings/<target>/, which exists; returns the saved file.
fn planted(target: &str, kind: &str, extra: &[&str]) -> PathBuf {
    let dir = scratch(target);
    let out = fuzz(target, &dir, extra);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{target}: {stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("FINDING {target}: {kind} on input")))
        .unwrap_or_else(|| panic!("{target}: no {kind} finding in {stdout}"));
    let saved = line
        .rsplit_once("(input saved to ")
        .map(|(_, p)| PathBuf::from(p.trim_end_matches(')')))
        .unwrap_or_else(|| panic!("no saved input in {line}"));
    assert!(saved.starts_with(dir.join(target)), "{line}");
    assert!(saved.is_file(), "{line}");
    assert!(
        stdout.contains("(stopped at"),
        "max-findings stops it: {stdout}"
    );
    saved
}

/// The saved input, replayed in-process, hits the planted bug again (the parent saved the
/// input the child ran, regenerated from its index).
fn replay_fails(target: &str, saved: &Path) {
    let child = Command::new(bin())
        .args(["--target", target, "--replay"])
        .arg(saved)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("replay runs");
    // A replay that crashes cannot remove its scratch folder.
    let scratch = terse_fuzz::child::scratch_path(target, child.id());
    let out = child.wait_with_output().expect("replay ends");
    let _ = std::fs::remove_dir_all(scratch);
    assert!(
        !out.status.success(),
        "{target}: the saved input replays clean"
    );
    let _ = std::fs::remove_dir_all(saved.parent().and_then(Path::parent).unwrap_or(saved));
}

#[test]
fn a_planted_panic_is_a_finding() {
    let saved = planted("planted-panic", "panic", &[]);
    replay_fails("planted-panic", &saved);
}

#[test]
fn a_planted_abort_is_a_finding() {
    let saved = planted("planted-abort", "abort", &[]);
    replay_fails("planted-abort", &saved);
}

#[test]
fn a_planted_stack_overflow_is_a_finding() {
    let saved = planted("planted-overflow", "stack-overflow", &[]);
    replay_fails("planted-overflow", &saved);
}

#[test]
fn a_planted_hang_is_a_finding() {
    let saved = planted("planted-hang", "hang", &["--hang-ms", "300"]);
    // A replay has no watchdog: the hang is only checked to be in the saved file's name.
    assert!(saved.to_string_lossy().contains("hang-s0-i"));
    let _ = std::fs::remove_dir_all(scratch("planted-hang"));
}

#[test]
fn a_planted_allocation_over_the_limit_is_a_finding() {
    planted("planted-oom", "oom", &["--mem-gb", "0.5"]);
    let _ = std::fs::remove_dir_all(scratch("planted-oom"));
}

#[test]
fn a_clean_target_exits_zero() {
    let dir = scratch("kk");
    let out = fuzz("kk", &dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("kk: 120 inputs in"), "{stdout}");
    assert!(!dir.exists(), "no finding, no findings folder");
}
