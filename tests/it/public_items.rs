//! Every public item each library crate makes reachable from its root, listed in
//! docs/public-items.txt: the module-level `pub` items of every `pub mod` (followed into its
//! file, or its inline body), `pub use` leaves (a re-exported module is followed too), and
//! `#[macro_export]` macros; test code and `pub(crate)` items are not reachable. A `pub` item
//! added anywhere a library user can reach fails here until the list says so (regenerate it
//! with `TERSE_BLESS=1 cargo test --test it public_items`, and say in docs/library.md whether the
//! item is for users), so the API grows on purpose. terse-train's façade is also checked
//! item by item against docs/library.md from this list (public_surface.rs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The crates whose public items are listed: every library crate of the workspace.
const CRATES: [&str; 10] = [
    "dist", "model", "optim", "reward", "rollout", "simt", "study", "tasks", "train", "fuzz",
];

/// `text` with comments and the contents of string and char literals blanked (kept as spaces,
/// so offsets stay), which leaves braces, `pub` and `;` only where they are code.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        let next = c.get(i + 1).copied().unwrap_or('\0');
        if c[i] == '/' && next == '/' {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && next == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                    continue;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == 'r' && (next == '"' || next == '#') && !is_ident(c.get(i.wrapping_sub(1)))
        {
            // A raw string r"..", r#".."#.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            let rest: String = c[j + 1..].iter().collect();
            let end = j
                + 1
                + rest
                    .find(&close)
                    .map_or(rest.chars().count(), |b| rest[..b].chars().count());
            for &ch in &c[i..(end + close.len()).min(c.len())] {
                blank(&mut out, ch);
            }
            i = end + close.len();
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' && (next == '\\' || c.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote there.
            let start = i;
            i += if next == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            for &ch in &c[start..=i.min(c.len() - 1)] {
                blank(&mut out, ch);
            }
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

fn ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The file of module `name` declared in `dir` (its parent's folder): `name.rs` or
/// `name/mod.rs`; and the folder its own submodules live in.
fn module_file(dir: &Path, name: &str) -> Option<(PathBuf, PathBuf)> {
    let flat = dir.join(format!("{name}.rs"));
    let nested = dir.join(name).join("mod.rs");
    if flat.is_file() {
        Some((flat, dir.join(name)))
    } else if nested.is_file() {
        Some((nested, dir.join(name)))
    } else {
        None
    }
}

/// A `pub use` path inside the crate (`crate::a::b`, `a::b` from the root's folder) that names a
/// module with a file: that file and its folder.
fn used_module(src: &Path, dir: &Path, path: &str) -> Option<(PathBuf, PathBuf)> {
    let segs: Vec<&str> = path.split("::").map(str::trim).collect();
    let (mut at, segs) = match segs.first() {
        Some(&"crate") => (src.to_path_buf(), &segs[1..]),
        Some(&"self") => (dir.to_path_buf(), &segs[1..]),
        _ => (dir.to_path_buf(), &segs[..]),
    };
    let mut found = None;
    for s in segs {
        let (file, sub) = module_file(&at, s)?;
        at = sub;
        found = Some((file, at.clone()));
    }
    found
}

/// The `pub use` tree's leaves with their full paths: `a::{b, c as d}` -> (a::b, b), (a::c, d).
fn use_leaves(tree: &str, prefix: &str, out: &mut Vec<(String, String)>) {
    let t = tree.trim();
    match t.find('{') {
        Some(open) if t.ends_with('}') => {
            let base = format!("{prefix}{}", &t[..open]);
            let inner = &t[open + 1..t.len() - 1];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        use_leaves(&inner[start..i], &base, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            use_leaves(&inner[start..], &base, out);
        }
        _ if t.is_empty() => {}
        _ => {
            let (path, name) = match t.split_once(" as ") {
                Some((p, alias)) => (p.trim(), alias.trim()),
                None => (t, t.rsplit("::").next().unwrap_or(t)),
            };
            let full = format!("{prefix}{path}")
                .split_whitespace()
                .collect::<String>();
            out.push((full, name.to_string()));
        }
    }
}

/// The public items of one module's code (`text`, already `code_only`), as `path::name kind`.
fn module_items(src: &Path, dir: &Path, text: &str, path: &str, out: &mut BTreeSet<String>) {
    let b = text.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    let mut attrs = String::new();
    while i < b.len() {
        if !text.is_char_boundary(i) {
            i += 1;
            continue;
        }
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                // A private item's body ends: its attributes are not the next item's.
                if depth == 0 {
                    attrs.clear();
                }
            }
            b'#' if depth == 0 && b.get(i + 1) == Some(&b'[') => {
                let end = text[i..].find(']').map_or(b.len(), |e| i + e);
                attrs.push_str(&text[i..=end.min(b.len() - 1)]);
                i = end + 1;
                continue;
            }
            b';' if depth == 0 => attrs.clear(),
            _ if depth == 0 && text[i..].starts_with("macro_rules!") => {
                if attrs.contains("macro_export") {
                    let name = ident(&text[i + "macro_rules!".len()..]);
                    out.insert(format!(
                        "{}::{name} macro",
                        path.split("::").next().unwrap_or(path)
                    ));
                }
                attrs.clear();
            }
            _ if depth == 0
                && text[i..].starts_with("pub ")
                && !is_ident(text[..i].chars().last().as_ref()) =>
            {
                let test_only = attrs.contains("cfg(test)");
                attrs.clear();
                let mut rest = &text[i + 4..];
                for q in ["unsafe ", "async ", "extern \"C\" ", "const fn"] {
                    if let Some(r) = rest.trim_start().strip_prefix(q) {
                        rest = if q == "const fn" {
                            &rest.trim_start()[6..]
                        } else {
                            r
                        };
                    }
                }
                let rest = rest.trim_start();
                let kind = ident(rest);
                let after = &rest[kind.len()..];
                let start = text.len() - after.len();
                if test_only {
                    i = start;
                    continue;
                }
                match kind.as_str() {
                    "use" => {
                        let end = after.find(';').expect("a `pub use` ends with `;`");
                        let mut leaves = vec![];
                        use_leaves(&after[..end], "", &mut leaves);
                        for (full, name) in leaves {
                            // A glob brings the module's items into this one.
                            let (module, at) = match full.strip_suffix("::*") {
                                Some(m) => (m.to_string(), path.to_string()),
                                None => (full.clone(), format!("{path}::{name}")),
                            };
                            match used_module(src, dir, &module) {
                                Some((file, sub)) => walk_file(src, &sub, &file, &at, out),
                                None => {
                                    out.insert(format!("{path}::{name} use"));
                                }
                            }
                        }
                        i = start + end;
                        continue;
                    }
                    "mod" => {
                        let name = ident(after);
                        let tail = after.trim_start()[name.len()..].trim_start();
                        let sub = format!("{path}::{name}");
                        out.insert(format!("{sub} mod"));
                        if tail.starts_with(';') {
                            if let Some((file, folder)) = module_file(dir, &name) {
                                walk_file(src, &folder, &file, &sub, out);
                            }
                        } else if tail.starts_with('{') {
                            // An inline module: its body, then on past it.
                            let open = start + after.find('{').expect("a body");
                            let mut d = 0;
                            let mut close = open;
                            for (k, ch) in text[open..].char_indices() {
                                match ch {
                                    '{' => d += 1,
                                    '}' => {
                                        d -= 1;
                                        if d == 0 {
                                            close = open + k;
                                            break;
                                        }
                                    }
                                    _ => {}
                                }
                            }
                            module_items(src, &dir.join(&name), &text[open + 1..close], &sub, out);
                            i = close + 1;
                            continue;
                        }
                    }
                    "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" => {
                        out.insert(format!("{path}::{} {kind}", ident(after)));
                    }
                    _ => {} // `pub(crate)`, `pub(super)`: not reachable.
                }
                i = start;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

fn walk_file(src: &Path, dir: &Path, file: &Path, path: &str, out: &mut BTreeSet<String>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    module_items(src, dir, &code_only(&text), path, out);
}

/// Every reachable public item of the workspace's library crates, one per line.
fn public_items(root: &Path) -> Vec<String> {
    let mut out = vec![];
    for c in CRATES {
        let src = root.join("crates").join(c).join("src");
        let mut items = BTreeSet::new();
        walk_file(
            &src,
            &src,
            &src.join("lib.rs"),
            &format!("terse_{c}"),
            &mut items,
        );
        out.extend(items);
    }
    out
}

#[test]
fn public_items_are_the_listed_ones() {
    let root = crate::train::repo("");
    let list = root.join("docs/public-items.txt");
    let now = public_items(&root).join("\n") + "\n";
    if std::env::var("TERSE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&list, &now).expect("writing docs/public-items.txt");
    }
    let listed = std::fs::read_to_string(&list).unwrap_or_default();
    let (a, b): (BTreeSet<&str>, BTreeSet<&str>) =
        (now.lines().collect(), listed.lines().collect());
    let mut diff: Vec<String> = a
        .difference(&b)
        .map(|l| format!("+ {l} (public, not listed)"))
        .collect();
    diff.extend(
        b.difference(&a)
            .map(|l| format!("- {l} (listed, no longer public)")),
    );
    assert!(
        diff.is_empty(),
        "the public API differs from docs/public-items.txt (accept with TERSE_BLESS=1 cargo test --test it public_items, and say in docs/library.md whether it is for users):\n{}",
        diff.join("\n")
    );
    // The walk reaches into modules, groups and re-exported modules.
    for item in [
        "terse_train::step::gradients use",
        "terse_train::config::RunConfig struct",
        "terse_model::sample::sample_rows fn",
        "terse_model::fail macro",
    ] {
        assert!(a.contains(item), "{item} not found");
    }
}

#[test]
fn a_planted_public_item_is_seen_and_private_ones_are_not() {
    let dir = crate::scratch("public_items_check");
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("inner")).expect("mkdir");
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("write");
    write(
        "lib.rs",
        "pub mod a;\nmod inner;\npub use inner::{deep, Hidden as Shown};\n#[cfg(test)]\npub mod t;\n",
    );
    write(
        "a.rs",
        "pub fn f() { let s = \"pub fn not_code() {\"; }\npub(crate) fn g() {}\nimpl X { pub fn method() {} }\n",
    );
    write("inner/mod.rs", "pub mod deep;\npub struct Hidden;\n");
    write("inner/deep.rs", "pub const C: u8 = b'}';\n");
    let walk = || {
        let mut items = BTreeSet::new();
        walk_file(&src, &src, &src.join("lib.rs"), "k", &mut items);
        items.into_iter().collect::<Vec<_>>()
    };
    assert_eq!(
        walk(),
        ["k::Shown use", "k::a mod", "k::a::f fn", "k::deep::C const"],
        "{:?}",
        walk()
    );
    write("a.rs", "pub fn f() {}\npub fn planted() {}\n");
    assert!(
        walk().contains(&"k::a::planted fn".to_string()),
        "{:?}",
        walk()
    );
}

/// The settings types that may grow are built as docs/library.md shows ("Types that can
/// grow"): a constructor or `Default`, then fields; here from outside their crates, as research
/// code builds them.
#[test]
fn growable_settings_build_from_constructors_and_fields() {
    let mut gen = terse_rollout::GenParams::new(512);
    gen.sampling.temperature = 0.6;
    gen.paging.kv_budget = terse_rollout::KvBudget::Gib(4.0);
    assert_eq!(gen.max_new_tokens, 512);
    assert!(gen.eos_ids.is_empty() && gen.step_exit.is_none());
    let mut ppo = terse_train::step::PpoParams::default();
    ppo.clip_high = 0.28;
    assert_eq!(
        ppo.clip_low,
        terse_train::config::GrpoSection::default().clip_low
    );
    let mut adv = terse_reward::Advantage::grpo(true, 1, 1e-6);
    assert_eq!(adv, terse_reward::Advantage::default());
    if let terse_reward::Advantage::Grpo { norm, .. } = &mut adv {
        *norm = terse_reward::Norm::Batch;
    }
    assert_ne!(adv, terse_reward::Advantage::default());
    let mut fwd = terse_model::ForwardOptions::default();
    fwd.checkpoint_layers = true;
    assert!(fwd.flash && fwd.checkpoint_layers);
}
