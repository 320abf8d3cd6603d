//! NCCL ranks behind [`Collective`] (feature `nccl`, on in GPU builds): each rank's communicator
//! on its CUDA device, made from the unique id rank 0 draws and sends over the TCP group the
//! launcher already formed (the rendezvous). The trainer hands host buffers today (its gradients
//! are flattened on the host), so each reduction is staged: copied to the device, reduced or
//! gathered by NCCL on the group's stream, copied back; keeping the gradients on the device is
//! the next step. Byte broadcasts (configs, weights, checkpoints' optimizer shards) stay on TCP.
//!
//! Nothing waits without a deadline: the communicator is made non-blocking
//! (`ncclCommInitRankConfig` with `blocking = 0`), its initialisation and every collective are
//! polled (`ncclCommGetAsyncError`, then a stream event) through deadline.rs, and on expiry or
//! an asynchronous error the communicator is aborted (`ncclCommAbort`) and the error names the
//! rank and the collective. A dead or stuck peer ends the run instead of hanging it.
//!
//! Unlike [`crate::TcpGroup`], NCCL picks its own reduction order (ring or tree); every rank
//! still ends with the same bits.

#![allow(unsafe_code)] // the NCCL C API on raw device pointers

use crate::deadline::{wait, Poll};
use crate::{shard_len, Collective, TcpGroup};
use anyhow::{anyhow, bail, Context, Result};
use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
};
use candle_core::cuda_backend::cudarc::nccl::{result, sys};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

/// An NCCL communicator owned by one rank: a raw handle, aborted once (on a deadline, an
/// asynchronous error, or drop), null after that.
struct OwnedComm(Cell<sys::ncclComm_t>);

// SAFETY: NCCL forbids concurrent calls on a communicator, not moving it between threads, and
// every call here goes through `&mut NcclGroup` (or the one `&NcclGroup` of a wait), so no two
// calls can overlap.
unsafe impl Send for OwnedComm {}

impl OwnedComm {
    fn handle(&self) -> sys::ncclComm_t {
        self.0.get()
    }

    /// `ncclCommAbort`, once: the handle is freed by it.
    fn abort(&self) {
        let c = self.0.replace(std::ptr::null_mut());
        if !c.is_null() {
            // SAFETY: a handle from a successful init, aborted exactly once (it is null now).
            let _ = unsafe { sys::ncclCommAbort(c) };
        }
    }

    /// Idle (`Done`), an operation in progress (`Pending`), or its asynchronous error.
    fn state(&self) -> Result<Poll> {
        let c = self.handle();
        if c.is_null() {
            bail!("the communicator was aborted");
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        let r = unsafe { sys::ncclCommGetAsyncError(c, &mut state) };
        if r != sys::ncclResult_t::ncclSuccess {
            bail!("ncclCommGetAsyncError: {r:?}");
        }
        match state {
            sys::ncclResult_t::ncclSuccess => Ok(Poll::Done),
            sys::ncclResult_t::ncclInProgress => Ok(Poll::Pending),
            other => bail!("{other:?}"),
        }
    }
}

impl Drop for OwnedComm {
    fn drop(&mut self) {
        self.abort();
    }
}

/// One rank of an NCCL group (see the module docs).
pub struct NcclGroup {
    comm: OwnedComm,
    stream: Arc<CudaStream>,
    tcp: TcpGroup,
    timeout: Duration,
}

/// A CUDA driver error (a copy, an allocation, an event) as an anyhow error.
fn driver(e: DriverError) -> anyhow::Error {
    anyhow!("CUDA: {e:?}")
}

/// NCCL's element type of a Rust value type.
trait Elem: DeviceRepr {
    const NCCL: sys::ncclDataType_t;
}

impl Elem for f32 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat32;
}

impl Elem for f64 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat64;
}

/// The config a non-blocking communicator is made with: NCCL_CONFIG_INITIALIZER (every field
/// "undefined": INT_MIN for the ints, null for the pointers), then `blocking = 0`. The ints are
/// filled word by word so the fields this NCCL version adds need no naming here.
fn nonblocking_config() -> sys::ncclConfig_t {
    let mut cfg = std::mem::MaybeUninit::<sys::ncclConfig_t>::zeroed();
    let words = std::mem::size_of::<sys::ncclConfig_t>() / 4;
    // SAFETY: the struct is plain old data (ints and two pointers, set right below); every
    // 4-byte word is written before the struct is read.
    let mut cfg = unsafe {
        let p = cfg.as_mut_ptr().cast::<i32>();
        for i in 0..words {
            p.add(i).write(i32::MIN);
        }
        cfg.assume_init()
    };
    cfg.size = std::mem::size_of::<sys::ncclConfig_t>();
    cfg.magic = 0xcafe_beef;
    // The layout cudarc declares (NCCL 2.30); a newer library reads the fields it knows.
    cfg.version = 23000;
    cfg.blocking = 0;
    cfg.netName = std::ptr::null();
    cfg.commName = std::ptr::null();
    cfg
}

impl NcclGroup {
    /// This rank's communicator on CUDA device `ordinal`, from the TCP group's rank and world
    /// size; rank 0's unique id travels over `tcp`, which then carries the byte broadcasts.
    /// Initialisation and every later collective wait at most `timeout`.
    pub fn new(mut tcp: TcpGroup, ordinal: usize, timeout: Duration) -> Result<Self> {
        let (rank, world) = (tcp.rank(), tcp.world());
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| anyhow!("rank {rank}: CUDA device {ordinal}: {e:?}"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow!("rank {rank}: a stream on CUDA device {ordinal}: {e:?}"))?;
        let mut id = if rank == 0 {
            let id =
                result::get_uniqueid().map_err(|e| anyhow!("rank 0: ncclGetUniqueId: {e:?}"))?;
            id.internal.iter().map(|&c| c as u8).collect()
        } else {
            vec![]
        };
        tcp.broadcast(&mut id, 0)
            .with_context(|| format!("rank {rank}: the NCCL unique id from rank 0"))?;
        let Ok(bytes) = <[u8; 128]>::try_from(id.as_slice()) else {
            bail!(
                "rank {rank}: an NCCL unique id of {} bytes, not 128",
                id.len()
            );
        };
        let unique = sys::ncclUniqueId {
            internal: bytes.map(|b| b as core::ffi::c_char),
        };
        let mut cfg = nonblocking_config();
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        ctx.bind_to_thread().map_err(driver)?;
        // SAFETY: valid out-pointer and config; the id is the one rank 0 drew.
        let started = unsafe {
            sys::ncclCommInitRankConfig(&mut comm, world as i32, unique, rank as i32, &mut cfg)
        };
        if !matches!(
            started,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            bail!("rank {rank}: ncclCommInitRankConfig: {started:?}");
        }
        let comm = OwnedComm(Cell::new(comm));
        let group = Self {
            comm,
            stream,
            tcp,
            timeout,
        };
        group.settle("NCCL initialisation")?;
        Ok(group)
    }

    /// Waits until the communicator has no operation in progress; an asynchronous error or
    /// the deadline aborts it.
    fn settle(&self, what: &str) -> Result<()> {
        let comm = &self.comm;
        wait(
            self.tcp.rank(),
            what,
            self.timeout,
            || comm.state(),
            || comm.abort(),
        )
    }

    /// Waits for everything queued on the stream (the collective and the copy back), polling
    /// an event against the deadline and the communicator's asynchronous errors.
    fn finish(&self, what: &str) -> Result<()> {
        self.settle(what)?;
        let event = self.stream.record_event(None).map_err(driver)?;
        let comm = &self.comm;
        let poll = || {
            comm.state()?;
            Ok(if event.is_complete() {
                Poll::Done
            } else {
                Poll::Pending
            })
        };
        wait(self.tcp.rank(), what, self.timeout, poll, || comm.abort())
    }

    /// The raw stream NCCL enqueues on.
    fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// `buf` summed over ranks, through the device.
    fn all_reduce<T: Elem>(&mut self, buf: &mut [T], what: &str) -> Result<()> {
        let mut d: CudaSlice<T> = self.stream.clone_htod(buf).map_err(driver)?;
        {
            let (ptr, _guard) = d.device_ptr_mut(&self.stream);
            // SAFETY: an in-place sum over `buf.len()` elements of a live device buffer.
            unsafe {
                result::all_reduce(
                    ptr as *const _,
                    ptr as *mut _,
                    buf.len(),
                    T::NCCL,
                    sys::ncclRedOp_t::ncclSum,
                    self.comm.handle(),
                    self.raw_stream(),
                )
            }
            .map_err(|e| anyhow!("rank {}: {what}: {e:?}", self.tcp.rank()))?;
        }
        self.stream.memcpy_dtoh(&d, buf).map_err(driver)?;
        self.finish(what)
    }
}

impl Collective for NcclGroup {
    fn rank(&self) -> usize {
        self.tcp.rank()
    }
    fn world(&self) -> usize {
        self.tcp.world()
    }
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce(buf, "all-reduce")
    }
    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce(buf, "all-reduce (f64)")
    }
    fn reduce_scatter_sum(&mut self, parts: &[f32]) -> Result<Vec<f32>> {
        let n = shard_len(parts.len(), self.world())?;
        let send = self.stream.clone_htod(parts).map_err(driver)?;
        let mut recv = self.stream.alloc_zeros::<f32>(n).map_err(driver)?;
        {
            let (sp, _g1) = send.device_ptr(&self.stream);
            let (rp, _g2) = recv.device_ptr_mut(&self.stream);
            // SAFETY: `parts.len()` = world x n input elements, n output elements.
            unsafe {
                result::reduce_scatter(
                    sp as *const _,
                    rp as *mut _,
                    n,
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclSum,
                    self.comm.handle(),
                    self.raw_stream(),
                )
            }
            .map_err(|e| anyhow!("rank {}: reduce-scatter: {e:?}", self.tcp.rank()))?;
        }
        let out = self.stream.clone_dtoh(&recv).map_err(driver)?;
        self.finish("reduce-scatter")?;
        Ok(out)
    }
    fn all_gather(&mut self, part: &[f32]) -> Result<Vec<f32>> {
        let send = self.stream.clone_htod(part).map_err(driver)?;
        let mut recv = self
            .stream
            .alloc_zeros::<f32>(part.len() * self.world())
            .map_err(driver)?;
        {
            let (sp, _g1) = send.device_ptr(&self.stream);
            let (rp, _g2) = recv.device_ptr_mut(&self.stream);
            // SAFETY: `part.len()` input elements, world x that many output elements.
            unsafe {
                result::all_gather(
                    sp as *const _,
                    rp as *mut _,
                    part.len(),
                    sys::ncclDataType_t::ncclFloat32,
                    self.comm.handle(),
                    self.raw_stream(),
                )
            }
            .map_err(|e| anyhow!("rank {}: all-gather: {e:?}", self.tcp.rank()))?;
        }
        let out = self.stream.clone_dtoh(&recv).map_err(driver)?;
        self.finish("all-gather")?;
        Ok(out)
    }
    fn broadcast(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        self.tcp.broadcast(buf, root)
    }
}
