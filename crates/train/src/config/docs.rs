//! docs/config.md, generated from the config types themselves: the sections of `RunConfig`
//! (config/mod.rs), each struct's fields and `///` comments (config/sections.rs, grpo.rs), and each
//! key's default (the serialised `RunConfig::default()`). `cargo xtask config-docs` writes the
//! file; a test compares the file with this output, so the page cannot go stale.
//! Sections typed in another crate (reward, advantage, optim) point to that crate's docs and
//! show their defaults.

use crate::config::RunConfig;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One field of a config struct: its key, its Rust type and its comment.
#[derive(Debug, Clone, PartialEq)]
struct Field {
    key: String,
    ty: String,
    doc: String,
}

/// Every `pub struct NAME { ... }` of `src` with its `pub` fields and their comments.
fn structs(src: &str) -> BTreeMap<String, Vec<Field>> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Vec<Field>)> = None;
    let mut doc = String::new();
    for line in src.lines() {
        let t = line.trim();
        if let Some(name) = t
            .strip_prefix("pub struct ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            current = Some((name.to_string(), vec![]));
            doc.clear();
            continue;
        }
        let Some((_, fields)) = current.as_mut() else {
            continue;
        };
        if line == "}" {
            if let Some((name, fields)) = current.take() {
                out.insert(name, fields);
            }
            continue;
        }
        if let Some(d) = t.strip_prefix("///") {
            if !doc.is_empty() {
                doc.push(' ');
            }
            doc.push_str(d.trim());
        } else if let Some(rest) = t.strip_prefix("pub ") {
            if let Some((key, ty)) = rest.split_once(": ") {
                fields.push(Field {
                    key: key.to_string(),
                    ty: ty.trim_end_matches(',').to_string(),
                    doc: std::mem::take(&mut doc),
                });
            }
        } else if !t.starts_with("#[") {
            doc.clear();
        }
    }
    out
}

/// A default value as inline TOML.
fn inline(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Table(t) => {
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        toml::Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(inline).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

/// The defaults of an optional table's keys, where the type has them (a key without one is
/// required once the table is given).
fn sub_defaults(ty: &str) -> Option<toml::Value> {
    use crate::config::{CorrectionLevel, CorrectionMethod, Gfpo, LoraSection, RolloutCorrection};
    match ty {
        "LoraSection" => toml::Value::try_from(LoraSection::default()).ok(),
        "Gfpo" => {
            let mut t = toml::Value::try_from(Gfpo {
                keep: 2,
                metric: Default::default(),
            })
            .ok()?;
            t.as_table_mut()?.remove("keep");
            Some(t)
        }
        "RolloutCorrection" => {
            let mut t = toml::Value::try_from(RolloutCorrection {
                method: CorrectionMethod::Tis,
                cap: 2.0,
                level: CorrectionLevel::Token,
            })
            .ok()?;
            t.as_table_mut()?.remove("method");
            Some(t)
        }
        _ => None,
    }
}

/// The files that define the config's sections, whose sources (concatenated, in this order)
/// are `markdown`'s second argument.
pub const SECTION_SOURCES: [&str; 2] = [
    "crates/train/src/config/sections.rs",
    "crates/train/src/config/grpo.rs",
];

/// The markdown page, from the sources of config/mod.rs and of [`SECTION_SOURCES`].
pub fn markdown(mod_rs: &str, sections_rs: &str) -> String {
    let all = structs(sections_rs);
    let top = structs(mod_rs);
    let defaults =
        toml::Value::try_from(RunConfig::default()).unwrap_or(toml::Value::Boolean(false));
    let mut s = String::from(
        "# Configuration\n\n\
         Every key of a run config (TOML), by section, with its default; generated from\n\
         crates/train/src/config/ by `cargo xtask config-docs` (a test keeps this page equal to\n\
         what the types say). Every key is optional; unknown keys and non-finite numbers are\n\
         rejected with the key named. configs/default.toml is a full example.\n",
    );
    for section in top.get("RunConfig").into_iter().flatten() {
        let _ = write!(s, "\n## [{}]\n\n", section.key);
        let default = defaults.get(&section.key);
        match all.get(&section.ty) {
            Some(fields) => {
                s.push_str("| key | default | meaning |\n|---|---|---|\n");
                for f in fields {
                    let d = default
                        .and_then(|t| t.get(&f.key))
                        .map_or("unset".to_string(), |v| format!("`{}`", inline(v)));
                    let _ = writeln!(
                        s,
                        "| `{}.{}` | {d} | {} |",
                        section.key,
                        f.key,
                        f.doc.replace('|', "\\|")
                    );
                    // An optional table of this file's types: its keys, when it is given.
                    let inner =
                        f.ty.strip_prefix("Option<")
                            .and_then(|t| t.strip_suffix('>'));
                    for sub in inner.and_then(|t| all.get(t)).into_iter().flatten() {
                        let d = inner
                            .and_then(sub_defaults)
                            .and_then(|t| t.get(&sub.key).cloned())
                            .map_or("required".to_string(), |v| format!("`{}`", inline(&v)));
                        let _ = writeln!(
                            s,
                            "| `{}.{}.{}` | {d} | {} |",
                            section.key,
                            f.key,
                            sub.key,
                            sub.doc.replace('|', "\\|")
                        );
                    }
                }
            }
            None => {
                // `Chosen<T>`: the built-in `T`, or a registered method by name (registered.rs).
                let ty = section
                    .ty
                    .strip_prefix("Chosen<")
                    .and_then(|t| t.strip_suffix('>'))
                    .unwrap_or(&section.ty);
                let _ = writeln!(
                    s,
                    "Typed `{ty}` (its crate's docs list every key; docs/methods.md explains the methods). Default:\n"
                );
                if let Some(d) = default {
                    let _ = writeln!(s, "```toml\n{}```", toml::to_string(d).unwrap_or_default());
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_their_comments_are_read() {
        let src = "pub struct A {\n    /// One.\n    /// Two.\n    pub x: u64,\n    #[serde(default)]\n    pub y: Option<f64>,\n}\n";
        let s = structs(src);
        assert_eq!(
            s["A"],
            vec![
                Field {
                    key: "x".into(),
                    ty: "u64".into(),
                    doc: "One. Two.".into()
                },
                Field {
                    key: "y".into(),
                    ty: "Option<f64>".into(),
                    doc: String::new()
                }
            ]
        );
    }
}
