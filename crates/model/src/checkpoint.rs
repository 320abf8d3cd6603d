//! HF checkpoints in and out: resolve a model name (directory or hub id), read single or sharded
//! safetensors with shape checks, and write the same layout back atomically (each file through
//! `disk::atomic_write`, the I/O layer every checkpoint write goes through).
//!
//! Data flow: `resolve` -> `read_weights` (storage dtype -> f32 master tensors, exact HF keys) ->
//! `Qwen3` Vars ... training ... -> `write_checkpoint` (config.json + safetensors [+ index]).

use crate::config::Config;
use crate::disk;
use candle_core::{DType, Device, Error, Result, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub(crate) fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Msg(format!("{}: {e}", path.display()))
}

/// Turns a model name into a local directory holding config.json and the weights.
///
/// A name that is an existing directory is used as is. Otherwise a name shaped like `org/name`
/// is looked up in the local HF cache (`HF_HOME`, default `~/.cache/huggingface`); it is
/// downloaded only when `allow_download` is set. Nothing is fetched implicitly.
pub fn resolve(name: &str, allow_download: bool) -> Result<PathBuf> {
    let path = Path::new(name);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let looks_like_hub = name.split('/').count() == 2
        && !name.starts_with('.')
        && !name.starts_with('/')
        && !name.contains('\\');
    if !looks_like_hub {
        crate::fail!("model directory `{name}` does not exist");
    }
    let cache = hf_hub::Cache::from_env();
    let repo = cache.model(name.to_string());
    if let Some(cfg) = repo.get("config.json") {
        let dir = cfg.parent().map(Path::to_path_buf).unwrap_or_default();
        if weight_files(&dir).is_ok() {
            return Ok(dir);
        }
    }
    if !allow_download {
        crate::fail!(
            "model `{name}` is not a local directory and is not complete in the HF cache at {}; \
             pass --allow-download to fetch it, or point to a directory",
            cache
                .path()
                .join(format!("models--{}", name.replace('/', "--")))
                .display()
        );
    }
    download(name)
}

fn download(name: &str) -> Result<PathBuf> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .build()
        .map_err(|e| Error::Msg(format!("hub client for `{name}`: {e}")))?;
    let repo = api.model(name.to_string());
    let fetch = |f: &str| {
        repo.get(f)
            .map_err(|e| Error::Msg(format!("downloading `{f}` of `{name}`: {e}")))
    };
    let cfg = fetch("config.json")?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        // Optional files: a model without them still loads.
        let _ = fetch(f);
    }
    if let Ok(index) = fetch("model.safetensors.index.json") {
        for shard in shard_names(&index)? {
            fetch(&shard)?;
        }
    } else {
        fetch("model.safetensors")?;
    }
    Ok(cfg.parent().map(Path::to_path_buf).unwrap_or_default())
}

fn shard_names(index: &Path) -> Result<BTreeSet<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| io_err(index, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| io_err(index, format!("invalid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| io_err(index, "missing `weight_map` object"))?;
    map.values()
        .map(|f| {
            f.as_str()
                .map(str::to_string)
                .ok_or_else(|| io_err(index, format!("weight_map value {f} is not a file name")))
        })
        .collect()
}

/// The safetensors files of a checkpoint directory: the shards of the index, or model.safetensors.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        return Ok(shard_names(&index)?
            .into_iter()
            .map(|s| dir.join(s))
            .collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    crate::fail!(
        "{}: no model.safetensors or model.safetensors.index.json",
        dir.display()
    )
}

/// Reads every tensor of the checkpoint as `dtype` on `device`, checking names and shapes
/// against the config. Returns the tensors and the dtype they were stored in.
pub fn read_weights(
    dir: &Path,
    cfg: &Config,
    dtype: DType,
    device: &Device,
) -> Result<(BTreeMap<String, Tensor>, DType)> {
    let expected: BTreeMap<String, Vec<usize>> = cfg.expected_tensors().into_iter().collect();
    let mut out = BTreeMap::new();
    let mut storage = None;
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| io_err(&file, e))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| io_err(&file, format!("corrupt safetensors: {e}")))?;
        for (name, view) in st.tensors() {
            let shape = view.shape().to_vec();
            let want = match expected.get(&name) {
                Some(w) => w,
                // transformers may store the tied head; it is the embedding, so skip it.
                None if name == "lm_head.weight" && cfg.tie_word_embeddings => continue,
                None => crate::fail!("{}: unexpected tensor `{name}` {shape:?}", file.display()),
            };
            if &shape != want {
                crate::fail!(
                    "{}: tensor `{name}` has shape {shape:?}, the config expects {want:?}",
                    file.display()
                );
            }
            let st_dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::BF16 => DType::BF16,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::F64 => DType::F64,
                other => crate::fail!(
                    "{}: tensor `{name}` has unsupported dtype {other:?}",
                    file.display()
                ),
            };
            storage.get_or_insert(st_dtype);
            let t = Tensor::from_raw_buffer(view.data(), st_dtype, &shape, device)
                .map_err(|e| io_err(&file, format!("tensor `{name}`: {e}")))?;
            out.insert(name, t.to_dtype(dtype)?);
        }
    }
    if let Some((name, shape)) = expected.iter().find(|(n, _)| !out.contains_key(*n)) {
        crate::fail!(
            "{}: missing tensor `{name}` (expected shape {shape:?})",
            dir.display()
        );
    }
    Ok((out, storage.unwrap_or(DType::F32)))
}

/// How to write a checkpoint.
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// The dtype tensors are stored in (f32, bf16 or f16).
    pub dtype: DType,
    /// Above this many bytes the weights are split into shards with an index file.
    pub max_shard_bytes: usize,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            max_shard_bytes: 5 << 30,
        }
    }
}

fn dtype_name(dt: DType) -> Result<&'static str> {
    Ok(match dt {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => crate::fail!("cannot save weights as {other:?} (use f32, bf16 or f16)"),
    })
}

/// Writes config.json and the weights in HF layout into `dir` (created if needed). Each file is
/// written under a temporary name, fsynced and renamed (`disk::atomic_write`), so neither a
/// crash nor a power loss leaves a half-written file.
pub fn write_checkpoint(
    dir: &Path,
    cfg: &Config,
    tensors: &BTreeMap<String, Tensor>,
    opts: &SaveOptions,
) -> Result<()> {
    disk::create_dir_all(dir).map_err(|e| Error::Msg(e.to_string()))?;
    let mut raw = cfg.raw.clone();
    let name = dtype_name(opts.dtype)?;
    if raw.get("torch_dtype").is_some() {
        raw["torch_dtype"] = name.into();
    }
    raw["dtype"] = name.into();
    let text = serde_json::to_string_pretty(&raw).map_err(|e| Error::Msg(e.to_string()))?;
    atomic_write(&dir.join("config.json"), text.as_bytes())?;

    // Group tensors into shards in key order, each under the size limit (a single oversized
    // tensor gets a shard of its own).
    let mut shards: Vec<Vec<(&String, Tensor)>> = vec![vec![]];
    let mut size = 0usize;
    let mut total = 0usize;
    for (k, t) in tensors {
        let t = t
            .to_dtype(opts.dtype)?
            .to_device(&Device::Cpu)?
            .contiguous()?;
        let bytes = t.elem_count() * opts.dtype.size_in_bytes();
        if size + bytes > opts.max_shard_bytes && size > 0 {
            shards.push(vec![]);
            size = 0;
        }
        size += bytes;
        total += bytes;
        shards.last_mut().expect("non-empty").push((k, t));
    }
    let meta = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(),
    )]));
    let n = shards.len();
    let index_path = dir.join("model.safetensors.index.json");
    if n == 1 {
        let bytes = safetensors::serialize(shards[0].iter().map(|(k, t)| (k.as_str(), t)), meta)
            .map_err(|e| io_err(dir, e))?;
        atomic_write(&dir.join("model.safetensors"), &bytes)?;
        remove_if_exists(&index_path)?;
        return Ok(());
    }
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        let bytes =
            safetensors::serialize(shard.iter().map(|(k, t)| (k.as_str(), t)), meta.clone())
                .map_err(|e| io_err(dir, e))?;
        atomic_write(&dir.join(&file), &bytes)?;
        for (k, _) in shard {
            weight_map.insert((*k).clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let text = serde_json::to_string_pretty(&index).map_err(|e| Error::Msg(e.to_string()))?;
    atomic_write(&index_path, text.as_bytes())?;
    remove_if_exists(&dir.join("model.safetensors"))
}

fn remove_if_exists(p: &Path) -> Result<()> {
    disk::remove_file(p).map_err(|e| Error::Msg(e.to_string()))
}

/// `disk::atomic_write` with this crate's error type.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    disk::atomic_write(path, bytes).map_err(|e| Error::Msg(e.to_string()))
}
