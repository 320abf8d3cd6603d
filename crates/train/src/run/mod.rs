//! A whole run around the step: start (validate, lock, load, SFT warm-up), the one loop every
//! rank drives, the hand-offs between ranks, the run lock, the run's config record and its
//! machine record. Checkpoints and failure records sit a floor lower, in the crate root's
//! checkpoint.rs and failure.rs, where the step reads them too.

pub(crate) mod config_record;
pub(crate) mod handoff;
pub(crate) mod lock;
pub(crate) mod machine;
pub(crate) mod ranks;
pub(crate) mod run_loop;
pub(crate) mod sft;
pub(crate) mod start;
