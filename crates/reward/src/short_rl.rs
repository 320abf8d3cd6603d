//! Short-RL (docs/methods.md, Short-RL): a length reward only for correct completions, a tolerance nucleus τ_ℓ
//! around the shortest correct one, and a gate on batch accuracy against its running maximum.
//! Also γ_ℓ, the length control rate (docs/methods.md, Short-RL).

use crate::types::{Group, Shaped};
use serde::{Deserialize, Serialize};

/// Short-RL and its ablations. The paper's designs: D1 = `correct_only`, D2 = `tau_len > 0`,
/// D3 = `tau_acc < 1`. Defaults are the Logic-RL setting (τ_ℓ = 200, τ_acc = 0.05).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShortRl {
    /// Nucleus tolerance τ_ℓ in tokens: correct completions within ℓ_min + τ_ℓ get the full +0.5.
    pub tau_len: f64,
    /// Gate tolerance τ_acc: the length reward is on when acc ≥ acc_max − τ_acc (1 = always on).
    pub tau_acc: f64,
    /// D1: min/max over the correct set, incorrect completions get 0. Off gives Kimi's rule
    /// (min/max over all completions, incorrect get min(0, λ)).
    pub correct_only: bool,
    /// D2: the nucleus. Off behaves as τ_ℓ = 0 whatever `tau_len` says.
    pub nucleus: bool,
    /// D3: the accuracy gate. Off keeps the length reward always on (τ_acc = 1).
    pub acc_gate: bool,
}

impl Default for ShortRl {
    fn default() -> Self {
        Self {
            tau_len: 200.0,
            tau_acc: 0.05,
            correct_only: true,
            nucleus: true,
            acc_gate: true,
        }
    }
}

/// The state Short-RL carries across steps; the trainer checkpoints it (docs/methods.md, Short-RL: unlike the
/// released code, a resumed run continues with the same acc_max).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ShortRlState {
    pub acc_max: f64,
}

impl ShortRl {
    /// The paper's ablation presets: "D1", "D1+D2", "D1+D3", "Short-RL".
    pub fn preset(name: &str) -> Option<Self> {
        let (tau_len, tau_acc) = match name {
            "D1" => (0.0, 1.0),
            "D1+D2" => (200.0, 1.0),
            "D1+D3" => (0.0, 0.05),
            "Short-RL" => (200.0, 0.05),
            _ => return None,
        };
        Some(Self {
            tau_len,
            tau_acc,
            ..Self::default()
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.tau_len >= 0.0 && self.tau_len.is_finite()) {
            return Err(format!(
                "short_rl.tau_len must be a finite number >= 0, got {}",
                self.tau_len
            ));
        }
        if !(0.0..=1.0).contains(&self.tau_acc) {
            return Err(format!(
                "short_rl.tau_acc must be in [0, 1], got {}",
                self.tau_acc
            ));
        }
        Ok(())
    }

    /// The length term of every completion (before adding to the base reward), the gate, and
    /// the diagnostics. Updates `state.acc_max` with this batch before the gate test (docs/methods.md, Short-RL).
    pub fn length_terms(
        &self,
        groups: &[Group],
        state: &mut ShortRlState,
    ) -> (Vec<Vec<f64>>, bool, f64) {
        let total: usize = groups.iter().map(|g| g.samples.len()).sum();
        let correct: usize = groups
            .iter()
            .map(|g| g.samples.iter().filter(|s| s.correct).count())
            .sum();
        let acc = if total == 0 {
            0.0
        } else {
            correct as f64 / total as f64
        };
        if acc > state.acc_max {
            state.acc_max = acc;
        }
        let gate = !self.acc_gate || acc >= state.acc_max - self.tau_acc;
        let tau_len = if self.nucleus { self.tau_len } else { 0.0 };
        let terms = groups
            .iter()
            .map(|g| {
                let pool: Vec<f64> = if self.correct_only {
                    g.correct_lens()
                } else {
                    g.samples.iter().map(|s| s.len as f64).collect()
                };
                let lmin = pool.iter().copied().fold(f64::INFINITY, f64::min);
                let lmax = pool.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                g.samples
                    .iter()
                    .map(|s| {
                        if pool.is_empty() || (self.correct_only && !s.correct) {
                            return 0.0;
                        }
                        let l = s.len as f64;
                        let beta = if l > lmin + tau_len {
                            0.5 - (l - lmin) / (lmax - lmin + 1e-5)
                        } else {
                            0.5
                        };
                        if s.correct {
                            beta
                        } else {
                            beta.min(0.0)
                        }
                    })
                    .collect()
            })
            .collect();
        (terms, gate, acc)
    }

    /// r = base + term when the gate is on, else base. Diagnostics: acc, acc_max, gate_on, gamma_l.
    pub fn shape(&self, groups: &[Group], state: &mut ShortRlState) -> Shaped {
        let (terms, gate, acc) = self.length_terms(groups, state);
        let rewards = groups
            .iter()
            .zip(&terms)
            .map(|(g, t)| {
                g.samples
                    .iter()
                    .zip(t)
                    .map(|(s, x)| s.base_reward + if gate { *x } else { 0.0 })
                    .collect()
            })
            .collect();
        let mut out = Shaped {
            rewards,
            ..Default::default()
        };
        out.diagnostics.insert("acc".into(), acc);
        out.diagnostics.insert("acc_max".into(), state.acc_max);
        out.diagnostics
            .insert("gate_on".into(), f64::from(u8::from(gate)));
        out.diagnostics
            .insert("gamma_l".into(), gamma_l(groups, &terms, gate));
        out
    }
}

/// γ_ℓ (docs/methods.md, Short-RL): −1 when the gate is off; else R/N, the fraction of correct completions
/// whose length term is below 0.5 (0 when there is no correct completion).
pub fn gamma_l(groups: &[Group], terms: &[Vec<f64>], gate_on: bool) -> f64 {
    if !gate_on {
        return -1.0;
    }
    let (mut n, mut r) = (0usize, 0usize);
    for (g, t) in groups.iter().zip(terms) {
        for (s, x) in g.samples.iter().zip(t) {
            if s.correct {
                n += 1;
                r += usize::from(*x < 0.5);
            }
        }
    }
    if n == 0 {
        0.0
    } else {
        r as f64 / n as f64
    }
}
