//! How scoring a completion can fail without failing the step: a verdict's `ScoreFault`
//! (terse-reward's: the math verifier's budget refused the answer, or the scorer panicked),
//! mapped here from the verifier's refusal, and `quiet_catch`, which
//! runs every scorer (built-in or research code's) so that a panic becomes an error value:
//! task.rs scores it as wrong with one warning naming the item, and the panic hook's own
//! report (several lines, a backtrace with RUST_BACKTRACE) stays quiet for the panics caught
//! here only. step/collect.rs counts the faults per step (`verify_budget_exceeded`,
//! `verify_panics`).

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;
use terse_reward::ScoreFault;
use terse_tasks::math;

/// The verdict's fault for the math verifier's refusal (`ScoreFault` is the reward crate's,
/// beside `Outcome`; the tasks crate's refusal is mapped here, where both are known).
pub(crate) fn of_unverifiable(u: math::Unverifiable) -> ScoreFault {
    match u {
        math::Unverifiable::BudgetExceeded => ScoreFault::BudgetExceeded,
    }
}

thread_local! {
    /// Set while this thread runs a scorer under `quiet_catch`; the location of a panic there.
    static SCORING: Cell<bool> = const { Cell::new(false) };
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into its message and location. The panic hook stays silent for a
/// panic caught here (the caller logs one line per panic instead of the hook's several, a
/// backtrace with RUST_BACKTRACE, for every sample of a step); every other panic goes to the
/// hook that was installed before, unchanged. The wrapping hook is installed once, on first use.
pub(crate) fn quiet_catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if SCORING.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                PANIC_AT.with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
    let outer = SCORING.with(|s| s.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    SCORING.with(|s| s.set(outer));
    result.map_err(|payload| {
        let msg = terse_tasks::panic_message(&*payload);
        match PANIC_AT.with(|p| p.borrow_mut().take()) {
            Some(at) => format!("{msg} (at {at})"),
            None => msg,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_with_its_message_and_place() {
        assert_eq!(quiet_catch(|| 3), Ok(3));
        let err = quiet_catch(|| -> u8 { panic!("bad {}", 7) }).expect_err("a panic");
        assert!(err.starts_with("bad 7 (at "), "{err}");
        assert!(err.contains("score_fault.rs"), "{err}");
        let err = quiet_catch(|| -> u8 { std::panic::panic_any(5u32) }).expect_err("a panic");
        assert!(err.starts_with("a non-text panic (at "), "{err}");
        // Nested: the inner catch does not end the outer one's quiet.
        let outer = quiet_catch(|| {
            let inner = quiet_catch(|| -> u8 { panic!("inner") });
            assert!(inner.is_err());
            SCORING.with(Cell::get)
        });
        assert_eq!(outer, Ok(true));
        assert!(!SCORING.with(Cell::get));
    }
}
