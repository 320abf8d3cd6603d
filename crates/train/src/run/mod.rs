//! A whole run around the step: start (validate, lock, load, SFT warm-up), the one loop every
//! rank drives, the hand-offs between ranks, checkpoints, the run lock and failure records.

pub(crate) mod checkpoint;
pub(crate) mod config_record;
pub(crate) mod failure;
pub(crate) mod handoff;
pub(crate) mod load;
pub(crate) mod lock;
pub(crate) mod machine;
pub(crate) mod phase;
pub(crate) mod ranks;
pub(crate) mod run_loop;
pub(crate) mod sft;
pub(crate) mod start;
