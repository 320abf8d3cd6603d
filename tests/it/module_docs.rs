//! Every `//!` module doc of the workspace's Rust code (crates/, xtask/, tests/) names only files
//! and Rust items that exist, so a move or a rename that forgets a doc fails here, as
//! architecture.rs does for ARCHITECTURE.md. A doc names a file in backticks
//! (`crates/train/src/load.rs`, `kernels/`) or in prose (architecture.rs, crates/model/build.rs),
//! and a Rust item in backticks (`GrpoTrainer`, `decode::paged::step`, `train()`).

use crate::architecture::{defined_names, looks_like_path, rust_files, rust_segments};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Files the docs cite from other projects: Logic-RL's scorer, which crates/tasks/src/kk.rs
/// reproduces.
const ELSEWHERE: [&str; 1] = ["kk.py"];

/// The extensions of a file name written in prose, without backticks.
const PROSE_EXTENSIONS: [&str; 7] = [".rs", ".cu", ".cuh", ".md", ".toml", ".sh", ".py"];

/// What a doc's names are checked against.
struct Workspace {
    root: PathBuf,
    /// Items the workspace defines, and the names its `use` lines import from dependencies
    /// (candle's `CustomOp2`): a stale name is neither.
    names: BTreeSet<String>,
    /// The string literals without spaces of crates/ and xtask/: the files a program writes or
    /// reads (`config.toml`, results.md) and the texts it emits (`Wait`), which a doc may name.
    literals: BTreeSet<String>,
}

fn workspace() -> Workspace {
    let root = crate::train::repo("");
    let mut names = defined_names(&root);
    let mut literals = BTreeSet::new();
    for f in workspace_files(&root) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        // The programs' literals: tests/ write synthetic files ("run.rs") and plant stale names.
        let own = f.starts_with(root.join("tests"));
        for line in text.lines() {
            let t = line.trim_start();
            if let Some(rest) = t
                .strip_prefix("use ")
                .or_else(|| t.strip_prefix("pub use "))
            {
                let words = rest.split(|c: char| !(c.is_alphanumeric() || c == '_'));
                names.extend(words.filter(|w| !w.is_empty()).map(String::from));
            }
            // Quotes pair within a line; a char literal '"' may pair wrongly, adding noise only.
            for (i, lit) in line.split('"').enumerate() {
                if i % 2 == 1 && !own && !lit.is_empty() && !lit.contains(char::is_whitespace) {
                    literals.insert(lit.to_string());
                }
            }
        }
    }
    Workspace {
        root,
        names,
        literals,
    }
}

/// Every Rust file of the workspace: crates/, xtask/ and tests/ (build scripts, examples and
/// tests included).
fn workspace_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for d in ["crates", "xtask", "tests"] {
        rust_files(&root.join(d), &mut files);
    }
    files.sort();
    files
}

/// A file's module doc: the `//!` lines it opens with (comments, attributes and blank lines
/// among them), without the fenced code blocks (doctests, which the compiler checks).
fn module_doc(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        let Some(doc) = t.strip_prefix("//!") else {
            if t.is_empty() || t.starts_with("//") || t.starts_with("#!") {
                continue;
            }
            break;
        };
        if doc.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(doc);
            out.push('\n');
        }
    }
    out
}

/// One name a doc uses.
#[derive(Debug, PartialEq)]
enum Named {
    /// A backticked path: `load.rs`, `kernels/flash/`.
    Path(String),
    /// A backticked Rust item or path: `Qwen3::layer`, `train()`, `Observer`.
    Item(String),
    /// A file name in prose: start.rs, crates/train/src/report.rs.
    Prose(String),
}

/// Every name of a module doc: backticked paths and Rust paths, and file names in its prose.
fn names_in(doc: &str) -> Vec<Named> {
    let mut out = vec![];
    for (i, part) in doc.split('`').enumerate() {
        if i % 2 == 1 {
            if part.contains(char::is_whitespace) {
                continue;
            }
            // A path names a file or folder: a fraction (`1/3`) has no letter.
            if looks_like_path(part) && part.contains(|c: char| c.is_ascii_alphabetic()) {
                out.push(Named::Path(part.to_string()));
            } else if rust_segments(part).is_some() {
                out.push(Named::Item(part.to_string()));
            }
            continue;
        }
        for word in part.split_whitespace() {
            if let Some(f) = prose_file(word) {
                out.push(Named::Prose(f.to_string()));
            }
        }
    }
    out
}

/// The file name a prose word is, if it is one: "(report.rs," and "tensorboard.rs's" are;
/// "$OUT_DIR/ptx.rs" (a generated path), "kernels/*.cu" (a pattern) and ".rs" are not.
fn prose_file(word: &str) -> Option<&str> {
    let punct = |c: char| "()[]{}\"',.;:!?".contains(c);
    let w = word.trim_matches(punct);
    let w = w.strip_suffix("'s").unwrap_or(w).trim_end_matches(punct);
    let ext = PROSE_EXTENSIONS.iter().find(|e| w.ends_with(**e))?;
    let stem = &w[..w.len() - ext.len()];
    let plain = w
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
    let named = stem
        .chars()
        .last()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    (plain && named).then_some(w)
}

/// The folders a doc's file names are relative to: the file's own folder, its crate's src/ and
/// the crate's folder, the repository root, and kernels/ (the CUDA sources, named bare as
/// flash_fa2.cu all over the workspace).
fn bases(ws: &Workspace, file: &Path) -> Vec<PathBuf> {
    let rel = file.strip_prefix(&ws.root).unwrap_or(file);
    let parts: Vec<_> = rel.components().map(|c| c.as_os_str()).collect();
    let krate = match parts.first().and_then(|p| p.to_str()) {
        Some("crates") if parts.len() > 2 => ws.root.join("crates").join(parts[1]),
        Some(top) => ws.root.join(top),
        None => ws.root.clone(),
    };
    let own = file.parent().map_or(ws.root.clone(), Path::to_path_buf);
    vec![
        own,
        krate.join("src"),
        krate,
        ws.root.clone(),
        ws.root.join("kernels"),
    ]
}

fn resolves(ws: &Workspace, file: &Path, name: &str) -> bool {
    if ws.literals.contains(name) || ELSEWHERE.contains(&name) {
        return true;
    }
    let path = name.trim_end_matches('/');
    let path = path.split(':').next().unwrap_or(path); // `file.rs:LINE`
    bases(ws, file).iter().any(|b| b.join(path).exists())
}

/// What a module doc of `file` names that does not exist, one line each.
fn problems(ws: &Workspace, file: &Path, doc: &str) -> Vec<String> {
    let rel = file.strip_prefix(&ws.root).unwrap_or(file).display();
    let mut out = vec![];
    for named in names_in(doc) {
        match named {
            Named::Path(p) | Named::Prose(p) if !resolves(ws, file, &p) => {
                out.push(format!(
                    "{rel}: `{p}` is no file (from its folder, crate or root)"
                ));
            }
            // A one-word item may be a text the code emits (`Wait`), never a path of items.
            Named::Item(item) if item.contains("::") || !ws.literals.contains(&item) => {
                for seg in rust_segments(&item).unwrap_or_default() {
                    if !ws.names.contains(seg) && !["crate", "self", "super", "Self"].contains(&seg)
                    {
                        out.push(format!("{rel}: `{item}`: nothing defines `{seg}`"));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_module_doc_names_only_files_and_items_that_exist() {
    let ws = workspace();
    let (mut docs, mut names) = (0, 0);
    let mut missing = vec![];
    for f in workspace_files(&ws.root) {
        let doc = module_doc(&std::fs::read_to_string(&f).expect("a workspace file"));
        if doc.trim().is_empty() {
            continue;
        }
        docs += 1;
        names += names_in(&doc).len();
        missing.extend(problems(&ws, &f, &doc));
    }
    // The check is only as good as what it reads: every file opens with a `//!` line (the
    // standards), and the docs name several hundred files and items.
    assert!(
        docs >= 250 && names >= 400,
        "{docs} module docs, {names} names"
    );
    assert!(
        missing.is_empty(),
        "{} stale names in module docs:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn the_module_doc_check_sees_a_stale_file_and_a_missing_identifier() {
    let ws = workspace();
    let file = ws.root.join("crates/train/src/step/trainer.rs");
    let planted = "\
//! Called by the loop in run.rs (`run/load.rs`), see `GrpoTrainer::no_such_method` and
//! `NoSuchTrainer`.
//! ```
//! let not_checked = \"gone.rs\";
//! ```
";
    let doc = module_doc(planted);
    assert!(!doc.contains("gone.rs"), "fenced code is left out");
    let got = problems(&ws, &file, &doc);
    for stale in [
        "`run.rs`",
        "`run/load.rs`",
        "`no_such_method`",
        "`NoSuchTrainer`",
    ] {
        assert!(
            got.iter().any(|p| p.contains(stale)),
            "{stale} not seen: {got:#?}"
        );
    }
    assert_eq!(got.len(), 4, "{got:#?}");
    // What is true resolves: relative to the file's folder, its crate's src/, the root and
    // kernels/; literals the code writes; placeholders and generated paths are no names.
    let fine = "//! trainer.rs, step/collect.rs, `load.rs`, crates/reward/src/shaper.rs, \
                flash_fa2.cu's, `Cargo.toml`, `<run>/config.toml`, results.md, $OUT_DIR/ptx.rs, \
                `1/3`, `GrpoTrainer::step`, `train()`, `Wait`, `CustomOp2`.\n";
    let doc = module_doc(fine);
    assert_eq!(problems(&ws, &file, &doc), Vec::<String>::new());
    assert_eq!(
        names_in("x (report.rs, tensorboard.rs's flattening) and `Qwen3` in kernels/*.cu"),
        [
            Named::Prose("report.rs".into()),
            Named::Prose("tensorboard.rs".into()),
            Named::Item("Qwen3".into()),
        ]
    );
}
