//! The run directory's lock: `<run>/LOCK` holds "pid host start" of the process that owns the
//! run (start: the process's start time in clock ticks, field 22 of `/proc/<pid>/stat`, so a
//! reused pid is not mistaken for the holder), created with `create_new` so two processes can
//! never both hold it. Taken by `start()` (start.rs) right after the directory exists and
//! before anything in it is read or written; the run loop keeps it until the run ends (or
//! fails). A lock left by a process on this host that is gone, a zombie, or a different
//! process under the same pid is stale and taken over.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Held for the life of a run; dropping it removes the lock file.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    /// What this process wrote into the file: Drop removes only its own lock.
    content: String,
}

/// This machine's name, as the lock records it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// State (field 3) and start time (field 22) of `/proc/<pid>/stat`; None when the process
/// does not exist. The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last ')'.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The lock's content for this process.
fn me() -> String {
    let pid = std::process::id();
    match proc_stat(pid) {
        Some((_, start)) => format!("{pid} {} {start}", host()),
        None => format!("{pid} {}", host()),
    }
}

/// Whether the holder `pid` (started at `start`, when the lock recorded it) still runs on this
/// host. A zombie (state Z or X) has exited: in a container whose PID 1 does not reap, it stays
/// in /proc forever. Where /proc does not exist the answer is "alive": a lock is never broken on
/// a guess.
fn alive(pid: u32, start: Option<u64>) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    match proc_stat(pid) {
        None => Path::new(&format!("/proc/{pid}")).exists(),
        Some(('Z' | 'X', _)) => false,
        Some((_, now)) => start.is_none_or(|s| s == now),
    }
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
        let me = me();
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
                    return Ok(Self { path, content: me });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let mut parts = holder.split_whitespace();
                    let pid = parts.next().and_then(|p| p.parse::<u32>().ok());
                    let their_host = parts.next().unwrap_or("").to_string();
                    let their_start = parts.next().and_then(|s| s.parse::<u64>().ok());
                    let stale = match pid {
                        Some(p) => their_host == host() && !alive(p, their_start),
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
                        "taking over the stale lock {} (pid {} is not running, is a zombie, or is another process)",
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
        if std::fs::read_to_string(&self.path).is_ok_and(|s| s == self.content) {
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

    /// Issue 37 item 1: a LOCK whose holder is a zombie (killed, never reaped) is taken over.
    #[test]
    fn item1_a_zombie_holder_is_dead() {
        let d = scratch("zombie");
        // A child that exits at once and is not waited for stays a zombie until `wait`.
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while proc_stat(pid).is_some_and(|(s, _)| s != 'Z') {
            assert!(std::time::Instant::now() < deadline, "child never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(proc_stat(pid).map(|(s, _)| s), Some('Z'), "not a zombie");
        std::fs::write(d.join("LOCK"), format!("{pid} {}", host())).expect("lock");
        let lock = RunLock::acquire(&d).expect("a zombie's lock is taken over");
        assert_eq!(std::fs::read_to_string(d.join("LOCK")).expect("read"), me());
        drop(lock);
        child.wait().expect("reap");
    }

    /// Issue 37 item 1: a LOCK whose pid now belongs to another process (another start time)
    /// is taken over; the holder's own start time keeps it held.
    #[test]
    fn item1_a_reused_pid_is_not_the_holder() {
        let d = scratch("reused");
        let pid = std::process::id();
        let (_, start) = proc_stat(pid).expect("own stat");
        std::fs::write(d.join("LOCK"), format!("{pid} {} {}", host(), start + 1)).expect("lock");
        drop(RunLock::acquire(&d).expect("a reused pid's lock is taken over"));
        std::fs::write(d.join("LOCK"), format!("{pid} {} {start}", host())).expect("lock");
        let e = format!("{:#}", RunLock::acquire(&d).expect_err("held"));
        assert!(e.contains(&format!("in use by pid {pid}")), "{e}");
    }
}
