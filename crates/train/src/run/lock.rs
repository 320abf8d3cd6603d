//! The run directory's lock: an advisory lock (flock) on `<run>/LOCK`, held through an open
//! descriptor for the life of the run. The kernel keeps it: it is released on any exit of the
//! holder, kill -9 included, and two processes can never both hold it, so nothing has to guess
//! whether a recorded holder is still alive. Taken by `start()` (start.rs) and `sft_only`
//! (sft.rs) right after the directory exists and before anything in it is read or written;
//! the run loop keeps it until the run ends (or fails). The file's text ("pid host start")
//! names the holder in the message of a start that finds the lock taken, and nothing else.
//! The run directory is created, and stale `.tmp` checkpoints removed, through
//! `terse_model::disk` (the directory made durable); LOCK itself is no record and goes around it.

use anyhow::{bail, Context, Result};
use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a waiting start retries the lock.
const POLL: Duration = Duration::from_millis(20);

/// Held for the life of a run: the open, locked `LOCK`. Dropping it (or any exit of the
/// process) releases the lock. The file itself stays: removing it would let a later start
/// lock a new file while a waiter still holds the old one's descriptor.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

/// This machine's name, as the lock records it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// What the holder writes into the file: pid, host and start time (seconds since the epoch),
/// for a waiting or refused start's message.
fn me() -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{} {} {since}\n", std::process::id(), host())
}

/// The holder as the file names it ("pid N on host H"). A holder writes its text right after
/// it takes the lock, so an empty file is read again for up to a second before the message
/// settles for a generic name.
fn holder(file: &mut File) -> String {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let mut text = String::new();
        let _ = file.rewind().and_then(|()| file.read_to_string(&mut text));
        let mut parts = text.split_whitespace();
        if let (Some(pid), Some(host)) = (parts.next(), parts.next()) {
            return format!("pid {pid} on host {host}");
        }
        if Instant::now() >= until {
            return "a process that has not written its name".into();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl RunLock {
    /// Creates `run_dir` if needed and takes its lock, waiting up to `wait`: how a run (GRPO
    /// or SFT alone) starts.
    pub fn create_and_acquire(run_dir: &Path, wait: Duration) -> Result<Self> {
        terse_model::disk::create_dir_all(run_dir)
            .with_context(|| format!("cannot create run directory {}", run_dir.display()))?;
        Self::acquire(run_dir, wait)
    }

    /// Takes the lock of `run_dir` (which must exist). A lock held by another process is
    /// waited for up to `wait` (printing once whom it waits for, as cargo does for its build
    /// directory), then refused with one line naming the holder. Once held, the run's stale
    /// `*.tmp` directories (a checkpoint a killed process was writing) are removed.
    pub fn acquire(run_dir: &Path, wait: Duration) -> Result<Self> {
        let path = run_dir.join("LOCK");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening the run lock {}", path.display()))?;
        // None: a wait too long to represent, i.e. forever.
        let deadline = Instant::now().checked_add(wait);
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    let who = holder(&mut file);
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        bail!(
                            "run directory {} is in use by {who} (lock {}); waited {:.0} s (--lock-wait); wait for it to finish or stop it",
                            run_dir.display(),
                            path.display(),
                            wait.as_secs_f64()
                        );
                    }
                    if !told {
                        eprintln!(
                            "waiting for the lock {} held by {who} (up to {:.0} s)",
                            path.display(),
                            wait.as_secs_f64()
                        );
                        told = true;
                    }
                    let left = deadline.map_or(POLL, |d| d.saturating_duration_since(now));
                    std::thread::sleep(POLL.min(left));
                }
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| {
                        format!(
                            "locking {}: the filesystem refused an advisory lock (docs/cli.md, Run directories on network filesystems); put run.dir on a local disk or one that supports flock",
                            path.display()
                        )
                    });
                }
            }
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(me().as_bytes()))
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", path.display()))?;
        remove_stale_tmp(run_dir)?;
        Ok(Self { file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Directories ending in `.tmp` are checkpoints (or the SFT model) a process was writing when
/// it stopped; the lock's holder is the only writer, so once it is held they are garbage.
fn remove_stale_tmp(run_dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(run_dir)
        .with_context(|| format!("listing run directory {}", run_dir.display()))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && p.extension().is_some_and(|x| x == "tmp") {
            terse_model::disk::remove_dir_all(&p).context("removing a stale checkpoint")?;
        }
    }
    Ok(())
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Empty the holder's text while still holding the lock; closing the descriptor (when
        // `file` drops) releases it.
        let _ = self.file.set_len(0);
    }
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;
