//! Before a run: the memory plan of a config on a device (memory.rs) and the step-time
//! estimate `xtask plan` prints beside it (step_time.rs).

pub(crate) mod memory;
pub(crate) mod step_time;
