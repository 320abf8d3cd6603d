//! Kernel launches behind the custom ops of fused.rs (the `cuda` feature only): the PTX modules
//! build.rs compiled from kernels/*.cu, loaded once per device by candle's module cache. Inputs
//! must be contiguous; f32 everywhere, bf16 for the storage-typed kernels.

#![allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill

use crate::kernel_checks::{DECODE_WARPS, LOGPROB_BLOCK, RMSNORM_BLOCK};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape};

pub(crate) mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

pub(crate) fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(s.as_cuda_slice::<T>()?.slice(a..b)),
        None => crate::fail!("{what}: expected a contiguous tensor"),
    }
}

fn suffix(dt: DType, what: &str) -> Result<&'static str> {
    match dt {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => crate::fail!("{what}: no kernel for {other:?} (f32 or bf16)"),
    }
}

fn grid(rows: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// Launches `rmsnorm_fwd_{sfx}` on contiguous x (rows, cols) and w (cols) -> (y, rstd).
fn rmsnorm_fwd_launch<T: CudaDType + DeviceRepr>(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    eps: f32,
    sfx: &str,
) -> Result<(CudaSlice<T>, CudaSlice<f32>)> {
    let dev: &CudaDevice = x.device();
    let cols = lw.shape().elem_count();
    let n = lx.shape().elem_count();
    let rows = n / cols;
    let f =
        dev.get_or_load_custom_func(&format!("rmsnorm_fwd_{sfx}"), "terse_rmsnorm", ptx::RMSNORM)?;
    let (xv, wv) = (
        view::<T>(x, lx, "rmsnorm x")?,
        view::<T>(w, lw, "rmsnorm w")?,
    );
    // SAFETY: every element is written by the kernel.
    let mut y = unsafe { dev.alloc::<T>(n)? };
    let mut rstd = unsafe { dev.alloc::<f32>(rows)? };
    let cols_i = cols as i32;
    let mut b = f.builder();
    b.arg(&xv)
        .arg(&wv)
        .arg(&mut y)
        .arg(&mut rstd)
        .arg(&cols_i)
        .arg(&eps);
    // SAFETY: argument types and counts match the kernel's signature.
    unsafe { b.launch(grid(rows, RMSNORM_BLOCK)) }.w()?;
    Ok((y, rstd))
}

pub fn rmsnorm_fwd(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    let dev = x.device().clone();
    let s = match x.dtype() {
        DType::F32 => CudaStorage::wrap_cuda_slice(
            rmsnorm_fwd_launch::<f32>(x, lx, w, lw, eps, "f32")?.0,
            dev,
        ),
        DType::BF16 => CudaStorage::wrap_cuda_slice(
            rmsnorm_fwd_launch::<half::bf16>(x, lx, w, lw, eps, "bf16")?.0,
            dev,
        ),
        dt => suffix(dt, "rmsnorm").map(|_| unreachable!())?,
    };
    Ok((s, lx.shape().clone()))
}

/// RMSNorm backward, f32: the row statistic from `rmsnorm_fwd` (its output is scratch), then
/// `rmsnorm_bwd` writing dx into rows 0..rows and accumulating dw into the zeroed last row.
pub fn rmsnorm_bwd(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    dy: &CudaStorage,
    ldy: &Layout,
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    let dev: &CudaDevice = x.device();
    let cols = lw.shape().elem_count();
    let n = lx.shape().elem_count();
    let rows = n / cols;
    let (_, rstd) = rmsnorm_fwd_launch::<f32>(x, lx, w, lw, eps, "f32")?;
    let (xv, wv, gv) = (
        view::<f32>(x, lx, "rmsnorm bwd x")?,
        view::<f32>(w, lw, "rmsnorm bwd w")?,
        view::<f32>(dy, ldy, "rmsnorm bwd dy")?,
    );
    let cols_i = cols as i32;
    let bwd = dev.get_or_load_custom_func("rmsnorm_bwd_f32", "terse_rmsnorm", ptx::RMSNORM)?;
    // dw accumulates with atomics, so its row starts at zero.
    let mut out = dev.alloc_zeros::<f32>(n + cols)?;
    {
        let (mut dx, mut dw) = out.split_at_mut(n);
        let mut b = bwd.builder();
        b.arg(&xv)
            .arg(&wv)
            .arg(&rstd)
            .arg(&gv)
            .arg(&mut dx)
            .arg(&mut dw)
            .arg(&cols_i);
        // SAFETY: argument types and counts match the kernel's signature.
        unsafe { b.launch(grid(rows, RMSNORM_BLOCK)) }.w()?;
    }
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev.clone()),
        Shape::from((rows + 1, cols)),
    ))
}

pub fn rope(
    x: &CudaStorage,
    lx: &Layout,
    c: &CudaStorage,
    lc: &Layout,
    s: &CudaStorage,
    ls: &Layout,
    inverse: bool,
) -> Result<(CudaStorage, Shape)> {
    #[allow(clippy::too_many_arguments)]
    fn go<T: CudaDType + DeviceRepr>(
        x: &CudaStorage,
        lx: &Layout,
        c: &CudaStorage,
        lc: &Layout,
        s: &CudaStorage,
        ls: &Layout,
        inverse: bool,
        sfx: &str,
    ) -> Result<CudaStorage> {
        let dev: &CudaDevice = x.device();
        let (b, h, t, d) = lx.shape().dims4()?;
        let name = format!("rope_{}_{sfx}", if inverse { "bwd" } else { "fwd" });
        let f = dev.get_or_load_custom_func(&name, "terse_rope", ptx::ROPE)?;
        let (xv, cv, sv) = (
            view::<T>(x, lx, "rope x")?,
            view::<T>(c, lc, "rope cos")?,
            view::<T>(s, ls, "rope sin")?,
        );
        let n = lx.shape().elem_count();
        // SAFETY: every element is written by the kernel.
        let mut y = unsafe { dev.alloc::<T>(n)? };
        let dims = [b as i32, h as i32, t as i32, d as i32];
        let mut bld = f.builder();
        bld.arg(&xv)
            .arg(&cv)
            .arg(&sv)
            .arg(&mut y)
            .arg(&dims[0])
            .arg(&dims[1])
            .arg(&dims[2])
            .arg(&dims[3]);
        // SAFETY: argument types and counts match the kernel's signature.
        unsafe { bld.launch(elementwise(n / 2)) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
    let out = match x.dtype() {
        DType::F32 => go::<f32>(x, lx, c, lc, s, ls, inverse, "f32")?,
        DType::BF16 => go::<half::bf16>(x, lx, c, lc, s, ls, inverse, "bf16")?,
        dt => suffix(dt, "rope").map(|_| unreachable!())?,
    };
    Ok((out, lx.shape().clone()))
}

pub fn logprob_fwd(
    l: &CudaStorage,
    ll: &Layout,
    t: &CudaStorage,
    lt: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev: &CudaDevice = l.device();
    let (n, v) = ll.shape().dims2()?;
    let f = dev.get_or_load_custom_func("logprob_fwd_f32", "terse_logprob", ptx::LOGPROB)?;
    let (lv, tv) = (
        view::<f32>(l, ll, "logits")?,
        view::<u32>(t, lt, "targets")?,
    );
    // SAFETY: every element is written by the kernel.
    let mut stats = unsafe { dev.alloc::<f32>(n * 3)? };
    let v_i = v as i32;
    let mut b = f.builder();
    b.arg(&lv).arg(&tv).arg(&mut stats).arg(&v_i);
    // SAFETY: argument types and counts match the kernel's signature.
    unsafe { b.launch(grid(n, LOGPROB_BLOCK)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(stats, dev.clone()),
        Shape::from((n, 3)),
    ))
}

pub fn logprob_bwd(
    l: &CudaStorage,
    ll: &Layout,
    t: &CudaStorage,
    lt: &Layout,
    lg: &CudaStorage,
    llg: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev: &CudaDevice = l.device();
    let (n, v) = ll.shape().dims2()?;
    let f = dev.get_or_load_custom_func("logprob_bwd_f32", "terse_logprob", ptx::LOGPROB)?;
    let lgv = view::<f32>(lg, llg, "lse_g")?;
    // The kernel works in place: copy the logits chunk into the output first.
    let mut out = unsafe { dev.alloc::<f32>(n * v)? };
    dev.memcpy_dtod(&view::<f32>(l, ll, "logits")?, &mut out)?;
    let tv = view::<u32>(t, lt, "targets")?;
    let v_i = v as i32;
    let mut b = f.builder();
    b.arg(&mut out).arg(&tv).arg(&lgv).arg(&v_i);
    // SAFETY: argument types and counts match the kernel's signature.
    unsafe { b.launch(grid(n, LOGPROB_BLOCK)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev.clone()),
        ll.shape().clone(),
    ))
}

pub fn kv_write(
    cache: &mut CudaStorage,
    lc: &Layout,
    src: &CudaStorage,
    ls: &Layout,
    slot: usize,
) -> Result<()> {
    let [b, hkv, cap, d] = crate::kernel_checks::kv_write(lc.dims(), ls.dims(), slot)?;
    if !lc.is_contiguous() || lc.start_offset() != 0 {
        crate::fail!("kv write: the cache {:?} must be contiguous", lc.shape());
    }
    let dev = cache.device().clone();
    let sfx = suffix(cache.dtype(), "kv write")?;
    let f =
        dev.get_or_load_custom_func(&format!("kv_write_{sfx}"), "terse_kv_cache", ptx::KV_CACHE)?;
    let args = [b as i32, hkv as i32, cap as i32, d as i32, slot as i32];
    let n = b * hkv * d;
    macro_rules! launch {
        ($t:ty) => {{
            let sv = view::<$t>(src, ls, "kv src")?;
            let c = cache.as_cuda_slice_mut::<$t>()?;
            let mut bld = f.builder();
            bld.arg(&sv).arg(c);
            for a in &args {
                bld.arg(a);
            }
            // SAFETY: argument types and counts match the kernel's signature.
            unsafe { bld.launch(elementwise(n)) }.w()?;
        }};
    }
    match cache.dtype() {
        DType::BF16 => launch!(half::bf16),
        _ => launch!(f32),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    q: &CudaStorage,
    lq: &Layout,
    k: &CudaStorage,
    lk: &Layout,
    v: &CudaStorage,
    lv: &Layout,
    (valid, lvalid): (&CudaStorage, &Layout),
    len: usize,
) -> Result<(CudaStorage, Shape)> {
    let dev: &CudaDevice = q.device();
    let (b, hq, d) = lq.shape().dims3()?;
    let (_, hkv, cap, _) = lk.shape().dims4()?;
    crate::kernel_checks::decode_attention(
        lq.dims(),
        lk.dims(),
        lv.dims(),
        lvalid.shape().elem_count(),
        len,
    )?;
    let sfx = suffix(q.dtype(), "decode attention")?;
    let f = dev.get_or_load_custom_func(
        &format!("decode_attention_{sfx}"),
        "terse_kv_cache",
        ptx::KV_CACHE,
    )?;
    let valid_d = view::<u8>(valid, lvalid, "validity flags")?;
    let ints = [hq as i32, hkv as i32, cap as i32, len as i32, d as i32];
    let scale = 1.0f32 / (d as f32).sqrt();
    let cfg = grid(b * hq, 32 * DECODE_WARPS);
    macro_rules! launch {
        ($t:ty) => {{
            let (qv, kv, vv) = (
                view::<$t>(q, lq, "q")?,
                view::<$t>(k, lk, "k cache")?,
                view::<$t>(v, lv, "v cache")?,
            );
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<$t>(b * hq * d)? };
            let mut bld = f.builder();
            bld.arg(&qv).arg(&kv).arg(&vv).arg(&valid_d).arg(&mut out);
            for a in &ints {
                bld.arg(a);
            }
            bld.arg(&scale);
            // SAFETY: argument types and counts match the kernel's signature.
            unsafe { bld.launch(cfg) }.w()?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    let out = match q.dtype() {
        DType::BF16 => launch!(half::bf16),
        _ => launch!(f32),
    };
    Ok((out, lq.shape().clone()))
}

/// One of a paged step's u32 tensors (tables, lengths, slots) as a device view.
fn meta_view<'a>(
    storage: &'a candle_core::Storage,
    layout: &Layout,
    what: &str,
) -> Result<CudaView<'a, u32>> {
    match storage {
        candle_core::Storage::Cuda(s) => view::<u32>(s, layout, what),
        _ => crate::fail!("paged step: the {what} are not on the GPU"),
    }
}

pub fn paged_kv_write(
    pool: &mut CudaStorage,
    lp: &Layout,
    src: &CudaStorage,
    ls: &Layout,
    meta: &crate::fused_paged::PagedMeta,
) -> Result<()> {
    let [b, hkv, _, bs, d] = crate::kernel_checks::paged_kv_write(lp.dims(), ls.dims())?;
    if !lp.is_contiguous() || lp.start_offset() != 0 {
        crate::fail!(
            "paged kv write: the pool {:?} must be contiguous",
            lp.shape()
        );
    }
    let dev = pool.device().clone();
    let sfx = suffix(pool.dtype(), "paged kv write")?;
    let f = dev.get_or_load_custom_func(
        &format!("paged_kv_write_{sfx}"),
        "terse_paged_attention",
        ptx::PAGED_ATTENTION,
    )?;
    let guard = meta.dev[2].storage_and_layout();
    let slots = meta_view(&guard.0, guard.1, "write slots")?;
    let args = [b as i32, hkv as i32, bs as i32, d as i32];
    macro_rules! launch {
        ($t:ty) => {{
            let sv = view::<$t>(src, ls, "paged kv src")?;
            let p = pool.as_cuda_slice_mut::<$t>()?;
            let mut bld = f.builder();
            bld.arg(&sv).arg(p).arg(&slots);
            for a in &args {
                bld.arg(a);
            }
            // SAFETY: argument types and counts match the kernel's signature; every slot was
            // checked to lie in the pool (`kernel_checks::paged_tables`).
            unsafe { bld.launch(elementwise(b * hkv * d)) }.w()?;
        }};
    }
    match pool.dtype() {
        DType::BF16 => launch!(half::bf16),
        _ => launch!(f32),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention(
    q: &CudaStorage,
    lq: &Layout,
    k: &CudaStorage,
    lk: &Layout,
    v: &CudaStorage,
    lv: &Layout,
    meta: &crate::fused_paged::PagedMeta,
) -> Result<(CudaStorage, Shape)> {
    let dev: &CudaDevice = q.device();
    let [b, hq, hkv, _, bs, d] = crate::kernel_checks::paged_decode_attention(
        lq.dims(),
        lk.dims(),
        lv.dims(),
        meta.lens.len(),
    )?;
    let sfx = suffix(q.dtype(), "paged attention")?;
    let f = dev.get_or_load_custom_func(
        &format!("paged_decode_attention_{sfx}"),
        "terse_paged_attention",
        ptx::PAGED_ATTENTION,
    )?;
    let (gt, gl) = (
        meta.dev[0].storage_and_layout(),
        meta.dev[1].storage_and_layout(),
    );
    let tables = meta_view(&gt.0, gt.1, "block tables")?;
    let lens = meta_view(&gl.0, gl.1, "lengths")?;
    let ints = [hq as i32, hkv as i32, bs as i32, meta.maxb as i32, d as i32];
    let scale = 1.0f32 / (d as f32).sqrt();
    let cfg = grid(b * hq, 32 * DECODE_WARPS);
    macro_rules! launch {
        ($t:ty) => {{
            let (qv, kv, vv) = (
                view::<$t>(q, lq, "q")?,
                view::<$t>(k, lk, "k pool")?,
                view::<$t>(v, lv, "v pool")?,
            );
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<$t>(b * hq * d)? };
            let mut bld = f.builder();
            bld.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&tables)
                .arg(&lens)
                .arg(&mut out);
            for a in &ints {
                bld.arg(a);
            }
            bld.arg(&scale);
            // SAFETY: argument types and counts match the kernel's signature; the tables were
            // checked to hold blocks of the pool and lengths within them.
            unsafe { bld.launch(cfg) }.w()?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    let out = match q.dtype() {
        DType::BF16 => launch!(half::bf16),
        _ => launch!(f32),
    };
    Ok((out, lq.shape().clone()))
}
