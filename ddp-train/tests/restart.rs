//! The `digits_learner` example under its own launcher: a worker SIGKILLed mid-epoch with
//! `--max-restarts 1` is restarted with the group, which resumes from rank 0's latest
//! checkpoint (an epoch end, or with `--checkpoint-every-n-steps` a step inside the epoch) and
//! ends with the weights of an uninterrupted run, bit for bit. Processes, not threads: the
//! launcher, its restart and a real kill are what is tested.

use ddp_test_support::worker_pids;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Generous: a busy 2-core machine runs this next to other builds.
const DEADLINE: Duration = Duration::from_secs(600);
/// Epochs of each run: the kill lands in epoch 2 (after epoch 1's checkpoint), and epochs 2
/// and 3 run again from the checkpoint.
const EPOCHS: usize = 3;

/// The example's binary (built by `cargo test -p ddp-train`, which builds examples); a missing
/// or stale one is a failure saying how to build it.
fn example_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/digits_learner
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("examples").join("digits_learner"))
        .expect("target directory");
    let hint = "run `cargo test -p ddp-train` (which builds examples) or \
                `cargo build -p ddp-train --example digits_learner`";
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}: {hint}", path.display()));
    // `cargo test --test restart` alone does not rebuild examples: refuse a stale one.
    let sources = [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/digits_learner.rs"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    ];
    for source in sources {
        let edited = std::fs::read_dir(&source)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok())
                    .max()
            })
            .ok()
            .flatten()
            .or_else(|| std::fs::metadata(&source).and_then(|m| m.modified()).ok());
        if let Some(edited) = edited {
            assert!(
                edited <= built,
                "{} is older than {}: {hint}",
                path.display(),
                source.display()
            );
        }
    }
    path
}

/// The example on 2 ranks, small batches (45 steps per epoch and rank), its files in `dir`.
fn digits_learner(dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(example_path());
    // The test runner's environment must not make it a worker of some other job.
    ddp_test_support::remove_job_env(&mut cmd)
        .args(["--nproc-per-node", "2", "--batch-size", "16", "--epochs"])
        .arg(EPOCHS.to_string())
        .arg("--dir")
        .arg(dir.join("train"))
        .arg("--weights-out")
        .arg(dir.join("weights.bin"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A started launcher, stopped (SIGTERM, which stops its workers) if the test fails before
/// it ends, so nothing is left running.
struct Launcher {
    child: Option<Child>,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
}

impl Launcher {
    fn start(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("starting digits_learner");
        let read = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let out = read(Box::new(child.stdout.take().expect("stdout")));
        let err = read(Box::new(child.stderr.take().expect("stderr")));
        Launcher {
            child: Some(child),
            out: Some(out),
            err: Some(err),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether it ended already (then [`finish`](Self::finish) returns at once).
    fn ended(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("try_wait").is_some())
    }

    /// Waits up to [`DEADLINE`] from `start`: (success, stdout, stderr).
    fn finish(mut self, start: Instant) -> (bool, String, String) {
        let mut child = self.child.take().expect("a launcher");
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break Some(status);
            }
            if start.elapsed() > DEADLINE {
                stop(&mut child);
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self
            .out
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let err = self
            .err
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let Some(status) = status else {
            panic!("the job did not finish within {DEADLINE:?}:\n{out}\n{err}");
        };
        (status.success(), out, err)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            stop(child);
        }
    }
}

/// SIGTERM to the launcher (it stops its workers), then waits for it.
fn stop(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: plain syscall on the launcher this test started and has not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let _ = child.wait();
}

/// The final weights of an uninterrupted run (without mid-epoch checkpoints), run once for
/// all tests of this file.
fn reference_weights() -> &'static [u8] {
    static REFERENCE: OnceLock<Vec<u8>> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let start = Instant::now();
        let (ok, out, err) = Launcher::start(digits_learner(tmp.path(), &[])).finish(start);
        assert!(ok, "the uninterrupted run failed:\n{out}\n{err}");
        let reference = std::fs::read(tmp.path().join("weights.bin")).expect("reference weights");
        assert!(!reference.is_empty());
        reference
    })
}

/// The numbers following `marker` in `text`'s lines (`marker` then whitespace-separated
/// words, the first `count` parsed, trailing commas dropped).
fn numbers_after(text: &str, marker: &str, count: usize) -> Vec<Vec<usize>> {
    text.lines()
        .filter_map(|l| l.split(marker).nth(1))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.trim_end_matches(',').parse().ok())
                .take(count)
                .collect()
        })
        .collect()
}

#[test]
fn a_rank_killed_mid_epoch_is_restarted_and_ends_with_the_uninterrupted_weights() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let killed = tmp.path().join("killed");
    let reference = reference_weights();

    let start = Instant::now();
    let mut launcher = Launcher::start(digits_learner(&killed, &["--max-restarts", "1"]));
    // Kill rank 1 once epoch 1's checkpoint is complete: training is then in epoch 2.
    let checkpoint = killed.join("train");
    let resumable = loop {
        let latest = ddp_train::latest_checkpoint(&checkpoint).unwrap_or(None);
        if let Some(epoch) = latest {
            let pids = worker_pids(launcher.pid(), 1);
            assert_eq!(pids.len(), 1, "rank 1 of the first attempt: {pids:?}");
            // SAFETY: plain syscall on a worker of the launcher this test started.
            assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
            break epoch;
        }
        if launcher.ended() {
            let (_, out, err) = launcher.finish(start);
            panic!("the job ended before a checkpoint appeared:\n{out}\n{err}");
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no checkpoint within {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let (ok, out, err) = launcher.finish(start);
    let all = format!("--- stdout ---\n{out}\n--- stderr ---\n{err}");
    assert!(ok, "the restarted job must finish:\n{all}");
    assert!(
        err.contains("SIGKILL") && err.contains("restarting every worker (restart 1 of 1)"),
        "rank 1 was killed and the group restarted:\n{all}"
    );
    // Both ranks of the restart resume the same epoch, at or after the one seen complete.
    let resumed: Vec<usize> = all
        .lines()
        .filter_map(|l| l.split("resuming after epoch ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(resumed.len(), 2, "both ranks resume once:\n{all}");
    assert!(
        resumed[0] == resumed[1] && resumed[0] >= resumable && resumed[0] < EPOCHS,
        "resumed after epochs {resumed:?}, killed after epoch {resumable} was complete:\n{all}"
    );
    eprintln!(
        "rank 1 killed once epoch {resumable} was complete; the restart resumed after epoch {}",
        resumed[0]
    );
    let weights = std::fs::read(killed.join("weights.bin")).expect("weights of the killed run");
    assert!(
        weights == reference,
        "final weights differ from the uninterrupted run's:\n{all}"
    );
}

/// 45 steps per epoch and rank; checkpoints every 10 steps; rank 1 dies as it starts its 70th
/// step, step 25 of epoch 2, so the latest checkpoint is epoch 2's step 20 (rank 0 wrote it
/// before step 21, which rank 1 cannot have finished without it): deterministic, no race.
const EVERY_N_STEPS: &str = "10";
const KILL_AT_STEP: &str = "70";

#[test]
fn a_rank_killed_mid_epoch_resumes_at_the_last_step_checkpoint_and_ends_with_the_uninterrupted_weights()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let reference = reference_weights();
    let start = Instant::now();
    let launcher = Launcher::start(digits_learner(
        tmp.path(),
        &[
            "--max-restarts",
            "1",
            "--checkpoint-every-n-steps",
            EVERY_N_STEPS,
            "--kill-rank1-at-step",
            KILL_AT_STEP,
        ],
    ));
    let (ok, out, err) = launcher.finish(start);
    let all = format!("--- stdout ---\n{out}\n--- stderr ---\n{err}");
    assert!(ok, "the restarted job must finish:\n{all}");
    assert!(
        err.contains("killing itself at training step 70")
            && err.contains("SIGKILL")
            && err.contains("restarting every worker (restart 1 of 1)"),
        "rank 1 was killed and the group restarted:\n{all}"
    );
    // Both ranks of the restart resume inside epoch 2, after its step 20: mid-epoch, from the
    // step checkpoint, not from epoch 1's end.
    let resumed = numbers_after(&all, "resuming inside epoch ", 2);
    assert_eq!(
        resumed,
        [[2, 20], [2, 20]],
        "both ranks resume inside epoch 2 after step 20:\n{all}"
    );
    assert!(
        !all.contains("resuming after epoch"),
        "no epoch-end resume:\n{all}"
    );
    let weights = std::fs::read(tmp.path().join("weights.bin")).expect("weights");
    assert!(
        weights == reference,
        "final weights differ from the uninterrupted run's:\n{all}"
    );
    // Only the latest step checkpoint is kept: epoch 3's step 40.
    let mut kept: Vec<String> = std::fs::read_dir(tmp.path().join("train/checkpoint/steps"))
        .expect("step checkpoints")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            "model-3-40.mpk",
            "optim-3-40.mpk",
            "position-3-40.txt",
            "scheduler-3-40.mpk"
        ],
        "{all}"
    );
}
