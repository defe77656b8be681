//! Test harness: ranks as threads in one process, sharing a store server.
#![allow(dead_code)]

pub mod mpi;

use ddp_comm::{
    CommError, ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer, TransportKind,
};
use std::time::Duration;

/// How the ranks of a test world talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// TCP only (`DDP_TRANSPORT=tcp`).
    Tcp,
    /// Shared memory: threads of one process share a host.
    Shm,
    /// Shared memory with 4 KiB staging buffers, so that buffers stream through many steps.
    ShmSmall,
    /// Two pretend hosts (host ids `rank % 2`), shared memory within each with 4 KiB staging
    /// buffers: the hierarchical path (with 3 ranks, one host has a single rank).
    TwoHosts,
    /// MPI (`DDP_TRANSPORT=mpi`, feature `mpi`): each rank a process under a real `mpirun`
    /// (see [`mpi::run_test`]); the harness then returns this process's result only.
    Mpi,
}

/// Every setup, for tests that loop over them.
pub const SETUPS: [Setup; 4] = [Setup::Tcp, Setup::Shm, Setup::ShmSmall, Setup::TwoHosts];

/// Staging buffer size of the `*Small` setups.
pub const SMALL_BUFFER: usize = 4096;

impl Setup {
    pub fn config(self, rank: usize, n: usize, timeout: Duration) -> ProcessGroupConfig {
        let c = ProcessGroupConfig::new(rank, n).with_timeout(timeout);
        match self {
            Setup::Tcp => c.with_transport(TransportKind::Tcp),
            Setup::Shm => c.with_transport(TransportKind::Shm),
            Setup::ShmSmall => c
                .with_transport(TransportKind::Shm)
                .with_shm_buffer_bytes(SMALL_BUFFER),
            Setup::TwoHosts => c
                .with_transport(TransportKind::Shm)
                .with_shm_buffer_bytes(SMALL_BUFFER)
                .with_host_id(format!("test-host-{}", rank % 2)),
            Setup::Mpi => c.with_transport(TransportKind::Mpi),
        }
    }

    /// What [`ProcessGroup::shared_memory_groups`] must say for a world of `n`.
    pub fn expected_groups(self, n: usize) -> Vec<Vec<usize>> {
        match self {
            Setup::Tcp | Setup::Mpi => (0..n).map(|r| vec![r]).collect(),
            Setup::Shm | Setup::ShmSmall => vec![(0..n).collect()],
            Setup::TwoHosts => {
                let mut g: Vec<Vec<usize>> =
                    vec![(0..n).step_by(2).collect(), (1..n).step_by(2).collect()];
                g.retain(|h| !h.is_empty());
                if g.iter().all(|h| h.len() == 1) {
                    (0..n).map(|r| vec![r]).collect()
                } else {
                    g
                }
            }
        }
    }

    /// How many ranks of a world of `n` run in this process (and so how many results the
    /// harness returns).
    pub fn ranks_here(self, n: usize) -> usize {
        if self == Setup::Mpi { 1 } else { n }
    }

    /// What [`ProcessGroup::backend_name`] must say for a world of `n`.
    pub fn expected_backend(self, n: usize) -> &'static str {
        match self {
            Setup::Tcp => "tcp",
            Setup::Mpi => "mpi",
            Setup::Shm | Setup::ShmSmall if n > 1 => "shm+tcp",
            Setup::TwoHosts if n > 2 => "shm+tcp",
            _ => "tcp",
        }
    }
}

/// Runs `body` on `n` ranks (threads), each with its own process group, and returns each
/// rank's result in rank order. The transport follows `DDP_TRANSPORT` (default: auto).
pub fn run_world<T: Send>(
    n: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<Result<T, CommError>> {
    run_world_config(
        n,
        timeout,
        |rank| ProcessGroupConfig::new(rank, n).with_timeout(timeout),
        body,
    )
}

/// [`run_world`] with the given [`Setup`]; checks the group's backend name.
pub fn run_world_with<T: Send>(
    setup: Setup,
    n: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<Result<T, CommError>> {
    let checked = |pg: ProcessGroup| {
        assert_eq!(
            pg.backend_name(),
            setup.expected_backend(n),
            "{setup:?} with {n} ranks"
        );
        assert_eq!(
            pg.shared_memory_groups(),
            setup.expected_groups(n),
            "{setup:?} with {n} ranks"
        );
        body(pg)
    };
    let config = |rank| setup.config(rank, n, timeout);
    if setup == Setup::Mpi {
        return mpi::run_this_rank(n, timeout, config, checked);
    }
    run_world_config(n, timeout, config, checked)
}

fn run_world_config<T: Send>(
    n: usize,
    timeout: Duration,
    config: impl Fn(usize) -> ProcessGroupConfig + Sync,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<Result<T, CommError>> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind store");
    let addr = server.local_addr().to_string();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (addr, body, config) = (addr.clone(), &body, &config);
                s.spawn(move || {
                    let store = Store::connect(&addr, StoreConfig::new().with_timeout(timeout))?;
                    let pg = ProcessGroup::with_store(store, config(rank))?;
                    body(pg)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Like [`run_world`] but every rank must succeed.
pub fn run_ok<T: Send>(
    n: usize,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<T> {
    unwrap_all(run_world(n, Duration::from_secs(60), body))
}

/// Like [`run_world_with`] but every rank must succeed.
pub fn run_ok_with<T: Send>(
    setup: Setup,
    n: usize,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<T> {
    unwrap_all(run_world_with(setup, n, Duration::from_secs(60), body))
}

fn unwrap_all<T>(results: Vec<Result<T, CommError>>) -> Vec<T> {
    results
        .into_iter()
        .enumerate()
        .map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r} failed: {e}")))
        .collect()
}
