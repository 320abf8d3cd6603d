//! The choice among a kind's methods at the key that chooses it: `reward.shaper.method`,
//! `advantage.estimator`, `grpo.loss`. A name among the kind's serde enum (`terse_reward::Method`,
//! `terse_reward::Advantage`, `PolicyLossKind`) is a built-in and its table is read as that enum;
//! any other name is a registered method (registry.rs), whose factory gets the other keys of its
//! table (for a loss, the table `[grpo.loss_params]`, grpo.rs). The enums' own serde names are
//! the one list of built-in names (`builtin_shapers` and its siblings read them from serde), so
//! the config's typed fields (`Chosen`) hold either kind as written and write it back the same
//! way: the resolved config.toml and the ranks' start header say what the file said.

use serde::de::value::{MapDeserializer, StrDeserializer};
use serde::de::{DeserializeOwned, Error as _};
use serde::ser::SerializeMap as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use terse_reward::{Advantage, Method};

use super::PolicyLossKind;

/// The built-in shapers, by `reward.shaper.method`: `terse_reward::Method`'s names.
pub fn builtin_shapers() -> &'static [&'static str] {
    tagged_names::<Method>("method")
}

/// The built-in advantage estimators, by `advantage.estimator`: `terse_reward::Advantage`'s.
pub fn builtin_estimators() -> &'static [&'static str] {
    tagged_names::<Advantage>("estimator")
}

/// The built-in policy losses, by `grpo.loss`: `PolicyLossKind`'s, in its variants' order.
pub fn builtin_losses() -> &'static [&'static str] {
    caught(PolicyLossKind::deserialize(StrDeserializer::<Names>::new(
        "",
    )))
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

/// One registered method a config chooses: its name and its factory's parameters (the other
/// keys of its table; empty for a loss, whose parameters are `grpo.loss_params`).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub name: String,
    pub params: toml::Table,
}

/// A kind's method as a config chooses it: a built-in, configured by its serde enum, or a
/// registered one by name (built by its factory, registry.rs).
#[derive(Debug, Clone, PartialEq)]
pub enum Chosen<T> {
    Builtin(T),
    Registered(Choice),
}

impl<T: Default> Default for Chosen<T> {
    fn default() -> Self {
        Chosen::Builtin(T::default())
    }
}

impl<T> From<T> for Chosen<T> {
    fn from(t: T) -> Self {
        Chosen::Builtin(t)
    }
}

impl<T> Chosen<T> {
    /// The built-in, or None for a registered method.
    pub fn builtin(&self) -> Option<&T> {
        match self {
            Chosen::Builtin(t) => Some(t),
            Chosen::Registered(_) => None,
        }
    }

    /// The registered method, or None for a built-in.
    pub fn registered(&self) -> Option<&Choice> {
        match self {
            Chosen::Builtin(_) => None,
            Chosen::Registered(c) => Some(c),
        }
    }
}

/// Reads one choice from its TOML value at `key`: `tag` names the method inside the table
/// (None: the value is the name itself, and must be a string). A name outside `builtins` is registered; anything else (a built-in
/// name, a missing or non-string name) is the enum's to read, with the enum's own error.
fn read<'de, T, D>(
    d: D,
    key: &str,
    tag: Option<&str>,
    builtins: &[&str],
) -> Result<Chosen<T>, D::Error>
where
    T: DeserializeOwned,
    D: Deserializer<'de>,
{
    let value = toml::Value::deserialize(d)?;
    if let (None, v) = (tag, &value) {
        if !v.is_str() {
            return Err(D::Error::custom(format!(
                "{key} must be a name (a string), got {v}"
            )));
        }
    }
    let name = match (tag, &value) {
        (Some(tag), toml::Value::Table(t)) => t.get(tag).and_then(toml::Value::as_str),
        (None, v) => v.as_str(),
        _ => None,
    }
    .map(str::to_string);
    match name {
        Some(name) if !builtins.contains(&name.as_str()) => {
            let mut params = match value {
                toml::Value::Table(t) => t,
                _ => toml::Table::new(),
            };
            if let Some(tag) = tag {
                params.remove(tag);
            }
            Ok(Chosen::Registered(Choice { name, params }))
        }
        _ => T::deserialize(value)
            .map(Chosen::Builtin)
            .map_err(|e| D::Error::custom(e.message().trim())),
    }
}

/// Writes one choice as `read` reads it: a built-in as its enum, a registered method as its
/// name at `tag` followed by its parameters (or the bare name, with no tag).
fn write<T: Serialize, S: Serializer>(
    c: &Chosen<T>,
    tag: Option<&'static str>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match (c, tag) {
        (Chosen::Builtin(t), _) => t.serialize(s),
        (Chosen::Registered(c), None) => s.serialize_str(&c.name),
        (Chosen::Registered(c), Some(tag)) => {
            let mut m = s.serialize_map(Some(c.params.len() + 1))?;
            m.serialize_entry(tag, &c.name)?;
            for (k, v) in &c.params {
                m.serialize_entry(k, v)?;
            }
            m.end()
        }
    }
}

/// Each kind's serde: its tag and its enum's names.
macro_rules! chosen_serde {
    ($t:ty, $key:expr, $tag:expr, $names:path) => {
        impl<'de> Deserialize<'de> for Chosen<$t> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                read(d, $key, $tag, $names())
            }
        }
        impl Serialize for Chosen<$t> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                write(self, $tag, s)
            }
        }
    };
}

chosen_serde!(Method, "reward.shaper", Some("method"), builtin_shapers);
chosen_serde!(
    Advantage,
    "advantage",
    Some("estimator"),
    builtin_estimators
);
chosen_serde!(PolicyLossKind, "grpo.loss", None, builtin_losses);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;
    use std::path::Path;

    #[test]
    fn registered_names_are_read_at_their_keys_and_written_back() {
        let text = "[reward.shaper]\nmethod = \"mine\"\nper_token = 0.02\n\n[reward.overlong]\nl_max = 9\nl_cache = 2\n\n\
                    [advantage]\nestimator = \"ranks\"\nscale = 2\n\n[grpo]\nsteps = 3\nloss = \"my_loss\"\n\n[grpo.loss_params]\nbeta = 0.5\n";
        let cfg = RunConfig::parse(text).expect("registered");
        let shaper = cfg.reward.shaper.registered().expect("a registered shaper");
        assert_eq!(shaper.name, "mine");
        assert_eq!(
            shaper.params.get("per_token"),
            Some(&toml::Value::Float(0.02))
        );
        assert_eq!(shaper.params.len(), 1, "the tag is not a parameter");
        let estimator = cfg.advantage.registered().expect("a registered estimator");
        assert_eq!(estimator.name, "ranks");
        assert_eq!(
            estimator.params.get("scale"),
            Some(&toml::Value::Integer(2))
        );
        assert_eq!(
            cfg.grpo.loss.registered().map(|c| c.name.as_str()),
            Some("my_loss")
        );
        assert_eq!(
            cfg.grpo.loss_params.as_ref().and_then(|p| p.get("beta")),
            Some(&toml::Value::Float(0.5))
        );
        assert_eq!(cfg.reward.overlong.as_ref().map(|o| o.l_max), Some(9));
        // Written back where the file had them, and read back the same.
        let written = cfg.to_toml().expect("toml");
        let (original, back): (toml::Table, toml::Table) = (
            toml::from_str(text).expect("toml"),
            toml::from_str(&written).expect("toml"),
        );
        assert_eq!(back["reward"]["shaper"], original["reward"]["shaper"]);
        assert_eq!(back["advantage"], original["advantage"]);
        assert_eq!(back["grpo"]["loss"], original["grpo"]["loss"]);
        assert_eq!(back["grpo"]["loss_params"], original["grpo"]["loss_params"]);
        assert_eq!(RunConfig::parse(&written), Ok(cfg));
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
            let m: Result<Chosen<Method>, _> = toml::from_str(&t);
            assert!(matches!(m, Ok(Chosen::Builtin(_))), "{n}: {m:?}");
        }
    }

    #[test]
    fn built_ins_are_read_by_their_enums_with_their_errors() {
        let text = "[reward.shaper]\nmethod = \"short_rl\"\n[advantage]\nestimator = \"rloo\"\n[grpo]\nloss = \"gspo\"\n";
        let cfg = RunConfig::parse(text).expect("built-ins");
        assert!(matches!(
            cfg.reward.shaper,
            Chosen::Builtin(Method::ShortRl(_))
        ));
        assert!(matches!(cfg.advantage, Chosen::Builtin(Advantage::Rloo)));
        assert_eq!(cfg.grpo.loss, Chosen::Builtin(PolicyLossKind::Gspo));
        assert_eq!(RunConfig::parse(&cfg.to_toml().expect("toml")), Ok(cfg));
        // A built-in's table is its enum's: an unknown key is its error, in one line.
        let e = RunConfig::parse("[advantage]\nestimator = \"grpo\"\nbogus = 1\n")
            .expect_err("an unknown key");
        assert!(e.contains("bogus") && !e.contains('\n'), "{e}");
        let e = RunConfig::parse("[reward.shaper]\nmethod = 3\n").expect_err("a number");
        assert!(!e.contains('\n'), "{e}");
        let e = RunConfig::parse("[grpo]\nloss = 3\n").expect_err("a number");
        assert_eq!(e, "grpo.loss must be a name (a string), got 3");
        let origin = Path::new("c.toml");
        let e = RunConfig::from_toml("[plugins]\nshaper = \"x\"\n", origin).expect_err("[plugins]");
        let e = format!("{e:#}");
        assert!(
            e.starts_with("c.toml: [plugins] is gone") && !e.contains('\n'),
            "{e}"
        );
        let e = RunConfig::from_toml(
            "[grpo]\nloss = \"ppo\"\n[grpo.loss_params]\nx = 1\n",
            origin,
        )
        .expect_err("params of a built-in");
        let e = format!("{e:#}");
        assert!(e.contains("grpo.loss_params") && !e.contains('\n'), "{e}");
        let e = RunConfig::from_toml("[grpo]\nloss = \"mine\"\nloss_params = 1\n", origin)
            .expect_err("params not a table");
        let e = format!("{e:#}");
        assert!(
            e.contains("grpo.loss_params must be a table") && !e.contains('\n'),
            "{e}"
        );
    }
}
