//! terse-train's public surface is the façade of its lib.rs, and docs/library.md names every
//! item of it: a `pub` item added to lib.rs (a `pub mod`, a `pub use`, a `pub fn`, ...) that
//! the page does not list fails here, and so does a listed item lib.rs no longer has. The
//! façade's own modules (`pub mod config;` ...) are listed by name; a façade group written in
//! lib.rs (`pub mod step { pub use ... }`) lists each of its items as `group::item`.

use std::collections::BTreeSet;

/// `text` without `//` comments (lib.rs has no string holding `//`).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names a `use` tree brings in: `a::b::{c, d as e, f::{g}}` -> c, e, g (public_items.rs
/// splits the tree; this keeps the names).
fn use_leaves(tree: &str) -> Vec<String> {
    let mut out = vec![];
    crate::public_items::use_leaves(tree, "", &mut out);
    out.into_iter().map(|(_, name)| name).collect()
}

/// The public items one scope's text declares (nested `{ .. }` bodies of inline modules are
/// handled by the caller): `pub use` leaves and `pub fn|struct|enum|trait|type|const|static`.
fn scope_items(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(i) = rest.find("pub use ") {
        let after = &rest[i + "pub use ".len()..];
        let end = after.find(';').expect("a `pub use` ends with `;`");
        out.extend(use_leaves(&after[..end]));
        rest = &after[end..];
    }
    for kw in ["fn", "struct", "enum", "trait", "type", "const", "static"] {
        let pat = format!("pub {kw} ");
        let mut rest = text;
        while let Some(i) = rest.find(&pat) {
            let after = &rest[i + pat.len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
            rest = after;
        }
    }
    out
}

/// Every public name lib.rs gives, façade groups' items as `group::item`.
fn lib_surface(lib: &str) -> BTreeSet<String> {
    let mut text = strip_comments(lib);
    let mut names = BTreeSet::new();
    // Inline groups first (cut out of the text), then the crate root.
    let inline_group = |text: &str| {
        text.match_indices("pub mod ").map(|(i, _)| i).find(|&i| {
            let line_end = text[i..].find('\n').map_or(text.len(), |e| i + e);
            text[i..line_end].trim_end().ends_with('{')
        })
    };
    while let Some(i) = inline_group(&text) {
        let header_end = i + text[i..].find('{').expect("a group's body");
        let group = text[i + "pub mod ".len()..header_end].trim().to_string();
        let mut depth = 0;
        let mut close = header_end;
        for (k, c) in text[header_end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = header_end + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        names.insert(group.clone());
        for item in scope_items(&text[header_end + 1..close]) {
            names.insert(format!("{group}::{item}"));
        }
        text.replace_range(i..=close, "");
    }
    for line in text.lines() {
        let l = line.trim();
        if let Some(m) = l.strip_prefix("pub mod ") {
            names.insert(m.trim_end_matches(';').trim().to_string());
        }
    }
    names.extend(scope_items(&text));
    names
}

/// The names docs/library.md lists under "## Public items of terse-train": each list entry's
/// first `code` span.
fn documented(page: &str) -> BTreeSet<String> {
    let section = page
        .split("\n## ")
        .find(|s| s.starts_with("Public items of terse-train"))
        .expect("docs/library.md has a \"## Public items of terse-train\" section");
    section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

fn differences(lib: &BTreeSet<String>, docs: &BTreeSet<String>) -> Vec<String> {
    let mut out: Vec<String> = lib
        .difference(docs)
        .map(|n| {
            format!(
                "`{n}` is public in crates/train/src/lib.rs but docs/library.md does not list it"
            )
        })
        .collect();
    out.extend(
        docs.difference(lib)
            .map(|n| format!("docs/library.md lists `{n}`, which lib.rs does not make public")),
    );
    out
}

/// The wings whose folder's mod.rs carries façade items (`pub mod step;` in lib.rs, its
/// `pub use` lines in step/mod.rs): lib.rs with each spliced in as an inline group, so the
/// check reads every public item wherever it is written.
const FACADE_WINGS: [&str; 2] = ["step", "records"];

fn facade_text() -> String {
    let lib =
        std::fs::read_to_string(crate::train::repo("crates/train/src/lib.rs")).expect("lib.rs");
    FACADE_WINGS.iter().fold(lib, |lib, wing| {
        let file = format!("crates/train/src/{wing}/mod.rs");
        let text = std::fs::read_to_string(crate::train::repo(&file)).expect("wing mod.rs");
        // The wing's own module declarations are crate-private; its `pub` lines are the group.
        let body: String = text
            .lines()
            .filter(|l| !l.starts_with("//!") && !l.starts_with("pub(crate) mod "))
            .map(|l| format!("{l}\n"))
            .collect();
        let decl = format!("pub mod {wing};");
        assert!(lib.contains(&decl), "lib.rs declares no `{decl}`");
        lib.replace(&decl, &format!("pub mod {wing} {{\n{body}}}"))
    })
}

#[test]
fn terse_train_exposes_only_what_docs_library_md_lists() {
    let lib = facade_text();
    let page = std::fs::read_to_string(crate::train::repo("docs/library.md")).expect("library.md");
    let (surface, listed) = (lib_surface(&lib), documented(&page));
    assert!(
        surface.contains("GrpoTrainer") && surface.contains("step::gradients"),
        "{surface:?}"
    );
    let diff = differences(&surface, &listed);
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}

/// The check sees what it must: a new `pub` item of any kind, in the root or in a group, is a
/// difference; a crate-private one is not.
#[test]
fn a_new_public_item_is_a_difference() {
    let lib = facade_text();
    let base = lib_surface(&lib);
    for (added, name) in [
        ("pub use crate::step::zero::Partition;", "Partition"),
        (
            "pub use crate::step::zero::{sharded_step as step_zero, Partition};",
            "step_zero",
        ),
        ("pub fn extra() {}", "extra"),
        ("pub mod zero_public;", "zero_public"),
        (
            "pub mod tools {\n    pub use crate::step::zero::Partition;\n}",
            "tools::Partition",
        ),
    ] {
        let grown = lib_surface(&format!("{lib}\n{added}\n"));
        assert!(
            grown.contains(name) && !base.contains(name),
            "{added}: {grown:?}"
        );
    }
    let same = lib_surface(&format!(
        "{lib}\npub(crate) use crate::step::zero::Partition;\n"
    ));
    assert_eq!(same, base);
}
