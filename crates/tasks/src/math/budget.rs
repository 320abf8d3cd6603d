//! Math answers: the verifier's budget, and the exact arithmetic it bounds. One model
//! completion must not stall or crash a training step, so each comparison ([`super::check`])
//! reads at most [`MAX_ANSWER_CHARS`] of answer text per side, nests and chains expressions
//! only so deep (parsing, evaluating and dropping an expression recurse over it: a bounded
//! depth is a bounded stack, whatever the thread's stack size), and spends at most
//! [`MAX_OPS`] units of work: a parse step, an evaluation step, an exact operation charged by
//! the size of its operands. An exact value is kept only within [`MAX_BITS`] bits (a huge
//! power, factorial or binomial is refused before it is computed), and a float evaluation that
//! overflows is refused: neither is rounded into a value that could compare equal to what it
//! is not (`0.1^{99999999}` is not 0, `\pi^{1000}` is not `\pi^{1001}`). Any refusal makes the
//! verdict [`Verdict::Unverifiable`], which every scorer counts as not correct.

use num_bigint::{BigInt, Sign};
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use std::cell::Cell;

/// Why the verifier gave no verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unverifiable {
    /// The answer is longer than [`MAX_ANSWER_CHARS`], nests or chains deeper than the
    /// parser reads, holds an exact value over [`MAX_BITS`] bits or a float that overflows,
    /// or comparing it took more than [`MAX_OPS`] units of work.
    BudgetExceeded,
}

/// Whether an answer is the reference: the verifier's word, or why it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Equal,
    NotEqual,
    Unverifiable(Unverifiable),
}

impl Verdict {
    pub fn is_equal(self) -> bool {
        self == Verdict::Equal
    }

    /// The reason, when there is no verdict.
    pub fn unverifiable(self) -> Option<Unverifiable> {
        match self {
            Verdict::Unverifiable(u) => Some(u),
            _ => None,
        }
    }
}

/// The most answer text (characters, per side, after extraction) a comparison reads. Ground
/// truths are short: graded.tsv's longest is 41 characters and a math dataset's longest are a
/// few hundred (a matrix, a long expression); a final answer 10 times that is not one a
/// grader would read either. At this size lexing and parsing take well under a millisecond.
pub const MAX_ANSWER_CHARS: usize = 4096;

/// Units of work per comparison, a unit about 10 ns of one core: the whole budget is about a
/// millisecond (`cargo xtask bench verify` measures it on the corpus's cases that spend it
/// all). A normal answer spends a few hundred, the proptests' most complex expressions
/// (nested fractions, mixed numbers and radicals, compared rewritten) about 5,000.
pub const MAX_OPS: u64 = 100_000;

/// What the steps cost, in units, measured rather than derived: a parse step or an evaluated
/// node; the setup of one comparison of two expressions; one evaluation point of an
/// expression with variables (its table of values); an operation on small exact rationals
/// (num-rational reduces every result by a gcd, a microsecond even for one-word numbers).
pub(crate) const STEP: u64 = 2;
pub(crate) const COMPARE: u64 = 10;
pub(crate) const ROUND: u64 = 8;
const RATIONAL_OP: u64 = 64;

/// The deepest expression tree chains build (`1+1+…`, `2·2·…`, `5!!…`): 100 terms of one
/// sum, or fewer when its terms are themselves deep. With the parser's nesting limit (48
/// brackets, parse.rs) this bounds every recursion over an expression.
pub(crate) const MAX_DEPTH: usize = 100;

/// The largest exact value, in bits of its numerator or denominator (1233 decimal digits).
/// Above it the float path does not take over either: the verdict is unverifiable.
pub const MAX_BITS: u64 = 4096;

/// The work left for one comparison. Shared by reference through the lexer, the parser and
/// the evaluation; once exceeded, everything after it fails at once.
pub(crate) struct Budget {
    left: Cell<u64>,
    exceeded: Cell<bool>,
}

impl Budget {
    pub(crate) fn new() -> Self {
        Self {
            left: Cell::new(MAX_OPS),
            exceeded: Cell::new(false),
        }
    }

    /// Spends `units`; None (and the budget marked exceeded) when they are not left.
    pub(crate) fn spend(&self, units: u64) -> Option<()> {
        match self.left.get().checked_sub(units) {
            Some(left) if !self.exceeded.get() => {
                self.left.set(left);
                Some(())
            }
            _ => self.refuse(),
        }
    }

    /// Refuses the work at hand: the comparison's verdict will be unverifiable.
    pub(crate) fn refuse<T>(&self) -> Option<T> {
        self.exceeded.set(true);
        None
    }

    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded.get()
    }

    /// Charges one exact operation on `a` and `b`: as integers (`integers`: both are, and the
    /// operation keeps them so), in time linear in, or the product of, their 64-bit words; or
    /// as rationals, whose result is reduced by a binary gcd, about 64·w² word operations
    /// for w words.
    pub(crate) fn charge(&self, a: &BigRational, b: &BigRational, integers: bool) -> Option<()> {
        let (wa, wb) = (words(a), words(b));
        if integers {
            return self.spend(STEP + wa * wb / 8);
        }
        self.spend(RATIONAL_OP + 8 * (wa + wb) * (wa + wb))
    }

    /// `x`, when it fits [`MAX_BITS`].
    pub(crate) fn fits(&self, x: BigRational) -> Option<BigRational> {
        if bits(&x) > MAX_BITS {
            return self.refuse();
        }
        Some(x)
    }
}

/// Bits of the larger of a rational's numerator and denominator.
fn bits(x: &BigRational) -> u64 {
    x.numer().bits().max(x.denom().bits())
}

/// 64-bit words of the larger of a rational's numerator and denominator.
fn words(x: &BigRational) -> u64 {
    bits(x).div_ceil(64)
}

/// base^e for an integer e, refused when the result would exceed [`MAX_BITS`]. 0, 1 and −1
/// take any power (`1^{10^{30}}` is 1).
pub(crate) fn pow(base: &BigRational, e: &BigInt, b: &Budget) -> Option<BigRational> {
    if base.is_zero() {
        return match e.sign() {
            Sign::Minus => None,
            Sign::NoSign => Some(BigRational::one()),
            Sign::Plus => Some(BigRational::zero()),
        };
    }
    if base.is_integer() && base.numer().magnitude().is_one() {
        let odd = e.magnitude().bit(0);
        return Some(if base.is_negative() && odd {
            -BigRational::one()
        } else {
            BigRational::one()
        });
    }
    let Some(n) = e.magnitude().to_u64() else {
        return b.refuse();
    };
    if bits(base).max(1).saturating_mul(n) > MAX_BITS {
        return b.refuse();
    }
    // Numerator and denominator apart: powers of coprime numbers stay coprime, so no gcd
    // (a rational's squarings would each reduce by one, quadratic in the size).
    let w = (bits(base) * n).div_ceil(64);
    b.spend(STEP + w * w / 8)?;
    let n = usize::try_from(n).ok()?;
    let p = BigRational::new_raw(
        num_traits::pow(base.numer().clone(), n),
        num_traits::pow(base.denom().clone(), n),
    );
    Some(if e.is_negative() { p.recip() } else { p })
}

/// The exact n-th root of a rational when numerator and denominator are perfect n-th powers.
pub(crate) fn exact_root(x: &BigRational, n: u32, b: &Budget) -> Option<BigRational> {
    if n == 0 {
        return None;
    }
    if x.is_negative() {
        return (n % 2 == 1).then(|| exact_root(&-x, n, b).map(|r| -r))?;
    }
    // Newton's iterations, each a division of the value's size, and the check's power.
    let w = words(x);
    b.spend(RATIONAL_OP + 8 * w * w)?;
    let root = |v: &BigInt| -> Option<BigInt> {
        let r = v.nth_root(n);
        (num_traits::pow(r.clone(), n as usize) == *v).then_some(r)
    };
    // Roots of coprime numbers are coprime: already reduced.
    Some(BigRational::new_raw(root(x.numer())?, root(x.denom())?))
}

/// Whether a rational has a finite decimal expansion (its reduced denominator is 2^a·5^b).
pub(crate) fn terminates(x: &BigRational, b: &Budget) -> Option<bool> {
    let mut d = x.denom().clone();
    d >>= d.trailing_zeros().unwrap_or(0);
    let five = BigInt::from(5);
    loop {
        b.spend(STEP + words(x))?;
        if !(&d % &five).is_zero() {
            return Some(d.is_one());
        }
        d /= &five;
    }
}

/// The rational a literal's digits stand for: digits · 10^(exp − decimals), refused when it
/// would exceed [`MAX_BITS`] (about 3.32 bits a digit).
pub(crate) fn literal(
    digits: &str,
    decimals: Option<usize>,
    exp: i32,
    b: &Budget,
) -> Option<BigRational> {
    let shift = i64::from(exp) - decimals.unwrap_or(0) as i64;
    let significant = digits.trim_start_matches('0').len() as u64;
    let numer_digits = significant + shift.max(0).unsigned_abs();
    let denom_digits = shift.min(0).unsigned_abs();
    if numer_digits.max(denom_digits).saturating_mul(10) / 3 > MAX_BITS {
        return b.refuse();
    }
    // Parsing the digits, and the gcd that reduces digits / 10^k.
    let w = numer_digits.max(denom_digits) / 19 + 1;
    b.spend(if shift < 0 {
        RATIONAL_OP + 8 * w * w
    } else {
        STEP + w * w
    })?;
    let m: BigInt = digits.parse().ok()?;
    let scale = num_traits::pow(BigInt::from(10), shift.unsigned_abs() as usize);
    Some(if shift >= 0 {
        BigRational::from_integer(m * scale)
    } else {
        BigRational::new(m, scale)
    })
}

/// n! of a natural number; refused above 500! (3767 bits, within [`MAX_BITS`]).
pub(crate) fn factorial(n: &BigRational, b: &Budget) -> Option<BigRational> {
    if !n.is_integer() || n.is_negative() {
        return None;
    }
    let Some(n) = n.to_integer().to_u64().filter(|&n| n <= 500) else {
        return b.refuse();
    };
    // n small multiplications of a number growing to n·log2(n) bits.
    b.spend(STEP + n * n / 64)?;
    Some(BigRational::from_integer(
        (1..=n).fold(BigInt::one(), |p, k| p * k),
    ))
}

/// `\binom{n}{k}` of natural numbers (0 when k > n); None for other arguments, refused when
/// it would exceed [`MAX_BITS`] (found while it grows: C(n, j) increases up to j = n/2).
pub(crate) fn binomial(n: &BigRational, k: &BigRational, b: &Budget) -> Option<BigRational> {
    if !n.is_integer() || !k.is_integer() || n.is_negative() || k.is_negative() {
        return None;
    }
    if k > n {
        return Some(BigRational::zero());
    }
    let (Some(n), Some(k)) = (n.to_integer().to_i64(), k.to_integer().to_i64()) else {
        return b.refuse();
    };
    let mut c = BigInt::one();
    for j in 0..k.min(n - k) {
        b.spend(STEP + c.bits().div_ceil(64))?;
        c = c * (n - j) / (j + 1);
        if c.bits() > MAX_BITS {
            return b.refuse();
        }
    }
    Some(BigRational::from_integer(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(n: i64) -> BigRational {
        BigRational::from_integer(n.into())
    }

    #[test]
    fn sizes_over_the_limit_are_refused_not_computed() {
        let b = Budget::new();
        assert_eq!(
            pow(&int(2), &2048.into(), &b).map(|p| p.numer().bits()),
            Some(2049)
        );
        assert!(!b.exceeded());
        assert_eq!(pow(&int(2), &2049.into(), &b), None);
        assert!(b.exceeded());
        let b = Budget::new();
        let tenth = BigRational::new(1.into(), 10.into());
        assert_eq!(pow(&tenth, &99_999_999.into(), &b), None);
        assert!(b.exceeded(), "0.1^99999999 is refused, not rounded to 0");
        let b = Budget::new();
        assert_eq!(pow(&int(-1), &BigInt::from(10).pow(30), &b), Some(int(1)));
        assert_eq!(pow(&int(0), &(-1).into(), &b), None);
        assert_eq!(factorial(&int(5), &b), Some(int(120)));
        assert_eq!(factorial(&int(-1), &b), None);
        assert!(!b.exceeded(), "an undefined value is not a refusal");
        assert_eq!(factorial(&int(100_000), &b), None);
        assert!(b.exceeded());
        let b = Budget::new();
        assert_eq!(binomial(&int(5), &int(2), &b), Some(int(10)));
        assert_eq!(binomial(&int(20_000), &int(2), &b), Some(int(199_990_000)));
        assert_eq!(binomial(&int(2), &int(5), &b), Some(int(0)));
        assert!(!b.exceeded());
        assert_eq!(binomial(&int(1_000_000_000), &int(500_000_000), &b), None);
        assert!(b.exceeded());
    }

    #[test]
    fn literals_terminating_decimals_and_roots() {
        let b = Budget::new();
        assert_eq!(
            literal("25", Some(1), 0, &b),
            Some(BigRational::new(5.into(), 2.into()))
        );
        assert_eq!(literal("22", Some(1), 5, &b), Some(int(220_000)));
        assert!(literal(&"9".repeat(1200), None, 0, &b).is_some());
        assert_eq!(
            terminates(&BigRational::new(1.into(), 40.into()), &b),
            Some(true)
        );
        assert_eq!(
            terminates(&BigRational::new(1.into(), 3.into()), &b),
            Some(false)
        );
        assert_eq!(exact_root(&int(-27), 3, &b), Some(int(-3)));
        assert_eq!(exact_root(&int(8), 2, &b), None);
        assert!(!b.exceeded());
        assert_eq!(literal(&"9".repeat(1300), None, 0, &b), None);
        assert!(b.exceeded());
    }

    #[test]
    fn an_exhausted_budget_fails_everything_after() {
        let b = Budget::new();
        assert!(b.spend(MAX_OPS).is_some());
        assert!(b.spend(1).is_none());
        assert!(b.exceeded());
        assert!(b.spend(0).is_none());
    }
}
