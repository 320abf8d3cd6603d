//! Datasets users bring: JSONL and Parquet (the HF datasets layout), with the prompt and answer
//! columns chosen by name (dotted paths reach into nested objects, e.g.
//! `reward_model.ground_truth`). A malformed row is an error naming the file and the line (JSONL)
//! or row (Parquet); with `skip_bad_rows` it is skipped and reported instead.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// Which columns hold what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Columns {
    /// A string, or a list of chat messages ({role, content}).
    pub prompt: String,
    /// A string or a number.
    pub answer: String,
    /// Optional columns kept as-is (difficulty level, id, ...).
    #[serde(default)]
    pub extra: Vec<String>,
}

/// The prompt of a row: plain text or chat messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PromptText {
    Text(String),
    Chat(Vec<crate::template::Message>),
}

/// One usable row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// 1-based line (JSONL) or 0-based row (Parquet) in the file.
    pub index: usize,
    pub prompt: PromptText,
    pub answer: String,
    pub extra: Vec<(String, Value)>,
}

/// What loading skipped, when `skip_bad_rows` is on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LoadReport {
    pub rows: usize,
    /// (line or row, reason)
    pub skipped: Vec<(usize, String)>,
}

fn get<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |cur, key| cur.get(key))
}

/// Parses one record into a row, or says why not.
fn to_row(v: &Value, cols: &Columns, index: usize) -> Result<Row, String> {
    let prompt = match get(v, &cols.prompt) {
        Some(Value::String(s)) => PromptText::Text(s.clone()),
        Some(m @ Value::Array(_)) => {
            PromptText::Chat(serde_json::from_value(m.clone()).map_err(|e| {
                format!(
                    "column `{}` is not a list of {{role, content}} messages: {e}",
                    cols.prompt
                )
            })?)
        }
        Some(other) => {
            return Err(format!(
                "column `{}` must be a string or messages, got {other}",
                cols.prompt
            ))
        }
        None => return Err(format!("column `{}` is missing", cols.prompt)),
    };
    let answer = match get(v, &cols.answer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(format!(
                "column `{}` must be a string or number, got {other}",
                cols.answer
            ))
        }
        None => return Err(format!("column `{}` is missing", cols.answer)),
    };
    let extra = cols
        .extra
        .iter()
        .map(|k| (k.clone(), get(v, k).cloned().unwrap_or(Value::Null)))
        .collect();
    Ok(Row {
        index,
        prompt,
        answer,
        extra,
    })
}

/// A record read from a file: its line (JSONL) or row (Parquet), and the JSON or why not.
type Record = (usize, Result<Value, String>);

/// The rows of a Parquet reader up to and including its first error. parquet's row iterator
/// does not end after an error: a row group it cannot read is retried, and yields the same
/// error, forever (a corrupt page header made `load` collect errors until memory ran out),
/// so an error ends the file.
fn until_first_error<E: std::fmt::Display>(
    rows: impl Iterator<Item = Result<Value, E>>,
) -> Vec<Record> {
    let mut out = vec![];
    for (i, r) in rows.enumerate() {
        let failed = r.is_err();
        out.push((
            i,
            r.map_err(|e| format!("unreadable row (the rest of the file is not read): {e}")),
        ));
        if failed {
            break;
        }
    }
    out
}

/// The records of a Parquet file. parquet's decoders assert on some corrupt pages (found by
/// fuzzing: `size <= src.len()` in its bit reader, from one inserted byte) instead of erring,
/// so the read runs under `catch_unwind` and a panic is an error naming the file (the default
/// hook still prints the panic's line to stderr).
fn parquet_records(path: &Path) -> Result<Vec<Record>, String> {
    use parquet::file::reader::SerializedFileReader;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let read = || {
        let reader = SerializedFileReader::try_from(file)
            .map_err(|e| format!("{}: not a parquet file: {e}", path.display()))?;
        Ok(until_first_error(
            reader.into_iter().map(|r| r.map(|row| row.to_json_value())),
        ))
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|p| {
        let msg = crate::panic_message(&*p);
        Err(format!(
            "{}: corrupt parquet file (the reader panicked: {msg})",
            path.display()
        ))
    })
}

/// Loads a `.jsonl` or `.parquet` file.
pub fn load(
    path: &Path,
    cols: &Columns,
    skip_bad_rows: bool,
) -> Result<(Vec<Row>, LoadReport), String> {
    let records: Vec<(usize, Result<Value, String>)> =
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("json") => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                text.lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                    .map(|(i, l)| {
                        (
                            i + 1,
                            serde_json::from_str::<Value>(l)
                                .map_err(|e| format!("invalid JSON: {e}")),
                        )
                    })
                    .collect()
            }
            Some("parquet") => parquet_records(path)?,
            _ => {
                return Err(format!(
                    "{}: unknown dataset format (expected .jsonl or .parquet)",
                    path.display()
                ))
            }
        };
    let unit = if path.extension().and_then(|e| e.to_str()) == Some("parquet") {
        "row"
    } else {
        "line"
    };
    let mut rows = Vec::with_capacity(records.len());
    let mut report = LoadReport::default();
    for (i, rec) in records {
        match rec.and_then(|v| to_row(&v, cols, i)) {
            Ok(r) => rows.push(r),
            Err(e) if skip_bad_rows => report.skipped.push((i, e)),
            Err(e) => return Err(format!("{}: {unit} {i}: {e}", path.display())),
        }
    }
    report.rows = rows.len();
    Ok((rows, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row iterator that keeps failing ends at its first error (parquet's retries the
    /// row group it cannot read and repeats the error forever).
    #[test]
    fn a_reader_error_ends_the_parquet_rows() {
        let rows = [Ok(Value::from(1)), Err("bad page"), Ok(Value::from(2))]
            .into_iter()
            .chain(std::iter::repeat_n(Err("bad page"), 1000));
        let out = until_first_error(rows);
        assert_eq!(out.len(), 2);
        assert!(matches!(&out[1], (1, Err(e)) if e.contains("bad page")));
    }

    /// Fuzzing (terse-fuzz, target dataset): a Parquet file whose first column chunk lost its
    /// page data (bytes 42..161 of the flat fixture cut out) made `load` hang, collecting the
    /// reader's repeated error until memory ran out; it is an error naming row 0, and with
    /// `skip_bad_rows` one skipped entry.
    #[test]
    fn a_parquet_file_with_a_cut_page_is_an_error_not_a_hang() {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/datasets/flat.parquet"
        );
        let mut bytes = std::fs::read(fixture).expect("fixture");
        bytes.drain(42..161);
        let dir = std::env::temp_dir().join(format!("terse-cut-page-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("cut.parquet");
        std::fs::write(&path, &bytes).expect("write");
        let cols = Columns {
            prompt: "question".into(),
            answer: "answer".into(),
            extra: vec![],
        };
        // On a thread with a deadline, so a regression fails here instead of hanging the suite.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send((load(&p, &cols, false), load(&p, &cols, true)));
        });
        let (strict, skipping) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("load returns on a corrupt Parquet file");
        let _ = std::fs::remove_dir_all(&dir);
        let err = strict.expect_err("a corrupt file is an error");
        assert!(err.contains("row 0: unreadable row"), "{err}");
        let (rows, report) = skipping.expect("skipped");
        assert!(rows.is_empty());
        assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    }

    /// Fuzzing (terse-fuzz, target dataset): one byte (0x80) inserted at offset 12 of the verl
    /// fixture made parquet's bit reader assert (a panic out of `load`); it is an error naming
    /// the file, also with `skip_bad_rows`.
    #[test]
    fn a_parquet_file_whose_reader_panics_is_an_error() {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/datasets/verl.parquet"
        );
        let mut bytes = std::fs::read(fixture).expect("fixture");
        bytes.insert(12, 0x80);
        let dir = std::env::temp_dir().join(format!("terse-bad-bits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("bad.parquet");
        std::fs::write(&path, &bytes).expect("write");
        let cols = Columns {
            prompt: "prompt".into(),
            answer: "reward_model.ground_truth".into(),
            extra: vec![],
        };
        let r = std::panic::catch_unwind(|| (load(&path, &cols, false), load(&path, &cols, true)));
        let _ = std::fs::remove_dir_all(&dir);
        let (strict, skipping) = r.expect("load does not panic");
        for e in [strict.expect_err("strict"), skipping.expect_err("skipping")] {
            assert!(e.contains("bad.parquet: corrupt parquet file"), "{e}");
        }
    }
}
