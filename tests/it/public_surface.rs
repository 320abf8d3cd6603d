//! docs/library.md is checked against docs/public-items.txt, the list of every reachable public
//! item that public_items.rs keeps equal to the code, so the page and the code have one list
//! between them. The granularity: "Public items of terse-train" names every item of
//! terse-train's root (by its name: `GrpoTrainer`), and every item of each module it lists item
//! by item (a façade group: `step::gradients`); a module it names alone (`config`) is the crate's
//! own, and its items are in docs/public-items.txt only. "The study (terse-study)" names every
//! item of terse-study's root. An entry that names no listed item fails, and so does a listed
//! item the page misses, so a `pub` item added to a root or a group fails here as soon as the
//! list is regenerated.

use std::collections::BTreeSet;

/// The items of `krate` in the list, as their paths below the crate root (`step::gradients`).
fn listed(list: &str, krate: &str) -> BTreeSet<String> {
    let prefix = format!("{krate}::");
    list.lines()
        .filter_map(|l| l.split_whitespace().next()?.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// A section of the page (its text up to the next `## `), by the start of its title.
fn section<'a>(page: &'a str, title: &str) -> &'a str {
    page.split("\n## ")
        .find(|s| s.starts_with(title))
        .unwrap_or_else(|| panic!("docs/library.md has no \"## {title}\" section"))
}

/// The names a section lists: each list entry's first `code` span.
fn entries(section: &str) -> BTreeSet<String> {
    section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

/// What the façade section gets wrong against the list: entries naming no listed item, root
/// items it misses, and items it misses of the groups it lists item by item.
fn differences(items: &BTreeSet<String>, documented: &BTreeSet<String>) -> Vec<String> {
    let mut out: Vec<String> = documented
        .iter()
        .filter(|d| !items.contains(*d))
        .map(|d| format!("docs/library.md lists `{d}`, which docs/public-items.txt does not have"))
        .collect();
    let groups: BTreeSet<&str> = documented
        .iter()
        .filter_map(|d| d.split_once("::").map(|(g, _)| g))
        .collect();
    for item in items {
        let wanted = match item.split_once("::") {
            None => true,
            Some((g, rest)) => groups.contains(g) && !rest.contains("::"),
        };
        if wanted && !documented.contains(item) {
            out.push(format!(
                "`{item}` is public in terse-train (docs/public-items.txt) but docs/library.md does not list it"
            ));
        }
    }
    out
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(crate::train::repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn docs_library_md_lists_what_the_public_items_list_has() {
    let (page, list) = (read("docs/library.md"), read("docs/public-items.txt"));
    let items = listed(&list, "terse_train");
    let documented = entries(section(&page, "Public items of terse-train"));
    assert!(
        documented.contains("GrpoTrainer") && documented.contains("step::gradients"),
        "{documented:?}"
    );
    let diff = differences(&items, &documented);
    assert!(diff.is_empty(), "{}", diff.join("\n"));

    // The study's section names each item of terse-study's root in backticks.
    let study = section(&page, "The study (terse-study)");
    let named: BTreeSet<&str> = study.split('`').skip(1).step_by(2).collect();
    let roots: Vec<String> = listed(&list, "terse_study")
        .into_iter()
        .filter(|i| !i.contains("::"))
        .collect();
    assert!(roots.len() >= 10, "{roots:?}");
    let missing: Vec<&String> = roots
        .iter()
        .filter(|r| !named.contains(r.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/library.md's study section does not name {missing:?}"
    );
}

/// The check sees what it must: a planted root item, a new item of a group, and an entry for
/// an item that is gone are differences; an item inside a module listed by name is not.
#[test]
fn a_new_public_item_is_a_difference() {
    let items = |extra: &[&str]| -> BTreeSet<String> {
        [
            "train",
            "config",
            "config::RunConfig",
            "step",
            "step::gradients",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let documented: BTreeSet<String> = ["train", "config", "step", "step::gradients"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert!(differences(&items(&[]), &documented).is_empty());
    for planted in ["planted", "step::planted"] {
        let d = differences(&items(&[planted]), &documented);
        assert!(d.len() == 1 && d[0].contains(planted), "{planted}: {d:?}");
    }
    assert!(differences(&items(&["config::Planted"]), &documented).is_empty());
    let mut gone = documented.clone();
    gone.insert("step::removed".into());
    let d = differences(&items(&[]), &gone);
    assert!(d.len() == 1 && d[0].contains("step::removed"), "{d:?}");
    // Lines of the list read as paths below the crate root.
    let list = "terse_train::step mod\nterse_train::step::gradients use\nterse_model::x fn\n";
    assert_eq!(
        listed(list, "terse_train"),
        ["step", "step::gradients"].map(String::from).into()
    );
}
