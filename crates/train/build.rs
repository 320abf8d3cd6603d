//! The commit terse-train is built from (`TERSE_COMMIT`, "unknown" outside a git checkout),
//! for the machine.json each run records (src/run/machine.rs). Rebuilt when HEAD moves.

use std::process::Command;

fn main() {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TERSE_COMMIT={commit}");
    // HEAD itself, the branch it points at, and packed refs (a branch's commit can live there).
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watch.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for f in watch {
        // Only files that exist: a missing one would rerun this script on every build.
        let path = git(&["rev-parse", "--git-path", &f]);
        if let Some(p) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}
