//! # ddp-launch
//!
//! Starting and supervising data-parallel jobs: burn's `torchrun`. This crate does not depend on
//! burn, so the `ddp-run` binary builds without it; ddp-core re-exports it as
//! `ddp_core::launcher` (and its `launch` function as `ddp_core::launch`).
//!
//! Two front ends share one supervisor:
//!
//! - [`launch`]: a training binary starts its own workers. Run it normally with launcher flags
//!   (`cargo run --release --example train -- --nproc-per-node 2 --epochs 3`); it starts itself
//!   again once per rank with the worker environment, and in each worker calls your training
//!   function with a [`WorkerContext`] (rank, local rank, world size, device index, restart
//!   count, a joined [`ProcessGroup`](ddp_comm::ProcessGroup)).
//! - `ddp-run`: the same for any program,
//!   `ddp-run --nproc-per-node 2 -- ./train --epochs 3`. The program joins the job with
//!   [`init_from_env`] or [`launch`].
//!
//! Flags are parsed into [`LaunchArgs`] (what was typed) and validated into a [`LaunchPlan`]
//! (world size, ranks, ports, the environment of each worker), which [`LaunchPlan::run`]
//! executes.
//!
//! # Complete example
//! ```no_run
//! use clap::Parser;
//! use ddp_comm::ReduceOp;
//! use ddp_launch::{LaunchArgs, LaunchError, WorkerContext};
//!
//! /// Your program's flags; the launcher's are flattened in.
//! #[derive(Parser)]
//! struct Args {
//!     #[arg(long, default_value_t = 3)]
//!     epochs: usize,
//!     #[command(flatten)]
//!     launch: LaunchArgs,
//! }
//!
//! fn train(ctx: WorkerContext, args: &Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     // With --max-restarts, a restarted group resumes from its latest checkpoint here
//!     // (and ignores "start over" flags: they were meant for the first attempt).
//!     let first_epoch = if ctx.is_restart() { /* load checkpoint */ 0 } else { 0 };
//!     for epoch in first_epoch..args.epochs {
//!         let mut loss = [1.0f32 / (epoch + 1) as f32];
//!         ctx.process_group().all_reduce(&mut loss, ReduceOp::Avg)?;
//!         if ctx.is_main() {
//!             println!("epoch {epoch}: loss {:.3} on {} ranks", loss[0], ctx.world_size());
//!         }
//!     }
//!     Ok(())
//! }
//!
//! fn main() -> Result<(), LaunchError> {
//!     let args = Args::parse();
//!     ddp_launch::launch(&args.launch, |ctx| train(ctx, &args))
//! }
//! ```
//! `anyhow::Result<()>` works as the training function's return type too.
//!
//! Run it:
//! ```text
//! cargo run --release --example train -- --nproc-per-node 2 --epochs 3
//! cargo run --release --example train -- --nproc-per-node auto --max-restarts 3 --log-dir logs
//! ddp-run --nproc-per-node 2 -- target/release/examples/train --epochs 3
//! # two nodes (same command on both, each with its --node-rank; same secret token):
//! export DDP_JOB_TOKEN=$(openssl rand -hex 16)   # copy the value to every node
//! ddp-run --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr 10.0.0.1 --master-port 29500 -- ./train
//! ddp-run --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr 10.0.0.1 --master-port 29500 -- ./train
//! ```
//!
//! # Layout
//! By role, each a folder. The worker side builds on its own (without the `supervisor`
//! feature): `worker/` is what a training process runs ([`init_from_env`], the job environment
//! and the variables a launcher sets, [`WorkerContext`]), with `progress/` and the failure
//! summary types at the root. The launcher side needs `supervisor`: `plan/` turns flags into a
//! [`LaunchPlan`] (nothing started); `rendezvous/` holds ports and joins the nodes;
//! `supervise/` spawns, watches, blames and restarts the workers (static and elastic);
//! `entry.rs` is [`launch`], which runs one side or the other. The worker side never imports
//! the launcher side.
//!
//! # Worker environment
//! Every worker gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK` (node
//! rank), `GROUP_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `DDP_RESTART_COUNT` (elastic jobs
//! also `DDP_RDZV_ROUND`; and torchrun's
//! `TORCHELASTIC_RESTART_COUNT` (elastic jobs: failed rounds only, as torchrun counts),
//! `TORCHELASTIC_MAX_RESTARTS`, `TORCHELASTIC_RUN_ID` (`--rdzv-id`, default `none`),
//! `ROLE_NAME=default`, `ROLE_RANK`, `ROLE_WORLD_SIZE`), `DDP_JOB_TOKEN`,
//! `DDP_LAUNCH_WORKER=1`, and `OMP_NUM_THREADS`/`RAYON_NUM_THREADS` = cores / local ranks unless
//! already set. On glibc Linux they also get [`ALLOCATOR_ENV`] (keep freed buffers of up to
//! 1 GiB mapped, so burn's per-step allocations stop page-faulting) unless any `MALLOC_*`
//! variable, `GLIBC_TUNABLES` or `LD_PRELOAD` is set. Node `k`'s local rank `j` is global rank `k * nproc_per_node + j`; the device
//! index is the local rank. Standard input is closed (`/dev/null`).
//!
//! # Output and progress
//! Workers' lines are printed prefixed with `[rank N]: `. A worker's stderr is a pipe, so when
//! the launcher's stderr is a terminal, global rank 0 also gets `DDP_PROGRESS_FD`, an inherited
//! pipe for the progress reports of ddp-core's `EpochProgress` ([`progress`]): the launcher draws rank 0's bar live
//! and prints every worker's lines above it. Otherwise (a file, a pipe, `TERM=dumb`) rank 0
//! prints a line every few seconds. `DDP_PROGRESS=bar|lines|auto` overrides the choice.
//!
//! The job token is random per job, or `DDP_JOB_TOKEN` when set. **Multi-node jobs require it
//! set, to the same secret, on every node** (otherwise the launcher refuses to start).
//!
//! # Other launchers
//! [`launch`] also runs as a worker directly, without spawning, when started by
//! torchrun (or with `RANK`/`WORLD_SIZE` set by hand), Slurm's `srun` (`SLURM_PROCID`,
//! `SLURM_NTASKS`/`SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`, tasks per node, `SLURM_NODEID`; the
//! master is `MASTER_ADDR` or the first host of the step's node list, else
//! `SLURM_LAUNCH_NODE_IPADDR`; the port is `MASTER_PORT` or derived from the job and step ids)
//! or Open MPI's `mpirun` (`OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}`). Under
//! `mpirun` nothing else is needed on one host: `MASTER_ADDR` defaults to `127.0.0.1` when every
//! rank is local (across hosts, set it: `mpirun -x MASTER_ADDR=<host of rank 0> ...`), and
//! `MASTER_PORT` defaults to a value derived from the Open MPI job id
//! (`OMPI_MCA_ess_base_jobid`, or `PMIX_NAMESPACE` on Open MPI 5; port in 10000..32000,
//! below Linux's ephemeral ports, so no outgoing connection holds it), so concurrent jobs on
//! one host use different ports and cannot join each other. A port that is taken makes rank 0
//! fail, and `mpirun` then stops the job. See [`WorkerEnv`].
//!
//! **A job across nodes needs a secret** under every launcher: `DDP_JOB_TOKEN`, or under
//! Open MPI 4 the per-job key `mpirun` gives its processes
//! (`OMPI_MCA_orte_precondition_transports`). Job ids, host names and ports are public, so no
//! token is derived from them; without a secret each worker stops with an error saying how to
//! set one. On one node the ranks meet on loopback.
//!
//! # Failures, restarts, signals
//! - When a worker exits non-zero or is killed by a signal, the others get SIGTERM, then
//!   SIGKILL after `--grace-period` (5 s), and a summary names the first failing rank, its exit
//!   code or signal, and its last `--tail-lines` (20) lines of output.
//! - With `--max-restarts N` the whole group is restarted up to `N` times, with a fresh
//!   `MASTER_PORT` unless `--master-port` fixed it, and `DDP_RESTART_COUNT` incremented;
//!   training that resumes from its latest checkpoint continues where it stopped. Every attempt
//!   gets the same command line, so a flag like `--fresh` must only apply when
//!   [`WorkerContext::is_restart`] is false, or each restart would start the run over.
//! - SIGINT, SIGTERM, SIGHUP and SIGQUIT to the launcher are forwarded to every worker, which
//!   then get the grace period before SIGKILL (a second signal skips it); the launcher then
//!   fails with [`LaunchError::Interrupted`] (`ddp-run` exits with 128 + the signal number). A
//!   signal ignored when the launcher started stays ignored, by it and by its workers: `nohup
//!   ddp-run ...` survives a hang-up, and a shell's background job keeps ignoring SIGINT and
//!   SIGQUIT.
//! - No worker outlives the launcher: each runs in its own process group (killed as a group,
//!   so what it started goes too) with `PR_SET_PDEATHSIG = SIGKILL` (Linux), so even a launcher killed
//!   with SIGKILL takes its workers with it. (Processes a worker started survive a SIGKILLed
//!   launcher unless they set up the same.)
//!
//! # Multi-node
//! Static rendezvous: node 0's launcher hosts a store on `--master-port`; every node runs the
//! same command with its own `--node-rank`. For each attempt node 0 picks a free port on its
//! host for the workers' store (so firewalls must let the nodes reach node 0's ephemeral ports,
//! and the workers' peer-to-peer ports, as with torchrun). Nodes must agree on `--nnodes`,
//! `--nproc-per-node`, `--max-restarts` and the launcher's rendezvous protocol version
//! (checked); a failure on one node stops and restarts (or stops for good) every node. Every node's workers get node 0's `DDP_LAUNCH_ID`. A node
//! whose workers all succeeded waits up to `--join-timeout` for the others to finish, then (as
//! torchrun's exit barrier) warns naming those it did not hear from and exits successfully;
//! node 0 keeps serving the rendezvous while other nodes still run (a signal stops that wait).
//! A node whose launcher died rejoins when its launcher is started again (as with torchrun):
//! the new launcher sees the old one's heartbeat in the rendezvous stay still for 15 s, takes its
//! `--node-rank` over, and joins the job as it forms, or every node restarts its workers (a
//! restart is spent; with none left it says so and stops, leaving the running attempt alone). A second launcher for a node whose launcher runs is refused.
//!
//! # Elastic jobs
//! `--nnodes MIN:MAX --rdzv-endpoint HOST:PORT` (the same command on every node, no
//! `--node-rank`): each node's launcher joins numbered rendezvous rounds (`--rdzv-backend
//! c10d`: a store hosted by the launcher on HOST, the first to bind the endpoint). A round
//! starts with MIN to MAX nodes (after `--rdzv-last-call` for more), ranks nodes by join order,
//! and ends when a worker fails, a node's heartbeats stop for `--rdzv-heartbeat-timeout`, a
//! node's launcher is interrupted, or a new node asks to join; the others then stop their
//! workers and form the next round, whose workers get the new `WORLD_SIZE`, their ranks, a
//! fresh `MASTER_ADDR`/`MASTER_PORT` and [`RDZV_ROUND_ENV`] = `DDP_RESTART_COUNT` = the round,
//! and resume from their latest checkpoint. `--max-restarts` counts rounds that ended in a
//! failure; the summary lists every round ([`ElasticRound`]). With `c10d` the hosting
//! launcher is a single point of failure; `--rdzv-backend etcd` (feature `etcd`) keeps the
//! rounds in an etcd v3 cluster at `--rdzv-endpoint` instead, so any node may die.
//!
//! # Features
//! - `supervisor` (default): the launcher side: `ddp-run`, [`launch`], [`LaunchArgs`],
//!   [`LaunchPlan`]. Turn default features off for the worker side alone (what ddp-core depends
//!   on without its `launch` feature): no flag parser, no supervisor.
//! - `etcd`: the `etcd` rendezvous backend (the `etcd-client` crate, whose build needs
//!   `protoc`). Without it, `--rdzv-backend etcd` is an error saying to build with it.
//!
//! # Not yet
//! - `--nproc-per-node auto` counts CPU cores, not GPUs: pass the GPU count explicitly.
#![warn(missing_docs)]

mod error;
#[cfg(feature = "supervisor")]
mod note;
pub mod progress;
mod round_summary;
mod signal_names;
mod summary;
mod worker;

// The launcher's side: planning, starting and supervising workers (`ddp-run`, [`launch`]).
#[cfg(feature = "supervisor")]
mod entry;
#[cfg(feature = "supervisor")]
mod launcher_id;
#[cfg(feature = "supervisor")]
mod node_sync;
#[cfg(feature = "supervisor")]
mod plan;
#[cfg(feature = "supervisor")]
mod rendezvous;
#[cfg(feature = "supervisor")]
mod rendezvous_protocol;
#[cfg(feature = "supervisor")]
mod signals;
#[cfg(feature = "supervisor")]
mod supervise;
#[cfg(all(test, feature = "supervisor"))]
mod test_support;

pub use error::LaunchError;
pub use round_summary::ElasticRound;
pub use summary::{FailureCause, FailureSummary, RankFailure, WorkerExit};
pub use summary::{RootCause, Victim};
pub use worker::context::WorkerContext;
pub use worker::env::launcher_vars::{
    ALLOCATOR_ENV, LAUNCH_ID_ENV, RDZV_ROUND_ENV, RESTART_COUNT_ENV, WORKER_ENV,
};
pub use worker::env::{DEFAULT_MASTER_PORT, LauncherKind, WorkerEnv};
pub use worker::init::init_from_env;

#[cfg(feature = "supervisor")]
pub use entry::launch;
#[cfg(feature = "supervisor")]
pub use plan::args::{LaunchArgs, MAX_DURATION, NprocPerNode};
#[cfg(feature = "supervisor")]
pub use plan::node_count::{NodeCount, RdzvBackend};
#[cfg(feature = "supervisor")]
pub use plan::{LaunchPlan, MasterPort};
