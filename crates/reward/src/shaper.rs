//! The closed set of shapers, selected by a serde tag (`method = "short_rl"` in TOML), their
//! validation and persistent state, and the one shaper trait (`LengthShaper`) research code
//! implements.
//!
//! Sits between scoring and advantages: `Group`s -> `RewardConfig::shape` -> `Shaped`.

use crate::baselines::{Alp, CosFn, DapoOverlong, Dast, Efficient, Kimi, L1};
use crate::care::Care;
use crate::grpo_lambda::GrpoLambda;
use crate::laser::{LaserD, LaserState};
use crate::lead::GrpoLead;
use crate::short_rl::{ShortRl, ShortRlState};
use crate::step_grpo::StepGrpo;
use crate::types::{Group, Shaped, StepCtx};
use serde::{Deserialize, Serialize};

pub use crate::types::RewardError;

/// Every length-aware method terse implements; `method` is the tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Method {
    /// The base reward unchanged ("Standard").
    #[default]
    None,
    Kimi(Kimi),
    ShortRl(ShortRl),
    GrpoLambda(GrpoLambda),
    Care(Care),
    StepGrpo(StepGrpo),
    CosFn(CosFn),
    Efficient(Efficient),
    Alp(Alp),
    Dast(Dast),
    L1(L1),
    /// LASER-D: a bonus for right completions within a target length that adapts per
    /// difficulty bucket (its state is checkpointed).
    LaserD(LaserD),
    /// GRPO-LEAD's length-dependent accuracy reward with the explicit penalty.
    GrpoLead(GrpoLead),
}

/// The reward section of a run config: one method, optionally plus DAPO's soft overlong
/// punishment (which the papers combine with the others).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    pub shaper: Method,
    pub overlong: Option<DapoOverlong>,
}

/// State a shaper carries across steps; saved in checkpoints. Every field defaults, so a
/// checkpoint written before a field existed still loads; a field a run never used is not
/// written, so such a run's state.json is what it always was.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ShaperState {
    pub short_rl: ShortRlState,
    /// LASER-D's targets and the statistics since their last update.
    #[serde(default, skip_serializing_if = "LaserState::is_empty")]
    pub laser_d: LaserState,
}

fn positive(name: &str, v: f64) -> Result<(), String> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(format!("{name} must be a finite number > 0, got {v}"))
    }
}

impl RewardConfig {
    /// Checks every option; the error names the key and the value.
    pub fn validate(&self) -> Result<(), String> {
        match &self.shaper {
            Method::None => {}
            Method::Kimi(k) => {
                if !k.weight.is_finite() || k.weight < 0.0 {
                    return Err(format!(
                        "kimi.weight must be a finite number >= 0, got {}",
                        k.weight
                    ));
                }
            }
            Method::ShortRl(s) => s.validate()?,
            Method::GrpoLambda(g) => g.validate()?,
            Method::Care(c) => c.validate()?,
            Method::StepGrpo(s) => s.validate()?,
            Method::CosFn(c) => {
                if c.l_max == 0 {
                    return Err("cos_fn.l_max must be > 0, got 0".into());
                }
                if c.r0_wrong > 0.0 || c.rl_wrong > 0.0 {
                    return Err(format!(
                        "cos_fn wrong-answer rewards must be <= 0, got {} and {}",
                        c.r0_wrong, c.rl_wrong
                    ));
                }
            }
            Method::Efficient(e) => positive("efficient.alpha", e.alpha)?,
            Method::Alp(a) => {
                positive("alp.beta", a.beta)?;
                if a.l_max == 0 {
                    return Err("alp.l_max must be > 0, got 0".into());
                }
            }
            Method::Dast(d) => {
                if d.l_max == 0 {
                    return Err("dast.l_max must be > 0, got 0".into());
                }
            }
            Method::L1(_) => {}
            Method::LaserD(l) => l.validate()?,
            Method::GrpoLead(g) => g.validate()?,
        }
        if let Some(o) = &self.overlong {
            o.validate()?;
        }
        Ok(())
    }

    /// Shapes a batch of groups. Stateful methods (Short-RL) update `state`. The config is
    /// validated first (an invalid one is an error, never a silent no-op), and the method sees
    /// only scorable samples (see [`shape_scorable`]).
    pub fn shape(
        &self,
        groups: &[Group],
        ctx: &StepCtx,
        state: &mut ShaperState,
    ) -> Result<Shaped, RewardError> {
        self.validate().map_err(RewardError)?;
        shape_scorable(groups, |gs| self.shape_all(gs, ctx, state))
    }

    pub(crate) fn shape_all(
        &self,
        groups: &[Group],
        ctx: &StepCtx,
        state: &mut ShaperState,
    ) -> Result<Shaped, RewardError> {
        let per_group = |f: &dyn Fn(&Group) -> Vec<f64>| Shaped {
            rewards: groups.iter().map(f).collect(),
            ..Default::default()
        };
        let mut out = match &self.shaper {
            Method::None => Shaped::base(groups),
            Method::Kimi(k) => per_group(&|g| k.rewards(g, ctx.step)),
            Method::ShortRl(s) => s.shape(groups, &mut state.short_rl),
            Method::GrpoLambda(g) => g.shape(groups, ctx),
            Method::Care(c) => c.shape(groups, ctx),
            Method::StepGrpo(s) => s.shape(groups),
            Method::CosFn(c) => per_group(&|g| {
                g.samples
                    .iter()
                    .map(|s| c.reward(s.len, s.correct))
                    .collect()
            }),
            Method::Efficient(e) => per_group(&|g| e.rewards(g)),
            Method::Alp(a) => per_group(&|g| a.rewards(g)),
            Method::Dast(d) => per_group(&|g| d.rewards(g)),
            Method::L1(l) => {
                if let Some(g) = groups.iter().find(|g| g.target_len.is_none()) {
                    return Err(RewardError(format!(
                        "l1: prompt {} has no target length (n_gold)",
                        g.prompt_id
                    )));
                }
                per_group(&|g| {
                    let n = g.target_len.unwrap_or_default();
                    g.samples
                        .iter()
                        .map(|s| l.reward(s.len, s.correct, n))
                        .collect()
                })
            }
            Method::LaserD(l) => l.shape(groups, &mut state.laser_d),
            Method::GrpoLead(g) => per_group(&|grp| g.rewards(grp)),
        };
        if let Some(o) = &self.overlong {
            for (g, r) in groups.iter().zip(out.rewards.iter_mut()) {
                for (s, x) in g.samples.iter().zip(r.iter_mut()) {
                    *x += o.penalty(s.len);
                }
            }
        }
        Ok(out)
    }
}

/// Runs a shaper on the batch with every unscorable sample removed, and puts the rewards back
/// in place (0 for an unscorable sample, whose advantage is 0 anyway).
///
/// An unscorable completion carries no information (docs/methods.md, Advantage estimators gives it no advantage), so it
/// must not move anyone else's reward either: its length does not enter a group's mean or
/// range (Kimi, Efficient, CARE, ...), its "wrong" verdict does not lower a group's or the
/// batch's accuracy (Short-RL's gate, GRPO-λ's ranking, ALP, DAST). A group left empty is
/// passed as an empty group. The shaper's output is checked: one reward per sample it saw.
pub fn shape_scorable(
    groups: &[Group],
    shape: impl FnOnce(&[Group]) -> Result<Shaped, RewardError>,
) -> Result<Shaped, RewardError> {
    if groups.iter().all(|g| g.samples.iter().all(|s| s.scorable)) {
        let out = shape(groups)?;
        crate::advantage::check_shape(groups, &out)?;
        return Ok(out);
    }
    let kept: Vec<Group> = groups
        .iter()
        .map(|g| Group {
            samples: g.samples.iter().filter(|s| s.scorable).copied().collect(),
            ..g.clone()
        })
        .collect();
    let mut out = shape(&kept)?;
    crate::advantage::check_shape(&kept, &out)?;
    out.rewards = groups
        .iter()
        .zip(&out.rewards)
        .map(|(g, r)| {
            let mut it = r.iter();
            g.samples
                .iter()
                .map(|s| {
                    if s.scorable {
                        it.next().copied().unwrap_or(0.0)
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    Ok(out)
}

/// The one shaper trait: what the trainer calls to shape rewards, and the state it
/// checkpoints. The built-in methods implement it through `BuiltinShaper`; research code
/// implements it (or passes a closure, which carries no state) to plug in its own.
///
/// The trainer hands `shape` the scorable samples only (it runs [`shape_scorable`] once per
/// step around the call), so a shaper never filters them itself.
pub trait LengthShaper {
    fn shape(&mut self, groups: &[Group], ctx: &StepCtx) -> Result<Shaped, RewardError>;

    /// What checkpoints save of the shaper (Null: nothing).
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Restores what `state` saved; an error (a state that does not deserialise) stops the
    /// resume, since continuing with a default state would break "resume equals not stopping".
    fn restore(&mut self, _state: &serde_json::Value) -> Result<(), RewardError> {
        Ok(())
    }
}

/// A configured built-in method with its state (Short-RL's acc_max, LASER-D's targets), saved
/// and restored so a resumed run shapes as one that never stopped.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BuiltinShaper {
    pub config: RewardConfig,
    pub state: ShaperState,
}

impl BuiltinShaper {
    /// A built-in shaper at its initial state; the config is validated here, once, rather than
    /// at every step.
    pub fn new(config: RewardConfig) -> Result<Self, RewardError> {
        config.validate().map_err(RewardError)?;
        Ok(Self {
            config,
            state: ShaperState::default(),
        })
    }
}

impl LengthShaper for BuiltinShaper {
    /// The method on the groups as given: the caller has removed the unscorable samples (see
    /// the trait) and `new` has validated the config.
    fn shape(&mut self, groups: &[Group], ctx: &StepCtx) -> Result<Shaped, RewardError> {
        self.config.shape_all(groups, ctx, &mut self.state)
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(&self.state).unwrap_or_default()
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), RewardError> {
        self.state = serde_json::from_value(state.clone())
            .map_err(|e| RewardError(format!("not a built-in shaper state: {e}")))?;
        Ok(())
    }
}

impl<F: FnMut(&[Group], &StepCtx) -> Shaped> LengthShaper for F {
    fn shape(&mut self, groups: &[Group], ctx: &StepCtx) -> Result<Shaped, RewardError> {
        Ok(self(groups, ctx))
    }
}
