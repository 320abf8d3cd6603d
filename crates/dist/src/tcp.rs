//! `TcpGroup`: the CPU backend of [`Collective`](crate::Collective), for tests and CPU runs.
//! Ranks (processes or threads) meet at rank 0's address (the rendezvous: each joiner sends a
//! magic number, its rank and the world size; rank 0 checks them and answers). Every exchange
//! goes through rank 0 (a star): it sums the ranks' buffers in rank order and sends the result
//! back, so every rank holds the same bits. Each read and write has the group's timeout, so a
//! rank that died or hangs makes the others fail with an error naming it, never wait forever.

use crate::{shard_len, Collective};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x7465_7273; // "ters"

/// A group of ranks over loopback (or any) TCP, star-shaped around rank 0.
pub struct TcpGroup {
    rank: usize,
    world: usize,
    /// On rank 0, the stream of rank r at index r - 1; elsewhere, the stream to rank 0.
    peers: Vec<TcpStream>,
}

fn configure(s: &TcpStream, timeout: Duration) -> Result<()> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    Ok(())
}

fn read_u32(s: &mut TcpStream) -> Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

impl TcpGroup {
    /// Rank 0: accepts the other `world - 1` ranks on `listener` within `timeout`.
    pub fn root(listener: TcpListener, world: usize, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        listener.set_nonblocking(true)?;
        let mut slots: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        while slots.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    configure(&s, timeout)?;
                    let (magic, rank, w) = (
                        read_u32(&mut s)?,
                        read_u32(&mut s)? as usize,
                        read_u32(&mut s)? as usize,
                    );
                    if magic != MAGIC
                        || w != world
                        || rank == 0
                        || rank >= world
                        || slots[rank - 1].is_some()
                    {
                        s.write_all(&0u32.to_le_bytes())?;
                        bail!("rendezvous: refused a joiner claiming rank {rank} of {w} (this group: {world} ranks)");
                    }
                    s.write_all(&1u32.to_le_bytes())?;
                    slots[rank - 1] = Some(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        let missing: Vec<usize> =
                            (1..world).filter(|r| slots[r - 1].is_none()).collect();
                        bail!("rendezvous: ranks {missing:?} did not join within {timeout:?}");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e).context("rendezvous: accepting a rank"),
            }
        }
        Ok(Self {
            rank: 0,
            world,
            peers: slots.into_iter().flatten().collect(),
        })
    }

    /// Rank `rank` > 0: joins rank 0 at `addr`, retrying until `timeout`.
    pub fn join(addr: SocketAddr, rank: usize, world: usize, timeout: Duration) -> Result<Self> {
        if rank == 0 || rank >= world {
            bail!("rank {rank} cannot join a group of {world} (rank 0 is the root)");
        }
        let deadline = Instant::now() + timeout;
        let mut s = loop {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("rank {rank}: no rank 0 at {addr} within {timeout:?}")
                    })
                }
            }
        };
        configure(&s, timeout)?;
        for v in [MAGIC, rank as u32, world as u32] {
            s.write_all(&v.to_le_bytes())?;
        }
        if read_u32(&mut s).with_context(|| format!("rank {rank}: no answer from rank 0"))? != 1 {
            bail!("rank {rank}: rank 0 refused it (a duplicate rank or another world size)");
        }
        Ok(Self {
            rank,
            world,
            peers: vec![s],
        })
    }

    /// Runs `f` on every rank of a fresh loopback group of `world` ranks, one thread each (tests,
    /// and CPU runs inside one process); results by rank, a rank that panicked as an error.
    pub fn on_threads<R, F>(world: usize, timeout: Duration, f: F) -> Vec<Result<R>>
    where
        R: Send + 'static,
        F: Fn(TcpGroup) -> Result<R> + Send + Sync + 'static,
    {
        let f = std::sync::Arc::new(f);
        let bound = TcpListener::bind("127.0.0.1:0").and_then(|l| Ok((l.local_addr()?, l)));
        let (addr, listener) = match bound {
            Ok(b) => b,
            Err(e) => {
                return (0..world)
                    .map(|_| Err(anyhow::anyhow!("binding a loopback port: {e}")))
                    .collect()
            }
        };
        let mut listener = Some(listener);
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (f, l) = (std::sync::Arc::clone(&f), listener.take());
                std::thread::spawn(move || {
                    let g = match l {
                        Some(l) => TcpGroup::root(l, world, timeout)?,
                        None => TcpGroup::join(addr, r, world, timeout)?,
                    };
                    f(g)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("rank {r} panicked")))
            })
            .collect()
    }

    /// The stream to rank `r` (on rank 0), or to rank 0 (elsewhere).
    fn stream(&mut self, r: usize) -> &mut TcpStream {
        let i = if self.rank == 0 { r - 1 } else { 0 };
        &mut self.peers[i]
    }

    fn send(&mut self, to: usize, bytes: &[u8]) -> Result<()> {
        let me = self.rank;
        let s = self.stream(to);
        s.write_all(&(bytes.len() as u64).to_le_bytes())
            .and_then(|_| s.write_all(bytes))
            .with_context(|| format!("rank {me}: sending to rank {to} failed (did it stop?)"))
    }

    fn recv(&mut self, from: usize) -> Result<Vec<u8>> {
        let me = self.rank;
        let s = self.stream(from);
        let mut len = [0u8; 8];
        s.read_exact(&mut len).with_context(|| {
            format!(
                "rank {me}: nothing from rank {from} (it stopped, or took longer than the timeout)"
            )
        })?;
        let mut buf = vec![0u8; u64::from_le_bytes(len) as usize];
        s.read_exact(&mut buf)
            .with_context(|| format!("rank {me}: rank {from} stopped mid-message"))?;
        Ok(buf)
    }

    fn recv_vals<T: Elem>(&mut self, from: usize, n: usize) -> Result<Vec<T>> {
        let b = self.recv(from)?;
        if b.len() != T::SIZE * n {
            bail!(
                "rank {}: rank {from} sent {} values, expected {n}",
                self.rank,
                b.len() / T::SIZE
            );
        }
        Ok(b.chunks_exact(T::SIZE).map(T::read).collect())
    }

    /// The sum in rank order, ((b0 + b1) + b2) + ..., on rank 0 (the others send their `buf`
    /// and get None).
    fn sum_at_root<T: Elem>(&mut self, buf: &[T]) -> Result<Option<Vec<T>>> {
        if self.rank != 0 {
            self.send(0, &bytes(buf))?;
            return Ok(None);
        }
        let mut sum = buf.to_vec();
        for r in 1..self.world {
            let v = self.recv_vals::<T>(r, buf.len())?;
            sum.iter_mut().zip(v).for_each(|(a, b)| *a = a.add(b));
        }
        Ok(Some(sum))
    }

    /// Every rank's `buf` replaced by the sum in rank order, through rank 0.
    fn reduce<T: Elem>(&mut self, buf: &mut [T]) -> Result<()> {
        let sum = match self.sum_at_root(buf)? {
            Some(sum) => {
                let out = bytes(&sum);
                (1..self.world).try_for_each(|r| self.send(r, &out))?;
                sum
            }
            None => self.recv_vals::<T>(0, buf.len())?,
        };
        buf.copy_from_slice(&sum);
        Ok(())
    }
}

/// A value the group sends as little-endian bytes and sums.
trait Elem: Copy {
    const SIZE: usize;
    fn write(self, out: &mut Vec<u8>);
    fn read(b: &[u8]) -> Self;
    fn add(self, o: Self) -> Self;
}

impl Elem for f32 {
    const SIZE: usize = 4;
    fn write(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn add(self, o: Self) -> Self {
        self + o
    }
}

impl Elem for f64 {
    const SIZE: usize = 8;
    fn write(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read(b: &[u8]) -> Self {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        f64::from_le_bytes(a)
    }
    fn add(self, o: Self) -> Self {
        self + o
    }
}

fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    v.iter().for_each(|x| x.write(&mut out));
    out
}

impl Collective for TcpGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()> {
        self.reduce(buf)
    }

    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        self.reduce(buf)
    }

    /// The all-reduce's sum (the same rank order, so the same bits), but rank 0 sends each rank
    /// only its part: 1/world of the all-reduce's return traffic.
    fn reduce_scatter_sum(&mut self, parts: &[f32]) -> Result<Vec<f32>> {
        let n = shard_len(parts.len(), self.world)?;
        let Some(mut sum) = self.sum_at_root(parts)? else {
            return self.recv_vals::<f32>(0, n);
        };
        for r in 1..self.world {
            self.send(r, &bytes(&sum[r * n..(r + 1) * n]))?;
        }
        sum.truncate(n);
        Ok(sum)
    }

    fn all_gather(&mut self, part: &[f32]) -> Result<Vec<f32>> {
        let n = part.len();
        if self.rank != 0 {
            self.send(0, &bytes(part))?;
            return self.recv_vals::<f32>(0, n * self.world);
        }
        let mut all = part.to_vec();
        for r in 1..self.world {
            all.extend(self.recv_vals::<f32>(r, n)?);
        }
        shard_len(all.len(), self.world)?;
        let out = bytes(&all);
        (1..self.world).try_for_each(|r| self.send(r, &out))?;
        Ok(all)
    }

    fn broadcast(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        if root >= self.world {
            bail!("broadcast from rank {root} in a group of {}", self.world);
        }
        match (self.rank, root) {
            (0, _) => {
                if root != 0 {
                    *buf = self.recv(root)?;
                }
                let b = buf.clone();
                (1..self.world)
                    .filter(|&r| r != root)
                    .try_for_each(|r| self.send(r, &b))
            }
            (me, r) if me == r => self.send(0, buf),
            _ => {
                *buf = self.recv(0)?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Single;

    const T: Duration = Duration::from_secs(10);

    /// Runs `f` on every rank of a fresh loopback group (threads), results by rank.
    fn group<R: Send + 'static>(
        world: usize,
        f: fn(&mut dyn Collective) -> Result<R>,
    ) -> Vec<Result<R>> {
        TcpGroup::on_threads(world, T, move |mut g| f(&mut g))
    }

    fn data(rank: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.1 + 1e-7 * rank as f32)
            .collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_and_every_rank_holds_the_same_bits() {
        for world in [1usize, 2, 4] {
            let out = group(world, |g| {
                let mut v = data(g.rank(), 100);
                g.all_reduce_sum(&mut v)?;
                let mut d = [g.rank() as f64, 1e-12];
                g.all_reduce_sum_f64(&mut d)?;
                let w = g.world() as f64;
                anyhow::ensure!(d == [w * (w - 1.0) / 2.0, w * 1e-12], "f64 sums {d:?}");
                Ok(v)
            });
            let mut want = data(0, 100);
            for r in 1..world {
                want.iter_mut().zip(data(r, 100)).for_each(|(a, b)| *a += b);
            }
            for (r, got) in out.into_iter().enumerate() {
                let got = got.expect("rank");
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "world {world} rank {r}"
                );
            }
        }
    }

    #[test]
    fn reduce_scatter_all_gather_and_broadcast_compose() {
        let out = group(4, |g| {
            let parts = data(g.rank(), 8); // 4 parts of 2
            let mine = g.reduce_scatter_sum(&parts)?;
            let all = g.all_gather(&mine)?;
            let mut reduced = data(g.rank(), 8);
            g.all_reduce_sum(&mut reduced)?;
            let mut msg = if g.rank() == 2 {
                b"from two".to_vec()
            } else {
                vec![]
            };
            g.broadcast(&mut msg, 2)?;
            // Records of a different length per rank.
            let records = g.all_gather_bytes(vec![g.rank() as u8; g.rank()])?;
            Ok((all, reduced, msg, records))
        });
        for o in out {
            let (all, reduced, msg, records) = o.expect("rank");
            assert_eq!(all, reduced, "reduce-scatter + all-gather = all-reduce");
            assert_eq!(msg, b"from two");
            assert_eq!(records, [vec![], vec![1], vec![2, 2], vec![3, 3, 3]]);
        }
        let mut one = Single;
        assert_eq!(
            one.reduce_scatter_sum(&[1.0, 2.0]).expect("single"),
            [1.0, 2.0]
        );
        assert!(shard_len(10, 4).is_err());
    }

    #[test]
    fn a_rank_that_stops_fails_the_others_with_its_name_and_nobody_hangs() {
        let out = group(3, |g| {
            if g.rank() == 2 {
                return Ok(()); // leaves without taking part: its stream closes
            }
            let mut v = vec![1.0; 4];
            g.all_reduce_sum(&mut v)
        });
        let e = format!("{:#}", out[0].as_ref().expect_err("rank 0 must fail"));
        assert!(e.contains("rank 2"), "{e}");
        assert!(out[1].is_err(), "rank 1 is not left waiting");
        // Nobody at the address: an error after the timeout, naming the rank.
        let free = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr");
        let e = TcpGroup::join(free, 1, 2, Duration::from_millis(200))
            .err()
            .expect("no root");
        assert!(format!("{e:#}").contains("rank 1"), "{e:#}");
        // A root whose ranks never come.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let e = TcpGroup::root(l, 3, Duration::from_millis(100))
            .err()
            .expect("nobody joined");
        assert!(e.to_string().contains("[1, 2]"), "{e}");
    }
}
