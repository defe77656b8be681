//! DDP on burn's NdArray backend (feature `ndarray`): the central equivalence (N ranks with batch
//! b train as one process with batch N*b, SGD and Adam, replicas bitwise identical), ZeRO stages
//! 1 and 2 and FSDP against plain DDP, and an exact checkpoint resume, on `Autodiff<NdArray>`.
//!
//! Run with `cargo test -p ddp-core --features ndarray --test core ndarray`; `cargo test
//! --workspace` runs them too (ddp-tests turns the feature on, and workspace builds unify
//! features). The helpers are generic over the backend only where the shared fixtures (`common`)
//! already are; the training loops are written once, for every backend, in `backend_suite.rs`.

type N = burn::backend::Autodiff<burn::backend::NdArray>;
const BACKEND: &str = "NdArray";

include!("backend_suite.rs");
