//! All of this crate's integration tests in one binary: burn is linked once instead of
//! once per file. Each module is one former test file; `cargo test --test processes NAME`
//! filters as before.

mod checkpoint_crash;
mod comm_processes;
mod ddp_processes;
mod launch_restart_resume;
mod shm_processes;
