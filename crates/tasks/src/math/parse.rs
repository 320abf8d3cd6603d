//! Math answers, second stage: tokens -> an [`Answer`]: a list of items (bare comma lists,
//! "or"/"and", several boxed answers, ±), each an expression, a relation (`x = 3`,
//! `x \le 3`, `1 < x \le 2`), a bracketed tuple or interval, a set `\{...\}`, or plain words.
//! Units after a value are dropped only when they are units (words.rs), multipliers
//! (`3 million`) multiply, mixed numbers (`1\frac{1}{2}`) add, and any other trailing word is a
//! parse failure, so `5 \text{ squared}` is never 5. Expressions are parse_expr.rs.

use super::budget::{Budget, STEP};
use super::expr::Expr;
use super::lex::Tok;
use super::words::{is_word, noun, TEXT_UNITS, UNITS};

/// One answer as the grader reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    Expr(Expr),
    /// A chain `e0 op0 e1 op1 e2 ...` with ops among = < > <= >= !=.
    Rel(Vec<Expr>, Vec<&'static str>),
    /// `(a, b)`, `[a, b)`, ...: the brackets and the entries.
    Bracket(char, Vec<Item>, char),
    /// `\{a, b\}` (or `\emptyset`): unordered.
    Set(Vec<Item>),
    /// Plain words, lower-cased, spaces collapsed ("yes", "no solution").
    Text(String),
}

/// The items of an answer; `list` when the source wrote several (order does not matter).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub items: Vec<Item>,
}

pub(super) struct P<'b> {
    pub(super) t: Vec<Tok>,
    pub(super) i: usize,
    pub(super) depth: usize,
    pub(super) b: &'b Budget,
}

/// Brackets, groups and arguments nested deeper than this are refused (a budget refusal:
/// the verdict is unverifiable): the parser recurses once per level.
const MAX_NEST: usize = 48;

pub(super) type R<T> = Option<T>;

impl P<'_> {
    pub(super) fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i)
    }

    pub(super) fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.t.get(self.i + k)
    }

    pub(super) fn eat_op(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Op(c)) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    pub(super) fn eat_cmd(&mut self, name: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Cmd(n)) if n == name) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// One level deeper, and one step of work; the caller undoes the depth on return.
    pub(super) fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth >= MAX_NEST {
            return self.b.refuse();
        }
        self.b.spend(STEP)
    }

    /// Separators between the items of a top-level list.
    fn eat_sep(&mut self) -> bool {
        if self.eat_op(',') || self.eat_op(';') || self.eat_cmd("cup") {
            return true;
        }
        if is_word(self.peek(), &["or", "and"]) {
            self.i += 1;
            return true;
        }
        false
    }

    fn answer(&mut self) -> R<Answer> {
        let mut items = vec![self.item()?];
        while self.eat_sep() {
            items.push(self.item()?);
        }
        (self.i == self.t.len()).then_some(Answer { items })
    }

    fn item(&mut self) -> R<Item> {
        // Plain words only ("yes", "no solution"): text.
        let start = self.i;
        let mut words = vec![];
        while let Some(Tok::Word { w, .. }) = self.peek() {
            if w == "or" || w == "and" {
                break;
            }
            words.push(w.to_lowercase());
            self.i += 1;
        }
        let ends = self.peek().is_none()
            || matches!(self.peek(), Some(Tok::Op(',' | ';' | '.')))
            || is_word(self.peek(), &["or", "and"]);
        if ends && (words.len() > 1 || words.first().is_some_and(|w| w.len() > 1)) {
            // A lone "pi" or "infinity" is a value, not a word.
            if !(words.len() == 1 && ["pi", "infinity", "inf"].contains(&words[0].as_str())) {
                self.eat_op('.');
                return Some(Item::Text(words.join(" ")));
            }
        }
        self.i = start;
        // `x \in [1, 2]`: the set the variable ranges over.
        if matches!(self.peek(), Some(Tok::Word { w, .. }) if w.len() == 1)
            && matches!(self.peek_at(1), Some(Tok::Cmd(c)) if c == "in")
        {
            self.i += 2;
        }
        // `f(x) = x^2 + 1`, `g(2) = 7`: a function's value named, then the value.
        self.function_name();
        if self.eat_cmd("emptyset") {
            return Some(Item::Set(vec![]));
        }
        if let Some(set) = self.set()? {
            return Some(set);
        }
        if let Some(b) = self.bracket()? {
            return Some(b);
        }
        let first = self.expr()?;
        let mut exprs = vec![first];
        let mut ops = vec![];
        while let Some(op) = self.relop() {
            ops.push(op);
            exprs.push(self.expr()?);
        }
        self.units();
        Some(if ops.is_empty() {
            Item::Expr(exprs.pop()?)
        } else {
            Item::Rel(exprs, ops)
        })
    }

    /// `\{a, b\}` (any number of entries), or `{a, b}` with two or more; None (no tokens
    /// taken) when no set starts here.
    fn set(&mut self) -> R<Option<Item>> {
        let latex = self.peek() == Some(&Tok::SetOpen);
        if !latex && self.peek() != Some(&Tok::Op('{')) {
            return Some(None);
        }
        let close = if latex { Tok::SetClose } else { Tok::Op('}') };
        let start = self.i;
        self.i += 1;
        self.enter()?;
        let mut items = vec![];
        let ok = (|| {
            if self.peek() != Some(&close) {
                items.push(self.item()?);
                while self.eat_op(',') || self.eat_op(';') {
                    items.push(self.item()?);
                }
            }
            (self.peek() == Some(&close)).then_some(())
        })();
        self.depth -= 1;
        if ok.is_some() && (latex || items.len() >= 2) {
            self.i += 1;
            return Some(Some(Item::Set(items)));
        }
        self.i = start;
        if latex {
            return None;
        }
        Some(None)
    }

    /// A bracketed list of two or more entries, `(a, b)` / `[a, b)` / ...; None (no tokens
    /// taken) when what follows is a parenthesised expression instead.
    fn bracket(&mut self) -> R<Option<Item>> {
        let open = match self.peek() {
            Some(Tok::Op(c @ ('(' | '['))) => *c,
            _ => return Some(None),
        };
        let start = self.i;
        self.i += 1;
        self.enter()?;
        let mut items = vec![];
        let ok = (|| {
            items.push(self.item()?);
            while self.eat_op(',') {
                items.push(self.item()?);
            }
            match self.peek() {
                Some(Tok::Op(c @ (')' | ']'))) => Some(*c),
                _ => None,
            }
        })();
        self.depth -= 1;
        match ok {
            Some(close) if items.len() >= 2 => {
                self.i += 1;
                // Only a bracket that ends the item is a tuple: `(1, 2)x` is not an answer.
                let end = self.peek().is_none()
                    || matches!(self.peek(), Some(Tok::Op(',' | ';')))
                    || matches!(self.peek(), Some(Tok::Cmd(c)) if c == "cup")
                    || is_word(self.peek(), &["or", "and"]);
                if !end {
                    return None;
                }
                Some(Some(Item::Bracket(open, items, close)))
            }
            _ => {
                self.i = start;
                Some(None)
            }
        }
    }

    fn relop(&mut self) -> Option<&'static str> {
        let op = match self.peek()? {
            Tok::Op('=') => "=",
            Tok::Op('<') if self.peek_at(1) == Some(&Tok::Op('=')) => {
                self.i += 1;
                "<="
            }
            Tok::Op('>') if self.peek_at(1) == Some(&Tok::Op('=')) => {
                self.i += 1;
                ">="
            }
            Tok::Op('<') => "<",
            Tok::Op('>') => ">",
            Tok::Op('!') if self.peek_at(1) == Some(&Tok::Op('=')) => {
                self.i += 1;
                "!="
            }
            Tok::Cmd(c) if c == "le" => "<=",
            Tok::Cmd(c) if c == "ge" => ">=",
            Tok::Cmd(c) if c == "ne" => "!=",
            _ => return None,
        };
        self.i += 1;
        Some(op)
    }

    /// Skips `f(...) =` at the start of an item: one letter, a parenthesised argument list
    /// without relations, and `=`. What follows is the answer (as `x = 3` is 3).
    fn function_name(&mut self) {
        if !matches!(self.peek(), Some(Tok::Word { w, .. }) if w.chars().count() == 1)
            || self.peek_at(1) != Some(&Tok::Op('('))
        {
            return;
        }
        let mut depth = 0usize;
        let mut k = 1;
        while let Some(t) = self.peek_at(k) {
            if self.b.spend(1).is_none() {
                return;
            }
            match t {
                Tok::Op('(') => depth += 1,
                Tok::Op(')') => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                Tok::Op('=' | '<' | '>') => return,
                _ => {}
            }
            k += 1;
        }
        if self.peek_at(k) == Some(&Tok::Op(')')) && self.peek_at(k + 1) == Some(&Tok::Op('=')) {
            self.i += k + 2;
        }
    }

    /// Drops units after a value: `cm`, `\text{m}^2`, `km/h`, `square units`, `meters per
    /// second`.
    fn units(&mut self) {
        let unit_at = |p: &P, k: usize| match p.peek_at(k) {
            Some(Tok::Word { w, text }) => {
                UNITS.contains(&w.as_str())
                    || (*text && TEXT_UNITS.contains(&w.as_str()))
                    || noun(w, *text)
            }
            _ => false,
        };
        let save = self.i;
        let mut any = false;
        while unit_at(self, 0) {
            any = true;
            self.i += 1;
            if self.peek() == Some(&Tok::Op('^')) {
                if matches!(self.peek_at(1), Some(Tok::Num { .. })) {
                    self.i += 2;
                } else if self.peek_at(1) == Some(&Tok::Op('{'))
                    && matches!(self.peek_at(2), Some(Tok::Num { .. }))
                    && self.peek_at(3) == Some(&Tok::Op('}'))
                {
                    self.i += 4;
                }
            }
            // Rates in words: "meters per second", "miles per hour".
            if matches!(self.peek(), Some(Tok::Word { w, .. }) if w == "per") && unit_at(self, 1) {
                self.i += 1;
                continue;
            }
            // km/h, m/s: after a unit, a one-letter unit needs no \text{}.
            let letter_unit = matches!(self.peek_at(1), Some(Tok::Word { w, .. }) if TEXT_UNITS.contains(&w.as_str()));
            if self.peek() == Some(&Tok::Op('/')) && (unit_at(self, 1) || letter_unit) {
                self.i += 1;
                if letter_unit {
                    self.i += 1;
                }
            }
        }
        if any {
            self.eat_op('.');
        } else {
            self.i = save;
        }
    }
}

/// Parses the tokens of one answer; None when they are not an answer this grammar reads.
pub(crate) fn parse(t: Vec<Tok>, b: &Budget) -> Option<Answer> {
    if t.is_empty() {
        return None;
    }
    // A trailing full stop ends a sentence, not the answer.
    let mut t = t;
    if t.last() == Some(&Tok::Op('.')) {
        t.pop();
    }
    let mut p = P {
        t,
        i: 0,
        depth: 0,
        b,
    };
    p.answer()
}
