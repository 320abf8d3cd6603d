//! CARE's premise read on paper, from the testbed teacher a condition's SFT checkpoint imitates:
//! groups of teacher traces per training prompt, CARE's direction d of each group, and per level
//! the teacher's pass@1 and length. A premise condition (docs/v4/plan.md section 7b) can be
//! checked this way before its runs; the runs' own check 2 (premise.rs) stays the verdict.
//! Data flow: a run config's [data] and [grpo] -> [`teacher_premise`] -> [`render`] ->
//! `cargo xtask teacher-premise`.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;
use terse_reward::care::direction;
use terse_tasks::testbed::{verify, Problem, Teacher};
use terse_train::config::RunConfig;
use terse_train::task as data;

/// A stream tag no training or SFT draw uses, so the teacher's samples here are their own.
const STREAM: u64 = 900;

/// One level's groups: how many, how many said "shorter" (d = −1) and "longer" (d = +1), and
/// the teacher's accuracy and mean length (tokens: the testbed's tokenizer splits on spaces).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LevelRead {
    pub level: usize,
    pub groups: usize,
    pub shorter: usize,
    pub longer: usize,
    pub correct: usize,
    pub samples: usize,
    pub tokens: usize,
}

impl LevelRead {
    /// Adds `other`'s counts (the same level: another group, or another seed's read).
    fn add(&mut self, other: &LevelRead) {
        self.groups += other.groups;
        self.shorter += other.shorter;
        self.longer += other.longer;
        self.correct += other.correct;
        self.samples += other.samples;
        self.tokens += other.tokens;
    }

    pub fn pass(&self) -> f64 {
        self.correct as f64 / self.samples.max(1) as f64
    }
}

/// The read of one condition: per level, and per step the d = −1 and d = +1 groups.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherPremise {
    /// The GRPO seeds read: one, or several pooled by [`pool`].
    pub seeds: Vec<u64>,
    pub group: usize,
    pub steps: usize,
    pub prompts_per_step: usize,
    pub levels: Vec<LevelRead>,
}

impl TeacherPremise {
    /// Mean d = −1 and d = +1 groups per step (the runs' check 2 compares these).
    pub fn per_step(&self) -> (f64, f64) {
        let n = self.steps.max(1) as f64;
        let (s, l) = self
            .levels
            .iter()
            .fold((0, 0), |(s, l), r| (s + r.shorter, l + r.longer));
        (s as f64 / n, l as f64 / n)
    }

    /// d = −1 minus d = +1 groups per step: what check 2 asks to be positive.
    pub fn margin(&self) -> f64 {
        let (shorter, longer) = self.per_step();
        shorter - longer
    }
}

/// Reads of several GRPO seeds as one (counts summed level by level, steps added), so a design
/// is chosen on more prompts than one run draws. `reads` is non-empty and shares one config
/// (group, prompts per step, levels); with equal steps per read, as the CLI draws them, the
/// pooled margin is the mean of the reads' margins.
pub fn pool(reads: &[TeacherPremise]) -> TeacherPremise {
    let mut out = reads[0].clone();
    for r in &reads[1..] {
        let shape = |t: &TeacherPremise| {
            let levels: Vec<usize> = t.levels.iter().map(|l| l.level).collect();
            (t.group, t.prompts_per_step, levels)
        };
        assert_eq!(shape(r), shape(&out), "pooled reads of different configs");
        out.seeds.extend(&r.seeds);
        out.steps += r.steps;
        for (a, b) in out.levels.iter_mut().zip(&r.levels) {
            a.add(b);
        }
    }
    out
}

/// Each seed's margin, their mean and sample sd: how much of a design's margin a one-seed read
/// owes to which prompts that seed draws (one line, empty for a single read).
pub fn render_spread(reads: &[TeacherPremise]) -> String {
    if reads.len() < 2 {
        return String::new();
    }
    let m: Vec<f64> = reads.iter().map(TeacherPremise::margin).collect();
    let mean = m.iter().sum::<f64>() / m.len() as f64;
    let each: Vec<String> = reads
        .iter()
        .zip(&m)
        .map(|(r, x)| format!("{} {x:+.2}", r.seeds[0]))
        .collect();
    format!(
        "margin (d = -1 minus d = +1 per step) by seed: {}; mean {mean:+.2}, sd {:.2}\n",
        each.join(", "),
        super::stats::sd(&m, mean)
    )
}

/// Training item `index` of a run with GRPO seed `seed`, as a problem the teacher can trace.
fn drawn(levels: &[usize], teacher: &Teacher, seed: u64, index: u64) -> Problem {
    data::problem(seed, data::TRAIN, index, levels, teacher)
}

/// Draws `steps` steps of the training prompts a run of `cfg` with GRPO seed `seed` draws (its
/// levels round-robin; the prompts of [`terse_train::task::Task::train_item`]), each with `group`
/// teacher traces, and reads CARE's direction per group (tie key: sample index).
pub fn teacher_premise(cfg: &RunConfig, group: usize, steps: usize, seed: u64) -> TeacherPremise {
    let teacher = cfg.data.teacher();
    let levels = &cfg.data.levels;
    let per_step = cfg.grpo.prompts_per_step;
    let mut reads: Vec<LevelRead> = levels
        .iter()
        .map(|&level| LevelRead {
            level,
            ..Default::default()
        })
        .collect();
    for step in 0..steps {
        for k in 0..per_step {
            let index = (step * per_step + k) as u64;
            let slot = (index % levels.len() as u64) as usize;
            let p = drawn(levels, &teacher, seed, index);
            let samples: Vec<(usize, bool, u64)> = (0..group as u64)
                .map(|j| {
                    let key = data::mix(seed, STREAM, index << 16 | j);
                    let text = teacher.trace(&p, &mut ChaCha8Rng::seed_from_u64(key)).text;
                    let right = verify(&text, p.answer()).correct;
                    (text.split_whitespace().count(), right, j)
                })
                .collect();
            let (d, _) = direction(&samples);
            reads[slot].add(&LevelRead {
                level: levels[slot],
                groups: 1,
                shorter: usize::from(d < 0),
                longer: usize::from(d > 0),
                correct: samples.iter().filter(|s| s.1).count(),
                samples: samples.len(),
                tokens: samples.iter().map(|s| s.0).sum(),
            });
        }
    }
    TeacherPremise {
        seeds: vec![seed],
        group,
        steps,
        prompts_per_step: per_step,
        levels: reads,
    }
}

/// The read as a Markdown table per level and the per-step counts check 2 compares.
pub fn render(t: &TeacherPremise) -> String {
    let seeds: Vec<String> = t.seeds.iter().map(u64::to_string).collect();
    let mut s = format!(
        "Teacher read at G = {}, {} steps of {} prompts, seed{} {} (no model: the traces the SFT \
         checkpoint imitates)\n\n| level | teacher pass@1 | tokens | groups | d = -1 (shorter) | \
         d = +1 (longer) |\n|---|---|---|---|---|---|\n",
        t.group,
        t.steps,
        t.prompts_per_step,
        if seeds.len() > 1 { "s" } else { "" },
        seeds.join(", ")
    );
    for r in &t.levels {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.1} | {} | {} | {} |",
            r.level,
            r.pass(),
            r.tokens as f64 / r.samples.max(1) as f64,
            r.groups,
            r.shorter,
            r.longer
        );
    }
    let (shorter, longer) = t.per_step();
    let _ = writeln!(
        s,
        "\nper step: d = -1 {shorter:.2}, d = +1 {longer:.2} (check 2 asks for more d = -1)"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(data: &str) -> RunConfig {
        let text = format!(
            "[data]\ntask = \"testbed\"\nlevels = [1, 2, 3, 4, 5, 6]\ntestbed = \"v3\"\n\
             recheck_prob = 0.5\nrecheck_hard_prob = 0.6\nhard_rate = 0.05\n\
             guess_unchecked = true\nreflect_rounds = 2\n{data}\n[grpo]\nprompts_per_step = 12\n"
        );
        RunConfig::from_toml(&text, Path::new("t.toml")).expect("config")
    }

    #[test]
    fn overturns_on_the_middle_levels_turn_their_groups_toward_shorter() {
        let flat = "overturn_by_level = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]\n";
        let none = teacher_premise(&config(flat), 6, 20, 7);
        let mid = teacher_premise(
            &config("overturn_by_level = [0.0, 0.0, 0.9, 0.9, 0.0, 0.0]\n"),
            6,
            20,
            7,
        );
        for t in [&none, &mid] {
            assert_eq!(t.levels.iter().map(|r| r.groups).sum::<usize>(), 240);
            // Easy levels: no hard steps, no overturns, so every trace is right and no group
            // has a direction.
            for r in &t.levels[..2] {
                assert_eq!((r.pass(), r.shorter, r.longer), (1.0, 0, 0), "{r:?}");
            }
        }
        // Without overturns only corrections set d: a longer trace re-checked a guess.
        let (s0, l0) = none.per_step();
        assert!(l0 > s0, "{}", render(&none));
        // Overturns on levels 3-4 make their longer traces wrong: those levels say shorter.
        for r in &mid.levels[2..4] {
            assert!(r.shorter > r.longer, "{}", render(&mid));
        }
        let (s1, l1) = mid.per_step();
        assert!(s1 > s0 && l1 < l0, "{}\n{}", render(&none), render(&mid));
        assert!(none.margin() < 0.0 && mid.margin() > none.margin());
        // Levels 5-6 are untouched by the profile: the same draws, the same groups.
        assert_eq!(none.levels[4..], mid.levels[4..]);
        // Longer chains, longer traces; no trace is empty.
        assert!(none.levels.windows(2).all(|w| {
            let t = |r: &LevelRead| r.tokens as f64 / r.samples as f64;
            t(&w[0]) > 8.0 && t(&w[1]) > t(&w[0])
        }));
    }

    /// The prompts read are the ones a run with that seed trains on, step by step.
    #[test]
    fn the_read_draws_the_training_prompts_of_its_seed() {
        let cfg = config("");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed");
        let task = terse_train::task::Task::new(&cfg.data, &root, 7).expect("task");
        let teacher = cfg.data.teacher();
        for index in [0u64, 5, 13, 719] {
            let p = drawn(&cfg.data.levels, &teacher, 7, index);
            let item = task.train_item(index).expect("item");
            assert_eq!(
                (p.prompt(), p.answer().to_string()),
                (item.prompt, item.answer)
            );
        }
        // Another seed, other problems: the read is not the same.
        assert_ne!(
            teacher_premise(&cfg, 6, 5, 7),
            teacher_premise(&cfg, 6, 5, 8)
        );
    }

    /// Pooling seeds is reading their prompts together: counts add level by level, the pooled
    /// margin is the seeds' mean margin (equal steps each), and the spread line names each seed.
    #[test]
    fn pooled_seeds_add_their_groups_and_average_their_margins() {
        let cfg = config("overturn_by_level = [0.0, 0.0, 0.5, 0.5, 0.2, 0.2]\n");
        let reads: Vec<TeacherPremise> = (3..6).map(|s| teacher_premise(&cfg, 6, 10, s)).collect();
        let all = pool(&reads);
        assert_eq!((all.seeds.clone(), all.steps), (vec![3, 4, 5], 30));
        for (i, r) in all.levels.iter().enumerate() {
            let sum =
                |f: fn(&LevelRead) -> usize| reads.iter().map(|t| f(&t.levels[i])).sum::<usize>();
            assert_eq!(r.groups, sum(|l| l.groups));
            assert_eq!(r.shorter, sum(|l| l.shorter));
            assert_eq!(r.longer, sum(|l| l.longer));
            assert_eq!(r.tokens, sum(|l| l.tokens));
        }
        let mean = reads.iter().map(TeacherPremise::margin).sum::<f64>() / 3.0;
        assert!(
            (all.margin() - mean).abs() < 1e-12,
            "{} {mean}",
            all.margin()
        );
        let line = render_spread(&reads);
        assert!(
            line.contains("by seed: 3 ") && line.contains(", 5 "),
            "{line}"
        );
        assert!(render(&all).contains("seeds 3, 4, 5"), "{}", render(&all));
        assert_eq!(render_spread(&reads[..1]), "");
    }
}
