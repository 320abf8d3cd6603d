//! Checkpoint round trips (single file and sharded, f32 and bf16) and the one-line errors bad
//! checkpoints produce.

use crate::{fixture, scratch};
use candle_core::{DType, Device};
use std::path::Path;
use terse_model::{reference, Qwen3, SaveOptions};

fn load(dir: &Path) -> Qwen3 {
    Qwen3::load(dir, &Device::Cpu, DType::F32).expect("load")
}

fn assert_identical(a: &Qwen3, b: &Qwen3) {
    let (ta, tb) = (a.tensors(), b.tensors());
    assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>());
    for (k, x) in &ta {
        let (x, y) = (
            x.flatten_all().expect("f").to_vec1::<f32>().expect("v"),
            tb[k].flatten_all().expect("f").to_vec1::<f32>().expect("v"),
        );
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{k} differs after the round trip"
        );
    }
}

#[test]
fn save_then_load_is_identical_and_still_matches_transformers() {
    for (name, opts) in [
        ("qwen3-tiny", SaveOptions::default()),
        // Sharded: a 40 KB limit splits the ~130k-parameter model into many files.
        (
            "qwen3-untied-1kv",
            SaveOptions {
                dtype: DType::F32,
                max_shard_bytes: 40_000,
            },
        ),
        (
            "qwen3-sharded-bf16",
            SaveOptions {
                dtype: DType::BF16,
                max_shard_bytes: 1 << 30,
            },
        ),
        ("qwen2-tiny", SaveOptions::default()),
    ] {
        let m = load(&fixture(name));
        let out = scratch(&format!("roundtrip-{name}"));
        m.save(&out, &opts).expect("save");
        let back = load(&out);
        assert_identical(&m, &back);
        assert_eq!(back.config.rope_theta, m.config.rope_theta);
        let report =
            reference::check(&back, &fixture(name).join("reference.safetensors")).expect("check");
        assert!(report.passes(1e-4), "{name}: {report:?}");
        let sharded = out.join("model.safetensors.index.json").exists();
        assert_eq!(sharded, opts.max_shard_bytes < 100_000, "{name}: sharding");
    }
}

fn copy_fixture(name: &str, to: &str) -> std::path::PathBuf {
    let out = scratch(to);
    for e in std::fs::read_dir(fixture(name)).expect("dir") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, out.join(p.file_name().expect("name"))).expect("copy");
    }
    out
}

fn load_err(dir: &Path) -> String {
    let e = Qwen3::load(dir, &Device::Cpu, DType::F32)
        .expect_err("must fail")
        .to_string();
    assert_eq!(e.lines().count(), 1, "error is not one line: {e}");
    e
}

#[test]
fn bad_checkpoints_give_one_line_errors_naming_the_problem() {
    let e = load_err(Path::new("/nonexistent/model"));
    assert!(
        e.contains("/nonexistent/model") && e.contains("does not exist"),
        "{e}"
    );

    // A missing tensor, named with its expected shape.
    let dir = copy_fixture("qwen3-tiny", "bad-missing");
    let m = load(&dir);
    let mut t = m.tensors();
    t.remove("model.layers.1.mlp.up_proj.weight");
    terse_model::checkpoint::write_checkpoint(&dir, &m.config, &t, &SaveOptions::default())
        .expect("write");
    let e = load_err(&dir);
    assert!(
        e.contains("missing tensor `model.layers.1.mlp.up_proj.weight`") && e.contains("[160, 64]"),
        "{e}"
    );

    // A wrong shape names the key and both shapes.
    let mut t = m.tensors();
    t.insert(
        "model.norm.weight".into(),
        candle_core::Tensor::zeros(63, DType::F32, &Device::Cpu).expect("z"),
    );
    terse_model::checkpoint::write_checkpoint(&dir, &m.config, &t, &SaveOptions::default())
        .expect("write");
    let e = load_err(&dir);
    assert!(
        e.contains("`model.norm.weight`") && e.contains("[63]") && e.contains("[64]"),
        "{e}"
    );

    // An unexpected tensor.
    let mut t = m.tensors();
    t.insert(
        "model.extra.weight".into(),
        candle_core::Tensor::zeros(2, DType::F32, &Device::Cpu).expect("z"),
    );
    terse_model::checkpoint::write_checkpoint(&dir, &m.config, &t, &SaveOptions::default())
        .expect("write");
    assert!(load_err(&dir).contains("unexpected tensor `model.extra.weight`"));

    // A corrupt safetensors header.
    let dir = copy_fixture("qwen3-tiny", "bad-header");
    let mut bytes = std::fs::read(dir.join("model.safetensors")).expect("read");
    bytes[8..16].copy_from_slice(b"{garbage");
    std::fs::write(dir.join("model.safetensors"), bytes).expect("write");
    let e = load_err(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("corrupt safetensors"),
        "{e}"
    );

    // A sliding-window config.
    let dir = copy_fixture("qwen3-tiny", "bad-sliding");
    let cfg = std::fs::read_to_string(dir.join("config.json")).expect("read");
    std::fs::write(
        dir.join("config.json"),
        cfg.replace(
            "\"use_sliding_window\": false",
            "\"use_sliding_window\": true",
        ),
    )
    .expect("write");
    let e = load_err(&dir);
    assert!(
        e.contains("config.json") && e.contains("sliding-window"),
        "{e}"
    );

    // No weights at all.
    let dir = copy_fixture("qwen3-tiny", "bad-noweights");
    std::fs::remove_file(dir.join("model.safetensors")).expect("rm");
    assert!(load_err(&dir).contains("no model.safetensors"));
}

#[test]
fn hub_ids_resolve_from_the_cache_only_unless_download_is_allowed() {
    // Point the HF cache at an empty directory: the id is not there and nothing is fetched.
    // (Only this test reads HF_HOME.)
    let cache = scratch("empty-hf-home");
    std::env::set_var("HF_HOME", &cache);
    let e = terse_model::resolve("Qwen/Qwen3-0.6B", false)
        .map(|_| ())
        .expect_err("offline");
    let msg = e.to_string();
    assert!(
        msg.contains("Qwen/Qwen3-0.6B")
            && msg.contains("--allow-download")
            && msg.contains("models--Qwen--Qwen3-0.6B"),
        "{msg}"
    );
    let dir = fixture("qwen3-tiny");
    assert_eq!(
        terse_model::resolve(dir.to_str().expect("utf8"), false).expect("dir"),
        dir
    );
    assert!(terse_model::resolve("./no/such/dir", false)
        .expect_err("missing")
        .to_string()
        .contains("does not exist"));
}
