//! `DistributedDataLoaderBuilder::timeout`: a dataset `get` that never returns
//! ends the iteration with `DataError::Timeout` instead of hanging the rank,
//! and a slow one within the timeout changes nothing.
//!
//! The stuck `get`s wait on a gate that each test opens when it ends (also when
//! it fails), so no thread is left blocked. No assertion depends on speed: a
//! hang would be caught by the test harness.
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use burn::backend::Flex;
use burn::data::dataset::Dataset;
use ddp_data::{DataError, DistributedDataLoaderBuilder, DistributedSamplerConfig};

use crate::common::{Collect, JitterDataset};

/// Short: the stuck `get`s never return before the gate opens, so any
/// timeout gives the same result; a short one only keeps the tests quick.
const SHORT: Duration = Duration::from_millis(200);

/// Closed until opened; `get`s of blocked indices wait for it.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*open {
            open = self
                .opened
                .wait(open)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Opens the gate when dropped: declared first in a test, it is dropped last,
/// after the loader, so the drops are checked with the worker still stuck.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        *self.0.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.0.opened.notify_all();
    }
}

/// Item `i` is `i`; `get` of a blocked index waits for the gate.
#[derive(Debug, Clone)]
struct GatedDataset {
    len: usize,
    blocked: HashSet<usize>,
    gate: Arc<Gate>,
}

impl Dataset<usize> for GatedDataset {
    fn get(&self, index: usize) -> Option<usize> {
        if self.blocked.contains(&index) {
            self.gate.wait();
        }
        (index < self.len).then_some(index)
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A closed gate (opened when the returned guard drops) and a dataset of
/// `len` items whose `blocked` indices wait for it.
fn gated(len: usize, blocked: &[usize]) -> (OpenOnDrop, GatedDataset) {
    let gate = Arc::new(Gate::default());
    let dataset = GatedDataset {
        len,
        blocked: blocked.iter().copied().collect(),
        gate: Arc::clone(&gate),
    };
    (OpenOnDrop(gate), dataset)
}

fn in_order() -> DistributedSamplerConfig {
    DistributedSamplerConfig::new(1, 0).with_shuffle(false)
}

#[test]
fn blocked_get_times_out_with_an_error_naming_the_timeout() {
    let (_open, dataset) = gated(12, &[4]);
    // Resume after batches 0 and 1 (samples 0..4), so the first batch waited
    // for is batch 2 (indices 4, 5), whose `get(4)` never returns.
    let mut state = DistributedDataLoaderBuilder::new(Collect)
        .build(dataset.clone(), in_order())
        .unwrap()
        .state();
    state.position = 4;
    let loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(2)
        .num_workers(2)
        .timeout(SHORT)
        .resume_from(state)
        .build(dataset, in_order())
        .unwrap();
    assert_eq!(loader.timeout(), Some(SHORT));
    let mut iter = loader.iter();
    let err = iter.next().expect("an item").unwrap_err();
    assert_eq!(
        err,
        DataError::Timeout {
            timeout: SHORT,
            epoch: 0,
            batch: 2,
            indices: vec![4, 5],
        }
    );
    let text = err.to_string();
    for part in [
        "timed out after 200ms",
        "batch 2 of epoch 0",
        "[4, 5]",
        "timeout",
    ] {
        assert!(text.contains(part), "{part:?} missing in: {text}");
    }
    assert!(iter.next().is_none(), "the timeout ends the iteration");
    assert_eq!(
        (loader.state().epoch, loader.state().position),
        (0, 4),
        "the timed-out batch is not counted as consumed"
    );
}

#[test]
fn dropping_after_a_timeout_does_not_hang() {
    let (_open, dataset) = gated(8, &[0]);
    let loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(2)
        .num_workers(1)
        .timeout(SHORT)
        .build(dataset, in_order())
        .unwrap();
    let mut iter = loader.iter();
    assert!(matches!(
        iter.next(),
        Some(Err(DataError::Timeout { batch: 0, .. }))
    ));
    drop(iter);
    // The only worker is still stuck in `get(0)`: a new iteration times out
    // too, rather than waiting behind it forever.
    let second: Vec<_> = loader.iter().collect();
    assert!(
        matches!(
            second.as_slice(),
            [Err(DataError::Timeout { batch: 0, .. })]
        ),
        "{second:?}"
    );
    assert_eq!(loader.state().position, 0);
    // Dropping the loader does not wait for the stuck worker; `_open` then
    // lets it finish.
    drop(loader);
}

#[test]
fn slow_dataset_within_a_generous_timeout_gives_every_batch_unchanged() {
    // `get` sleeps up to 0.8 ms (30 ms for the first items), finishing out of order.
    let dataset = JitterDataset {
        len: 41,
        slow_below: 4,
    };
    let config = DistributedSamplerConfig::new(2, 1).with_seed(5);
    let build = |timeout: Option<Duration>| {
        let builder = DistributedDataLoaderBuilder::new(Collect)
            .batch_size(3)
            .num_workers(3);
        match timeout {
            Some(timeout) => builder.timeout(timeout),
            None => builder,
        }
        .build(dataset, config.clone())
        .unwrap()
    };
    let (mut plain, mut timed) = (build(None), build(Some(Duration::from_secs(30))));
    for epoch in 0..2 {
        plain.set_epoch(epoch);
        timed.set_epoch(epoch);
        let expected: Vec<Vec<usize>> = plain.iter().map(Result::unwrap).collect();
        let got: Vec<Vec<usize>> = timed.iter().map(Result::unwrap).collect();
        assert_eq!(expected.len(), plain.len());
        assert_eq!(got, expected, "epoch {epoch}");
        assert_eq!(timed.state(), plain.state());
    }
}

#[test]
fn zero_timeout_is_refused() {
    let err = build_err(
        DistributedDataLoaderBuilder::new(Collect)
            .num_workers(2)
            .timeout(Duration::ZERO),
    );
    assert_eq!(err, DataError::ZeroTimeout);
    assert!(err.to_string().contains("timeout is 0"), "{err}");
}

#[test]
fn timeout_without_workers_is_refused() {
    let err = build_err(DistributedDataLoaderBuilder::new(Collect).timeout(Duration::from_secs(5)));
    assert_eq!(
        err,
        DataError::TimeoutWithoutWorkers {
            timeout: Duration::from_secs(5)
        }
    );
    assert!(err.to_string().contains("num_workers 0"), "{err}");
}

/// What `build` refuses `builder` with, on a small dataset.
fn build_err(builder: DistributedDataLoaderBuilder<Flex, usize, Vec<usize>>) -> DataError {
    let dataset = JitterDataset {
        len: 4,
        slow_below: 0,
    };
    match builder.build(dataset, in_order()) {
        Ok(_) => panic!("the builder's settings were accepted"),
        Err(e) => e,
    }
}
