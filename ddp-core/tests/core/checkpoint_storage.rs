//! The storage layer's public face (`ddp_core::checkpoint::storage`), as ddp-train uses it:
//! rank 0 reads files and every rank gets their bytes; a file rank 0 cannot read fails every
//! rank, naming it.
use crate::common::*;
use ddp_core::checkpoint::storage::{read_on_rank0, write_file_atomically};
use ddp_core::checkpoint::{CheckpointError, StorageError};
use std::io::Write;
use std::path::PathBuf;

#[test]
fn every_rank_receives_the_bytes_rank_0_read_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = [b"model bytes".to_vec(), Vec::new(), vec![7u8; 100_000]];
    let paths: Vec<PathBuf> = (0..files.len())
        .map(|i| dir.path().join(format!("file-{i}")))
        .collect();
    for (path, bytes) in paths.iter().zip(&files) {
        write_file_atomically(path, |f| f.write_all(bytes)).expect("write");
    }
    let received = run_ranks(3, |pg| {
        // Only rank 0's paths are read: the others name files that do not exist.
        let mine: Vec<PathBuf> = if pg.rank() == 0 {
            paths.clone()
        } else {
            (0..files.len())
                .map(|i| PathBuf::from(format!("/nonexistent/{i}")))
                .collect()
        };
        read_on_rank0(&pg, &mine).expect("read")
    });
    for (rank, got) in received.iter().enumerate() {
        assert!(got == &files, "rank {rank} received other bytes");
    }
}

#[test]
fn a_file_rank_0_cannot_read_fails_every_rank_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let present = dir.path().join("model-1.mpk");
    std::fs::write(&present, b"whole").expect("write");
    let missing = dir.path().join("optim-1.mpk");
    let errors = run_ranks(2, |pg| {
        read_on_rank0(&pg, &[present.clone(), missing.clone()]).expect_err("rank 0 cannot read")
    });
    match &errors[0] {
        CheckpointError::Storage(StorageError::Read { path, .. }) => assert_eq!(path, &missing),
        other => panic!("rank 0: expected a read error, got {other:?}"),
    }
    match &errors[1] {
        CheckpointError::Rank0Failed { message, .. } => {
            assert!(message.contains("optim-1.mpk"), "{message}")
        }
        other => panic!("rank 1: expected rank 0's failure, got {other:?}"),
    }
}
