//! Research code's own methods by name: `register_shaper`, `register_estimator` and
//! `register_loss` put a factory under a name, and a run config names it (`[plugins] shaper =
//! "my_shaper"`, `estimator = ..`, `loss = ..`, with `[plugins.params]` handed to the factory),
//! as verl's `register_adv_est` / `register_policy_loss` do. `train(cfg)` and
//! `GrpoTrainer::from_config` / the builder look the names up; an unknown name is an error
//! that lists the registered ones, raised by `start` before anything is loaded or written.

use crate::loss::PolicyLoss;
use crate::shaper::ShaperWithState;
use anyhow::Result;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use terse_reward::AdvantageEstimator;

/// `[plugins.params]`, as the factory receives it.
pub type Params = toml::Table;

type ShaperFactory = fn(&Params) -> Result<Box<dyn ShaperWithState>>;
type EstimatorFactory = fn(&Params) -> Result<Box<dyn AdvantageEstimator>>;
type LossFactory = fn(&Params) -> Result<Box<dyn PolicyLoss>>;

#[derive(Default)]
struct Registry {
    shapers: BTreeMap<String, ShaperFactory>,
    estimators: BTreeMap<String, EstimatorFactory>,
    losses: BTreeMap<String, LossFactory>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Makes `name` usable as `[plugins] shaper = "name"`.
pub fn register_shaper(name: &str, factory: ShaperFactory) {
    registry().shapers.insert(name.to_string(), factory);
}

/// Makes `name` usable as `[plugins] estimator = "name"`.
pub fn register_estimator(name: &str, factory: EstimatorFactory) {
    registry().estimators.insert(name.to_string(), factory);
}

/// Makes `name` usable as `[plugins] loss = "name"`.
pub fn register_loss(name: &str, factory: LossFactory) {
    registry().losses.insert(name.to_string(), factory);
}

fn unknown<T>(kind: &str, name: &str, known: &BTreeMap<String, T>) -> anyhow::Error {
    let names: Vec<&str> = known.keys().map(String::as_str).collect();
    anyhow::anyhow!(
        "plugins.{kind} = {name:?} is not registered (registered: {})",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    )
}

/// The shaper a config names: `[plugins] shaper` from the registry, else the built-in
/// `[reward]` method.
pub fn configured_shaper(cfg: &crate::config::RunConfig) -> Result<Box<dyn ShaperWithState>> {
    match &cfg.plugins.shaper {
        Some(name) => shaper(name, &cfg.plugins.params),
        None => Ok(Box::new(terse_reward::BuiltinShaper {
            config: cfg.reward.clone(),
            state: Default::default(),
        })),
    }
}

/// The registered shaper `name`, built from `params`.
pub fn shaper(name: &str, params: &Params) -> Result<Box<dyn ShaperWithState>> {
    let f = {
        let r = registry();
        match r.shapers.get(name) {
            Some(f) => *f,
            None => return Err(unknown("shaper", name, &r.shapers)),
        }
    };
    f(params)
}

/// The registered estimator `name`, built from `params`.
pub fn estimator(name: &str, params: &Params) -> Result<Box<dyn AdvantageEstimator>> {
    let f = {
        let r = registry();
        match r.estimators.get(name) {
            Some(f) => *f,
            None => return Err(unknown("estimator", name, &r.estimators)),
        }
    };
    f(params)
}

/// The registered policy loss `name`, built from `params`.
pub fn loss(name: &str, params: &Params) -> Result<Box<dyn PolicyLoss>> {
    let f = {
        let r = registry();
        match r.losses.get(name) {
            Some(f) => *f,
            None => return Err(unknown("loss", name, &r.losses)),
        }
    };
    f(params)
}

/// Every name `[plugins]` gives is registered: `start` checks this before anything is loaded
/// or written, so a misspelt name loses nothing.
pub fn check(p: &crate::config::PluginsSection) -> Result<()> {
    let r = registry();
    let missing = |kind: &str, name: &Option<String>, ok: bool| match name {
        Some(n) if !ok => Some((kind.to_string(), n.clone())),
        _ => None,
    };
    let bad = [
        missing(
            "shaper",
            &p.shaper,
            p.shaper.as_ref().is_none_or(|n| r.shapers.contains_key(n)),
        ),
        missing(
            "estimator",
            &p.estimator,
            p.estimator
                .as_ref()
                .is_none_or(|n| r.estimators.contains_key(n)),
        ),
        missing(
            "loss",
            &p.loss,
            p.loss.as_ref().is_none_or(|n| r.losses.contains_key(n)),
        ),
    ];
    match bad.into_iter().flatten().next() {
        None => Ok(()),
        Some((kind, name)) => Err(match kind.as_str() {
            "shaper" => unknown(&kind, &name, &r.shapers),
            "estimator" => unknown(&kind, &name, &r.estimators),
            _ => unknown(&kind, &name, &r.losses),
        }),
    }
}
