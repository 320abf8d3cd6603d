//! What a power loss can leave of a recorded `terse_model::disk` tape: ALICE's abstract
//! persistence model (Pillai et al., OSDI 2014), used by crash_consistency.rs.
//!
//! The tape is first replayed on a volatile namespace to tie every path to a node (an inode):
//! a file's data operations (create-or-truncate of an existing file, writes) belong to its node,
//! its entry operations (create, mkdir, rename, unlink, rmdir) to the directory holding the
//! entry. Then, for a crash after the first `p` operations:
//! - a data operation is durable once its node was fsynced after it;
//! - an entry operation once its parent directory was fsynced after it (a rename: both
//!   parents);
//! - every operation not yet durable may be lost, independently of the others, and a lost
//!   write may also have reached the disk in part (a prefix: half of it, or all but its last
//!   byte, the cuts that tear a line or leave it without its newline).
//!
//! The states are enumerated exhaustively in that sense: every prefix, and for each prefix
//! every combination of outcomes of its not-yet-durable operations (drop or keep each entry
//! operation; drop, keep or tear each write). The only bound is the number of torn lengths per
//! write (two), and it is sound for the writers checked: each either fsyncs before anything
//! depends on the write (so any tear is the same as any other: not durable, never read) or
//! appends a line, where the two cuts are the two kinds of torn line (no valid JSON, and valid
//! JSON without its newline). The number of combinations is the product of the outcomes per
//! operation. Past `MAX_PER_PREFIX` combinations (a writer that leaves many operations
//! undurable at once, such as one that never fsyncs), `states` draws that many with a fixed
//! seed instead and says so; the test requires the writers checked never need it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use terse_model::disk::Op;

pub type Node = usize;

/// A file's content: the writes that reached it (index on the tape, bytes kept), in order,
/// and its size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Content {
    pub writes: Vec<(usize, usize)>,
    pub len: u64,
}

impl Content {
    /// The bytes, from the tape's writes.
    pub fn bytes(&self, tape: &[Op]) -> Vec<u8> {
        let mut out = vec![0u8; self.len as usize];
        for &(i, kept) in &self.writes {
            let Op::Write { offset, bytes, .. } = &tape[i] else {
                unreachable!("content from a write")
            };
            let at = *offset as usize;
            out[at..at + kept].copy_from_slice(&bytes[..kept]);
        }
        out
    }
}

/// One tape operation tied to nodes.
#[derive(Debug, Clone)]
enum Act {
    Link {
        parent: Node,
        name: String,
        node: Node,
    },
    Truncate(Node),
    Write {
        node: Node,
        tape: usize,
        offset: u64,
        len: usize,
    },
    Fsync(Node),
    Rename {
        from: (Node, String),
        to: (Node, String),
        node: Node,
    },
    Unlink {
        parent: Node,
        name: String,
        node: Node,
    },
}

/// A namespace: each directory node's entries; each file node's content.
#[derive(Debug, Clone, Default)]
struct Fs {
    dirs: HashMap<Node, BTreeMap<String, Node>>,
    files: HashMap<Node, Content>,
}

/// What a visible path holds after a crash.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    Dir,
    File(Content),
}

/// A crash state: every path under the root (relative) with what it holds, sorted.
pub type State = Vec<(PathBuf, Entry)>;

/// The tape tied to nodes, ready to enumerate crash states.
pub struct Model {
    acts: Vec<Act>,
    /// For each act, the prefix length from which it is durable (`usize::MAX`: never).
    durable_from: Vec<usize>,
    /// The nodes that are directories.
    dir_nodes: HashSet<Node>,
}

pub const MAX_PER_PREFIX: usize = 1 << 12;

const ROOT: Node = 0;

impl Model {
    /// Ties `tape` (every path under `root`, which exists and is durable) to nodes.
    pub fn new(root: &Path, tape: &[Op]) -> Model {
        let mut fs = Fs::default();
        fs.dirs.insert(ROOT, BTreeMap::new());
        let mut next = 1;
        let split = |p: &Path| -> (Vec<String>, String) {
            let rel = p.strip_prefix(root).expect("a path under the root");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let name = parts.pop().expect("not the root itself");
            (parts, name)
        };
        let walk =
            |fs: &Fs, parts: &[String]| -> Node { parts.iter().fold(ROOT, |n, c| fs.dirs[&n][c]) };
        let lookup = |fs: &Fs, p: &Path| -> Node {
            if p == root {
                return ROOT;
            }
            let (parts, name) = split(p);
            fs.dirs[&walk(fs, &parts)][&name]
        };
        let mut acts = vec![];
        let mut dir_nodes = HashSet::from([ROOT]);
        for (i, op) in tape.iter().enumerate() {
            let act = match op {
                Op::Mkdir(p) | Op::Create(p) => {
                    let (parts, name) = split(p);
                    let parent = walk(&fs, &parts);
                    match fs.dirs[&parent].get(&name) {
                        Some(&node) if matches!(op, Op::Create(_)) => Act::Truncate(node),
                        Some(_) => panic!("{}: mkdir of an existing path", p.display()),
                        None => {
                            let node = next;
                            next += 1;
                            Act::Link { parent, name, node }
                        }
                    }
                }
                Op::Write {
                    path,
                    offset,
                    bytes,
                } => Act::Write {
                    node: lookup(&fs, path),
                    tape: i,
                    offset: *offset,
                    len: bytes.len(),
                },
                Op::Fsync(p) => Act::Fsync(lookup(&fs, p)),
                Op::Rename { from, to } => {
                    let (fp, fname) = split(from);
                    let (tp, tname) = split(to);
                    let (fp, tp) = (walk(&fs, &fp), walk(&fs, &tp));
                    let node = fs.dirs[&fp][&fname];
                    Act::Rename {
                        from: (fp, fname),
                        to: (tp, tname),
                        node,
                    }
                }
                Op::Remove(p) | Op::Rmdir(p) => {
                    let (parts, name) = split(p);
                    let parent = walk(&fs, &parts);
                    let node = fs.dirs[&parent][&name];
                    Act::Unlink { parent, name, node }
                }
            };
            if let (Op::Mkdir(_), Act::Link { node, .. }) = (op, &act) {
                dir_nodes.insert(*node);
            }
            apply(&mut fs, &dir_nodes, &act, None);
            acts.push(act);
        }
        // The first later fsync of each node, for the durability of what came before it.
        let mut durable_from = vec![usize::MAX; acts.len()];
        for (i, a) in acts.iter().enumerate() {
            let after = |n: Node| -> usize {
                (i + 1..acts.len())
                    .find(|&j| matches!(acts[j], Act::Fsync(m) if m == n))
                    .map_or(usize::MAX, |j| j + 1)
            };
            durable_from[i] = match a {
                Act::Link { parent, .. } | Act::Unlink { parent, .. } => after(*parent),
                Act::Rename { from, to, .. } => after(from.0).max(after(to.0)),
                Act::Truncate(n) | Act::Write { node: n, .. } => after(*n),
                Act::Fsync(_) => 0,
            };
        }
        Model {
            acts,
            durable_from,
            dir_nodes,
        }
    }

    pub fn len(&self) -> usize {
        self.acts.len()
    }

    /// The outcomes a crash after `p` operations may give act `i`: `None` lost, `Some(len)`
    /// kept with `len` bytes (whole for anything but a torn write).
    fn outcomes(&self, i: usize, p: usize) -> Vec<Option<usize>> {
        if self.durable_from[i] <= p {
            return vec![Some(usize::MAX)];
        }
        match &self.acts[i] {
            Act::Fsync(_) => vec![Some(usize::MAX)],
            Act::Write { len, .. } => {
                let mut cuts = vec![None, Some(usize::MAX)];
                for c in [len / 2, len.saturating_sub(1)] {
                    if c > 0 && c < *len && !cuts.contains(&Some(c)) {
                        cuts.push(Some(c));
                    }
                }
                cuts
            }
            _ => vec![None, Some(usize::MAX)],
        }
    }

    /// The number of outcome combinations of a crash after `p` operations.
    pub fn combinations(&self, p: usize) -> usize {
        (0..p).fold(1usize, |n, i| n.saturating_mul(self.outcomes(i, p).len()))
    }

    /// Calls `f` with every crash state after `p` operations (one per combination of outcomes;
    /// the same state may come more than once); returns false when there were more than
    /// `MAX_PER_PREFIX` and that many were drawn instead (seeded: the same ones every run).
    pub fn states(&self, p: usize, mut f: impl FnMut(State)) -> bool {
        let n = self.combinations(p);
        let outcomes: Vec<Vec<Option<usize>>> = (0..p).map(|i| self.outcomes(i, p)).collect();
        // Everything before the first undecided act is the same in every state: replayed once.
        let first = outcomes.iter().position(|o| o.len() > 1).unwrap_or(p);
        let mut base = Fs::default();
        base.dirs.insert(ROOT, BTreeMap::new());
        for a in &self.acts[..first] {
            apply(&mut base, &self.dir_nodes, a, None);
        }
        let mut pick = vec![0usize; p];
        if n > MAX_PER_PREFIX {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ p as u64;
            for _ in 0..MAX_PER_PREFIX {
                let mut fs = base.clone();
                for i in first..p {
                    // xorshift64: a fixed sequence of draws.
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let o = &outcomes[i][(seed % outcomes[i].len() as u64) as usize];
                    if let Some(kept) = *o {
                        apply(&mut fs, &self.dir_nodes, &self.acts[i], Some(kept));
                    }
                }
                f(visible(&fs, &self.dir_nodes));
            }
            return false;
        }
        loop {
            let mut fs = base.clone();
            for i in first..p {
                if let Some(kept) = outcomes[i][pick[i]] {
                    apply(&mut fs, &self.dir_nodes, &self.acts[i], Some(kept));
                }
            }
            f(visible(&fs, &self.dir_nodes));
            // The next combination, as an odometer over the undecided acts.
            let mut i = first;
            loop {
                if i == p {
                    return true;
                }
                pick[i] += 1;
                if pick[i] < outcomes[i].len() {
                    break;
                }
                pick[i] = 0;
                i += 1;
            }
        }
    }
}

/// One act on a namespace; a write keeps `kept` bytes (all with `None` or `usize::MAX`). A
/// directory exists as soon as anything links into it or it is linked somewhere: an entry made
/// durable inside a directory whose own creation was lost is still there if a later rename
/// links the directory.
fn apply(fs: &mut Fs, dir_nodes: &HashSet<Node>, act: &Act, kept: Option<usize>) {
    match act {
        Act::Link { parent, name, node } => {
            fs.dirs
                .entry(*parent)
                .or_default()
                .insert(name.clone(), *node);
            if dir_nodes.contains(node) {
                fs.dirs.entry(*node).or_default();
            } else {
                fs.files.entry(*node).or_default();
            }
        }
        Act::Truncate(n) => {
            fs.files.insert(*n, Content::default());
        }
        Act::Write {
            node,
            tape,
            offset,
            len,
        } => {
            let kept = kept.map_or(*len, |k| k.min(*len));
            let c = fs.files.entry(*node).or_default();
            c.writes.push((*tape, kept));
            c.len = c.len.max(offset + kept as u64);
        }
        Act::Fsync(_) => {}
        Act::Rename { from, to, node } => {
            let d = fs.dirs.entry(from.0).or_default();
            if d.get(&from.1) == Some(node) {
                d.remove(&from.1);
            }
            fs.dirs.entry(to.0).or_default().insert(to.1.clone(), *node);
        }
        Act::Unlink { parent, name, node } => {
            let d = fs.dirs.entry(*parent).or_default();
            if d.get(name) == Some(node) {
                d.remove(name);
            }
        }
    }
}

/// Every path reachable from the root, with what it holds.
fn visible(fs: &Fs, dir_nodes: &HashSet<Node>) -> State {
    fn walk(fs: &Fs, dir_nodes: &HashSet<Node>, dir: Node, at: &Path, out: &mut State) {
        let Some(entries) = fs.dirs.get(&dir) else {
            return;
        };
        for (name, &node) in entries {
            let p = at.join(name);
            if dir_nodes.contains(&node) {
                out.push((p.clone(), Entry::Dir));
                walk(fs, dir_nodes, node, &p, out);
            } else {
                let c = fs.files.get(&node).cloned().unwrap_or_default();
                out.push((p, Entry::File(c)));
            }
        }
    }
    let mut out = vec![];
    walk(fs, dir_nodes, ROOT, Path::new(""), &mut out);
    out
}

impl Model {
    /// The namespace after the first `p` operations with nothing lost (no crash).
    pub fn volatile(&self, p: usize) -> State {
        let mut fs = Fs::default();
        fs.dirs.insert(ROOT, BTreeMap::new());
        for a in &self.acts[..p] {
            apply(&mut fs, &self.dir_nodes, a, None);
        }
        visible(&fs, &self.dir_nodes)
    }
}

/// The model itself, on hand-written tapes: what it must allow and what it must not.
mod tests {
    use super::*;

    fn write(p: &str, bytes: &[u8]) -> Op {
        Op::Write {
            path: PathBuf::from(p),
            offset: 0,
            bytes: bytes.to_vec(),
        }
    }

    /// The states after the whole tape, each as (path, bytes or None for a directory).
    fn ends(tape: &[Op]) -> HashSet<Vec<(PathBuf, Option<Vec<u8>>)>> {
        let m = Model::new(Path::new("/r"), tape);
        let mut out = HashSet::new();
        let all = m.states(m.len(), |s| {
            out.insert(
                s.into_iter()
                    .map(|(p, e)| match e {
                        Entry::Dir => (p, None),
                        Entry::File(c) => (p, Some(c.bytes(tape))),
                    })
                    .collect(),
            );
        });
        assert!(all, "enumerated, not drawn");
        out
    }

    fn state(files: &[(&str, &[u8])]) -> Vec<(PathBuf, Option<Vec<u8>>)> {
        files
            .iter()
            .map(|(p, b)| (PathBuf::from(p), Some(b.to_vec())))
            .collect()
    }

    /// A rename made durable over a file whose data was not fsynced may leave it empty or
    /// torn; with the file fsynced first, only the whole content.
    #[test]
    fn a_rename_before_the_data_is_synced_can_publish_an_empty_file() {
        let base = [Op::Create("/r/a.tmp".into()), write("/r/a.tmp", b"line\n")];
        let rename = [
            Op::Rename {
                from: "/r/a.tmp".into(),
                to: "/r/a".into(),
            },
            Op::Fsync("/r".into()),
        ];
        let unsynced: Vec<Op> = base.iter().chain(&rename).cloned().collect();
        let got = ends(&unsynced);
        for (bytes, must) in [
            (&b""[..], true),
            (b"li", true),
            (b"line", true),
            (b"line\n", true),
        ] {
            assert_eq!(got.contains(&state(&[("a", bytes)])), must, "{bytes:?}");
        }
        assert_eq!(got.len(), 4);
        let mut synced: Vec<Op> = base.to_vec();
        synced.push(Op::Fsync("/r/a.tmp".into()));
        synced.extend(rename);
        let got = ends(&synced);
        assert_eq!(got, HashSet::from([state(&[("a", b"line\n")])]));
    }

    /// A new file's entry is durable only once its directory is fsynced, whatever the file's
    /// own fsync; a removal likewise; a durable write survives a lost earlier one as a hole.
    #[test]
    fn entries_need_the_directory_fsync() {
        let tape = [
            Op::Create("/r/f".into()),
            write("/r/f", b"ab"),
            Op::Fsync("/r/f".into()),
        ];
        let got = ends(&tape);
        assert_eq!(
            got,
            HashSet::from([vec![], state(&[("f", b"ab")])]),
            "the file or nothing"
        );
        let mut then = tape.to_vec();
        then.extend([
            Op::Fsync("/r".into()),
            Op::Write {
                path: "/r/f".into(),
                offset: 2,
                bytes: b"cd".to_vec(),
            },
            Op::Write {
                path: "/r/f".into(),
                offset: 4,
                bytes: b"ef".to_vec(),
            },
            Op::Remove("/r/f".into()),
        ]);
        let got = ends(&then);
        assert!(got.contains(&vec![]), "the removal kept");
        assert!(got.contains(&state(&[("f", b"ab\0\0ef")])), "a hole");
        assert!(!got
            .iter()
            .any(|s| s.iter().any(|(_, b)| b.as_deref() == Some(b""))));
    }
}
