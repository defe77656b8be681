//! Loading one batch: fetch the items, batch them, and turn every failure
//! (a missing item or a panic) into a [`DataError`].

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;

use crate::DataError;

/// Everything a worker needs to load batches, shared by all jobs.
pub(crate) struct Source<B: Backend, I, O> {
    pub(crate) dataset: Arc<dyn Dataset<I>>,
    pub(crate) batcher: Arc<dyn Batcher<B, I, O>>,
    pub(crate) device: B::Device,
    /// The dataset length the sampler was built for.
    pub(crate) dataset_len: usize,
}

impl<B: Backend, I, O> Source<B, I, O> {
    /// Loads the items at `indices` and batches them; `batch` is only used
    /// in error messages. Never panics.
    pub(crate) fn load(&self, indices: &[usize], batch: usize) -> Result<O, DataError> {
        let attempt = catch_unwind(AssertUnwindSafe(|| {
            let mut items = Vec::with_capacity(indices.len());
            for &index in indices {
                let item = self.dataset.get(index).ok_or(DataError::MissingItem {
                    index,
                    dataset_len: self.dataset_len,
                })?;
                items.push(item);
            }
            Ok(self.batcher.batch(items, &self.device))
        }));
        let result = attempt.unwrap_or_else(|payload| {
            Err(DataError::WorkerPanicked {
                batch,
                message: panic_message(payload.as_ref()),
            })
        });
        if let Err(error) = &result {
            tracing::warn!(batch, %error, "failed to load a batch");
        }
        result
    }
}

/// The text of a panic payload (`&str` or `String`), or a placeholder.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic payload is not a string".to_owned()
    }
}

/// A finished batch, keyed by its sequence number within the iteration.
pub(crate) type Finished<O> = (usize, Result<O, DataError>);

/// Delivers exactly one result per job: if the job never calls
/// [`send`](Self::send) (it unwound somewhere unexpected), dropping the
/// reply sends an error instead, so the consumer can never wait forever.
pub(crate) struct Reply<O> {
    pub(crate) tx: Option<mpsc::Sender<Finished<O>>>,
    pub(crate) seq: usize,
    pub(crate) batch: usize,
}

impl<O> Reply<O> {
    pub(crate) fn send(mut self, result: Result<O, DataError>) {
        if let Some(tx) = self.tx.take() {
            // The receiver is gone only if the iterator was dropped.
            let _ = tx.send((self.seq, result));
        }
    }
}

impl<O> Drop for Reply<O> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((
                self.seq,
                Err(DataError::WorkerPanicked {
                    batch: self.batch,
                    message: "the worker stopped without producing the batch".to_owned(),
                }),
            ));
        }
    }
}

/// One batch to load on the worker pool.
pub(crate) struct Job<B: Backend, I, O> {
    pub(crate) source: Arc<Source<B, I, O>>,
    pub(crate) indices: Vec<usize>,
    pub(crate) reply: Reply<O>,
    pub(crate) cancelled: Arc<AtomicBool>,
}

impl<B: Backend, I, O> Job<B, I, O> {
    /// Runs the job (skipping the work if the iterator was dropped).
    pub(crate) fn run(self) {
        if self.cancelled.load(Ordering::Relaxed) {
            return;
        }
        let result = self.source.load(&self.indices, self.reply.batch);
        self.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_message_reads_str_and_string_payloads() {
        let payload = catch_unwind(|| panic!("static text")).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "static text");
        let value = 3;
        let payload = catch_unwind(|| panic!("formatted {value}")).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "formatted 3");
        let payload = catch_unwind(|| std::panic::panic_any(17_u8)).unwrap_err();
        assert_eq!(
            panic_message(payload.as_ref()),
            "panic payload is not a string"
        );
    }

    #[test]
    fn dropped_reply_sends_an_error() {
        let (tx, rx) = mpsc::channel::<Finished<()>>();
        drop(Reply {
            tx: Some(tx),
            seq: 4,
            batch: 9,
        });
        let (seq, result) = rx.recv().unwrap();
        assert_eq!(seq, 4);
        assert!(matches!(
            result,
            Err(DataError::WorkerPanicked { batch: 9, .. })
        ));
    }
}
