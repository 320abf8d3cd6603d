//! What the CPU decode kernels share: Cephes' vectorisable e^x (its constants are also the
//! vector kernels'), and `Kv`, a cache block as stored (f32, or the opt-in f16).

/// Cephes' e^x, shared by `exp` and the kernels' vector versions: ln 2 in two parts (the
/// second added back), then the polynomial's coefficients, highest degree first.
pub(crate) const EXP_LN2: (f32, f32) = (0.693_359_4, 2.121_944_4e-4);
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];

/// e^x to ~2 ulp, branch-free so loops over it vectorise (Cephes' expf: x = n·ln2 + r,
/// |r| ≤ ln2/2, degree-5 polynomial, scaled by 2^n through the exponent bits). Underflows to 0
/// below -87.3 (so e^-inf = 0), saturates at 88.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.5, 88.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = x - n * EXP_LN2.0 + n * EXP_LN2.1;
    let mut p = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        p = p * r + c;
    }
    let y = p * r * r + r + 1.0;
    let scaled = y * f32::from_bits(((n as i32 + 127).max(0) as u32) << 23);
    if x <= -87.3 {
        0.0
    } else {
        scaled
    }
}

/// Cache contents as stored: f32, or f16 (the opt-in half-size cache, read as f32).
#[derive(Clone, Copy)]
pub(crate) enum Kv<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
}

impl<'a> Kv<'a> {
    /// Elements start..start + n.
    pub(crate) fn slice(self, start: usize, n: usize) -> Kv<'a> {
        match self {
            Kv::F32(x) => Kv::F32(&x[start..][..n]),
            Kv::F16(x) => Kv::F16(&x[start..][..n]),
        }
    }

    /// (first element, element count, f16?) for the kernels' raw loads.
    pub(crate) fn raw(self) -> (*const u8, usize, bool) {
        match self {
            Kv::F32(x) => (x.as_ptr().cast(), x.len(), false),
            Kv::F16(x) => (x.as_ptr().cast(), x.len(), true),
        }
    }

    /// The contents as f32: borrowed when stored so, converted into `buf` otherwise.
    pub(super) fn f32s<'b>(self, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Kv::F32(x) => x,
            Kv::F16(x) => {
                buf.clear();
                buf.extend(x.iter().map(|h| h.to_f32()));
                buf
            }
        }
    }
}

/// One KV group's slots as the attention kernels read them: one contiguous run (the
/// preallocated cache's row), or the blocks of a paged pool in block-table order. Segment i
/// holds slots [i · seg_len, (i + 1) · seg_len); a kernel's chunk never crosses a segment, and
/// with segments a multiple of its chunk (64 slots for AVX-512, 8 for AVX2) the sums run in the
/// same order as over one contiguous run.
#[derive(Clone, Copy)]
pub(crate) enum Segs<'a> {
    /// (len, D) keys and values, contiguous.
    Flat { k: Kv<'a>, v: Kv<'a> },
    /// Blocks of a paged pool.
    Paged(PagedGroup<'a>),
}

/// A KV group of one sequence in a paged pool: block b's slots for this group start at element
/// `b · stride + off` of the pool and hold `block` slots of `d` elements.
#[derive(Clone, Copy)]
pub(crate) struct PagedGroup<'a> {
    pub pool: PoolPtr,
    pub blocks: &'a [u32],
    pub block: usize,
    pub stride: usize,
    pub off: usize,
    pub d: usize,
}

/// The K and V pools of one layer as raw pointers, shared by the threads of a decode step: each
/// thread writes only blocks its own sequences hold alone (the paged cache checks this before
/// the step), and reads blocks no thread writes in the step (shared prefix blocks are never
/// written: a write to a shared block copies it first).
#[derive(Clone, Copy)]
pub(crate) struct PoolPtr {
    pub k: *mut u8,
    pub v: *mut u8,
    /// Elements in each pool.
    pub n: usize,
    pub f16: bool,
}

// SAFETY: the pointers are only dereferenced under the ownership rule above (disjoint blocks
// written, unwritten blocks read), which the paged cache checks before each step.
#[allow(unsafe_code)]
unsafe impl Send for PoolPtr {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for PoolPtr {}

impl<'a> Segs<'a> {
    /// Whether the cache stores f16.
    pub(crate) fn f16(&self) -> bool {
        match self {
            Segs::Flat { k, .. } => matches!(k, Kv::F16(_)),
            Segs::Paged(p) => p.pool.f16,
        }
    }

    /// Slots per segment (unbounded for a flat run).
    #[inline(always)]
    pub(crate) fn seg_len(&self) -> usize {
        match self {
            Segs::Flat { .. } => usize::MAX,
            Segs::Paged(p) => p.block,
        }
    }

    /// Keys and values of segment i (all its slots; the caller reads the ones in use).
    #[inline(always)]
    pub(crate) fn seg(&self, i: usize) -> (Kv<'a>, Kv<'a>) {
        match *self {
            Segs::Flat { k, v } => (k, v),
            Segs::Paged(p) => {
                let start = p.blocks[i] as usize * p.stride + p.off;
                let n = p.block * p.d;
                assert!(start + n <= p.pool.n, "paged cache block out of range");
                // SAFETY: in bounds (asserted); the block is not written during this read (the
                // ownership rule on `PoolPtr`).
                #[allow(unsafe_code)]
                unsafe {
                    if p.pool.f16 {
                        let (k, v) = (p.pool.k.cast::<half::f16>(), p.pool.v.cast::<half::f16>());
                        (
                            Kv::F16(std::slice::from_raw_parts(k.add(start), n)),
                            Kv::F16(std::slice::from_raw_parts(v.add(start), n)),
                        )
                    } else {
                        let (k, v) = (p.pool.k.cast::<f32>(), p.pool.v.cast::<f32>());
                        (
                            Kv::F32(std::slice::from_raw_parts(k.add(start), n)),
                            Kv::F32(std::slice::from_raw_parts(v.add(start), n)),
                        )
                    }
                }
            }
        }
    }

    /// The first `len` slots' keys and values as contiguous f32 (borrowed when stored so in one
    /// run, else gathered and converted into the buffers): the two-pass fallback's input.
    pub(crate) fn gather_f32<'b>(
        &self,
        len: usize,
        d: usize,
        kbuf: &'b mut Vec<f32>,
        vbuf: &'b mut Vec<f32>,
    ) -> (&'b [f32], &'b [f32])
    where
        'a: 'b,
    {
        if let Segs::Flat { k, v } = *self {
            let (k, v) = (k.slice(0, len * d), v.slice(0, len * d));
            return (k.f32s(kbuf), v.f32s(vbuf));
        }
        kbuf.clear();
        vbuf.clear();
        let seg = self.seg_len();
        let mut t = 0;
        let mut tmp = Vec::new();
        while t < len {
            let n = seg.min(len - t);
            let (k, v) = self.seg(t / seg);
            kbuf.extend_from_slice(k.slice(0, n * d).f32s(&mut tmp));
            vbuf.extend_from_slice(v.slice(0, n * d).f32s(&mut tmp));
            t += n;
        }
        (kbuf, vbuf)
    }
}
