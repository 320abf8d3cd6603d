//! ARCHITECTURE.md stays true: it is short (at most 300 lines), and every path and Rust
//! identifier it names in backticks exists in the repository, so a rename or a move that
//! forgets the map fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The map's length limit (issue 44: a bird's-eye view, not a manual).
const MAX_LINES: usize = 300;

/// Every `.rs` file under `dir`, target/ and .git/ aside.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() {
            if !["target", ".git", "runs"].contains(&name) {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// The names the workspace's Rust code defines: items (fn, struct, enum, trait, type, const,
/// static, mod, macro), enum variants and struct fields (a line `Name,` / `Name(` / `Name {`
/// / `name:` at the start), so the map may name any of them.
pub(crate) fn defined_names(root: &Path) -> BTreeSet<String> {
    let mut files = vec![];
    for d in ["crates", "xtask", "tests"] {
        rust_files(&root.join(d), &mut files);
    }
    let mut names = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for line in text.lines() {
            // Qualifiers before the keyword: visibility, `unsafe`, `async`, `const fn`.
            let mut t = line.trim_start();
            loop {
                let next = ["pub(crate) ", "pub(super) ", "pub ", "unsafe ", "async "]
                    .iter()
                    .find_map(|q| t.strip_prefix(q))
                    .or_else(|| t.strip_prefix("const ").filter(|r| r.starts_with("fn ")));
                match next {
                    Some(r) => t = r,
                    None => break,
                }
            }
            for kw in [
                "fn ",
                "struct ",
                "enum ",
                "trait ",
                "type ",
                "const ",
                "static ",
                "mod ",
                "macro_rules! ",
            ] {
                if let Some(rest) = t.strip_prefix(kw) {
                    names.insert(ident(rest));
                }
            }
            // Variants and fields: a leading identifier followed by `,` `(` `{` or `:`.
            let head = ident(t);
            if !head.is_empty() {
                let after = t[head.len()..].trim_start();
                if after.starts_with(',')
                    || after.starts_with('(')
                    || after.starts_with('{')
                    || (after.starts_with(':') && !after.starts_with("::"))
                {
                    names.insert(head);
                }
            }
        }
    }
    // The workspace's crates, as Rust code names them.
    for c in [
        "terse_model",
        "terse_reward",
        "terse_rollout",
        "terse_tasks",
        "terse_train",
    ] {
        names.insert(c.to_string());
    }
    for c in [
        "terse_optim",
        "terse_dist",
        "terse_simt",
        "terse_fuzz",
        "terse_study",
        "xtask",
    ] {
        names.insert(c.to_string());
    }
    names
}

/// Every file and folder of the repository as a path relative to the root (target/, .git/
/// and runs/ aside).
pub(crate) fn repo_paths(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if ["target", ".git", "runs"].contains(&name) {
            continue;
        }
        let rel = p
            .strip_prefix(root)
            .unwrap_or(&p)
            .to_string_lossy()
            .to_string();
        out.push(rel);
        if p.is_dir() {
            repo_paths(root, &p, out);
        }
    }
}

/// Does `tok` name a file or folder? The map names a file by its path from the root, or
/// relative to the folder its bullet is about (`kernels/` then `rmsnorm.rs`): so a token
/// resolves when some path of the repository, under the section's folder when it has one,
/// ends with it.
fn resolve(paths: &[String], section: &[String], tok: &str) -> bool {
    let tok = tok.trim_end_matches('/');
    let tok = tok.split(':').next().unwrap_or(tok); // `file.rs:LINE`
    paths.iter().any(|p| {
        let under = section.is_empty() || section.iter().any(|s| p.starts_with(s.as_str()));
        p == tok || (p.ends_with(&format!("/{tok}")) && under)
    })
}

pub(crate) const EXTENSIONS: [&str; 12] = [
    ".rs", ".md", ".toml", ".cu", ".cuh", ".h", ".cpp", ".sh", ".py", ".json", ".map", ".txt",
];

pub(crate) fn looks_like_path(tok: &str) -> bool {
    !tok.contains(' ')
        && !tok.starts_with("//")
        && !tok.starts_with('.')
        && !tok.contains("::")
        && !tok.starts_with('-')
        && !tok.starts_with('<')
        && !tok.contains('*')
        && !tok.contains('<')
        && (tok.contains('/') || EXTENSIONS.iter().any(|e| tok.ends_with(e)))
}

/// A Rust path or call: `A::b`, `name()`, or a CamelCase type name.
pub(crate) fn rust_segments(tok: &str) -> Option<Vec<&str>> {
    let bare = tok.trim_end_matches("()");
    let is_ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_alphanumeric() || c == '_')
            && !s.chars().next().is_some_and(|c| c.is_ascii_digit())
    };
    let segs: Vec<&str> = bare.split("::").collect();
    if !segs.iter().all(|s| is_ident(s)) {
        return None;
    }
    let camel = segs.len() == 1
        && bare.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && bare.chars().any(|c| c.is_ascii_lowercase())
        && !bare.contains('_');
    (segs.len() > 1 || tok.ends_with("()") || camel).then_some(segs)
}

/// Every backticked token of the map, with the folders of the `###` section it is in (none
/// under a `##` heading).
fn tokens(text: &str) -> Vec<(Vec<String>, String)> {
    let mut section: Vec<String> = vec![];
    let mut out = vec![];
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            // "### `kernels/`, `crates/simt` (terse-simt)": names resolve under those folders.
            section = h
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.trim_end_matches('/').to_string())
                .filter(|s| s.contains('/') || !s.contains(' '))
                .collect();
        } else if line.starts_with("## ") {
            section.clear();
        }
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 1 {
                out.push((section.clone(), part.to_string()));
            }
        }
    }
    out
}

#[test]
fn architecture_md_is_short_and_names_only_what_exists() {
    let root = crate::train::repo("");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let lines = text.lines().count();
    assert!(
        lines <= MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, over {MAX_LINES}"
    );
    let names = defined_names(&root);
    let mut paths_of_repo = vec![];
    repo_paths(&root, &root, &mut paths_of_repo);
    let mut missing = vec![];
    let (mut paths, mut idents) = (0, 0);
    for (section, tok) in tokens(&text) {
        if looks_like_path(&tok) {
            paths += 1;
            if !resolve(&paths_of_repo, &section, &tok) {
                missing.push(format!("path `{tok}` (under {section:?})"));
            }
        } else if let Some(segs) = rust_segments(&tok) {
            idents += 1;
            for s in segs {
                if !names.contains(s) && !["crate", "self", "super", "Self"].contains(&s) {
                    missing.push(format!("identifier `{tok}`: no definition of `{s}`"));
                }
            }
        }
    }
    // The check is only as good as what it reads: the map names many of both.
    assert!(
        paths >= 40 && idents >= 20,
        "{paths} paths, {idents} identifiers"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_name_check_sees_a_missing_path_and_a_missing_identifier() {
    let root = crate::train::repo("");
    let names = defined_names(&root);
    let mut paths = vec![];
    repo_paths(&root, &root, &mut paths);
    assert!(looks_like_path("crates/model/src/no_such_file.rs"));
    assert!(!resolve(&paths, &[], "crates/model/src/no_such_file.rs"));
    assert!(resolve(&paths, &["crates/model".into()], "Cargo.toml"));
    assert!(resolve(
        &paths,
        &["crates/model".into()],
        "kernels/rmsnorm.rs"
    ));
    // A name that exists elsewhere is not found under another section's folder.
    assert!(!resolve(&paths, &["crates/optim".into()], "rmsnorm.rs"));
    let segs = rust_segments("GrpoTrainer::no_such_method").expect("a rust path");
    assert!(names.contains(segs[0]), "GrpoTrainer is defined");
    assert!(!names.contains(segs[1]));
    assert_eq!(rust_segments("cargo xtask train"), None);
}
