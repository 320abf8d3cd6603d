//! `cargo xtask check-model`: load any HF-layout checkpoint, run a transformers reference file
//! through it, print the differences, exit non-zero outside the tolerance.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use terse_model::{device, reference, resolve, Qwen3};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory, or a hub id such as Qwen/Qwen3-0.6B (looked up in the HF cache).
    #[arg(long)]
    model: String,
    /// Reference file (layout of tests/fixtures/qwen3-tiny/reference.safetensors);
    /// default: MODEL/reference.safetensors.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Largest accepted absolute difference of logits and log-probs.
    #[arg(long, default_value_t = 1e-4)]
    tol: f64,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Allow fetching a hub id that is not in the local cache.
    #[arg(long)]
    allow_download: bool,
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let dir = resolve(&a.model, a.allow_download)?;
    let reference = a
        .reference
        .clone()
        .unwrap_or_else(|| dir.join("reference.safetensors"));
    anyhow::ensure!(
        reference.is_file(),
        "reference file {} does not exist",
        reference.display()
    );
    let (dev, dtype) = device::select(&a.device)?;
    let model =
        Qwen3::load(&dir, &dev, dtype).with_context(|| format!("loading {}", dir.display()))?;
    let r = reference::check(&model, &reference)?;
    println!(
        "model       {} ({} parameters, stored {:?})",
        dir.display(),
        model.config.num_parameters(),
        model.storage_dtype
    );
    println!("reference   {}", reference.display());
    println!("logits      max abs diff {:.3e}", r.max_logit_diff);
    println!("log-probs   max abs diff {:.3e}", r.max_logprob_diff);
    println!(
        "step logits max abs diff {:.3e} (KV-cache decode)",
        r.max_step_logit_diff
    );
    println!(
        "greedy      {}",
        if r.greedy_match {
            "matches".to_string()
        } else {
            format!("differs: {:?} vs {:?}", r.greedy, r.reference_greedy)
        }
    );
    let ok = r.passes(a.tol);
    println!(
        "{} (tolerance {:e})",
        if ok { "PASS" } else { "FAIL" },
        a.tol
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
