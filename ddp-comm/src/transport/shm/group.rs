//! [`ShmGroup`]: the ranks of one host around one segment, and the step protocol they run.
//!
//! A step is one round in which every rank may publish one staging buffer's worth of data and
//! read its peers' (see the [module docs](super)). This file owns the counters, the waits and
//! the errors; `collectives.rs` says what each collective copies and reduces in its steps.

use super::host::ProcId;
use super::patience::{Patience, Spin};
use super::segment_layout::{
    FP_BYTES, H_EPOCH, H_WAITERS, Layout, S_CONSUMED, S_PID, S_POSTED, S_REDUCED, S_START, S_STATE,
    STATE_ABORTED, STATE_CLOSED, STATE_OPEN,
};
use super::sys::{Segment, futex_wait, futex_wake_all};
use crate::collective::Fingerprint;
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// How long a blocked rank sleeps before it checks that the ranks it waits for are alive.
const POLL: Duration = Duration::from_millis(100);

// `post` writes three words per fingerprint record.
const _: () = assert!(FP_BYTES >= 24);

/// Which per-rank counter a wait is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counter {
    /// The rank's input for step `k` is in its staging buffer: `posted > k`.
    Posted,
    /// The rank's reduced slice of step `k` is in its staging buffer: `reduced > k`.
    Reduced,
    /// The rank has finished reading every buffer of step `k`: `consumed > k`.
    Consumed,
}

impl Counter {
    fn offset(self) -> usize {
        match self {
            Counter::Posted => S_POSTED,
            Counter::Reduced => S_REDUCED,
            Counter::Consumed => S_CONSUMED,
        }
    }
}

/// The local ranks of one host and their shared segment, from this rank's point of view.
#[derive(Debug)]
pub(crate) struct ShmGroup {
    /// Shared with [`ShmAbort`] handles, which may outlive a borrow of the group.
    pub(super) seg: Arc<Segment>,
    pub(super) layout: Layout,
    /// This rank's slot.
    pub(super) me: usize,
    /// Global rank of each slot, for errors.
    ranks: Vec<usize>,
    /// Process of each slot, for liveness checks.
    procs: Vec<ProcId>,
    my_proc: ProcId,
    patience: Patience,
    /// The next step number to begin.
    step: u64,
    timeout: Duration,
    /// Where a slice is summed in rank order (see `collectives.rs`), reused between steps; in
    /// words, so that it is aligned for every element type.
    pub(super) scratch: Vec<u64>,
}

impl ShmGroup {
    pub(super) fn new(
        seg: Segment,
        layout: Layout,
        me: usize,
        ranks: Vec<usize>,
        timeout: Duration,
        patience: Patience,
    ) -> ShmGroup {
        let procs = (0..layout.local)
            .map(|i| ProcId {
                pid: seg.u32_at(layout.slot(i) + S_PID).load(SeqCst),
                start: seg.u64_at(layout.slot(i) + S_START).load(SeqCst),
            })
            .collect();
        ShmGroup {
            seg: Arc::new(seg),
            layout,
            me,
            ranks,
            procs,
            my_proc: ProcId::me(),
            patience,
            step: 0,
            timeout,
            scratch: Vec::new(),
        }
    }

    /// Writes this rank's identity into its slot (before the peers read it, at setup).
    pub(super) fn register(seg: &Segment, layout: &Layout, me: usize) {
        let p = ProcId::me();
        seg.u32_at(layout.slot(me) + S_PID).store(p.pid, SeqCst);
        seg.u64_at(layout.slot(me) + S_START).store(p.start, SeqCst);
        seg.u32_at(layout.slot(me) + S_STATE)
            .store(STATE_OPEN, SeqCst);
    }

    /// Number of ranks on the host.
    pub(crate) fn n(&self) -> usize {
        self.layout.local
    }

    /// Bytes per staging buffer.
    pub(super) fn chunk(&self) -> usize {
        self.layout.chunk
    }

    /// Global rank of slot `i`.
    pub(super) fn global(&self, i: usize) -> usize {
        self.ranks[i]
    }

    /// Offset of slot `i`'s staging buffer for step `k`.
    pub(super) fn buf(&self, i: usize, k: u64) -> usize {
        self.layout
            .staging(i, (k % self.layout.nbuf as u64) as usize)
    }

    fn counter(&self, i: usize, c: Counter) -> &AtomicU64 {
        self.seg.u64_at(self.layout.slot(i) + c.offset())
    }

    fn state(&self, i: usize) -> &AtomicU32 {
        self.seg.u32_at(self.layout.slot(i) + S_STATE)
    }

    fn epoch(&self) -> &AtomicU32 {
        self.seg.u32_at(H_EPOCH)
    }

    fn waiters(&self) -> &AtomicU32 {
        self.seg.u32_at(H_WAITERS)
    }

    /// Wakes sleepers if there are any. Callers have just changed a control word (SeqCst):
    /// a waiter either registered before our load of `waiters` (and is woken, or sees the
    /// changed epoch and does not sleep), or registers after it, and then its re-check of the
    /// condition sees our change.
    fn wake(&self) {
        if self.waiters().load(SeqCst) > 0 {
            self.epoch().fetch_add(1, SeqCst);
            futex_wake_all(self.epoch());
        }
    }

    fn publish(&self, c: Counter, value: u64) {
        self.counter(self.me, c).store(value, SeqCst);
        self.wake();
    }

    /// Starts the next step `k`: waits until every peer has finished reading the staging
    /// buffers that step `k` reuses (those of step `k - nbuf`). Returns `k`. Steps are numbered
    /// in the order they begin; a collective may begin step `k + 1` before it finishes `k`.
    pub(super) fn begin(&mut self, fp: &Fingerprint, deadline: Instant) -> Result<u64> {
        let k = self.step;
        self.step += 1;
        let nbuf = self.layout.nbuf as u64;
        if k >= nbuf {
            self.wait_all(Counter::Consumed, k + 1 - nbuf, fp, deadline)?;
        }
        Ok(k)
    }

    /// Publishes this rank's fingerprint and staging buffer for step `k`.
    pub(super) fn post(&self, k: u64, fp: &Fingerprint) {
        let at = self
            .layout
            .fp(self.me, (k % self.layout.nbuf as u64) as usize);
        self.seg.u64_at(at).store(fp.seq, SeqCst);
        self.seg.u64_at(at + 8).store(fp.count, SeqCst);
        self.seg.u64_at(at + 16).store(fp.packed(), SeqCst);
        self.publish(Counter::Posted, k + 1);
    }

    /// Waits until every peer has posted step `k`, and checks that they all run the same
    /// collective as this rank.
    pub(super) fn wait_posted(&self, k: u64, fp: &Fingerprint, deadline: Instant) -> Result<()> {
        self.wait_all(Counter::Posted, k + 1, fp, deadline)?;
        for q in self.peers() {
            let theirs = self.read_fp(q, k).ok_or_else(|| CommError::Protocol {
                from: format!("rank {}", self.global(q)),
                reason: "unknown collective kind, type or op in its shared-memory slot".into(),
            })?;
            fp.expect_same(&theirs, self.global(self.me), self.global(q))?;
        }
        Ok(())
    }

    fn read_fp(&self, q: usize, k: u64) -> Option<Fingerprint> {
        let at = self.layout.fp(q, (k % self.layout.nbuf as u64) as usize);
        let seq = self.seg.u64_at(at).load(SeqCst);
        let count = self.seg.u64_at(at + 8).load(SeqCst);
        let packed = self.seg.u64_at(at + 16).load(SeqCst);
        Fingerprint::unpack(seq, count, packed)
    }

    /// Says that this rank's phase-two output of step `k` is in place.
    pub(super) fn mark_reduced(&self, k: u64) {
        self.publish(Counter::Reduced, k + 1);
    }

    /// Waits until every peer has marked step `k` reduced.
    pub(super) fn wait_reduced(&self, k: u64, fp: &Fingerprint, deadline: Instant) -> Result<()> {
        self.wait_all(Counter::Reduced, k + 1, fp, deadline)
    }

    /// Ends step `k`: this rank will not read any buffer of it again. Steps finish in order.
    pub(super) fn finish(&mut self, k: u64) {
        self.publish(Counter::Consumed, k + 1);
    }

    /// The deadline of a collective starting now.
    pub(super) fn deadline(&self) -> Instant {
        deadline_after(self.timeout)
    }

    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.n()).filter(move |&q| q != self.me)
    }

    fn lagging(&self, c: Counter, target: u64) -> Option<usize> {
        self.peers()
            .find(|&q| self.counter(q, c).load(SeqCst) < target)
    }

    /// Fails if peer `q` has closed or aborted its slot.
    fn check_open(&self, q: usize, fp: &Fingerprint) -> Result<()> {
        match self.state(q).load(SeqCst) {
            STATE_OPEN => Ok(()),
            s => Err(CommError::PeerClosed {
                op: fp.label(),
                peer: self.global(q),
                detail: if s == STATE_ABORTED {
                    " (it gave up on the group after an error)".into()
                } else {
                    String::new()
                },
            }),
        }
    }

    /// Fails if this rank's own slot was aborted (from another thread, through an
    /// [`ShmAbort`]), or if any peer aborted: the group is dead then, even when the rank we wait
    /// for is healthy, so nobody should wait for the timeout.
    fn check_group(&self, fp: &Fingerprint) -> Result<()> {
        if self.state(self.me).load(SeqCst) != STATE_OPEN {
            return Err(CommError::Aborted(format!(
                "{}: this rank aborted the group",
                fp.label()
            )));
        }
        match self
            .peers()
            .find(|&q| self.state(q).load(SeqCst) == STATE_ABORTED)
        {
            Some(q) => self.check_open(q, fp),
            None => Ok(()),
        }
    }

    /// Whether a sleeper may sleep: nobody aborted, and `late` is still open.
    fn may_sleep(&self, late: usize) -> bool {
        self.state(late).load(SeqCst) == STATE_OPEN
            && self.state(self.me).load(SeqCst) == STATE_OPEN
            && self
                .peers()
                .all(|q| self.state(q).load(SeqCst) != STATE_ABORTED)
    }

    /// Fails if a peer that has not reached `target` is no longer running.
    fn check_alive(&self, c: Counter, target: u64, fp: &Fingerprint) -> Result<()> {
        for q in self
            .peers()
            .filter(|&q| self.counter(q, c).load(SeqCst) < target)
        {
            let p = self.procs[q];
            if p != self.my_proc && !p.alive() {
                return Err(CommError::PeerClosed {
                    op: fp.label(),
                    peer: self.global(q),
                    detail: format!("; its process {} is gone", p.pid),
                });
            }
        }
        Ok(())
    }

    /// Waits until every peer's counter `c` reaches `target`: spins briefly, then sleeps on the
    /// segment's futex, checking every [`POLL`] that the ranks it waits for are alive. Fails
    /// naming the first rank that is late when a peer closed, died, or the deadline passed.
    fn wait_all(&self, c: Counter, target: u64, fp: &Fingerprint, deadline: Instant) -> Result<()> {
        if self.lagging(c, target).is_none() {
            return Ok(());
        }
        let spin_end = self.patience.spin_end(Instant::now());
        let mut late;
        loop {
            let next = self.patience.pause();
            match self.lagging(c, target) {
                None => return Ok(()),
                Some(q) => late = q,
            }
            self.check_open(late, fp)?;
            self.check_group(fp)?;
            if next == Spin::Sleep || Instant::now() >= spin_end {
                break;
            }
        }
        let mut last_check = Instant::now();
        loop {
            self.waiters().fetch_add(1, SeqCst);
            let epoch = self.epoch().load(SeqCst);
            // Checked after loading the epoch: an abort changes the state before it bumps the
            // epoch, so either we see the state here or the futex sees the new epoch.
            if let Some(q) = self.lagging(c, target)
                && self.may_sleep(q)
            {
                let left = deadline.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    futex_wait(self.epoch(), epoch, left.min(POLL));
                }
            }
            self.waiters().fetch_sub(1, SeqCst);
            match self.lagging(c, target) {
                None => return Ok(()),
                Some(q) => late = q,
            }
            self.check_open(late, fp)?;
            self.check_group(fp)?;
            let now = Instant::now();
            if now.duration_since(last_check) >= POLL {
                self.check_alive(c, target, fp)?;
                last_check = now;
            }
            if now >= deadline {
                self.check_alive(c, target, fp)?;
                return Err(CommError::Timeout {
                    op: fp.label(),
                    peer: self.global(late),
                    timeout: self.timeout,
                    detail: String::new(),
                });
            }
        }
    }

    /// Marks this rank's slot aborted and wakes everyone, so peers blocked on it fail at once.
    pub(crate) fn abort(&self) {
        self.abort_handle().abort();
    }

    /// A handle that aborts this rank's slot from any thread, even while this group's own
    /// thread waits in a collective (it wakes up too, and fails).
    pub(crate) fn abort_handle(&self) -> ShmAbort {
        ShmAbort {
            seg: Arc::clone(&self.seg),
            state: self.layout.slot(self.me) + S_STATE,
        }
    }
}

/// Aborts one rank's shared-memory slot; keeps the mapping alive as long as it exists.
#[derive(Debug)]
pub(crate) struct ShmAbort {
    seg: Arc<Segment>,
    /// Offset of the slot's state word.
    state: usize,
}

impl ShmAbort {
    /// Marks the slot aborted and wakes every sleeper on the segment. Idempotent.
    pub(crate) fn abort(&self) {
        self.seg.u32_at(self.state).fetch_max(STATE_ABORTED, SeqCst);
        let epoch = self.seg.u32_at(H_EPOCH);
        epoch.fetch_add(1, SeqCst);
        futex_wake_all(epoch);
    }
}

impl Drop for ShmGroup {
    fn drop(&mut self) {
        // Like closing a socket: peers still waiting for this rank fail instead of timing out.
        // (Peers still reading our buffers are fine: the memory lives while anyone maps it.)
        self.state(self.me).fetch_max(STATE_CLOSED, SeqCst);
        self.epoch().fetch_add(1, SeqCst);
        futex_wake_all(self.epoch());
    }
}
