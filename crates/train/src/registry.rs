//! One registry per kind of plug-in (shaper, advantage estimator, policy loss): each holds the
//! built-ins under their TOML names (`short_rl`, `grpo`, `ppo`, ...) beside research code's
//! entries, which `register_shaper`, `register_estimator` and `register_loss` add (as verl's
//! `register_adv_est` / `register_policy_loss` do). A name is taken once: registering a
//! built-in's name or a name twice is refused with one line. One key chooses among a kind's
//! names: `reward.shaper.method`, `advantage.estimator`, `grpo.loss` (`config::Chosen`, config/registered.rs; a
//! registered method's factory gets the other keys of its table, `[grpo.loss_params]` for a
//! loss); the builder (builder.rs) looks them up, and an unknown name is an error that lists
//! the kind's names, raised before anything is loaded or written. A built-in and a registered
//! method come out alike, as the kind's trait object (`LengthShaper`, `AdvantageEstimator`,
//! `PolicyLoss`): the trainer holds no fallback of its own.

use crate::config::{builtin_estimators, builtin_losses, builtin_shapers, Chosen, RunConfig};
use crate::step::gspo::GspoParams;
use crate::step::loss::{PolicyLoss, PpoParams};
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use terse_reward::{AdvantageEstimator, LengthShaper};

/// The other keys of the chosen method's table, as the factory receives them.
pub type Params = toml::Table;

pub type ShaperFactory = fn(&Params) -> Result<Box<dyn LengthShaper>>;
pub type EstimatorFactory = fn(&Params) -> Result<Box<dyn AdvantageEstimator>>;
pub type LossFactory = fn(&Params) -> Result<Box<dyn PolicyLoss>>;

/// One kind's entries: a built-in (configured by its own TOML section) or research code's
/// factory.
enum Entry<F> {
    Builtin,
    Registered(F),
}

struct Kind<F> {
    what: &'static str,
    /// The config key that chooses among this kind's names.
    key: &'static str,
    entries: BTreeMap<String, Entry<F>>,
}

impl<F: Copy> Kind<F> {
    fn new(what: &'static str, key: &'static str, builtins: &[&str]) -> Self {
        let entries = builtins
            .iter()
            .map(|n| (n.to_string(), Entry::Builtin))
            .collect();
        Kind { what, key, entries }
    }

    fn add(&mut self, name: &str, f: F) -> Result<()> {
        match self.entries.get(name) {
            Some(Entry::Builtin) => {
                bail!(
                    "{} {name:?} is a built-in's name; register yours under another",
                    self.what
                )
            }
            Some(Entry::Registered(_)) => {
                bail!(
                    "{} {name:?} is already registered; a name is registered once",
                    self.what
                )
            }
            None => {
                self.entries.insert(name.to_string(), Entry::Registered(f));
                Ok(())
            }
        }
    }

    /// Research code's factory named `name`; an unknown name is an error listing the kind's
    /// names (built-in names never reach here: the config reads them into its sections).
    fn factory(&self, name: &str) -> Result<F> {
        match self.entries.get(name) {
            Some(Entry::Registered(f)) => Ok(*f),
            _ => bail!(
                "{} = {name:?} is neither built in nor registered (built in: {}; registered: {})",
                self.key,
                self.builtins(),
                self.names()
            ),
        }
    }

    fn builtins(&self) -> String {
        let names: Vec<&str> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Builtin))
            .map(|(n, _)| n.as_str())
            .collect();
        names.join(", ")
    }

    /// Research code's names, or "none".
    fn names(&self) -> String {
        let names: Vec<&str> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Registered(_)))
            .map(|(n, _)| n.as_str())
            .collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

struct Registry {
    shapers: Kind<ShaperFactory>,
    estimators: Kind<EstimatorFactory>,
    losses: Kind<LossFactory>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            shapers: Kind::new("shaper", "reward.shaper.method", builtin_shapers()),
            estimators: Kind::new("estimator", "advantage.estimator", builtin_estimators()),
            losses: Kind::new("loss", "grpo.loss", builtin_losses()),
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

/// Makes `name` usable as `reward.shaper.method = "name"`; a name already taken is refused.
pub fn register_shaper(name: &str, factory: ShaperFactory) -> Result<()> {
    registry().shapers.add(name, factory)
}

/// Makes `name` usable as `advantage.estimator = "name"`; a name already taken is refused.
pub fn register_estimator(name: &str, factory: EstimatorFactory) -> Result<()> {
    registry().estimators.add(name, factory)
}

/// Makes `name` usable as `grpo.loss = "name"`; a name already taken is refused.
pub fn register_loss(name: &str, factory: LossFactory) -> Result<()> {
    registry().losses.add(name, factory)
}

/// The shaper a config names: a registered one by `reward.shaper.method`, else the built-in
/// `[reward]` method (validated once, here).
pub fn configured_shaper(cfg: &RunConfig) -> Result<Box<dyn LengthShaper>> {
    match &cfg.reward.shaper {
        Chosen::Registered(c) => {
            let f = registry().shapers.factory(&c.name)?;
            f(&c.params)
        }
        Chosen::Builtin(_) => Ok(Box::new(
            terse_reward::BuiltinShaper::new(cfg.reward.builtin())
                .map_err(|e| anyhow::anyhow!("reward: {e}"))?,
        )),
    }
}

/// The estimator a config names by `advantage.estimator`: a registered one, else the
/// built-in `[advantage]` estimator (the same trait object either way).
pub(crate) fn configured_estimator(cfg: &RunConfig) -> Result<Box<dyn AdvantageEstimator>> {
    match &cfg.advantage {
        Chosen::Registered(c) => {
            let f = registry().estimators.factory(&c.name)?;
            f(&c.params)
        }
        Chosen::Builtin(a) => Ok(Box::new(*a)),
    }
}

/// The policy loss a config names by `grpo.loss`: a registered one (its parameters:
/// `[grpo.loss_params]`), else the built-in PPO-clip or GSPO with `[grpo]`'s settings (the same
/// trait object either way).
pub(crate) fn configured_loss(cfg: &RunConfig) -> Result<Box<dyn PolicyLoss>> {
    match &cfg.grpo.loss {
        Chosen::Registered(c) => {
            let f = registry().losses.factory(&c.name)?;
            f(cfg.grpo.loss_params.as_ref().unwrap_or(&c.params))
        }
        Chosen::Builtin(_) => Ok(match GspoParams::of_grpo(&cfg.grpo) {
            Some(gspo) => Box::new(gspo),
            None => Box::new(PpoParams::from(&cfg.grpo)),
        }),
    }
}

/// Every registered name the config gives is registered: the builder checks this before
/// anything is loaded or written, so a misspelt name loses nothing.
pub fn check(cfg: &RunConfig) -> Result<()> {
    let r = registry();
    if let Some(c) = cfg.reward.shaper.registered() {
        r.shapers.factory(&c.name)?;
    }
    if let Some(c) = cfg.advantage.registered() {
        r.estimators.factory(&c.name)?;
    }
    if let Some(c) = cfg.grpo.loss.registered() {
        r.losses.factory(&c.name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &Params) -> Result<Box<dyn LengthShaper>> {
        bail!("not built in this test")
    }

    #[test]
    fn the_registry_holds_the_built_ins_and_refuses_a_name_twice() {
        let e = register_shaper("short_rl", none).expect_err("a built-in's name");
        assert_eq!(
            e.to_string(),
            "shaper \"short_rl\" is a built-in's name; register yours under another"
        );
        let e = register_loss("gspo", |_| bail!("no")).expect_err("a built-in's name");
        assert!(e.to_string().contains("built-in"), "{e}");
        let e = register_estimator("rloo", |_| bail!("no")).expect_err("a built-in's name");
        assert!(e.to_string().contains("built-in"), "{e}");
        register_shaper("registry_test_twice", none).expect("first");
        let e = register_shaper("registry_test_twice", none).expect_err("twice");
        assert_eq!(
            e.to_string(),
            "shaper \"registry_test_twice\" is already registered; a name is registered once"
        );
        assert_eq!(e.to_string().lines().count(), 1);
        // The built-ins are listed under their config names, and those are the names the
        // config sections accept (a name a section does not know is "unknown variant").
        let r = registry();
        for n in builtin_shapers() {
            assert!(
                matches!(r.shapers.entries.get(*n), Some(Entry::Builtin)),
                "{n}"
            );
            let e =
                toml::from_str::<terse_reward::RewardConfig>(&format!("[shaper]\nmethod = {n:?}"));
            assert!(
                e.as_ref()
                    .err()
                    .is_none_or(|e| !e.to_string().contains("unknown variant")),
                "{n}: {e:?}"
            );
        }
        for n in builtin_estimators() {
            assert!(
                matches!(r.estimators.entries.get(*n), Some(Entry::Builtin)),
                "{n}"
            );
            let e = toml::from_str::<terse_reward::Advantage>(&format!("estimator = {n:?}"));
            assert!(
                e.as_ref()
                    .err()
                    .is_none_or(|e| !e.to_string().contains("unknown variant")),
                "{n}: {e:?}"
            );
        }
        for n in builtin_losses() {
            assert!(
                matches!(r.losses.entries.get(*n), Some(Entry::Builtin)),
                "{n}"
            );
            let g: crate::config::GrpoSection = toml::from_str(&format!("loss = {n:?}")).expect(n);
            let kind = g.loss.builtin().copied().expect(n);
            assert_eq!(builtin_losses()[kind as usize], *n);
        }
    }
}
