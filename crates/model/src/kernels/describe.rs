//! The vocabulary of a launch description, shared by every kernel family: the storage type an
//! entry point is instantiated for, one launch argument, a whole launch (kernel name, grid,
//! block, arguments in order: buffers by their position in the caller's list, scalars by value)
//! and the grid shapes several families use. Each family's file describes its own entry points
//! with these; crates/simt runs the same descriptions on the CPU through the SIMT shim.

/// The storage type a kernel is instantiated for: the entry point's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
}

impl Storage {
    pub fn suffix(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::Bf16 => "bf16",
        }
    }
}

/// One argument of a launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// The caller's buffer at this position.
    Buf(usize),
    I32(i32),
    U32(u32),
    F32(f32),
    U64(u64),
}

/// A kernel launch: what cudarc's `launch` and the CPU shim both run.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The entry point, e.g. `rmsnorm_fwd_bf16`.
    pub kernel: String,
    /// The kernels/ file (stem) the entry point is in: the PTX module on CUDA.
    pub module: &'static str,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory (kernels/mma.cuh's `TERSE_DYNAMIC_SHARED`); above 48 KB
    /// the CUDA launch raises the function's limit first (launching.rs, `allow_shared`).
    pub shared: u32,
    pub args: Vec<Arg>,
}

/// One block of `block` threads per row.
pub(crate) fn per_row(
    kernel: String,
    module: &'static str,
    rows: usize,
    block: u32,
    args: Vec<Arg>,
) -> Launch {
    Launch {
        kernel,
        module,
        grid: (rows as u32, 1, 1),
        block: (block, 1, 1),
        shared: 0,
        args,
    }
}

/// One thread per element, blocks of 1024 (cudarc's `LaunchConfig::for_num_elems`).
pub(crate) fn elementwise(
    kernel: String,
    module: &'static str,
    n: usize,
    args: Vec<Arg>,
) -> Launch {
    Launch {
        kernel,
        module,
        grid: ((n as u32).div_ceil(1024), 1, 1),
        block: (1024, 1, 1),
        shared: 0,
        args,
    }
}

pub(crate) fn bufs(n: usize) -> impl Iterator<Item = Arg> {
    (0..n).map(Arg::Buf)
}

pub(crate) fn ints(xs: &[usize]) -> impl Iterator<Item = Arg> + '_ {
    xs.iter().map(|&x| Arg::I32(x as i32))
}
