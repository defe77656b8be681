//! The shared-memory transport: the ranks of one host exchange data through one segment under
//! `/dev/shm`, reading each other's staging buffers directly.
//!
//! - `sys`: **every `unsafe`** (mmap, atomics and bytes in the mapping, futex).
//! - `segment_layout`: the offsets below; `host`: host ids, process liveness, stale-segment cleanup.
//! - `setup`: rendezvous through the store; `group`: [`ShmGroup`], the step protocol and its waits and
//!   errors; `collectives`: what each collective does in its steps.
//!
//! # Segment layout
//! One segment per host and group, created by the host's lowest group rank (the leader) as
//! `/dev/shm/ddp-<job id>-<group id>-<nonce>`. All integers native-endian.
//!
//! ```text
//! page 0: header
//!   0..8    magic "DDPSHM01"        8..12   layout version (1)
//!   12..16  ranks on the host (L)   16..20  staging buffers per rank (B = 3)
//!   24..32  bytes per staging buffer (C, whole pages; 512 KiB unless `shm_buffer_bytes` or
//!           `DDP_SHM_BUFFER_BYTES` say otherwise)
//!   32..36  creator pid             40..48  creator start time (ticks after boot)
//!   48..56  creator's pid-namespace inode   56..64  total segment bytes
//!   128     epoch: u32 futex word, bumped on every change a sleeper may wait for
//!   192     waiters: u32, number of ranks sleeping on the epoch
//! slot i (i in 0..L) at 4096 + i * (4096 + B * C), one per rank of the host:
//!   +0    pid u32    +8 start time u64          (the rank's process, for liveness)
//!   +64   state u32: 0 open, 1 closed (group dropped), 2 aborted (group failed)
//!   +128  posted u64    +192 reduced u64    +256 consumed u64     (step counters)
//!   +320  B fingerprint records of 32 bytes: seq, count, kind | dtype<<8 | op<<16 | root<<32
//!   +4096 B staging buffers of C bytes
//! ```
//!
//! # Step protocol
//! Collectives run as numbered steps `k = 0, 1, 2, ...` (the count goes on across
//! collectives), each moving at most one staging buffer per rank, through buffer `k mod B`:
//!
//! 1. *begin*: wait until every peer's `consumed > k - B` (nobody still reads the buffer
//!    this step reuses);
//! 2. write this rank's input into its buffer and its fingerprint into record `k mod B`, then
//!    `posted = k + 1`;
//! 3. wait until every peer's `posted > k`; compare every peer's fingerprint with ours: a
//!    difference is [`CommError::Mismatch`](crate::CommError) naming both calls;
//! 4. (reductions) reduce this rank's slice of the chunk in place in its own buffer, reading
//!    the peers' buffers; `reduced = k + 1`; wait until every peer's `reduced > k`;
//! 5. copy what this rank needs out of the peers' buffers; `consumed = k + 1`.
//!
//! All-reduce pipelines its steps: a rank posts step `k + 1` (2.) right after reducing its
//! slice of step `k` (4.), before it waits for the peers' slices of step `k`; with three
//! buffers that never waits for readers. A writer publishes with a SeqCst store after its
//! copies; a reader acts only after seeing it. So all-reduce is reduce-scatter + all-gather over shared buffers: each element is
//! reduced by exactly one rank and copied by the others, and results are bitwise identical.
//!
//! # Waiting
//! A rank keeps checking for 100 µs, yielding its CPU between checks (so a rank it waits for
//! on an oversubscribed host can run; see `patience.rs` for why it stops yielding while other
//! processes take the CPU from it), then sleeps on the epoch futex (registering in
//! `waiters`, so publishers only make the wake system call when somebody sleeps). Every 100 ms
//! of sleep it checks that the ranks it waits for are alive (`/proc/<pid>/stat`: gone, a
//! zombie, or a different start time means dead). A closed or aborted slot, a dead process,
//! or the collective's deadline ends the wait with an error naming the rank. So does an
//! aborted slot of any rank of the host, even one not waited for, and this rank's own slot
//! aborted from another thread (`ProcessGroup::abort`): the group is dead then.
//!
//! # Lifetime of the name
//! `/dev/shm` is writable by every user, so whatever is found under a segment's name is
//! distrusted: it is opened without following symbolic links or blocking (a FIFO), and mapped
//! only if it is a regular file owned by this user (checked on the open descriptor).
//!
//! Once every rank of the host has mapped the segment, the leader unlinks its name: the memory
//! lives until the last rank unmaps it, and a crash cannot leave it behind. Only a crash during
//! setup can; the next leader on the host removes `ddp-*` segments whose creator (same pid
//! namespace) is dead.

mod collectives;
mod group;
pub(crate) mod host;
mod patience;
mod segment_layout;
mod setup;
mod sys;

pub(crate) use group::{ShmAbort, ShmGroup};
pub(crate) use setup::{SetupSpec, setup};
