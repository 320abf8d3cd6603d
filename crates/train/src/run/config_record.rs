//! A run's config is its own: `<run>/config.toml` is written once, when the run is created, and
//! a later start compares its config with the run's, key by key. Keys that change no result
//! ([`NO_RESULT_KEYS`]: where the run is found, the lock wait, checkpoint and evaluation
//! frequency, logging) may differ, noted in one line; any other difference refuses in one line
//! naming each key with both values, unless the start allows it (`xtask train
//! --allow-config-change`, `TrainerBuilder::allow_config_change`): then each change is appended
//! to `<run>/config_changes.jsonl` as `{"step", "key", "old", "new"}`, and the run's config is
//! config.toml with those lines applied in order (what the next start compares with).
//! Both files go through `terse_model::disk`: config.toml by `atomic_write`, the changes
//! appended and fsynced by an `Appender` whose new file's entry is made durable first.

use crate::config::RunConfig;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// The run's config as created.
pub(crate) const CONFIG: &str = "config.toml";
/// The changes a start allowed, one JSON line each.
pub(crate) const CHANGES: &str = "config_changes.jsonl";

/// Keys whose value changes no result of the run (weights, metrics lines other than the
/// evaluations' steps): a start may give them another value, used as given and noted.
pub(crate) const NO_RESULT_KEYS: [&str; 8] = [
    "run.name",
    "run.dir",
    "run.resume",
    "run.lock_wait_s",
    "checkpoint.every",
    "checkpoint.keep_last",
    "eval.every",
    "log.tensorboard",
];

/// One key whose value differs between the run's config and a start's (None: unset).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub key: String,
    pub old: Option<toml::Value>,
    pub new: Option<toml::Value>,
}

impl Change {
    /// `key = old there, new now`, values as inline TOML.
    fn describe(&self) -> String {
        let show = |v: &Option<toml::Value>| v.as_ref().map_or("unset".into(), |v| v.to_string());
        format!(
            "{} = {} in {CONFIG}, {} now",
            self.key,
            show(&self.old),
            show(&self.new)
        )
    }
}

/// One line of config_changes.jsonl, its keys in this order.
#[derive(serde::Serialize)]
struct ChangeLine<'a> {
    step: u64,
    key: &'a str,
    old: serde_json::Value,
    new: serde_json::Value,
}

/// What a start writes about its config once everything is loaded and checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record {
    /// A new run: config.toml, the resolved config's text.
    Create(String),
    /// A run resumed with the same config, or with differences in keys that change no result.
    Same,
    /// Allowed changes, appended to config_changes.jsonl.
    Changed(Vec<Change>),
}

/// Compares the resolved `cfg` with the run's config in `dir` (config.toml with
/// config_changes.jsonl applied). Differences in [`NO_RESULT_KEYS`] are noted in one line;
/// any other refuses naming every key with both values, unless `allow`. Writes nothing:
/// `write` does, once the run is loaded.
pub(crate) fn check(dir: &Path, cfg: &RunConfig, allow: bool) -> Result<Record> {
    let text = cfg.to_toml().context("serialising the resolved config")?;
    let path = dir.join(CONFIG);
    if !path.exists() {
        return Ok(Record::Create(text));
    }
    let old = run_config(dir)?;
    let new = flat(&text, Path::new("the resolved config"))?;
    let (quiet, changed): (Vec<Change>, Vec<Change>) = diff(&old, &new)
        .into_iter()
        .partition(|c| NO_RESULT_KEYS.contains(&c.key.as_str()));
    if !changed.is_empty() && !allow {
        bail!(
            "{}: this run was made with another config: {} (a run's config is fixed when it is created: start it with its own config, use another run.name, or pass --allow-config-change to record the change in {CHANGES})",
            path.display(),
            list(&changed)
        );
    }
    if !quiet.is_empty() {
        tracing::warn!(
            "{}: {} (keys that change no result: used as given, {CONFIG} kept)",
            path.display(),
            list(&quiet)
        );
    }
    if changed.is_empty() {
        return Ok(Record::Same);
    }
    Ok(Record::Changed(changed))
}

/// Writes what `check` decided: config.toml for a new run, the allowed changes (each with the
/// step the run resumes from) appended to config_changes.jsonl and synced.
pub(crate) fn write(dir: &Path, record: &Record, step: u64) -> Result<()> {
    match record {
        Record::Create(text) => Ok(terse_model::disk::atomic_write(
            &dir.join(CONFIG),
            text.as_bytes(),
        )?),
        Record::Same => Ok(()),
        Record::Changed(changes) => {
            let path = dir.join(CHANGES);
            let mut lines = String::new();
            for c in changes {
                let json = |v: &Option<toml::Value>| -> Result<serde_json::Value> {
                    v.as_ref().map_or(Ok(serde_json::Value::Null), |v| {
                        serde_json::to_value(v).context("a config value as JSON")
                    })
                };
                let line = ChangeLine {
                    step,
                    key: &c.key,
                    old: json(&c.old)?,
                    new: json(&c.new)?,
                };
                lines.push_str(&serde_json::to_string(&line)?);
                lines.push('\n');
            }
            let mut f = terse_model::disk::Appender::open(&path, true)?;
            f.append(lines.as_bytes())?;
            f.sync()?;
            tracing::warn!(
                "{}: config changed with --allow-config-change at step {step}: {} ({CONFIG} kept)",
                path.display(),
                list(changes)
            );
            Ok(())
        }
    }
}

/// The run's config, flattened to dotted keys: config.toml, then every line of
/// config_changes.jsonl applied in order; read through `RunConfig::parse`, so a key an older
/// build did not write reads as its default.
pub(crate) fn run_config(dir: &Path) -> Result<BTreeMap<String, toml::Value>> {
    let path = dir.join(CONFIG);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message().trim()))?;
    let changes = dir.join(CHANGES);
    if changes.exists() {
        let lines = std::fs::read_to_string(&changes)
            .with_context(|| format!("reading {}", changes.display()))?;
        for (i, l) in lines
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            apply(&mut table, l)
                .with_context(|| format!("{} line {}", changes.display(), i + 1))?;
        }
    }
    let text = toml::to_string(&table).context("serialising the run's config")?;
    flat(&text, &path)
}

/// Sets (or, for a `null` new value, removes) one change line's key in `table`.
fn apply(table: &mut toml::Table, line: &str) -> Result<()> {
    let v: serde_json::Value = serde_json::from_str(line)?;
    let key = v["key"].as_str().context("no \"key\"")?;
    let mut parents: Vec<&str> = key.split('.').collect();
    let last = parents.pop().unwrap_or_default().to_string();
    let mut t = table;
    for p in parents {
        t = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .with_context(|| format!("{key}: {p} is not a table"))?;
    }
    match &v["new"] {
        serde_json::Value::Null => {
            t.remove(&last);
        }
        new => {
            let new: toml::Value =
                serde_json::from_value(new.clone()).with_context(|| format!("{key}: {new}"))?;
            t.insert(last, new);
        }
    }
    Ok(())
}

/// A config's text read as a `RunConfig` and written back, flattened to dotted keys (tables
/// opened; arrays are values).
fn flat(text: &str, origin: &Path) -> Result<BTreeMap<String, toml::Value>> {
    let cfg = RunConfig::parse(text).map_err(|e| anyhow::anyhow!("{}: {e}", origin.display()))?;
    let table: toml::Table =
        toml::from_str(&cfg.to_toml()?).context("reading back the serialised config")?;
    let mut out = BTreeMap::new();
    fn walk(prefix: &str, t: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&key, t, out),
                v => {
                    out.insert(key, v.clone());
                }
            }
        }
    }
    walk("", &table, &mut out);
    Ok(out)
}

/// Every key whose value differs, in key order.
pub(crate) fn diff(
    old: &BTreeMap<String, toml::Value>,
    new: &BTreeMap<String, toml::Value>,
) -> Vec<Change> {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| Change {
            key: k.clone(),
            old: old.get(k).cloned(),
            new: new.get(k).cloned(),
        })
        .collect()
}

/// The changes as `key = old in config.toml, new now; ...`.
fn list(changes: &[Change]) -> String {
    changes
        .iter()
        .map(Change::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
#[path = "config_record_tests.rs"]
mod tests;
