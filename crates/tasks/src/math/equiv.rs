//! Math answers, last stage: are two parsed answers the same? Values compare exactly when both
//! are rational (big integers and fractions, no tolerance); irrational constants compare in
//! floating point to 1e-12; expressions with variables compare by evaluation at fixed
//! pseudo-random points (symbolic equality of polynomials and rational functions); a ground
//! truth written as a decimal (`0.33`, `3.14159`) accepts an answer whose exact value has no
//! finite decimal expansion (`1/3`, `\pi`) when it rounds to it at the written places — the only
//! tolerance. Lists and sets compare unordered, tuples and intervals in order, `x = 3` as 3,
//! one-variable inequalities as intervals, ± as its two values. Everything runs under the
//! comparison's budget (budget.rs): an exact value over its size and a float that overflows
//! are refused, so neither ever compares equal by rounding (`0.1^{99999999}` is not 0,
//! `\pi^{1000}` is not `\pi^{1001}`). The floor in `close` (closeness relative to at least
//! 1e-2: near 0, values within 1e-14, or 1e-11 at variable points, are equal) is for float
//! noise such as `\sin\pi` against 0; it never applies when both values are exact.

use super::budget::{terminates, Budget, COMPARE, ROUND};
use super::expr::Expr;
use super::parse::{Answer, Item};
use std::collections::BTreeMap;

/// Values the variables take at the comparison points (irrational-looking, positive, so
/// radicals and logs of them are defined and coincidences are unlikely).
const POINTS: [f64; 11] = [
    0.7391, 1.3183, 2.1719, 0.4517, 1.7725, 2.6458, 0.9163, 1.5557, 3.0917, 0.6180, 1.2247,
];

/// Evaluation rounds of the symbolic comparison and how many must be defined on both sides.
const ROUNDS: usize = 7;
const MIN_DEFINED: usize = 3;

fn close(x: f64, y: f64, rel: f64) -> bool {
    if x.is_infinite() || y.is_infinite() {
        return x == y;
    }
    (x - y).abs() <= rel * x.abs().max(y.abs()).max(1e-2)
}

/// x rounds to the decimal y written with `d` places.
fn rounds_to(x: f64, y: f64, d: usize) -> bool {
    (x - y).abs() <= 0.5 * 10f64.powi(-(d as i32)) * (1.0 + 1e-9)
}

/// Answer `a` against ground truth `g`.
pub(crate) fn expr_eq(a: &Expr, g: &Expr, b: &Budget) -> bool {
    if b.spend(COMPARE).is_none() {
        return false;
    }
    let mut vars = vec![];
    a.vars(&mut vars);
    g.vars(&mut vars);
    vars.sort();
    if vars.is_empty() {
        let none = BTreeMap::new();
        let approx_gt = g.written_decimals().filter(|d| *d > 0);
        if let (Some(x), Some(y)) = (a.exact(b), g.exact(b)) {
            if x == y {
                return true;
            }
            return approx_gt.is_some_and(|d| {
                terminates(&x, b) == Some(false)
                    && rounds_to(f(&x), f(&y), d)
                    && a.written_decimals().is_none()
            });
        }
        let (Some(x), Some(y)) = (a.approx(&none, b), g.approx(&none, b)) else {
            return false;
        };
        if close(x, y, 1e-12) {
            return true;
        }
        // An irrational answer against a decimal ground truth: rounding at the written places.
        return approx_gt.is_some_and(|d| a.exact(b).is_none() && rounds_to(x, y, d));
    }
    let mut defined = 0;
    for k in 0..ROUNDS {
        if b.spend(ROUND).is_none() {
            return false;
        }
        let env: BTreeMap<String, f64> = vars
            .iter()
            .enumerate()
            .map(|(j, v)| (v.clone(), POINTS[(k * 5 + j * 3) % POINTS.len()]))
            .collect();
        match (a.approx(&env, b), g.approx(&env, b)) {
            (Some(x), Some(y)) => {
                if !close(x, y, 1e-9) {
                    return false;
                }
                defined += 1;
            }
            (None, None) => {}
            _ => return false,
        }
    }
    defined >= MIN_DEFINED
}

fn f(x: &num_rational::BigRational) -> f64 {
    num_traits::ToPrimitive::to_f64(x).unwrap_or(f64::NAN)
}

/// `x = 3` and `3 = x` read as 3; other relations as they are.
fn as_value(item: &Item) -> Item {
    if let Item::Rel(es, ops) = item {
        if ops.as_slice() == ["="] {
            match (&es[0], &es[1]) {
                (Expr::Var(_), e) | (e, Expr::Var(_)) => return Item::Expr(e.clone()),
                _ => {}
            }
        }
    }
    item.clone()
}

/// A one-variable inequality (`x \le 3`, `1 < x \le 2`, `3 > x`) as the interval it denotes.
fn as_interval(item: &Item) -> Item {
    let Item::Rel(es, ops) = item else {
        return item.clone();
    };
    let var_at: Vec<usize> = (0..es.len())
        .filter(|&i| matches!(es[i], Expr::Var(_)))
        .collect();
    let constant = |e: &Expr| {
        let mut v = vec![];
        e.vars(&mut v);
        v.is_empty()
    };
    if var_at.len() != 1 || ops.iter().any(|o| *o == "=" || *o == "!=") {
        return item.clone();
    }
    if !es
        .iter()
        .enumerate()
        .all(|(i, e)| i == var_at[0] || constant(e))
    {
        return item.clone();
    }
    let neg_inf = Expr::Neg(Box::new(Expr::Inf));
    let (mut lo, mut hi) = ((neg_inf, '('), (Expr::Inf, ')'));
    let v = var_at[0];
    // Bound on the left of the variable: `a < x` / `a > x`; on the right: `x < b` / `x > b`.
    if v > 0 {
        let (e, op) = (&es[v - 1], ops[v - 1]);
        match op {
            "<" => lo = (e.clone(), '('),
            "<=" => lo = (e.clone(), '['),
            ">" => hi = (e.clone(), ')'),
            ">=" => hi = (e.clone(), ']'),
            _ => return item.clone(),
        }
    }
    if v + 1 < es.len() {
        let (e, op) = (&es[v + 1], ops[v]);
        match op {
            "<" => hi = (e.clone(), ')'),
            "<=" => hi = (e.clone(), ']'),
            ">" => lo = (e.clone(), '('),
            ">=" => lo = (e.clone(), '['),
            _ => return item.clone(),
        }
    }
    Item::Bracket(lo.1, vec![Item::Expr(lo.0), Item::Expr(hi.0)], hi.1)
}

fn flip(op: &str) -> &str {
    match op {
        "<" => ">",
        ">" => "<",
        "<=" => ">=",
        ">=" => "<=",
        o => o,
    }
}

pub(crate) fn item_eq(a: &Item, g: &Item, b: &Budget) -> bool {
    match (a, g) {
        (Item::Expr(x), Item::Expr(y)) => expr_eq(x, y, b),
        (Item::Text(x), Item::Text(y)) => x == y,
        (Item::Bracket(oa, xa, ca), Item::Bracket(og, xg, cg)) => {
            oa == og && ca == cg && ordered_eq(xa, xg, b)
        }
        (Item::Set(xa), Item::Set(xg)) => unordered_eq(xa, xg, b),
        (Item::Rel(ea, oa), Item::Rel(eg, og)) => {
            if ea.len() != eg.len() {
                return false;
            }
            if oa.as_slice() == ["="] && og.as_slice() == ["="] {
                // Equations: the same zero set, written either way round.
                let d = |e: &[Expr]| Expr::Sub(Box::new(e[0].clone()), Box::new(e[1].clone()));
                let (da, dg) = (d(ea), d(eg));
                return expr_eq(&da, &dg, b) || expr_eq(&Expr::Neg(Box::new(da)), &dg, b);
            }
            let same = oa == og && ea.iter().zip(eg).all(|(x, y)| expr_eq(x, y, b));
            let reversed = oa.iter().rev().map(|o| flip(o)).eq(og.iter().copied())
                && ea.iter().rev().zip(eg).all(|(x, y)| expr_eq(x, y, b));
            same || reversed
        }
        _ => false,
    }
}

fn ordered_eq(a: &[Item], g: &[Item], b: &Budget) -> bool {
    a.len() == g.len() && a.iter().zip(g).all(|(x, y)| item_eq(x, y, b))
}

/// Equal as sets: every item of one side matches an item of the other.
fn unordered_eq(a: &[Item], g: &[Item], b: &Budget) -> bool {
    a.iter().all(|x| g.iter().any(|y| item_eq(x, y, b)))
        && g.iter().all(|y| a.iter().any(|x| item_eq(x, y, b)))
}

/// The items of an answer ready to compare: ± expanded, `x = 3` read as 3, inequalities as
/// intervals, duplicates removed. None once the budget is spent (a long list's
/// deduplication is quadratic in its length).
fn prepare(a: &Answer, b: &Budget) -> Option<Vec<Item>> {
    let mut out: Vec<Item> = vec![];
    for item in &a.items {
        let expanded: Vec<Item> = match item {
            Item::Expr(e) => e
                .clone()
                .expand_pm(b)?
                .into_iter()
                .map(Item::Expr)
                .collect(),
            Item::Rel(es, ops) if es.len() == 2 => {
                let rhs = es[1].clone().expand_pm(b)?;
                rhs.into_iter()
                    .map(|r| Item::Rel(vec![es[0].clone(), r], ops.clone()))
                    .collect()
            }
            other => vec![other.clone()],
        };
        for it in expanded {
            let it = as_interval(&as_value(&it));
            if !out.iter().any(|x| item_eq(x, &it, b)) {
                out.push(it);
            }
            if b.exceeded() {
                return None;
            }
        }
    }
    Some(out)
}

/// Answer `a` against ground truth `g`.
pub(crate) fn answers_eq(a: &Answer, g: &Answer, b: &Budget) -> bool {
    let (Some(pa), Some(pg)) = (prepare(a, b), prepare(g, b)) else {
        return false;
    };
    let singleton =
        |s: &Item, y: &Item| matches!(s, Item::Set(xs) if xs.len() == 1 && item_eq(&xs[0], y, b));
    match (pa.as_slice(), pg.as_slice()) {
        // A one-element set is its element: `\{3\}` against 3.
        ([x], [y]) => item_eq(x, y, b) || singleton(x, y) || singleton(y, x),
        // A bare list against a set (unordered) or a tuple (ordered).
        (xs, [Item::Set(ys)]) | ([Item::Set(ys)], xs) if xs.len() > 1 => unordered_eq(xs, ys, b),
        (xs, [Item::Bracket('(' | '[', ys, ')' | ']')])
        | ([Item::Bracket('(' | '[', ys, ')' | ']')], xs)
            if xs.len() > 1 =>
        {
            ordered_eq(xs, ys, b)
        }
        (xs, ys) => xs.len() > 1 && ys.len() > 1 && unordered_eq(xs, ys, b),
    }
}
