//! terse's CUDA kernels on the CPU: kernels/*.cu, unchanged, compiled as host C++ under the
//! project's SIMT shim (kernels/shim/: every CUDA thread an OS thread, barriers with a deadline,
//! warp shuffles through an exchange), launched from Rust with host buffers. It sits beside the
//! CUDA path: crates/model describes each launch once (`terse_model::launch`), cudarc runs the
//! description on a GPU and [`run`] runs it here, so `cargo test` executes every kernel and
//! compares it with its CPU reference (src/lib_tests/) on machines without a GPU.
//!
//! Only for tests: the shim is slow (an OS thread per CUDA thread) and serialises launches.

#![allow(unsafe_code)] // the FFI into the compiled kernels, with pointers to host buffers

use std::ffi::{c_char, c_void, CString};

/// The element type behind a pointer parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    Bf16,
    F16,
    U32,
    I32,
    U8,
    U64,
}

/// One kernel parameter's kind: a pointer (element type, writable) or a scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    Ptr(Elem, bool),
    I32,
    U32,
    F32,
    U64,
}

/// A kernel entry point as build.rs found it in the preprocessed sources.
#[derive(Debug)]
pub struct Kernel {
    pub name: &'static str,
    pub file: &'static str,
    pub params: &'static [Param],
    body: unsafe extern "C" fn(*mut *mut c_void),
}

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// The kernel named `name`, if kernels/ has it.
pub fn kernel(name: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name)
}

/// A host buffer a kernel reads or writes.
#[derive(Debug)]
pub enum Buf<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [u16]),
    F16(&'a mut [u16]),
    U32(&'a mut [u32]),
    I32(&'a mut [i32]),
    U8(&'a mut [u8]),
    /// A table of device (here: host) addresses and counts, such as `adamw_*`'s.
    U64(&'a mut [u64]),
}

impl Buf<'_> {
    fn elem(&self) -> Elem {
        match self {
            Buf::F32(_) => Elem::F32,
            Buf::Bf16(_) => Elem::Bf16,
            Buf::F16(_) => Elem::F16,
            Buf::U32(_) => Elem::U32,
            Buf::I32(_) => Elem::I32,
            Buf::U8(_) => Elem::U8,
            Buf::U64(_) => Elem::U64,
        }
    }

    fn ptr(&mut self) -> *mut c_void {
        match self {
            Buf::F32(s) => s.as_mut_ptr().cast(),
            Buf::Bf16(s) | Buf::F16(s) => s.as_mut_ptr().cast(),
            Buf::U32(s) => s.as_mut_ptr().cast(),
            Buf::I32(s) => s.as_mut_ptr().cast(),
            Buf::U8(s) => s.as_mut_ptr().cast(),
            Buf::U64(s) => s.as_mut_ptr().cast(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buf::F32(s) => s.len(),
            Buf::Bf16(s) | Buf::F16(s) => s.len(),
            Buf::U32(s) => s.len(),
            Buf::I32(s) => s.len(),
            Buf::U8(s) => s.len(),
            Buf::U64(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One argument of a launch: a buffer, or a scalar.
#[derive(Debug)]
pub enum Arg<'a> {
    Buf(Buf<'a>),
    I32(i32),
    U32(u32),
    F32(f32),
    U64(u64),
}

/// Runs kernel `name` over `grid` blocks of `block` threads with `args` and `shared_bytes` of
/// dynamic shared memory (the launch description's `shared`), on the CPU. The
/// arguments are checked against the kernel's signature first (count, and each one's kind and
/// element type), so a swapped or missing argument is an error naming it, never a wrong read.
/// A barrier some threads never reach ends the launch after `deadline_ms` with an error naming
/// the kernel, the block and the line.
pub fn run(
    name: &str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
    args: &mut [Arg<'_>],
    deadline_ms: u32,
) -> Result<(), String> {
    let k = kernel(name).ok_or_else(|| format!("no kernel `{name}` in kernels/*.cu"))?;
    if args.len() != k.params.len() {
        return Err(format!(
            "kernel {name} ({}) takes {} arguments, got {}",
            k.file,
            k.params.len(),
            args.len()
        ));
    }
    // Scalars live here while the launch runs; `slots` points at them or at the buffers.
    let mut scalars = vec![0u64; args.len()];
    let mut slots: Vec<*mut c_void> = Vec::with_capacity(args.len());
    let mut pointers: Vec<*mut c_void> = vec![std::ptr::null_mut(); args.len()];
    for (i, (a, p)) in args.iter_mut().zip(k.params).enumerate() {
        let ok = match (&*a, p) {
            (Arg::Buf(b), Param::Ptr(e, _)) => b.elem() == *e,
            (Arg::I32(_), Param::I32)
            | (Arg::U32(_), Param::U32)
            | (Arg::F32(_), Param::F32)
            | (Arg::U64(_), Param::U64) => true,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "kernel {name} argument {i}: the kernel takes {p:?}, the launch passes {}",
                describe(a)
            ));
        }
        match a {
            Arg::Buf(b) => pointers[i] = b.ptr(),
            Arg::I32(v) => scalars[i] = u64::from(*v as u32),
            Arg::U32(v) => scalars[i] = u64::from(*v),
            Arg::F32(v) => scalars[i] = u64::from(v.to_bits()),
            Arg::U64(v) => scalars[i] = *v,
        }
    }
    for (i, a) in args.iter().enumerate() {
        slots.push(match a {
            Arg::Buf(_) => (&mut pointers[i] as *mut *mut c_void).cast(),
            // Little-endian: the low bytes of the u64 are the 4-byte scalar.
            _ => (&mut scalars[i] as *mut u64).cast(),
        });
    }
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    let g = [grid.0, grid.1, grid.2];
    let b = [block.0, block.1, block.2];
    let mut err = vec![0u8; 1024];
    // SAFETY: the arguments match the kernel's parameters in count and kind (checked above),
    // each pointer is a live buffer of the declared element type, and the call returns before
    // any of them is dropped. Bounds are the kernel's own business, as on the device; the
    // AddressSanitizer job catches a read past a buffer.
    let rc = unsafe {
        terse_shim_run(
            cname.as_ptr(),
            g.as_ptr(),
            b.as_ptr(),
            shared_bytes,
            k.body,
            slots.as_mut_ptr(),
            deadline_ms,
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
    Err(String::from_utf8_lossy(&err[..end]).into_owned())
}

fn describe(a: &Arg<'_>) -> String {
    match a {
        Arg::Buf(b) => format!("a {:?} buffer", b.elem()),
        Arg::I32(v) => format!("i32 {v}"),
        Arg::U32(v) => format!("u32 {v}"),
        Arg::F32(v) => format!("f32 {v}"),
        Arg::U64(v) => format!("u64 {v}"),
    }
}

#[cfg(test)]
#[path = "lib_tests/mod.rs"]
mod tests;

unsafe extern "C" {
    fn terse_shim_run(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        body: unsafe extern "C" fn(*mut *mut c_void),
        args: *mut *mut c_void,
        deadline_ms: u32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}
