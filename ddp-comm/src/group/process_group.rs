//! [`ProcessGroup`]: a set of ranks that run collectives together.

use super::config::ProcessGroupConfig;
use super::generation;
use super::transport_thread::TransportThread;
use crate::collective::{CollectiveKind, Fingerprint};
use crate::dtype::DataType;
use crate::error::{CommError, Result};
use crate::store::{Store, StoreServer};
use crate::transport::tcp::MeshSpec;
use crate::transport::{self, ConnectSpec, Connected};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A group of ranks and the connections between them; cheap to clone (clones share the group).
///
/// Created by [`init_process_group`](crate::init_process_group) (the whole job) or
/// [`ProcessGroup::new_group`] (a subset). Collectives are methods on it; see the
/// [crate docs](crate) for the list and their contracts.
///
/// # Ranks
/// Ranks passed to a group's methods (roots, peers) are ranks *in that group*, `0..world_size()`.
/// [`ProcessGroup::global_rank_of`] and [`ProcessGroup::group_rank_of`] translate; errors always
/// name global ranks.
///
/// # Abort
/// [`ProcessGroup::abort`] fails the group on purpose, from any thread, when this rank cannot go
/// on (its backward pass failed, say): peers waiting on this rank fail promptly with an error
/// that carries the reason, instead of waiting for the timeout, and every later call on this
/// rank returns [`CommError::Aborted`].
///
/// # Creating groups again on one store
/// A store may outlive its groups (destroy the group, create a new one over the same store, as
/// PyTorch users do with `destroy_process_group` and `init_process_group` over one `TCPStore`).
/// Each init of the world group on a store is a new [generation](ProcessGroup::generation):
/// its keys, and its subgroups', never meet an earlier init's. Rank 0 begins each generation
/// and the other ranks join the newest one begun since their last, so every rank must create
/// its world groups on a store in the same order. The world may change size between inits: a
/// rank waits for a generation begun with its own world size.
///
/// # Shutdown
/// Dropping the last clone lets queued collectives finish, closes every connection and joins the
/// communication thread. On the rank that hosts the store, it then waits (up to the timeout) for
/// the other ranks to disconnect before stopping the store, so slower ranks can finish.
#[derive(Clone)]
pub struct ProcessGroup {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) transport: TransportThread,
    name: String,
    ranks: Vec<usize>,
    group_rank: usize,
    config: ProcessGroupConfig,
    backend: &'static str,
    units: Vec<Vec<usize>>,
    store: Store,
    root_store: Store,
    seq: AtomicU64,
    /// Bytes handed to collectives so far (see [`ProcessGroup::payload_bytes`]).
    payload: AtomicU64,
    subgroups: AtomicU64,
    /// The job's random nonce (agreed through the store), part of every group id.
    job_nonce: Vec<u8>,
    /// Which init of the world group on its store this group belongs to (1: the first).
    generation: u64,
    /// The NCCL backend ([`ProcessGroup::nccl`]); dropped before the store it met through.
    #[cfg(feature = "cuda")]
    pub(crate) nccl: super::nccl_slot::NcclSlot,
    /// Keeps the parent (and so the store it may host) alive while a subgroup exists.
    _parent: Option<Arc<Inner>>,
    /// Declared last: dropped after every store connection above is closed.
    _server: Option<HostedStore>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.transport.shutdown();
    }
}

/// Where a group comes from: the whole job (with the store rank 0 may host, the job's nonce
/// and the init's generation), or a parent group it is a subgroup of.
enum Lineage<'a> {
    World {
        /// Taken only once nothing can fail: on an error it stays with [`ProcessGroup::world`],
        /// which stops it at once (see [`HostedStore::stop_now`]).
        server: &'a mut Option<HostedStore>,
        job_nonce: Vec<u8>,
        generation: u64,
    },
    Sub(Arc<Inner>),
}

/// The store server rank 0 runs for the job; stops once the other ranks have left.
pub(crate) struct HostedStore {
    server: StoreServer,
    /// How long the drop waits for the other ranks to disconnect.
    linger: Duration,
    /// Set by [`HostedStore::stop_now`]: the drop does not wait.
    abandoned: bool,
}

impl HostedStore {
    /// The store `server`, stopped (when dropped) once the other ranks have disconnected or
    /// `linger` has passed.
    pub(crate) fn new(server: StoreServer, linger: Duration) -> HostedStore {
        HostedStore {
            server,
            linger,
            abandoned: false,
        }
    }

    /// Stops the store without waiting for the other ranks, after this rank's init failed and
    /// its generation was abandoned: nobody can finish anything there, and lingering would only
    /// hold the error back a whole timeout (this rank's own store handles had kept it busy).
    pub(crate) fn stop_now(mut self) {
        tracing::debug!(
            clients = self.server.num_clients(),
            "stopping the store of a failed init"
        );
        self.abandoned = true;
    }
}

impl Drop for HostedStore {
    fn drop(&mut self) {
        if self.abandoned {
            return;
        }
        if !self.server.wait_for_clients(0, self.linger) {
            tracing::warn!(
                clients = self.server.num_clients(),
                "stopping the store while other ranks are still connected"
            );
        }
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("name", &self.inner.name)
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("ranks", &self.inner.ranks)
            .finish()
    }
}

impl ProcessGroup {
    /// Joins the whole job through an already connected store (the launcher's, a test's, or
    /// one created by hand). Every rank calls it with the same `world_size`. Calling it again
    /// over the same store, after the earlier groups are gone, makes a new group that shares no
    /// keys with them (see [Creating groups again on one store](ProcessGroup#creating-groups-again-on-one-store)).
    ///
    /// # Errors
    /// Invalid config, or rendezvous failures (timeouts naming the missing ranks, rejected token).
    pub fn with_store(store: Store, config: ProcessGroupConfig) -> Result<ProcessGroup> {
        Self::world(store, config, None)
    }

    pub(crate) fn world(
        store: Store,
        config: ProcessGroupConfig,
        server: Option<HostedStore>,
    ) -> Result<ProcessGroup> {
        let mut server = server;
        let joined = Self::join_world(store, config, &mut server);
        // `join_world` has dropped every handle on the store by now. On an error the server
        // is still here: stop it at once rather than linger a timeout for ranks that can only
        // fail too (they see the store close instead of waiting out their own timeout).
        if let (Err(_), Some(hosted)) = (&joined, server.take()) {
            hosted.stop_now();
        }
        joined
    }

    /// [`ProcessGroup::world`] up to the group; takes `server` into it only once nothing can
    /// fail, and drops `store` (and every handle made from it) on every path.
    fn join_world(
        store: Store,
        config: ProcessGroupConfig,
        server: &mut Option<HostedStore>,
    ) -> Result<ProcessGroup> {
        config.validate()?;
        // Every rank listens on the interface it reaches the store through (see the mesh).
        let mesh_ip = store.local_addr()?.ip();
        config.require_token_if_exposed(&format!("rank {}", config.rank), mesh_ip)?;
        if mesh_ip.is_loopback() && config.local_world_size < config.world_size {
            // Not an error: tests simulate several hosts on one. On real hosts the peers
            // elsewhere time out connecting to this rank, and this line says why.
            tracing::warn!(
                rank = config.rank,
                %mesh_ip,
                "this rank reaches the store through a loopback address, so it listens there, \
                 but the job spans several hosts (LOCAL_WORLD_SIZE {} < WORLD_SIZE {}): ranks \
                 on other hosts cannot reach it. Set MASTER_ADDR to an address every host \
                 reaches; if it is this host's name, fix /etc/hosts (Debian and Ubuntu map it \
                 to 127.0.1.1)",
                config.local_world_size,
                config.world_size
            );
        }
        let ranks: Vec<usize> = (0..config.world_size).collect();
        let group_rank = config.rank;
        // Everything below, the nonce included, lives in this init's namespace of the store.
        let generation = generation::join(&store, config.rank, config.world_size, config.timeout)?;
        let number = generation.number;
        let joined = job_nonce(&generation.store).and_then(|job_nonce| {
            Self::connect(
                "world".into(),
                generation.store,
                ranks,
                group_rank,
                config,
                Lineage::World {
                    server,
                    job_nonce,
                    generation: number,
                },
            )
        });
        if joined.is_err() && group_rank == 0 {
            // Ranks that arrive later must not join a generation rank 0 has left.
            generation::abandon(&store, number);
        }
        joined
    }

    fn connect(
        name: String,
        root_store: Store,
        ranks: Vec<usize>,
        group_rank: usize,
        config: ProcessGroupConfig,
        lineage: Lineage<'_>,
    ) -> Result<ProcessGroup> {
        let (server, parent, job_nonce, generation) = match lineage {
            Lineage::World {
                server,
                job_nonce,
                generation,
            } => (server, None, job_nonce, generation),
            Lineage::Sub(parent) => {
                let (nonce, generation) = (parent.job_nonce.clone(), parent.generation);
                (&mut None, Some(parent), nonce, generation)
            }
        };
        let store = root_store.with_prefix(&format!("pg/{name}/"));
        let spec = ConnectSpec {
            mesh: MeshSpec {
                store: &store,
                addr_prefix: "",
                ranks: &ranks,
                group_rank,
                group_id: group_id(&job_nonce, generation, &name),
                token: &config.token,
                timeout: config.timeout,
                socket_buffer_bytes: config.socket_buffer_bytes,
            },
            root_store: &root_store,
            transport: config.resolved_transport()?,
            host_id: config.host_id.as_deref(),
            shm_buffer_bytes: config.shm_buffer_bytes,
        };
        let Connected {
            transport,
            backend,
            units,
        } = transport::connect(&spec)?;
        let reporter = store.duplicate()?;
        let transport = TransportThread::start(
            transport,
            Some(reporter),
            config.rank,
            format!("ddp-comm-{}", config.rank),
        )?;
        tracing::info!(group = %name, rank = config.rank, world_size = ranks.len(), backend, generation, "process group ready");
        Ok(ProcessGroup {
            inner: Arc::new(Inner {
                transport,
                name,
                ranks,
                group_rank,
                config,
                backend,
                units,
                store,
                root_store,
                seq: AtomicU64::new(0),
                payload: AtomicU64::new(0),
                subgroups: AtomicU64::new(0),
                job_nonce,
                generation,
                #[cfg(feature = "cuda")]
                nccl: Default::default(),
                _parent: parent,
                // Nothing fails from here on: the group owns the store it hosts.
                _server: server.take(),
            }),
        })
    }

    /// This process's rank in the group, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.inner.group_rank
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.inner.ranks.len()
    }

    /// This process's rank in the whole job.
    pub fn global_rank(&self) -> usize {
        self.inner.config.rank
    }

    /// This process's rank on its host (selects the device).
    pub fn local_rank(&self) -> usize {
        self.inner.config.local_rank
    }

    /// Number of processes on this host.
    pub fn local_world_size(&self) -> usize {
        self.inner.config.local_world_size
    }

    /// Global ranks of the members, indexed by group rank.
    pub fn ranks(&self) -> &[usize] {
        &self.inner.ranks
    }

    /// Global rank of `group_rank`, if it is in the group.
    pub fn global_rank_of(&self, group_rank: usize) -> Option<usize> {
        self.inner.ranks.get(group_rank).copied()
    }

    /// Group rank of `global_rank`, if that process is a member.
    pub fn group_rank_of(&self, global_rank: usize) -> Option<usize> {
        self.inner.ranks.iter().position(|&r| r == global_rank)
    }

    /// The group's name (`world`, or `world/sub0:0,2` for subgroups).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Which init of the world group on its store this group belongs to: 1 for the first, `n`
    /// for the `n`-th (see [Creating groups again on one store](ProcessGroup#creating-groups-again-on-one-store)).
    /// A subgroup has its world group's.
    pub fn generation(&self) -> u64 {
        self.inner.generation
    }

    /// The store namespace of this group, for user-level coordination.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The name of the transport in use: `"shm+tcp"` when some ranks of the group share
    /// memory (TCP carries point-to-point messages and traffic between hosts), `"tcp"` when
    /// every byte goes over TCP (one rank per host, `DDP_TRANSPORT=tcp`, or world size 1).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend
    }

    /// The group's ranks (global) by shared-memory group: ranks listed together share a host
    /// and exchange data through shared memory; a rank listed alone talks TCP only. Across
    /// groups, data goes over TCP. Every rank sees the same list.
    pub fn shared_memory_groups(&self) -> &[Vec<usize>] {
        &self.inner.units
    }

    /// The group's timeout for each collective.
    pub fn timeout(&self) -> Duration {
        self.inner.config.timeout
    }

    /// Creates a subgroup of the given *global* ranks, with its own connections.
    ///
    /// # Collective
    /// Every rank of this group must call it, with the same list, in the same order relative to
    /// other `new_group` calls. Members get `Some(group)` (group ranks follow the sorted global
    /// ranks); others get `None`.
    ///
    /// # Errors
    /// An empty list, a duplicate, or a rank that is not a member of this group; rendezvous
    /// failures among the members; [`CommError::Aborted`] after [`ProcessGroup::abort`].
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        if let Some(e) = self.inner.transport.aborted() {
            return Err(e);
        }
        let index = self.inner.subgroups.fetch_add(1, Ordering::SeqCst);
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Err(CommError::arg("new_group", "the rank list is empty"));
        }
        if sorted.len() != ranks.len() {
            return Err(CommError::arg(
                "new_group",
                format!("the rank list {ranks:?} has duplicates"),
            ));
        }
        if let Some(bad) = sorted.iter().find(|r| self.group_rank_of(**r).is_none()) {
            return Err(CommError::arg(
                "new_group",
                format!(
                    "global rank {bad} is not a member of group '{}' (members: {:?})",
                    self.name(),
                    self.ranks()
                ),
            ));
        }
        let me = self.global_rank();
        let Some(group_rank) = sorted.iter().position(|&r| r == me) else {
            return Ok(None);
        };
        let list = sorted
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let name = format!("{}/sub{index}:{list}", self.inner.name);
        Self::connect(
            name,
            self.inner.root_store.clone(),
            sorted,
            group_rank,
            self.inner.config.clone(),
            Lineage::Sub(self.inner.clone()),
        )
        .map(Some)
    }

    /// Fails the group at once, from any thread, and tells the peers why.
    ///
    /// Call it when this rank cannot take part in the next collectives (a gradient could not
    /// be computed, say), so the peers do not wait the whole timeout for it. It publishes
    /// `reason` as this rank's failure report in the store (`failure/<rank>`), then closes the
    /// group's connections and marks its shared-memory slot aborted. That happens at once, even
    /// while this rank's communication thread is blocked inside a collective, which then fails.
    ///
    /// Afterwards:
    /// - on this rank, the running collective, every queued one and every later call returns
    ///   [`CommError::Aborted`] containing `reason` ([`ProcessGroup::new_group`] too);
    /// - a peer waiting on this rank, or next talking to it, fails within about a second with
    ///   an error naming this rank and ending in `; rank R reported: aborted: <reason>`. Over
    ///   shared memory every peer on the host notices at once; over TCP, a peer blocked on a
    ///   third rank notices when that rank moves on (or at the timeout).
    ///
    /// Only the first call acts; later ones do nothing. It aborts this group only, not its
    /// parent or its subgroups. With the `cuda` feature it also aborts the group's NCCL
    /// backend (`ProcessGroup::nccl`), if created. Publishing waits at most about a second for
    /// the store.
    pub fn abort(&self, reason: &str) {
        self.inner.transport.abort(reason);
        #[cfg(feature = "cuda")]
        self.inner.nccl.abort(reason);
    }

    /// Bytes this rank has handed to collectives and point-to-point calls on this group so far:
    /// each call's per-rank buffer (an all-reduce of 1 MiB counts 1 MiB; a ring moves about
    /// `2 (n-1)/n` times that over the links). For accounting and tests: what a feature sends, or
    /// does not send, shows here.
    pub fn payload_bytes(&self) -> u64 {
        self.inner.payload.load(Ordering::Relaxed)
    }

    /// Destroys this handle. The group shuts down when its last clone is gone (see
    /// [Shutdown](ProcessGroup#shutdown)).
    pub fn destroy(self) {
        drop(self);
    }

    pub(crate) fn fingerprint(
        &self,
        kind: CollectiveKind,
        dtype: DataType,
        count: usize,
    ) -> Fingerprint {
        let bytes = (count as u64).saturating_mul(dtype.size_bytes() as u64);
        self.inner.payload.fetch_add(bytes, Ordering::Relaxed);
        Fingerprint::new(
            self.inner.seq.fetch_add(1, Ordering::SeqCst),
            kind,
            dtype,
            count,
        )
    }
}

/// The store key of the job's nonce, in the init's namespace (see `generation`).
const JOB_NONCE_KEY: &str = "job/nonce";

/// The job's random nonce: the first rank to get here sets it, every rank reads the same.
/// A stranger who knows a group's name still cannot tell its id without it. Each init on a
/// store (generation) draws its own.
fn job_nonce(store: &Store) -> Result<Vec<u8>> {
    let candidate: [u8; 16] = rand::random();
    let hex: String = candidate.iter().map(|b| format!("{b:02x}")).collect();
    store.compare_set(JOB_NONCE_KEY, b"", hex.as_bytes())
}

/// A group's id: the job's nonce, the init's generation and the group's name, hashed (SHA-256,
/// first 8 bytes), so two groups, one group of two jobs, or of two inits on one store, never
/// share an id.
fn group_id(job_nonce: &[u8], generation: u64, name: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update((job_nonce.len() as u64).to_le_bytes())
        .chain_update(job_nonce)
        .chain_update(generation.to_le_bytes())
        .chain_update(name.as_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(id)
}
