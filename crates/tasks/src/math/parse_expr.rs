//! Math answers, the expression half of the parser: sums, products (implicit ones too: `2x`,
//! `2\\pi`, `(2)(3)`), signs, powers, factorials, and the atoms — numbers (mixed numbers,
//! `3 million`), variables, `\\frac`/`\\sqrt[n]` with TeX's one-token arguments, π, ∞,
//! functions, `|x|`. The item half (lists, sets, brackets, relations, units) is parse.rs.

use super::budget::{binomial, literal, MAX_DEPTH};
use super::expr::{int, Expr};
use super::lex::Tok;
use super::parse::{P, R};
use super::words::{noun, FUNCS, GREEK, MULTIPLIERS, TEXT_UNITS, UNITS};

/// A binary node's constructor (`Expr::Add`, ...): what a chain's next link is built with.
type Join = fn(Box<Expr>, Box<Expr>) -> Expr;

impl P<'_> {
    pub(super) fn expr(&mut self) -> R<Expr> {
        self.enter()?;
        let e = self.sum();
        self.depth -= 1;
        e
    }

    fn sum(&mut self) -> R<Expr> {
        // A leading ± or ∓: 0 ± the first term.
        let lead = if self.eat_cmd("pm") {
            Some(false)
        } else if self.eat_cmd("mp") {
            Some(true)
        } else {
            None
        };
        let first = self.term()?;
        let mut v = match lead {
            Some(mp) => Expr::PlusMinus(Box::new(int(0)), Box::new(first), mp),
            None => first,
        };
        let mut depth = None;
        loop {
            let op: Join = if self.eat_op('+') {
                Expr::Add
            } else if self.eat_op('-') {
                Expr::Sub
            } else if self.eat_cmd("pm") {
                |a, b| Expr::PlusMinus(a, b, false)
            } else if self.eat_cmd("mp") {
                |a, b| Expr::PlusMinus(a, b, true)
            } else {
                return Some(v);
            };
            let t = self.term()?;
            self.chain(&mut depth, &v, Some(&t))?;
            v = op(Box::new(v), Box::new(t));
        }
    }

    /// Checks a chain before it grows by one node over `v` (and `operand`): the tree a loop
    /// builds is as deep as its operands plus its length, and a tree over [`MAX_DEPTH`] is
    /// refused before it exists (evaluating or dropping it would recurse that deep). `depth`
    /// is the chain's depth so far, walked from `v` on its first growth only: a lone term
    /// costs nothing.
    fn chain(&mut self, depth: &mut Option<usize>, v: &Expr, operand: Option<&Expr>) -> R<()> {
        let d = match *depth {
            Some(d) => d,
            None => v.depth_over(MAX_DEPTH, self.b)?,
        };
        let o = match operand {
            Some(e) => e.depth_over(MAX_DEPTH, self.b)?,
            None => 0,
        };
        let grown = 1 + d.max(o);
        if grown > MAX_DEPTH {
            return self.b.refuse();
        }
        *depth = Some(grown);
        Some(())
    }

    /// Whether the next token can start a factor of an implicit product (`2x`, `2\pi`, `(2)(3)`).
    fn starts_factor(&self) -> bool {
        match self.peek() {
            Some(Tok::Op('(')) => true,
            Some(Tok::Word { w, text }) => {
                !(["or", "and"].contains(&w.as_str())
                    || UNITS.contains(&w.as_str())
                    || (*text && TEXT_UNITS.contains(&w.as_str()))
                    || noun(w, *text)
                    || MULTIPLIERS.iter().any(|(m, ..)| m == w))
            }
            Some(Tok::Cmd(c)) => {
                !["le", "ge", "ne", "pm", "mp", "cup", "in", "emptyset"].contains(&c.as_str())
            }
            Some(Tok::Num { .. }) => false,
            _ => false,
        }
    }

    fn term(&mut self) -> R<Expr> {
        let mut v = self.unary()?;
        let mut depth = None;
        loop {
            let (op, f): (Join, _) = if self.eat_op('*') {
                (Expr::Mul, self.unary()?)
            } else if self.eat_op('/') {
                (Expr::Div, self.unary()?)
            } else if self.starts_factor() {
                (Expr::Mul, self.power()?)
            } else {
                return Some(v);
            };
            self.chain(&mut depth, &v, Some(&f))?;
            v = op(Box::new(v), Box::new(f));
        }
    }

    fn unary(&mut self) -> R<Expr> {
        let mut neg = false;
        loop {
            if self.eat_op('-') {
                neg = !neg;
            } else if !self.eat_op('+') {
                break;
            }
        }
        let v = self.power()?;
        Some(if neg { Expr::Neg(Box::new(v)) } else { v })
    }

    fn power(&mut self) -> R<Expr> {
        let mut base = self.postfix()?;
        if self.eat_op('^') {
            self.enter()?;
            let e = if self.peek() == Some(&Tok::Op('{')) {
                self.group()
            } else if self.eat_op('-') {
                self.single().map(|s| Expr::Neg(Box::new(s)))
            } else {
                self.single()
            };
            self.depth -= 1;
            base = euler(Expr::Pow(Box::new(base), Box::new(e?)));
            let mut depth = None;
            while self.eat_op('!') {
                self.chain(&mut depth, &base, None)?;
                base = Expr::Fact(Box::new(base));
            }
        }
        Some(base)
    }

    fn postfix(&mut self) -> R<Expr> {
        let mut v = self.atom()?;
        let mut depth = None;
        while self.peek() == Some(&Tok::Op('!')) && self.peek_at(1) != Some(&Tok::Op('=')) {
            self.i += 1;
            self.chain(&mut depth, &v, None)?;
            v = Expr::Fact(Box::new(v));
        }
        Some(v)
    }

    /// `{ expr }`.
    fn group(&mut self) -> R<Expr> {
        self.eat_op('{').then_some(())?;
        let v = self.expr()?;
        self.eat_op('}').then_some(v)
    }

    /// A TeX argument: a braced group or one token (`\frac12` is 1/2, `\sqrt 2`).
    fn arg(&mut self) -> R<Expr> {
        match self.peek()? {
            Tok::Op('{') => self.group(),
            Tok::Num {
                digits,
                decimals: None,
                exp: 0,
            } if digits.len() > 1 => {
                // One digit is the argument; the rest stays for what follows.
                let (d, rest) = digits.split_at(1);
                let (d, rest) = (d.to_string(), rest.to_string());
                self.t[self.i] = Tok::Num {
                    digits: rest,
                    decimals: None,
                    exp: 0,
                };
                self.num(&d, None, 0)
            }
            _ => self.single(),
        }
    }

    /// One number, letter or command value, no operators.
    fn single(&mut self) -> R<Expr> {
        match self.peek()?.clone() {
            Tok::Num {
                digits,
                decimals,
                exp,
            } => {
                self.i += 1;
                self.num(&digits, decimals, exp)
            }
            Tok::Word { w, .. } if w.chars().count() == 1 => {
                self.i += 1;
                Some(Expr::Var(w))
            }
            Tok::Cmd(_) | Tok::Op('{') => self.atom(),
            _ => None,
        }
    }

    fn atom(&mut self) -> R<Expr> {
        self.enter()?;
        let v = self.atom_inner();
        self.depth -= 1;
        v
    }

    /// One atom. Each kind of token has its own function, so a nested atom costs the stack
    /// only its own kind's frame (a debug build's frame holds every arm's temporaries: one
    /// function for all kinds took 8 KiB a level).
    fn atom_inner(&mut self) -> R<Expr> {
        match self.peek()? {
            Tok::Op(c @ ('(' | '[')) => {
                let close = if *c == '(' { ')' } else { ']' };
                self.i += 1;
                let v = self.expr()?;
                self.eat_op(close).then_some(v)
            }
            Tok::Op('{') => self.group(),
            Tok::Op('|') => {
                self.i += 1;
                let v = self.expr()?;
                self.eat_op('|')
                    .then(|| Expr::Func("abs".into(), Box::new(v)))
            }
            Tok::Num { .. } => self.number(),
            Tok::Word { .. } => self.word(),
            Tok::Cmd(_) => self.command(),
            _ => None,
        }
    }

    /// A number, a mixed number (`1\frac{1}{2}`) or a number of millions (`3 million`).
    fn number(&mut self) -> R<Expr> {
        let Some(Tok::Num {
            digits,
            decimals,
            exp,
        }) = self.peek().cloned()
        else {
            return None;
        };
        self.i += 1;
        let mut v = self.num(&digits, decimals, exp)?;
        // A mixed number: an integer directly followed by a fraction of integers.
        if decimals.is_none() && exp == 0 && matches!(self.peek(), Some(Tok::Cmd(c)) if c == "frac")
        {
            let save = self.i;
            self.i += 1;
            match (self.arg(), self.arg()) {
                (
                    Some(a @ Expr::Num { decimals: None, .. }),
                    Some(b @ Expr::Num { decimals: None, .. }),
                ) => {
                    v = Expr::Add(Box::new(v), Box::new(Expr::Div(Box::new(a), Box::new(b))));
                }
                _ => self.i = save,
            }
        }
        // "3 million".
        if let Some(Tok::Word { w, .. }) = self.peek() {
            if let Some((_, d, p)) = MULTIPLIERS.iter().find(|(m, ..)| m == w) {
                self.i += 1;
                let (d, p) = (*d, *p);
                v = Expr::Mul(Box::new(v), Box::new(self.num(d, None, p)?));
            }
        }
        Some(v)
    }

    /// A word in an expression: π, ∞, a function, a variable, a product of letters.
    fn word(&mut self) -> R<Expr> {
        let Some(Tok::Word { w, .. }) = self.peek().cloned() else {
            return None;
        };
        self.i += 1;
        match w.as_str() {
            "pi" => Some(Expr::Pi),
            "infinity" | "inf" => Some(Expr::Inf),
            "sqrt" => Some(Expr::Root(Box::new(int(2)), Box::new(self.arg()?))),
            f if FUNCS.contains(&f) => self.func(f),
            _ if w.chars().count() == 1 => Some(self.subscript(w)),
            // Several letters in an expression: a product of variables ("xy").
            _ if w.len() <= 3 && !UNITS.contains(&w.as_str()) => {
                let mut it = w.chars().map(|c| Expr::Var(c.to_string()));
                let first = it.next()?;
                Some(it.fold(first, |a, b| Expr::Mul(Box::new(a), Box::new(b))))
            }
            _ => None,
        }
    }

    /// A command's value: `\frac`, `\sqrt[n]`, `\binom`, `\log_b`, functions, π, ∞, Greek.
    fn command(&mut self) -> R<Expr> {
        let Some(Tok::Cmd(c)) = self.peek().cloned() else {
            return None;
        };
        self.i += 1;
        match c.as_str() {
            "frac" | "over" => {
                let a = self.arg()?;
                let b = self.arg()?;
                Some(Expr::Div(Box::new(a), Box::new(b)))
            }
            "sqrt" => {
                let index = if self.eat_op('[') {
                    let n = self.expr()?;
                    self.eat_op(']').then_some(n)?
                } else {
                    int(2)
                };
                Some(Expr::Root(Box::new(index), Box::new(self.arg()?)))
            }
            "pi" => Some(Expr::Pi),
            "binom" | "dbinom" | "tbinom" => self.binom(),
            "infty" => Some(Expr::Inf),
            "log" if self.peek() == Some(&Tok::Op('_')) => {
                self.i += 1;
                let base = self.arg()?;
                let x = self.func_arg()?;
                Some(Expr::Log(Box::new(base), Box::new(x)))
            }
            f if FUNCS.contains(&f) => self.func(f),
            g if GREEK.contains(&g) => Some(Expr::Var(format!("\\{g}"))),
            _ => None,
        }
    }

    /// A function's argument: `\sin x`, `\sin(x)`, `\sin{x}`, `\sin^2 x` is not supported.
    fn func_arg(&mut self) -> R<Expr> {
        match self.peek()? {
            Tok::Op('(') | Tok::Op('{') => self.atom(),
            _ => self.power(),
        }
    }

    fn func(&mut self, name: &str) -> R<Expr> {
        let x = self.func_arg()?;
        // ln e = 1 and ln e^x = x: `e` before a natural log is Euler's number.
        if name == "ln" {
            match x {
                Expr::Var(v) if v == "e" => return Some(int(1)),
                Expr::Pow(b, p) if matches!(&*b, Expr::Var(v) if v == "e") => return Some(*p),
                _ => {}
            }
        }
        Some(Expr::Func(name.to_string(), Box::new(x)))
    }

    /// A one-letter name with its subscript, if any (`x_1`, `a_{10}`, `x_n`): one variable.
    fn subscript(&mut self, w: String) -> Expr {
        if self.peek() != Some(&Tok::Op('_')) {
            return Expr::Var(w);
        }
        let text = |t: &Tok| match t {
            Tok::Num {
                digits,
                decimals: None,
                exp: 0,
            } => Some(digits.clone()),
            Tok::Word { w, .. } => Some(w.clone()),
            _ => None,
        };
        let (sub, used) = match (self.peek_at(1), self.peek_at(2), self.peek_at(3)) {
            (Some(Tok::Op('{')), Some(t), Some(Tok::Op('}'))) => (text(t), 4),
            (Some(t), _, _) => (text(t), 2),
            _ => (None, 0),
        };
        match sub {
            Some(s) => {
                self.i += used;
                Expr::Var(format!("{w}_{s}"))
            }
            None => Expr::Var(w),
        }
    }

    /// `\binom{n}{k}` of two natural numbers, exactly (budget.rs refuses a huge one); any
    /// other arguments are unread.
    fn binom(&mut self) -> R<Expr> {
        let (n, k) = (self.arg()?.exact(self.b)?, self.arg()?.exact(self.b)?);
        Some(Expr::Num {
            value: Box::new(binomial(&n, &k, self.b)?),
            decimals: None,
        })
    }

    /// A number literal as an expression; the written decimals are kept only without an
    /// exponent.
    fn num(&mut self, digits: &str, decimals: Option<usize>, exp: i32) -> R<Expr> {
        Some(Expr::Num {
            value: Box::new(literal(digits, decimals, exp, self.b)?),
            decimals: if exp == 0 { decimals } else { None },
        })
    }
}

/// Euler's identity: e^{iπ} (or e^{πi}) is −1. `e` and `i` are otherwise variables, so it is
/// read here, where the power is built, and nowhere else.
fn euler(p: Expr) -> Expr {
    let Expr::Pow(b, x) = &p else {
        return p;
    };
    let is = |e: &Expr, name: &str| matches!(e, Expr::Var(v) if v == name);
    let i_pi = match &**x {
        Expr::Mul(a, c) => (is(a, "i") && **c == Expr::Pi) || (**a == Expr::Pi && is(c, "i")),
        _ => false,
    };
    if is(b, "e") && i_pi {
        Expr::Neg(Box::new(int(1)))
    } else {
        p
    }
}
