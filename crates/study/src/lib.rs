//! terse-study: the reproduction study's statistics as a library, read from finished terse-train
//! runs (it depends on terse-train, never the reverse): per-seed paired differences, t intervals,
//! sign-flip tests and Holm's correction (`stats`); v3's claims (`claims`, its report's α kept);
//! v4's confirmatory claims as planned in docs/v4/plan.md (`confirmatory`), decided from the
//! per-seed table docs/v4/seeds.csv (`seeds`), with each run's trajectory (`trajectory`) for
//! CARE's premise checks (`premise`) and the effect sizes against the papers' (`effect`), the
//! robustness cells side by side (`robust`), the descriptive tables by level (`levels`), the
//! audit that a hand-written reading cites only printed numbers (`readings`), CARE's premise
//! read from the testbed teacher before a condition's runs (`teacher_premise`), v5's verbose
//! start read from its teacher (`verbose_start`); and whether outcome-only GRPO overthinks
//! (`overthink`). Typed inputs, markdown out; `cargo xtask repro` reads the runs and writes
//! the reports with them, and research code can compute the same verdicts on its own runs.

pub mod checkpoints;
pub mod claims;
pub mod confirmatory;
mod csv;
pub mod effect;
pub mod levels;
pub mod overthink;
pub mod premise;
pub mod readings;
pub mod recompute;
pub mod robust;
pub mod seeds;
pub mod stats;
pub mod teacher_premise;
pub mod trajectory;
pub mod twolevel;
pub mod v5_tables;
pub mod verbose_start;

pub use claims::{paired, Interval, RunStats, Verdict};
