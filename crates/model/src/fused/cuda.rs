//! Kernel launches behind the custom ops of fused/ (the `cuda` feature only), each through its
//! launch description (crate::launch) and launching.rs's `Described`. Inputs must be
//! contiguous; f32 everywhere, bf16 for the storage-typed kernels.

#![allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill

use super::launching::{func, store, view, Described};
use crate::launch::{self, Storage as Store};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape};

/// Launches `rmsnorm_fwd_{sfx}` on contiguous x (rows, cols) and w (cols) -> (y, rstd).
fn rmsnorm_fwd_launch<T: CudaDType + DeviceRepr>(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    eps: f32,
    s: Store,
) -> Result<(CudaSlice<T>, CudaSlice<f32>)> {
    let dev: &CudaDevice = x.device();
    let cols = lw.shape().elem_count();
    let n = lx.shape().elem_count();
    let rows = n / cols;
    let l = launch::rmsnorm_fwd(s, rows, cols, eps);
    let f = func!(dev, l)?;
    let (xv, wv) = (
        view::<T>(x, lx, "rmsnorm x")?,
        view::<T>(w, lw, "rmsnorm w")?,
    );
    // SAFETY: every element is written by the kernel.
    let mut y = unsafe { dev.alloc::<T>(n)? };
    let mut rstd = unsafe { dev.alloc::<f32>(rows)? };
    let mut d = Described::new(f.builder(), &l);
    d.buf(0, &xv)?
        .buf(1, &wv)?
        .buf(2, &mut y)?
        .buf(3, &mut rstd)?;
    // SAFETY: x and y hold rows x cols, w cols and rstd rows elements.
    unsafe { d.launch() }?;
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
            rmsnorm_fwd_launch::<f32>(x, lx, w, lw, eps, Store::F32)?.0,
            dev,
        ),
        DType::BF16 => CudaStorage::wrap_cuda_slice(
            rmsnorm_fwd_launch::<half::bf16>(x, lx, w, lw, eps, Store::Bf16)?.0,
            dev,
        ),
        dt => store(dt, "rmsnorm").map(|_| unreachable!())?,
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
    let (_, rstd) = rmsnorm_fwd_launch::<f32>(x, lx, w, lw, eps, Store::F32)?;
    let (xv, wv, gv) = (
        view::<f32>(x, lx, "rmsnorm bwd x")?,
        view::<f32>(w, lw, "rmsnorm bwd w")?,
        view::<f32>(dy, ldy, "rmsnorm bwd dy")?,
    );
    let l = launch::rmsnorm_bwd(rows, cols);
    let bwd = func!(dev, l)?;
    // dw accumulates with atomics, so its row starts at zero.
    let mut out = dev.alloc_zeros::<f32>(n + cols)?;
    {
        let (mut dx, mut dw) = out.split_at_mut(n);
        let mut d = Described::new(bwd.builder(), &l);
        d.buf(0, &xv)?
            .buf(1, &wv)?
            .buf(2, &rstd)?
            .buf(3, &gv)?
            .buf(4, &mut dx)?
            .buf(5, &mut dw)?;
        // SAFETY: x, dy and dx hold rows x cols, w and dw cols, rstd rows elements.
        unsafe { d.launch() }?;
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
        st: Store,
    ) -> Result<CudaStorage> {
        let dev: &CudaDevice = x.device();
        let (b, h, t, d) = lx.shape().dims4()?;
        let l = launch::rope(st, inverse, [b, h, t, d]);
        let f = func!(dev, l)?;
        let (xv, cv, sv) = (
            view::<T>(x, lx, "rope x")?,
            view::<T>(c, lc, "rope cos")?,
            view::<T>(s, ls, "rope sin")?,
        );
        let n = lx.shape().elem_count();
        // SAFETY: every element is written by the kernel.
        let mut y = unsafe { dev.alloc::<T>(n)? };
        let mut dsc = Described::new(f.builder(), &l);
        dsc.buf(0, &xv)?.buf(1, &cv)?.buf(2, &sv)?.buf(3, &mut y)?;
        // SAFETY: x and y hold B x H x T x D elements, cos and sin B x T x D/2.
        unsafe { dsc.launch() }?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
    let out = match x.dtype() {
        DType::F32 => go::<f32>(x, lx, c, lc, s, ls, inverse, Store::F32)?,
        DType::BF16 => go::<half::bf16>(x, lx, c, lc, s, ls, inverse, Store::Bf16)?,
        dt => store(dt, "rope").map(|_| unreachable!())?,
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
    let lau = launch::logprob_fwd(n, v);
    let f = func!(dev, lau)?;
    let (lv, tv) = (
        view::<f32>(l, ll, "logits")?,
        view::<u32>(t, lt, "targets")?,
    );
    // SAFETY: every element is written by the kernel.
    let mut stats = unsafe { dev.alloc::<f32>(n * 3)? };
    let mut d = Described::new(f.builder(), &lau);
    d.buf(0, &lv)?.buf(1, &tv)?.buf(2, &mut stats)?;
    // SAFETY: logits hold n x v elements, targets n (each < v, checked), stats n x 3.
    unsafe { d.launch() }?;
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
    let lau = launch::logprob_bwd(n, v);
    let f = func!(dev, lau)?;
    let lgv = view::<f32>(lg, llg, "lse_g")?;
    // The kernel works in place: copy the logits chunk into the output first.
    let mut out = unsafe { dev.alloc::<f32>(n * v)? };
    dev.memcpy_dtod(&view::<f32>(l, ll, "logits")?, &mut out)?;
    let tv = view::<u32>(t, lt, "targets")?;
    let mut d = Described::new(f.builder(), &lau);
    d.buf(0, &mut out)?.buf(1, &tv)?.buf(2, &lgv)?;
    // SAFETY: logits hold n x v elements, targets n (each < v, checked), lse_g n x 2.
    unsafe { d.launch() }?;
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
    let l = launch::kv_write(store(cache.dtype(), "kv write")?, [b, hkv, cap, d], slot);
    let f = func!(&dev, l)?;
    macro_rules! launch {
        ($t:ty) => {{
            let sv = view::<$t>(src, ls, "kv src")?;
            let c = cache.as_cuda_slice_mut::<$t>()?;
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &sv)?.buf(1, c)?;
            // SAFETY: src holds B x Hkv x D elements and the cache B x Hkv x cap x D, slot < cap
            // (checked).
            unsafe { dsc.launch() }?;
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
    let st = store(q.dtype(), "decode attention")?;
    let l = launch::decode_attention(st, [b, hq, hkv, cap, d], len);
    let f = func!(dev, l)?;
    let valid_d = view::<u8>(valid, lvalid, "validity flags")?;
    macro_rules! launch {
        ($t:ty) => {{
            let (qv, kv, vv) = (
                view::<$t>(q, lq, "q")?,
                view::<$t>(k, lk, "k cache")?,
                view::<$t>(v, lv, "v cache")?,
            );
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<$t>(b * hq * d)? };
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &vv)?
                .buf(3, &valid_d)?
                .buf(4, &mut out)?;
            // SAFETY: the shapes were checked by kernel_checks::decode_attention.
            unsafe { dsc.launch() }?;
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
    meta: &crate::paged::PagedMeta,
) -> Result<()> {
    let [b, hkv, _, bs, d] = crate::kernel_checks::paged_kv_write(lp.dims(), ls.dims())?;
    if !lp.is_contiguous() || lp.start_offset() != 0 {
        crate::fail!(
            "paged kv write: the pool {:?} must be contiguous",
            lp.shape()
        );
    }
    let dev = pool.device().clone();
    let l = launch::paged_kv_write(store(pool.dtype(), "paged kv write")?, [b, hkv, bs, d]);
    let f = func!(&dev, l)?;
    let guard = meta.dev[2].storage_and_layout();
    let slots = meta_view(&guard.0, guard.1, "write slots")?;
    macro_rules! launch {
        ($t:ty) => {{
            let sv = view::<$t>(src, ls, "paged kv src")?;
            let p = pool.as_cuda_slice_mut::<$t>()?;
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &sv)?.buf(1, p)?.buf(2, &slots)?;
            // SAFETY: every slot was checked to lie in the pool (`kernel_checks::paged_tables`).
            unsafe { dsc.launch() }?;
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
    meta: &crate::paged::PagedMeta,
) -> Result<(CudaStorage, Shape)> {
    let dev: &CudaDevice = q.device();
    let [b, hq, hkv, _, bs, d] = crate::kernel_checks::paged_decode_attention(
        lq.dims(),
        lk.dims(),
        lv.dims(),
        meta.lens.len(),
    )?;
    let st = store(q.dtype(), "paged attention")?;
    let l = launch::paged_decode_attention(st, [b, hq, hkv, bs, meta.maxb, d]);
    let f = func!(dev, l)?;
    let (gt, gl) = (
        meta.dev[0].storage_and_layout(),
        meta.dev[1].storage_and_layout(),
    );
    let tables = meta_view(&gt.0, gt.1, "block tables")?;
    let lens = meta_view(&gl.0, gl.1, "lengths")?;
    macro_rules! launch {
        ($t:ty) => {{
            let (qv, kv, vv) = (
                view::<$t>(q, lq, "q")?,
                view::<$t>(k, lk, "k pool")?,
                view::<$t>(v, lv, "v pool")?,
            );
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<$t>(b * hq * d)? };
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &vv)?
                .buf(3, &tables)?
                .buf(4, &lens)?
                .buf(5, &mut out)?;
            // SAFETY: the tables were checked to hold blocks of the pool and lengths within
            // them.
            unsafe { dsc.launch() }?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    let out = match q.dtype() {
        DType::BF16 => launch!(half::bf16),
        _ => launch!(f32),
    };
    Ok((out, lq.shape().clone()))
}
