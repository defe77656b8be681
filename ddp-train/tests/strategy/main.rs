//! The DDP strategy against burn-train's single-process semantics, with ranks as threads (each
//! with its own process group over a local store), deterministic: seeded weights, seeded
//! sampler, no timing assertions. One test binary (`cargo test -p ddp-train --test strategy`):
//! the shared runs and data are in `fixture/`, the tests in one file per topic.

mod fixture;

mod aborts;
mod data_errors;
mod equivalence;
mod failures;
mod loader;
mod mid_epoch;
mod resume;
