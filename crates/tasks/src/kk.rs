//! Knights & Knaves (Logic-RL): a seeded puzzle generator for 2..8 people whose statements use
//! the Logic-RL statement types, a brute-force solver that keeps only puzzles with exactly one
//! solution, the Logic-RL text format, and the Logic-RL scorer exactly as Logic-RL's kk.py
//! (docs/methods.md, Base task rewards; a completion without an assistant marker scores as kk.py scores it, −1 or −3).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

const NAMES: [&str; 24] = [
    "Zoey", "Oliver", "Ethan", "Sophia", "Jack", "Emily", "Liam", "Mia", "Noah", "Ava", "Lucas",
    "Isabella", "Mason", "Harper", "Logan", "Evelyn", "James", "Abigail", "Benjamin", "Ella",
    "Henry", "Scarlett", "Samuel", "Grace",
];

/// A claim an inhabitant makes (Logic-RL's statement types).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stmt {
    /// "X is a knight" (telling-truth).
    Knight(usize),
    /// "X is a knave" (lying).
    Knave(usize),
    Not(Box<Stmt>),
    And(Box<Stmt>, Box<Stmt>),
    Or(Box<Stmt>, Box<Stmt>),
    Implies(Box<Stmt>, Box<Stmt>),
    Iff(Box<Stmt>, Box<Stmt>),
}

impl Stmt {
    /// Truth of the claim when `knight[i]` says whether person i is a knight.
    pub fn eval(&self, knight: &[bool]) -> bool {
        match self {
            Stmt::Knight(i) => knight[*i],
            Stmt::Knave(i) => !knight[*i],
            Stmt::Not(s) => !s.eval(knight),
            Stmt::And(a, b) => a.eval(knight) && b.eval(knight),
            Stmt::Or(a, b) => a.eval(knight) || b.eval(knight),
            Stmt::Implies(a, b) => !a.eval(knight) || b.eval(knight),
            Stmt::Iff(a, b) => a.eval(knight) == b.eval(knight),
        }
    }

    pub fn render(&self, names: &[String]) -> String {
        match self {
            Stmt::Knight(i) => format!("{} is a knight", names[*i]),
            Stmt::Knave(i) => format!("{} is a knave", names[*i]),
            Stmt::Not(s) => match s.as_ref() {
                Stmt::Knight(i) => format!("{} is not a knight", names[*i]),
                Stmt::Knave(i) => format!("{} is not a knave", names[*i]),
                other => format!("it is not the case that {}", other.render(names)),
            },
            Stmt::And(a, b) => format!("{} and {}", a.render(names), b.render(names)),
            Stmt::Or(a, b) => format!("{} or {}", a.render(names), b.render(names)),
            Stmt::Implies(a, b) => format!("if {} then {}", a.render(names), b.render(names)),
            Stmt::Iff(a, b) => format!("{} if and only if {}", a.render(names), b.render(names)),
        }
    }
}

/// One puzzle: names, what each says, and the unique solution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Puzzle {
    pub names: Vec<String>,
    pub statements: Vec<Stmt>,
    pub solution: Vec<bool>,
}

/// All assignments (knight = true) under which every knight tells the truth and every knave lies.
pub fn solve(statements: &[Stmt]) -> Vec<Vec<bool>> {
    let n = statements.len();
    (0..1u32 << n)
        .map(|mask| (0..n).map(|i| mask >> i & 1 == 1).collect::<Vec<bool>>())
        .filter(|k| {
            statements
                .iter()
                .enumerate()
                .all(|(i, s)| s.eval(k) == k[i])
        })
        .collect()
}

fn atom(rng: &mut ChaCha8Rng, n: usize) -> Stmt {
    let i = rng.random_range(0..n);
    if rng.random_bool(0.5) {
        Stmt::Knight(i)
    } else {
        Stmt::Knave(i)
    }
}

fn statement(rng: &mut ChaCha8Rng, n: usize) -> Stmt {
    let (a, b) = (Box::new(atom(rng, n)), Box::new(atom(rng, n)));
    match rng.random_range(0..7) {
        0 | 1 => *a,
        2 => Stmt::Not(a),
        3 => Stmt::And(a, b),
        4 => Stmt::Or(a, b),
        5 => Stmt::Implies(a, b),
        _ => Stmt::Iff(a, b),
    }
}

/// A puzzle with `n` people (2..=8) and exactly one solution, from `seed`.
pub fn generate(n: usize, seed: u64) -> Puzzle {
    assert!(
        (2..=8).contains(&n),
        "knights & knaves puzzles have 2..=8 people, got {n}"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pool: Vec<&str> = NAMES.to_vec();
    pool.shuffle(&mut rng);
    let names: Vec<String> = pool[..n].iter().map(|s| s.to_string()).collect();
    loop {
        let statements: Vec<Stmt> = (0..n).map(|_| statement(&mut rng, n)).collect();
        let mut sols = solve(&statements);
        if sols.len() == 1 {
            return Puzzle {
                names,
                statements,
                solution: sols.remove(0),
            };
        }
    }
}

impl Puzzle {
    /// The quiz text in Logic-RL's format.
    pub fn quiz(&self) -> String {
        let n = self.names.len();
        let list = match n {
            2 => format!("{} and {}", self.names[0], self.names[1]),
            _ => format!(
                "{}, and {}",
                self.names[..n - 1].join(", "),
                self.names[n - 1]
            ),
        };
        let verbs = ["said", "stated", "remarked", "told you that", "claimed"];
        let mut s = format!(
            "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves always lie. You meet {n} inhabitants: {list}."
        );
        for (i, st) in self.statements.iter().enumerate() {
            let claim = st.render(&self.names);
            let verb = verbs[i % verbs.len()];
            if verb == "told you that" {
                s.push_str(&format!(" {} {verb} {claim}.", self.names[i]));
            } else {
                s.push_str(&format!(" {} {verb}, \"{claim}.\"", self.names[i]));
            }
        }
        s.push_str(" So who is a knight and who is a knave?");
        s
    }

    /// The ground truth as Logic-RL writes it: "(1) Zoey is a knight\n(2) ...".
    pub fn solution_text(&self) -> String {
        self.names
            .iter()
            .zip(&self.solution)
            .enumerate()
            .map(|(i, (n, k))| {
                format!(
                    "({}) {n} is a {}",
                    i + 1,
                    if *k { "knight" } else { "knave" }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The Logic-RL scorer's verdict (docs/methods.md, Base task rewards).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KkScore {
    pub format_score: f64,
    pub answer_score: f64,
    /// format + answer: 3, −0.5, −1 or −3.
    pub total: f64,
    /// answer_score > 0.
    pub correct: bool,
    pub reason: &'static str,
}

fn re(cell: &'static OnceLock<Regex>, pat: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pat).expect("valid built-in regex"))
}

/// Parses a ground-truth solution text into {name: role}.
pub fn parse_solution(text: &str) -> BTreeMap<String, String> {
    static LINE: OnceLock<Regex> = OnceLock::new();
    let line = re(&LINE, r"(?i)\b([A-Za-z]+)\b.*?\b(knight|knave)\b");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            line.captures(l)
                .map(|c| (c[1].to_string(), c[2].to_lowercase()))
        })
        .collect()
}

fn format_ok(processed: &str) -> bool {
    let tags = ["<think>", "</think>", "<answer>", "</answer>"];
    if tags.iter().any(|t| processed.matches(t).count() != 1) {
        return false;
    }
    let pos: Vec<usize> = tags
        .iter()
        .map(|t| processed.find(t).unwrap_or(0))
        .collect();
    pos.windows(2).all(|w| w[0] <= w[1])
}

/// Scores `solution_str` (decoded prompt ⊕ response, special tokens kept) against the
/// ground-truth solution text, exactly as Logic-RL's kk.py.
pub fn score(solution_str: &str, ground_truth: &str) -> KkScore {
    let processed = if let Some((_, rest)) = solution_str.split_once("Assistant:") {
        Some(rest)
    } else {
        solution_str
            .split_once("<|im_start|>assistant")
            .map(|(_, rest)| rest)
    };
    let (processed, has_assistant) = match processed {
        Some(p) => (p, true),
        None => (solution_str, false),
    };
    static ANSWER: OnceLock<Regex> = OnceLock::new();
    let answer = if has_assistant {
        re(&ANSWER, r"(?s)<answer>(.*?)</answer>")
            .captures_iter(processed)
            .last()
            .map(|c| c[1].trim().to_string())
    } else {
        None
    };
    let truth = parse_solution(ground_truth);
    let fmt_ok = format_ok(processed);
    let done = |format_score: f64, answer_score: f64, reason| KkScore {
        format_score,
        answer_score,
        total: format_score + answer_score,
        correct: answer_score > 0.0,
        reason,
    };
    // Without an assistant marker Logic-RL's kk.py checks the format on the whole text and has
    // no answer: −3 for bad tags, but −1 for well-formed ones (docs/methods.md, Base task rewards says "the format
    // check will fail", which holds only when the prompt carries a <think> of its own).
    if !fmt_ok {
        return done(-1.0, -2.0, "format: tags missing, repeated or out of order");
    }
    let Some(answer) = answer.filter(|a| !a.is_empty()) else {
        let why = if has_assistant {
            "answer: empty"
        } else {
            "answer: no assistant marker, so no answer"
        };
        return done(1.0, -2.0, why);
    };
    let lower = answer.to_lowercase();
    if lower.matches("knight").count() + lower.matches("knave").count() != truth.len() {
        return done(1.0, -2.0, "answer: wrong number of knight/knave claims");
    }
    let mut parsed = BTreeMap::new();
    for name in truth.keys() {
        let pat = format!(
            r"(?i)\b{}\b\s+is\s+a\s+\b(knight|knave)\b",
            regex::escape(name)
        );
        match Regex::new(&pat)
            .ok()
            .and_then(|r| r.captures(&answer).map(|c| c[1].to_lowercase()))
        {
            Some(role) => {
                parsed.insert(name.clone(), role);
            }
            None => return done(1.0, -2.0, "answer: a person's role could not be parsed"),
        }
    }
    if parsed == truth {
        done(1.0, 2.0, "correct")
    } else {
        done(1.0, -1.5, "answer: wrong role")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(answer: &str) -> String {
        format!("<|im_start|>user\nquiz<|im_end|>\n<|im_start|>assistant\n<think> reasoning </think><answer> {answer} </answer><|im_end|>")
    }

    #[test]
    fn every_generated_puzzle_has_one_solution_and_its_truth_scores_3() {
        for n in 2..=8 {
            for seed in 0..25 {
                let p = generate(n, seed * 10 + n as u64);
                assert_eq!(
                    solve(&p.statements),
                    vec![p.solution.clone()],
                    "n={n} seed={seed}"
                );
                let s = score(&response(&p.solution_text()), &p.solution_text());
                assert_eq!((s.total, s.correct), (3.0, true), "{s:?}\n{}", p.quiz());
                assert!(p.quiz().contains(&format!("You meet {n} inhabitants")));
            }
        }
    }

    #[test]
    fn generation_is_seeded() {
        assert_eq!(generate(5, 9), generate(5, 9));
        assert_ne!(generate(5, 9), generate(5, 10));
    }

    #[test]
    fn scorer_table_case_by_case() {
        let truth = "(1) Zoey is a knight\n(2) Oliver is a knave";
        let check =
            |resp: &str, total: f64| assert_eq!(score(resp, truth).total, total, "{resp:?}");
        // Format OK, exact match: 3.
        check(
            &response("(1) Zoey is a knight\n(2) Oliver is a knave"),
            3.0,
        );
        // Format OK, mismatch: −0.5.
        check(
            &response("(1) Zoey is a knave\n(2) Oliver is a knave"),
            -0.5,
        );
        // Format OK, unparseable (count mismatch; missing name; empty): −1.
        check(&response("Zoey is a knight"), -1.0);
        check(
            &response("(1) Zoey is a knight\n(2) Olive is a knave"),
            -1.0,
        );
        check(&response(""), -1.0);
        // "knights" counts as a knight claim (substring count), so this is unparseable: −1.
        check(
            &response("Zoey is a knight, Oliver is a knave, both knights?"),
            -1.0,
        );
        // Format wrong: no answer tag, repeated tag, wrong order: −3.
        check(
            "<|im_start|>assistant\n<think> x </think> Zoey is a knight",
            -3.0,
        );
        check(
            &response("(1) Zoey is a knight\n(2) Oliver is a knave")
                .replace("</think>", "</think></think>"),
            -3.0,
        );
        check("<|im_start|>assistant\n<answer>(1) Zoey is a knight (2) Oliver is a knave</answer><think> x </think>", -3.0);
        // No assistant marker (issue 21 item 4): as kk.py, the format is checked on the whole
        // text and there is no answer: well-formed tags give −1, malformed ones −3.
        check(
            "<think> x </think><answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>",
            -1.0,
        );
        check(
            "<think> x </think><think><answer>(1) Zoey is a knight</answer>",
            -3.0,
        );
        // "Assistant:" marker (base template) works too; the last answer block counts.
        check("User: q\nAssistant: <think> x </think><answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>", 3.0);
        // Case-insensitive roles and names in the answer.
        check(
            &response("(1) ZOEY IS A KNIGHT\n(2) oliver is a Knave"),
            3.0,
        );
        assert!(
            score(
                &response("(1) Zoey is a knight\n(2) Oliver is a knave"),
                truth
            )
            .correct
        );
        assert!(
            !score(
                &response("(1) Zoey is a knave\n(2) Oliver is a knave"),
                truth
            )
            .correct
        );
    }
}
