//! The child process's limits on one input: a counting global allocator that refuses any
//! allocation taking the live total over `--mem-gb` (remembering it, so an input whose parser
//! survives the refusal is still a finding), the watchdog thread that aborts the process when
//! one input runs over `--hang-ms`, and the quiet panic hook that keeps a panic's message for
//! the report instead of printing it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The size of the largest allocation refused since the last `take_refused` (0: none).
static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// The system allocator with a live-byte count and a ceiling. The bin installs it as its
/// global allocator; the ceiling is set only in the child, so the parent is unlimited.
#[derive(Debug)]
pub struct Counting;

impl Counting {
    fn reserve(size: usize) -> bool {
        let before = LIVE.fetch_add(size, Ordering::Relaxed);
        if before.saturating_add(size) > LIMIT.load(Ordering::Relaxed) {
            LIVE.fetch_sub(size, Ordering::Relaxed);
            REFUSED.fetch_max(size, Ordering::Relaxed);
            return false;
        }
        true
    }
}

// GlobalAlloc is an unsafe trait: the allocator must return memory valid for the layout. Every
// call forwards to `System` with the caller's own layout and pointer unchanged; the only added
// behaviour is the atomic count and returning null (an allowed "allocation failed") above the
// ceiling.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, forwarded as is (GlobalAlloc::alloc's contract).
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !Self::reserve(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` and `layout` are the caller's, from `System` (GlobalAlloc::realloc's
        // contract); on failure the old block stays valid and the count is restored.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                LIVE.fetch_sub(new_size - old, Ordering::Relaxed);
            }
        } else if new_size < old {
            LIVE.fetch_sub(old - new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Sets the ceiling on live bytes (the child calls it once, before the first input).
pub fn set_memory_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
}

/// Live bytes now (only counted when `Counting` is the global allocator).
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The largest allocation refused since the last call, if any.
pub fn take_refused() -> Option<usize> {
    match REFUSED.swap(0, Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

static PANIC: Mutex<String> = Mutex::new(String::new());

/// Replaces the panic hook by one that keeps the message and location (taken by
/// `take_panic`) and prints nothing: the parent reports each panic in one line.
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info.payload_as_str().unwrap_or("(non-string payload)");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let mut m = PANIC.lock().unwrap_or_else(|e| e.into_inner());
        *m = format!("{msg}{at}");
    }));
}

/// The last panic's message and location.
pub fn take_panic() -> String {
    std::mem::take(&mut *PANIC.lock().unwrap_or_else(|e| e.into_inner()))
}

const IDLE: u64 = u64::MAX;
static CURRENT: AtomicU64 = AtomicU64::new(IDLE);
static STARTED_US: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

/// Marks input `index` as running (the watchdog's clock starts).
pub fn begin_input(index: u64) {
    CURRENT.store(IDLE, Ordering::SeqCst);
    STARTED_US.store(now_us(), Ordering::SeqCst);
    CURRENT.store(index, Ordering::SeqCst);
}

/// Marks the input done.
pub fn end_input() {
    CURRENT.store(IDLE, Ordering::SeqCst);
}

/// Starts the watchdog: when one input has run for `limit`, `report(index, elapsed)` is
/// called and the process aborts (a hung parser cannot be stopped from another thread).
pub fn start_watchdog(limit: Duration, report: fn(u64, Duration)) {
    epoch();
    let tick = (limit / 20).clamp(Duration::from_millis(1), Duration::from_millis(50));
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || loop {
            std::thread::sleep(tick);
            let a = CURRENT.load(Ordering::SeqCst);
            let started = STARTED_US.load(Ordering::SeqCst);
            // Read again: an input that ended and another that began between the two loads
            // would otherwise pair one input's index with another's start time.
            if a == IDLE || CURRENT.load(Ordering::SeqCst) != a {
                continue;
            }
            let ran = Duration::from_micros(now_us().saturating_sub(started));
            if ran >= limit {
                report(a, ran);
                std::process::abort();
            }
        })
        .map(|_| ())
        .unwrap_or_else(|e| panic!("starting the watchdog: {e}"));
}
