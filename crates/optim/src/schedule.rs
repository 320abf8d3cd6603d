//! Learning-rate schedules as a pure function of the step: linear warm-up from 0 to the peak,
//! then constant, linear or cosine decay to a minimum at `total_steps`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decay {
    Constant,
    Linear,
    Cosine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Schedule {
    pub peak_lr: f64,
    /// Steps of linear warm-up: lr = peak · (step + 1) / warmup_steps for step < warmup_steps
    /// (step 0 already trains, as verl's warm-up does).
    pub warmup_steps: u64,
    pub decay: Decay,
    /// Where linear/cosine decay reaches `min_lr` (and stays).
    pub total_steps: u64,
    pub min_lr: f64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            peak_lr: 1e-6,
            warmup_steps: 0,
            decay: Decay::Constant,
            total_steps: 0,
            min_lr: 0.0,
        }
    }
}

impl Schedule {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.peak_lr > 0.0 && self.peak_lr.is_finite()) {
            return Err(format!(
                "schedule.peak_lr must be a finite number > 0, got {}",
                self.peak_lr
            ));
        }
        if !(0.0..=self.peak_lr).contains(&self.min_lr) {
            return Err(format!(
                "schedule.min_lr must be in [0, peak_lr], got {}",
                self.min_lr
            ));
        }
        if self.decay != Decay::Constant && self.total_steps <= self.warmup_steps {
            return Err(format!(
                "schedule.total_steps ({}) must exceed warmup_steps ({}) for {:?} decay",
                self.total_steps, self.warmup_steps, self.decay
            ));
        }
        Ok(())
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        let factor = match self.decay {
            Decay::Constant => return self.peak_lr,
            Decay::Linear => 1.0 - progress,
            Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        };
        self.min_lr + (self.peak_lr - self.min_lr) * factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(s: &Schedule, expect: &[(u64, f64)]) {
        for &(step, lr) in expect {
            assert!(
                (s.lr_at(step) - lr).abs() < 1e-15,
                "step {step}: {} vs {lr}",
                s.lr_at(step)
            );
        }
    }

    #[test]
    fn warmup_then_constant() {
        let s = Schedule {
            peak_lr: 1.0,
            warmup_steps: 4,
            ..Default::default()
        };
        check(&s, &[(0, 0.25), (3, 1.0), (4, 1.0), (1000, 1.0)]);
    }

    #[test]
    fn linear_and_cosine_decay_boundaries() {
        let lin = Schedule {
            peak_lr: 1.0,
            warmup_steps: 2,
            decay: Decay::Linear,
            total_steps: 12,
            min_lr: 0.1,
        };
        check(
            &lin,
            &[
                (0, 0.5),
                (1, 1.0),
                (2, 1.0),
                (7, 0.55),
                (12, 0.1),
                (50, 0.1),
            ],
        );
        let cos = Schedule {
            decay: Decay::Cosine,
            ..lin
        };
        check(&cos, &[(2, 1.0), (7, 0.55), (12, 0.1), (99, 0.1)]);
        assert!(
            (cos.lr_at(4) - (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * 0.2).cos()))).abs()
                < 1e-15
        );
    }

    #[test]
    fn validation_names_the_value() {
        let bad = Schedule {
            decay: Decay::Cosine,
            warmup_steps: 5,
            total_steps: 5,
            ..Default::default()
        };
        assert!(bad.validate().expect_err("bad").contains("total_steps (5)"));
        assert!(Schedule {
            peak_lr: -1.0,
            ..Default::default()
        }
        .validate()
        .expect_err("neg")
        .contains("-1"));
    }
}
