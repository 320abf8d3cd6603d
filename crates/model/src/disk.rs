//! The one door to the disk for what a run keeps: model and run checkpoints, metrics.jsonl,
//! config.toml, machine.json and the failure record are created, written, fsynced, renamed and
//! removed only through these functions (terse-train's writers and this crate's
//! `write_checkpoint`/`save_adapter`). Beside doing the operation, each one can note it on a
//! tape: `record` turns the tape on for the calling thread, and the crash-consistency test
//! (tests/it/crash_consistency.rs) replays every prefix of what it noted, with the writes not
//! yet made durable dropped, as a power loss may leave them.
//!
//! The durability contract the writers rely on (and the test checks): a file's data is on disk
//! once the file is fsynced (`sync`, `Appender::sync`); a directory entry (a create, rename,
//! removal) once its parent directory is fsynced. `atomic_write` and `create_dir_all` return
//! only once what they did is durable.
//!
//! The tape is thread-local and off unless a test turns it on: a normal run pays one
//! thread-local check per operation and copies nothing.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One operation on the disk, as `record` notes it (paths as given by the writer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A new directory.
    Mkdir(PathBuf),
    /// A file opened with create and truncate: a new empty file, or an existing one emptied.
    Create(PathBuf),
    /// `bytes` written into the file at `offset` (one write call of the writer).
    Write {
        path: PathBuf,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// fsync of a file (its data) or of a directory (its entries).
    Fsync(PathBuf),
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    /// A file unlinked.
    Remove(PathBuf),
    /// An empty directory removed.
    Rmdir(PathBuf),
}

thread_local! {
    /// The operations noted since `record` turned the tape on; `None` when off.
    static TAPE: RefCell<Option<Vec<Op>>> = const { RefCell::new(None) };
}

/// Runs `f` with the tape on for this thread and returns what it did to the disk, in order.
/// Operations of other threads are not noted (every writer of a run writes from the thread
/// that drives it).
pub fn record<T>(f: impl FnOnce() -> T) -> (T, Vec<Op>) {
    let before = TAPE.with(|t| t.borrow_mut().replace(vec![]));
    let out = f();
    let ops = TAPE.with(|t| std::mem::replace(&mut *t.borrow_mut(), before));
    (out, ops.unwrap_or_default())
}

/// Notes an operation when the tape is on; `op` is built only then (no copy otherwise).
fn note(op: impl FnOnce() -> Op) {
    TAPE.with(|t| {
        if let Some(ops) = t.borrow_mut().as_mut() {
            ops.push(op());
        }
    });
}

/// The error of an operation on `path`, naming it.
fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The directory holding `path` (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and its missing ancestors, each made durable (its parent fsynced) before the
/// next: a run directory or checkpoint directory this returns is on disk.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(up) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all(up)?;
    }
    match std::fs::create_dir(dir) {
        // Another process made it meanwhile: it exists, which is what was asked.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        r => r.map_err(|e| named(dir, e))?,
    }
    note(|| Op::Mkdir(dir.to_path_buf()));
    sync(parent(dir))
}

/// Creates (or empties) `path` and writes `bytes` in one write call; not synced (`sync` it, or
/// use `atomic_write`).
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(path).map_err(|e| named(path, e))?;
    note(|| Op::Create(path.to_path_buf()));
    f.write_all(bytes).map_err(|e| named(path, e))?;
    if !bytes.is_empty() {
        note(|| Op::Write {
            path: path.to_path_buf(),
            offset: 0,
            bytes: bytes.to_vec(),
        });
    }
    Ok(())
}

/// A copy of the file `from` as `to` (written as `write_file` does).
pub fn copy(from: &Path, to: &Path) -> io::Result<()> {
    let bytes = std::fs::read(from).map_err(|e| named(from, e))?;
    write_file(to, &bytes)
}

/// fsync of a file (its data reaches the disk) or of a directory (its entries do).
pub fn sync(path: &Path) -> io::Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| named(path, e))?;
    note(|| Op::Fsync(path.to_path_buf()));
    Ok(())
}

pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to).map_err(|e| named(from, e))?;
    note(|| Op::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
    });
    Ok(())
}

/// Unlinks a file; one that is not there is no error.
pub fn remove_file(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => {
            r.map_err(|e| named(path, e))?;
            note(|| Op::Remove(path.to_path_buf()));
            Ok(())
        }
    }
}

/// Removes `dir` and everything under it, one entry at a time (so the tape holds each), files
/// before the directory that held them. Symbolic links are removed, not followed.
pub fn remove_dir_all(dir: &Path) -> io::Result<()> {
    let mut entries: Vec<(PathBuf, bool)> = vec![];
    for e in std::fs::read_dir(dir).map_err(|e| named(dir, e))? {
        let e = e.map_err(|e| named(dir, e))?;
        let is_dir = e.file_type().map_err(|er| named(&e.path(), er))?.is_dir();
        entries.push((e.path(), is_dir));
    }
    // Sorted: the same order on every filesystem, so a recorded sequence is reproducible.
    entries.sort();
    for (p, is_dir) in entries {
        match is_dir {
            true => remove_dir_all(&p)?,
            false => remove_file(&p)?,
        }
    }
    std::fs::remove_dir(dir).map_err(|e| named(dir, e))?;
    note(|| Op::Rmdir(dir.to_path_buf()));
    Ok(())
}

/// Replaces `path` with `bytes` so that a crash or a power loss at any moment leaves the old
/// content or the new, never a mix or an empty file: written to `<path>.tmp`-style sibling,
/// fsynced, renamed over `path`, and the directory fsynced (the rename made durable) before
/// returning.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    write_file(&tmp, bytes)?;
    sync(&tmp)?;
    rename(&tmp, path)?;
    sync(parent(path))
}

/// A file written by appending: each `append` is one write call at the end, durable after
/// `sync`.
pub struct Appender {
    file: File,
    path: PathBuf,
    len: u64,
}

impl Appender {
    /// Opens `path` for appending; with `create`, a missing file is created and its entry made
    /// durable (the directory fsynced) before anything is appended.
    pub fn open(path: &Path, create: bool) -> io::Result<Self> {
        let new = create && !path.exists();
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(create)
            .open(path)
            .map_err(|e| named(path, e))?;
        if new {
            note(|| Op::Create(path.to_path_buf()));
            sync(parent(path))?;
        }
        let len = file.metadata().map_err(|e| named(path, e))?.len();
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len,
        })
    }

    /// A new empty file at `path` (an existing one is emptied), for appending; not synced.
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = File::create(path).map_err(|e| named(path, e))?;
        note(|| Op::Create(path.to_path_buf()));
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len: 0,
        })
    }

    /// `bytes` at the end of the file, in one write call.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file
            .write_all(bytes)
            .map_err(|e| named(&self.path, e))?;
        note(|| Op::Write {
            path: self.path.clone(),
            offset: self.len,
            bytes: bytes.to_vec(),
        });
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// fsync of the file's data (and of its size).
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| named(&self.path, e))?;
        note(|| Op::Fsync(self.path.clone()));
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("terse-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    /// The order `atomic_write` promises: data fsynced before the rename, the directory after.
    #[test]
    fn atomic_write_syncs_the_file_before_the_rename_and_the_directory_after() {
        let d = scratch("atomic");
        let p = d.join("state.json");
        let ((), ops) = record(|| atomic_write(&p, b"{}").expect("write"));
        let tmp = d.join("state.json.tmp");
        assert_eq!(
            ops,
            [
                Op::Create(tmp.clone()),
                Op::Write {
                    path: tmp.clone(),
                    offset: 0,
                    bytes: b"{}".to_vec()
                },
                Op::Fsync(tmp.clone()),
                Op::Rename {
                    from: tmp,
                    to: p.clone()
                },
                Op::Fsync(d.clone()),
            ]
        );
        assert_eq!(std::fs::read(&p).expect("read"), b"{}");
        // Off unless recording: nothing is kept, and the next recording starts empty.
        atomic_write(&p, b"[]").expect("write");
        assert_eq!(record(|| ()).1, []);
        std::fs::remove_dir_all(&d).expect("clean");
    }

    /// Directories made durable level by level; appends at the file's end; removal entry by
    /// entry, files before their directory.
    #[test]
    fn mkdir_append_and_removal_are_recorded_entry_by_entry() {
        let d = scratch("tree");
        let (a, b) = (d.join("a"), d.join("a/b"));
        let ((), ops) = record(|| {
            create_dir_all(&b).expect("mkdir");
            let mut f = Appender::open(&b.join("m"), true).expect("open");
            f.append(b"x\n").and_then(|()| f.sync()).expect("append");
            let mut f = Appender::open(&b.join("m"), false).expect("reopen");
            f.append(b"y\n").expect("append");
            remove_dir_all(&a).expect("remove");
        });
        let m = b.join("m");
        assert_eq!(
            ops,
            [
                Op::Mkdir(a.clone()),
                Op::Fsync(d.clone()),
                Op::Mkdir(b.clone()),
                Op::Fsync(a.clone()),
                Op::Create(m.clone()),
                Op::Fsync(b.clone()),
                Op::Write {
                    path: m.clone(),
                    offset: 0,
                    bytes: b"x\n".to_vec()
                },
                Op::Fsync(m.clone()),
                Op::Write {
                    path: m.clone(),
                    offset: 2,
                    bytes: b"y\n".to_vec()
                },
                Op::Remove(m),
                Op::Rmdir(b),
                Op::Rmdir(a.clone()),
            ]
        );
        assert!(!a.exists());
        std::fs::remove_dir_all(&d).expect("clean");
    }
}
