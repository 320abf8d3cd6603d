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

/// Loads a `.jsonl` or `.parquet` file.
pub fn load(
    path: &Path,
    cols: &Columns,
    skip_bad_rows: bool,
) -> Result<(Vec<Row>, LoadReport), String> {
    let records: Vec<(usize, Result<Value, String>)> = match path
        .extension()
        .and_then(|e| e.to_str())
    {
        Some("jsonl") | Some("json") => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            text.lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| {
                    (
                        i + 1,
                        serde_json::from_str::<Value>(l).map_err(|e| format!("invalid JSON: {e}")),
                    )
                })
                .collect()
        }
        Some("parquet") => {
            use parquet::file::reader::SerializedFileReader;
            let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let reader = SerializedFileReader::try_from(file)
                .map_err(|e| format!("{}: not a parquet file: {e}", path.display()))?;
            reader
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    (
                        i,
                        r.map(|row| row.to_json_value())
                            .map_err(|e| format!("unreadable row: {e}")),
                    )
                })
                .collect()
        }
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
