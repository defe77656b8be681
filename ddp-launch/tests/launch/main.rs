//! The launcher's integration tests in one binary: they run `ddp-run` and the `launch_worker`
//! example as real processes. Each module is one former test file; `cargo test --test launch
//! NAME` filters as before.

mod launch_common;

mod launch_broken_stderr;
mod launch_elastic;
#[cfg(feature = "etcd")]
mod launch_elastic_etcd;
mod launch_env;
mod launch_errors;
mod launch_failures;
mod launch_first_failure;
mod launch_limits;
mod launch_log_dir;
mod launch_loopback_nodes;
mod launch_multinode;
mod launch_orphans;
mod launch_progress;
mod launch_strangers;
mod launch_strict_env;
mod launch_torchrun;
