//! Without a shared filesystem, rank 0 picks the checkpoint in its own directory: a newer one
//! in another rank's directory (the host that was rank 0 before an elastic restart) stops the
//! load on every rank, naming that rank, its step and its directory, instead of an older
//! resume or a fresh start. Ranks sharing one directory resume as before.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, MANIFEST_FILE, MODEL_FILE,
    SUPERSEDED_RUNS_FILE, TrainingState, checkpoint_name,
};
use std::path::{Path, PathBuf};

/// Saves `steps` of random models into `dir` (1 rank).
fn save_steps(dir: &Path, steps: &[u64]) {
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("new");
        for &step in steps {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
}

/// `load_latest` on 2 ranks, rank `r` on `dirs[r]`: each rank's result, as the resumed
/// checkpoint's name (`None`: fresh) or the error.
fn load_on(dirs: [&Path; 2]) -> Vec<Result<Option<String>, CheckpointError>> {
    load_with(dirs, true)
}

/// [`load_on`], with the other ranks' directories `checked` or not.
fn load_with(dirs: [&Path; 2], checked: bool) -> Vec<Result<Option<String>, CheckpointError>> {
    run_ranks(2, |pg| {
        let dir = dirs[pg.rank()];
        let config = CheckpointConfig::new(dir).with_other_ranks_checked(checked);
        let ckpt = FullCheckpointer::new(config, pg).expect("new");
        let device = Default::default();
        let mut model = Mlp::<B>::new(&device, 4);
        let mut optim = adam();
        ckpt.load_latest(&device, &mut model, &mut optim)
            .map(|outcome| outcome.resumed().map(|r| r.info.name.clone()))
    })
}

fn assert_names_rank_1(results: &[Result<Option<String>, CheckpointError>], dir1: &Path) {
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(
                e @ CheckpointError::NewerCheckpointElsewhere {
                    rank: 1, step: 300, ..
                },
            ) => {
                let msg = e.to_string();
                for part in [
                    "rank 1",
                    "step 300",
                    &dir1.display().to_string(),
                    "every host that can become rank 0 shares",
                ] {
                    assert!(msg.contains(part), "rank {rank}: no {part:?} in: {msg}");
                }
            }
            other => panic!("rank {rank}: expected NewerCheckpointElsewhere, got {other:?}"),
        }
    }
}

#[test]
fn a_newer_checkpoint_in_another_ranks_directory_stops_the_load_on_every_rank() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1): (PathBuf, PathBuf) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[100]);
    save_steps(&dir1, &[300]);
    assert_names_rank_1(&load_on([&dir0, &dir1]), &dir1);
    // Nothing moved on either side.
    assert_eq!(
        entries_with_prefix(&dir0, "step-"),
        vec![checkpoint_name(100)]
    );
    assert_eq!(
        entries_with_prefix(&dir1, "step-"),
        vec![checkpoint_name(300)]
    );
}

/// With the check off (directories that may hold other runs' checkpoints), rank 0's own
/// choice is resumed, as before the check existed.
#[test]
fn with_the_check_off_rank_0s_checkpoint_is_resumed() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1): (PathBuf, PathBuf) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[100]);
    save_steps(&dir1, &[300]);
    for (rank, result) in load_with([&dir0, &dir1], false).into_iter().enumerate() {
        let name = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(name, Some(checkpoint_name(100)), "rank {rank}");
    }
}

#[test]
fn a_checkpoint_only_in_another_ranks_directory_stops_a_fresh_start() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1) = (root.path().join("new-host0"), root.path().join("host1"));
    save_steps(&dir1, &[300]);
    let results = load_on([&dir0, &dir1]);
    assert_names_rank_1(&results, &dir1);
    let msg = results[0].as_ref().expect_err("error").to_string();
    assert!(msg.contains("a fresh start"), "{msg}");
}

#[test]
fn ranks_sharing_one_directory_resume_as_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_steps(dir.path(), &[100, 300]);
    for result in load_on([dir.path(), dir.path()]) {
        assert_eq!(result.expect("resumed"), Some(checkpoint_name(300)));
    }
    // Also when rank 0 falls back past a corrupt newer checkpoint and sets it aside: the other
    // rank, on the same directory, does not take it for a newer one.
    save_steps(dir.path(), &[400]);
    let model = dir.path().join(checkpoint_name(400)).join(MODEL_FILE);
    let mut bytes = std::fs::read(&model).expect("read");
    bytes[0] ^= 0xff;
    std::fs::write(&model, bytes).expect("corrupt");
    for result in load_on([dir.path(), dir.path()]) {
        assert_eq!(result.expect("resumed"), Some(checkpoint_name(300)));
    }
}

/// The run id in the manifest of checkpoint `step` of `dir` (its `run_id`).
fn run_id(dir: &Path, step: u64) -> Option<String> {
    let path = dir.join(checkpoint_name(step)).join(MANIFEST_FILE);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read manifest")).expect("parse");
    manifest["run_id"].as_str().map(str::to_string)
}

/// `--fresh` on 2 ranks, rank `r` on `dirs[r]`, as ddp-examples' `start_over` does it: rank 0's
/// directory cleared (`rewind_to(0)`), the initial state saved as step 0 when it held any, the
/// fresh start recorded.
fn start_over(dirs: [&Path; 2], save_step_0: bool) {
    start_over_as(dirs, save_step_0, "launch-2");
}

/// [`start_over`] by launch `launch`.
fn start_over_as(dirs: [&Path; 2], save_step_0: bool, launch: &str) {
    run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dirs[pg.rank()]), pg).expect("new");
        ckpt.rewind_to(0).expect("rewind");
        if save_step_0 {
            save_random(&ckpt, TrainingState::new(0, 0));
        }
        ckpt.record_fresh_start(launch).expect("record");
    });
}

/// `fresh_start_launch` on 2 ranks, rank `r` on `dirs[r]`: each rank's answer.
fn launch_on(dirs: [&Path; 2]) -> Vec<Option<String>> {
    run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dirs[pg.rank()]), pg).expect("new");
        ckpt.fresh_start_launch()
            .expect("read the fresh-start record")
    })
}

/// `fresh_start_recorded(launch)` on 2 ranks, rank `r` on `dirs[r]`: each rank's answer.
fn recorded_on(dirs: [&Path; 2], launch: &str) -> Vec<bool> {
    run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dirs[pg.rank()]), pg).expect("new");
        ckpt.fresh_start_recorded(launch)
            .expect("read the fresh-start records")
    })
}

/// The finding this guards against: after `--fresh`, another host's own directory still held
/// the older run's newer checkpoint, and every restart was refused until it was removed or the
/// check turned off. The fresh start marks that run superseded: the new run resumes (with a
/// warning naming the directory), saves, and resumes its own checkpoints, keeping its run id.
#[test]
fn after_a_fresh_start_an_older_runs_checkpoint_on_another_rank_is_passed_over() {
    for save_step_0 in [false, true] {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir0, dir1) = (root.path().join("host0"), root.path().join("host1"));
        // Older runs' checkpoints on both hosts.
        save_steps(&dir0, &[100]);
        save_steps(&dir1, &[300]);
        let old_run = run_id(&dir1, 300).expect("a run id");
        start_over([&dir0, &dir1], save_step_0);
        assert_eq!(
            entries_with_prefix(&dir1, "step-"),
            vec![checkpoint_name(300)],
            "rank 1's directory is left as it was"
        );

        // The restart of the fresh run: not refused.
        let expect_first = save_step_0.then(|| checkpoint_name(0));
        let results = run_ranks(2, |pg| {
            let rank = pg.rank();
            let config = CheckpointConfig::new([&dir0, &dir1][rank]);
            let ckpt = FullCheckpointer::new(config, pg).expect("new");
            let (outcome, logs) = capture_logs(|| {
                let device = Default::default();
                let mut model = Mlp::<B>::new(&device, 4);
                let mut optim = adam();
                ckpt.load_latest(&device, &mut model, &mut optim)
                    .map(|o| o.resumed().map(|r| r.info.name.clone()))
            });
            // Its own saves and loads work on: saved, then resumed over the stale step 300.
            save_random(&ckpt, TrainingState::new(0, 50));
            let (again, _) = load_latest_fresh(&ckpt);
            let again = again.resumed().map(|r| r.info.name.clone());
            (outcome, logs, again)
        });
        for (rank, (outcome, logs, again)) in results.into_iter().enumerate() {
            let name =
                outcome.unwrap_or_else(|e| panic!("rank {rank} (step 0 {save_step_0}): {e}"));
            assert_eq!(name, expect_first, "rank {rank}");
            for part in [
                "passing over checkpoint step-0000000300",
                "rank 1's directory",
                &dir1.display().to_string(),
                &old_run,
            ] {
                assert!(logs.contains(part), "rank {rank}: no {part:?} in: {logs}");
            }
            assert_eq!(again, Some(checkpoint_name(50)), "rank {rank}");
        }
        let new_run = run_id(&dir0, 50).expect("a run id");
        assert_ne!(new_run, old_run);
        if save_step_0 {
            assert_eq!(run_id(&dir0, 0).as_deref(), Some(new_run.as_str()));
        }
        // Still the same run when resumed and saved on.
        save_steps(&dir0, &[60]);
        assert_eq!(run_id(&dir0, 60), Some(new_run));
        assert_eq!(
            entries_with_prefix(&dir1, "step-"),
            vec![checkpoint_name(300)]
        );
    }
}

/// Copies checkpoint `step` of `from` into `to` (a host that becomes rank 0 continues it).
fn copy_checkpoint(from: &Path, to: &Path, step: u64) {
    let (src, dst) = (
        from.join(checkpoint_name(step)),
        to.join(checkpoint_name(step)),
    );
    std::fs::create_dir_all(&dst).expect("mkdir");
    for entry in std::fs::read_dir(&src).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dst.join(entry.file_name())).expect("copy");
    }
}

/// A fresh start passes over only the runs it superseded: a newer checkpoint of the run rank 0
/// resumes still stops the load (the fresh run went on with host 1 as rank 0), and so does one
/// without a run id (written before run ids existed), which no fresh start can mark.
#[test]
fn a_newer_checkpoint_of_the_same_run_on_another_rank_still_stops_the_load() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[100]);
    save_steps(&dir1, &[200]);
    start_over([&dir0, &dir1], true);
    let record = std::fs::read_to_string(dir0.join(SUPERSEDED_RUNS_FILE)).expect("record");
    let old_run = run_id(&dir1, 200).expect("a run id");
    let new_run = run_id(&dir0, 0).expect("a run id");
    assert!(record.contains(&old_run), "{record}");
    assert!(!record.contains(&new_run), "{record}");
    // The fresh run went on with host 1 as rank 0: its older run's checkpoint removed there,
    // step 0 copied over, step 300 saved (the same run).
    std::fs::remove_dir_all(dir1.join(checkpoint_name(200))).expect("rm");
    copy_checkpoint(&dir0, &dir1, 0);
    save_steps(&dir1, &[300]);
    assert_eq!(run_id(&dir1, 300).as_deref(), Some(new_run.as_str()));
    assert_names_rank_1(&load_on([&dir0, &dir1]), &dir1);

    // An older build's checkpoint (no run id) left on host 1 when starting over: the fresh
    // start cannot tell its run, and the check refuses as before.
    let (dir0, dir1) = (root.path().join("b-host0"), root.path().join("b-host1"));
    save_steps(&dir1, &[300]);
    let manifest = dir1.join(checkpoint_name(300)).join(MANIFEST_FILE);
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).expect("read")).expect("parse");
    json.as_object_mut().expect("object").remove("run_id");
    std::fs::write(&manifest, serde_json::to_vec(&json).expect("json")).expect("write");
    assert_eq!(run_id(&dir1, 300), None);
    start_over([&dir0, &dir1], true);
    assert_names_rank_1(&load_on([&dir0, &dir1]), &dir1);

    // A superseded run's checkpoint whose manifest no longer parses names no run: it is not
    // passed over (a corrupt checkpoint is never skipped silently).
    let (dir0, dir1) = (root.path().join("c-host0"), root.path().join("c-host1"));
    save_steps(&dir0, &[100]);
    save_steps(&dir1, &[300]);
    start_over([&dir0, &dir1], true);
    let manifest = dir1.join(checkpoint_name(300)).join(MANIFEST_FILE);
    std::fs::write(&manifest, b"{ not json").expect("garble");
    assert_names_rank_1(&load_on([&dir0, &dir1]), &dir1);
}

/// Without a shared filesystem, `--fresh` with host 1 as rank 0 supersedes the run host 0 still
/// holds; the new run trains on host 1. When rank 0 moves back to host 0, its own directory's
/// newest checkpoint is the superseded run's: resuming it would silently drop the new run, so
/// the load fails on every rank, naming the checkpoint, its run and the record.
#[test]
fn a_superseded_runs_checkpoint_is_not_resumed_when_rank_0_moves_back() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[500]);
    let old_run = run_id(&dir0, 500).expect("a run id");
    start_over([&dir1, &dir0], false); // host 1 is rank 0
    save_steps(&dir1, &[300]);
    let new_run = run_id(&dir1, 300).expect("a run id");
    assert_ne!(new_run, old_run);
    for (rank, result) in load_on([&dir0, &dir1]).into_iter().enumerate() {
        let msg = match result {
            Err(e @ CheckpointError::SupersededCheckpoint { .. }) => e.to_string(),
            other => panic!("rank {rank}: expected SupersededCheckpoint, got {other:?}"),
        };
        for part in [
            checkpoint_name(500).as_str(),
            &old_run,
            "superseded",
            &dir0.display().to_string(),
            "--fresh",
        ] {
            assert!(msg.contains(part), "rank {rank}: no {part:?} in: {msg}");
        }
    }
    // Nothing moved.
    assert_eq!(
        entries_with_prefix(&dir0, "step-"),
        vec![checkpoint_name(500)]
    );
}

/// The fresh start's launch is recorded in every rank's directory: a restart of that launch
/// with another host as rank 0 resumes instead of starting over again, and the newest record
/// wins over an older launch's left on a host.
#[test]
fn a_fresh_start_is_recorded_in_every_ranks_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs: Vec<PathBuf> = (0..4)
        .map(|h| root.path().join(format!("host{h}")))
        .collect();
    start_over_as([&dirs[2], &dirs[3]], false, "launch-1");
    // The newest record is the one with the highest stamp (rank 0's clock, in ms).
    std::thread::sleep(std::time::Duration::from_millis(5));
    start_over_as([&dirs[1], &dirs[0]], false, "launch-2"); // host 1 is rank 0
    for pair in [
        [&dirs[0], &dirs[1]],
        [&dirs[1], &dirs[0]],
        [&dirs[2], &dirs[0]],
        [&dirs[0], &dirs[2]],
    ] {
        assert_eq!(recorded_on([pair[0], pair[1]], "launch-2"), [true, true]);
        for (rank, launch) in launch_on([pair[0], pair[1]]).into_iter().enumerate() {
            assert_eq!(
                launch.as_deref(),
                Some("launch-2"),
                "rank {rank} of {pair:?}"
            );
        }
    }
    assert_eq!(
        launch_on([&dirs[2], &dirs[3]]),
        vec![Some("launch-1".to_string()); 2]
    );
    // Ranks sharing one directory write the same record, each through its own temporary file.
    start_over_as([&dirs[0], &dirs[0]], false, "launch-3");
    assert_eq!(
        launch_on([&dirs[1], &dirs[0]]),
        vec![Some("launch-3".to_string()); 2]
    );
    assert_eq!(entries_with_prefix(&dirs[0], ".tmp-"), Vec::<String>::new());
}

/// A restart asks whether its own launch started over, not which record is newest: a record
/// left on a host with a stamp from a clock far ahead (or garbled) does not hide this launch's
/// fresh start, which would make the restart start over again and drop the run.
#[test]
fn a_stale_record_stamped_in_the_future_does_not_hide_this_launchs_fresh_start() {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs: Vec<PathBuf> = (0..3)
        .map(|h| root.path().join(format!("host{h}")))
        .collect();
    std::fs::create_dir_all(&dirs[2]).expect("mkdir");
    std::fs::write(
        dirs[2].join("fresh-start"),
        "launch-1\n18446744073709551614\n",
    )
    .expect("write a stale record");
    start_over_as([&dirs[0], &dirs[1]], true, "launch-2");
    assert_eq!(recorded_on([&dirs[0], &dirs[2]], "launch-2"), [true, true]);
    assert_eq!(recorded_on([&dirs[2], &dirs[0]], "launch-2"), [true, true]);
    assert_eq!(
        recorded_on([&dirs[0], &dirs[2]], "launch-3"),
        [false, false]
    );
    assert_eq!(recorded_on([&dirs[0], &dirs[2]], ""), [false, false]);
}

/// A rank whose checkpoint path cannot be created on its host (a mount or permission that
/// only rank 0's host has) only warns: the fresh start succeeds on every rank, as before the
/// records were written on every rank, and rank 0's record answers the restart.
#[test]
fn a_rank_that_cannot_write_its_directory_does_not_fail_the_fresh_start() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir0 = root.path().join("host0");
    let blocker = root.path().join("a-file");
    std::fs::write(&blocker, b"not a directory").expect("file");
    let bad = blocker.join("ckpt"); // ENOTDIR, even as root
    let logs = run_ranks(2, |pg| {
        let rank = pg.rank();
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new([&dir0, &bad][rank]), pg).expect("new");
        let (recorded, logs) = capture_logs(|| ckpt.record_fresh_start("launch-2"));
        recorded.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        logs
    });
    assert!(
        logs[1].contains("cannot write the fresh-start records"),
        "rank 1 warns: {}",
        logs[1]
    );
    assert_eq!(recorded_on([&dir0, &bad], "launch-2"), [true, true]);
}

/// A rank whose own directory another job holds (its lock) writes nothing there: that job's
/// records stay as they were, and the fresh start succeeds.
#[test]
fn a_fresh_start_writes_nothing_into_a_directory_another_job_holds() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, other) = (root.path().join("host0"), root.path().join("other-job"));
    start_over_as(
        [&other, &root.path().join("other-job-rank1")],
        false,
        "other-launch",
    );
    let before = std::fs::read(other.join("fresh-start")).expect("the other job's record");
    let held = ddp_core::checkpoint::lock_dir(&other).expect("the other job holds it");
    start_over_as([&dir0, &other], false, "launch-2");
    assert_eq!(
        std::fs::read(other.join("fresh-start")).expect("record"),
        before,
        "the other job's record is untouched"
    );
    drop(held);
    assert_eq!(recorded_on([&dir0, &other], "launch-2"), [true, true]);
}

/// `--fresh` over a directory holding a step-0 checkpoint: the new step 0 replaces the old
/// run's, it does not continue it, so the fresh run gets a new id.
#[test]
fn a_fresh_start_over_a_step_0_checkpoint_starts_a_new_run() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir0, dir1) = (root.path().join("host0"), root.path().join("host1"));
    save_steps(&dir0, &[0, 100]);
    save_steps(&dir1, &[300]);
    let old_run = run_id(&dir0, 0).expect("a run id");
    start_over([&dir0, &dir1], true);
    let new_run = run_id(&dir0, 0).expect("a run id");
    assert_ne!(new_run, old_run, "the fresh run kept the old run's id");
    save_steps(&dir0, &[10]);
    assert_eq!(run_id(&dir0, 10), Some(new_run));
}
