//! A process SIGKILLed at any phase of a checkpoint write loses nothing: the next start
//! removes the partial write and resumes, bitwise, from the newest committed checkpoint (the
//! newest complete one: the rename commits), and saving works as usual afterwards.
//!
//! The writer is the helper program `examples/checkpoint_crash_writer.rs` of this crate, built
//! by this test
//! with `cargo build --example` (a no-op when `cargo test` already built it); the test-only
//! hook `DDP_CHECKPOINT_TEST_CRASH_AT` makes it SIGKILL itself at a named phase.
use ddp_core::checkpoint::{
    CRASH_POINTS, CheckpointConfig, FullCheckpointer, LATEST_FILE, TEST_CRASH_AT_ENV,
    checkpoint_name,
};
use ddp_tests::fixtures::{SmallMlp, TestBackend as B, flat_params};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const EXAMPLE: &str = "checkpoint_crash_writer";

/// Builds the helper example with the profile of this test binary and returns its path.
fn writer_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile dir>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let path = profile_dir.join("examples").join(EXAMPLE);
    // `cargo test` builds the examples already; building `-p ddp-tests` alone would resolve
    // other features than the workspace build and recompile burn, so only build when missing
    // or older than its source.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{EXAMPLE}.rs"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(built), Some(edited)) = (modified(&path), modified(&source))
        && built >= edited
    {
        return path;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "ddp-tests",
            "--example",
            EXAMPLE,
            "--profile",
            &profile,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build for the helper example");
    assert!(
        status.success(),
        "building the helper example {EXAMPLE} failed"
    );
    assert!(
        path.exists(),
        "the helper example is not at {}",
        path.display()
    );
    path
}

/// Runs the writer for `step`, SIGKILLing itself at `crash_at` if given; checks how it ended.
fn write_step(writer: &Path, dir: &Path, step: u64, crash_at: Option<&str>) {
    let mut cmd = Command::new(writer);
    cmd.arg(dir).arg(step.to_string()).env("RUST_LOG", "warn");
    match crash_at {
        Some(point) => cmd.env(TEST_CRASH_AT_ENV, point),
        None => cmd.env_remove(TEST_CRASH_AT_ENV),
    };
    let out = cmd.output().expect("run the writer");
    let log = String::from_utf8_lossy(&out.stderr);
    match crash_at {
        None => assert!(out.status.success(), "writer failed: {log}"),
        Some(point) => assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "the writer was to kill itself at {point}: {} {log}",
            out.status
        ),
    }
}

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(LATEST_FILE))
        .expect("latest")
        .trim()
        .to_string()
}

/// Loads the newest committed checkpoint of `dir` as a new run would; returns its name, its
/// user note and its parameters.
fn resume(dir: &Path) -> (String, Option<String>, Vec<f32>) {
    let (_server, pg) = ddp_tests::one_rank_group().expect("process group");
    let device = Default::default();
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("new");
    let mut model = SmallMlp::<B>::new(&device);
    let mut optim = burn::optim::AdamConfig::new().init::<B, SmallMlp<B>>();
    let outcome = ckpt
        .load_latest(&device, &mut model, &mut optim)
        .expect("load");
    let resumed = outcome.into_resumed().expect("resumed from a checkpoint");
    assert!(resumed.invalid.is_empty(), "{:?}", resumed.invalid);
    let note = resumed.state.user::<String>().expect("user note");
    (resumed.info.name, note, flat_params(&model))
}

/// The entries of `dir` whose names start with `prefix`.
fn entries_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn sigkill_at_every_phase_of_a_save_loses_nothing() {
    let writer = writer_binary();
    let committed_at = CRASH_POINTS
        .iter()
        .position(|p| *p == "after-rename")
        .expect("after-rename is a crash point");
    for (i, point) in CRASH_POINTS.iter().enumerate() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_step(&writer, dir.path(), 1, None);
        assert_eq!(latest(dir.path()), checkpoint_name(1));
        write_step(&writer, dir.path(), 2, Some(point));

        // The rename commits the save: before it the run resumes from step 1, after it from
        // step 2 (complete and verified, even while `latest` still names step 1).
        let expected: u64 = if i >= committed_at { 2 } else { 1 };
        let (name, note, params) = resume(dir.path());
        assert_eq!(name, checkpoint_name(expected), "crash {point}");
        assert_eq!(
            note.as_deref(),
            Some(format!("written by step {expected}").as_str()),
            "crash {point}"
        );
        let bits = (expected as f32).to_bits();
        assert!(
            !params.is_empty() && params.iter().all(|v| v.to_bits() == bits),
            "crash {point}: the parameters of step {expected}, bit for bit"
        );
        // The next start removed whatever the crash left half-done.
        for prefix in [".tmp-", ".trash-"] {
            assert_eq!(
                entries_with_prefix(dir.path(), prefix),
                Vec::<String>::new(),
                "crash {point}: no {prefix} leftover after the next start"
            );
        }

        // Saving works as usual afterwards, and the save is the one a new run resumes.
        write_step(&writer, dir.path(), 2, None);
        assert_eq!(latest(dir.path()), checkpoint_name(2), "crash {point}");
        let (name, _, params) = resume(dir.path());
        assert_eq!(name, checkpoint_name(2), "crash {point}");
        assert!(params.iter().all(|v| v.to_bits() == 2f32.to_bits()));
        assert!(
            !dir.path().join(checkpoint_name(1)).exists(),
            "crash {point}: step 1 pruned (keep last 1)"
        );
    }
}

/// Saving a step that already has a checkpoint moves the old one aside before the new one
/// takes its name. A crash between the two renames must not lose the step, even when it is the
/// only checkpoint (keep last 1): the next start puts the old one back.
#[test]
fn sigkill_while_the_same_step_is_saved_again_keeps_that_step() {
    let writer = writer_binary();
    let dir = tempfile::tempdir().expect("tempdir");
    write_step(&writer, dir.path(), 1, None);
    write_step(&writer, dir.path(), 1, Some("replacing"));
    assert!(
        !dir.path().join(checkpoint_name(1)).exists(),
        "the crash left step 1 moved aside"
    );

    let (name, note, params) = resume(dir.path());
    assert_eq!(name, checkpoint_name(1));
    assert_eq!(note.as_deref(), Some("written by step 1"));
    assert!(!params.is_empty() && params.iter().all(|v| v.to_bits() == 1f32.to_bits()));
    for prefix in [".tmp-", ".trash-", ".replaced-"] {
        assert_eq!(
            entries_with_prefix(dir.path(), prefix),
            Vec::<String>::new(),
            "no {prefix} leftover after the next start"
        );
    }

    // Saving the same step again completes, and replaces nothing else.
    write_step(&writer, dir.path(), 1, None);
    assert_eq!(latest(dir.path()), checkpoint_name(1));
    assert_eq!(
        entries_with_prefix(dir.path(), ".replaced-"),
        Vec::<String>::new()
    );
}
