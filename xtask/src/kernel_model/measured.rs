//! `cargo xtask kernel-model --check-measured`: the model (timing.rs) against a measurement
//! committed under docs/gpu/measured/DATE/: Nsight Compute's duration of each FA2 kernel launch
//! (ncu_flash.csv) next to the time the model predicts from the launch's grid and the kernels'
//! SASS-derived inputs at the measured commit (model-inputs.json, written by `cargo xtask
//! kernel-model`), with the error, failing past 20 %.

use super::model::{Counts, Gpu};
use super::profile::Role;
use super::timing::{self, Constants, Launch, Sm, Step};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;

/// The measurement the model is calibrated on.
pub const DIR: &str = "docs/gpu/measured/2026-12-04";
/// The largest error the check allows.
pub const TOLERANCE: f64 = 0.20;

/// One kernel's inputs, as `cargo xtask kernel-model` derives them from its SASS.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub name: String,
    pub role: Role,
    pub d: u64,
    pub warps: u64,
    pub registers: u64,
    pub shared: u64,
    /// Query x key entries one warp covers per main-loop iteration.
    pub area: f64,
    pub step: Step,
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Forward => "forward",
        Role::Dq => "dq",
        Role::Dkdv => "dkdv",
    }
}

impl Inputs {
    pub fn json(&self) -> Value {
        let c = &self.step.counts;
        json!({"name": self.name, "role": role_name(self.role), "d": self.d,
               "warps": self.warps, "registers": self.registers, "shared_bytes": self.shared,
               "area": self.area, "latency_cycles_per_instruction": self.step.latency,
               "per_warp_iteration": {"instructions": c.issued, "hmma": c.hmma, "flops": c.flops,
               "wavefronts": c.wavefronts, "global_bytes": c.global_bytes}})
    }

    fn from_json(v: &Value) -> Result<Inputs> {
        let num = |path: &[&str]| -> Result<f64> {
            let mut x = v;
            for p in path {
                x = &x[*p];
            }
            x.as_f64()
                .with_context(|| format!("no number at `{}`", path.join(".")))
        };
        let name = v["name"].as_str().context("no `name`")?.to_string();
        let role = match v["role"].as_str() {
            Some("forward") => Role::Forward,
            Some("dq") => Role::Dq,
            Some("dkdv") => Role::Dkdv,
            other => bail!("{name}: `role` is {other:?}, not forward, dq or dkdv"),
        };
        let it = |k: &str| num(&["per_warp_iteration", k]);
        Ok(Inputs {
            role,
            d: num(&["d"])? as u64,
            warps: num(&["warps"])? as u64,
            registers: num(&["registers"])? as u64,
            shared: num(&["shared_bytes"])? as u64,
            area: num(&["area"])?,
            step: Step {
                counts: Counts {
                    issued: it("instructions")?,
                    hmma: it("hmma")?,
                    flops: it("flops")?,
                    wavefronts: it("wavefronts")?,
                    global_bytes: it("global_bytes")?,
                    ..Counts::default()
                },
                latency: num(&["latency_cycles_per_instruction"])?,
            },
            name,
        })
    }
}

/// The shape of a measured launch: gpu-check's flash shapes (batch 1, causal, no packing).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub t: u64,
    pub hq: u64,
    pub hkv: u64,
}

/// Rows (queries, or keys for dK/dV) a block covers: FA2_ROWS.
const ROWS: u64 = 64;

/// `k`'s launch at `shape`: its blocks' main-loop iterations in dispatch order (x fastest,
/// heaviest first: the forward and dQ take their row blocks in reverse, dK/dV's first key
/// block sees the most queries) and the bytes each tensor moves from DRAM once.
pub fn launch(k: &Inputs, s: Shape) -> Launch {
    let tiles = s.t.div_ceil(ROWS);
    let per_block = k.warps as f64 * k.area;
    let bytes = (s.t * k.d * 2) as f64;
    let (heads, iterations, tensors): (u64, Box<dyn Fn(u64) -> f64>, f64) = match k.role {
        // Row block rb sees key tiles 0..=rb.
        Role::Forward | Role::Dq => (
            s.hq,
            Box::new(move |x| {
                let rb = tiles - 1 - x;
                (ROWS * ROWS * (rb + 1)) as f64 / per_block
            }),
            // Q, O (and dO, dQ) per query head; K, V per key head.
            if k.role == Role::Forward {
                (2 * s.hq + 2 * s.hkv) as f64
            } else {
                (3 * s.hq + 2 * s.hkv) as f64
            },
        ),
        // Key block kb serves the queries from its first key on, for each query head of its
        // group.
        Role::Dkdv => (
            s.hkv,
            Box::new(move |x| {
                let queries = s.t - x * ROWS;
                ((s.hq / s.hkv) * queries * ROWS) as f64 / per_block
            }),
            (2 * s.hq + 4 * s.hkv) as f64,
        ),
    };
    let iterations = (0..heads)
        .flat_map(|_| (0..tiles).map(&iterations))
        .collect();
    Launch {
        iterations,
        warps: k.warps,
        registers: k.registers,
        shared: k.shared,
        dram_bytes: tensors * bytes,
    }
}

/// Nsight Compute's launches in `csv` (`--page details --csv`, lines before its header
/// skipped): (kernel, grid, mean duration in seconds) per kernel and grid, in launch order.
pub fn ncu_durations(csv: &str) -> Result<Vec<(String, String, f64, usize)>> {
    let mut lines = csv.lines().skip_while(|l| !l.starts_with("\"ID\""));
    let header = lines
        .next()
        .context("no Nsight Compute header (a line starting \"ID\")")?;
    let cols = csv_fields(header);
    let col = |name: &str| {
        cols.iter()
            .position(|c| c == name)
            .with_context(|| format!("no `{name}` column in the Nsight Compute header"))
    };
    let (kernel, grid, metric, unit, value) = (
        col("Kernel Name")?,
        col("Grid Size")?,
        col("Metric Name")?,
        col("Metric Unit")?,
        col("Metric Value")?,
    );
    let mut out: Vec<(String, String, f64, usize)> = vec![];
    for l in lines {
        let f = csv_fields(l);
        if f.len() <= value.max(unit).max(metric).max(kernel).max(grid) || f[metric] != "Duration" {
            continue;
        }
        let scale = match f[unit].as_str() {
            "ns" => 1e-9,
            "us" => 1e-6,
            "ms" => 1e-3,
            u => bail!("Duration in `{u}`, not ns, us or ms"),
        };
        let v: f64 = f[value]
            .replace(',', "")
            .parse()
            .with_context(|| format!("Duration `{}` is not a number", f[value]))?;
        let s = v * scale;
        match out
            .iter_mut()
            .find(|(k, g, _, _)| *k == f[kernel] && *g == f[grid])
        {
            Some(e) => {
                e.2 = (e.2 * e.3 as f64 + s) / (e.3 + 1) as f64;
                e.3 += 1;
            }
            None => out.push((f[kernel].clone(), f[grid].clone(), s, 1)),
        }
    }
    Ok(out)
}

/// The fields of one CSV line: comma-separated, each optionally in double quotes (a doubled
/// quote inside is one quote); commas inside quotes belong to the field.
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut field = String::new();
    let (mut quoted, mut chars) = (false, line.trim_end().chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    out.push(field);
    out
}

/// The grid's x and y from ncu's `(x, y, z)`.
fn grid_xy(g: &str) -> Result<(u64, u64)> {
    let v: Vec<u64> = g
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(|x| x.trim().parse())
        .collect::<Result<_, _>>()
        .with_context(|| format!("grid `{g}` is not (x, y, z)"))?;
    match v.as_slice() {
        [x, y, ..] => Ok((*x, *y)),
        _ => bail!("grid `{g}` is not (x, y, z)"),
    }
}

/// One row of the check.
#[derive(Debug, Clone)]
pub struct Row {
    pub kernel: String,
    pub t: u64,
    pub launches: usize,
    pub measured: f64,
    pub predicted: f64,
    pub prediction: timing::Prediction,
}

impl Row {
    pub fn error(&self) -> f64 {
        self.predicted / self.measured - 1.0
    }
}

/// The inputs of every kernel in `dir`'s model-inputs.json and its shape (Hq, Hkv).
pub fn read_inputs(dir: &Path) -> Result<(Vec<Inputs>, Shape)> {
    let path = dir.join("model-inputs.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let kernels = v["kernels"]
        .as_array()
        .with_context(|| format!("{}: no `kernels` array", path.display()))?
        .iter()
        .map(Inputs::from_json)
        .collect::<Result<Vec<_>>>()
        .with_context(|| format!("{}: a kernel's inputs", path.display()))?;
    let head = |k: &str| {
        v["shape"][k]
            .as_u64()
            .with_context(|| format!("{}: no `shape.{k}`", path.display()))
    };
    let shape = Shape {
        t: 0,
        hq: head("hq")?,
        hkv: head("hkv")?,
    };
    Ok((kernels, shape))
}

/// The check of `dir` (a measurement directory) with constants `k`: a row per measured kernel
/// and grid.
pub fn check(dir: &Path, g: &Gpu, k: &Constants, sm: &Sm) -> Result<Vec<Row>> {
    let (inputs, shape) = read_inputs(dir)?;
    let csv_path = dir.join("ncu_flash.csv");
    let csv = std::fs::read_to_string(&csv_path)
        .with_context(|| format!("reading {}", csv_path.display()))?;
    let mut rows = vec![];
    for (kernel, grid, measured, launches) in ncu_durations(&csv)? {
        let i = inputs
            .iter()
            .find(|i| i.name == kernel)
            .with_context(|| format!("{}: no inputs for {kernel}", csv_path.display()))?;
        let (x, _) = grid_xy(&grid)?;
        let s = Shape {
            t: x * ROWS,
            ..shape
        };
        let p = timing::predict(&launch(i, s), &i.step, g, k, sm);
        rows.push(Row {
            kernel,
            t: s.t,
            launches,
            measured,
            predicted: p.seconds,
            prediction: p,
        });
    }
    if rows.is_empty() {
        bail!("{}: no kernel durations", csv_path.display());
    }
    Ok(rows)
}

/// Prints the check's table; true when every error is within TOLERANCE.
pub fn print(rows: &[Row]) -> bool {
    println!(
        "  {:<26} {:>6} {:>4} {:>12} {:>12} {:>8}  {:>10} {:>6}",
        "kernel", "T", "runs", "measured", "predicted", "error", "blocks/SM", "waves"
    );
    let mut ok = true;
    for r in rows {
        let e = r.error();
        let bad = e.abs() > TOLERANCE;
        ok &= !bad;
        println!(
            "  {:<26} {:>6} {:>4} {:>9.1} us {:>9.1} us {:>+7.1} %  {:>3} ({:<9}) {:>5.2}{}",
            r.kernel,
            r.t,
            r.launches,
            r.measured * 1e6,
            r.predicted * 1e6,
            100.0 * e,
            r.prediction.blocks_per_sm,
            r.prediction.limit,
            r.prediction.waves,
            if bad { "  PAST 20 %" } else { "" }
        );
    }
    ok
}

/// The errors by kernel name and T.
#[cfg(test)]
pub fn errors(rows: &[Row]) -> std::collections::BTreeMap<(String, u64), f64> {
    rows.iter()
        .map(|r| ((r.kernel.clone(), r.t), r.error()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::model::H200;
    use super::super::timing::{H200_FIT, SM90};
    use super::*;

    fn dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DIR)
    }

    /// The committed measurement: its seven kernels, each within 20 %.
    #[test]
    fn the_model_predicts_the_measured_kernels() -> Result<()> {
        let rows = check(&dir(), &H200, &H200_FIT, &SM90)?;
        let errors = errors(&rows);
        assert_eq!(errors.len(), 7, "{rows:?}");
        for ((k, t), e) in errors {
            assert!(e.abs() <= TOLERANCE, "{k} T = {t}: {:+.1} %", 100.0 * e);
        }
        Ok(())
    }

    /// Whether `k` in place of the fitted constants puts a measured kernel past 20 %.
    fn fails(k: &Constants) -> Result<bool> {
        let rows = check(&dir(), &H200, k, &SM90)?;
        Ok(errors(&rows).values().any(|e| e.abs() > TOLERANCE))
    }

    /// With one warp's latency alone (no contention between the warps of a scheduler), the
    /// measured kernels but dK/dV are 32-40 % fast. (Dropping the occupancy term, registers and shared memory limiting
    /// nothing, is not caught by these rows; see docs/gpu.md.)
    #[test]
    fn the_check_catches_a_model_without_each_term() -> Result<()> {
        let none = Constants {
            contention: 0.0,
            ..H200_FIT
        };
        assert!(fails(&none)?, "no contention");
        Ok(())
    }

    #[test]
    fn ncu_durations_average_repeated_launches() -> Result<()> {
        let csv = "noise\n\"ID\",\"Kernel Name\",\"Grid Size\",\"Metric Name\",\"Metric Unit\",\
                   \"Metric Value\"\n\"0\",\"k\",\"(2, 1, 1)\",\"Duration\",\"ns\",\"1,000\"\n\
                   \"1\",\"k\",\"(2, 1, 1)\",\"Duration\",\"us\",\"3\"\n\
                   \"1\",\"k\",\"(2, 1, 1)\",\"Elapsed Cycles\",\"cycle\",\"9\"\n";
        let d = ncu_durations(csv)?;
        assert_eq!(d.len(), 1);
        assert!((d[0].2 - 2e-6).abs() < 1e-12 && d[0].3 == 2);
        assert_eq!(grid_xy("(128, 16, 1)")?, (128, 16));
        assert_eq!(
            csv_fields("\"a\",\"(1, 2)\",\"x \"\"y\"\"\",,"),
            ["a", "(1, 2)", "x \"y\"", "", ""]
        );
        Ok(())
    }

    #[test]
    fn causal_launches_count_the_visible_tiles() {
        let step = Step {
            counts: Counts::default(),
            latency: 1.0,
        };
        let k = |role, area| Inputs {
            name: "k".into(),
            role,
            d: 128,
            warps: 4,
            registers: 128,
            shared: 0,
            area,
            step,
        };
        let s = Shape {
            t: 256,
            hq: 2,
            hkv: 1,
        };
        // 4 row blocks, heaviest first: 4, 3, 2, 1 tiles of 64 keys (16 x 64 a warp).
        let f = launch(&k(Role::Forward, 1024.0), s);
        assert_eq!(f.iterations, [4.0, 3.0, 2.0, 1.0, 4.0, 3.0, 2.0, 1.0]);
        // dK/dV: key block kb sees 256 - 64 kb queries of 2 heads, 16 x 16 a warp step.
        let b = launch(&k(Role::Dkdv, 256.0), s);
        assert_eq!(b.iterations, [32.0, 24.0, 16.0, 8.0]);
    }
}
