//! The 500-line limit on source files (issue 44): every Rust, C++ and CUDA file under crates/,
//! xtask/, tests/, fake_gpu/ and kernels/ is at most 500 lines, unless
//! tests/file_size_exceptions.txt lists it with a written reason. An entry whose file is gone or
//! back under the limit fails too, so the list cannot go stale.

use std::collections::BTreeMap;
use std::path::Path;

/// The most lines a source file may hold without a listed reason.
const LIMIT: usize = 500;
/// The folders searched, from the repository root.
const ROOTS: [&str; 5] = ["crates", "xtask", "tests", "fake_gpu", "kernels"];
/// The source extensions counted.
const EXTENSIONS: [&str; 5] = ["rs", "cpp", "cu", "h", "cuh"];

/// Every source file under `dir` (build outputs aside), as paths relative to `root`.
fn sources(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() {
            if !["target", ".git", "runs"].contains(&name) {
                sources(root, &p, out);
            }
        } else if p
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| EXTENSIONS.contains(&x))
        {
            let rel = p.strip_prefix(root).expect("under the root");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The exceptions file: `path — reason` per line; blank lines and `#` comments are skipped.
fn exceptions(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (path, reason) = line.split_once(" — ").unwrap_or_else(|| {
            panic!(
                "file_size_exceptions.txt:{}: `{line}` is not `path — reason`",
                i + 1
            )
        });
        assert!(
            reason.trim().len() >= 10,
            "file_size_exceptions.txt:{}: `{path}` needs a written reason",
            i + 1
        );
        let dup = out.insert(path.trim().to_string(), reason.trim().to_string());
        assert!(
            dup.is_none(),
            "file_size_exceptions.txt:{}: `{path}` listed twice",
            i + 1
        );
    }
    out
}

#[test]
fn no_source_file_is_over_the_limit_without_a_listed_reason() {
    let root = crate::train::repo("");
    let listed = exceptions(
        &std::fs::read_to_string(root.join("tests/file_size_exceptions.txt"))
            .expect("tests/file_size_exceptions.txt"),
    );
    let mut files = vec![];
    for dir in ROOTS {
        sources(&root, &root.join(dir), &mut files);
    }
    assert!(files.len() > 200, "only {} source files found", files.len());
    let mut problems = vec![];
    for f in &files {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let lines = text.lines().count();
        if lines > LIMIT && !listed.contains_key(f) {
            problems.push(format!(
                "{f}: {lines} lines (split it by idea, or list it with a reason)"
            ));
        }
    }
    for path in listed.keys() {
        match std::fs::read_to_string(root.join(path)) {
            Err(_) => problems.push(format!("{path}: listed as an exception but does not exist")),
            Ok(t) if t.lines().count() <= LIMIT => problems.push(format!(
                "{path}: listed as an exception but has {} lines; remove the entry",
                t.lines().count()
            )),
            Ok(_) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "over {LIMIT} lines:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_exceptions_file_refuses_a_line_without_a_reason() {
    let ok = exceptions("# comment\n\na/b.rs — a table of test vectors\n");
    assert_eq!(ok.len(), 1);
    let bad = std::panic::catch_unwind(|| exceptions("a/b.rs\n"));
    assert!(bad.is_err());
    let short = std::panic::catch_unwind(|| exceptions("a/b.rs — big\n"));
    assert!(short.is_err());
}
