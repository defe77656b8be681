//! One job per checkpoint directory: while one job's checkpointer lives, a second job's is
//! refused with an error naming the holder, before it can remove or write anything; the lock
//! is free again once the first job's checkpointer is gone.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, TrainingState, checkpoint_name};

#[test]
fn a_second_job_on_the_same_directory_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(1, |pg| {
        let first = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("first");
        save_random(&first, TrainingState::new(0, 5));

        // Another job (its own process group) on the same directory, while the first lives.
        let second = run_ranks(2, |pg| {
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        let msg = second[0].as_ref().expect_err("the second job is refused");
        assert!(
            msg.contains("in use by another job")
                && msg.contains(&format!("pid {}", std::process::id()))
                && msg.contains("host ")
                && msg.contains("started "),
            "the error names the holder: {msg}"
        );
        let other = second[1].as_ref().expect_err("every rank of it learns");
        assert!(other.contains("in use by another job"), "{other}");
        // The first job's checkpoint is untouched, and it goes on saving.
        save_random(&first, TrainingState::new(0, 6));
        assert_eq!(
            first.list().expect("list"),
            [checkpoint_name(5), checkpoint_name(6)]
        );
    });
    // The first job is gone: the directory is free.
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("free");
        let (outcome, _) = load_latest_fresh(&ckpt);
        assert_eq!(
            outcome.resumed().expect("resumed").info.name,
            checkpoint_name(6)
        );
    });
}

/// `with_dir_lock(false)` (a file system without locks): the checkpointer opens without taking
/// the lock, so it opens beside a holder; the lock stays the default, and survives a JSON
/// round trip of the settings.
#[test]
fn without_the_directory_lock_a_checkpointer_opens_beside_a_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let held = ddp_core::checkpoint::lock_dir(dir.path()).expect("another job's lock");
    run_ranks(2, |pg| {
        let unlocked = CheckpointConfig::new(dir.path()).with_dir_lock(false);
        let ckpt = FullCheckpointer::new(unlocked, pg).expect("opens without the lock");
        save_random(&ckpt, TrainingState::new(0, 3));
    });
    let locked = CheckpointConfig::new(dir.path());
    assert!(locked.dir_lock(), "the lock is the default");
    let json = serde_json::to_string(&locked).expect("json");
    let without_field = json.replace(",\"dir_lock\":true", "");
    assert_ne!(json, without_field, "{json}");
    let old: CheckpointConfig = serde_json::from_str(&without_field).expect("older settings");
    assert!(
        old.dir_lock(),
        "settings saved before the option load with the lock on"
    );
    drop(held);
}
