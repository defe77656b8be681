//! A process SIGKILLed while writing a checkpoint leaves the previous one loadable; the next
//! start removes the partial write and resumes from the previous checkpoint.
//!
//! The writer is the helper program `examples/checkpoint_crash_writer.rs`, built by this test
//! with `cargo build --example` (a no-op when `cargo test` already built it), and slowed down
//! by the test-only hook `DDP_CHECKPOINT_TEST_PAUSE_MS`.

mod checkpoint_common;
mod common;

use checkpoint_common::*;
use common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, Checkpointer, LATEST_FILE, MANIFEST_FILE, MODEL_FILE, TEST_PAUSE_ENV,
    TrainingState, checkpoint_name,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    // `cargo test` builds the examples already; building `-p ddp-core` alone would resolve
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
            "ddp-core",
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

fn tmp_dirs(dir: &Path) -> Vec<String> {
    entries_with_prefix(dir, ".tmp-")
}

#[test]
fn sigkill_during_a_save_leaves_the_previous_checkpoint_loadable() {
    let writer = writer_binary();
    let dir = tempfile::tempdir().expect("tempdir");

    // Checkpoint 1, written completely.
    let out = Command::new(&writer)
        .arg(dir.path())
        .arg("1")
        .output()
        .expect("run the writer");
    assert!(
        out.status.success(),
        "writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join(LATEST_FILE))
            .expect("latest")
            .trim(),
        checkpoint_name(1)
    );

    // Checkpoint 2, paused after each file and killed mid-write.
    let mut child = Command::new(&writer)
        .arg(dir.path())
        .arg("2")
        .env(TEST_PAUSE_ENV, "3000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the writer");
    let deadline = Instant::now() + Duration::from_secs(120);
    let partial = loop {
        let ready = tmp_dirs(dir.path())
            .into_iter()
            .map(|n| dir.path().join(n))
            .find(|p| p.join(MODEL_FILE).exists());
        if let Some(p) = ready {
            break p;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the writer exited ({status}) before it was killed");
        }
        assert!(
            Instant::now() < deadline,
            "the writer never started checkpoint 2"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(rc, 0, "SIGKILL failed");
    let status = child.wait().expect("wait for the writer");
    assert!(!status.success(), "the writer was killed");

    // The crash left a partial temporary directory and nothing else.
    assert!(partial.is_dir(), "the partial write is still there");
    assert!(
        !partial.join(MANIFEST_FILE).exists(),
        "killed before the manifest"
    );
    assert!(
        !dir.path().join(checkpoint_name(2)).exists(),
        "checkpoint 2 never appeared"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join(LATEST_FILE))
            .expect("latest")
            .trim(),
        checkpoint_name(1)
    );

    // The next start cleans up and resumes from checkpoint 1.
    let ((resumed, params), log) = run_ranks(1, |pg| {
        capture_logs(|| {
            let device = Default::default();
            let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
            let mut model = Mlp::<B>::new(&device, 8);
            let mut optim = burn::optim::AdamConfig::new().init::<B, Mlp<B>>();
            let outcome = ckpt
                .load_latest(&device, &mut model, &mut optim)
                .expect("load");
            (
                outcome.into_resumed().expect("resumed from checkpoint 1"),
                flat_params(&model),
            )
        })
    })
    .remove(0);
    assert_eq!(
        tmp_dirs(dir.path()),
        Vec::<String>::new(),
        "no temporary directory remains"
    );
    assert!(log.contains("removed the leftover"), "{log}");
    assert_eq!(resumed.info.name, checkpoint_name(1));
    assert!(resumed.invalid.is_empty());
    assert_eq!(
        resumed.state.user::<String>().expect("user").as_deref(),
        Some("written by step 1")
    );
    assert!(
        !params.is_empty() && params.iter().all(|&v| v == 1.0),
        "checkpoint 1's parameters"
    );

    // And the directory works as usual afterwards.
    run_ranks(1, |pg| {
        let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let model = Mlp::<B>::new(&Default::default(), 8);
        let optim = burn::optim::AdamConfig::new().init::<B, Mlp<B>>();
        ckpt.save(&model, &optim, &TrainingState::new(0, 2))
            .expect("save step 2");
        assert_eq!(ckpt.latest().expect("latest"), Some(checkpoint_name(2)));
    });
}
