//! Tests of the paged KV cache (mod.rs) and `forward_paged` (forward.rs): block-table
//! bookkeeping, the CPU step against the preallocated cache and the composite reference, chunked
//! prefill against token-by-token decoding, and independence from the other sequences.

use crate::paged::forward::PagedPath;
use crate::{BlockTable, Config, PagedKvCache, PagedSeq, Qwen3};
use candle_core::{DType, Device, Tensor};

fn model(head_dim: usize) -> Qwen3 {
    let cfg = Config::synthetic(48, 64, 96, 2, 4, 2, head_dim, true).expect("config");
    Qwen3::random(cfg, 7, &Device::Cpu, DType::F32).expect("model")
}

/// `model`'s shape as Qwen2 (q/k/v biases, no q/k norm).
fn qwen2(head_dim: usize) -> Qwen3 {
    let cfg = Config::synthetic(48, 64, 96, 2, 4, 2, head_dim, true)
        .and_then(|c| c.as_qwen2())
        .expect("config");
    Qwen3::random(cfg, 7, &Device::Cpu, DType::F32).expect("model")
}

fn tokens(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|j| ((salt * 5 + j * 3) % 47 + 1) as u32)
        .collect()
}

/// Feeds `seq` in chunks of `chunk` tokens through a fresh table; returns the logits after
/// each chunk's last token.
fn feed(
    m: &Qwen3,
    path: PagedPath,
    cache: &mut PagedKvCache,
    seq: &[u32],
    chunk: usize,
) -> (BlockTable, Vec<Vec<f32>>) {
    let snap = m.decode_weights();
    let mut t = BlockTable::default();
    let mut out = vec![];
    for part in seq.chunks(chunk) {
        assert!(cache.reserve(&mut t, part.len()).expect("reserve"));
        let mut s = [PagedSeq {
            table: &mut t,
            tokens: part,
        }];
        let l = m
            .forward_paged_with(path, &snap, cache, &mut s)
            .expect("forward");
        out.push(
            l.flatten_all()
                .expect("flat")
                .to_vec1::<f32>()
                .expect("vec"),
        );
    }
    (t, out)
}

#[test]
fn block_tables_share_copy_on_write_and_free() {
    let mut c = PagedKvCache::new(1, 1, 16, 16, 8, DType::F32, &Device::Cpu).expect("cache");
    let mut a = BlockTable::default();
    assert_eq!(c.blocks_needed(&a, 20), 2);
    assert!(c.reserve(&mut a, 20).expect("reserve"));
    a.len = 20; // as forward_paged would
    let mut b = c.fork(&a);
    assert_eq!((c.used_blocks(), c.refs(a.blocks()[1])), (2, 2));
    // b writes into the shared partial last block: copied first; a full shared block never is.
    assert_eq!(c.blocks_needed(&b, 1), 1);
    assert!(c.reserve(&mut b, 1).expect("reserve"));
    assert_eq!(b.blocks()[0], a.blocks()[0]);
    assert_ne!(b.blocks()[1], a.blocks()[1]);
    assert_eq!((c.refs(a.blocks()[0]), c.refs(a.blocks()[1])), (2, 1));
    // Writing the shared block in place is refused.
    let e = c.check_writable(&[&a, &b], &[0, 1]);
    assert!(e.is_ok());
    let mut shared = c.fork(&a);
    shared.len = 15;
    let e = c.check_writable(&[&shared], &[1]).expect_err("shared");
    assert!(e.to_string().contains("shared"), "{e}");
    c.release(&mut shared);
    // Out of blocks: reserve changes nothing.
    assert!(!c.reserve(&mut b, 200).expect("reserve"));
    assert_eq!(b.blocks().len(), 2);
    c.release(&mut a);
    c.release(&mut b);
    assert_eq!((c.used_blocks(), c.peak_blocks()), (0, 3));
    assert!(PagedKvCache::new(1, 1, 16, 24, 8, DType::F32, &Device::Cpu).is_err());
}

#[test]
fn paged_decoding_matches_the_preallocated_cache_and_the_composite_path() {
    for (head_dim, m) in [(16, model(16)), (32, model(32)), (32, qwen2(32))] {
        let seq = tokens(150, 3); // crosses two 64-token blocks
                                  // The preallocated cache, one row, no padding, one token at a time.
        let snap = m.decode_weights();
        let mut flat = m.new_cache(1, seq.len()).expect("cache");
        let mut want = vec![];
        for (p, &id) in seq.iter().enumerate() {
            let ids = Tensor::from_vec(vec![id], (1, 1), &Device::Cpu).expect("ids");
            let pos = Tensor::from_vec(vec![p as u32], (1, 1), &Device::Cpu).expect("pos");
            let l = m
                .forward_cached(&snap, &mut flat, &ids, &pos, &[1])
                .expect("fwd");
            want.push(l.flatten_all().expect("f").to_vec1::<f32>().expect("v"));
        }
        for (block, path, tol) in [
            // 64-token blocks are the AVX-512 kernel's chunks: the same sums, bit for bit.
            (64, PagedPath::Cpu, 0.0f32),
            (16, PagedPath::Cpu, 2e-5),
            (16, PagedPath::Composite, 2e-5),
        ] {
            let mut c = m.new_paged_cache(block, 16, DType::F32).expect("paged");
            let (_, got) = feed(&m, path, &mut c, &seq, 1);
            let exact = tol == 0.0 && crate::decode::features().avx512;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                for (a, b) in g.iter().zip(w) {
                    let ok = if exact {
                        a == b
                    } else {
                        (a - b).abs() <= tol.max(2e-5)
                    };
                    assert!(
                        ok,
                        "D {head_dim} block {block} {path:?} token {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn chunked_prefill_equals_token_by_token_decoding_and_other_sequences_do_not_matter() {
    for kv in [DType::F32, DType::F16] {
        let m = model(32);
        let seq = tokens(90, 1);
        let mut c = m.new_paged_cache(16, 32, kv).expect("cache");
        let (mut one, by_token) = feed(&m, PagedPath::Cpu, &mut c, &seq, 1);
        let (mut chunked, by_chunk) = feed(&m, PagedPath::Cpu, &mut c, &seq, 37);
        // The logits after each chunk equal those after the same token decoded alone.
        for (i, l) in by_chunk.iter().enumerate() {
            let t = ((i + 1) * 37).min(seq.len()) - 1;
            assert_eq!(l, &by_token[t], "{kv:?}: chunk {i} vs token {t}");
        }
        // The same sequence decoded beside others (a prefill and a longer decode) gives the
        // same logits, bit for bit.
        let snap = m.decode_weights();
        let (mut a, mut b, mut x) = (
            BlockTable::default(),
            BlockTable::default(),
            BlockTable::default(),
        );
        let other = tokens(70, 9);
        for (p, &id) in seq.iter().enumerate() {
            for (t, n) in [(&mut a, 1), (&mut b, 3), (&mut x, 1)] {
                assert!(c.reserve(t, n).expect("reserve"));
            }
            let tb = [other[p % 60], other[p % 60 + 1], other[p % 60 + 2]];
            let mut seqs = [
                PagedSeq {
                    table: &mut b,
                    tokens: &tb,
                },
                PagedSeq {
                    table: &mut a,
                    tokens: &[id],
                },
                PagedSeq {
                    table: &mut x,
                    tokens: &[other[p % 70]],
                },
            ];
            let l = m.forward_paged(&snap, &mut c, &mut seqs).expect("fwd");
            let row = l.get(1).expect("row").to_vec1::<f32>().expect("v");
            assert_eq!(row, by_token[p], "{kv:?}: token {p} beside other sequences");
            if p == 60 {
                // Room runs out for b soon; drop it (the others go on).
                c.release(&mut b);
                b = BlockTable::default();
            }
        }
        for t in [&mut one, &mut chunked, &mut a, &mut b, &mut x] {
            c.release(t);
        }
        assert_eq!(c.used_blocks(), 0);
    }
}

#[test]
fn forked_prefixes_decode_like_separate_copies() {
    let m = model(32);
    let prompt = tokens(40, 2);
    let snap = m.decode_weights();
    let mut c = m.new_paged_cache(16, 32, DType::F32).expect("cache");
    let (mut pre, _) = feed(&m, PagedPath::Cpu, &mut c, &prompt, 40);
    let before = c.used_blocks();
    // Two samples over the shared prompt, continuing with different tokens.
    let (mut s1, mut s2) = (c.fork(&pre), c.fork(&pre));
    assert_eq!(c.used_blocks(), before, "forks share the prompt's blocks");
    for (t, id) in [(&mut s1, 5u32), (&mut s2, 9)] {
        assert!(c.reserve(t, 1).expect("reserve"));
        let mut s = [PagedSeq {
            table: t,
            tokens: &[id],
        }];
        let got = m.forward_paged(&snap, &mut c, &mut s).expect("fwd");
        // A private copy of the whole sequence gives the same logits.
        let mut whole = prompt.clone();
        whole.push(id);
        let (mut w, want) = feed(&m, PagedPath::Cpu, &mut c, &whole, 40);
        let want = want.last().expect("last");
        assert_eq!(
            &got.flatten_all().expect("f").to_vec1::<f32>().expect("v"),
            want
        );
        c.release(&mut w);
    }
    // The prompt's full blocks are stored once; each sample copied only the partial last one.
    assert_eq!(c.used_blocks(), before + 2);
    // A fork of the first 37 tokens continues as if the last three had never been fed: its
    // write lands in a copy of the shared third block, and the full table is left as it was.
    let mut p = c.fork_prefix(&pre, 37);
    assert_eq!(
        (p.len(), p.blocks(), c.used_blocks()),
        (37, &pre.blocks()[..3], before + 2)
    );
    assert!(c.reserve(&mut p, 1).expect("reserve"));
    let mut s = [PagedSeq {
        table: &mut p,
        tokens: &[5],
    }];
    let got = m.forward_paged(&snap, &mut c, &mut s).expect("fwd");
    let mut whole = prompt[..37].to_vec();
    whole.push(5);
    let (mut w, want) = feed(&m, PagedPath::Cpu, &mut c, &whole, 40);
    assert_eq!(
        &got.flatten_all().expect("f").to_vec1::<f32>().expect("v"),
        want.last().expect("last")
    );
    assert_ne!(p.blocks()[2], pre.blocks()[2], "copied before the write");
    c.release(&mut w);
    for t in [&mut pre, &mut s1, &mut s2, &mut p] {
        c.release(t);
    }
    assert_eq!(c.used_blocks(), 0);
}

#[test]
fn the_kernels_decode_step_matches_the_cpu_step() {
    kernels_step_matches_cpu_step(&model(32));
    kernels_step_matches_cpu_step(&qwen2(32));
}

fn kernels_step_matches_cpu_step(m: &Qwen3) {
    let snap = m.decode_weights();
    // Three sequences of different lengths (one crossing a block), prefilled alike on both
    // caches, then 20 steps: the kernels path (CUDA's; here the kernels' CPU loops) writes its
    // K/V through the paged write, so later steps also check what it wrote; one step mixes a
    // prefill chunk (the composite path) into the batch.
    let lens = [5usize, 19, 40];
    let mut logits = vec![];
    for path in [PagedPath::Cpu, PagedPath::Kernels] {
        let mut c = m.new_paged_cache(16, 24, DType::F32).expect("cache");
        let mut tables: Vec<BlockTable> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| feed(m, PagedPath::Cpu, &mut c, &tokens(n, i), 64).0)
            .collect();
        let mut steps = vec![];
        for step in 0..20u32 {
            // At step 7 the middle sequence feeds a 3-token chunk (a prefill beside decodes).
            let n = |i: u32| if step == 7 && i == 1 { 3 } else { 1 };
            let ids: Vec<Vec<u32>> = (0..3u32)
                .map(|i| (0..n(i)).map(|j| (i * 7 + step * 5 + j) % 47 + 1).collect())
                .collect();
            for (t, id) in tables.iter_mut().zip(&ids) {
                assert!(c.reserve(t, id.len()).expect("reserve"));
            }
            let mut seqs = PagedSeq::zip(&mut tables, &ids);
            let l = m
                .forward_paged_with(path, &snap, &mut c, &mut seqs)
                .expect("step");
            steps.push(l.to_vec2::<f32>().expect("logits"));
        }
        logits.push(steps);
    }
    for (s, (a, b)) in logits[0].iter().zip(&logits[1]).enumerate() {
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert!((x - y).abs() < 2e-5, "step {s}: {x} vs {y}");
        }
    }
}

#[test]
fn decoding_a_compute_dtype_copy_equals_casting_each_weight_at_its_use() {
    let cfg = Config::synthetic(48, 64, 96, 2, 4, 2, 16, true).expect("config");
    // f32 masters under bf16 compute (CUDA's setting, here on the CPU).
    let m = Qwen3::random(cfg, 7, &Device::Cpu, DType::BF16).expect("model");
    let seq = tokens(40, 2);
    let decode = |m: &Qwen3, path| {
        let mut c = m.new_paged_cache(16, 8, DType::BF16).expect("cache");
        feed(m, path, &mut c, &seq, 7).1
    };
    m.with_decoding_weights(|copy| -> candle_core::Result<()> {
        // One copy, every weight already in bf16: decoding casts nothing.
        assert!(copy.base_vars().values().all(|v| v.dtype() == DType::BF16));
        // The same casts, made once instead of at each use: the same bits. (The kernels path's
        // CPU loops are f32-only; the emulated device's bf16 runs compare it.)
        let path = PagedPath::Composite;
        assert_eq!(decode(&m, path), decode(copy, path));
        Ok(())
    })
    .expect("decode");
    // f32 compute: nothing to cast, and no copy.
    let f = model(16);
    f.with_decoding_weights(|d| -> candle_core::Result<()> {
        assert!(std::ptr::eq(d, &f));
        Ok(())
    })
    .expect("f32");
}

/// A decoding copy whose q/k/v and gate/up weights are stacked (what CUDA decodes, model/
/// stacked.rs) decodes as the separate weights do, through the paged kernels' layer and the
/// composite one, for Qwen3 and for Qwen2 (stacked biases): one GEMM's columns where there were
/// three GEMMs.
#[test]
fn stacked_projections_decode_as_the_separate_ones() {
    for m in [model(16), qwen2(16)] {
        let mut stacked = m.merged().expect("copy");
        stacked.stack_all().expect("stack");
        let names: Vec<&String> = stacked.base_vars().keys().collect();
        assert!(names
            .iter()
            .all(|n| !n.contains("q_proj") && !n.contains("gate_proj")));
        let qkv = names.iter().filter(|n| n.contains("qkv_proj")).count();
        assert_eq!(qkv, if m.config.qkv_bias { 4 } else { 2 }, "{names:?}");
        let seq = tokens(30, 3);
        for path in [PagedPath::Kernels, PagedPath::Composite] {
            let decode = |m: &Qwen3| {
                let mut c = m.new_paged_cache(16, 8, DType::F32).expect("cache");
                feed(m, path, &mut c, &seq, 7).1
            };
            let (want, got) = (decode(&m), decode(&stacked));
            for (a, b) in want.iter().flatten().zip(got.iter().flatten()) {
                assert!((a - b).abs() < 1e-5, "{path:?}: {a} vs {b}");
            }
        }
    }
}
