// The GPU tests, written once for both of burn's CUDA backends: `gpu_cuda.rs` includes this
// file in a module per backend, each defining `Inner` (the backend under `Autodiff`).

use crate::common::{Mlp, flat_params, max_scaled_diff, run_ranks};
use burn::backend::Autodiff;
use burn::backend::cuda::CudaDevice;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use ddp_core::{Collectives, DdpConfig, DistributedDataParallel, HostStaging, comm::ProcessGroup};
use std::io::Write;

type G = Autodiff<Inner>;

const STEPS: usize = 4;
const PER_RANK: usize = 4;

/// Fails, saying what is missing, unless this machine has a CUDA driver and a GPU.
fn require_gpu() {
    assert!(
        ddp_core::comm::cuda_driver_present(),
        "no CUDA driver found (libcuda could not be loaded): this test needs an NVIDIA GPU"
    );
    assert!(
        ddp_comm::cuda_device_count().unwrap_or(0) > 0,
        "the CUDA driver sees no GPU"
    );
}

fn batch(indices: &[usize], device: &CudaDevice) -> (Tensor<G, 2>, Tensor<G, 2>) {
    crate::common::batch_on::<G>(indices, device)
}

/// Rank `rank` of `world` takes every `world`-th sample of the step's global batch.
fn indices(step: usize, world: usize, rank: Option<usize>) -> Vec<usize> {
    let all = step * world * PER_RANK..(step + 1) * world * PER_RANK;
    match rank {
        None => all.collect(),
        Some(r) => all.skip(r).step_by(world).collect(),
    }
}

fn initial() -> Mlp<G> {
    let device = CudaDevice::new(0);
    G::seed(&device, 3);
    let m = Mlp::<G>::new(&device, 64);
    flat_params(&m); // initialise the lazy parameters, so clones share them
    m
}

/// One process with the global batch, plain burn.
fn reference(init: &Mlp<G>, world: usize) -> Vec<f32> {
    let device = CudaDevice::new(0);
    let mut model = init.clone();
    let mut adam = AdamConfig::new().init::<G, Mlp<G>>();
    for step in 0..STEPS {
        let (x, y) = batch(&indices(step, world, None), &device);
        let loss = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
        let grads = GradientsParams::from_grads::<G, _>(loss.backward(), &model);
        model = adam.step(0.01, model, grads);
    }
    flat_params(&model)
}

fn train(init: &Mlp<G>, pg: ProcessGroup, config: DdpConfig) -> Vec<f32> {
    let device = CudaDevice::new(0);
    let (world, rank) = (pg.world_size(), pg.rank());
    let mut ddp = DistributedDataParallel::new(init.clone(), pg, config).unwrap();
    let mut adam = AdamConfig::new().init::<G, Mlp<G>>();
    for step in 0..STEPS {
        let (x, y) = batch(&indices(step, world, Some(rank)), &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        let grads = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        ddp.optimizer_step(&mut adam, 0.01, grads);
    }
    flat_params(ddp.module())
}

/// Small buckets: several per step, some holding one parameter.
fn small_buckets() -> DdpConfig {
    DdpConfig::new()
        .with_bucket_cap_mb(0.002)
        .with_first_bucket_cap_mb(0.0005)
}

/// GPU check 1's reduction: NCCL forced at world size 1 averages in place (x / 1, exact) and hands
/// the gradients back as slices of the flat bucket: training equals plain burn on the same GPU,
/// bit for bit wherever plain burn repeats itself bit for bit on this GPU (on the unfused
/// backend; see `BITWISE` for the fused one).
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn nccl_engine_at_world_one_equals_plain_training() {
    require_gpu();
    let init = initial();
    let expected = reference(&init, 1);
    let deterministic = bitwise_equal(&reference(&init, 1), &expected);
    let got = run_ranks(1, |pg| {
        train(
            &init,
            pg,
            small_buckets().with_collectives(Collectives::Nccl),
        )
    });
    if deterministic && BITWISE {
        assert!(
            bitwise_equal(&got[0], &expected),
            "NCCL reduction at world 1 differs from plain burn (which repeats itself bit for bit) \
             by {}",
            max_scaled_diff(&got[0], &expected)
        );
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "plain burn repeats itself bit for bit: {deterministic}; bitwise equal to it: {}; \
             comparing to 1e-6",
            bitwise_equal(&got[0], &expected)
        );
        let diff = max_scaled_diff(&got[0], &expected);
        assert!(
            diff < 1e-6,
            "NCCL reduction at world 1 differs from plain burn by {diff}"
        );
    }
}

/// ZeRO stage 2 and FSDP with their collectives on NCCL at world size 1 (the device path:
/// gradients and parameters assembled as tensors on the GPU, reduce-scattered and all-gathered
/// by NCCL) train as plain burn does: within 1e-6 (their flat copies may round nothing, but
/// Adam's order of operations on a chunk is not the per-tensor one).
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn zero2_and_fsdp_on_nccl_at_world_one_equal_plain_training() {
    use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
    use ddp_core::zero::ZeroRedundancyOptimizer;
    require_gpu();
    let init = initial();
    let expected = reference(&init, 1);
    let device = CudaDevice::new(0);
    let zero2 = run_ranks(1, |pg| {
        let config = small_buckets().with_collectives(Collectives::Nccl);
        let mut ddp = DistributedDataParallel::new(init.clone(), pg, config).unwrap();
        let mut zero = ZeroRedundancyOptimizer::stage2(AdamConfig::new().init(), &mut ddp)
            .unwrap()
            .with_bucket_bytes(4096);
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, 1, Some(0)), &device);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            let stepped = zero.try_step(0.01, ddp.module().clone(), grads).unwrap();
            ddp.set_module(stepped).unwrap();
        }
        assert_eq!(zero.device_communicator(), Some("NCCL"));
        flat_params(ddp.module())
    });
    let diff = max_scaled_diff(&zero2[0], &expected);
    assert!(
        diff < 1e-6,
        "ZeRO-2 on NCCL differs from plain burn by {diff}"
    );
    let fsdp = run_ranks(1, |pg| {
        let config = FsdpConfig::new().with_collectives(Collectives::Nccl);
        let mut fsdp = FullyShardedDataParallel::new(init.clone(), pg, config).unwrap();
        let mut adam = AdamConfig::new().init::<G, ShardedParams<G>>();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, 1, Some(0)), &device);
            let pred = fsdp.forward(|m| m.forward(x, false)).unwrap();
            let grads = fsdp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            fsdp.optimizer_step(&mut adam, 0.01, grads).unwrap();
        }
        flat_params(&fsdp.full_module().unwrap())
    });
    let diff = max_scaled_diff(&fsdp[0], &expected);
    assert!(
        diff < 1e-6,
        "FSDP on NCCL differs from plain burn by {diff}"
    );
}

fn bitwise_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Two ranks on one GPU: NCCL cannot run them (one GPU per rank), so asking for it is a clear
/// error on every rank, not a hang in NCCL's rendezvous.
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn nccl_forced_with_two_ranks_on_one_gpu_is_refused_naming_the_gpu() {
    require_gpu();
    // Without libnccl the refusal names the missing library instead, not the shared GPU.
    if let Err(e) = ddp_comm::nccl_device_uuid(0) {
        panic!("NCCL cannot run here ({e}); point LD_LIBRARY_PATH at libnccl");
    }
    let init = initial();
    let errors = run_ranks(2, |pg| {
        DistributedDataParallel::new(
            init.clone(),
            pg,
            DdpConfig::new().with_collectives(Collectives::Nccl),
        )
        .err()
        .map(|e| e.to_string())
    });
    for (rank, e) in errors.iter().enumerate() {
        let e = e.as_deref().unwrap_or("no error");
        assert!(
            e.contains("same GPU") && e.contains("Collectives::Auto or Host"),
            "rank {rank}: {e}"
        );
    }
}

/// With `Collectives::Auto`, two ranks on one GPU fall back to host staging (NCCL needs a GPU per
/// rank) and train as one process with twice the batch.
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn auto_with_two_ranks_on_one_gpu_falls_back_to_host_staging() {
    require_gpu();
    let init = initial();
    let expected = reference(&init, 2);
    let got = run_ranks(2, |pg| {
        train(
            &init,
            pg,
            small_buckets().with_collectives(Collectives::Auto),
        )
    });
    assert!(bitwise_equal(&got[0], &got[1]), "the replicas differ");
    let diff = max_scaled_diff(&got[0], &expected);
    assert!(diff < 1e-5, "two ranks differ from one process by {diff}");
}

/// GPU check 2: two ranks share the GPU and reduce through host staging (one copy each way per
/// bucket): they stay bitwise identical and equal one process with twice the batch.
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn two_ranks_sharing_a_gpu_through_host_staging_equal_one_process() {
    require_gpu();
    let init = initial();
    let expected = reference(&init, 2);
    let config = small_buckets()
        .with_collectives(Collectives::Host)
        .with_host_staging(HostStaging::PerBucket);
    let got = run_ranks(2, |pg| train(&init, pg, config.clone()));
    assert!(bitwise_equal(&got[0], &got[1]), "the replicas differ");
    let diff = max_scaled_diff(&got[0], &expected);
    assert!(diff < 1e-5, "two ranks differ from one process by {diff}");
}
