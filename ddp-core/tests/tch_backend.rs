//! The LibTorch tests (`core/tch_backend.rs`: DDP, ZeRO 1 and 2, FSDP and a checkpoint resume
//! on `Autodiff<LibTorch>`) in a test binary of their own: the `tch` build then compiles these
//! and the shared helpers, not all of `core`'s modules again (CI's tch step).

#[cfg(feature = "tch")]
#[allow(dead_code, unused_imports)] // the helpers all of the suites share; this one uses some
#[path = "core/common/mod.rs"]
mod common;

#[cfg(feature = "tch")]
#[path = "core/tch_backend.rs"]
mod tch_backend;

#[cfg(not(feature = "tch"))]
mod tch_backend {
    /// Without the `tch` feature the LibTorch tests are not built: listed here as ignored, so
    /// the summary shows them as not run. Run with `--ignored`, this says how to run them.
    #[test]
    #[ignore = "needs the tch feature and libtorch 2.9.0 (pip install torch==2.9.0); .ci/run installs it and runs them"]
    fn tch_backend_tests_need_the_tch_feature_and_libtorch() {
        panic!(
            "the LibTorch tests are built with the tch feature only: pip install torch==2.9.0, \
             then LIBTORCH_USE_PYTORCH=1 cargo test -p ddp-core --features tch --test \
             tch_backend (.ci/run does this in its tch step)"
        );
    }
}
