//! The central equivalence, with ranks as separate processes: N ranks with batch b each end
//! with the same parameters as one process with batch N*b, and all replicas bitwise identical.

use ddp_tests::fixtures::{
    Opt, SmallMlp, TestBackend, flat_params, max_scaled_diff, to_bytes, train_reference,
};
use ddp_tests::spawn_world;
use std::time::Duration;

/// The worker executable: cargo's, unless `DDP_WORKER_EXE` names another (the GPU checks carry
/// this test and the worker to a machine where cargo's path does not exist).
fn worker() -> String {
    std::env::var("DDP_WORKER_EXE").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ddp_worker").to_string())
}

fn check(world: usize, opt: Opt) {
    check_over(world, opt, "auto");
}

fn check_over(world: usize, opt: Opt, transport: &str) {
    let reference = |init: &[u8]| train_reference(init, world, opt);
    check_with(world, opt, &[("DDP_TRANSPORT", transport)], reference);
}

/// Runs `world` worker processes with the extra environment `env` and compares them with each
/// other (bitwise) and with `reference` (one process, the union batch; within 1e-5 of its
/// largest weight). The initial weights are seeded, so every machine checks the same numbers.
fn check_with(
    world: usize,
    opt: Opt,
    env: &[(&str, &str)],
    reference: impl Fn(&[u8]) -> Result<Vec<f32>, String>,
) {
    let (dir, init, outputs) = run_world(world, opt, |_| pairs(env));
    for o in &outputs {
        assert_eq!(
            o.code,
            Some(0),
            "{opt:?} world {world} {env:?} rank {}: {}",
            o.rank,
            o.stderr
        );
    }
    let read = |r: usize| -> Vec<f32> {
        std::fs::read(dir.path().join(format!("rank{r}.bin")))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let rank0 = read(0);
    for r in 1..world {
        let other = read(r);
        assert!(
            other
                .iter()
                .zip(&rank0)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{opt:?} world {world} {env:?}: rank {r} is not bitwise equal to rank 0"
        );
    }
    let reference = reference(&init).unwrap();
    let diff = max_scaled_diff(&rank0, &reference);
    assert!(
        diff < 1e-5,
        "{opt:?} world {world} {env:?}: differs from one process by {diff}"
    );
}

fn pairs(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Starts `world` workers from the seeded initial weights with `env(rank)` and waits for them
/// (120 s at most); the output directory, the initial weights and each rank's outcome.
fn run_world(
    world: usize,
    opt: Opt,
    env: impl Fn(usize) -> Vec<(String, String)>,
) -> (tempfile::TempDir, Vec<u8>, Vec<ddp_tests::RankOutput>) {
    let dir = tempfile::tempdir().unwrap();
    let model = SmallMlp::<TestBackend>::seeded(&Default::default(), 7);
    flat_params(&model); // initialise the lazy parameters before serialising
    let init = to_bytes(&model);
    let init_path = dir.path().join("init.bin");
    std::fs::write(&init_path, &init).unwrap();
    let out = dir.path().display().to_string();
    let opt_name = if opt == Opt::Sgd { "sgd" } else { "adam" };
    let outputs = spawn_world(
        &worker(),
        &[init_path.to_str().unwrap(), &out, opt_name],
        world,
        Duration::from_secs(120),
        env,
    );
    (dir, init, outputs)
}

#[test]
fn processes_with_sgd_train_like_one_process_with_the_union_batch() {
    for world in [2, 3, 4] {
        check(world, Opt::Sgd);
    }
}

#[test]
fn processes_with_adam_train_like_one_process_with_the_union_batch() {
    for world in [2, 3, 4] {
        check(world, Opt::Adam);
    }
}

/// TCP reduces each bucket through a flat copy of its gradients (shared memory reads them in
/// place): the same parameters either way.
#[test]
fn processes_over_tcp_train_like_one_process_with_the_union_batch() {
    check_over(3, Opt::Sgd, "tcp");
    check_over(2, Opt::Adam, "tcp");
}

/// Two processes sharing one GPU (NCCL cannot put two ranks on one device, so gradients go
/// through the host and the CPU transport): the same equivalence, against one process training
/// on the same GPU.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU and its driver; run with --features cuda -- --ignored on a GPU machine"]
fn processes_sharing_one_gpu_train_like_one_process_with_the_union_batch() {
    assert!(
        ddp_core::comm::cuda_driver_present(),
        "no CUDA driver found (libcuda could not be loaded): this test needs an NVIDIA GPU"
    );
    type Gpu = burn::backend::Autodiff<burn::backend::Cuda>;
    let device = burn::backend::cuda::CudaDevice::new(0);
    for opt in [Opt::Sgd, Opt::Adam] {
        let reference =
            |init: &[u8]| ddp_tests::fixtures::train_reference_on::<Gpu>(init, 2, opt, &device);
        check_with(2, opt, &[("DDP_TEST_BACKEND", "cuda")], reference);
    }
}

/// The device engine that drives NCCL, on its CPU stand-in (`Collectives::StandIn`: issuing
/// thread, per-rank communication thread, watchdog), with ranks as processes: the same
/// equivalence at worlds 2 to 8.
#[test]
fn processes_over_the_device_engine_stand_in_train_like_one_process() {
    let stand_in = [("DDP_TEST_COLLECTIVES", "stand-in")];
    for (world, opt) in [
        (2, Opt::Sgd),
        (3, Opt::Adam),
        (4, Opt::Sgd),
        (8, Opt::Sgd),
        (8, Opt::Adam),
    ] {
        let reference = |init: &[u8]| train_reference(init, world, opt);
        check_with(world, opt, &stand_in, reference);
    }
}

/// ZeRO stage 2 on the device path (gradients reduce-scattered and parameters all-gathered as
/// tensors, through the stand-in's communicator: the code NCCL runs on GPUs), with ranks as
/// processes at worlds 2 to 8: the same parameters as one process with the union batch,
/// replicas bitwise identical.
#[test]
fn processes_with_zero2_on_the_device_stand_in_train_like_one_process() {
    let env = [
        ("DDP_TEST_COLLECTIVES", "stand-in"),
        ("DDP_TEST_SHARDING", "zero2"),
    ];
    for (world, opt) in [(2, Opt::Adam), (3, Opt::Sgd), (4, Opt::Adam), (8, Opt::Sgd)] {
        let reference = |init: &[u8]| train_reference(init, world, opt);
        check_with(world, opt, &env, reference);
    }
}

/// FSDP on the device path (each unit's gradient assembled as a tensor and reduce-scattered
/// by the device engine's issuing thread during backward, the chunks all-gathered on the
/// stand-in's communicator: the code NCCL runs on GPUs), with ranks as processes at worlds 2
/// to 8: the same parameters as one process with the union batch, replicas bitwise identical.
#[test]
fn processes_with_fsdp_on_the_device_stand_in_train_like_one_process() {
    let env = [
        ("DDP_TEST_COLLECTIVES", "stand-in"),
        ("DDP_TEST_SHARDING", "fsdp"),
    ];
    for (world, opt) in [(2, Opt::Sgd), (3, Opt::Adam), (4, Opt::Sgd), (8, Opt::Adam)] {
        let reference = |init: &[u8]| train_reference(init, world, opt);
        check_with(world, opt, &env, reference);
    }
}

/// Fences that complete late (each 30 ms after its bucket was read, on its own thread, so
/// possibly out of order): the issuing thread still queues buckets in launch order.
#[test]
fn processes_over_the_stand_in_with_late_fences_train_like_one_process() {
    let env = [
        ("DDP_TEST_COLLECTIVES", "stand-in"),
        ("DDP_TEST_STAND_IN_FENCE", "delay:30"),
    ];
    let reference = |init: &[u8]| train_reference(init, 3, Opt::Adam);
    check_with(3, Opt::Adam, &env, reference);
}

/// The stand-in with a fault on rank 1 only.
fn stand_in_fault(world: usize, fault: &str, timeout_s: &str) -> Vec<ddp_tests::RankOutput> {
    stand_in_fault_with(world, fault, timeout_s, &[])
}

/// [`stand_in_fault`] with more environment for every rank.
fn stand_in_fault_with(
    world: usize,
    fault: &str,
    timeout_s: &str,
    extra: &[(&str, &str)],
) -> Vec<ddp_tests::RankOutput> {
    let (_dir, _init, outputs) = run_world(world, Opt::Sgd, |rank| {
        let mut env = pairs(&[
            ("DDP_TEST_COLLECTIVES", "stand-in"),
            ("DDP_TIMEOUT_SECS", timeout_s),
        ]);
        env.extend(pairs(extra));
        if rank == 1 {
            env.push(("DDP_TEST_STAND_IN_FENCE".into(), fault.into()));
        }
        env
    });
    outputs
}

/// A fence that never completes on rank 1 (a kernel that never ends): after the timeout rank 1
/// says which bucket it waited for, every other rank names rank 1, and every rank exits.
#[test]
fn stand_in_fence_that_never_completes_is_named_and_every_rank_exits() {
    let outputs = stand_in_fault(3, "never:1", "15");
    for o in &outputs {
        assert_eq!(
            o.code,
            Some(2),
            "rank {} exits with its error: {}",
            o.rank,
            o.stderr
        );
    }
    assert!(
        outputs[1]
            .stderr
            .contains("has not finished the kernels that produce gradient bucket"),
        "rank 1 names its stuck bucket: {}",
        outputs[1].stderr
    );
    for o in outputs.iter().filter(|o| o.rank != 1) {
        assert!(
            o.stderr.contains("rank 1"),
            "rank {} names rank 1: {}",
            o.rank,
            o.stderr
        );
    }
}

/// Rank 1 dies (SIGKILL) between two buckets of a step: every other rank fails naming it, long
/// before the (default, 10-minute) timeout, and exits.
#[test]
fn stand_in_rank_killed_between_buckets_is_named_by_every_peer() {
    let outputs = stand_in_fault(3, "kill:2", "600");
    assert_eq!(
        outputs[1].code, None,
        "rank 1 was killed: {}",
        outputs[1].stderr
    );
    for o in outputs.iter().filter(|o| o.rank != 1) {
        assert_eq!(
            o.code,
            Some(2),
            "rank {} exits with its error: {}",
            o.rank,
            o.stderr
        );
        assert!(
            o.stderr.contains("rank 1"),
            "rank {} names rank 1: {}",
            o.rank,
            o.stderr
        );
    }
}

/// Rank 1 dies (SIGKILL) in the middle of ZeRO stage 2's collectives on the device path (its
/// third staged buffer: between two groups), and of FSDP's (its seventh: in the first
/// backward, after one unit's reduce-scatter was queued, before the next): every other rank
/// fails naming it, long before the (10-minute) timeout, and exits.
#[test]
fn stand_in_rank_killed_inside_zero2_and_fsdp_collectives_is_named_by_every_peer() {
    for (sharding, fault) in [("zero2", "kill:2"), ("fsdp", "kill:6")] {
        let outputs = stand_in_fault_with(3, fault, "600", &[("DDP_TEST_SHARDING", sharding)]);
        assert_eq!(
            outputs[1].code, None,
            "{sharding}: rank 1 was killed: {}",
            outputs[1].stderr
        );
        for o in outputs.iter().filter(|o| o.rank != 1) {
            assert_eq!(
                o.code,
                Some(2),
                "{sharding}: rank {} exits with its error: {}",
                o.rank,
                o.stderr
            );
            assert!(
                o.stderr.contains("rank 1"),
                "{sharding}: rank {} names rank 1: {}",
                o.rank,
                o.stderr
            );
        }
    }
}
