//! The shaper the trainer calls each step, with the state it checkpoints: any `LengthShaper`
//! (a closure works) or the built-in one of `[reward]`, whose Short-RL state is saved and
//! restored so a resumed run shapes as one that never stopped.

use anyhow::Result;
use terse_reward::{BuiltinShaper, Group, LengthShaper, Shaped, StepCtx};

/// A shaper whose state (if any) the trainer checkpoints.
pub trait ShaperWithState: LengthShaper {
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Restores what `state` saved; an error (a state that does not deserialise) stops the
    /// resume, since continuing with a default state would break "resume equals not stopping".
    fn restore(&mut self, _state: &serde_json::Value) -> Result<()> {
        Ok(())
    }
}

impl<F: FnMut(&[Group], &StepCtx) -> Shaped> ShaperWithState for F {}

impl ShaperWithState for BuiltinShaper {
    fn state(&self) -> serde_json::Value {
        serde_json::to_value(&self.state).unwrap_or_default()
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<()> {
        self.state = serde_json::from_value(state.clone())
            .map_err(|e| anyhow::anyhow!("not a built-in shaper state: {e}"))?;
        Ok(())
    }
}
