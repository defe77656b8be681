//! The crate's single error type.

use std::time::Duration;

use thiserror::Error;

/// Everything that can go wrong when configuring a sampler, restoring its
/// state or loading batches.
///
/// Every message names the offending values and says what to do about them.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DataError {
    /// `num_replicas` (the world size) was zero.
    #[error(
        "num_replicas is 0; the world size must be at least 1 (set it to the number of training processes)"
    )]
    ZeroReplicas,

    /// The rank is not in `0..num_replicas`.
    #[error(
        "rank {rank} is out of range for num_replicas {num_replicas}; the rank must be in 0..{num_replicas}"
    )]
    RankOutOfRange {
        /// The rank that was given.
        rank: usize,
        /// The world size it was given with.
        num_replicas: usize,
    },

    /// The dataset has no items.
    #[error(
        "the dataset is empty (len 0); a distributed sampler needs at least one item, check the dataset path or filter"
    )]
    EmptyDataset,

    /// The batch size was zero.
    #[error("batch size is 0; set a batch size of at least 1")]
    ZeroBatchSize,

    /// Worker threads were requested with no room to prefetch a batch.
    #[error(
        "prefetch is 0 with num_workers {num_workers}; allow at least 1 batch in flight (or use num_workers 0)"
    )]
    ZeroPrefetch {
        /// The number of worker threads that was requested.
        num_workers: usize,
    },

    /// A position inside the epoch lies past the end of this rank's samples.
    #[error(
        "position {position} is past the end of the epoch ({num_samples} samples per rank); use a position in 0..={num_samples}"
    )]
    PositionOutOfRange {
        /// The requested position (samples consumed by this rank).
        position: usize,
        /// Samples per rank and epoch.
        num_samples: usize,
    },

    /// A saved state does not match the sampler it is loaded into.
    #[error(
        "saved sampler state has {field} = {saved} but this sampler has {field} = {current}; resume with the same {field} or start from scratch"
    )]
    StateMismatch {
        /// The name of the differing setting.
        field: &'static str,
        /// Its value in the saved state.
        saved: String,
        /// Its value in the sampler being restored.
        current: String,
    },

    /// A mid-epoch state cannot be continued exactly on a different world size.
    #[error(
        "cannot resume epoch {epoch} saved with world size {saved} on world size {current}: {global_consumed} samples were consumed globally, which is not a multiple of {current}; resume with world size {saved}, or from a checkpoint taken at an epoch boundary, or load `state.resharded_for({current})` to continue with exactly the samples of the epoch not consumed yet"
    )]
    WorldSizeChange {
        /// World size the state was saved with.
        saved: usize,
        /// World size of the sampler being restored.
        current: usize,
        /// The epoch the state was saved in.
        epoch: u64,
        /// Samples consumed by all ranks together in that epoch.
        global_consumed: usize,
    },

    /// A saved state's offset is not below its world size, which no sampler
    /// produces: the state is corrupt or was edited by hand.
    #[error(
        "saved sampler state has offset {offset} but num_replicas {num_replicas}; the offset (samples consumed before a world-size change) must be below num_replicas: the state is corrupt, start the epoch from scratch"
    )]
    OffsetOutOfRange {
        /// The saved offset.
        offset: usize,
        /// The saved world size.
        num_replicas: usize,
    },

    /// `Dataset::get` returned `None` for an index below `Dataset::len`.
    #[error(
        "the dataset returned no item for index {index} although its len() is {dataset_len}; the Dataset implementation is inconsistent (get must return Some for every index below len)"
    )]
    MissingItem {
        /// The index that was requested.
        index: usize,
        /// The length the dataset reported.
        dataset_len: usize,
    },

    /// The dataset or the batcher panicked while a batch was being loaded, or the worker that
    /// was loading it stopped.
    #[error(
        "loading batch {batch} failed: {message}; the dataset's get or the batcher's batch \
         panicked, or the loader's worker died: fix the dataset or batcher (RUST_BACKTRACE=1 \
         shows where it panicked)"
    )]
    WorkerPanicked {
        /// Index of the batch (counted from the start of the epoch) that failed.
        batch: usize,
        /// The panic message.
        message: String,
    },

    /// The loader's timeout was zero, which would fail every batch.
    #[error(
        "the data loader timeout is 0; set a positive timeout, or leave it unset to wait for batches without limit"
    )]
    ZeroTimeout,

    /// A timeout was set on a loader without worker threads, where it cannot apply.
    #[error(
        "a data loader timeout of {timeout:?} was set with num_workers 0; a timeout only applies to worker threads (a batch loaded on the iterating thread cannot be interrupted): set num_workers to at least 1, or remove the timeout"
    )]
    TimeoutWithoutWorkers {
        /// The timeout that was requested.
        timeout: Duration,
    },

    /// No batch arrived from the workers within the loader's timeout.
    ///
    /// The worker stays blocked in the dataset or batcher (a thread cannot be
    /// killed); see [`DistributedDataLoaderBuilder::timeout`](crate::DistributedDataLoaderBuilder::timeout).
    #[error(
        "data loader timed out after {timeout:?} waiting for batch {batch} of epoch {epoch} (dataset indices {}): a dataset `get` or the batcher is stuck or too slow on these samples; fix it, or raise the loader's timeout",
        list_indices(indices)
    )]
    Timeout {
        /// The loader's timeout.
        timeout: Duration,
        /// The epoch being iterated.
        epoch: u64,
        /// Index of the batch (counted from the start of the epoch) that did not arrive.
        batch: usize,
        /// The dataset indices of that batch.
        indices: Vec<usize>,
    },

    /// The worker thread pool could not be created.
    #[error("could not start {num_workers} data loader worker threads: {message}")]
    ThreadPool {
        /// The number of worker threads that was requested.
        num_workers: usize,
        /// The reason given by the operating system or rayon.
        message: String,
    },
}

/// Most indices a message lists; a large batch's are summarised.
const LISTED_INDICES: usize = 16;

/// `[3, 8, 1]`, or the first [`LISTED_INDICES`] and a count, so that a large
/// batch does not flood the log.
fn list_indices(indices: &[usize]) -> String {
    if indices.len() <= LISTED_INDICES {
        return format!("{indices:?}");
    }
    let shown: Vec<String> = indices[..LISTED_INDICES]
        .iter()
        .map(ToString::to_string)
        .collect();
    format!("[{}, ... ({} in all)]", shown.join(", "), indices.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_message_lists_few_indices_and_summarises_many() {
        let error = |indices: Vec<usize>| DataError::Timeout {
            timeout: Duration::from_millis(1500),
            epoch: 3,
            batch: 7,
            indices,
        };
        let short = error(vec![4, 9]).to_string();
        assert!(
            short.contains("1.5s") && short.contains("batch 7 of epoch 3"),
            "{short}"
        );
        assert!(short.contains("[4, 9]"), "{short}");
        let long = error((100..140).collect()).to_string();
        assert!(
            long.contains("[100, 101,") && long.contains("115, ... (40 in all)]"),
            "{long}"
        );
        assert!(!long.contains("116"), "{long}");
    }
}
