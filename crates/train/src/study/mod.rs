//! The reproduction study's statistics as a library: the papers' claims decided from paired
//! runs with 95 % intervals and seed counts (`claims`), and whether outcome-only GRPO
//! overthinks (`overthink`). Typed inputs (`RunStats`, `overthink::Run`), markdown out; `cargo
//! xtask repro` reads the runs and writes docs/results.md with them, and research code can
//! compute the same verdicts on its own runs without the CLI.

pub mod claims;
pub mod overthink;

pub use claims::{paired, Interval, RunStats, Verdict};
