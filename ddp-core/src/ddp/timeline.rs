//! Step timelines: a Chrome trace (chrome://tracing, Perfetto) and overlap statistics.
//!
//! Each recorded step adds: `forward` and `backward` on the compute track, one `ready` marker
//! per bucket (its last gradient arrived; its `ms_vs_backward_end` argument is negative when
//! that was before backward ended), each bucket's `all_reduce` on the communication track (as
//! it ran on the communication thread), `unpack` per bucket, and `optimizer`.

use crate::engine::reducer::BucketTimes;
use std::time::{Duration, Instant};

/// Measurements of one synchronised step.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    /// The forward closure.
    pub forward: Duration,
    /// `loss.backward()` (gradients handed to the reducer, buckets launched as they fill).
    pub backward: Duration,
    /// From the end of backward until every bucket was reduced and unpacked.
    pub sync_after_backward: Duration,
    /// Sum of the buckets' all-reduce times on the communication thread.
    pub comm: Duration,
    /// The part of `comm` that ran while backward was still running.
    pub comm_during_backward: Duration,
    /// Number of buckets.
    pub buckets: usize,
    /// Buckets whose all-reduce was issued while backward (or the closure of
    /// [`step_on`](crate::DistributedDataParallel::step_on)) was still running, by the tap
    /// events themselves; the others were issued after it ended. A count, not a timing: it says
    /// how much of the communication *could* overlap.
    pub buckets_launched_during_backward: usize,
    /// Gradients handed over at a [`layer_boundary`](crate::layer_boundary), before the end of
    /// backward (0 without boundaries).
    pub early_gradients: usize,
    /// Taps anchored where [`DdpConfig::automatic_overlap`](crate::DdpConfig::automatic_overlap)
    /// learned backward reaches their parameter's consumers (0 with overlap off, on the step that
    /// learns, and in forwards whose graph changed: their taps are plain).
    pub anchored_taps: usize,
    /// Per bucket, in bucket (launch) order: when its last gradient arrived, in seconds
    /// relative to the end of backward; negative = ready while backward was still running, so
    /// its all-reduce could hide behind the rest of backward. Buckets completed only after
    /// backward (a parameter this rank did not use) are positive.
    pub bucket_ready: Vec<f64>,
    /// When backward (or the closure of [`step_on`](crate::DistributedDataParallel::step_on))
    /// returned: the reference point of [`bucket_ready`](Self::bucket_ready), to compare with
    /// timestamps of your own.
    pub backward_end: Option<Instant>,
}

impl StepStats {
    /// Fraction of all-reduce time hidden behind backward, in `0..=1`.
    pub fn overlap_fraction(&self) -> f64 {
        if self.comm.is_zero() {
            return 0.0;
        }
        self.comm_during_backward.as_secs_f64() / self.comm.as_secs_f64()
    }

    /// How many buckets were ready at least `margin` before the end of backward.
    pub fn buckets_ready_before_backward_end(&self, margin: Duration) -> usize {
        let margin = margin.as_secs_f64();
        self.bucket_ready.iter().filter(|&&r| r <= -margin).count()
    }
}

/// `at - reference` in seconds, negative when `at` is earlier.
fn signed_secs(at: Instant, reference: Instant) -> f64 {
    at.saturating_duration_since(reference).as_secs_f64()
        - reference.saturating_duration_since(at).as_secs_f64()
}

/// Timestamps of one step as the wrapper saw them.
#[derive(Debug, Clone)]
pub(crate) struct StepTimes {
    pub(crate) forward: (Instant, Instant),
    pub(crate) backward: (Instant, Instant),
    pub(crate) finished: Instant,
    pub(crate) buckets: BucketTimes,
}

impl StepTimes {
    pub(crate) fn stats(&self) -> StepStats {
        let (b0, b1) = self.backward;
        let mut comm = Duration::ZERO;
        let mut during = Duration::ZERO;
        for t in self.buckets.comm.iter().flatten() {
            comm += t.finished.saturating_duration_since(t.started);
            let end = t.finished.min(b1);
            let start = t.started.max(b0);
            during += end.saturating_duration_since(start);
        }
        StepStats {
            forward: self.forward.1.saturating_duration_since(self.forward.0),
            backward: b1.saturating_duration_since(b0),
            sync_after_backward: self.finished.saturating_duration_since(b1),
            comm,
            comm_during_backward: during,
            buckets: self.buckets.comm.len(),
            buckets_launched_during_backward: self.buckets.launched_during_backward,
            early_gradients: 0,
            anchored_taps: 0,
            bucket_ready: self
                .buckets
                .ready
                .iter()
                .map(|r| r.map_or(f64::NAN, |at| signed_secs(at, b1)))
                .collect(),
            backward_end: Some(b1),
        }
    }
}

/// Accumulates trace events and writes them as Chrome trace JSON.
#[derive(Debug)]
pub(crate) struct Timeline {
    origin: Instant,
    events: Vec<String>,
    pid: usize,
}

impl Timeline {
    pub(crate) fn new(pid: usize) -> Self {
        let mut t = Timeline {
            origin: Instant::now(),
            events: Vec::new(),
            pid,
        };
        for (tid, name) in [(1, "compute"), (2, "communication")] {
            t.events.push(format!(
                r#"{{"name":"thread_name","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":"{name}"}}}}"#
            ));
        }
        t
    }

    fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e6
    }

    fn span(&mut self, name: &str, tid: u32, start: Instant, end: Instant, step: u64) {
        let (ts, dur) = (
            self.us(start),
            end.saturating_duration_since(start).as_secs_f64() * 1e6,
        );
        self.events.push(format!(
            r#"{{"name":"{name}","ph":"X","pid":{},"tid":{tid},"ts":{ts:.1},"dur":{dur:.1},"args":{{"step":{step}}}}}"#,
            self.pid
        ));
    }

    /// An instant event; `extra_args` is appended to its `args` object (`,"key":value...`).
    fn instant(&mut self, name: &str, at: Instant, step: u64, extra_args: &str) {
        let ts = self.us(at);
        self.events.push(format!(
            r#"{{"name":"{name}","ph":"i","s":"t","pid":{},"tid":1,"ts":{ts:.1},"args":{{"step":{step}{extra_args}}}}}"#,
            self.pid
        ));
    }

    pub(crate) fn record_step(&mut self, step: u64, t: &StepTimes) {
        self.span("forward", 1, t.forward.0, t.forward.1, step);
        self.span("backward", 1, t.backward.0, t.backward.1, step);
        for (b, ready) in t.buckets.ready.iter().enumerate() {
            if let Some(at) = ready {
                let vs_end = signed_secs(*at, t.backward.1) * 1e3;
                let name = format!("bucket {b} ready");
                self.instant(
                    &name,
                    *at,
                    step,
                    &format!(r#","ms_vs_backward_end":{vs_end:.3}"#),
                );
            }
        }
        for (b, c) in t.buckets.comm.iter().enumerate() {
            if let Some(c) = c {
                self.span(
                    &format!("all_reduce bucket {b}"),
                    2,
                    c.started,
                    c.finished,
                    step,
                );
            }
        }
        for (b, u) in t.buckets.unpacked.iter().enumerate() {
            if let Some((s, e)) = u {
                self.span(&format!("unpack bucket {b}"), 1, *s, *e, step);
            }
        }
    }

    pub(crate) fn record_optimizer(&mut self, step: u64, start: Instant, end: Instant) {
        self.span("optimizer", 1, start, end, step);
    }

    pub(crate) fn to_json(&self) -> String {
        format!(
            "{{\"traceEvents\":[\n{}\n],\"displayTimeUnit\":\"ms\"}}\n",
            self.events.join(",\n")
        )
    }
}
