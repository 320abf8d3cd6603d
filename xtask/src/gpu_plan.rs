//! The device check as a plan that a short GPU window cannot waste: an ordered list of steps
//! (parity groups first, the path the model runs on before the rest; benchmarks after; HF
//! generate last), each with its expected seconds. A numeric miss is a row with `ok: false`
//! and the plan goes on; a failing step becomes that step's `error` and the plan goes on; only
//! a CUDA error (a fault or a sticky launch failure, after which every later call fails too)
//! stops it. The report is rewritten after every step, so a kill keeps what finished.
//!
//! Device-agnostic: gpu.rs builds the real plan on a CUDA build; the tests below run fake steps
//! through the same driver on the CPU.

use anyhow::Result;
use serde_json::{json, Map, Value};

/// One step of the plan: its report key, its expected seconds on an H200, and what it runs.
pub struct Step<'a> {
    pub key: String,
    pub expect_s: f64,
    pub run: Box<dyn FnOnce() -> Result<Value> + 'a>,
}

impl<'a> Step<'a> {
    pub fn new(key: &str, expect_s: f64, run: impl FnOnce() -> Result<Value> + 'a) -> Self {
        Self {
            key: key.into(),
            expect_s,
            run: Box::new(run),
        }
    }
}

/// Whether an error is the device's (the context is unusable after it), not the step's.
pub fn is_device_fault(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    [
        "CUDA_ERROR",
        "DriverError",
        "illegal memory access",
        "unspecified launch failure",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// The plan's expected total, printed before it starts.
pub fn expected_total(steps: &[Step<'_>]) -> f64 {
    steps.iter().map(|s| s.expect_s).sum()
}

/// Runs `steps` in order into one report (see the module docs). `write` is called with the
/// report after every step. Returns the report; `stopped_at` names the step a device fault
/// ended the plan at.
pub fn run(
    steps: Vec<Step<'_>>,
    mut write: impl FnMut(&Map<String, Value>) -> Result<()>,
) -> Result<Map<String, Value>> {
    let mut report = Map::new();
    let plan: Vec<Value> = steps
        .iter()
        .map(|s| json!({"step": s.key, "expect_s": s.expect_s}))
        .collect();
    println!(
        "gpu-check plan: {} steps, about {:.0} s in all",
        steps.len(),
        expected_total(&steps)
    );
    report.insert("plan".into(), Value::Array(plan));
    let mut keys = vec![];
    for step in steps {
        println!("== {} (about {:.0} s)", step.key, step.expect_s);
        let t0 = std::time::Instant::now();
        let outcome = (step.run)();
        let secs = t0.elapsed().as_secs_f64();
        let fault = match outcome {
            Ok(v) => {
                report.insert(step.key.clone(), v);
                None
            }
            Err(e) => {
                println!("{}: {e:#}", step.key);
                report.insert(step.key.clone(), json!({"error": format!("{e:#}")}));
                is_device_fault(&e).then(|| step.key.clone())
            }
        };
        keys.push(json!({"step": step.key, "seconds": secs}));
        report.insert("timings".into(), Value::Array(keys.clone()));
        if let Some(at) = fault {
            report.insert("stopped_at".into(), json!(at));
            write(&report)?;
            return Ok(report);
        }
        write(&report)?;
    }
    Ok(report)
}

/// Parity rows as the report holds them; a miss is recorded, never a stop.
pub fn parity_rows(group: &str, rows: &[terse_model::testing::parity::Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({"group": group, "op": r.name, "max_diff": r.max_diff,
                       "tolerance": r.tolerance, "ok": r.ok()})
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use terse_model::testing::parity::Row;

    /// A numeric miss and a failing benchmark are rows, and the plan goes on; a device fault
    /// stops it with `stopped_at`; the report is written after every step.
    #[test]
    fn a_miss_and_a_failing_step_do_not_stop_the_plan_a_device_fault_does() {
        let miss = Row {
            name: "flash bf16 dq".into(),
            max_diff: 0.5,
            tolerance: 0.01,
        };
        let steps = vec![
            Step::new("parity flash bf16", 5.0, move || {
                Ok(parity_rows("flash bf16", &[miss]))
            }),
            Step::new("decode", 30.0, || anyhow::bail!("out of patience")),
            Step::new("fwd_bwd", 20.0, || Ok(json!({"tokens_per_s": 1.0}))),
            Step::new("long_context", 60.0, || {
                anyhow::bail!(
                    "DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access\")"
                )
            }),
            Step::new("hf_generate", 120.0, || Ok(json!("never runs"))),
        ];
        assert_eq!(expected_total(&steps), 235.0);
        let mut writes = 0;
        let r = run(steps, |_| {
            writes += 1;
            Ok(())
        })
        .expect("run");
        assert_eq!(writes, 4, "written after every step that ran");
        assert_eq!(r["parity flash bf16"][0]["ok"], false);
        assert!(r["decode"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("patience")));
        assert_eq!(r["fwd_bwd"]["tokens_per_s"], 1.0);
        assert_eq!(r["stopped_at"], "long_context");
        assert!(r.get("hf_generate").is_none());
        assert_eq!(r["timings"].as_array().map(Vec::len), Some(4));
    }
}
