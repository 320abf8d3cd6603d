//! The seeded mutator: input `i` of a target is a function of (seed, target, i) alone, so the
//! parent process regenerates the input a child crashed on from its index, and a finding
//! replays on any machine. Byte-level operations (bit flips, byte and chunk edits, splices
//! between corpus entries) and structure-aware ones (numbers swapped for edge values, tokens of
//! the target's dictionary, deep nesting, long runs, line edits), stacked 1 to 16 deep.

use crate::corpus::{Entry, Input};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Numbers parsers mishandle: overflow at every integer width, floats out of range or
/// subnormal, the non-finite spellings of TOML / JSON / Python, signs and odd radices.
pub const INTERESTING: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1e309",
    "-1e309",
    "1e-400",
    "5e-324",
    "1.7976931348623157e308",
    "NaN",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "255",
    "256",
    "65536",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "99999999999999999999999999999999999999999999999999",
    "0x7fffffff",
    "0b1",
    "1_000",
    "1e1000000",
    "10^1000",
    "9^9^9^9",
    "1/0",
    "0/0",
    "00000000000000000001",
];

/// Openers that make recursive parsers recurse: repeated up to 32768 times.
const OPENERS: &[&str] = &[
    "[", "{", "(", "[[", "{\"a\":", "[{", "\\frac{", "\\sqrt{", "{{", "-", "^", "\\left(", "a.",
];

/// Bytes that end strings, escape, open structures or break UTF-8.
const SPECIAL_BYTES: &[u8] = &[
    0, b'"', b'\'', b'\\', b'{', b'}', b'[', b']', b'\n', b'\r', b'=', b',', b':', b'#', 0x7f,
    0x80, 0xc3, 0xe2, 0xf0, 0xff,
];

/// Lengths of nesting and of long runs.
const DEPTHS: &[usize] = &[8, 64, 512, 4096, 32768];
const RUNS: &[usize] = &[256, 4096, 65536];

/// The per-input random stream: (seed, target, index) mixed by splitmix64, so neighbouring
/// indices and seeds give unrelated streams.
pub fn input_rng(seed: u64, target: &str, index: u64) -> ChaCha8Rng {
    let name = target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut x = seed ^ name.rotate_left(17) ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ChaCha8Rng::seed_from_u64(x ^ (x >> 31))
}

/// A target's corpus and dictionary, and the input size it truncates to.
#[derive(Debug)]
pub struct Mutator<'a> {
    pub corpus: &'a [Entry],
    pub dictionary: &'a [String],
    pub max_len: usize,
}

impl Mutator<'_> {
    /// Input `index`: the corpus entries unchanged first (each seed is run as it is), then
    /// mutants of a randomly chosen entry.
    pub fn input(&self, target: &str, seed: u64, index: u64) -> Input {
        let n = self.corpus.len() as u64;
        if index < n {
            let e = &self.corpus[index as usize];
            return Input {
                name: e.name.clone(),
                bytes: e.bytes.clone(),
            };
        }
        let mut rng = input_rng(seed, target, index);
        let e = &self.corpus[rng.random_range(0..self.corpus.len())];
        let bytes = if e.name.ends_with(".safetensors") && rng.random_bool(0.7) {
            self.mutate_safetensors(&mut rng, &e.bytes)
        } else {
            self.mutate(&mut rng, &e.bytes)
        };
        Input {
            name: e.name.clone(),
            bytes,
        }
    }

    /// 1 to 16 stacked mutations of `bytes`, truncated to `max_len`.
    pub fn mutate(&self, rng: &mut ChaCha8Rng, bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        let mut rounds = 1;
        while rounds < 16 && rng.random_bool(0.5) {
            rounds += 1;
        }
        for _ in 0..rounds {
            self.mutate_once(rng, &mut out);
            out.truncate(self.max_len);
        }
        out
    }

    /// A safetensors file is an 8-byte header length, a JSON header and the data: most raw
    /// edits of the header only break that length, so the header is mutated as text and
    /// usually re-framed with its true length (else the length is left or set to an edge value).
    fn mutate_safetensors(&self, rng: &mut ChaCha8Rng, bytes: &[u8]) -> Vec<u8> {
        let Some(len) = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .filter(|&l| l <= (bytes.len() - 8) as u64)
        else {
            return self.mutate(rng, bytes);
        };
        let (header, data) = bytes[8..].split_at(len as usize);
        let header = self.mutate(rng, header);
        let framed = match rng.random_range(0..10u32) {
            0 => len,
            1 => {
                [0, 1, u64::MAX, u64::MAX / 2, 1 << 32, bytes.len() as u64][rng.random_range(0..6)]
            }
            _ => header.len() as u64,
        };
        let mut out = framed.to_le_bytes().to_vec();
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.truncate(self.max_len);
        out
    }

    fn pos(rng: &mut ChaCha8Rng, out: &[u8]) -> usize {
        rng.random_range(0..=out.len())
    }

    fn token<'t>(&'t self, rng: &mut ChaCha8Rng) -> &'t str {
        if self.dictionary.is_empty() || rng.random_bool(0.2) {
            INTERESTING[rng.random_range(0..INTERESTING.len())]
        } else {
            &self.dictionary[rng.random_range(0..self.dictionary.len())]
        }
    }

    fn other_entry(&self, rng: &mut ChaCha8Rng) -> &[u8] {
        &self.corpus[rng.random_range(0..self.corpus.len())].bytes
    }

    /// One mutation, chosen uniformly among the operations.
    fn mutate_once(&self, rng: &mut ChaCha8Rng, out: &mut Vec<u8>) {
        match rng.random_range(0..15u32) {
            // Bit flip.
            0 if !out.is_empty() => {
                let i = rng.random_range(0..out.len());
                out[i] ^= 1 << rng.random_range(0..8);
            }
            // A special or random byte inserted.
            1 => {
                let b = if rng.random_bool(0.7) {
                    SPECIAL_BYTES[rng.random_range(0..SPECIAL_BYTES.len())]
                } else {
                    rng.random()
                };
                let p = Self::pos(rng, out);
                out.insert(p, b);
            }
            // A byte replaced.
            2 if !out.is_empty() => {
                let i = rng.random_range(0..out.len());
                out[i] = if rng.random_bool(0.5) {
                    SPECIAL_BYTES[rng.random_range(0..SPECIAL_BYTES.len())]
                } else {
                    rng.random()
                };
            }
            // A range deleted (short, or up to a quarter of the input).
            3 if !out.is_empty() => {
                let a = rng.random_range(0..out.len());
                let max = if rng.random_bool(0.7) {
                    8
                } else {
                    out.len() / 4 + 1
                };
                let b = (a + rng.random_range(1..=max)).min(out.len());
                out.drain(a..b);
            }
            // A chunk duplicated somewhere else.
            4 if !out.is_empty() => {
                let a = rng.random_range(0..out.len());
                let b = (a + rng.random_range(1..=64)).min(out.len());
                let chunk = out[a..b].to_vec();
                let p = Self::pos(rng, out);
                out.splice(p..p, chunk);
            }
            // A chunk of another corpus entry inserted or written over this one.
            5 => {
                let other = self.other_entry(rng);
                if !other.is_empty() {
                    let a = rng.random_range(0..other.len());
                    let b = (a + rng.random_range(1..=256)).min(other.len());
                    let p = Self::pos(rng, out);
                    let end = if rng.random_bool(0.5) {
                        p
                    } else {
                        (p + b - a).min(out.len())
                    };
                    out.splice(p..end, other[a..b].iter().copied());
                }
            }
            // Crossover: this entry's head, another's tail.
            6 => {
                let other = self.other_entry(rng).to_vec();
                let p = Self::pos(rng, out);
                out.truncate(p);
                let q = rng.random_range(0..=other.len());
                out.extend_from_slice(&other[q..]);
            }
            // A number replaced by an edge value.
            7 => {
                let starts: Vec<usize> = (0..out.len())
                    .filter(|&i| {
                        out[i].is_ascii_digit() && (i == 0 || !out[i - 1].is_ascii_digit())
                    })
                    .collect();
                if starts.is_empty() {
                    return;
                }
                let a = starts[rng.random_range(0..starts.len())];
                let b = a + out[a..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E'))
                    .count();
                let v = INTERESTING[rng.random_range(0..INTERESTING.len())];
                out.splice(a..b, v.bytes());
            }
            // A dictionary token (or an edge value) inserted.
            8 | 9 => {
                let t = self.token(rng).as_bytes().to_vec();
                let p = Self::pos(rng, out);
                out.splice(p..p, t);
            }
            // One occurrence of a dictionary token replaced by another token.
            10 => {
                let from = self.token(rng).as_bytes().to_vec();
                let to = self.token(rng).as_bytes().to_vec();
                if let Some(i) = find(out, &from) {
                    out.splice(i..i + from.len(), to);
                }
            }
            // Deep nesting, closed in reverse half the time.
            11 => {
                let open = if rng.random_bool(0.5) {
                    OPENERS[rng.random_range(0..OPENERS.len())]
                } else {
                    self.token(rng)
                };
                let depth = DEPTHS[rng.random_range(0..DEPTHS.len())];
                let mut nest = open.repeat(depth).into_bytes();
                if rng.random_bool(0.5) {
                    let close: String = open.chars().rev().filter_map(closer).collect();
                    nest.extend(close.repeat(depth).bytes());
                }
                let p = Self::pos(rng, out);
                out.splice(p..p, nest);
            }
            // A long run of one byte or one token.
            12 => {
                let len = RUNS[rng.random_range(0..RUNS.len())];
                let run = if rng.random_bool(0.5) {
                    vec![b"a0 9\"\\\n"[rng.random_range(0..7)]; len]
                } else {
                    let t = self.token(rng);
                    t.repeat(len / t.len().max(1)).into_bytes()
                };
                let p = Self::pos(rng, out);
                out.splice(p..p, run);
            }
            // Line edits: duplicate, delete or swap lines (JSONL rows, TOML keys).
            13 => line_edit(rng, out),
            // A cut: a torn last line or a truncated file.
            14 => {
                let p = Self::pos(rng, out);
                out.truncate(p);
            }
            _ => {}
        }
    }
}

/// The bracket that closes `c`, when it opens one.
fn closer(c: char) -> Option<char> {
    match c {
        '[' => Some(']'),
        '{' => Some('}'),
        '(' => Some(')'),
        _ => None,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn line_edit(rng: &mut ChaCha8Rng, out: &mut Vec<u8>) {
    let mut lines: Vec<Vec<u8>> = out.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    let i = rng.random_range(0..lines.len());
    match rng.random_range(0..3u32) {
        0 => {
            let copies = if rng.random_bool(0.9) { 1 } else { 100 };
            for _ in 0..copies {
                lines.insert(i, lines[i].clone());
            }
        }
        1 if lines.len() > 1 => {
            lines.remove(i);
        }
        _ => {
            let j = rng.random_range(0..lines.len());
            lines.swap(i, j);
        }
    }
    *out = lines.join(&b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<Entry> {
        vec![
            Entry {
                name: "a.jsonl".into(),
                bytes: br#"{"phase": "grpo", "step": 12, "loss": 0.5}"#.to_vec(),
            },
            Entry {
                name: "b.toml".into(),
                bytes: b"[grpo]\ngroup_size = 6\nclip_high = 0.28\n".to_vec(),
            },
        ]
    }

    /// A finding replays from its index: input i is the same whatever was generated before it,
    /// and another seed or target gives other inputs.
    #[test]
    fn an_input_is_a_function_of_seed_target_and_index() {
        let corpus = corpus();
        let dictionary = vec!["\\frac{".to_string(), "[model.lora]".to_string()];
        let m = Mutator {
            corpus: &corpus,
            dictionary: &dictionary,
            max_len: 1 << 12,
        };
        let forward: Vec<Input> = (0..400).map(|i| m.input("t", 7, i)).collect();
        let mut backward: Vec<Input> = (0..400).rev().map(|i| m.input("t", 7, i)).collect();
        backward.reverse();
        assert_eq!(forward, backward);
        assert_eq!(
            (&forward[0].bytes, &forward[1].name),
            (&corpus[0].bytes, &corpus[1].name)
        );
        let differ = |other: Vec<Input>| {
            forward
                .iter()
                .zip(&other)
                .skip(2)
                .filter(|(a, b)| a != b)
                .count()
        };
        assert!(differ((0..400).map(|i| m.input("t", 8, i)).collect()) > 350);
        assert!(differ((0..400).map(|i| m.input("u", 7, i)).collect()) > 350);
        let mutated = forward[2..]
            .iter()
            .filter(|x| corpus.iter().all(|e| e.bytes != x.bytes))
            .count();
        assert!(mutated > 350, "{mutated} of 398 inputs are mutants");
        assert!(forward.iter().all(|x| x.bytes.len() <= 1 << 12));
        // The structure-aware operations show up: an edge value, a dictionary token.
        let text: Vec<String> = forward
            .iter()
            .map(|x| String::from_utf8_lossy(&x.bytes).into_owned())
            .collect();
        assert!(text.iter().any(|t| t.contains("\\frac{\\frac{")), "nesting");
        assert!(text.iter().any(|t| t.contains("1e309")), "edge values");
    }

    /// A safetensors seed's mutants mostly keep a header length that frames the mutated header.
    #[test]
    fn safetensors_mutants_are_reframed() {
        let header = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        file.extend_from_slice(&[0, 0, 128, 63]);
        let corpus = [Entry {
            name: "m.safetensors".into(),
            bytes: file,
        }];
        let m = Mutator {
            corpus: &corpus,
            dictionary: &[],
            max_len: 1 << 16,
        };
        let framed = (1..300)
            .map(|i| m.input("t", 0, i).bytes)
            .filter(|b| {
                let n = b
                    .get(..8)
                    .and_then(|h| h.try_into().ok())
                    .map_or(u64::MAX, u64::from_le_bytes);
                // The header's end is where the length says: the data follows it unchanged.
                n < b.len() as u64 && b.ends_with(&[0, 0, 128, 63]) && b.len() as u64 == 8 + n + 4
            })
            .count();
        assert!(framed > 100, "{framed} of 299 reframed");
    }
}
