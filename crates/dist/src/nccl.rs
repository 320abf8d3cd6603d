//! NCCL ranks behind [`Collective`] (feature `nccl`, on in GPU builds): each rank's communicator
//! on its CUDA device, made from the unique id rank 0 draws and sends over the TCP group the
//! launcher already formed (the rendezvous). The trainer hands host buffers today (its gradients
//! are flattened on the host), so each reduction is staged: copied to the device, reduced or
//! gathered by NCCL on the group's stream, copied back; keeping the gradients on the device is
//! the next step. Byte broadcasts (configs, weights, checkpoints' optimizer shards) stay on TCP.
//!
//! Unlike [`crate::TcpGroup`], NCCL picks its own reduction order (ring or tree); every rank
//! still ends with the same bits.

use crate::{shard_len, Collective, TcpGroup};
use anyhow::{anyhow, bail, Context, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaContext, CudaStream, DriverError};
use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use std::sync::Arc;

/// An NCCL communicator owned by one rank. `Comm` holds a raw handle and so is not `Send`;
/// NCCL forbids concurrent calls on a communicator, not moving it between threads, and every
/// call here goes through `&mut NcclGroup`, so no two calls can overlap.
struct OwnedComm(Comm);

// SAFETY: see `OwnedComm`: exclusive ownership, calls serialised by `&mut self`.
#[allow(unsafe_code)]
unsafe impl Send for OwnedComm {}

/// One rank of an NCCL group (see the module docs).
pub struct NcclGroup {
    comm: OwnedComm,
    stream: Arc<CudaStream>,
    tcp: TcpGroup,
}

/// An NCCL error, naming the call.
fn nccl(
    what: &str,
) -> impl FnOnce(candle_core::cuda_backend::cudarc::nccl::result::NcclError) -> anyhow::Error + '_ {
    move |e| anyhow!("NCCL {what}: {e:?}")
}

/// A CUDA driver error (a copy, an allocation, a synchronisation) as an anyhow error.
fn driver(e: DriverError) -> anyhow::Error {
    anyhow!("CUDA: {e:?}")
}

impl NcclGroup {
    /// This rank's communicator on CUDA device `ordinal`, from the TCP group's rank and world
    /// size; rank 0's unique id travels over `tcp`, which then carries the byte broadcasts.
    pub fn new(mut tcp: TcpGroup, ordinal: usize) -> Result<Self> {
        let (rank, world) = (tcp.rank(), tcp.world());
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| anyhow!("rank {rank}: CUDA device {ordinal}: {e:?}"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow!("rank {rank}: a stream on CUDA device {ordinal}: {e:?}"))?;
        let mut id = if rank == 0 {
            let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
            id.internal().iter().map(|&c| c as u8).collect()
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
        let comm = Comm::from_rank(
            Arc::clone(&stream),
            rank,
            world,
            Id::uninit(bytes.map(|b| b as core::ffi::c_char)),
        )
        .map_err(nccl("ncclCommInitRank"))?;
        Ok(Self {
            comm: OwnedComm(comm),
            stream,
            tcp,
        })
    }

    /// `buf` summed over ranks in place, through the device.
    fn all_reduce<T: NcclType + candle_core::cuda_backend::cudarc::driver::DeviceRepr>(
        &mut self,
        buf: &mut [T],
    ) -> Result<()> {
        let mut d = self.stream.clone_htod(buf).map_err(driver)?;
        self.comm
            .0
            .all_reduce_in_place(&mut d, &ReduceOp::Sum)
            .map_err(nccl("all-reduce"))?;
        self.stream.memcpy_dtoh(&d, buf).map_err(driver)?;
        self.stream.synchronize().map_err(driver)
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
        self.all_reduce(buf)
    }
    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce(buf)
    }
    fn reduce_scatter_sum(&mut self, parts: &[f32]) -> Result<Vec<f32>> {
        let n = shard_len(parts.len(), self.world())?;
        let send = self.stream.clone_htod(parts).map_err(driver)?;
        let mut recv = self.stream.alloc_zeros::<f32>(n).map_err(driver)?;
        self.comm
            .0
            .reduce_scatter(&send, &mut recv, &ReduceOp::Sum)
            .map_err(nccl("reduce-scatter"))?;
        let out = self.stream.clone_dtoh(&recv).map_err(driver)?;
        self.stream.synchronize().map_err(driver)?;
        Ok(out)
    }
    fn all_gather(&mut self, part: &[f32]) -> Result<Vec<f32>> {
        let send = self.stream.clone_htod(part).map_err(driver)?;
        let mut recv = self
            .stream
            .alloc_zeros::<f32>(part.len() * self.world())
            .map_err(driver)?;
        self.comm
            .0
            .all_gather(&send, &mut recv)
            .map_err(nccl("all-gather"))?;
        let out = self.stream.clone_dtoh(&recv).map_err(driver)?;
        self.stream.synchronize().map_err(driver)?;
        Ok(out)
    }
    fn broadcast(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        self.tcp.broadcast(buf, root)
    }
}
