//! TensorBoard event files (`log.tensorboard = true`): every scalar of every metrics record,
//! under `<run>/tensorboard/`, as "phase/key" tags ("grpo/reward", "grpo/time/rollout_s",
//! "eval/by_level/3/pass1", "sft/loss"), and a reader for tests and tools. Written through
//! `terse_model::disk` (appended, not fsynced: a view of metrics.jsonl, which is).
//!
//! The format is TFRecord framing (length, masked CRC-32C of the length, an `Event` protobuf,
//! masked CRC-32C of it) around three protobuf fields, encoded here by hand. The `tboard`
//! crate does the same through prost-build, whose build script needs a `protoc` binary these
//! machines do not have; CRC-32C comes from the `crc` crate.

use crate::records::observe::Observer;
use crate::report::MetricsLine;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;
use terse_model::disk::Appender;

const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

fn masked_crc(data: &[u8]) -> u32 {
    let c = CASTAGNOLI.checksum(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(field: u32, data: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field << 3 | 2), out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

/// An `Event` with wall time, step and either a file version or scalar summary values.
fn event(
    wall_time: f64,
    step: i64,
    file_version: Option<&str>,
    scalars: &[(String, f32)],
) -> Vec<u8> {
    let mut out = vec![0x09]; // field 1, 64-bit: wall_time
    out.extend_from_slice(&wall_time.to_le_bytes());
    out.push(0x10); // field 2, varint: step
    varint(step as u64, &mut out);
    if let Some(v) = file_version {
        bytes_field(3, v.as_bytes(), &mut out);
    }
    if !scalars.is_empty() {
        let mut summary = vec![];
        for (tag, x) in scalars {
            let mut value = vec![];
            bytes_field(1, tag.as_bytes(), &mut value); // Value.tag
            value.push(0x15); // field 2, 32-bit: simple_value
            value.extend_from_slice(&x.to_le_bytes());
            bytes_field(1, &value, &mut summary); // Summary.value
        }
        bytes_field(5, &summary, &mut out); // Event.summary
    }
    out
}

/// Appends event files in a directory.
pub struct EventWriter {
    file: Appender,
}

impl EventWriter {
    /// A new events file in `dir` (created), starting with the file-version record.
    pub fn create(dir: &Path) -> Result<Self> {
        terse_model::disk::create_dir_all(dir)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        let path = dir.join(format!(
            "events.out.tfevents.{:010}.{host}.{}",
            now.as_secs(),
            std::process::id()
        ));
        let mut w = Self {
            file: Appender::create(&path)?,
        };
        w.write_event(&event(now.as_secs_f64(), 0, Some("brain.Event:2"), &[]))?;
        Ok(w)
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    fn write_event(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut rec = Vec::with_capacity(data.len() + 16);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(&masked_crc(&len).to_le_bytes());
        rec.extend_from_slice(data);
        rec.extend_from_slice(&masked_crc(data).to_le_bytes());
        Ok(self.file.append(&rec)?)
    }

    /// Scalars at one step, in one event.
    pub fn scalars(&mut self, step: i64, values: &[(String, f32)]) -> Result<()> {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.write_event(&event(wall, step, None, values))
    }
}

/// Every numeric leaf of a record as (tag, value): `phase/key[/subkey]`; the by-level table of
/// an evaluation keyed by level.
pub fn scalars_of(line: &MetricsLine) -> Result<(i64, Vec<(String, f32)>)> {
    let v = serde_json::to_value(line)?;
    let phase = v["phase"].as_str().unwrap_or("run").to_string();
    let step = v["step"].as_i64().unwrap_or(0);
    let mut out = vec![];
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, f32)>) {
        match v {
            Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((prefix.to_string(), x as f32));
                }
            }
            Value::Object(m) => {
                for (k, x) in m {
                    if k != "phase" && k != "step" {
                        walk(&format!("{prefix}/{k}"), x, out);
                    }
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let key = x["level"].as_u64().map_or(i.to_string(), |l| l.to_string());
                    walk(&format!("{prefix}/{key}"), x, out);
                }
            }
            _ => {}
        }
    }
    walk(&phase, &v, &mut out);
    Ok((step, out))
}

/// The TensorBoard observer.
pub struct TensorBoard {
    writer: EventWriter,
}

impl TensorBoard {
    pub fn create(run_dir: &Path) -> Result<Self> {
        Ok(Self {
            writer: EventWriter::create(&run_dir.join("tensorboard"))?,
        })
    }
}

impl Observer for TensorBoard {
    fn record(&mut self, line: &MetricsLine) -> Result<()> {
        let (step, values) = scalars_of(line)?;
        self.writer.scalars(step, &values)
    }
}

fn read_varint(b: &[u8], i: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = b.get(*i) else {
            bail!("truncated varint");
        };
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(v);
        }
    }
    bail!("varint too long")
}

/// One protobuf field: (number, wire type, varint or fixed value, length-delimited bytes).
type Field<'a> = (u32, u8, u64, &'a [u8]);

/// Protobuf fields of one message.
fn fields(b: &[u8]) -> Result<Vec<Field<'_>>> {
    let (mut out, mut i) = (vec![], 0);
    while i < b.len() {
        let key = read_varint(b, &mut i)?;
        let (field, wire) = ((key >> 3) as u32, (key & 7) as u8);
        let take = |i: &mut usize, n: usize| -> Result<&[u8]> {
            let s = b.get(*i..*i + n).context("truncated field")?;
            *i += n;
            Ok(s)
        };
        match wire {
            0 => out.push((field, wire, read_varint(b, &mut i)?, &b[0..0])),
            1 => {
                let s = take(&mut i, 8)?;
                out.push((field, wire, u64::from_le_bytes(s.try_into()?), &b[0..0]));
            }
            5 => {
                let s = take(&mut i, 4)?;
                out.push((
                    field,
                    wire,
                    u64::from(u32::from_le_bytes(s.try_into()?)),
                    &b[0..0],
                ));
            }
            2 => {
                let n = read_varint(b, &mut i)? as usize;
                out.push((field, wire, 0, take(&mut i, n)?));
            }
            w => bail!("wire type {w} is not used by events"),
        }
    }
    Ok(out)
}

/// Reads an events file back: (step, tag, value) for every scalar, checking every CRC.
pub fn read_scalars(path: &Path) -> Result<Vec<(i64, String, f32)>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (mut out, mut i) = (vec![], 0);
    while i < b.len() {
        let rec = b.get(i..i + 12).context("truncated record header")?;
        let len = u64::from_le_bytes(rec[..8].try_into()?) as usize;
        if u32::from_le_bytes(rec[8..12].try_into()?) != masked_crc(&rec[..8]) {
            bail!("{}: length CRC mismatch at byte {i}", path.display());
        }
        let data = b.get(i + 12..i + 12 + len).context("truncated record")?;
        let crc = b.get(i + 12 + len..i + 16 + len).context("truncated CRC")?;
        if u32::from_le_bytes(crc.try_into()?) != masked_crc(data) {
            bail!("{}: data CRC mismatch at byte {i}", path.display());
        }
        i += 16 + len;
        let ev = fields(data)?;
        let step = ev.iter().find(|f| f.0 == 2).map_or(0, |f| f.2 as i64);
        for (_, _, _, summary) in ev.iter().filter(|f| f.0 == 5) {
            for (_, _, _, value) in fields(summary)?.iter().filter(|f| f.0 == 1) {
                let vf = fields(value)?;
                let tag = vf
                    .iter()
                    .find(|f| f.0 == 1)
                    .map(|f| f.3)
                    .unwrap_or_default();
                let x = vf
                    .iter()
                    .find(|f| f.0 == 2)
                    .map_or(f32::NAN, |f| f32::from_bits(f.2 as u32));
                out.push((step, String::from_utf8_lossy(tag).into_owned(), x));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{SftReport, StepReport};

    /// CRC-32C of "123456789" is the standard check value; TensorBoard's mask on top.
    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(CASTAGNOLI.checksum(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_are_written_and_read_back() {
        let dir = std::env::temp_dir().join(format!("terse-tb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut tb = TensorBoard::create(&dir).expect("create");
        let mut s = StepReport {
            step: 4,
            reward: 0.75,
            len_mean: Some(21.5),
            ..Default::default()
        };
        s.diagnostics.insert("gamma_l".into(), 0.5);
        tb.record(&MetricsLine::Grpo(Box::new(s))).expect("grpo");
        tb.record(&MetricsLine::Sft(SftReport {
            step: 2,
            loss: 1.25,
            grad_norm: 3.0,
            lr: 1e-3,
        }))
        .expect("sft");
        let back = read_scalars(tb.writer.path()).expect("read");
        let get = |tag: &str| {
            back.iter()
                .find(|(_, t, _)| t == tag)
                .map(|(s, _, v)| (*s, *v))
        };
        assert_eq!(get("grpo/reward"), Some((4, 0.75)));
        assert_eq!(get("grpo/len_mean"), Some((4, 21.5)));
        assert_eq!(get("grpo/gamma_l"), Some((4, 0.5)));
        assert_eq!(get("grpo/time/rollout_s"), Some((4, 0.0)));
        assert_eq!(get("sft/loss"), Some((2, 1.25)));
        assert!(get("grpo/len_min").is_none(), "null values are not scalars");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
