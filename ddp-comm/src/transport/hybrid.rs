//! Choosing a group's transport, and [`HybridTransport`]: shared memory within each host, TCP
//! between hosts.
//!
//! Every group keeps its TCP transport (point-to-point messages, and the collectives that have
//! no hierarchical form), whose connections are made when first needed. Ranks that share a host (see `shm::setup`) form a *unit* with one
//! shared-memory segment; the lowest rank of each unit is its *leader*, and the leaders have a
//! TCP mesh of their own.
//!
//! - One unit (every rank on one host): every collective but send/recv runs in shared memory.
//! - Several units, some with more than one rank:
//!   - all-reduce: reduce to the leader in shared memory, ring all-reduce between the leaders
//!     over TCP, broadcast from the leader in shared memory. The leaders' rings reduce each
//!     element on one rank and copy it, so every rank ends bitwise identical.
//!   - broadcast: within the root's unit, then between leaders, then within the other units.
//!   - barrier: within units, between leaders, within units again.
//!   - the others run over TCP, after a fingerprint check within the unit (shared
//!     memory) and between the leaders (TCP), so ranks that issue different collectives get a
//!     mismatch instead of waiting on different connections. All-to-all among them is the
//!     pairwise exchange over the whole group's TCP mesh, between ranks of one host too:
//!     correct, not hierarchical.
//! - Every rank alone on its host (or `tcp` asked for): plain [`TcpTransport`].

use super::shm::{self, SetupSpec, ShmGroup};
use super::tcp::{MeshSpec, TcpTransport};
use super::{AbortHandle, Parts, Transport, TransportKind};
use crate::collective::Fingerprint;
use crate::error::Result;
use crate::reduce_op::ReduceOp;
use crate::store::Store;

/// What a group needs to connect.
#[derive(Debug)]
pub(crate) struct ConnectSpec<'a> {
    /// The TCP transport; its store is the group's namespace.
    pub(crate) mesh: MeshSpec<'a>,
    /// The root store namespace of this init of the job (its generation's, see
    /// `group::generation`).
    pub(crate) root_store: &'a Store,
    pub(crate) transport: TransportKind,
    /// Overrides the detected host id.
    pub(crate) host_id: Option<&'a str>,
    /// Staging buffer size, if set in the config.
    pub(crate) shm_buffer_bytes: Option<usize>,
}

/// A connected group's transport and what it is made of.
pub(crate) struct Connected {
    pub(crate) transport: Box<dyn Transport>,
    /// For [`ProcessGroup::backend_name`](crate::ProcessGroup::backend_name).
    pub(crate) backend: &'static str,
    /// Global ranks by shared-memory unit (singletons talk TCP only).
    pub(crate) units: Vec<Vec<usize>>,
}

/// Connects a group: the TCP mesh, then shared memory where ranks share a host.
pub(crate) fn connect(spec: &ConnectSpec<'_>) -> Result<Connected> {
    let tcp = TcpTransport::connect(&spec.mesh)?;
    let ranks = spec.mesh.ranks;
    let n = ranks.len();
    let me = spec.mesh.group_rank;
    let topo = shm::setup(&SetupSpec {
        store: spec.mesh.store,
        root_store: spec.root_store,
        ranks,
        group_rank: me,
        group_id: spec.mesh.group_id,
        timeout: spec.mesh.timeout,
        requested: spec.transport,
        host_id: spec.host_id.map_or_else(shm::host::host_id, str::to_string),
        buffer_bytes: spec.shm_buffer_bytes,
    })?;
    let units = topo
        .units
        .iter()
        .map(|u| u.iter().map(|&r| ranks[r]).collect())
        .collect();
    if topo.units.len() == n {
        return Ok(Connected {
            transport: Box::new(tcp),
            backend: "tcp",
            units,
        });
    }
    let mut unit_of = vec![0; n];
    let mut slot_of = vec![0; n];
    for (u, members) in topo.units.iter().enumerate() {
        for (i, &r) in members.iter().enumerate() {
            unit_of[r] = u;
            slot_of[r] = i;
        }
    }
    let my_unit = unit_of[me];
    let leaders = if topo.units.len() > 1 && topo.units[my_unit][0] == me {
        let leader_ranks: Vec<usize> = topo.units.iter().map(|u| ranks[u[0]]).collect();
        Some(TcpTransport::connect(&MeshSpec {
            store: spec.mesh.store,
            addr_prefix: "leaders/",
            ranks: &leader_ranks,
            group_rank: my_unit,
            group_id: spec.mesh.group_id ^ 0x6c65_6164_6572_7321,
            token: spec.mesh.token,
            timeout: spec.mesh.timeout,
            socket_buffer_bytes: spec.mesh.socket_buffer_bytes,
        })?)
    } else {
        None
    };
    tracing::debug!(
        rank = ranks[me],
        units = ?topo.units,
        leader = leaders.is_some(),
        "shared-memory transport ready"
    );
    Ok(Connected {
        transport: Box::new(HybridTransport {
            n,
            units: topo.units.len(),
            single: topo.units.len() == 1,
            unit_of,
            slot_of,
            my_unit,
            shm: topo.shm,
            leaders,
            tcp,
        }),
        backend: "shm+tcp",
        units,
    })
}

/// Shared memory within units, TCP between them (see the module docs).
#[derive(Debug)]
pub(crate) struct HybridTransport {
    n: usize,
    /// Number of units.
    units: usize,
    /// Whether the whole group is one unit.
    single: bool,
    /// Unit of each group rank, and its slot in that unit.
    unit_of: Vec<usize>,
    slot_of: Vec<usize>,
    my_unit: usize,
    /// This rank's unit's shared memory (`None` when it is alone in its unit).
    shm: Option<ShmGroup>,
    /// The leaders' mesh, on leaders of a multi-unit group.
    leaders: Option<TcpTransport>,
    /// The TCP transport over the whole group.
    tcp: TcpTransport,
}

impl HybridTransport {
    /// Checks that every rank issues the same collective before one that runs over the full
    /// mesh: within the unit, then between the leaders.
    fn agree(&mut self, fp: &Fingerprint) -> Result<()> {
        if let Some(shm) = self.shm.as_mut() {
            shm.barrier(fp)?;
        }
        if let Some(leaders) = self.leaders.as_mut() {
            // One byte per leader, in frames that carry the collective's own fingerprint (the
            // TCP all-gather sizes its frames by the buffers, not by `fp.count`), so a leader
            // in any other collective sees a mismatch naming both calls.
            let mut out = vec![0u8; self.units];
            leaders.all_gather(fp, &[0], &mut out)?;
        }
        Ok(())
    }

    /// Where a collective with no hierarchical form runs: in shared memory when the whole group
    /// is one unit, else over the whole group's TCP mesh once every rank has agreed on it
    /// ([`HybridTransport::agree`]). Ranks are group ranks on TCP and slots in shared memory
    /// (the same numbers when the group is one unit).
    fn flat(&mut self, fp: &Fingerprint) -> Result<Flat<'_>> {
        if self.single {
            if let Some(shm) = self.shm.as_mut() {
                return Ok(Flat::Shm(shm));
            }
        } else {
            self.agree(fp)?;
        }
        Ok(Flat::Tcp(&mut self.tcp))
    }
}

/// What [`HybridTransport::flat`] chose to run a collective on.
enum Flat<'a> {
    /// The whole group is this unit: its shared memory.
    Shm(&'a mut ShmGroup),
    /// The whole group's TCP mesh, every rank having agreed on the collective.
    Tcp(&'a mut TcpTransport),
}

impl Transport for HybridTransport {
    fn all_reduce(&mut self, fp: &Fingerprint, buf: &mut [u8], op: ReduceOp) -> Result<()> {
        let avg = op.avg_ranks(self.n);
        if self.single {
            return match self.shm.as_mut() {
                Some(shm) => shm.reduce_to(fp, buf, op, avg, None),
                None => Ok(()),
            };
        }
        // One `Avg` over every rank of every host: the inputs scaled here (f16, bf16), the
        // sum divided by the leaders (every other type); the steps in between only sum.
        op.prescale_if_avg(self.n, fp.dtype, buf);
        let combine = op.combine_op();
        if let Some(shm) = self.shm.as_mut() {
            shm.reduce_to(fp, buf, combine, None, Some(0))?;
        }
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.all_reduce(fp, buf, combine)?;
            op.divide_if_avg(self.n, fp.dtype, buf);
        }
        if let Some(shm) = self.shm.as_mut() {
            shm.broadcast(fp, buf, 0)?;
        }
        Ok(())
    }

    fn all_reduce_parts(
        &mut self,
        fp: &Fingerprint,
        parts: &mut Parts<'_, '_>,
        op: ReduceOp,
    ) -> Result<()> {
        if !self.single {
            // Across hosts the leaders' TCP ring needs one flat buffer anyway.
            return parts.through_flat(|flat| self.all_reduce(fp, flat, op));
        }
        let avg = op.avg_ranks(self.n);
        match self.shm.as_mut() {
            Some(shm) => shm.reduce_parts_to(fp, parts, op, avg, None),
            None => Ok(()),
        }
    }

    fn broadcast(&mut self, fp: &Fingerprint, buf: &mut [u8], root: usize) -> Result<()> {
        let root_unit = self.unit_of[root];
        if root_unit == self.my_unit
            && let Some(shm) = self.shm.as_mut()
        {
            shm.broadcast(fp, buf, self.slot_of[root])?;
        }
        if self.single {
            return Ok(());
        }
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.broadcast(fp, buf, root_unit)?;
        }
        if root_unit != self.my_unit
            && let Some(shm) = self.shm.as_mut()
        {
            shm.broadcast(fp, buf, 0)?;
        }
        Ok(())
    }

    fn all_gather(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()> {
        match self.flat(fp)? {
            Flat::Shm(shm) => shm.gather_to(fp, input, Some(output), None),
            Flat::Tcp(tcp) => tcp.all_gather(fp, input, output),
        }
    }

    fn reduce_scatter(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: &mut [u8],
        op: ReduceOp,
    ) -> Result<()> {
        let avg = op.avg_ranks(self.n);
        match self.flat(fp)? {
            Flat::Shm(shm) => shm.reduce_scatter(fp, input, output, op, avg),
            Flat::Tcp(tcp) => tcp.reduce_scatter(fp, input, output, op),
        }
    }

    fn reduce(
        &mut self,
        fp: &Fingerprint,
        buf: &mut [u8],
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let (avg, slot) = (op.avg_ranks(self.n), self.slot_of[root]);
        match self.flat(fp)? {
            Flat::Shm(shm) => shm.reduce_to(fp, buf, op, avg, Some(slot)),
            Flat::Tcp(tcp) => tcp.reduce(fp, buf, root, op),
        }
    }

    fn gather(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: Option<&mut [u8]>,
        root: usize,
    ) -> Result<()> {
        let slot = self.slot_of[root];
        match self.flat(fp)? {
            Flat::Shm(shm) => shm.gather_to(fp, input, output, Some(slot)),
            Flat::Tcp(tcp) => tcp.gather(fp, input, output, root),
        }
    }

    fn scatter(
        &mut self,
        fp: &Fingerprint,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()> {
        let slot = self.slot_of[root];
        match self.flat(fp)? {
            Flat::Shm(shm) => shm.scatter(fp, input, output, slot),
            Flat::Tcp(tcp) => tcp.scatter(fp, input, output, root),
        }
    }

    /// One unit: in shared memory, each rank reading its blocks straight out of the peers'
    /// staging buffers. Several units: after the fingerprint check ([`HybridTransport::agree`]),
    /// the pairwise exchange over the group's TCP mesh, every pair of ranks directly (ranks of
    /// one host too, over loopback): correct, not hierarchical.
    fn all_to_all(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()> {
        match self.flat(fp)? {
            Flat::Shm(shm) => shm.all_to_all(fp, input, output),
            Flat::Tcp(tcp) => tcp.all_to_all(fp, input, output),
        }
    }

    fn barrier(&mut self, fp: &Fingerprint) -> Result<()> {
        if let Some(shm) = self.shm.as_mut() {
            shm.barrier(fp)?;
        }
        if self.single {
            return Ok(());
        }
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.barrier(fp)?;
        }
        if let Some(shm) = self.shm.as_mut() {
            shm.barrier(fp)?;
        }
        Ok(())
    }

    fn send(&mut self, fp: &Fingerprint, buf: &[u8], dst: usize) -> Result<()> {
        self.tcp.send(fp, buf, dst)
    }

    fn recv(&mut self, fp: &Fingerprint, buf: &mut [u8], src: usize) -> Result<()> {
        self.tcp.recv(fp, buf, src)
    }

    fn abort(&mut self) {
        if let Some(shm) = &self.shm {
            shm.abort();
        }
        if let Some(leaders) = self.leaders.as_mut() {
            leaders.abort();
        }
        self.tcp.abort();
    }

    fn abort_handle(&self) -> Result<AbortHandle> {
        let mut handle = self.tcp.abort_handle()?;
        if let Some(leaders) = &self.leaders {
            handle = handle.merge(leaders.abort_handle()?);
        }
        if let Some(shm) = &self.shm {
            handle = handle.merge(AbortHandle::from_shm(shm.abort_handle()));
        }
        Ok(handle)
    }
}
