//! An intact checkpoint written by another version (another manifest format, or a training
//! state this build cannot parse) is not corruption: the load stops on every rank with an
//! error saying so, instead of setting it aside and resuming an older checkpoint.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, LATEST_FILE, MANIFEST_FILE, STATE_FILE,
    TrainingState, checkpoint_name,
};
use std::path::Path;

/// Saves steps 100 and 200 of random models into `dir` (1 rank).
fn save_100_and_200(dir: &Path) {
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("new");
        for step in [100, 200] {
            save_random(&ckpt, TrainingState::new(0, step));
        }
    });
}

/// Rewrites `manifest.json` of `checkpoint` in `dir` with `edit` applied (the manifest lists
/// the other files' hashes; it is not hashed itself).
fn edit_manifest(dir: &Path, checkpoint: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(checkpoint).join(MANIFEST_FILE);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read manifest")).expect("parse");
    edit(&mut manifest);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).expect("json")).expect("write");
}

/// `load_latest` on 2 ranks over `dir`: every rank's error.
fn load_latest_errors(dir: &Path) -> Vec<CheckpointError> {
    run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).expect("new");
        let device = Default::default();
        let mut model = Mlp::<B>::new(&device, 4);
        let mut optim = adam();
        match ckpt.load_latest(&device, &mut model, &mut optim) {
            Ok(outcome) => panic!("expected an error, resumed: {outcome}"),
            Err(e) => e,
        }
    })
}

/// Step 200 is still where it was, nothing was set aside, `latest` did not move.
fn assert_untouched(dir: &Path) {
    assert_eq!(
        entries_with_prefix(dir, "step-"),
        vec![checkpoint_name(100), checkpoint_name(200)]
    );
    let latest = std::fs::read_to_string(dir.join(LATEST_FILE)).expect("latest");
    assert_eq!(latest.trim(), checkpoint_name(200));
}

#[test]
fn a_checkpoint_of_a_newer_format_stops_the_load_on_every_rank_and_stays() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_100_and_200(dir.path());
    // Written by a newer build: format 2, every file's hash correct.
    edit_manifest(dir.path(), &checkpoint_name(200), |m| {
        m["format_version"] = 2.into();
    });
    let errors = load_latest_errors(dir.path());
    assert!(
        matches!(&errors[0], CheckpointError::Incompatible { name, .. } if *name == checkpoint_name(200)),
        "{}",
        errors[0]
    );
    assert!(
        matches!(&errors[1], CheckpointError::Rank0Failed { .. }),
        "{}",
        errors[1]
    );
    for (rank, e) in errors.iter().enumerate() {
        let msg = e.to_string();
        for part in [
            "step-0000000200",
            "format v2",
            "this build reads v1",
            "upgrade",
            "move it",
        ] {
            assert!(msg.contains(part), "rank {rank}: no {part:?} in: {msg}");
        }
    }
    assert_untouched(dir.path());
}

#[test]
fn a_newer_format_of_another_shape_is_still_recognised_as_a_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_100_and_200(dir.path());
    // A format 2 manifest that this build's manifest type cannot even parse.
    edit_manifest(dir.path(), &checkpoint_name(200), |m| {
        *m = serde_json::json!({ "format_version": 2, "shards": [] });
    });
    let errors = load_latest_errors(dir.path());
    let msg = errors[0].to_string();
    assert!(
        msg.contains("format v2") && msg.contains("this build reads v1"),
        "{msg}"
    );
    assert_untouched(dir.path());
}

#[test]
fn a_training_state_that_passes_its_hash_but_does_not_parse_is_version_skew() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_100_and_200(dir.path());
    // Hashes cover training_state.json: one that matches its hash yet does not parse was
    // written that way, by a build with another state schema.
    let state = br#"{"schema": "from another build"}"#;
    let step_dir = dir.path().join(checkpoint_name(200));
    std::fs::write(step_dir.join(STATE_FILE), state).expect("write state");
    edit_manifest(dir.path(), &checkpoint_name(200), |m| {
        let files = m["files"].as_array_mut().expect("files");
        let entry = files
            .iter_mut()
            .find(|f| f["name"] == STATE_FILE)
            .expect("state entry");
        entry["size"] = state.len().into();
        entry["sha256"] = ddp_core::checkpoint::sha256_hex(state).into();
    });
    let errors = load_latest_errors(dir.path());
    for (rank, e) in errors.iter().enumerate() {
        let msg = e.to_string();
        assert!(
            msg.contains("step-0000000200") && msg.contains(STATE_FILE) && msg.contains("upgrade"),
            "rank {rank}: {msg}"
        );
    }
    assert_untouched(dir.path());
}
