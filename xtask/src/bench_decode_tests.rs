//! bench_decode.rs's tests: the per-step arithmetic on made-up counters, the refusal of bad
//! arguments, the counters' absence named in one line, and a whole measurement on the CPU with
//! a tiny skeleton (wall time only, every key of the JSON there).

use super::*;
use candle_core::DType;

fn counts(pairs: &[(&str, u64)]) -> Counts {
    let mut c = Counts::default();
    for (name, v) in pairs {
        let i = FIELDS.iter().position(|f| f == name).expect("a field");
        c.0[i] = *v;
    }
    c
}

#[test]
fn figures_are_the_long_runs_excess_per_decode_step() {
    // The one-token rollout: 1 step (the prefill); the long one: 1 + 4 steps.
    let short = Run {
        steps: 1,
        wall_ns: 3_000_000,
        counts: Some(counts(&[
            ("launches", 100),
            ("library_launches", 50),
            ("d2h_bytes", 1_000),
            ("h2d_bytes", 64),
            ("inside_ns", 1_000_000),
            ("syncs", 2),
            ("allocs", 9),
            ("alloc_bytes", 4_096),
            ("driver_calls", 300),
            ("pool_releases", 1),
            ("thread_cpu_ns", 10_000_000),
            ("thread_inside_cpu_ns", 400_000),
        ])),
    };
    let long = Run {
        steps: 5,
        wall_ns: 11_000_000,
        counts: Some(counts(&[
            ("launches", 140),
            ("graph_launches", 4),
            ("library_launches", 70),
            ("d2h_bytes", 1_256),
            ("h2d_bytes", 96),
            ("inside_ns", 5_000_000),
            ("syncs", 6),
            ("allocs", 17),
            ("alloc_bytes", 6_144),
            ("driver_calls", 400),
            ("frees", 8),
            ("pool_releases", 5),
            ("graph_steps", 3),
            ("graph_kernels", 2_000),
            ("graph_step_host_ns", 600_000),
            ("thread_cpu_ns", 13_600_000),
            ("thread_inside_cpu_ns", 2_000_000),
        ])),
    };
    let f = figures(&long, &short).expect("figures");
    let get = |k: &str| f[k].as_f64().unwrap_or_else(|| panic!("{k} in {f}"));
    assert_eq!(f["decode_steps"], 4);
    assert_eq!(get("wall_ms_per_step"), 2.0); // 8 ms over 4 steps
    assert_eq!(get("launches_per_step"), (40.0 + 4.0 + 20.0) / 4.0); // graphs and GEMMs count
    assert_eq!(get("kernel_launches_per_step"), 10.0);
    assert_eq!(get("graph_launches_per_step"), 1.0);
    assert_eq!(get("graph_kernels_per_step"), 500.0); // the graphs' nodes, replayed
    assert_eq!(get("library_launches_per_step"), 5.0);
    assert_eq!(get("d2h_bytes_per_step"), 64.0);
    assert_eq!(get("h2d_bytes_per_step"), 8.0);
    assert_eq!(get("syncs_per_step"), 1.0);
    assert_eq!(get("allocs_per_step"), 2.0);
    assert_eq!(get("alloc_bytes_per_step"), 512.0);
    assert_eq!(get("frees_per_step"), 2.0);
    assert_eq!(get("pool_releases_per_step"), 1.0);
    assert_eq!(get("driver_calls_per_step"), 25.0);
    assert_eq!(get("inside_ms_per_step"), 1.0);
    assert_eq!(get("host_ms_per_step"), 1.0); // (8 - 4) ms over 4 steps
    assert_eq!(get("host_cpu_ms_per_step"), 0.5); // (3.6 - 1.6) ms of the thread's CPU over 4
    assert_eq!(get("host_cpu_ms_per_graph_step"), 0.2); // 0.6 ms over 3 launch-to-launch steps
                                                        // Without counters: wall time only, every counter figure null.
    let bare = |r: &Run| Run {
        counts: None,
        ..r.clone()
    };
    let f = figures(&bare(&long), &bare(&short)).expect("figures");
    assert_eq!(f["wall_ms_per_step"], 2.0);
    for k in [
        "launches_per_step",
        "d2h_bytes_per_step",
        "host_ms_per_step",
        "host_cpu_ms_per_step",
        "host_cpu_ms_per_graph_step",
    ] {
        assert!(f[k].is_null(), "{k} in {f}");
    }
    // No decode step between the two: refused, naming both step counts.
    let e = figures(&short, &short).expect_err("no step").to_string();
    assert!(e.contains("1 steps") && e.contains("no decode step"), "{e}");
    // Ratios: null where the new path's figure is 0 or missing.
    let (b, n) = (json!({"x": 10.0, "y": 1.0}), json!({"x": 2.0, "y": 0.0}));
    assert_eq!(ratio(&b, &n, "x"), 5.0);
    assert!(ratio(&b, &n, "y").is_null() && ratio(&b, &n, "z").is_null());
}

#[test]
fn counters_absent_are_named_in_one_line() {
    let e = Counters::open("libterse-no-such-library.so.1")
        .err()
        .expect("absent");
    assert!(
        e.starts_with("libterse-no-such-library.so.1 cannot be opened"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    // A library without the symbol: what a real driver is.
    let e = Counters::open("libc.so.6").err().expect("no symbol");
    assert_eq!(
        e,
        "libc.so.6 has no terse_fake_gpu_counters (a real driver)"
    );
}

#[test]
fn bad_arguments_are_refused_naming_them() {
    let e = decode(false, true, &[1, 0], 4, 8, None)
        .expect_err("batch 0")
        .to_string();
    assert!(e.contains("--batches [1, 0]"), "{e}");
    let e = decode(false, true, &[], 4, 8, None)
        .expect_err("none")
        .to_string();
    assert!(e.contains("--batches []"), "{e}");
    let e = decode(false, true, &[1], 2, 8, None)
        .expect_err("two tokens: only the capturing decode step")
        .to_string();
    assert!(e.contains("--new-tokens 2"), "{e}");
    let e = decode(false, true, &[1], 4, 0, None)
        .expect_err("no prompt")
        .to_string();
    assert!(e.contains("--prompt-tokens 0"), "{e}");
}

#[test]
fn the_skeleton_is_qwen3_0_6b_but_narrow() {
    let (s, q) = (skeleton().expect("skeleton"), Config::qwen3_0_6b());
    assert_eq!(
        (
            s.num_hidden_layers,
            s.num_attention_heads,
            s.num_key_value_heads
        ),
        (28, 16, 8)
    );
    assert_eq!((s.head_dim, s.vocab_size), (q.head_dim, q.vocab_size));
    assert_eq!((s.hidden_size, s.intermediate_size), (64, 128));
}

#[test]
fn a_cpu_measurement_has_every_key_and_wall_time_only() {
    // The skeleton's head layout with 2 layers and a small vocabulary: fast on the CPU.
    let cfg = Config::synthetic(256, 64, 128, 2, 16, 8, 128, true).expect("config");
    let m = Qwen3::random(cfg, 0, &Device::Cpu, DType::F32).expect("model");
    let setup = Setup {
        prompt_tokens: 8,
        new_tokens: 4,
        counters: None,
    };
    let switches = || OLD_PATH.map(|(k, _)| std::env::var(k).ok());
    let before = switches();
    let rows = measure(&m, &[1, 3], &setup).expect("measure");
    for b in ["1", "3"] {
        let row = &rows[b];
        for side in [row, &row["baseline"]] {
            // The rollouts prefill the same prompts: 2 steady decode steps after the first.
            assert_eq!(side["decode_steps"], 2, "{row}");
            assert_eq!(side["first_decode_step"]["decode_steps"], 1, "{row}");
            let wall = side["wall_ms_per_step"].as_f64();
            assert!(wall.is_some_and(|w| w >= 0.0), "{row}");
            for k in [
                "launches_per_step",
                "graph_launches_per_step",
                "driver_calls_per_step",
                "d2h_bytes_per_step",
                "h2d_bytes_per_step",
                "syncs_per_step",
                "allocs_per_step",
                "host_ms_per_step",
                "host_cpu_ms_per_step",
            ] {
                assert!(side[k].is_null(), "{k} in {row}");
            }
        }
        assert!(row["baseline_over_new"]["d2h_bytes"].is_null(), "{row}");
        assert!(row["baseline_over_new"]["launches"].is_null(), "{row}");
    }
    // The switches are restored after the baseline.
    assert_eq!(switches(), before);
}
