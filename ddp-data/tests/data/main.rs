//! All of this crate's integration tests in one binary: burn is linked once instead of
//! once per file. Each module is one former test file; `cargo test --test data NAME`
//! filters as before.

mod common;

mod errors;
mod loader_determinism;
mod loader_prefetch;
mod loader_timeout;
mod reshard;
mod resume;
mod sampler_properties;
mod sampler_pytorch_table;
