//! Where prompts come from: deterministic testbed problems keyed by (seed, stream, index), so a
//! step's data depends only on its index (the data cursor is the step).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use terse_tasks::testbed::{Problem, Teacher};

/// A stable 64-bit mix of the run seed, a stream tag and an index.
pub fn mix(seed: u64, stream: u64, index: u64) -> u64 {
    let mut x = seed
        ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub const SFT: u64 = 1;
pub const TRAIN: u64 = 2;
pub const EVAL: u64 = 3;

/// The level of item `index` of a generated stream: round-robin over `levels`.
pub fn level_at(levels: &[usize], index: u64) -> usize {
    levels[(index % levels.len() as u64) as usize]
}

/// The key of held-out evaluation item `j` of `level` (a stream no training step draws from).
pub fn eval_index(level: usize, j: u64) -> u64 {
    (level as u64) << 32 | j
}

/// Problem `index` of a stream in `teacher`'s testbed, its level drawn round-robin from `levels`.
pub fn problem(seed: u64, stream: u64, index: u64, levels: &[usize], teacher: &Teacher) -> Problem {
    teacher.problem(level_at(levels, index), mix(seed, stream, index))
}

/// The SFT example `index`: a problem and its teacher trace.
pub fn sft_example(
    seed: u64,
    index: u64,
    levels: &[usize],
    teacher: &Teacher,
) -> (Problem, String) {
    let p = problem(seed, SFT, index, levels, teacher);
    let mut rng = ChaCha8Rng::seed_from_u64(mix(seed, SFT + 100, index));
    let trace = teacher.trace(&p, &mut rng).text;
    (p, trace)
}
