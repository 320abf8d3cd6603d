//! Math answers, the expression form the parser builds and the comparison reads: exact values
//! as big rationals where the arithmetic stays rational (`2.2 \times 10^{5}` is 220000 exactly,
//! `1000000001` is not `1000000000`), and floating-point evaluation (π, radicals, functions,
//! variables at fixed pseudo-random points) where it does not.

use super::budget::{exact_root, factorial, pow, Budget, STEP};
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{ToPrimitive, Zero};
use std::collections::BTreeMap;

/// A real-valued expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    /// An exact number; `decimals` is how many digits after the point the source wrote
    /// (None for integers, fractions and results of arithmetic). Boxed: it is the largest
    /// variant, and every expression on the parser's recursion is one (a smaller `Expr` is a
    /// smaller stack frame per nesting level).
    Num {
        value: Box<BigRational>,
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
        value: Box::new(BigRational::from_integer(BigInt::from(n))),
        decimals: None,
    }
}

impl Expr {
    /// The exact rational value, when every operation on the way is rational. A value over
    /// [`MAX_BITS`](super::budget::MAX_BITS) is refused (budget.rs), not approximated.
    pub(crate) fn exact(&self, b: &Budget) -> Option<BigRational> {
        use Expr::*;
        b.spend(STEP)?;
        // Integers add, subtract and multiply as integers: a rational's operators reduce
        // every result by a gcd, which for a big integer over 1 still walks all its bits.
        let ints = |x: &Expr,
                    y: &Expr,
                    f: fn(&BigInt, &BigInt) -> BigInt,
                    g: fn(BigRational, BigRational) -> BigRational| {
            let (x, y) = (x.exact(b)?, y.exact(b)?);
            let integers = x.is_integer() && y.is_integer();
            b.charge(&x, &y, integers)?;
            b.fits(if integers {
                BigRational::from_integer(f(x.numer(), y.numer()))
            } else {
                g(x, y)
            })
        };
        Some(match self {
            Num { value, .. } => BigRational::clone(value),
            Neg(a) => -a.exact(b)?,
            Add(x, y) => ints(x, y, |p, q| p + q, |p, q| p + q)?,
            Sub(x, y) => ints(x, y, |p, q| p - q, |p, q| p - q)?,
            Mul(x, y) => ints(x, y, |p, q| p * q, |p, q| p * q)?,
            Div(x, y) => {
                let d = y.exact(b)?;
                if d.is_zero() {
                    return None;
                }
                let n = x.exact(b)?;
                b.charge(&n, &d, false)?;
                b.fits(n / d)?
            }
            Pow(x, y) => {
                let (base, e) = (x.exact(b)?, y.exact(b)?);
                if !e.is_integer() {
                    // 8^{1/3}: a root in disguise.
                    let (n, d) = (e.numer(), e.denom().to_u32()?);
                    let r = exact_root(&base, d, b)?;
                    return pow(&r, n, b);
                }
                pow(&base, &e.to_integer(), b)?
            }
            Root(n, x) => exact_root(&x.exact(b)?, n.exact(b)?.to_integer().to_u32()?, b)?,
            Fact(a) => factorial(&a.exact(b)?, b)?,
            Pi | Inf | Var(_) | Func(..) | Log(..) | PlusMinus(..) => return None,
        })
    }

    /// The value with `vars` substituted; None where it is undefined (0 division, a negative
    /// radicand, a log of a non-positive number, a pole) or not finite. A finite computation
    /// that overflows is refused, not compared as ∞ (`\pi^{1000}` is not `\pi^{1001}`); ∞
    /// itself (an interval's end) is a value.
    pub(crate) fn approx(&self, vars: &BTreeMap<String, f64>, b: &Budget) -> Option<f64> {
        use Expr::*;
        b.spend(STEP)?;
        let over = |v: f64, from: &[f64]| -> Option<f64> {
            if v.is_infinite() && from.iter().all(|x| x.is_finite()) {
                return b.refuse();
            }
            Some(v)
        };
        let v = match self {
            Num { value, .. } => match value.to_f64() {
                Some(v) => over(v, &[])?,
                None => return b.refuse(),
            },
            Pi => std::f64::consts::PI,
            Inf => f64::INFINITY,
            Var(name) => *vars.get(name)?,
            Neg(a) => -a.approx(vars, b)?,
            Add(x, y) => {
                let (x, y) = (x.approx(vars, b)?, y.approx(vars, b)?);
                over(x + y, &[x, y])?
            }
            Sub(x, y) => {
                let (x, y) = (x.approx(vars, b)?, y.approx(vars, b)?);
                over(x - y, &[x, y])?
            }
            Mul(x, y) => {
                let (x, y) = (x.approx(vars, b)?, y.approx(vars, b)?);
                over(x * y, &[x, y])?
            }
            Div(x, y) => {
                let d = y.approx(vars, b)?;
                if d == 0.0 {
                    return None;
                }
                let n = x.approx(vars, b)?;
                over(n / d, &[n, d])?
            }
            Pow(x, y) => {
                let (x, e) = (x.approx(vars, b)?, y.approx(vars, b)?);
                if x < 0.0 && e.fract() != 0.0 {
                    return None;
                }
                over(x.powf(e), &[x, e])?
            }
            Root(n, x) => {
                let (n, x) = (n.approx(vars, b)?, x.approx(vars, b)?);
                if n == 0.0 {
                    return None;
                }
                let v = if x < 0.0 {
                    // Odd roots of negatives are real.
                    if n.fract() == 0.0 && (n as i64) % 2 != 0 {
                        -(-x).powf(1.0 / n)
                    } else {
                        return None;
                    }
                } else {
                    x.powf(1.0 / n)
                };
                over(v, &[n, x])?
            }
            Func(f, a) => {
                let x = a.approx(vars, b)?;
                let v = match f.as_str() {
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
                    "exp" => over(x.exp(), &[x])?,
                    "abs" => x.abs(),
                    _ => return None,
                };
                // cot 0 and csc 0: a pole, undefined.
                if v.is_infinite() && x.is_finite() {
                    return None;
                }
                v
            }
            Log(base, a) => {
                let (base, x) = (base.approx(vars, b)?, a.approx(vars, b)?);
                if base <= 0.0 || base == 1.0 || x <= 0.0 {
                    return None;
                }
                x.ln() / base.ln()
            }
            Fact(a) => {
                let n = a.approx(vars, b)?;
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

    /// The expression with every ± resolved both ways: at most 16 values, the first in the
    /// order plus before minus, left operand before right. It takes the expression, so a
    /// subtree without ± moves into its one value: a copy is made only where a ± multiplies
    /// the values (copying at every level made long chains quadratic).
    pub(crate) fn expand_pm(self, b: &Budget) -> Option<Vec<Expr>> {
        use Expr::*;
        const MAX_VALUES: usize = 16;
        type Join = fn(Box<Expr>, Box<Expr>) -> Expr;
        // Every pairing of the operands' values, the first MAX_VALUES of them.
        let cross = |xa: &[Expr], xb: &[Expr], f: Join| -> Option<Vec<Expr>> {
            let mut out = vec![];
            for x in xa {
                for y in xb.iter().take(MAX_VALUES - out.len()) {
                    b.spend(STEP)?;
                    out.push(f(Box::new(x.clone()), Box::new(y.clone())));
                }
            }
            Some(out)
        };
        let bin = |x: Box<Expr>, y: Box<Expr>, f: Join| -> Option<Vec<Expr>> {
            let (mut xa, mut xb) = (x.expand_pm(b)?, y.expand_pm(b)?);
            if let ([_], [_]) = (xa.as_slice(), xb.as_slice()) {
                let (x, y) = (xa.pop()?, xb.pop()?);
                return Some(vec![f(Box::new(x), Box::new(y))]);
            }
            cross(&xa, &xb, f)
        };
        let one = |x: Box<Expr>, f: &dyn Fn(Box<Expr>) -> Expr| -> Option<Vec<Expr>> {
            Some(
                x.expand_pm(b)?
                    .into_iter()
                    .map(|v| f(Box::new(v)))
                    .collect(),
            )
        };
        b.spend(STEP)?;
        match self {
            PlusMinus(x, y, mp) => {
                let (xa, xb) = (x.expand_pm(b)?, y.expand_pm(b)?);
                let plus = cross(&xa, &xb, Add)?;
                let minus = cross(&xa, &xb, Sub)?;
                let (first, second) = if mp { (minus, plus) } else { (plus, minus) };
                Some(first.into_iter().chain(second).take(MAX_VALUES).collect())
            }
            Neg(a) => one(a, &Neg),
            Func(f, a) => one(a, &|v| Func(f.clone(), v)),
            Fact(a) => one(a, &Fact),
            Add(x, y) => bin(x, y, Add),
            Sub(x, y) => bin(x, y, Sub),
            Mul(x, y) => bin(x, y, Mul),
            Div(x, y) => bin(x, y, Div),
            Pow(x, y) => bin(x, y, Pow),
            Root(x, y) => bin(x, y, Root),
            Log(x, y) => bin(x, y, Log),
            leaf @ (Num { .. } | Pi | Inf | Var(_)) => Some(vec![leaf]),
        }
    }

    /// The depth of the tree (a leaf is 1), walked without recursion, stopping once it is
    /// over `max`: what the parser checks before it lets a chain grow (parse_expr.rs).
    pub(crate) fn depth_over(&self, max: usize, b: &Budget) -> Option<usize> {
        use Expr::*;
        let mut deepest = 0;
        let mut stack = vec![(self, 1usize)];
        while let Some((e, d)) = stack.pop() {
            b.spend(1)?;
            deepest = deepest.max(d);
            if deepest > max {
                break;
            }
            match e {
                Neg(a) | Func(_, a) | Fact(a) => stack.push((a, d + 1)),
                Add(x, y)
                | Sub(x, y)
                | Mul(x, y)
                | Div(x, y)
                | Pow(x, y)
                | Root(x, y)
                | Log(x, y)
                | PlusMinus(x, y, _) => {
                    stack.push((x, d + 1));
                    stack.push((y, d + 1));
                }
                Num { .. } | Pi | Inf | Var(_) => {}
            }
        }
        Some(deepest)
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
