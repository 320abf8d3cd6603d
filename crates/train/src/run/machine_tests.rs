//! machine.rs: the machine a run records, and the one line a start on another type gives.

use super::*;

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("terse-machine-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

#[test]
fn this_machine_names_its_cpu_simd_level_and_build() {
    let m = Machine::this("cpu");
    assert!(!m.cpu.is_empty());
    assert!(
        ["avx512", "avx2", "portable"].contains(&m.simd.as_str()),
        "{m:?}"
    );
    assert!(m.gpu.is_none());
    assert!(
        m.commit == "unknown"
            || (m.commit.len() == 40 && m.commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{}",
        m.commit
    );
    // A CUDA run records its GPU, "unknown" where nvidia-smi cannot say.
    let g = Machine::this("cuda:0").gpu.expect("a GPU entry");
    assert!(!g.name.is_empty() && !g.driver.is_empty() && !g.cuda.is_empty());
}

#[test]
fn a_start_on_another_machine_type_says_so_in_one_line() {
    let dir = scratch("other");
    let here = Machine::this("cpu");
    assert_eq!(here.compare(&dir).expect("no file"), None);
    here.write(&dir).expect("write");
    assert_eq!(here.compare(&dir).expect("same"), None);
    // Another build on the same machine type is the same type.
    let rebuilt = Machine {
        commit: "0".repeat(40),
        ..here.clone()
    };
    assert_eq!(rebuilt.compare(&dir).expect("same type"), None);
    let epyc = Machine {
        cpu: "AMD EPYC 9654 96-Core Processor".into(),
        simd: "avx512".into(),
        ..here.clone()
    };
    epyc.write(&dir).expect("write");
    let line = here.compare(&dir).expect("read").expect("another type");
    assert_eq!(line.lines().count(), 1);
    assert!(
        line.contains("created on AMD EPYC 9654 96-Core Processor (avx512)")
            && line.contains(&format!("runs on {} ({})", here.cpu, here.simd))
            && line.contains("bitwise reproducible per machine type"),
        "{line}"
    );
}

#[test]
fn an_unreadable_machine_json_names_the_file() {
    let dir = scratch("torn");
    std::fs::write(dir.join(MACHINE), "{\"cpu\": ").expect("torn");
    let e = format!(
        "{:#}",
        Machine::this("cpu").compare(&dir).expect_err("torn")
    );
    assert!(e.contains("machine.json"), "{e}");
}
