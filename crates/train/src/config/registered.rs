//! Research code's registered methods in a run config, chosen by the keys that choose the
//! built-ins: `reward.shaper.method`, `advantage.estimator`, `grpo.loss`. A name the built-ins
//! do not have is a registered one (registry.rs): the other keys of its table (for a loss, the
//! table `[grpo.loss_params]`) are handed to its factory. `RunConfig::from_toml` takes such
//! choices out of the TOML before the typed sections read it (the built-ins' enums stay
//! closed, and a config naming only built-ins is read exactly as before) and
//! `RunConfig::to_toml` puts them back where they were, so the resolved config.toml and the
//! ranks' start header say what the file said. The `[plugins]` section of earlier versions is
//! refused with one line saying where its names now go.

use serde::de::value::{MapDeserializer, StrDeserializer};
use serde::de::DeserializeOwned;
use serde::Deserialize as _;
use std::collections::BTreeSet;

/// The built-in shapers, by `reward.shaper.method`: `terse_reward::Method`'s names.
pub fn builtin_shapers() -> &'static [&'static str] {
    tagged_names::<terse_reward::Method>("method")
}

/// The built-in advantage estimators, by `advantage.estimator`: `terse_reward::Advantage`'s.
pub fn builtin_estimators() -> &'static [&'static str] {
    tagged_names::<terse_reward::Advantage>("estimator")
}

/// The built-in policy losses, by `grpo.loss`: `PolicyLossKind`'s, in its variants' order.
pub fn builtin_losses() -> &'static [&'static str] {
    caught(super::PolicyLossKind::deserialize(
        StrDeserializer::<Names>::new(""),
    ))
}

/// What deserializing an unknown name reports: serde's list of the enum's names (its
/// variants under their `rename_all`), which is thereby their one source.
#[derive(Debug)]
struct Names(Option<&'static [&'static str]>);

impl std::fmt::Display for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Names {}

impl serde::de::Error for Names {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Names(None)
    }
    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        Names(Some(expected))
    }
}

/// The names of an internally tagged enum: a table whose `tag` names no variant, read as `T`.
fn tagged_names<T: DeserializeOwned>(tag: &'static str) -> &'static [&'static str] {
    caught(T::deserialize(MapDeserializer::<_, Names>::new(
        std::iter::once((tag, "")),
    )))
}

fn caught<T>(read: Result<T, Names>) -> &'static [&'static str] {
    match read {
        Err(Names(Some(names))) => names,
        // The empty name is no variant of any enum here, so serde always says which are.
        _ => unreachable!("an enum read from the empty name lists its variants"),
    }
}

/// One registered method a config chooses: its name and its factory's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub name: String,
    pub params: toml::Table,
}

/// The registered methods a config chooses (None: the built-in its section configures).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Registered {
    pub shaper: Option<Choice>,
    pub estimator: Option<Choice>,
    pub loss: Option<Choice>,
}

fn table_mut<'a>(t: &'a mut toml::Table, key: &str) -> Option<&'a mut toml::Table> {
    t.get_mut(key).and_then(toml::Value::as_table_mut)
}

/// `t[key]` when it is a string that is not one of `builtins`.
fn registered_name(t: &toml::Table, key: &str, builtins: &[&str]) -> Option<String> {
    let name = t.get(key)?.as_str()?;
    let known: BTreeSet<&str> = builtins.iter().copied().collect();
    (!known.contains(name)).then(|| name.to_string())
}

/// Takes the registered choices out of a parsed config, leaving what the typed sections read.
pub(crate) fn take(t: &mut toml::Table) -> Result<Registered, String> {
    if t.contains_key("plugins") {
        return Err("[plugins] is gone: name a registered shaper in reward.shaper.method, an estimator in advantage.estimator and a loss in grpo.loss (the other keys of their tables, and [grpo.loss_params] for a loss, go to the factory)".into());
    }
    let mut r = Registered::default();
    if let Some(reward) = table_mut(t, "reward") {
        let name = reward
            .get("shaper")
            .and_then(toml::Value::as_table)
            .and_then(|s| registered_name(s, "method", builtin_shapers()));
        if let Some(name) = name {
            let mut params = match reward.remove("shaper") {
                Some(toml::Value::Table(s)) => s,
                _ => toml::Table::new(),
            };
            params.remove("method");
            r.shaper = Some(Choice { name, params });
        }
    }
    let name = t
        .get("advantage")
        .and_then(toml::Value::as_table)
        .and_then(|a| registered_name(a, "estimator", builtin_estimators()));
    if let Some(name) = name {
        let mut params = match t.remove("advantage") {
            Some(toml::Value::Table(a)) => a,
            _ => toml::Table::new(),
        };
        params.remove("estimator");
        r.estimator = Some(Choice { name, params });
    }
    if let Some(grpo) = table_mut(t, "grpo") {
        match registered_name(grpo, "loss", builtin_losses()) {
            Some(name) => {
                grpo.remove("loss");
                let params = match grpo.remove("loss_params") {
                    Some(toml::Value::Table(p)) => p,
                    Some(v) => {
                        return Err(format!(
                            "grpo.loss_params must be a table of the loss's parameters, got {v}"
                        ))
                    }
                    None => toml::Table::new(),
                };
                r.loss = Some(Choice { name, params });
            }
            None if grpo.contains_key("loss_params") => {
                return Err(
                    "grpo.loss_params is for a registered grpo.loss; a built-in loss (ppo, gspo, gspo-token) is configured by [grpo]'s own keys".into(),
                )
            }
            None => {}
        }
    }
    Ok(r)
}

/// Puts the registered choices back at their keys (the inverse of [`take`]).
pub(crate) fn put(t: &mut toml::Table, r: &Registered) {
    let section = |t: &mut toml::Table, key: &str| -> toml::Table {
        match t.remove(key) {
            Some(toml::Value::Table(s)) => s,
            _ => toml::Table::new(),
        }
    };
    if let Some(c) = &r.shaper {
        let mut reward = section(t, "reward");
        let mut shaper = c.params.clone();
        shaper.insert("method".into(), c.name.clone().into());
        reward.insert("shaper".into(), shaper.into());
        t.insert("reward".into(), reward.into());
    }
    if let Some(c) = &r.estimator {
        let mut advantage = c.params.clone();
        advantage.insert("estimator".into(), c.name.clone().into());
        t.insert("advantage".into(), advantage.into());
    }
    if let Some(c) = &r.loss {
        let mut grpo = section(t, "grpo");
        grpo.insert("loss".into(), c.name.clone().into());
        if !c.params.is_empty() {
            grpo.insert("loss_params".into(), c.params.clone().into());
        }
        t.insert("grpo".into(), grpo.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_names_are_taken_out_and_put_back() {
        let text = "[reward.shaper]\nmethod = \"mine\"\nper_token = 0.02\n\n[reward.overlong]\nl_max = 9\nl_cache = 2\n\n\
                    [advantage]\nestimator = \"ranks\"\nscale = 2\n\n[grpo]\nsteps = 3\nloss = \"my_loss\"\n\n[grpo.loss_params]\nbeta = 0.5\n";
        let mut t: toml::Table = toml::from_str(text).expect("toml");
        let original = t.clone();
        let r = take(&mut t).expect("registered");
        assert_eq!(r.shaper.as_ref().map(|c| c.name.as_str()), Some("mine"));
        assert_eq!(
            r.shaper.as_ref().and_then(|c| c.params.get("per_token")),
            Some(&toml::Value::Float(0.02))
        );
        assert_eq!(r.estimator.as_ref().map(|c| c.name.as_str()), Some("ranks"));
        assert_eq!(r.loss.as_ref().map(|c| c.name.as_str()), Some("my_loss"));
        assert!(t.get("advantage").is_none());
        assert!(t["reward"].get("shaper").is_none() && t["reward"].get("overlong").is_some());
        assert_eq!(t["grpo"].as_table().map(|g| g.len()), Some(1));
        put(&mut t, &r);
        assert_eq!(t, original);
    }

    #[test]
    fn built_in_names_are_the_enums_own() {
        // Read from the enums (serde's names), not kept by hand: each parses back as its kind.
        assert_eq!(builtin_shapers().len(), 13);
        assert!(builtin_shapers().contains(&"grpo_lead") && builtin_shapers()[0] == "none");
        assert_eq!(
            builtin_estimators(),
            ["grpo", "dr_grpo", "rloo", "reinforce_pp"]
        );
        assert_eq!(builtin_losses(), ["ppo", "gspo", "gspo-token"]);
        for n in builtin_shapers() {
            let t = format!(
                "method = {n:?}\n{}",
                if *n == "alp" { "beta = 1" } else { "" }
            );
            let m: Result<terse_reward::Method, _> = toml::from_str(&t);
            assert!(m.is_ok(), "{n}: {m:?}");
        }
    }

    #[test]
    fn built_ins_stay_and_plugins_is_refused_in_one_line() {
        let text = "[reward.shaper]\nmethod = \"short_rl\"\n[advantage]\nestimator = \"rloo\"\n[grpo]\nloss = \"gspo\"\n";
        let mut t: toml::Table = toml::from_str(text).expect("toml");
        let before = t.clone();
        assert_eq!(take(&mut t), Ok(Registered::default()));
        assert_eq!(t, before);
        let mut t: toml::Table = toml::from_str("[plugins]\nshaper = \"x\"\n").expect("toml");
        let e = take(&mut t).expect_err("[plugins]");
        assert!(
            e.starts_with("[plugins] is gone") && !e.contains('\n'),
            "{e}"
        );
        let mut t: toml::Table =
            toml::from_str("[grpo]\nloss = \"ppo\"\n[grpo.loss_params]\nx = 1\n").expect("toml");
        assert!(take(&mut t)
            .expect_err("params of a built-in")
            .contains("grpo.loss_params"));
    }
}
