//! The published layouts of the math benchmarks efficient-reasoning papers report (AIME 2024 /
//! 2025, AMC23, MATH-500, Minerva, OlympiadBench, GSM8K): each one's question column, answer
//! column and answer format as its Hugging Face dataset publishes them, read from JSONL or
//! Parquet into (question, reference answer, level) rows. Data flow: `data.layout` in a run
//! config -> here (through crates/train/src/task/rows.rs) -> terse-train's `Task`
//! (crates/train/src/task.rs) renders the prompt -> the math verifier grades.
//!
//! The answer columns are read as they are published (an integer for AIME 2024, a float for
//! AMC23, a list for OlympiadBench, a `#### N` tail for GSM8K) and turned into the text the math
//! verifier compares ([`crate::math::check`]). A missing or mistyped column is one line naming
//! the file, the line (JSONL) or row (Parquet) and the column.

use crate::dataset::{self, Columns, PromptText};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// A benchmark's published layout (`data.layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `Maxwell-Jia/AIME_2024`: `Problem`, `Answer` (an integer; `ID`, `Solution` unread).
    Aime2024,
    /// `opencompass/AIME2025` (configs AIME2025-I and AIME2025-II, one JSONL each):
    /// `question`, `answer` (an integer as a string).
    Aime2025,
    /// `math-ai/amc23`: `question`, `answer` (a float such as `27.0`; `id`, `url` unread).
    Amc23,
    /// `HuggingFaceH4/MATH-500`: `problem`, `answer` (LaTeX), `level` (1-5; `solution`,
    /// `subject`, `unique_id` unread).
    Math500,
    /// `svc-huggingface/minerva-math` (as SkyThought's evaluation reads it): `problem` and
    /// `solution`, whose last `\boxed{}` is the answer; an `answer` column, as copies such as
    /// `knoveleng/Minerva-Math` add, is used when present.
    Minerva,
    /// `Hothan/OlympiadBench`, config `OE_TO_maths_en_COMP`: `question`, `final_answer` (a
    /// list of LaTeX strings such as `["$3$"]`; several when `is_multiple_answer`), joined with
    /// ", " and their `$` delimiters dropped.
    #[serde(rename = "olympiadbench")]
    OlympiadBench,
    /// `openai/gsm8k`, config `main`: `question`, `answer` (the worked solution ending
    /// `#### N`; N is the reference, thousands separators dropped).
    Gsm8k,
}

/// How a layout's answer column is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerFormat {
    /// A string or a number.
    Plain,
    /// A worked solution ending `#### N`.
    Hashes,
    /// A list of LaTeX answers.
    List,
    /// An `answer` column, or else the last `\boxed{}` of a `solution` column.
    AnswerOrBoxedSolution,
}

/// The columns a layout reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schema {
    question: &'static str,
    answer: &'static str,
    format: AnswerFormat,
    level: Option<&'static str>,
}

impl Layout {
    fn schema(self) -> Schema {
        let s = |question, answer, format| Schema {
            question,
            answer,
            format,
            level: None,
        };
        match self {
            Layout::Aime2024 => s("Problem", "Answer", AnswerFormat::Plain),
            Layout::Aime2025 | Layout::Amc23 => s("question", "answer", AnswerFormat::Plain),
            Layout::Math500 => Schema {
                level: Some("level"),
                ..s("problem", "answer", AnswerFormat::Plain)
            },
            Layout::Minerva => s("problem", "answer", AnswerFormat::AnswerOrBoxedSolution),
            Layout::OlympiadBench => s("question", "final_answer", AnswerFormat::List),
            Layout::Gsm8k => s("question", "answer", AnswerFormat::Hashes),
        }
    }
}

/// One benchmark problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// 1-based line (JSONL) or 0-based row (Parquet), as `dataset::Row::index`.
    pub index: usize,
    pub question: String,
    /// The reference answer as the math verifier reads it.
    pub answer: String,
    /// The layout's difficulty column (MATH-500's `level`); 0 where it has none.
    pub level: usize,
}

/// Reads `path` (`.jsonl` or `.parquet`) in `layout`. Every row must be complete: a benchmark
/// with a silently skipped problem would report a different accuracy.
pub fn load(path: &Path, layout: Layout) -> Result<Vec<BenchRow>, String> {
    let schema = layout.schema();
    let mut extra = vec![schema.answer.to_string()];
    if schema.format == AnswerFormat::AnswerOrBoxedSolution {
        extra.push("solution".into());
    }
    extra.extend(schema.level.map(String::from));
    // The answer columns travel as `extra` (raw JSON): their published types (a list, an
    // integer, a float) are not all what `dataset::Columns::answer` accepts. The question
    // column stands in for the answer there so the loader's own checks still run.
    let cols = Columns {
        prompt: schema.question.into(),
        answer: schema.question.into(),
        extra,
    };
    let (rows, _) = dataset::load(path, &cols, false)?;
    let unit = if path.extension().and_then(|e| e.to_str()) == Some("parquet") {
        "row"
    } else {
        "line"
    };
    let out: Vec<BenchRow> = rows
        .into_iter()
        .map(|r| {
            let at = |col: &str, why: String| {
                format!(
                    "{}: {unit} {}: column `{col}` {why}",
                    path.display(),
                    r.index
                )
            };
            let column = |name: &str| {
                r.extra
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v)
                    .filter(|v| !v.is_null())
            };
            let question = match &r.prompt {
                PromptText::Text(s) => s.clone(),
                PromptText::Chat(_) => {
                    return Err(at(
                        schema.question,
                        "must be a string, got a message list".into(),
                    ))
                }
            };
            let answer = read_answer(schema, &column).map_err(|(col, why)| at(col, why))?;
            let level = match schema.level {
                Some(col) => match column(col) {
                    Some(v) => level_of(v)
                        .ok_or_else(|| at(col, format!("must be a level number, got {v}")))?,
                    None => return Err(at(col, "is missing".into())),
                },
                None => 0,
            };
            Ok(BenchRow {
                index: r.index,
                question,
                answer,
                level,
            })
        })
        .collect::<Result<_, String>>()?;
    if out.is_empty() {
        return Err(format!("{}: no rows", path.display()));
    }
    Ok(out)
}

/// The reference answer of one row, or (column, why not).
fn read_answer<'a>(
    schema: Schema,
    column: &dyn Fn(&str) -> Option<&'a Value>,
) -> Result<String, (&'static str, String)> {
    let col = schema.answer;
    let missing = || (col, "is missing".to_string());
    let answer = match schema.format {
        AnswerFormat::Plain => {
            let v = column(col).ok_or_else(missing)?;
            plain(v).ok_or_else(|| (col, format!("must be a string or number, got {v}")))?
        }
        AnswerFormat::Hashes => match column(col).ok_or_else(missing)? {
            Value::String(s) => {
                hashes(s).ok_or_else(|| (col, "has no `#### N` final answer".to_string()))?
            }
            v => return Err((col, format!("must be a string ending `#### N`, got {v}"))),
        },
        AnswerFormat::List => {
            let v = column(col).ok_or_else(missing)?;
            list(v).ok_or_else(|| (col, format!("must be a list of answers, got {v}")))?
        }
        AnswerFormat::AnswerOrBoxedSolution => match (column(col), column("solution")) {
            (Some(v), _) => {
                plain(v).ok_or_else(|| (col, format!("must be a string or number, got {v}")))?
            }
            (None, Some(Value::String(s))) => crate::math::extract_boxed(s).ok_or((
                "solution",
                "has no \\boxed{} answer (and there is no `answer` column)".to_string(),
            ))?,
            (None, Some(v)) => return Err(("solution", format!("must be a string, got {v}"))),
            (None, None) => return Err((col, "is missing (and so is `solution`)".to_string())),
        },
    };
    if answer.trim().is_empty() {
        return Err((col, "is empty".into()));
    }
    Ok(answer)
}

/// A string as is; a number as the verifier reads it (`27.0` as `27`: AMC23 stores integers
/// as floats).
fn plain(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_string()),
        Value::Number(n) => Some(match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        }),
        _ => None,
    }
}

/// GSM8K's final answer: the text after the last `####`, thousands separators dropped
/// (`1,200` is 1200 there, never a pair).
fn hashes(solution: &str) -> Option<String> {
    let a = crate::math::extract_gsm8k(solution)?;
    let digits_and_commas = a
        .trim_start_matches('-')
        .chars()
        .all(|c| c.is_ascii_digit() || c == ',' || c == '.');
    Some(if digits_and_commas {
        a.replace(',', "")
    } else {
        a
    })
}

/// OlympiadBench's `final_answer`: each entry's `$...$` dropped, joined with ", " (the
/// verifier reads "3, -3" as the answer set, so `\pm 3` matches it).
fn list(v: &Value) -> Option<String> {
    let items = v.as_array()?;
    let parts: Option<Vec<String>> = items
        .iter()
        .map(|x| {
            let s = plain(x)?;
            let t = s.trim();
            Some(
                t.strip_prefix('$')
                    .and_then(|t| t.strip_suffix('$'))
                    .unwrap_or(t)
                    .trim()
                    .to_string(),
            )
        })
        .collect();
    let parts = parts?;
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// A level written as a number or as text ("3", MATH's "Level 3").
fn level_of(v: &Value) -> Option<usize> {
    match v {
        Value::Number(n) => n.as_u64().map(|l| l as usize),
        Value::String(s) => s.trim().trim_start_matches("Level").trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/datasets/bench")
            .join(name)
    }

    /// Loads a fixture and checks (question start, answer, level) per row, and that the math
    /// verifier grades a differently written right answer as equal to each reference.
    fn check(file: &str, layout: Layout, want: &[(&str, &str, usize, &str)]) {
        let rows = load(&fixture(file), layout).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rows.len(), want.len(), "{file}");
        for (r, (q, a, level, model_says)) in rows.iter().zip(want) {
            assert!(r.question.starts_with(q), "{file}: {:?}", r.question);
            assert_eq!((r.answer.as_str(), r.level), (*a, *level), "{file}");
            assert!(
                math::check(model_says, &r.answer).is_equal(),
                "{file}: {model_says} vs {}",
                r.answer
            );
            assert!(!math::check("12345", &r.answer).is_equal(), "{file}");
        }
    }

    #[test]
    fn aime_2024_reads_problem_and_integer_answer() {
        check(
            "aime2024.jsonl",
            Layout::Aime2024,
            &[
                ("A jar holds", "41", 0, "041"),
                ("Let $n$ be", "312", 0, "312.0"),
            ],
        );
    }

    #[test]
    fn aime_2025_reads_question_and_string_answer() {
        check(
            "aime2025.jsonl",
            Layout::Aime2025,
            &[
                ("Find the number of ordered", "60", 0, "60"),
                ("A regular hexagon", "504", 0, "\\boxed{504}"),
            ],
        );
    }

    #[test]
    fn amc23_reads_float_answers_as_integers() {
        check(
            "amc23.jsonl",
            Layout::Amc23,
            &[
                ("Two trains", "27", 0, "27"),
                ("What is the value", "2.5", 0, "\\frac{5}{2}"),
            ],
        );
    }

    #[test]
    fn math500_reads_latex_answers_and_levels() {
        check(
            "math500.jsonl",
            Layout::Math500,
            &[
                ("Compute $\\dbinom", "21", 2, "21"),
                ("Solve for $x$", "\\frac{3}{4}", 4, "0.75"),
                ("Find all real", "[-1, 2)", 5, "-1 \\le x < 2"),
            ],
        );
    }

    #[test]
    fn minerva_takes_the_answer_column_or_the_solutions_box() {
        check(
            "minerva.jsonl",
            Layout::Minerva,
            &[
                ("A ball is dropped", "4.9", 0, "4.9"),
                ("A star has", "6000", 0, "6000"),
            ],
        );
    }

    #[test]
    fn olympiadbench_joins_its_answer_list() {
        check(
            "olympiadbench.jsonl",
            Layout::OlympiadBench,
            &[
                ("Determine all real", "3, -3", 0, "\\pm 3"),
                ("Compute the smallest", "17", 0, "17"),
            ],
        );
    }

    #[test]
    fn gsm8k_reads_the_hashes_answer() {
        check(
            "gsm8k.jsonl",
            Layout::Gsm8k,
            &[
                ("Mara buys", "1200", 0, "1,200"),
                ("A baker", "-3", 0, "-3"),
                ("Tom reads", "12.5", 0, "25/2"),
            ],
        );
    }

    /// Parquet goes through the same loader: the flat fixture is in the AIME 2025 / AMC23
    /// layout (`question`, `answer`), and its rows are numbered from 0; in MATH-500's layout
    /// its missing `problem` column is an error naming row 0.
    #[test]
    fn parquet_files_load_in_a_layout() {
        let p = fixture("../flat.parquet");
        let rows = load(&p, Layout::Aime2025).expect("parquet");
        assert_eq!(rows.len(), 5);
        assert_eq!((rows[3].index, rows[3].answer.as_str()), (3, "6"));
        assert_eq!(rows[3].question, "What is 3 + 3?");
        let e = load(&p, Layout::Math500).expect_err("no problem column");
        assert!(
            e.contains("flat.parquet: row 0: column `problem` is missing"),
            "{e}"
        );
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("terse-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    /// A wrong or missing column is one line naming the file, the line and the column.
    #[test]
    fn a_wrong_or_missing_column_names_file_line_and_column() {
        let cases = [
            (Layout::Math500, "{\"problem\": \"p\", \"level\": 1}\n", "line 1: column `answer` is missing"),
            (Layout::Math500, "{\"problem\": \"p\", \"answer\": \"1\"}\n", "line 1: column `level` is missing"),
            (Layout::Aime2024, "{\"problem\": \"p\", \"answer\": 3}\n", "line 1: column `Problem` is missing"),
            (
                Layout::OlympiadBench,
                "{\"question\": \"q\", \"final_answer\": [\"$1$\"]}\n{\"question\": \"q\", \"final_answer\": 2}\n",
                "line 2: column `final_answer` must be a list",
            ),
            (Layout::Gsm8k, "{\"question\": \"q\", \"answer\": \"so 4\"}\n", "line 1: column `answer` has no `#### N`"),
            (Layout::Minerva, "{\"problem\": \"q\", \"solution\": \"it is 4\"}\n", "line 1: column `solution` has no \\boxed{}"),
            (Layout::Amc23, "{\"question\": \"q\", \"answer\": [1]}\n", "line 1: column `answer` must be a string or number"),
        ];
        for (i, (layout, text, want)) in cases.iter().enumerate() {
            let p = write(&format!("case{i}.jsonl"), text);
            let e = load(&p, *layout).expect_err("an error");
            assert!(
                e.contains(&format!("case{i}.jsonl")) && e.contains(want),
                "{e}"
            );
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    /// The layout keys are the ones the configs write.
    #[test]
    fn layout_keys() {
        for (key, l) in [
            ("aime2024", Layout::Aime2024),
            ("aime2025", Layout::Aime2025),
            ("amc23", Layout::Amc23),
            ("math500", Layout::Math500),
            ("minerva", Layout::Minerva),
            ("olympiadbench", Layout::OlympiadBench),
            ("gsm8k", Layout::Gsm8k),
        ] {
            let v: Layout = serde_json::from_value(Value::from(key)).expect(key);
            assert_eq!(v, l);
        }
    }
}
