//! `cargo xtask bench verify`: the math verifier on its adversarial corpus
//! (terse_tasks::math::adversarial: long sums, products, quotients, nests, power towers, huge
//! factorials and binomials, million-character strings, 40k-character completions of each
//! kind), each timed through `check` and each of the three completion scorers (the slowest
//! counts), against a normal short answer measured in the same run. Reports the worst time per completion, the worst time per
//! 1k characters, and the ratios to the baseline; the target is ≤ 10 ms for a 40k-character
//! completion (build with --release: a debug build is ten times slower).

use anyhow::Result;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Instant;
use terse_tasks::math::{self, adversarial};

/// The target for one completion of 40k characters, in milliseconds (issue 42).
const TARGET_MS: f64 = 10.0;

/// Seconds per call of `f`: the fastest of `reps` timed calls after one warm-up (the work is
/// deterministic, so the machine's other load can only add to it).
fn seconds(reps: usize, f: &dyn Fn()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The verdict and the three scorers a math task can use (Short-RL, EasyR1, the plain
/// boxed rule, extraction and format checks included), each on its own: a training step runs
/// one of them per completion, so the slowest is the time per completion.
fn scorers<'a>(completion: &'a str, reference: &'a str) -> [Box<dyn Fn() + 'a>; 4] {
    let tagged = format!("Assistant: <think></think><answer>{completion}</answer>");
    [
        Box::new(move || {
            std::hint::black_box(math::check(completion, reference));
        }),
        Box::new(move || {
            std::hint::black_box(math::score_short_rl_checked(&tagged, reference));
        }),
        Box::new(move || {
            std::hint::black_box(math::score_easyr1_checked(completion, reference, 0.1));
        }),
        Box::new(move || {
            let boxed = math::extract_final_boxed(completion);
            std::hint::black_box(boxed.map(|a| math::check(&a, reference)));
        }),
    ]
}

/// Seconds of the slowest scorer on one completion.
fn worst_scorer(completion: &str, reference: &str, reps: usize) -> f64 {
    scorers(completion, reference)
        .iter()
        .map(|f| seconds(reps, f))
        .fold(0.0, f64::max)
}

pub fn verify(json: bool) -> Result<ExitCode> {
    let cases = adversarial::corpus();
    // The baseline: a normal completion with a short answer, right and wrong.
    let normal = "<think>Half of the total is 1/2.</think> So the answer is \\boxed{\\frac{1}{2}}.";
    let base = worst_scorer(normal, "0.5", 201).max(worst_scorer(normal, "0.25", 201));
    println!(
        "math verifier, adversarial corpus ({} cases); baseline: a normal short answer, {:.1} µs",
        cases.len(),
        base * 1e6
    );
    println!("| case | chars | verdict | ms | ms per 1k chars | × baseline |");
    println!("|---|---|---|---|---|---|");
    let mut rows: Vec<Value> = vec![];
    let (mut worst, mut worst_long, mut worst_per_k) = (0f64, 0f64, 0f64);
    let mut worst_name = String::new();
    for c in &cases {
        let reps = if c.completion.len() > 100_000 { 3 } else { 9 };
        let secs = worst_scorer(&c.completion, &c.reference, reps);
        let verdict = math::check(&c.completion, &c.reference);
        let chars = c.completion.chars().count();
        let per_k = secs * 1e3 / (chars as f64 / 1e3).max(1.0);
        if secs > worst {
            worst = secs;
            worst_name.clone_from(&c.name);
        }
        // The 40k-character completions (a few characters over, with their box).
        if chars < 2 * adversarial::LONG {
            worst_long = worst_long.max(secs);
        }
        worst_per_k = worst_per_k.max(per_k);
        println!(
            "| {} | {chars} | {verdict:?} | {:.3} | {per_k:.4} | {:.0} |",
            c.name,
            secs * 1e3,
            secs / base
        );
        rows.push(json!({
            "case": c.name, "chars": chars, "verdict": format!("{verdict:?}"),
            "ms": secs * 1e3, "ms_per_1k_chars": per_k, "over_baseline": secs / base,
        }));
    }
    let met = worst_long * 1e3 <= TARGET_MS;
    println!(
        "worst: {:.3} ms ({worst_name}); worst completion of about {} chars: {:.3} ms ({:.0}x the baseline), target {TARGET_MS} ms: {}",
        worst * 1e3,
        adversarial::LONG,
        worst_long * 1e3,
        worst_long / base,
        if met { "met" } else { "MISSED" }
    );
    println!("worst per 1k characters: {worst_per_k:.4} ms");
    if json {
        println!(
            "{}",
            json!({
                "bench": "verify", "baseline_us": base * 1e6, "worst_ms": worst * 1e3,
                "worst_case": worst_name, "worst_40k_ms": worst_long * 1e3,
                "worst_ms_per_1k_chars": worst_per_k, "target_ms": TARGET_MS, "met": met,
                "rows": rows,
            })
        );
    }
    Ok(if met {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
