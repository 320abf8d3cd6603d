//! v4's robustness cells (docs/v4/plan.md section 8, exploratory): the primary claims P1-P4
//! again on another SFT checkpoint, on one knob of the sensitivity grid moved from design 3,
//! or on v3's designs 1 and 2. `repro --testbed v4 --cell <name>` derives the cell's base
//! config (and, when its checkpoint differs, its SFT config) from the main design's, trains
//! Standard and P1-P4 on seeds 100-108 into runs/repro-v4-<cell>, and report_v4.rs writes
//! docs/v4/robust/<cell>/ with Holm within the cell.

use crate::methods::merge;
use anyhow::{Context, Result};

/// One cell of plan section 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cell {
    /// Design 3 from SFT seed 1.
    Sft1,
    /// Design 3 from SFT seed 2.
    Sft2,
    /// Overturn profile 0.0 -> 0.30 (P-CARE's), its own SFT checkpoint.
    OverturnMid,
    /// Overturn profile flat at 0.10, its own SFT checkpoint.
    OverturnFlat,
    /// One round of reflection, its own SFT checkpoint.
    Rounds1,
    /// Three rounds of reflection, its own SFT checkpoint.
    Rounds3,
    /// Group size 16, from the main checkpoint.
    G16,
    /// v3's design 1 (commit "Testbed v3 design 1 studied"): 800 SFT steps, overturns
    /// 0.10 -> 0.02 from the first round.
    V3Design1,
    /// v3's design 2 (commit 3b9c71f): 1600 SFT steps, overturns 0.05 -> 0.01 from the first
    /// round.
    V3Design2,
}

/// What a cell changes from the main design.
pub struct Spec {
    /// The cell's name in paths (`runs/repro-v4-<name>`, `docs/v4/robust/<name>`).
    pub name: &'static str,
    /// What it moves, in words (the report's title).
    pub what: &'static str,
    /// The SFT seed (`run.seed` of the SFT config; the main checkpoint's is 0).
    pub sft_seed: u64,
    /// `[data]` overrides, applied to both the SFT and the GRPO config (the model must learn
    /// the traces its GRPO problems come from).
    pub data: &'static str,
    /// `[sft]` overrides.
    pub sft: &'static str,
    /// `[grpo]` overrides of the GRPO runs.
    pub grpo: &'static str,
    /// Wall clock on 2 cores (two runs at a time), estimated from v3's timings as plan section
    /// 9 does: 0.42-0.47 min a run (G = 16 counts 2.7 runs), 8 min per 1600 SFT steps.
    pub minutes: &'static str,
}

/// The rows each cell trains: Standard and the four papers' primary rows.
pub const ROWS: [&str; 5] = [
    "standard",
    "short_rl",
    "grpo_lambda",
    "care",
    "step_grpo_paper",
];

impl Cell {
    #[rustfmt::skip]
    pub fn spec(self) -> Spec {
        let s = |name, what, sft_seed, data, sft, grpo, minutes| Spec { name, what, sft_seed, data, sft, grpo, minutes };
        match self {
            Cell::Sft1 => s("sft1", "design 3 from SFT seed 1", 1, "", "", "", "19-21 + 8 SFT"),
            Cell::Sft2 => s("sft2", "design 3 from SFT seed 2", 2, "", "", "", "19-21 + 8 SFT"),
            Cell::OverturnMid => s("overturn-mid", "overturn profile 0.0 -> 0.30 (P-CARE's)", 0, "overturn_easy = 0.0\noverturn_hard = 0.30\n", "", "", "19-21 + 8 SFT"),
            Cell::OverturnFlat => s("overturn-flat", "overturn profile flat at 0.10", 0, "overturn_easy = 0.10\noverturn_hard = 0.10\n", "", "", "19-21 + 8 SFT"),
            Cell::Rounds1 => s("rounds1", "one round of reflection", 0, "reflect_rounds = 1\n", "", "", "19-21 + 8 SFT"),
            Cell::Rounds3 => s("rounds3", "three rounds of reflection", 0, "reflect_rounds = 3\n", "", "", "19-21 + 8 SFT (longer traces may take more)"),
            Cell::G16 => s("g16", "group size 16", 0, "", "", "group_size = 16\n", "51-57"),
            Cell::V3Design1 => s("v3-design1", "v3's design 1 (800 SFT steps, overturns 0.10 -> 0.02 from round 1)", 0, "overturn_easy = 0.10\noverturn_hard = 0.02\noverturn_from_round = 1\n", "steps = 800\nschedule = { peak_lr = 3e-3, warmup_steps = 20, decay = \"cosine\", total_steps = 800, min_lr = 3e-4 }\n", "", "19-21 + 4 SFT"),
            Cell::V3Design2 => s("v3-design2", "v3's design 2 (overturns 0.05 -> 0.01 from round 1)", 0, "overturn_easy = 0.05\noverturn_hard = 0.01\noverturn_from_round = 1\n", "", "", "19-21 + 8 SFT"),
        }
    }
}

impl Spec {
    /// Whether the cell needs an SFT checkpoint of its own.
    pub fn own_sft(&self) -> bool {
        self.sft_seed != 0 || !self.data.is_empty() || !self.sft.is_empty()
    }

    /// Where the cell's report goes.
    pub fn out(&self) -> String {
        format!("docs/v4/robust/{}", self.name)
    }

    /// The cell's configs from the main design's base config and SFT config (TOML texts):
    /// (GRPO base, SFT config when the cell has its own checkpoint).
    pub fn configs(&self, base: &str, sft: &str) -> Result<(String, Option<String>)> {
        let parse = |t: &str, what: &str| -> Result<toml::Table> {
            toml::from_str(t).with_context(|| format!("cell {}: parsing {what}", self.name))
        };
        let data = parse(&format!("[data]\n{}", self.data), "its [data] overrides")?;
        let sft_name = format!("v4-{}", self.name);
        let mut doc = parse(base, "the base config")?;
        let mut over = parse(
            &format!(
                "[run]\ndir = \"runs/repro-v4-{}\"\n[grpo]\n{}",
                self.name, self.grpo
            ),
            "its [grpo] overrides",
        )?;
        if self.own_sft() {
            merge(
                &mut over,
                parse(
                    &format!("[model]\npath = \"runs/{sft_name}/sft\"\n"),
                    "model",
                )?,
            );
        }
        merge(&mut over, data.clone());
        merge(&mut doc, over);
        let sft_text = if self.own_sft() {
            let mut s = parse(sft, "the SFT config")?;
            let mut o = parse(
                &format!(
                    "[run]\nname = \"{sft_name}\"\nseed = {}\n[sft]\n{}",
                    self.sft_seed, self.sft
                ),
                "its [sft] overrides",
            )?;
            merge(&mut o, data);
            merge(&mut s, o);
            Some(toml::to_string(&s)?)
        } else {
            None
        };
        Ok((toml::to_string(&doc)?, sft_text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;
    use std::path::Path;

    /// Every cell's configs are valid, start from the checkpoint their SFT config writes, and
    /// differ from the main design in the cell's knob alone.
    #[test]
    fn every_cell_moves_its_knob_and_nothing_else() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        let (base, sft) = (read("configs/repro-v4.toml"), read("configs/v3.toml"));
        let main = terse_train::RunConfig::from_toml(&base, Path::new("main")).expect("main");
        let main_sft = terse_train::RunConfig::from_toml(&sft, Path::new("sft")).expect("sft");
        let mut names = vec![];
        for &cell in Cell::value_variants() {
            let spec = cell.spec();
            names.push(spec.name);
            let (b, s) = spec.configs(&base, &sft).expect("configs");
            let b = terse_train::RunConfig::from_toml(&b, Path::new(spec.name))
                .unwrap_or_else(|e| panic!("{}: {e:#}", spec.name));
            assert_eq!(
                b.run.dir,
                Path::new(&format!("runs/repro-v4-{}", spec.name))
            );
            assert_eq!(b.grpo.steps, main.grpo.steps, "{}", spec.name);
            let knobs = |c: &terse_train::RunConfig| {
                (
                    c.data.overturn_easy,
                    c.data.overturn_hard,
                    c.data.reflect_rounds,
                    c.data.overturn_from_round,
                    c.grpo.group_size,
                )
            };
            match cell {
                Cell::G16 => assert_eq!(knobs(&b), (0.25, 0.05, 2, 2, 16)),
                Cell::Rounds3 => assert_eq!(knobs(&b), (0.25, 0.05, 3, 2, 6)),
                Cell::OverturnMid => assert_eq!(knobs(&b), (0.0, 0.30, 2, 2, 6)),
                Cell::V3Design1 => assert_eq!(knobs(&b), (0.10, 0.02, 2, 1, 6)),
                Cell::Sft1 | Cell::Sft2 => assert_eq!(knobs(&b), knobs(&main)),
                _ => assert_ne!(knobs(&b), knobs(&main), "{}", spec.name),
            }
            match s {
                None => {
                    assert!(!spec.own_sft());
                    assert_eq!(b.model.path, main.model.path);
                }
                Some(s) => {
                    let s = terse_train::RunConfig::from_toml(&s, Path::new("cell sft"))
                        .unwrap_or_else(|e| panic!("{} sft: {e:#}", spec.name));
                    assert_eq!(b.model.path, s.run.dir.join(&s.run.name).join("sft"));
                    assert_eq!(s.run.seed, spec.sft_seed);
                    // The checkpoint learns the traces its GRPO problems come from.
                    let k = knobs(&s);
                    assert_eq!((k.0, k.1, k.2, k.3), {
                        let k = knobs(&b);
                        (k.0, k.1, k.2, k.3)
                    });
                    let steps = if cell == Cell::V3Design1 { 800 } else { 1600 };
                    assert_eq!(s.sft.steps, steps, "{}", spec.name);
                    assert_ne!(s.run.name, main_sft.run.name, "never the main checkpoint");
                }
            }
        }
        names.dedup();
        assert_eq!(
            names.len(),
            Cell::value_variants().len(),
            "names are distinct"
        );
    }
}
