//! The teacher side of study v5's verbose-start premise (docs/v5/plan.md section 2, check V1):
//! per level, how often the testbed teacher a config describes re-checks and how long its traces
//! are, against the same teacher with its redundant re-checks removed (no reflection round on a
//! verified chain; the rounds that correct a guessed hard step stay). No model: the SFT
//! checkpoint imitates these traces, so a teacher that is not verbose cannot give a verbose
//! start. Data flow: a run config's [data] -> [`read`] -> [`VerboseLevel`] per level (the v5
//! report's V1 and the test of configs/v5.toml).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use terse_tasks::testbed::Teacher;
use terse_train::config::RunConfig;
use terse_train::task as data;

/// A stream tag no training, SFT or teacher-premise draw uses.
const STREAM: u64 = 901;

/// One level's read: mean `Wait` re-checks and tokens per trace, with and without the redundant
/// re-checks (tokens: the testbed's tokenizer splits on spaces).
#[derive(Debug, Clone, PartialEq)]
pub struct VerboseLevel {
    pub level: usize,
    pub traces: usize,
    pub rechecks: f64,
    pub tokens: f64,
    /// The same problems and draws' seeds traced with `recheck_prob = 0`.
    pub tokens_plain: f64,
    /// The longest trace's tokens (it must fit the rollout's `max_new_tokens`).
    pub longest: usize,
}

impl VerboseLevel {
    /// Tokens over the plain teacher's tokens (1 when nothing is redundant).
    pub fn ratio(&self) -> f64 {
        self.tokens / self.tokens_plain.max(f64::MIN_POSITIVE)
    }
}

/// The teacher without redundant reflection: it still reflects where a guessed hard step is
/// unchecked (at `recheck_hard_prob`, or never when that is unset).
pub fn plain(teacher: &Teacher) -> Teacher {
    Teacher {
        recheck_prob: 0.0,
        ..teacher.clone()
    }
}

/// `per_level` training problems of each of the config's levels (GRPO seed `seed`), one trace
/// each from the config's teacher and from [`plain`], with the same trace seed.
pub fn read(cfg: &RunConfig, per_level: usize, seed: u64) -> Vec<VerboseLevel> {
    let teacher = cfg.data.teacher();
    let bare = plain(&teacher);
    let levels = &cfg.data.levels;
    let mut out: Vec<VerboseLevel> = levels
        .iter()
        .map(|&level| VerboseLevel {
            level,
            traces: 0,
            rechecks: 0.0,
            tokens: 0.0,
            tokens_plain: 0.0,
            longest: 0,
        })
        .collect();
    for index in 0..(per_level * levels.len()) as u64 {
        // Training items take their levels round-robin, as a run draws them.
        let slot = (index % levels.len() as u64) as usize;
        let p = data::problem(seed, data::TRAIN, index, levels, &teacher);
        let key = data::mix(seed, STREAM, index);
        let t = teacher.trace(&p, &mut ChaCha8Rng::seed_from_u64(key));
        let b = bare.trace(&p, &mut ChaCha8Rng::seed_from_u64(key));
        let r = &mut out[slot];
        r.traces += 1;
        r.rechecks += t.rechecks as f64;
        let tokens = t.text.split_whitespace().count();
        r.tokens += tokens as f64;
        r.longest = r.longest.max(tokens);
        r.tokens_plain += b.text.split_whitespace().count() as f64;
    }
    for r in &mut out {
        let n = r.traces.max(1) as f64;
        r.rechecks /= n;
        r.tokens /= n;
        r.tokens_plain /= n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(name: &str) -> RunConfig {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(name);
        RunConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
    }

    /// Testbed v5's teacher overthinks on every level: at least one `Wait` re-check per trace
    /// and clearly longer than without its redundant re-checks, the easy levels included, where
    /// no re-check is needed (plan V1's thresholds: one re-check, 1.25x on level 1).
    /// Every level of `read` re-checks at least once a trace and fits the config's length limit.
    fn rechecks_and_fits(cfg: &RunConfig, read: &[VerboseLevel]) {
        for r in read {
            assert!(
                r.longest < cfg.grpo.max_new_tokens,
                "level {}: {r:?}",
                r.level
            );
            assert!(r.rechecks >= 1.0, "level {}: {r:?}", r.level);
        }
    }

    #[test]
    fn the_v5_teacher_is_verbose_on_every_level() {
        let cfg = config("v5.toml");
        let read = read(&cfg, 400, 0);
        assert_eq!(read.len(), 6);
        rechecks_and_fits(&cfg, &read);
        for r in &read {
            assert!(r.ratio() >= 1.1, "level {}: {r:?}", r.level);
        }
        assert!(read[0].ratio() >= 1.25, "{:?}", read[0]);
        assert!(read[1].ratio() >= 1.25, "{:?}", read[1]);
    }

    /// The read tells a verbose teacher from v4's: design 3's teacher (configs/v3.toml) re-checks
    /// a verified easy chain rarely, so its level-1 traces are barely longer than plain ones.
    #[test]
    fn design_3s_teacher_is_not_verbose_on_the_easy_levels() {
        let read = read(&config("v3.toml"), 400, 0);
        assert!(read[0].rechecks < 0.5, "{:?}", read[0]);
        assert!(read[0].ratio() < 1.25, "{:?}", read[0]);
    }

    /// X6's teacher (configs/v5-care-hidden.toml) stays verbose in every hidden class and within
    /// the length limit; the classes share their prompts, so their plain traces differ only by
    /// how the hard steps are written (verified in classes 1-3, guessed in 4).
    #[test]
    fn the_hidden_class_teacher_is_verbose_and_fits() {
        let cfg = config("v5-care-hidden.toml");
        let read = read(&cfg, 400, 0);
        assert_eq!(read.len(), 4);
        rechecks_and_fits(&cfg, &read);
        assert!(
            (read[0].tokens_plain - read[1].tokens_plain).abs() < 1.0,
            "{read:?}"
        );
    }
}
