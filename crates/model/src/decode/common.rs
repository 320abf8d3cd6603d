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
