//! terse-train's top-level modules are layers, not only folders: ARCHITECTURE.md lists them
//! bottom first (the numbered list of the `crates/train` section), and a module may name
//! (`crate::x`) only modules of the layers before its own. A new upward or sideways import, or a
//! top-level module the list does not place, fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layer of each top-level module, from ARCHITECTURE.md's numbered list under the
/// `crates/train` heading: each backticked `x.rs` or `x/` that is a top-level module of `src`
/// belongs to the first item naming it (later mentions, and the files inside a folder, are
/// descriptions).
fn layers(map: &str, src: &Path) -> BTreeMap<String, usize> {
    let start = map
        .find("### `crates/train`")
        .expect("ARCHITECTURE.md has a crates/train section");
    let section = &map[start..];
    let section = &section[..section[4..].find("\n### ").map_or(section.len(), |i| i + 4)];
    let mut out = BTreeMap::new();
    let mut layer = 0;
    for line in section.lines() {
        let item = line
            .split_once(". ")
            .filter(|(n, _)| n.parse::<usize>().is_ok());
        let text = match item {
            Some((n, rest)) => {
                layer = n.parse().expect("a number");
                rest
            }
            // An item's continuation lines are indented; anything else ends the list.
            None if layer > 0 && line.starts_with("   ") => line,
            None => {
                if layer > 0 {
                    break;
                }
                continue;
            }
        };
        for (i, tok) in text.split('`').enumerate() {
            let name = tok.strip_suffix(".rs").or_else(|| tok.strip_suffix('/'));
            let Some(name) = name.filter(|_| i % 2 == 1) else {
                continue;
            };
            let is_module = src.join(format!("{name}.rs")).is_file() || src.join(name).is_dir();
            if is_module && !name.contains('/') {
                out.entry(name.to_string()).or_insert(layer);
            }
        }
    }
    out
}

/// The top-level modules of `src` (lib.rs aside) with their files: `x.rs`, and `x/` recursively.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("a folder").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(src).expect("src").flatten() {
        let p = e.path();
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if stem == "lib" || stem.ends_with("_tests") {
            continue;
        }
        let files = out.entry(stem.to_string()).or_default();
        if p.is_dir() {
            walk(&p, files);
        } else {
            files.push(p);
        }
    }
    out
}

/// The top-level modules a file's code names as `crate::x` or in `crate::{x, y::z}`; tests
/// (`*_tests.rs` files and what follows `#[cfg(test)]`) may reach anywhere.
fn imports(path: &Path) -> Vec<String> {
    if path.to_string_lossy().ends_with("_tests.rs") {
        return vec![];
    }
    let text = std::fs::read_to_string(path).expect("a source file");
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = vec![];
    for (i, part) in code.split("crate::").enumerate().skip(1) {
        // `crate::` inside a longer path (`terse_train::crate::` cannot be) or a comment: the
        // text before it decides. Comments are skipped line by line.
        let before = code.split("crate::").nth(i - 1).unwrap_or_default();
        let line_start = before.rsplit('\n').next().unwrap_or_default();
        if line_start.trim_start().starts_with("//") {
            continue;
        }
        match part.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                out.extend(group.split(',').map(ident).filter(|s| !s.is_empty()));
            }
            None => out.push(ident(part)),
        }
    }
    out
}

/// Every import that breaks the layering, as "from -> to (file)", and every module the list
/// does not place.
fn violations(src: &Path, map: &str) -> Vec<String> {
    let layer = layers(map, src);
    let mods = modules(src);
    let mut out = vec![];
    for (m, files) in &mods {
        let Some(&own) = layer.get(m) else {
            out.push(format!("`{m}` is in no layer of ARCHITECTURE.md"));
            continue;
        };
        for f in files {
            for to in imports(f) {
                let Some(&theirs) = layer.get(&to).filter(|_| mods.contains_key(&to)) else {
                    continue; // not a top-level module (a macro, `crate::Error`, ...)
                };
                if to != *m && theirs >= own {
                    let f = f.strip_prefix(src).unwrap_or(f).display();
                    out.push(format!("{m} (layer {own}) -> {to} (layer {theirs}) in {f}"));
                }
            }
        }
    }
    out
}

#[test]
fn terse_train_imports_only_from_lower_layers() {
    let root = crate::train::repo("");
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let src = root.join("crates/train/src");
    let placed = layers(&map, &src);
    // The check is only as good as the list it reads: every layer has a module.
    assert!(placed.len() >= 12, "{placed:?}");
    let v = violations(&src, &map);
    assert!(
        v.is_empty(),
        "imports against the layers:\n{}",
        v.join("\n")
    );
}

#[test]
fn the_layer_check_sees_an_upward_import_and_an_unplaced_module() {
    let dir = crate::scratch("layers_check");
    let src = dir.as_path();
    std::fs::create_dir_all(src.join("step")).expect("mkdir");
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("write");
    write("config.rs", "pub struct C;\n");
    write("step/mod.rs", "use crate::config::C;\nmod x;\n");
    write("step/x.rs", "// crate::run is only a comment\n");
    write("run.rs", "use crate::{config, step::x};\n");
    let map = "### `crates/train` (terse-train)\n\n1. `config.rs`\n2. `step/`: `x.rs`\n3. `run.rs`\n\n### next\n";
    assert_eq!(violations(src, map), Vec::<String>::new());
    // An upward import planted in a lower layer, and a module the list does not name.
    write("step/x.rs", "fn f() { crate::run::g() }\n");
    write("extra.rs", "\n");
    let v = violations(src, map);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].contains("`extra` is in no layer"), "{v:?}");
    assert!(v[1].contains("step (layer 2) -> run (layer 3)"), "{v:?}");
    // A sideways import within a layer is refused too.
    let same =
        "### `crates/train` (terse-train)\n\n1. `config.rs`\n2. `step/`, `run.rs`, `extra.rs`\n";
    let v = violations(src, same);
    assert!(
        v.iter()
            .any(|s| s.contains("run (layer 2) -> step (layer 2)")),
        "{v:?}"
    );
}
