//! config_record.rs: a run's config is written once; a start with another config refuses
//! naming each key with both values, keys that change no result pass, and an allowed change
//! is recorded and becomes the run's config for the next start.

use super::*;

/// A scratch run directory, emptied first.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("terse-config-record-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// The run created with `cfg`: config.toml written as a fresh start writes it.
fn created(name: &str, cfg: &RunConfig) -> std::path::PathBuf {
    let dir = scratch(name);
    let r = check(&dir, cfg, false).expect("check");
    assert!(matches!(r, Record::Create(_)), "{r:?}");
    write(&dir, &r, 0).expect("write");
    dir
}

#[test]
fn a_new_run_writes_its_config_and_the_same_config_writes_nothing() {
    let cfg = RunConfig::default();
    let dir = created("same", &cfg);
    let text = std::fs::read_to_string(dir.join(CONFIG)).expect("config.toml");
    assert_eq!(text, cfg.to_toml().expect("toml"));
    assert_eq!(check(&dir, &cfg, false).expect("same"), Record::Same);
    assert!(!dir.join(CHANGES).exists());
}

#[test]
fn keys_that_change_no_result_may_differ() {
    let dir = created("quiet", &RunConfig::default());
    let mut c = RunConfig::default();
    c.run.lock_wait_s = 0.0;
    c.eval.every = 5;
    c.log.tensorboard = true;
    c.checkpoint.keep_last = 9;
    assert_eq!(check(&dir, &c, false).expect("quiet"), Record::Same);
}

#[test]
fn another_seed_refuses_in_one_line_naming_each_key_with_both_values() {
    let dir = created("seed", &RunConfig::default());
    let mut c = RunConfig::default();
    c.run.seed = 1;
    c.grpo.schedule.peak_lr = 2e-6;
    c.eval.every = 3;
    let e = format!("{:#}", check(&dir, &c, false).expect_err("refused"));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("run.seed = 0 in config.toml, 1 now"), "{e}");
    assert!(e.contains("grpo.schedule.peak_lr = "), "{e}");
    assert!(e.contains("--allow-config-change"), "{e}");
    // A key that changes no result is not named among the refused ones.
    assert!(!e.contains("eval.every"), "{e}");
}

#[test]
fn an_unset_key_reads_as_unset() {
    let dir = created("unset", &RunConfig::default());
    let mut c = RunConfig::default();
    c.data.recheck_hard_prob = Some(0.5);
    let e = format!("{:#}", check(&dir, &c, false).expect_err("refused"));
    assert!(
        e.contains("data.recheck_hard_prob = unset in config.toml, 0.5 now"),
        "{e}"
    );
}

#[test]
fn an_allowed_change_is_recorded_and_becomes_the_runs_config() {
    let dir = created("allowed", &RunConfig::default());
    let before = std::fs::read(dir.join(CONFIG)).expect("config.toml");
    let mut c = RunConfig::default();
    c.run.seed = 7;
    c.grpo.steps = 300;
    c.data.recheck_hard_prob = Some(0.25);
    let r = check(&dir, &c, true).expect("allowed");
    let Record::Changed(changes) = &r else {
        panic!("{r:?}")
    };
    assert_eq!(changes.len(), 3, "{changes:?}");
    write(&dir, &r, 4).expect("write");
    let text = std::fs::read_to_string(dir.join(CHANGES)).expect("changes");
    assert!(
        text.contains("{\"step\":4,\"key\":\"run.seed\",\"old\":0,\"new\":7}"),
        "{text}"
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let seed = lines
        .iter()
        .find(|l| l["key"] == "run.seed")
        .expect("run.seed");
    assert_eq!(
        *seed,
        serde_json::json!({"step": 4, "key": "run.seed", "old": 0, "new": 7})
    );
    let unset = lines
        .iter()
        .find(|l| l["key"] == "data.recheck_hard_prob")
        .expect("recheck_hard_prob");
    assert_eq!(unset["old"], serde_json::Value::Null);
    // config.toml is the run's as created; the next start with the changed config finds it
    // the run's own, and going back is a change again.
    assert_eq!(
        std::fs::read(dir.join(CONFIG)).expect("config.toml"),
        before
    );
    assert_eq!(check(&dir, &c, false).expect("same"), Record::Same);
    let e = format!(
        "{:#}",
        check(&dir, &RunConfig::default(), false).expect_err("back")
    );
    assert!(e.contains("run.seed = 7 in config.toml, 0 now"), "{e}");
    // Unsetting a key records null, which the next start reads as unset.
    let r = check(&dir, &RunConfig::default(), true).expect("back, allowed");
    write(&dir, &r, 9).expect("write");
    assert_eq!(
        check(&dir, &RunConfig::default(), false).expect("same"),
        Record::Same
    );
}

#[test]
fn an_unreadable_change_line_names_the_file_and_line() {
    let dir = created("torn", &RunConfig::default());
    std::fs::write(dir.join(CHANGES), "{\"step\": 0, \"key\": \"run.seed\"").expect("torn");
    let e = format!(
        "{:#}",
        check(&dir, &RunConfig::default(), false).expect_err("torn")
    );
    assert!(e.contains("config_changes.jsonl line 1"), "{e}");
}
