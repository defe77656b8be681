//! All of this crate's integration tests in one binary: burn is linked once instead of
//! once per file. Each module is one former test file; `cargo test --test core NAME`
//! filters as before.

mod checkpoint_common;
mod common;

mod amp;
mod checkpoint_collective;
mod checkpoint_corruption;
mod checkpoint_elsewhere;
mod checkpoint_exact_resume;
mod checkpoint_interop;
mod checkpoint_io_errors;
mod checkpoint_lock;
mod checkpoint_read_only;
mod checkpoint_resave;
mod checkpoint_rotation;
mod checkpoint_set_aside;
mod checkpoint_sharded;
mod checkpoint_storage;
mod checkpoint_versions;
mod checkpoint_world_size;
mod ddp_buckets;
mod ddp_equivalence;
mod ddp_features;
mod ddp_join_hooks;
mod ddp_misuse;
mod ddp_semantics;
mod ddp_step_on;
mod device_stand_in;
mod exact_evaluation;
mod fsdp;
mod fsdp_checkpoint;
#[cfg(feature = "cuda")]
mod gpu_cuda;
#[cfg(feature = "ndarray")]
mod ndarray_backend;
mod old_paths;
mod sync_batch_norm;
mod zero;
mod zero2;
