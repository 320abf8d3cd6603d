//! What `cargo xtask eval` prints of an [`EvalOutcome`] (protocol.rs): a header naming the
//! sampling protocol, the by-level table, the efficiency table, the table against the baseline
//! (AES with its constants, pass@k retention) and accuracy by token budget, in markdown; and
//! the same as one JSON object for `--json`.

use crate::eval::protocol::{EvalOutcome, ModelEval};
use std::fmt::Write as _;

/// `x` with `digits` decimals, or "-" when undefined.
fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The sampling settings line.
pub fn header(o: &EvalOutcome) -> String {
    let s = &o.setup;
    let p = &s.sampling;
    let name = match s.protocol {
        Some(p) => format!(
            "protocol {}",
            serde_json::to_value(p)
                .unwrap_or_default()
                .as_str()
                .unwrap_or("?")
        ),
        None => "sampling".into(),
    };
    let mut line = format!(
        "{name}: temperature {}, top-p {}, top-k {}, {} samples per problem (avg@{n}), at most {} new tokens",
        p.temperature,
        p.top_p,
        if p.top_k == 0 { "off".to_string() } else { p.top_k.to_string() },
        s.samples,
        s.max_new_tokens,
        n = s.samples,
    );
    if !s.budgets.is_empty() {
        let b: Vec<String> = s.budgets.iter().map(usize::to_string).collect();
        let _ = write!(
            line,
            "; budgets {} (answer forced at each cut)",
            b.join(", ")
        );
    }
    line
}

/// pass@1, pass@k and tokens by level, with the baseline's and the compression rate.
fn by_level(o: &EvalOutcome, out: &mut String) {
    let (r, k) = (&o.model.report, o.setup.samples);
    let base = o.base.as_ref().map(|b| &b.report);
    let _ = writeln!(
        out,
        "| level | pass@1 | pass@{k} | tokens |{}",
        if base.is_some() {
            " base pass@1 | base tokens | CR |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|{}",
        if base.is_some() { "---|---|---|" } else { "" }
    );
    // The base's pass@1 and tokens, and the compression rate of the model's tokens to them.
    let vs_base = |pass1: f64, base_len: f64, len: f64| {
        format!(
            " {pass1:.3} | {base_len:.1} | {:.1}% |",
            100.0 * terse_reward::metrics::compression_rate(len, base_len)
        )
    };
    for (i, l) in r.by_level.iter().enumerate() {
        let extra = base
            .and_then(|b| b.by_level.get(i))
            .map_or(String::new(), |bl| {
                vs_base(bl.pass1, bl.len_mean, l.len_mean)
            });
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.3} | {:.1} |{extra}",
            l.level, l.pass1, l.pass_k, l.len_mean
        );
    }
    let extra = base.map_or(String::new(), |b| {
        vs_base(b.accuracy, b.len_mean, r.len_mean)
    });
    let _ = writeln!(
        out,
        "| all | {:.3} | - | {:.1} |{extra}",
        r.accuracy, r.len_mean
    );
}

/// The efficiency metrics, one row per run (averaged over samples).
fn efficiency(o: &EvalOutcome, out: &mut String) {
    let n = o.setup.samples;
    let _ = writeln!(
        out,
        "| run | avg@{n} | pass@{n} | tokens | acc / 1k tokens | completion rate | cond. correctness | tokens right | tokens wrong | truncation rate |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    let runs = std::iter::once(("model", &o.model)).chain(o.base.as_ref().map(|b| ("base", b)));
    for (name, m) in runs {
        let e = &m.efficiency;
        let _ = writeln!(
            out,
            "| {name} | {:.3} | {:.3} | {:.1} | {} | {:.3} | {} | {} | {} | {:.3} |",
            e.accuracy,
            e.pass_k,
            e.len_mean,
            opt(e.acc_per_1k, 3),
            e.completion_rate,
            opt(e.conditional_correctness, 3),
            opt(e.len_correct, 1),
            opt(e.len_incorrect, 1),
            e.truncation_rate
        );
    }
}

/// AES (with its constants), pass@k retention and the compression rate against the baseline.
fn versus(o: &EvalOutcome, out: &mut String) {
    let Some(v) = &o.vs_base else { return };
    let w = o.setup.aes;
    let n = o.setup.samples;
    let _ = writeln!(
        out,
        "AES (O1-Pruner): α·ΔL + β+·ΔA if ΔA ≥ 0, else α·ΔL − β−·|ΔA|; α = {}, β+ = {}, β− = {}",
        w.alpha, w.beta_plus, w.beta_minus
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "| vs base | ΔL | ΔA | AES | pass@{n} retention | CR |");
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| model | {} | {} | {} | {} | {:.1}% |",
        opt(v.aes.map(|a| a.delta_len), 3),
        opt(v.aes.map(|a| a.delta_acc), 3),
        opt(v.aes.map(|a| a.score), 3),
        opt(v.pass_k_retention, 3),
        100.0 * v.compression_rate
    );
}

/// Accuracy, forced share and tokens at each budget.
fn budgets(o: &EvalOutcome, out: &mut String) {
    if o.model.budgets.is_empty() {
        return;
    }
    let base = o.base.as_ref();
    let _ = writeln!(
        out,
        "| budget | accuracy | forced | tokens |{}",
        if base.is_some() {
            " base accuracy | base forced | base tokens |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|{}",
        if base.is_some() { "---|---|---|" } else { "" }
    );
    let cells = |m: &ModelEval, i: usize| {
        m.budgets.get(i).map_or(" - | - | - |".to_string(), |p| {
            format!(
                " {:.3} | {:.3} | {:.1} |",
                p.accuracy, p.forced_rate, p.tokens_mean
            )
        })
    };
    for (i, p) in o.model.budgets.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} |{}{}",
            p.budget,
            cells(&o.model, i),
            base.map_or(String::new(), |b| cells(b, i))
        );
    }
}

/// The whole report in markdown.
pub fn markdown(o: &EvalOutcome) -> String {
    let mut out = header(o) + "\n\n";
    by_level(o, &mut out);
    out.push('\n');
    efficiency(o, &mut out);
    if o.vs_base.is_some() {
        out.push('\n');
        versus(o, &mut out);
    }
    if !o.model.budgets.is_empty() {
        out.push('\n');
        budgets(o, &mut out);
    }
    out
}

/// The report as one JSON object: `model` and `base` (by level, as before) and
/// `compression_rate` (over levels) as earlier versions printed them, then `setup`,
/// `efficiency`, `vs_base` and `budgets`.
pub fn json(o: &EvalOutcome) -> serde_json::Value {
    let cr = o.base.as_ref().map(|b| {
        terse_reward::metrics::compression_rate(o.model.report.len_mean, b.report.len_mean)
    });
    serde_json::json!({
        "model": o.model.report,
        "base": o.base.as_ref().map(|b| &b.report),
        "compression_rate": cr,
        "setup": o.setup,
        "efficiency": {
            "model": o.model.efficiency,
            "base": o.base.as_ref().map(|b| &b.efficiency),
        },
        "vs_base": o.vs_base,
        "budgets": {
            "model": o.model.budgets,
            "base": o.base.as_ref().map(|b| &b.budgets),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::metrics::{efficiency, AesWeights, SampleOutcome};
    use crate::eval::protocol::{versus, BudgetPoint, Protocol, Setup};
    use crate::report::{EvalReport, LevelReport};

    fn run(len: usize, correct: bool) -> ModelEval {
        let s = SampleOutcome {
            len,
            finished: true,
            correct,
        };
        ModelEval {
            report: EvalReport {
                accuracy: 0.5,
                len_mean: len as f64,
                by_level: vec![LevelReport {
                    level: 1,
                    pass1: 0.5,
                    pass_k: 1.0,
                    len_mean: len as f64,
                    reflections_mean: 0.0,
                    examples: vec![],
                }],
            },
            efficiency: efficiency(&[vec![
                s,
                SampleOutcome {
                    correct: false,
                    ..s
                },
            ]]),
            budgets: vec![BudgetPoint {
                budget: 16,
                accuracy: 0.25,
                forced_rate: 0.5,
                tokens_mean: 12.0,
            }],
        }
    }

    /// The header names the protocol; the tables carry the AES constants and every run's row.
    #[test]
    fn markdown_names_protocol_constants_and_runs() {
        let (m, b) = (run(50, true), run(100, true));
        let o = EvalOutcome {
            setup: Setup {
                protocol: Some(Protocol::R1),
                sampling: Protocol::R1.sampling(),
                samples: 2,
                max_new_tokens: 16,
                budgets: vec![16],
                aes: AesWeights::default(),
            },
            vs_base: Some(versus(AesWeights::default(), &m.efficiency, &b.efficiency)),
            model: m,
            base: Some(b),
            plots: vec![],
        };
        let md = markdown(&o);
        assert!(md.starts_with("protocol r1: temperature 0.6, top-p 0.95, top-k off, 2 samples per problem (avg@2), at most 16 new tokens; budgets 16"), "{md}");
        assert!(md.contains("α = 1, β+ = 3, β− = 5"), "{md}");
        // Half the tokens at the same accuracy: ΔL = 0.5, ΔA = 0, AES = 0.5, retention 1.
        assert!(
            md.contains("| model | 0.500 | 0.000 | 0.500 | 1.000 | 50.0% |"),
            "{md}"
        );
        assert!(md.contains("| model | 0.500 | 1.000 | 50.0 |"), "{md}");
        assert!(
            md.contains("| 16 | 0.250 | 0.500 | 12.0 | 0.250 | 0.500 | 12.0 |"),
            "{md}"
        );
        let j = json(&o);
        assert_eq!(j["vs_base"]["aes"]["score"], 0.5);
        assert_eq!(j["compression_rate"], 0.5);
    }
}
