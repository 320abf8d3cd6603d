//! terse-fuzz: fuzz targets for every parser terse reads user files and model output with, on
//! the stable toolchain (no libFuzzer, no nightly). A seeded mutator (mutate.rs) turns each
//! target's committed seed corpus (corpus/<target>/, real files: fixtures, configs, a run
//! directory) into inputs that are a function of (seed, target, index) alone. The bin runs
//! every target in child processes (child.rs) under a hang watchdog and a memory ceiling
//! (limits.rs), and the parent (harness.rs) saves each finding's input to
//! target/fuzz-findings/<target>/. seeds.rs writes the generated part of the corpus.
//!
//! Data flow: corpus + dictionary -> `Mutator::input(target, seed, i)` -> the target's parser
//! calls (targets/) in the child -> protocol lines -> the parent's findings.

pub mod child;
pub mod corpus;
pub mod harness;
pub mod limits;
pub mod mutate;
pub mod seeds;
pub mod targets;

pub use corpus::{Entry, Input, Kind};
pub use harness::{Finding, Options, Report};
pub use targets::Target;
