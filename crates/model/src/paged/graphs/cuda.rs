//! The CUDA half of decode graphs (paged/graphs.rs): a bucket's static buffers (the device input and
//! output it was captured with, a pinned upload and a pinned download buffer), the one upload,
//! the capture and the launch.
//!
//! Data flow: `DecodeGraphs::run` -> `Bucket::new` (first use) -> `stage` (host words) ->
//! `Upload` -> `body` uncaptured then `capture`, or the bucket's graph launch -> `download`.
#![allow(unsafe_code)] // pinned host memory, the stream's capture and event tracking

use super::DecodeGraphs;
use crate::kernels::sample::{sample_packed, uniform_words, unpack, Drawn, Warpers};
use crate::kernels::PagedMeta;
use crate::model::Qwen3;
use crate::paged::{BlockTable, PagedKvCache, PagedSeq};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, PinnedHostSlice};
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, DType, Device, InplaceOp1, Layout, Result, Tensor,
};
use std::sync::Arc;

/// Words a row takes besides its table: token id, position, length, write slot, uniform (2).
const ROW_WORDS: usize = 6;

/// The draw a padding row makes (dropped): any uniform in [0, 1).
const PAD_UNIFORM: f64 = 0.5;

fn driver<T>(what: &str, r: std::result::Result<T, impl std::fmt::Display>) -> Result<T> {
    r.map_err(|e| candle_core::Error::Msg(format!("decode graph: {what}: {e}")))
}

/// One bucket: `rows` rows of `width` blocks, its graph once captured.
pub(super) struct Bucket {
    rows: usize,
    /// (rows * (ROW_WORDS + width)) u32: ids, positions, lengths, slots, uniforms, tables.
    input: Tensor,
    /// (rows, 4) u32: each row's draw.
    output: Tensor,
    ids: Tensor,      // (rows, 1) view of `input`
    pos: Tensor,      // (rows, 1)
    uniforms: Tensor, // (rows, 2)
    /// The tables as the kernels read them: views of `input` (the host copies are the
    /// capturing step's; on CUDA only their lengths are read).
    meta: Arc<PagedMeta>,
    graph: Option<CudaGraph>,
    up: PinnedHostSlice<u32>,
    down: PinnedHostSlice<u32>,
}

impl Bucket {
    fn new(dev: &CudaDevice, rows: usize, width: usize, host: HostMeta) -> Result<Self> {
        let device = Device::Cuda(dev.clone());
        let words = rows * (ROW_WORDS + width);
        let input = Tensor::zeros(words, DType::U32, &device)?;
        let output = Tensor::zeros((rows, 4), DType::U32, &device)?;
        let part = |at: usize, n: usize| input.narrow(0, at * rows, n * rows);
        let meta = PagedMeta {
            tables: host.tables,
            maxb: width,
            lens: host.lens,
            slots: host.slots,
            dev: [part(ROW_WORDS, width)?, part(2, 1)?, part(3, 1)?],
        };
        let ctx = dev.cuda_stream().context().clone();
        // SAFETY: both are written (staged, or downloaded into) before they are read.
        let up = driver("pinned upload buffer", unsafe {
            ctx.alloc_pinned::<u32>(words)
        })?;
        let down = driver("pinned download buffer", unsafe {
            ctx.alloc_pinned_with_flags::<u32>(rows * 4, 0)
        })?;
        Ok(Self {
            rows,
            ids: part(0, 1)?.reshape((rows, 1))?,
            pos: part(1, 1)?.reshape((rows, 1))?,
            uniforms: part(4, 2)?.reshape((rows, 2))?,
            input,
            output,
            meta: Arc::new(meta),
            graph: None,
            up,
            down,
        })
    }
}

/// A step's checked tables on the host (`PagedMeta::host_tables`).
struct HostMeta {
    tables: Vec<u32>,
    lens: Vec<u32>,
    slots: Vec<u32>,
}

/// The one upload of a step: the pinned buffer into the bucket's input, in place.
struct Upload<'a>(&'a PinnedHostSlice<u32>);

impl InplaceOp1 for Upload<'_> {
    fn name(&self) -> &'static str {
        "terse-decode-graph-upload"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        crate::fail!("decode graph upload: the input is not on a CUDA device")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, _: &Layout) -> Result<()> {
        let stream = s.device().cuda_stream();
        let dst = s.as_cuda_slice_mut::<u32>()?;
        driver("upload", stream.memcpy_htod(self.0, dst))
    }
}

/// What a bucket's graph runs: the layers over its rows, the head and the sampler, the draws
/// written into its output. Every temporary is dropped before it returns (a capture must free
/// what it allocates).
fn body(model: &Qwen3, cache: &PagedKvCache, b: &Bucket, w: &Warpers) -> Result<()> {
    let x = model.paged_rows(cache, &b.meta, &b.ids, &b.pos)?; // (R, H)
    let drawn = sample_packed(&model.paged_head(x)?, &b.uniforms, w)?; // (R, 4)
    b.output.slice_set(&drawn, 0, 0)
}

/// `body` captured into a graph on the device's stream (thread-local mode: a call from this
/// thread that CUDA refuses during a capture fails it). Event tracking is off meanwhile: one
/// stream orders everything, and an event of a buffer made outside the capture must not be
/// waited on inside it.
fn capture(
    dev: &CudaDevice,
    model: &Qwen3,
    cache: &PagedKvCache,
    b: &Bucket,
    w: &Warpers,
) -> Result<CudaGraph> {
    let stream = dev.cuda_stream();
    let ctx = stream.context().clone();
    let tracking = ctx.is_event_tracking();
    // SAFETY: the rollout uses the device's one stream; nothing else runs meanwhile.
    unsafe { ctx.disable_event_tracking() };
    let _cache = dev.enable_cuda_graph_htod_cache();
    let begun = driver(
        "begin capture",
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    );
    let ran = begun.and_then(|()| body(model, cache, b, w));
    let graph = driver(
        "end capture",
        stream.end_capture(sys::CUgraphInstantiate_flags(0)),
    );
    if tracking {
        // SAFETY: as above; tracking is as it was before the capture.
        unsafe { ctx.enable_event_tracking() };
    }
    ran?;
    match graph? {
        Some(g) => Ok(g),
        None => crate::fail!("decode graph: the capture recorded nothing"),
    }
}

impl DecodeGraphs {
    /// The step through its bucket: stage and upload the inputs, launch the graph (or run the
    /// bucket's first step uncaptured and capture it), download the draws of the real rows.
    pub(super) fn run(
        &mut self,
        model: &Qwen3,
        cache: &PagedKvCache,
        seqs: &[PagedSeq],
        uniforms: &[f64],
    ) -> Result<Vec<Drawn>> {
        let Device::Cuda(dev) = model.device() else {
            crate::fail!("decode graph: the model is not on a CUDA device");
        };
        let n = seqs.len();
        let rows = n.next_power_of_two();
        let mut list: Vec<(&BlockTable, usize)> =
            seqs.iter().map(|s| (&*s.table, s.table.len)).collect();
        list.extend(std::iter::repeat_n((&self.pad, 0), rows - n));
        let (tables, maxb, lens, slots) = PagedMeta::host_tables(cache, &list, self.width)?;
        if maxb != self.width {
            crate::fail!(
                "decode graph: a row needs {maxb} blocks, over the {} captured",
                self.width
            );
        }
        let at = match self.buckets.iter().position(|b| b.rows == rows) {
            Some(i) => i,
            None => {
                let host = HostMeta {
                    tables: tables.clone(),
                    lens: lens.clone(),
                    slots: slots.clone(),
                };
                self.buckets.push(Bucket::new(dev, rows, self.width, host)?);
                self.buckets.len() - 1
            }
        };
        let b = &mut self.buckets[at];
        {
            let up = driver("pinned upload buffer", b.up.as_mut_slice())?;
            let (head, rest) = up.split_at_mut(ROW_WORDS * rows);
            let (ids, rest_h) = head.split_at_mut(rows);
            let (pos, rest_h) = rest_h.split_at_mut(rows);
            let (lens_w, rest_h) = rest_h.split_at_mut(rows);
            let (slots_w, us) = rest_h.split_at_mut(rows);
            for i in 0..rows {
                let real = seqs.get(i);
                ids[i] = real.map_or(0, |s| s.tokens[0]);
                pos[i] = real.map_or(0, |s| s.table.len as u32);
                let u = uniforms.get(i).copied().unwrap_or(PAD_UNIFORM);
                us[2 * i..2 * i + 2].copy_from_slice(&uniform_words(u));
            }
            lens_w.copy_from_slice(&lens);
            slots_w.copy_from_slice(&slots);
            rest.copy_from_slice(&tables);
        }
        b.input.inplace_op1(&Upload(&b.up))?;
        match &b.graph {
            Some(g) => driver("graph launch", g.launch())?,
            None => {
                {
                    let _cache = dev.enable_cuda_graph_htod_cache();
                    body(model, cache, b, &self.warpers)?;
                }
                b.graph = Some(capture(dev, model, cache, b, &self.warpers)?);
                self.captures += 1;
            }
        }
        let words = download(dev, b)?;
        Ok(unpack(&words[..4 * n]))
    }
}

/// The bucket's draws, through its pinned buffer (the step's one synchronisation).
fn download(dev: &CudaDevice, b: &mut Bucket) -> Result<Vec<u32>> {
    let stream = dev.cuda_stream();
    {
        let (st, _) = b.output.storage_and_layout();
        let candle_core::Storage::Cuda(s) = &*st else {
            crate::fail!("decode graph: the output is not on a CUDA device");
        };
        let src = s.as_cuda_slice::<u32>()?;
        driver("download", stream.memcpy_dtoh(src, &mut b.down))?;
    }
    Ok(driver("pinned download buffer", b.down.as_slice())?.to_vec())
}
