//! Shared pieces of the example programs: data sets, models, backend selection, evaluation.
//!
//! - [`digits`]: the UCI handwritten digits, its seeded split, dataset and batcher.
//! - [`models`]: the classifiers the examples train (an MLP, a CNN with `SyncBatchNorm`, a
//!   small transformer).
//! - [`backend`]: `--backend flex|ndarray|tch|cuda|cuda-fused` and the checks that make a missing GPU an error message.
//! - [`eval`]: accuracy and loss over a test set sharded across ranks without padding
//!   (every image on exactly one rank), all-reduced.
//! - [`training`]: the epoch loop (progress, step count, step clock) and the digits DDP step.
//! - [`resume`]: resume-by-default from the latest checkpoint, shared by the examples.
//! - [`reverse`]: the synthetic sequence-reversal task of the transformer example.
//! - [`warm_up`]: the first step's time (kernel compilation on a GPU) apart from training speed.
#![warn(missing_docs, missing_debug_implementations)]

pub mod backend;
pub mod digits;
pub mod eval;
pub mod models;
pub mod resume;
pub mod reverse;
pub mod training;
pub mod warm_up;
