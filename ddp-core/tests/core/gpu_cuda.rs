//! DDP on burn's CUDA backends (feature `cuda`): the NCCL reduction and host staging on a real
//! GPU, on the unfused `CubeBackend` (what our workspace's `burn::backend::Cuda` is) and on
//! `Fusion<CubeBackend>` (what a user's `burn::backend::Cuda` is with burn's default features).
//!
//! Every test here is `#[ignore]`d with the reason (CI has no GPU, so `cargo test` lists them as
//! not run); on a GPU machine run them with
//! `cargo test -p ddp-core --features cuda --test core gpu_cuda -- --ignored --nocapture`, or
//! `.ci/gpu-checks`. There a missing driver, GPU or libnccl fails them, saying which.

/// burn's CUDA backend without fusion.
mod unfused {
    type Inner = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    /// Plain burn and DDP run the same kernels here: equal bit for bit.
    const BITWISE: bool = true;
    include!("gpu_cuda_suite.rs");
}

/// burn's default CUDA backend: fusion on (kernels fused at run time by burn-fusion).
mod fused {
    /// burn-fusion fuses the operations around DDP's buckets (the copies into the flat bucket,
    /// the slices out of it) into other kernels than plain burn's graph gives, which may round
    /// differently: equal within 1e-6 (whether bit for bit too is printed).
    const BITWISE: bool = false;
    type Inner =
        burn_fusion::Fusion<burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>;
    include!("gpu_cuda_suite.rs");
}
