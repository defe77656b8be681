//! DDP on burn's LibTorch backend (feature `tch`: PyTorch's kernels through the `tch` crate): the
//! central equivalence (N ranks with batch b train as one process with batch N*b, SGD and Adam,
//! replicas bitwise identical), ZeRO stages 1 and 2 and FSDP against plain DDP, and an exact
//! checkpoint resume, on `Autodiff<LibTorch>` (its CPU device); the same tests as
//! `ndarray_backend.rs`.
//!
//! Run with `LIBTORCH_USE_PYTORCH=1 cargo test -p ddp-core --features tch --test
//! tch_backend` after `pip install torch==2.9.0` (the crate docs, "Features"; the filter
//! `tch_backend`, not `tch`, which other tests' names contain). Unlike `ndarray`, no workspace
//! member turns `tch` on: `cargo test --workspace` builds no libtorch, and CI runs these in a
//! step of their own.

type N = burn::backend::Autodiff<burn::backend::LibTorch>;
const BACKEND: &str = "LibTorch";

include!("backend_suite.rs");
