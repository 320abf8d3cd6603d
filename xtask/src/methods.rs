//! The reproduction study's rows: every length method with its config overrides, shared by
//! the study's runner (repro.rs) and its report (summary/).

/// One row of the study: a name, what the papers call it, and its config overrides (TOML;
/// `{l_max}` stands for the base config's `grpo.max_new_tokens`, the testbed's length limit,
/// and `{l_max*N/D}` / `{l_max/D}` for that fraction of it, rounded down).
pub struct Method {
    pub name: &'static str,
    pub label: &'static str,
    pub overrides: &'static str,
}

/// Seeds per method of the full study, `cargo xtask repro` without `--seeds` (5 fit in 30
/// minutes); a full study with another count is reported in results-seeds<N>.md.
pub const DEFAULT_SEEDS: u64 = 5;

pub const METHODS: &[Method] = &[
    Method { name: "standard", label: "Standard (no length term)", overrides: "[reward.shaper]\nmethod = \"none\"\n" },
    Method { name: "kimi", label: "Kimi (dense length reward)", overrides: "[reward.shaper]\nmethod = \"kimi\"\n" },
    Method { name: "cos_fn", label: "CosFn", overrides: "[reward.shaper]\nmethod = \"cos_fn\"\nl_max = {l_max}\n" },
    Method { name: "efficient", label: "Efficient (α = 0.1)", overrides: "[reward.shaper]\nmethod = \"efficient\"\n" },
    Method { name: "dapo_overlong", label: "DAPO overlong (last 32 tokens)", overrides: "[reward.shaper]\nmethod = \"none\"\n[reward.overlong]\nl_max = {l_max}\nl_cache = 32\n" },
    Method { name: "short_rl_d1", label: "Short-RL D1 (correct only)", overrides: "[reward.shaper]\nmethod = \"short_rl\"\ntau_len = 4\ntau_acc = 0.05\nnucleus = false\nacc_gate = false\n" },
    Method { name: "short_rl_d1_d2", label: "Short-RL D1+D2 (+ nucleus)", overrides: "[reward.shaper]\nmethod = \"short_rl\"\ntau_len = 4\ntau_acc = 0.05\nacc_gate = false\n" },
    Method { name: "short_rl_d1_d3", label: "Short-RL D1+D3 (+ gate)", overrides: "[reward.shaper]\nmethod = \"short_rl\"\ntau_len = 4\ntau_acc = 0.05\nnucleus = false\n" },
    Method { name: "short_rl", label: "Short-RL (D1+D2+D3)", overrides: "[reward.shaper]\nmethod = \"short_rl\"\ntau_len = 4\ntau_acc = 0.05\n" },
    Method { name: "grpo_lambda_lp", label: "+LP (GRPO-λ, λ = 1)", overrides: "[reward.shaper]\nmethod = \"grpo_lambda\"\nlambda = 1.0\n" },
    Method { name: "grpo_lambda", label: "GRPO-λ (λ = 0.2)", overrides: "[reward.shaper]\nmethod = \"grpo_lambda\"\nlambda = 0.2\n" },
    Method { name: "care", label: "CARE", overrides: "[reward.shaper]\nmethod = \"care\"\nl_max = {l_max}\n" },
    Method { name: "step_grpo_no_dtr", label: "Step-GRPO w/o dynamic rollout", overrides: "[reward.shaper]\nmethod = \"step_grpo\"\n" },
    Method { name: "step_grpo", label: "Step-GRPO (δ = 0.95)", overrides: "[reward.shaper]\nmethod = \"step_grpo\"\n[grpo]\nstep_triggers = [\"Wait\"]\n[grpo.step_exit]\ninduction = \"</think> <answer>\"\nclose = \"</answer> <|im_end|>\"\nanswer_stops = [\"</answer>\"]\nmax_ans_tokens = 2\ndelta = 0.95\nmax_judge_steps = 10\ninclude_trigger_on_exit = false\n" },
    Method { name: "step_grpo_d99", label: "Step-GRPO (δ = 0.99)", overrides: "[reward.shaper]\nmethod = \"step_grpo\"\n[grpo]\nstep_triggers = [\"Wait\"]\n[grpo.step_exit]\ninduction = \"</think> <answer>\"\nclose = \"</answer> <|im_end|>\"\nanswer_stops = [\"</answer>\"]\nmax_ans_tokens = 2\ndelta = 0.99\nmax_judge_steps = 10\ninclude_trigger_on_exit = false\n" },
];

impl Method {
    /// The overrides for a base config that samples at most `l_max` tokens.
    pub fn resolved(&self, l_max: usize) -> String {
        let (mut out, mut rest) = (String::new(), self.overrides);
        while let Some(i) = rest.find("{l_max") {
            let after = &rest[i + "{l_max".len()..];
            let Some(end) = after.find('}') else { break };
            let value = fraction(&after[..end]).map(|(n, d)| l_max * n / d);
            out.push_str(&rest[..i]);
            match value {
                Some(v) => out.push_str(&v.to_string()),
                None => out.push_str(&rest[i..i + "{l_max".len() + end + 1]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// Deep-merges TOML table `b` into `a` (tables merge, other values replace): how a method's,
/// a run's or a robustness cell's overrides apply to a base config.
pub fn merge(a: &mut toml::Table, b: toml::Table) {
    for (k, v) in b {
        match (a.get_mut(&k), v) {
            (Some(toml::Value::Table(x)), toml::Value::Table(y)) => merge(x, y),
            (_, v) => {
                a.insert(k, v);
            }
        }
    }
}

/// The (N, D) of a placeholder's suffix: "" is 1/1, "*N/D" and "/D" are fractions.
fn fraction(suffix: &str) -> Option<(usize, usize)> {
    if suffix.is_empty() {
        return Some((1, 1));
    }
    let (n, d) = match suffix.strip_prefix('*') {
        Some(r) => r.split_once('/')?,
        None => ("1", suffix.strip_prefix('/')?),
    };
    let (n, d) = (n.parse().ok()?, d.parse::<usize>().ok()?);
    (d > 0).then_some((n, d))
}

/// Variants studied only when named (`--methods`), so the default study keeps its 30 minutes.
/// The five methods of issue 46 are here (docs/methods.md has each): DLER trains at 3/4 of the
/// limit (its truncation is the length penalty; through a one-round `think_prune`, so the
/// evaluation keeps the full limit as every other method's), ThinkPrune prunes in three rounds
/// of 20 steps to 1/2 of it, GFPO samples 12 and keeps the 6 shortest.
pub const VARIANTS: &[Method] = &[
    Method { name: "step_grpo_kept", label: "Step-GRPO (δ = 0.95, trigger kept)", overrides: "[reward.shaper]\nmethod = \"step_grpo\"\n[grpo]\nstep_triggers = [\"Wait\"]\n[grpo.step_exit]\ninduction = \"</think> <answer>\"\nclose = \"</answer> <|im_end|>\"\nanswer_stops = [\"</answer>\"]\nmax_ans_tokens = 2\ndelta = 0.95\nmax_judge_steps = 10\ninclude_trigger_on_exit = true\nprobe_without_trigger = true\n" },
    Method { name: "dler", label: "DLER (batch norm, truncation at 3/4)", overrides: "[reward.shaper]\nmethod = \"none\"\n[advantage]\nnorm = \"batch\"\n[grpo]\ntruncated_reward = \"zero\"\ndynamic_sampling = { max_rounds = 2 }\n[grpo.think_prune]\nlimits = [{l_max*3/4}]\nsteps_per_round = 1\n" },
    Method { name: "laser_d", label: "LASER-D (α = 0.5)", overrides: "[reward.shaper]\nmethod = \"laser_d\"\nl_max = {l_max}\nlower = 16\ninterval = 8\nupdate_every = 5\n" },
    Method { name: "gfpo", label: "GFPO (shortest 6 of 12)", overrides: "[reward.shaper]\nmethod = \"none\"\n[grpo]\ngroup_size = 12\n[grpo.gfpo]\nkeep = 6\nmetric = \"length\"\n" },
    Method { name: "think_prune", label: "ThinkPrune (3/4, 5/8, 1/2)", overrides: "[reward.shaper]\nmethod = \"none\"\n[grpo.think_prune]\nlimits = [{l_max*3/4}, {l_max*5/8}, {l_max/2}]\nsteps_per_round = 20\n" },
    Method { name: "grpo_lead", label: "GRPO-LEAD (α = 0.05, difficulty weights)", overrides: "[reward.shaper]\nmethod = \"grpo_lead\"\n[advantage]\ndifficulty = {}\n" },
];

/// Rows only v4's studies run (docs/v4/plan.md): the paper-literal Step-GRPO (the code's
/// defaults: the trigger in the kept path and in the probe context) and CARE's premise
/// condition at G = 16. Apart from `known()`, so v2's and v3's `--methods all` stay the studies
/// their committed reports came from.
pub const V4_ROWS: &[Method] = &[
    Method { name: "step_grpo_paper", label: "Step-GRPO (paper)", overrides: "[reward.shaper]\nmethod = \"step_grpo\"\n[grpo]\nstep_triggers = [\"Wait\"]\n[grpo.step_exit]\ninduction = \"</think> <answer>\"\nclose = \"</answer> <|im_end|>\"\nanswer_stops = [\"</answer>\"]\nmax_ans_tokens = 2\ndelta = 0.95\nmax_judge_steps = 10\ninclude_trigger_on_exit = true\nprobe_without_trigger = false\n" },
    Method { name: "standard_g16", label: "Standard at G = 16", overrides: "[reward.shaper]\nmethod = \"none\"\n[grpo]\ngroup_size = 16\n" },
    Method { name: "care_g16", label: "CARE at G = 16", overrides: "[reward.shaper]\nmethod = \"care\"\nl_max = {l_max}\n[grpo]\ngroup_size = 16\n" },
];

/// v4's main design (docs/v4/plan.md section 7a): Standard, the four papers' rows and the three
/// other Step-GRPO variants, 8 rows x 9 seeds.
const V4_MAIN: [&str; 8] = [
    "standard",
    "short_rl",
    "grpo_lambda",
    "care",
    "step_grpo_paper",
    "step_grpo_kept",
    "step_grpo",
    "step_grpo_no_dtr",
];

/// `--methods v4-new`: the five newer methods with Standard (kept by `--keep` when the main
/// design's runs exist), so they meet Standard on the same seeds (plan section 7a).
const V4_NEW: [&str; 6] = [
    "standard",
    "dler",
    "laser_d",
    "gfpo",
    "think_prune",
    "grpo_lead",
];

/// CARE's premise condition (plan section 7b): Standard and CARE at the study's G and at 16.
const V4_CARE: [&str; 4] = ["standard", "care", "standard_g16", "care_g16"];

/// The testbed a study runs on (`repro --testbed`): its base config, the SFT config that makes
/// its starting checkpoint, where its report goes, and the methods it studies by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Testbed {
    /// Testbed v2: every method, from the committed SFT fixture, into docs/.
    V2,
    /// Testbed v3 (models/testbed/README.md): the length methods of the four papers, from the
    /// checkpoint of configs/v3.toml (trained first when missing), into docs/v3/.
    V3,
    /// Testbed v4's confirmatory study (docs/v4/plan.md): v3's design 3 on seeds 100-108,
    /// from the same checkpoint as v3, into docs/v4/.
    V4,
    /// v4's CARE premise condition (plan section 7b): overturns on the partially solvable
    /// levels only, its own checkpoint (configs/v4-care.toml), into docs/v4/care/.
    V4Care,
    /// v4's second CARE premise condition (P-CARE-L, the plan's note of 2026-12-03): a
    /// per-level overturn profile that P-CARE's straight line could not draw, its own checkpoint
    /// (configs/v4-care-levels.toml), into docs/v4/care-levels/.
    V4CareLevels,
    /// Study v5 (docs/v5/plan.md): a verbose start, fresh SFT checkpoints of configs/v5.toml as
    /// the unit, each row x GRPO seeds 200-202 from each, into docs/v5/ (repro_v5.rs).
    V5,
    /// Study v5's exploratory X6 (docs/v5/plan.md section 11): CARE's premise with the
    /// difficulty hidden (every prompt four operations, the level a class the prompt does not
    /// show), v4's premise condition's rows, runner and report, into docs/v5/care-hidden/.
    V5CareHidden,
}

/// v5's rows (docs/v5/plan.md section 3): Standard and the five claims' rows.
const V5_MAIN: [&str; 6] = [
    "standard",
    "short_rl",
    "grpo_lambda",
    "care",
    "step_grpo_paper",
    "dler",
];

/// `--methods v5-new` (plan section 10, X4): the four v4 newer methods beside Standard.
const V5_NEW: [&str; 5] = ["standard", "laser_d", "gfpo", "think_prune", "grpo_lead"];

impl Testbed {
    pub fn config(self) -> &'static str {
        match self {
            Testbed::V2 => "configs/repro.toml",
            Testbed::V3 => "configs/repro-v3.toml",
            Testbed::V4 => "configs/repro-v4.toml",
            Testbed::V4Care => "configs/repro-v4-care.toml",
            Testbed::V4CareLevels => "configs/repro-v4-care-levels.toml",
            Testbed::V5 => "configs/repro-v5.toml",
            Testbed::V5CareHidden => "configs/repro-v5-care-hidden.toml",
        }
    }

    pub fn out(self) -> &'static str {
        match self {
            Testbed::V2 => "docs",
            Testbed::V3 => "docs/v3",
            Testbed::V4 => "docs/v4",
            Testbed::V4Care => "docs/v4/care",
            Testbed::V4CareLevels => "docs/v4/care-levels",
            Testbed::V5 => "docs/v5",
            Testbed::V5CareHidden => "docs/v5/care-hidden",
        }
    }

    /// How reports name it after "testbed" (v2, the default, is unnamed).
    pub fn label(self) -> &'static str {
        match self {
            Testbed::V2 => "",
            Testbed::V3 => " v3",
            Testbed::V4 => " v4",
            Testbed::V4Care => " v4-care",
            Testbed::V4CareLevels => " v4-care-levels",
            Testbed::V5 => " v5",
            Testbed::V5CareHidden => " v5-care-hidden",
        }
    }

    /// The SFT config that writes the base config's checkpoint, when it is not committed.
    pub fn sft(self) -> Option<&'static str> {
        match self {
            Testbed::V2 => None,
            Testbed::V3 | Testbed::V4 => Some("configs/v3.toml"),
            Testbed::V4Care => Some("configs/v4-care.toml"),
            Testbed::V4CareLevels => Some("configs/v4-care-levels.toml"),
            Testbed::V5 => Some("configs/v5.toml"),
            Testbed::V5CareHidden => Some("configs/v5-care-hidden.toml"),
        }
    }

    /// Seeds per method when `--seeds` is not given: v4 fixes 9 in its plan (section 6).
    pub fn default_seeds(self) -> u64 {
        match self {
            Testbed::V2 | Testbed::V3 => DEFAULT_SEEDS,
            Testbed::V4 | Testbed::V4Care | Testbed::V4CareLevels | Testbed::V5CareHidden => 9,
            Testbed::V5 => 3,
        }
    }

    /// The GRPO seed of the run with index `i` (`-s<i>`): v4's seeds 100-108 are disjoint from
    /// every seed v2 and v3 used (plan section 6); run names keep the index, the pairing key.
    pub fn run_seed(self, i: u64) -> u64 {
        match self {
            Testbed::V2 | Testbed::V3 => i,
            Testbed::V4 | Testbed::V4Care | Testbed::V4CareLevels => 100 + i,
            Testbed::V5 | Testbed::V5CareHidden => 200 + i,
        }
    }

    /// The rows a v4 report reads, whichever invocation trained them: the main design's, the
    /// newer methods' and every other known method run into its directory (exploratory rows
    /// such as Kimi's), or the premise condition's four.
    pub fn reported(self) -> Vec<&'static Method> {
        match self {
            Testbed::V4Care | Testbed::V4CareLevels | Testbed::V5CareHidden => self.methods(),
            _ => known().chain(named(&["step_grpo_paper"])).collect(),
        }
    }

    /// Whether the study is v4's confirmatory one, reported by report_v4.rs.
    pub fn is_v4(self) -> bool {
        matches!(
            self,
            Testbed::V4 | Testbed::V4Care | Testbed::V4CareLevels | Testbed::V5CareHidden
        )
    }

    /// The methods studied when `--methods` names none.
    pub fn methods(self) -> Vec<&'static Method> {
        match self {
            Testbed::V2 => METHODS.iter().collect(),
            Testbed::V3 => {
                let names = [
                    "standard",
                    "short_rl",
                    "grpo_lambda",
                    "care",
                    "step_grpo",
                    "step_grpo_kept",
                ];
                known().filter(|m| names.contains(&m.name)).collect()
            }
            Testbed::V4 => named(&V4_MAIN),
            Testbed::V4Care | Testbed::V4CareLevels | Testbed::V5CareHidden => named(&V4_CARE),
            Testbed::V5 => named(&V5_MAIN),
        }
    }
}

/// The known methods and v4's rows whose names are in `names`, in the study's order.
fn named(names: &[&str]) -> Vec<&'static Method> {
    nameable().filter(|m| names.contains(&m.name)).collect()
}

/// Every method `--methods` can name one by one: `known()`, then v4's rows.
pub fn nameable() -> impl Iterator<Item = &'static Method> {
    known().chain(V4_ROWS)
}

/// Every method `--methods` can name (`--methods all`): the default study's, then the variants.
pub fn known() -> impl Iterator<Item = &'static Method> {
    METHODS.iter().chain(VARIANTS)
}

/// The study's methods named in `names` (the testbed's default set when `names` is empty,
/// every method and variant for `all`, v4's newer methods with Standard for `v4-new`), in the
/// study's order; an unknown name is an error that lists the known ones.
pub fn select(names: &[String], testbed: Testbed) -> anyhow::Result<Vec<&'static Method>> {
    if names == ["all"] {
        return Ok(known().collect());
    }
    if names == ["v4-new"] {
        return Ok(named(&V4_NEW));
    }
    if names == ["v5-new"] {
        return Ok(named(&V5_NEW));
    }
    if let Some(bad) = names
        .iter()
        .find(|n| !nameable().any(|m| m.name == n.as_str()))
    {
        let known: Vec<&str> = nameable().map(|m| m.name).collect();
        anyhow::bail!(
            "repro --methods: unknown method `{bad}` (known: {})",
            known.join(", ")
        );
    }
    if names.is_empty() {
        return Ok(testbed.methods());
    }
    Ok(nameable()
        .filter(|m| names.iter().any(|n| n == m.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_keeps_the_study_order_and_names_an_unknown_method() {
        let all = select(&[], Testbed::V2).expect("all");
        assert_eq!(all.len(), METHODS.len());
        let two = select(&["cos_fn".into(), "standard".into()], Testbed::V2).expect("two");
        assert_eq!(
            two.iter().map(|m| m.name).collect::<Vec<_>>(),
            ["standard", "cos_fn"]
        );
        let e = select(&["cosfn".into()], Testbed::V2)
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains("`cosfn`") && e.contains("cos_fn"), "{e}");
        // A variant is studied only when named, after the default study's methods.
        assert!(all.iter().all(|m| m.name != "step_grpo_kept"));
        let v =
            select(&["step_grpo_kept".into(), "standard".into()], Testbed::V2).expect("variant");
        assert_eq!(
            v.iter().map(|m| m.name).collect::<Vec<_>>(),
            ["standard", "step_grpo_kept"]
        );
        let every = select(&["all".into()], Testbed::V3).expect("all");
        assert_eq!(every.len(), METHODS.len() + VARIANTS.len());
        // v3's default set holds the variant, in the study's order.
        let v3: Vec<&str> = select(&[], Testbed::V3)
            .expect("v3")
            .iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(v3.first(), Some(&"standard"));
        assert_eq!(v3.last(), Some(&"step_grpo_kept"));
        assert_eq!(v3.len(), 6);
        // v4's rows are nameable but not in `all`, so v3's every-method study is unchanged.
        assert!(every.iter().all(|m| m.name != "step_grpo_paper"));
        let v4: Vec<&str> = select(&[], Testbed::V4)
            .expect("v4")
            .iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(v4.len(), 8, "plan section 7a: 8 rows");
        for row in [
            "standard",
            "step_grpo_paper",
            "step_grpo_kept",
            "step_grpo_no_dtr",
        ] {
            assert!(v4.contains(&row), "{row} in {v4:?}");
        }
        let new: Vec<&str> = select(&["v4-new".into()], Testbed::V4)
            .expect("v4-new")
            .iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(
            new,
            [
                "standard",
                "dler",
                "laser_d",
                "gfpo",
                "think_prune",
                "grpo_lead"
            ]
        );
        let care: Vec<&str> = select(&[], Testbed::V4Care)
            .expect("care")
            .iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(care, ["standard", "care", "standard_g16", "care_g16"]);
        // Every v4 run names a claim's method or comparison, so none is run for nothing.
        use terse_study::confirmatory::CLAIMS;
        for name in v4.iter().chain(&new).chain(&care) {
            assert!(
                CLAIMS
                    .iter()
                    .any(|c| c.method == *name || c.against == *name),
                "{name} is in no claim"
            );
        }
        assert_eq!(
            (0..9).map(|i| Testbed::V4.run_seed(i)).collect::<Vec<_>>(),
            (100..109).collect::<Vec<_>>()
        );
        assert_eq!(Testbed::V3.run_seed(3), 3);
    }

    /// `{l_max}` becomes the base config's limit, and every override parses as TOML.
    #[test]
    fn overrides_resolve_the_length_limit() {
        for m in nameable() {
            let o = m.resolved(160);
            assert!(!o.contains("{l_max"), "{}: {o}", m.name);
            toml::from_str::<toml::Table>(&o).unwrap_or_else(|e| panic!("{}: {e}", m.name));
        }
        let care = select(&["care".into()], Testbed::V2).expect("care")[0].resolved(160);
        assert!(care.contains("l_max = 160"), "{care}");
        let tp = select(&["think_prune".into()], Testbed::V2).expect("tp")[0].resolved(112);
        assert!(tp.contains("limits = [84, 70, 56]"), "{tp}");
        // A malformed placeholder is left as written (the TOML parse then names it).
        let odd = Method {
            name: "x",
            label: "x",
            overrides: "a = {l_max*3}\nb = {l_max/0}\nc = {l_max",
        };
        assert_eq!(odd.resolved(8), "a = {l_max*3}\nb = {l_max/0}\nc = {l_max");
    }
}
