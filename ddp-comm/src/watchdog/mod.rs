//! The collective watchdog: no supervised collective waits forever.
//!
//! NCCL has no timeouts: a rank that stops issuing collectives (stuck in compute or data
//! loading, taking another code path, or dead) leaves its peers waiting inside NCCL forever. A
//! [`Watchdog`] bounds that wait. Each collective is [issued](Watchdog::issue) with a
//! [`CompletionProbe`] (for NCCL, a CUDA event recorded after it) and gets a sequence number; a
//! thread polls every in-flight item, and an optional probe for the whole communicator
//! (`ncclCommGetAsyncError`), every [`poll_interval`](WatchdogConfig::poll_interval).
//!
//! - [`WatchdogConfig`]: group name, rank, world size, timeout, poll and publish intervals.
//! - [`Watchdog`] and [`WatchedWork`]: issuing and waiting.
//! - [`CompletionProbe`], [`CollectiveLabel`]: what is supervised.
//! - [`WatchdogFailure`]: the error every waiter gets, as [`CommError::Watchdog`](crate::CommError::Watchdog).
//!
//! # Progress in the store
//! Each rank publishes its last issued and last completed sequence numbers under
//! `watchdog/<group>/<rank>` (text, `"<issued> <completed>"`), at most once per
//! [`publish_interval`](WatchdogConfig::publish_interval) and at once on failure, from a
//! thread of its own so a slow store never delays the polling.
//!
//! # Failure
//! When an item is not complete [`timeout`](WatchdogConfig::timeout) after it was issued, when
//! a probe reports an error, or when the async-error probe fires, the watchdog calls the abort
//! callback (once), reads every rank's progress from the store (one `multi_get` per 1,024
//! ranks, giving up after [`report_budget`](WatchdogConfig::report_budget), about 1 s) and
//! fails the group: the [`WatchdogFailure`] names the stuck collective (sequence number, op,
//! bucket, bytes, how long it waited) and the ranks that never issued it (a rank that never
//! published counts as having issued nothing), or says that every rank issued it and none
//! finished (a network or NCCL failure). Every waiter, and every later call, gets that error. An error on this rank
//! ([`Watchdog::fail`], a probe's error) names no peer as behind.
//!
//! # A stuck polling thread
//! Timeouts are checked by the polling thread; a probe call that never returns (a CUDA event
//! query in a hung driver) would stop them all. A second thread per watchdog fails the group
//! with [`WatchdogCause::Stalled`] once one probe call has lasted longer than
//! [`stall_limit`](WatchdogConfig::stall_limit) (the timeout, unless set), as PyTorch's
//! heartbeat monitor does; the stuck thread is left behind when the watchdog is dropped.
//!
//! # A dead or frozen peer
//! NCCL often never reports a peer whose process died (same host, over shared memory or
//! NVLink). Each rank's store thread bumps a heartbeat in the store; while this rank waits on
//! a collective, a peer whose heartbeat stands still for
//! [`silence_limit`](WatchdogConfig::silence_limit) (60 s) fails the group with
//! [`WatchdogCause::PeerSilent`], naming it, instead of the whole timeout later (see
//! `heartbeat.rs`).
//!
//! # Peers
//! The first rank to fail the group publishes its error under `watchdog/<group>/failed`; every
//! other rank's watchdog checks that key every
//! [`peer_check_interval`](WatchdogConfig::peer_check_interval) (1 s) and fails too
//! ([`WatchdogCause::PeerFailed`], quoting it), instead of waiting for its own timeout.
//!
//! # Starting again on one store
//! The keys above are those of a group's first watchdog on a store. Each rank counts its starts
//! of a group's watchdog on a store (`watchdog@starts/<group>/<rank>`); the `n`-th start
//! ([`Watchdog::generation`]) uses `watchdog@<n>/<group>/` instead of `watchdog/<group>/`, so a
//! watchdog started again under the same name never quotes the old run's failure or reads its
//! progress. Every rank starts a group's watchdogs on a store equally often. (A process group's
//! NCCL watchdog meets through the group's own store, new with each group.)
//!
//! # Completions after an abort
//! An aborted NCCL collective's event completes too, over garbage. So nothing is marked done
//! once the failure path has started, and [`WatchedWork::finish_observed`] (a waiter that saw
//! the event itself) returns the failure then.
//!
//! # Example
//! ```
//! use ddp_comm::watchdog::{CollectiveLabel, CompletionProbe, Watchdog, WatchdogConfig};
//! use ddp_comm::{Store, StoreConfig, StoreServer};
//! use std::sync::Arc;
//! use std::time::Duration;
//! let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new())?;
//! let store = Store::connect(&server.local_addr().to_string(), StoreConfig::new())?;
//! let config = WatchdogConfig::new("world", 0, 1, Duration::from_secs(60));
//! let abort = Box::new(|| eprintln!("aborting the communicator"));
//! let watchdog = Watchdog::start(&store, config, abort, None)?;
//! // A probe that says "done" at once; NCCL's queries a CUDA event.
//! let probe: Arc<dyn CompletionProbe> = Arc::new(|| Ok(true));
//! let work = watchdog.issue(CollectiveLabel::new("all_reduce").with_bucket(0), 4096, probe)?;
//! assert_eq!(work.seq(), 1);
//! work.wait()?; // or CommError::Watchdog naming the collective and the ranks behind it
//! assert_eq!(watchdog.last_completed(), 1);
//! # Ok::<(), ddp_comm::CommError>(())
//! ```

mod bounded;
mod config;
mod heartbeat;
mod monitor;
mod probe;
mod reporter;
mod stall;

pub use crate::failure::{
    CollectiveLabel, PeerProgress, RankProgress, StuckWork, WatchdogCause, WatchdogFailure,
};

/// Renamed [`WatchdogCause`] (the launcher's attempt failure is `ddp_launch::FailureCause`).
#[deprecated(
    since = "0.1.0",
    note = "renamed: use `ddp_comm::watchdog::WatchdogCause`"
)]
pub type FailureCause = WatchdogCause;
#[cfg(feature = "cuda")]
pub(crate) use bounded::{ABORT_WAIT, Bounded, run_bounded};
pub use config::WatchdogConfig;
#[cfg(feature = "cuda")]
pub(crate) use monitor::WatchdogFailer;
pub use monitor::{Watchdog, WatchedWork};
pub use probe::{AbortFn, AsyncErrorProbe, CompletionProbe};
