//! The run lock within one process: a second holder is refused at once naming the first, a
//! waiting start gets the lock when it is released, the file's text is only for messages, and
//! stale `*.tmp` directories go once the lock is held. The two-process races and kill -9
//! restarts are in tests/it/run_lock.rs (they need a second process).

use super::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("terse-lock-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch");
    d
}

/// A second holder stops at once naming the first (one line); dropping the lock frees the
/// directory; a flock is per open file, so this holds between threads of one process too.
#[test]
fn a_second_holder_is_refused_naming_the_first() {
    let d = scratch("one");
    let lock = RunLock::acquire(&d, Duration::ZERO).expect("first");
    let e = format!(
        "{:#}",
        RunLock::acquire(&d, Duration::ZERO).expect_err("second")
    );
    assert!(
        e.contains(&format!(
            "in use by pid {} on host {}",
            std::process::id(),
            host()
        )),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1);
    drop(lock);
    assert_eq!(std::fs::read_to_string(d.join("LOCK")).expect("read"), "");
    drop(RunLock::acquire(&d, Duration::ZERO).expect("free again"));
}

/// Whatever the file says (a dead pid, another host, garbage), an unlocked LOCK is free: the
/// text is never used to decide.
#[test]
fn the_file_text_never_decides() {
    let d = scratch("text");
    for text in [
        "4294967295 here 1\n",
        "1 some-other-host 5\n",
        "\0\0garbage",
        "",
    ] {
        std::fs::write(d.join("LOCK"), text).expect("write");
        let lock = RunLock::acquire(&d, Duration::ZERO).expect("an unlocked LOCK is free");
        let now = std::fs::read_to_string(d.join("LOCK")).expect("read");
        assert!(
            now.starts_with(&format!("{} ", std::process::id())),
            "{now:?}"
        );
        drop(lock);
    }
}

/// A start that finds the lock taken waits for it: released by the holder (a thread here,
/// told through a channel, not a sleep), the waiter proceeds; with too short a wait it is
/// refused after the wait.
#[test]
fn a_waiting_start_gets_the_lock_once_released() {
    let d = scratch("wait");
    let lock = RunLock::acquire(&d, Duration::ZERO).expect("first");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        rx.recv().expect("release");
        drop(lock);
    });
    let t0 = Instant::now();
    let e = RunLock::acquire(&d, Duration::from_millis(60)).expect_err("still held");
    assert!(
        t0.elapsed() >= Duration::from_millis(60),
        "refused before the wait"
    );
    assert!(format!("{e:#}").contains("waited"), "{e:#}");
    let d2 = d.clone();
    let waiter = std::thread::spawn(move || RunLock::acquire(&d2, Duration::from_secs(30)));
    tx.send(()).expect("send");
    holder.join().expect("holder");
    drop(
        waiter
            .join()
            .expect("waiter")
            .expect("the waiter gets the lock"),
    );
}

/// Stale `*.tmp` directories (a checkpoint a killed run was writing) are removed once the lock
/// is held, never before; other entries stay.
#[test]
fn stale_tmp_directories_go_once_the_lock_is_held() {
    let d = scratch("tmp");
    let first = RunLock::acquire(&d, Duration::ZERO).expect("first");
    std::fs::create_dir_all(d.join("step_000002.tmp")).expect("tmp");
    std::fs::create_dir_all(d.join("step_000001")).expect("ckpt");
    assert!(RunLock::acquire(&d, Duration::ZERO).is_err());
    assert!(
        d.join("step_000002.tmp").is_dir(),
        "removed by a start without the lock"
    );
    drop(first);
    let _lock = RunLock::acquire(&d, Duration::ZERO).expect("lock");
    assert!(!d.join("step_000002.tmp").exists());
    assert!(d.join("step_000001").is_dir());
}

/// A wait too long to represent waits forever rather than overflowing the deadline.
#[test]
fn an_unrepresentable_wait_does_not_panic() {
    let d = scratch("max");
    drop(RunLock::acquire(&d, Duration::MAX).expect("free lock"));
}
