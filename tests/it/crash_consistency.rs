//! Issue 59 item 5: a power loss at any moment of a run leaves a run that resumes from its
//! newest complete checkpoint, with metrics that have no torn, lost or duplicated line.
//!
//! A GRPO run of 2 steps with a checkpoint at every step (3 checkpoints: steps 0, 1, 2), an SFT
//! warm-up, keep-last-1 pruning, stopped after step 1's checkpoint (an observer fails) and
//! resumed to its end, is recorded through `terse_model::disk`. Every state a power loss can
//! leave of that tape (crash_model.rs: every prefix, every outcome of the operations not yet
//! durable) is written onto a fresh directory and read the way a start reads it: `RunLock`
//! (removes stale `.tmp` directories), `checkpoints_newest_first`, `read_state`,
//! `load_checkpoint_model`, and `MetricsWriter::open` (the truncation at resume). Each state
//! must hold:
//! - every checkpoint the resume may take (DONE) is complete: its files exactly those its save
//!   wrote, byte for byte; the newest loads with finite weights and its state.json names it;
//! - no checkpoint is lost once the run went on past it: the resume starts at or after the
//!   step of every line metrics.jsonl holds (a line is written after its step's checkpoint);
//! - metrics.jsonl after the resume's truncation is exactly the uninterrupted run's lines
//!   before the resume step ("time" aside), or, for a finished run, all of them;
//! - every other file the run wrote (config.toml, machine.json, the failure record) holds one
//!   of the contents it was given, never a torn or empty one.
//!
//! The tape is about 140 operations; the walk checks every one of the roughly 800 crash states
//! (about 180 distinct) in under 10 s here. A writer that leaves config.toml's data unsynced
//! before its rename, or the run directory unsynced after a checkpoint's rename, fails it.

use crate::crash_model::{Content, Entry, Model, State};
use crate::train::small_config;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use terse_model::disk::{self, Op};
use terse_train::records::{MetricsWriter, Start};
use terse_train::{checkpoints_newest_first, read_state, RunLock};

/// Fails the run at the record of GRPO step `.0`: the stop of a process after that step's
/// checkpoint (its line is written first: metrics.jsonl comes before the observers added).
struct StopAt(u64);

impl terse_train::Observer for StopAt {
    fn record(&mut self, line: &terse_train::MetricsLine) -> anyhow::Result<()> {
        match line {
            terse_train::MetricsLine::Grpo(r) if r.step == self.0 => {
                anyhow::bail!("stopped at step {}", self.0)
            }
            _ => Ok(()),
        }
    }
}

/// A metrics line without its wall-clock "time" (the one part a rerun of a step changes).
fn timeless(line: &str) -> Option<serde_json::Value> {
    let mut v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.as_object_mut()?.remove("time");
    Some(v)
}

/// What the uninterrupted tape wrote, for judging a crash state.
struct Written<'a> {
    tape: &'a [Op],
    /// Every content each path held at some point (paths relative to the root).
    published: HashMap<PathBuf, HashSet<Content>>,
    /// Each checkpoint directory's files right after a rename put it in place.
    checkpoints: HashMap<PathBuf, Vec<Vec<(PathBuf, Content)>>>,
    /// metrics.jsonl at the end, "time" aside.
    final_metrics: Vec<serde_json::Value>,
}

impl<'a> Written<'a> {
    fn new(model: &Model, tape: &'a [Op]) -> Self {
        let (mut published, mut checkpoints) = (HashMap::<_, HashSet<_>>::new(), HashMap::new());
        for p in 0..=model.len() {
            let state = model.volatile(p);
            for (path, e) in &state {
                if let Entry::File(c) = e {
                    published.entry(path.clone()).or_default().insert(c.clone());
                }
            }
            if let Some(Op::Rename { to, .. }) = p.checked_sub(1).map(|i| &tape[i]) {
                let name = to.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if name.starts_with("step_") {
                    let dir = state
                        .iter()
                        .find(|(path, _)| to.ends_with(path))
                        .map(|(path, _)| path.clone())
                        .expect("the renamed checkpoint");
                    let files = files_in(&state, &dir);
                    checkpoints.entry(dir).or_insert_with(Vec::new).push(files);
                }
            }
        }
        let end = model.volatile(model.len());
        let metrics = end
            .iter()
            .find(|(p, _)| p.ends_with("metrics.jsonl"))
            .and_then(|(_, e)| match e {
                Entry::File(c) => Some(c.bytes(tape)),
                Entry::Dir => None,
            })
            .expect("metrics.jsonl at the end");
        let final_metrics = String::from_utf8(metrics)
            .expect("utf-8")
            .lines()
            .map(|l| timeless(l).expect("a whole line"))
            .collect();
        Written {
            tape,
            published,
            checkpoints,
            final_metrics,
        }
    }

    /// Whether `c` at `path` is one of the contents written there (the same writes, or the
    /// same bytes).
    fn was_written(&self, path: &Path, c: &Content) -> bool {
        let Some(set) = self.published.get(path) else {
            return false;
        };
        set.contains(c) || {
            let b = c.bytes(self.tape);
            set.iter()
                .any(|w| w.len == c.len && w.bytes(self.tape) == b)
        }
    }
}

/// The files directly in `dir` of a state, with their contents.
fn files_in(state: &State, dir: &Path) -> Vec<(PathBuf, Content)> {
    state
        .iter()
        .filter(|(p, _)| p.parent() == Some(dir))
        .filter_map(|(p, e)| match e {
            Entry::File(c) => Some((p.clone(), c.clone())),
            Entry::Dir => None,
        })
        .collect()
}

/// Writes `state` under `at` (large files hard-linked from `blobs`, written once).
fn materialise(state: &State, tape: &[Op], at: &Path, blobs: &mut HashMap<Content, PathBuf>) {
    let store = at.with_file_name("blobs");
    std::fs::create_dir_all(at).expect("case dir");
    for (p, e) in state {
        let to = at.join(p);
        match e {
            Entry::Dir => std::fs::create_dir_all(&to).expect("dir"),
            Entry::File(c) if c.len < (1 << 20) => {
                std::fs::write(&to, c.bytes(tape)).expect("file")
            }
            Entry::File(c) => {
                let n = blobs.len();
                let blob = blobs.entry(c.clone()).or_insert_with(|| {
                    std::fs::create_dir_all(&store).expect("blobs");
                    let b = store.join(n.to_string());
                    std::fs::write(&b, c.bytes(tape)).expect("blob");
                    b
                });
                std::fs::hard_link(blob, &to).expect("link");
            }
        }
    }
}

/// Whether two listings of a directory's files are the same files with the same contents.
fn same_files(w: &Written, a: &[(PathBuf, Content)], b: &[(PathBuf, Content)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((pa, ca), (pb, cb))| {
            pa == pb && (ca == cb || (ca.len == cb.len && ca.bytes(w.tape) == cb.bytes(w.tape)))
        })
}

/// Whether a path lies in, or is, a `.tmp` file or directory (a write in progress).
fn in_progress(p: &Path) -> bool {
    p.components()
        .any(|c| c.as_os_str().to_string_lossy().ends_with(".tmp"))
}

/// The checks of the module docs on one crash state, written under `case`; `loaded` holds the
/// checkpoints already loaded (loading is a function of the files' bytes).
fn check(
    state: &State,
    w: &Written,
    cfg: &terse_train::RunConfig,
    case: &Path,
    loaded: &mut HashSet<Vec<(PathBuf, Content)>>,
) -> Result<(), String> {
    let rel = Path::new(&cfg.run.name);
    for (p, e) in state {
        if let Entry::File(c) = e {
            if !in_progress(p) && !p.ends_with("metrics.jsonl") && !w.was_written(p, c) {
                return Err(format!("{}: a content never written there", p.display()));
            }
        }
    }
    let run = case.join(rel);
    if !run.is_dir() {
        return Ok(());
    }
    let err = |e: anyhow::Error| format!("{e:#}");
    let _lock = RunLock::acquire(&run, std::time::Duration::ZERO).map_err(err)?;
    let ckpts = checkpoints_newest_first(&run).map_err(err)?;
    for ck in &ckpts {
        let dir = rel.join(ck.file_name().expect("a name"));
        let files = files_in(state, &dir);
        let saved = w.checkpoints.get(&dir).into_iter().flatten();
        if !saved.into_iter().any(|snap| same_files(w, snap, &files)) {
            return Err(format!(
                "{} has DONE but not the files its save wrote",
                dir.display()
            ));
        }
    }
    let resumed = match ckpts.first() {
        None => None,
        Some(ck) => {
            let st = read_state(ck).map_err(err)?;
            if ck.file_name() != Some(terse_train::step_name(st.step).as_ref()) {
                return Err(format!(
                    "{}: state.json says step {}",
                    ck.display(),
                    st.step
                ));
            }
            if loaded.insert(files_in(state, &rel.join(ck.file_name().expect("name")))) {
                let dev = candle_core::Device::Cpu;
                let m = terse_train::step::load_checkpoint_model(
                    cfg,
                    ck,
                    &dev,
                    candle_core::DType::F32,
                )
                .map_err(err)?;
                if let Some(t) = m.first_non_finite().map_err(|e| e.to_string())? {
                    return Err(format!("{}: non-finite {t}", ck.display()));
                }
            }
            Some(st.step)
        }
    };
    let path = run.join("metrics.jsonl");
    let raw = std::fs::read_to_string(&path).unwrap_or_default();
    // As start.rs reads it: whole lines (with their newline) only.
    let lines: Vec<serde_json::Value> = raw
        .split_inclusive('\n')
        .filter_map(|l| timeless(l.strip_suffix('\n')?))
        .collect();
    let reached = lines
        .iter()
        .filter(|v| v["phase"] != "sft")
        .filter_map(|v| v["step"].as_u64())
        .max();
    if let Some(s) = reached.filter(|&s| resumed.is_none_or(|r| r < s)) {
        return Err(format!(
            "a checkpoint was lost: metrics.jsonl reaches step {s}, the resume starts at {resumed:?}"
        ));
    }
    let steps = cfg.grpo.steps;
    let finished = resumed == Some(steps)
        && lines
            .iter()
            .any(|v| v["phase"] == "eval" && v["step"].as_u64() == Some(steps));
    let (text, expected) = if finished {
        (raw, w.final_metrics.clone())
    } else {
        let start = match resumed {
            Some(start) => Start::Resumed {
                start,
                steps,
                eval_every: cfg.eval.every,
            },
            None => Start::Fresh,
        };
        drop(MetricsWriter::open(&path, start).map_err(err)?);
        let kept = w.final_metrics.iter().filter(|v| {
            resumed
                .is_some_and(|r| v["phase"] == "sft" || v["step"].as_u64().is_some_and(|s| s < r))
        });
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        (text, kept.cloned().collect())
    };
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("metrics.jsonl ends in a torn line".into());
    }
    let got: Vec<serde_json::Value> = text
        .lines()
        .map(|l| timeless(l).ok_or_else(|| format!("metrics.jsonl: a torn line {l:?}")))
        .collect::<Result<_, _>>()?;
    if got != expected {
        return Err(format!(
            "metrics.jsonl after resuming at {resumed:?}: {} lines, the uninterrupted run's are {} ({:?} vs {:?})",
            got.len(),
            expected.len(),
            got.iter().map(|v| (v["phase"].clone(), v["step"].clone())).collect::<Vec<_>>(),
            expected.iter().map(|v| (v["phase"].clone(), v["step"].clone())).collect::<Vec<_>>(),
        ));
    }
    Ok(())
}

/// The files under `dir` (relative paths, sorted), LOCK and the plots left out (neither goes
/// through the I/O layer: the lock is no record, the plots are redrawn from metrics.jsonl).
fn on_disk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Option<Vec<u8>>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let rel = p.strip_prefix(root).expect("under root").to_path_buf();
        if p.is_dir() {
            out.push((rel, None));
            on_disk(root, &p, out);
        } else if !p.ends_with("LOCK") && p.extension().is_none_or(|e| e != "png") {
            out.push((rel, Some(std::fs::read(&p).expect("read"))));
        }
    }
}

/// Issue 59 item 5; see the module docs.
#[test]
fn item5_a_power_loss_anywhere_in_a_run_leaves_a_resumable_run() {
    let started = std::time::Instant::now();
    let root = crate::scratch("crash-consistency");
    let mut cfg = small_config(&root, "run", 2);
    cfg.checkpoint.every = 1;
    cfg.checkpoint.keep_last = 1;
    let ((), tape) = disk::record(|| {
        let stop = terse_train::GrpoTrainer::builder(cfg.clone())
            .observer(Box::new(StopAt(1)))
            .run()
            .expect_err("the run stops at step 1");
        assert!(
            format!("{stop:#}").contains("stopped at step 1"),
            "{stop:#}"
        );
        terse_train::train(&cfg).expect("the resumed run");
    });
    let recorded = started.elapsed();
    let model = Model::new(&root, &tape);
    // The tape is the whole story: replayed without a crash, it gives the directory the run
    // left, file for file and byte for byte.
    let mut disk_now = vec![];
    on_disk(&root, &root, &mut disk_now);
    let replayed: Vec<(PathBuf, Option<Vec<u8>>)> = model
        .volatile(model.len())
        .into_iter()
        .map(|(p, e)| match e {
            Entry::Dir => (p, None),
            Entry::File(c) => (p, Some(c.bytes(&tape))),
        })
        .collect();
    assert!(
        replayed == disk_now,
        "the tape does not replay into the run directory"
    );
    let w = Written::new(&model, &tape);
    assert_eq!(w.checkpoints.len(), 3, "3 checkpoints: steps 0, 1, 2");

    // Prefix by prefix, each new distinct state written out and checked; a broken writer
    // stops the walk at its first `SHOWN` failing states (not hours of them).
    const SHOWN: usize = 10;
    let (mut combinations, mut distinct, mut sampled) = (0usize, HashSet::new(), 0);
    let (mut prefixes, mut checked) = (0, 0);
    let cases = crate::scratch("crash-consistency-cases");
    let (mut blobs, mut loaded) = (HashMap::new(), HashSet::new());
    let mut failures = vec![];
    for p in 0..=model.len() {
        let mut new = vec![];
        let all = model.states(p, |s| {
            combinations += 1;
            if distinct.insert(s.clone()) {
                new.push(s);
            }
        });
        sampled += usize::from(!all);
        prefixes += 1;
        for s in new {
            let case = cases.join(format!("case{checked}"));
            checked += 1;
            materialise(&s, &tape, &case, &mut blobs);
            if let Err(e) = check(&s, &w, &cfg, &case, &mut loaded) {
                let op = p.checked_sub(1).map(|j| short(&tape[j]));
                failures.push(format!("after {p} ops (the last: {op:?}): {e}"));
            }
            std::fs::remove_dir_all(&case).expect("clean case");
        }
        if failures.len() >= SHOWN {
            break;
        }
    }
    eprintln!(
        "crash consistency: {} ops recorded; {prefixes} of {} prefixes walked ({sampled} sampled, not enumerated), {combinations} crash states, {checked} distinct ones checked, {} checkpoints loaded; {} failing; recorded in {:.1} s, all in {:.1} s",
        tape.len(),
        model.len() + 1,
        loaded.len(),
        failures.len(),
        recorded.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} crash states fail (the walk stops at {SHOWN}):\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Exhaustive: no prefix had more combinations than are enumerated.
    assert_eq!(
        sampled, 0,
        "{sampled} prefixes were sampled, not enumerated"
    );
    std::fs::remove_dir_all(&cases).expect("clean");
}

/// An operation without its bytes, for messages.
fn short(op: &Op) -> String {
    match op {
        Op::Write {
            path,
            offset,
            bytes,
        } => {
            format!(
                "Write {} at {offset}, {} bytes",
                path.display(),
                bytes.len()
            )
        }
        other => format!("{other:?}"),
    }
}
