//! All of this crate's integration tests in one binary: burn is linked once instead of
//! once per file. Each module is one former test file; `cargo test --test examples NAME`
//! filters as before.

mod common;

mod checkpoint_safety;
mod digits_cnn;
mod examples_end_to_end;
mod from_pytorch;
mod open_mpi;
mod restart_fresh;
mod slurm;
mod transformer_shard;
mod uneven_inputs;
