//! The run directory's lock: `<run>/LOCK` holds "pid host" of the process that owns the run,
//! created with `create_new` so two processes can never both hold it. Taken by `train_with`
//! right after the directory exists and before anything in it is read or written; removed when
//! the run ends (or fails). A lock left by a dead process on this host is stale and taken over.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Held for the life of a run; dropping it removes the lock file.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
}

/// This machine's name, as the lock records it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// Whether `pid` is a live process on this host. Where /proc does not exist the answer is
/// "alive": a lock is never broken on a guess.
fn alive(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new(&format!("/proc/{pid}")).exists()
}

impl RunLock {
    /// Creates `run_dir` if needed and takes its lock: how a run (GRPO or SFT alone) starts.
    pub fn create_and_acquire(run_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create run directory {}", run_dir.display()))?;
        Self::acquire(run_dir)
    }

    /// Takes the lock of `run_dir` (which must exist), or fails with one line naming the holder.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join("LOCK");
        let me = format!("{} {}", std::process::id(), host());
        // Two tries: the second after removing a stale lock.
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    f.write_all(me.as_bytes())
                        .and_then(|()| f.sync_all())
                        .with_context(|| format!("writing {}", path.display()))?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let mut parts = holder.split_whitespace();
                    let pid = parts.next().and_then(|p| p.parse::<u32>().ok());
                    let their_host = parts.next().unwrap_or("").to_string();
                    let stale = match pid {
                        Some(p) => their_host == host() && !alive(p),
                        // Empty or garbled: a writer died between create and write.
                        None => true,
                    };
                    if !stale {
                        bail!(
                            "run directory {} is in use by pid {} on host {} (lock {}); wait for it to finish, or delete the lock if that process is gone",
                            run_dir.display(),
                            pid.unwrap_or_default(),
                            their_host,
                            path.display()
                        );
                    }
                    tracing::warn!(
                        "taking over the stale lock {} (pid {} is not running)",
                        path.display(),
                        pid.map_or("?".to_string(), |p| p.to_string())
                    );
                    std::fs::remove_file(&path)
                        .with_context(|| format!("removing stale {}", path.display()))?;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("creating {}", path.display()));
                }
            }
        }
        bail!(
            "run directory {}: another process took the lock {} while a stale one was removed",
            run_dir.display(),
            path.display()
        )
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Only our own lock: a lock file that is not ours any more is left alone.
        let ours = format!("{} {}", std::process::id(), host());
        if std::fs::read_to_string(&self.path).is_ok_and(|s| s == ours) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("terse-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch");
        d
    }

    /// Issue 15 item 7: a second holder stops at once naming the first; a dead holder's lock
    /// does not block; dropping the lock frees the directory.
    #[test]
    fn item7_one_process_per_run_directory() {
        let d = scratch("one");
        let lock = RunLock::acquire(&d).expect("first");
        let e = format!("{:#}", RunLock::acquire(&d).expect_err("second"));
        assert!(
            e.contains(&format!("in use by pid {}", std::process::id())) && e.contains(&host()),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
        drop(lock);
        assert!(!d.join("LOCK").exists());
        // A stale lock: a pid that cannot be running (above the kernel's pid_max).
        std::fs::write(d.join("LOCK"), format!("4294967295 {}", host())).expect("stale");
        let lock = RunLock::acquire(&d).expect("stale lock taken over");
        drop(lock);
        // Another host's lock is never broken.
        std::fs::write(d.join("LOCK"), "1 some-other-host").expect("foreign");
        let e = format!("{:#}", RunLock::acquire(&d).expect_err("foreign"));
        assert!(e.contains("some-other-host"), "{e}");
    }
}
