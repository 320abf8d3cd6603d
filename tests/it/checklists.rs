//! ARCHITECTURE.md's checklists (new kernel, new shaper, new study method, new benchmark) name
//! every file one touches: each path a checklist names exists, and a file that lists most of
//! the built-in shapers or kernels (a list the next one joins) is named by its checklist, so a
//! new hand list, or a checklist that forgets one, fails here.

use crate::architecture::{looks_like_path, repo_paths};
use std::path::Path;

/// The checklists, by the start of their bold title.
const CHECKLISTS: [&str; 4] = [
    "Add a kernel",
    "Add a shaper",
    "Add a method to the study",
    "Add a benchmark",
];

/// Each checklist of the map's `## Checklists` section: its title and its text.
fn checklists(map: &str) -> Vec<(String, String)> {
    let start = map
        .find("\n## Checklists")
        .expect("ARCHITECTURE.md has ## Checklists");
    let section = &map[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    section
        .split("\n**")
        .skip(1)
        .map(|c| {
            let title = c.split("**").next().unwrap_or_default();
            (title.to_string(), c.to_string())
        })
        .collect()
}

/// The paths a checklist names in backticks, from the root; a placeholder (`kernels/<name>.cu`)
/// stands for a file of the folder before it.
fn paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| looks_like_path(t) || (t.contains('/') && t.contains('<')))
        .map(String::from)
        .collect()
}

/// The paths of a checklist that name nothing: a file or folder that does not exist, or a
/// placeholder whose folder does not.
fn missing(root: &Path, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| {
            let exists = match p.find('<') {
                Some(i) => {
                    let folder = &p[..p[..i].rfind('/').map_or(0, |j| j + 1)];
                    !folder.is_empty() && root.join(folder).is_dir()
                }
                None => root.join(p.trim_end_matches('/')).exists(),
            };
            !exists
        })
        .cloned()
        .collect()
}

/// Is `word` in `text` as a whole word (no letter, digit or `_` on either side)?
fn has_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(ident)
            && !text[i + word.len()..].chars().next().is_some_and(ident)
    })
}

/// Does `text` list the family: name at least three quarters of its members, each by any of
/// its spellings?
fn lists(text: &str, family: &[Vec<String>]) -> bool {
    let named = family
        .iter()
        .filter(|spellings| spellings.iter().any(|s| has_word(text, s)))
        .count();
    named * 4 >= family.len() * 3
}

/// The built-in shapers as code and docs spell them: the TOML name and the `Method` variant.
fn shapers() -> Vec<Vec<String>> {
    let camel = |n: &str| -> String {
        n.split('_')
            .map(|p| p[..1].to_uppercase() + &p[1..])
            .collect()
    };
    terse_train::config::builtin_shapers()
        .iter()
        .filter(|n| **n != "none")
        .map(|n| vec![n.to_string(), format!("Method::{}", camel(n))])
        .collect()
}

/// The kernels: the stems of kernels/*.cu.
fn kernels(root: &Path) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = std::fs::read_dir(root.join("kernels"))
        .expect("kernels/")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_suffix(".cu").map(|s| vec![s.to_string()])
        })
        .collect();
    out.sort();
    out
}

/// Every text file of the repository (target/, runs/, .git/ and data/ aside, and the map
/// itself), as (path from the root, text); files over 1 MiB are data, and the study's outputs
/// (results*.md, CSV tables) report methods rather than list them.
fn text_files(root: &Path) -> Vec<(String, String)> {
    let mut paths = vec![];
    repo_paths(root, root, &mut paths);
    paths
        .into_iter()
        .filter(|rel| !rel.starts_with("data/") && rel != "ARCHITECTURE.md")
        .filter(|rel| {
            let name = rel.rsplit('/').next().unwrap_or_default();
            !name.starts_with("results") && !name.ends_with(".csv")
        })
        .filter(|rel| {
            let m = std::fs::metadata(root.join(rel));
            m.is_ok_and(|m| m.is_file() && m.len() <= 1 << 20)
        })
        .filter_map(|rel| Some((rel.clone(), std::fs::read_to_string(root.join(&rel)).ok()?)))
        .collect()
}

/// The files that list `family` but no checklist of `named` names.
fn unnamed(files: &[(String, String)], family: &[Vec<String>], named: &[String]) -> Vec<String> {
    files
        .iter()
        .filter(|(rel, text)| lists(text, family) && !named.contains(rel))
        .map(|(rel, _)| rel.clone())
        .collect()
}

#[test]
fn every_path_a_checklist_names_exists() {
    let root = crate::train::repo("");
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let lists = checklists(&map);
    for want in CHECKLISTS {
        let (title, text) = lists
            .iter()
            .find(|(t, _)| t.starts_with(want))
            .unwrap_or_else(|| panic!("ARCHITECTURE.md has no checklist \"{want}\""));
        let named = paths(text);
        assert!(named.len() >= 3, "\"{title}\" names {named:?}");
        let gone = missing(&root, &named);
        assert!(
            gone.is_empty(),
            "\"{title}\" names what does not exist: {gone:?}"
        );
    }
}

#[test]
fn a_file_that_lists_the_shapers_or_the_kernels_is_on_its_checklist() {
    let root = crate::train::repo("");
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let of = |want: &str| -> Vec<String> {
        checklists(&map)
            .iter()
            .filter(|(t, _)| t.starts_with(want))
            .flat_map(|(_, text)| paths(text))
            .collect()
    };
    let files = text_files(&root);
    assert!(files.len() > 300, "{} files read", files.len());
    // A new shaper joins the study's lists too, so the study's checklist may name them.
    let shaper_files = [of("Add a shaper"), of("Add a method to the study")].concat();
    let (shapers, kernels) = (shapers(), kernels(&root));
    assert!(shapers.len() >= 10 && kernels.len() >= 8);
    let mut problems = vec![];
    for (what, family, named) in [
        ("shapers", &shapers, &shaper_files),
        ("kernels", &kernels, &of("Add a kernel")),
    ] {
        let listing: Vec<_> = files.iter().filter(|(_, t)| lists(t, family)).collect();
        // At least the family's own table (kernels/README.md, shaper.rs): the matcher works.
        assert!(!listing.is_empty(), "no file lists the {what}");
        for f in unnamed(&files, family, named) {
            problems.push(format!(
                "{f} lists the built-in {what}, but their checklist omits it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checklist_walk_sees_a_missing_path_and_an_unnamed_list() {
    let root = crate::train::repo("");
    let map = "# Map\n\n## Checklists\n\n**Add a thing.** 1. `kernels/<name>.cu` in \
               `crates/no_such/src/x.rs` and `no_such/<name>.rs`; `cargo xtask` runs.\n\n## After\n\
               `crates/train/src/gone.rs`\n";
    let lists = checklists(map);
    assert_eq!(lists.len(), 1);
    assert_eq!(lists[0].0, "Add a thing.");
    let named = paths(&lists[0].1);
    assert_eq!(
        named.len(),
        3,
        "the next section is not the checklist's: {named:?}"
    );
    assert_eq!(
        missing(&root, &named),
        ["crates/no_such/src/x.rs", "no_such/<name>.rs"]
    );
    let family = shapers();
    let all: String = family.iter().map(|s| format!("\"{}\",\n", s[0])).collect();
    let few = "short_rl and care, not the rest";
    let files = vec![
        ("a/hand_list.rs".to_string(), all),
        ("b/prose.md".to_string(), few.to_string()),
    ];
    assert_eq!(unnamed(&files, &family, &[]), ["a/hand_list.rs"]);
    assert!(unnamed(&files, &family, &["a/hand_list.rs".into()]).is_empty());
    assert!(has_word("Method::LaserD(l)", "Method::LaserD"));
    assert!(!has_word("laser_d_extra", "laser_d"));
}
