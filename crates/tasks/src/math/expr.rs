//! Math answers, the expression form the parser builds and the comparison reads: exact values
//! as big rationals where the arithmetic stays rational (`2.2 \times 10^{5}` is 220000 exactly,
//! `1000000001` is not `1000000000`), and floating-point evaluation (π, radicals, functions,
//! variables at fixed pseudo-random points) where it does not.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::collections::BTreeMap;

/// A real-valued expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    /// An exact number; `decimals` is how many digits after the point the source wrote
    /// (None for integers, fractions and results of arithmetic).
    Num {
        value: BigRational,
        decimals: Option<usize>,
    },
    Pi,
    /// +∞ (−∞ is `Neg(Inf)`), for interval ends.
    Inf,
    Var(String),
    Neg(Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    /// n-th root: (index, radicand).
    Root(Box<Expr>, Box<Expr>),
    /// sin, cos, tan, ln, log (base 10), exp, ... by name, or `log_b` as `Log(b, x)`.
    Func(String, Box<Expr>),
    Log(Box<Expr>, Box<Expr>),
    Fact(Box<Expr>),
    /// a ± b: expanded into its two values before comparing (`mp` for ∓).
    PlusMinus(Box<Expr>, Box<Expr>, bool),
}

pub(crate) fn int(n: i64) -> Expr {
    Expr::Num {
        value: BigRational::from_integer(BigInt::from(n)),
        decimals: None,
    }
}

/// Above this many bits an exact power is not worth computing (and a hostile `9^{9^9}` would
/// not finish): the float path takes over.
const MAX_BITS: u64 = 4096;

impl Expr {
    /// The exact rational value, when every operation on the way is rational.
    pub(crate) fn exact(&self) -> Option<BigRational> {
        use Expr::*;
        Some(match self {
            Num { value, .. } => value.clone(),
            Neg(a) => -a.exact()?,
            Add(a, b) => a.exact()? + b.exact()?,
            Sub(a, b) => a.exact()? - b.exact()?,
            Mul(a, b) => a.exact()? * b.exact()?,
            Div(a, b) => {
                let d = b.exact()?;
                if d.is_zero() {
                    return None;
                }
                a.exact()? / d
            }
            Pow(a, b) => {
                let (base, e) = (a.exact()?, b.exact()?);
                if !e.is_integer() {
                    // 8^{1/3}: a root in disguise.
                    let (n, d) = (e.numer().to_i64()?, e.denom().to_u32()?);
                    let r = exact_root(&base, d)?;
                    return pow_int(&r, n);
                }
                pow_int(&base, e.to_integer().to_i64()?)?
            }
            Root(n, x) => exact_root(&x.exact()?, n.exact()?.to_integer().to_u32()?)?,
            Fact(a) => {
                let n = a.exact()?;
                if !n.is_integer() || n.is_negative() || n > BigRational::from_integer(500.into()) {
                    return None;
                }
                let n = n.to_integer().to_u64()?;
                BigRational::from_integer((1..=n).fold(BigInt::one(), |p, k| p * k))
            }
            Pi | Inf | Var(_) | Func(..) | Log(..) | PlusMinus(..) => return None,
        })
    }

    /// The value with `vars` substituted; None where it is undefined (0 division, a negative
    /// radicand, a log of a non-positive number) or not finite.
    pub(crate) fn approx(&self, vars: &BTreeMap<String, f64>) -> Option<f64> {
        use Expr::*;
        let v = match self {
            Num { value, .. } => value.to_f64()?,
            Pi => std::f64::consts::PI,
            Inf => f64::INFINITY,
            Var(name) => *vars.get(name)?,
            Neg(a) => -a.approx(vars)?,
            Add(a, b) => a.approx(vars)? + b.approx(vars)?,
            Sub(a, b) => a.approx(vars)? - b.approx(vars)?,
            Mul(a, b) => a.approx(vars)? * b.approx(vars)?,
            Div(a, b) => {
                let d = b.approx(vars)?;
                if d == 0.0 {
                    return None;
                }
                a.approx(vars)? / d
            }
            Pow(a, b) => {
                let (x, e) = (a.approx(vars)?, b.approx(vars)?);
                if x < 0.0 && e.fract() != 0.0 {
                    return None;
                }
                x.powf(e)
            }
            Root(n, x) => {
                let (n, x) = (n.approx(vars)?, x.approx(vars)?);
                if n == 0.0 {
                    return None;
                }
                if x < 0.0 {
                    // Odd roots of negatives are real.
                    if n.fract() == 0.0 && (n as i64) % 2 != 0 {
                        -(-x).powf(1.0 / n)
                    } else {
                        return None;
                    }
                } else {
                    x.powf(1.0 / n)
                }
            }
            Func(f, a) => {
                let x = a.approx(vars)?;
                match f.as_str() {
                    "sin" => x.sin(),
                    "cos" => x.cos(),
                    "tan" => x.tan(),
                    "cot" => 1.0 / x.tan(),
                    "sec" => 1.0 / x.cos(),
                    "csc" => 1.0 / x.sin(),
                    "arcsin" => x.asin(),
                    "arccos" => x.acos(),
                    "arctan" => x.atan(),
                    "ln" if x > 0.0 => x.ln(),
                    "log" if x > 0.0 => x.log10(),
                    "exp" => x.exp(),
                    "abs" => x.abs(),
                    _ => return None,
                }
            }
            Log(b, a) => {
                let (b, x) = (b.approx(vars)?, a.approx(vars)?);
                if b <= 0.0 || b == 1.0 || x <= 0.0 {
                    return None;
                }
                x.ln() / b.ln()
            }
            Fact(a) => {
                let n = a.approx(vars)?;
                if n < 0.0 || n.fract() != 0.0 || n > 170.0 {
                    return None;
                }
                (1..=n as u64).map(|k| k as f64).product()
            }
            PlusMinus(..) => return None,
        };
        (!v.is_nan()).then_some(v)
    }

    /// Names of the variables, sorted.
    pub(crate) fn vars(&self, out: &mut Vec<String>) {
        use Expr::*;
        match self {
            Var(n) => {
                if !out.contains(n) {
                    out.push(n.clone());
                }
            }
            Neg(a) | Func(_, a) | Fact(a) => a.vars(out),
            Add(a, b) | Sub(a, b) | Mul(a, b) | Div(a, b) | Pow(a, b) | Root(a, b) | Log(a, b) => {
                a.vars(out);
                b.vars(out);
            }
            PlusMinus(a, b, _) => {
                a.vars(out);
                b.vars(out);
            }
            Num { .. } | Pi | Inf => {}
        }
    }

    /// The expression with every ± resolved both ways (at most 16 values).
    pub(crate) fn expand_pm(&self) -> Vec<Expr> {
        use Expr::*;
        let bin = |a: &Expr, b: &Expr, f: &dyn Fn(Box<Expr>, Box<Expr>) -> Expr| -> Vec<Expr> {
            let (xa, xb) = (a.expand_pm(), b.expand_pm());
            let mut out = vec![];
            for x in &xa {
                for y in &xb {
                    if out.len() < 16 {
                        out.push(f(Box::new(x.clone()), Box::new(y.clone())));
                    }
                }
            }
            out
        };
        match self {
            PlusMinus(a, b, mp) => {
                let plus = bin(a, b, &|x, y| Add(x, y));
                let minus = bin(a, b, &|x, y| Sub(x, y));
                let (first, second) = if *mp { (minus, plus) } else { (plus, minus) };
                first.into_iter().chain(second).take(16).collect()
            }
            Neg(a) => a
                .expand_pm()
                .into_iter()
                .map(|x| Neg(Box::new(x)))
                .collect(),
            Func(f, a) => a
                .expand_pm()
                .into_iter()
                .map(|x| Func(f.clone(), Box::new(x)))
                .collect(),
            Fact(a) => a
                .expand_pm()
                .into_iter()
                .map(|x| Fact(Box::new(x)))
                .collect(),
            Add(a, b) => bin(a, b, &|x, y| Add(x, y)),
            Sub(a, b) => bin(a, b, &|x, y| Sub(x, y)),
            Mul(a, b) => bin(a, b, &|x, y| Mul(x, y)),
            Div(a, b) => bin(a, b, &|x, y| Div(x, y)),
            Pow(a, b) => bin(a, b, &|x, y| Pow(x, y)),
            Root(a, b) => bin(a, b, &|x, y| Root(x, y)),
            Log(a, b) => bin(a, b, &|x, y| Log(x, y)),
            Num { .. } | Pi | Inf | Var(_) => vec![self.clone()],
        }
    }

    /// The decimals a literal number was written with (`-0.25` counts too).
    pub(crate) fn written_decimals(&self) -> Option<usize> {
        match self {
            Expr::Num { decimals, .. } => *decimals,
            Expr::Neg(a) => a.written_decimals(),
            _ => None,
        }
    }
}

/// base^e for an integer e, bounded in size.
fn pow_int(base: &BigRational, e: i64) -> Option<BigRational> {
    let bits = base.numer().bits().max(base.denom().bits()).max(1);
    if bits.saturating_mul(e.unsigned_abs()) > MAX_BITS {
        return None;
    }
    if e < 0 && base.is_zero() {
        return None;
    }
    let p = num_traits::pow(base.clone(), e.unsigned_abs() as usize);
    Some(if e < 0 { p.recip() } else { p })
}

/// The exact n-th root of a rational when numerator and denominator are perfect n-th powers.
fn exact_root(x: &BigRational, n: u32) -> Option<BigRational> {
    if n == 0 {
        return None;
    }
    if x.is_negative() {
        return (n % 2 == 1).then(|| exact_root(&-x, n).map(|r| -r))?;
    }
    let root = |v: &BigInt| -> Option<BigInt> {
        let r = v.nth_root(n);
        (num_traits::pow(r.clone(), n as usize) == *v).then_some(r)
    };
    Some(BigRational::new(root(x.numer())?, root(x.denom())?))
}

/// Whether a rational has a finite decimal expansion (its reduced denominator is 2^a·5^b).
pub(crate) fn terminates(x: &BigRational) -> bool {
    let mut d = x.denom().clone();
    for p in [2u32, 5] {
        let p = BigInt::from(p);
        while (&d % &p).is_zero() {
            d /= &p;
        }
    }
    d.is_one()
}

/// The rational a literal's digits stand for: digits · 10^(exp − decimals).
pub(crate) fn literal(digits: &str, decimals: Option<usize>, exp: i32) -> Option<BigRational> {
    let m: BigInt = digits.parse().ok()?;
    let shift = i64::from(exp) - decimals.unwrap_or(0) as i64;
    if shift.unsigned_abs() > 1000 {
        return None;
    }
    let ten = BigInt::from(10);
    let scale = num_traits::pow(ten, shift.unsigned_abs() as usize);
    Some(if shift >= 0 {
        BigRational::from_integer(m * scale)
    } else {
        BigRational::new(m, scale)
    })
}
