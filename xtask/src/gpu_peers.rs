//! terse against torch in one `cargo xtask gpu-check` report: the ratios of terse's training,
//! flash-forward and attention rows to their torch peers measured in the same run
//! (scripts/bench_torch_peers.py, gpu_bench.rs's `torch_peers` step), which issues 57 and 58
//! state their targets in. Pure over the report, so it is tested without a GPU.
//!
//! Data flow: gpu.rs, after the plan's last step -> `peer_ratios` -> the report's "peers".

use serde_json::{json, Value};

/// terse against torch in one gpu-check report: each ratio of a terse row to its torch peer
/// (above 1: terse is faster), null where either side is missing. Training tokens/s at 8k and
/// 16k (terse with its layers kept where it has that row, else recomputed) against HF's; the
/// flash forward at T 8192 against SDPA's flash and cuDNN; attention forward+backward at T 1024
/// and 4096 against both.
pub fn peer_ratios(report: &serde_json::Map<String, Value>) -> Value {
    let peers = match report.get("torch_peers") {
        Some(p) if p.get("error").is_none() => p,
        _ => return json!({"error": "no torch_peers row"}),
    };
    let by_t = |rows: Option<&Value>, t: u64, pick: &dyn Fn(&Value) -> bool| {
        rows.and_then(Value::as_array)
            .and_then(|rs| rs.iter().find(|r| r["t"].as_u64() == Some(t) && pick(r)))
            .cloned()
    };
    let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    };
    let mut out = serde_json::Map::new();
    for t in [8192u64, 16384] {
        let ours = by_t(report.get("long_context"), t, &|r| r["keep"] == "auto")
            .or_else(|| by_t(report.get("long_context"), t, &|_| true));
        let theirs = by_t(peers.get("hf_long_context"), t, &|_| true);
        let f = |r: &Option<Value>, k: &str| r.as_ref().and_then(|r| r[k].as_f64());
        out.insert(
            format!("training_tokens_per_s_t{t}_over_hf"),
            div(f(&ours, "tokens_per_s"), f(&theirs, "tokens_per_s")),
        );
    }
    // A skipped step has no row: `get`, since indexing a Map by a missing key panics.
    let ours_fwd = report
        .get("flash_kernel")
        .and_then(|r| r["tensor_cores"]["tflops"].as_f64());
    for b in ["flash", "cudnn"] {
        let theirs = peers["flash_fwd_t8192"][b]["tflops"].as_f64();
        out.insert(
            format!("flash_fwd_t8192_over_sdpa_{b}"),
            div(ours_fwd, theirs),
        );
    }
    for t in [1024u64, 4096] {
        let ours = by_t(report.get("attention_paths"), t, &|_| true);
        let theirs = by_t(peers.get("attention_paths"), t, &|_| true);
        for b in ["flash", "cudnn"] {
            let f = |r: &Option<Value>, k: &str| r.as_ref().and_then(|r| r[k].as_f64());
            // Times: theirs over ours, so that above 1 is terse faster.
            out.insert(
                format!("attention_fwd_bwd_t{t}_sdpa_{b}_over_terse"),
                div(f(&theirs, &format!("{b}_s")), f(&ours, "flash_s")),
            );
            // The training path's attention (in the rows, no graph).
            out.insert(
                format!("attention_fwd_bwd_t{t}_sdpa_{b}_over_terse_rows"),
                div(f(&theirs, &format!("{b}_s")), f(&ours, "rows_s")),
            );
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ratios read the 2026-12-04 rows as gpu-check and the peers script write them:
    /// terse's 8k training at 11,480 tokens/s against HF's 28,987 is 0.396, its flash forward
    /// at 157 TFLOP/s against cuDNN's 555 is 0.283, SDPA flash's 1.24 ms fwd+bwd at 4096
    /// against terse's 4.09 is 0.303; the kept-layer row is preferred; a missing side is null;
    /// the rows path's time, where there is one, gives its own ratio.
    #[test]
    fn peer_ratios_read_both_sides_of_one_report() {
        let report: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "long_context": [
                {"t": 8192, "keep": "none", "tokens_per_s": 11480.0},
                {"t": 8192, "keep": "auto", "tokens_per_s": 14493.5},
                {"t": 16384, "keep": "none", "tokens_per_s": 10443.0}],
            "flash_kernel": {"tensor_cores": {"tflops": 157.4}},
            "attention_paths": [{"t": 1024, "flash_s": 0.000743},
                                {"t": 4096, "flash_s": 0.004086, "rows_s": 0.002}],
            "torch_peers": {
                "flash_fwd_t8192": {"flash": {"tflops": 277.4}, "cudnn": {"tflops": 555.4}},
                "attention_paths": [{"t": 1024, "flash_s": 0.000403, "cudnn_s": 0.000344},
                                    {"t": 4096, "flash_s": 0.001237}],
                "hf_long_context": [{"t": 8192, "tokens_per_s": 28987.0},
                                    {"t": 16384, "tokens_per_s": 24881.0}]}
        }))
        .expect("report");
        let r = peer_ratios(&report);
        let at = |k: &str| r[k].as_f64();
        let near = |k: &str, want: f64| {
            let got = at(k).unwrap_or(f64::NAN);
            assert!(
                (got - want).abs() < 1e-3,
                "{k}: {got} against {want} in {r}"
            );
        };
        near("training_tokens_per_s_t8192_over_hf", 0.5);
        near("training_tokens_per_s_t16384_over_hf", 10443.0 / 24881.0);
        near("flash_fwd_t8192_over_sdpa_cudnn", 157.4 / 555.4);
        near(
            "attention_fwd_bwd_t4096_sdpa_flash_over_terse",
            0.001237 / 0.004086,
        );
        assert!(
            r["attention_fwd_bwd_t4096_sdpa_cudnn_over_terse"].is_null(),
            "{r}"
        );
        // The training path's attention, a time the 2026-12-04 run did not have (made up here).
        near(
            "attention_fwd_bwd_t4096_sdpa_flash_over_terse_rows",
            0.001237 / 0.002,
        );
        assert!(
            r["attention_fwd_bwd_t1024_sdpa_flash_over_terse_rows"].is_null(),
            "{r}"
        );
        // Steps skipped (`--skip`): their ratios are null, nothing panics.
        let mut skipped = report.clone();
        for k in ["flash_kernel", "attention_paths", "long_context"] {
            skipped.remove(k);
        }
        let r = peer_ratios(&skipped);
        assert!(r["flash_fwd_t8192_over_sdpa_flash"].is_null(), "{r}");
        assert!(r["training_tokens_per_s_t8192_over_hf"].is_null(), "{r}");
        let mut no_peers = report.clone();
        no_peers.insert("torch_peers".into(), json!({"error": "no torch"}));
        assert!(peer_ratios(&no_peers)["error"].is_string());
    }
}
