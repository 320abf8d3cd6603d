//! The repository stands alone: no file points a reader outside it (a clone has no sibling
//! folders), and the method reference covers every shaper the reward crate implements.

use std::path::Path;

/// Every text file of the repository, target/ and .git/ aside.
fn text_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() {
            if !["target", ".git", "runs"].contains(&name) {
                text_files(&p, out);
            }
        } else if std::fs::read_to_string(&p).is_ok() {
            out.push(p);
        }
    }
}

/// Issue 37 item 6: no reference to the development folder beside the repository.
#[test]
fn item6_no_file_points_outside_the_repository() {
    let root = crate::train::repo("");
    let mut files = vec![];
    text_files(&root, &mut files);
    assert!(files.len() > 100, "{} files", files.len());
    // Built from parts so this file does not match itself.
    let outside = [
        concat!("..", "/shared"),
        concat!("shared", "/spec"),
        concat!("shared", "/fixtures"),
    ];
    let hits: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            outside
                .iter()
                .filter(|o| text.contains(*o))
                .map(|o| format!("{}: {o}", f.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(hits.is_empty(), "{hits:#?}");
}

/// Issue 37 item 6: docs/methods.md has a section for every method a config can name.
#[test]
fn item6_the_method_reference_covers_every_shaper() {
    let text = std::fs::read_to_string(crate::train::repo("docs/methods.md")).expect("methods");
    // Every built-in method (the names come from the enum itself), the baseline "none" aside.
    let methods = terse_train::config::builtin_shapers();
    assert!(
        methods.len() >= 13 && methods.contains(&"short_rl"),
        "{methods:?}"
    );
    for &m in methods.iter().filter(|&&m| m != "none") {
        let tag = format!("method = \"{m}\"");
        assert!(text.contains(&tag), "docs/methods.md lacks {tag}");
        // The TOML name parses as a method, so the reference names real keys.
        let toml = format!(
            "[shaper]\n{tag}\n{}",
            if m == "alp" {
                "beta = 1\nl_max = 10\n"
            } else {
                ""
            }
        );
        toml::from_str::<terse_reward::RewardConfig>(&toml).unwrap_or_else(|e| panic!("{m}: {e}"));
    }
    for estimator in terse_train::config::builtin_estimators() {
        assert!(text.contains(&format!("`{estimator}`")), "{estimator}");
    }
    assert!(text.contains("arXiv"), "papers are cited by arXiv id");
}

/// Issue 34: docs/config.md is what the config types say (regenerate with `cargo xtask
/// config-docs`), and every key of the default config is on it.
#[test]
fn the_config_page_is_generated_from_the_config_types() {
    let read = |p: &str| std::fs::read_to_string(crate::train::repo(p)).expect(p);
    let sections: String = terse_train::config::docs::SECTION_SOURCES
        .iter()
        .map(|p| read(p))
        .collect();
    let want =
        terse_train::config::docs::markdown(&read("crates/train/src/config/mod.rs"), &sections);
    let have = read("docs/config.md");
    assert!(
        have == want,
        "docs/config.md is stale: run `cargo xtask config-docs`"
    );
    let defaults = toml::Value::try_from(terse_train::RunConfig::default()).expect("toml");
    for (section, table) in defaults.as_table().expect("table") {
        assert!(have.contains(&format!("## [{section}]")), "[{section}]");
        let Some(keys) = table.as_table() else {
            continue;
        };
        // Sections typed in another crate show their defaults as a TOML block instead.
        if have.contains(&format!("| `{section}.")) {
            for key in keys.keys() {
                assert!(
                    have.contains(&format!("| `{section}.{key}`")),
                    "{section}.{key}"
                );
            }
        }
    }
}

/// Issue 34: the README is a front door (at most 120 lines), and every relative link of the
/// README, docs/ and ARCHITECTURE.md resolves to a file of the repository.
#[test]
fn the_readme_is_short_and_every_docs_link_resolves() {
    let root = crate::train::repo("");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    assert!(
        readme.lines().count() <= 120,
        "README.md has {} lines",
        readme.lines().count()
    );
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for e in std::fs::read_dir(root.join("docs")).expect("docs") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("page");
        // Markdown links: ](target)
        for part in text.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or_default();
            if target.starts_with("http") || target.starts_with('#') || target.is_empty() {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let file = page.parent().expect("dir").join(path);
            assert!(
                file.exists(),
                "{}: link {target} resolves to nothing",
                page.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} links");
}
