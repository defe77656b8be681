//! The central equivalence, with ranks as separate processes: N ranks with batch b each end
//! with the same parameters as one process with batch N*b, and all replicas bitwise identical.

use ddp_tests::fixtures::{
    Opt, RankPlan, STEPS, SmallMlp, TestBackend, flat_params, max_scaled_diff, to_bytes,
    train_reference, train_reference_ranks,
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
    check_ranks(world, opt, |_| pairs(env), reference);
}

/// Per rank, per synchronised step: (buckets, buckets launched during backward).
type Stats = Vec<Vec<(usize, usize)>>;

/// [`check_with`] with each rank's own environment `env(rank)`; every rank's [`Stats`].
fn check_ranks(
    world: usize,
    opt: Opt,
    env: impl Fn(usize) -> Vec<(String, String)>,
    reference: impl Fn(&[u8]) -> Result<Vec<f32>, String>,
) -> Stats {
    let what = format!("{opt:?} world {world} {:?}", env(1));
    let (dir, init, outputs) = run_world(world, opt, env);
    for o in &outputs {
        assert_eq!(o.code, Some(0), "{what} rank {}: {}", o.rank, o.stderr);
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
            "{what}: rank {r} is not bitwise equal to rank 0"
        );
    }
    let reference = reference(&init).unwrap();
    let diff = max_scaled_diff(&rank0, &reference);
    assert!(diff < 1e-5, "{what}: differs from one process by {diff}");
    (0..world)
        .map(|r| {
            let text = std::fs::read_to_string(dir.path().join(format!("rank{r}.stats"))).unwrap();
            text.lines()
                .map(|l| {
                    let (b, d) = l.split_once(' ').unwrap();
                    (b.parse().unwrap(), d.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

fn pairs(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The seeded initial weights, serialised.
fn init_bytes() -> Vec<u8> {
    let model = SmallMlp::<TestBackend>::seeded(&Default::default(), 7);
    flat_params(&model); // initialise the lazy parameters before serialising
    to_bytes(&model)
}

/// Starts `world` workers from the seeded initial weights with `env(rank)` and waits for them
/// (120 s at most); the output directory, the initial weights and each rank's outcome.
fn run_world(
    world: usize,
    opt: Opt,
    env: impl Fn(usize) -> Vec<(String, String)>,
) -> (tempfile::TempDir, Vec<u8>, Vec<ddp_tests::RankOutput>) {
    let dir = tempfile::tempdir().unwrap();
    let init = init_bytes();
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
/// equivalence at worlds 2 to 8, bitwise equal replicas. With automatic overlap (the default)
/// and small buckets, most of each step's buckets are launched while backward still runs, on
/// every rank and at every world size, as the NCCL engine launches them on a GPU.
#[test]
fn processes_over_the_device_engine_stand_in_train_like_one_process() {
    for (world, opt) in [
        (2, Opt::Sgd),
        (3, Opt::Adam),
        (4, Opt::Sgd),
        (8, Opt::Sgd),
        (8, Opt::Adam),
    ] {
        let reference = |init: &[u8]| train_reference(init, world, opt);
        let stats = check_ranks(world, opt, |_| stand_in(&[]), reference);
        assert_most_buckets_launched_during_backward(world, &stats);
    }
}

/// The stand-in's settings, and `extra`.
fn stand_in(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = pairs(&[("DDP_TEST_COLLECTIVES", "stand-in")]);
    env.extend(pairs(extra));
    env
}

/// Every rank synchronised every step, with several buckets each; from the second step on
/// (the first learns where the taps go), more than half of them left during backward.
fn assert_most_buckets_launched_during_backward(world: usize, stats: &Stats) {
    for (rank, steps) in stats.iter().enumerate() {
        assert_eq!(steps.len(), STEPS, "world {world} rank {rank}: {steps:?}");
        for &(buckets, during) in &steps[1..] {
            assert!(buckets >= 3, "world {world} rank {rank}: {steps:?}");
            assert!(
                2 * during > buckets,
                "world {world} rank {rank}: most buckets must leave during backward: {steps:?}"
            );
        }
    }
}

/// Automatic overlap off (plain taps): the same parameters at worlds 2 and 4.
#[test]
fn stand_in_processes_with_automatic_overlap_off_train_like_one_process() {
    for (world, opt) in [(4, Opt::Adam), (2, Opt::Sgd)] {
        let reference = |init: &[u8]| train_reference(init, world, opt);
        let off = |_| stand_in(&[("DDP_TEST_OVERLAP", "off")]);
        let stats = check_ranks(world, opt, off, reference);
        for (rank, steps) in stats.iter().enumerate() {
            assert_eq!(steps.len(), STEPS, "world {world} rank {rank}: {steps:?}");
            assert!(steps.iter().all(|&(b, _)| b >= 3), "rank {rank}: {steps:?}");
        }
    }
}

/// Gradient accumulation (`backward_no_sync`): 2 micro-batches at worlds 3 and 8, 4 at world 2,
/// equal one process stepping on the union batch.
#[test]
fn stand_in_processes_with_no_sync_train_like_one_process() {
    for (world, opt, micro) in [(3, Opt::Sgd, "2"), (2, Opt::Adam, "4"), (8, Opt::Sgd, "2")] {
        let reference = |init: &[u8]| train_reference(init, world, opt);
        let no_sync = |_| stand_in(&[("DDP_TEST_NO_SYNC", micro)]);
        let stats = check_ranks(world, opt, no_sync, reference);
        for (rank, steps) in stats.iter().enumerate() {
            assert_eq!(
                steps.len(),
                STEPS,
                "rank {rank}: one synchronised step each"
            );
        }
    }
}

/// `fc2.bias` unused on rank 1 only (its forward skips it): it counts as zero there, nobody
/// hangs, and the ranks equal one process averaging the ranks' losses, each with its forward.
#[test]
fn stand_in_processes_with_a_parameter_unused_on_one_rank_train_like_one_process() {
    let world = 3;
    let plan = RankPlan {
        skips_bias: Some(1),
        ..RankPlan::even(world)
    };
    let env = |rank| {
        let skip = if rank == 1 { "1" } else { "0" };
        stand_in(&[("DDP_TEST_SKIP_BIAS", skip)])
    };
    let reference = |init: &[u8]| train_reference_ranks(init, &plan, Opt::Adam);
    check_ranks(world, Opt::Adam, env, reference);
    // The reference really differs from everyone using the bias.
    let init = init_bytes();
    let all_use = train_reference(&init, world, Opt::Adam).unwrap();
    let one_skips = train_reference_ranks(&init, &plan, Opt::Adam).unwrap();
    assert!(max_scaled_diff(&one_skips, &all_use) > 1e-4);
}

/// Uneven inputs (Join) at world 4: ranks with 4, 2, 3 and 1 steps; those out of data join and
/// answer the others' steps; every step averages the ranks that still train.
#[test]
fn stand_in_processes_with_uneven_inputs_join_and_train_like_one_process() {
    let steps = [STEPS, 2, 3, 1];
    let plan = RankPlan {
        steps: steps.to_vec(),
        skips_bias: None,
    };
    let env = |rank: usize| stand_in(&[("DDP_TEST_STEPS", &steps[rank].to_string())]);
    let reference = |init: &[u8]| train_reference_ranks(init, &plan, Opt::Sgd);
    let stats = check_ranks(steps.len(), Opt::Sgd, env, reference);
    for (rank, s) in stats.iter().enumerate() {
        assert_eq!(s.len(), steps[rank], "rank {rank} trained its own steps");
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

/// Fences that complete out of launch order on rank 1 only: there the first fence of each
/// step (every third: a step has 3 buckets) completes 300 ms after its bucket was read, the
/// later ones at once. Its issuing thread still queues the buckets in launch order, as its
/// peers do: one that queued them as they became ready would meet its peers' first bucket
/// with its second (a mismatch here; on NCCL, a hang or unrelated gradients added together).
#[test]
fn processes_over_the_stand_in_with_late_fences_train_like_one_process() {
    let env = |rank: usize| match rank {
        1 => stand_in(&[("DDP_TEST_STAND_IN_FENCE", "slow:300:3")]),
        _ => stand_in(&[]),
    };
    let reference = |init: &[u8]| train_reference(init, 3, Opt::Adam);
    let stats = check_ranks(3, Opt::Adam, env, reference);
    // Every step has the 3 buckets the fault counts on, so the late fence is each step's first.
    for (rank, steps) in stats.iter().enumerate() {
        assert_eq!(steps.len(), STEPS, "rank {rank}: {steps:?}");
        assert!(steps.iter().all(|&(b, _)| b == 3), "rank {rank}: {steps:?}");
    }
}

/// The stand-in with a fault on rank 1 only.
fn stand_in_fault(world: usize, fault: &str, timeout_s: &str) -> Vec<ddp_tests::RankOutput> {
    stand_in_fault_env(world, ("DDP_TEST_STAND_IN_FENCE", fault), timeout_s)
}

/// The stand-in with the environment `fault` on rank 1 only.
fn stand_in_fault_env(
    world: usize,
    fault: (&str, &str),
    timeout_s: &str,
) -> Vec<ddp_tests::RankOutput> {
    let (_dir, _init, outputs) = run_world(world, Opt::Sgd, |rank| {
        let mut env = stand_in(&[("DDP_TIMEOUT_SECS", timeout_s)]);
        if rank == 1 {
            env.extend(pairs(&[fault]));
        }
        env
    });
    outputs
}

/// Every rank exited with its error (not killed at `run_world`'s 120 s deadline, far below the
/// 600 s timeout these runs set), and every rank's error contains `what`.
fn assert_every_rank_failed_saying(outputs: &[ddp_tests::RankOutput], what: &str) {
    for o in outputs {
        assert_eq!(
            o.code,
            Some(2),
            "rank {} exits with its error: {}",
            o.rank,
            o.stderr
        );
        assert!(
            o.stderr.contains(what),
            "rank {} says {what:?}: {}",
            o.rank,
            o.stderr
        );
    }
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
    assert_rank_1_killed_and_named_by_every_peer(&outputs, "");
}

/// Rank 1 was killed (no exit code) and every other rank exited with its error (2), naming
/// rank 1. `context` starts each message.
fn assert_rank_1_killed_and_named_by_every_peer(outputs: &[ddp_tests::RankOutput], context: &str) {
    assert_eq!(
        outputs[1].code, None,
        "{context}rank 1 was killed: {}",
        outputs[1].stderr
    );
    for o in outputs.iter().filter(|o| o.rank != 1) {
        assert_eq!(
            o.code,
            Some(2),
            "{context}rank {} exits with its error: {}",
            o.rank,
            o.stderr
        );
        assert!(
            o.stderr.contains("rank 1"),
            "{context}rank {} names rank 1: {}",
            o.rank,
            o.stderr
        );
    }
}

/// Rank 1 lays its buckets out differently (other caps): NCCL would add unrelated gradients
/// together or hang; here every rank fails before the first bucket, naming rank 1, and exits.
#[test]
fn stand_in_rank_with_another_bucket_layout_is_named_and_every_rank_exits() {
    let outputs = stand_in_fault_env(3, ("DDP_TEST_BUCKETS", "other"), "600");
    assert_every_rank_failed_saying(&outputs, "gradient bucket layouts differ");
    for o in &outputs {
        assert!(
            o.stderr.contains("rank(s) 1"),
            "rank {}: {}",
            o.rank,
            o.stderr
        );
        assert!(
            !o.stderr.contains("rank(s) 0"),
            "rank {}: {}",
            o.rank,
            o.stderr
        );
    }
}

/// Another thread of rank 1 aborts its stand-in communicator while buckets are in flight (the
/// peers wait in the bucket rank 1 has not issued yet): rank 1's bucket fails with the abort's
/// reason, every peer names rank 1, and every rank exits, long before the 600 s timeout.
#[test]
fn stand_in_communicator_aborted_from_another_thread_is_named_and_every_rank_exits() {
    let outputs = stand_in_fault(3, "abort:1", "600");
    assert_every_rank_failed_saying(&outputs, "rank 1");
    assert!(
        outputs[1]
            .stderr
            .contains("DDP_TEST_STAND_IN_FENCE=abort:1"),
        "rank 1 says why its communicator failed: {}",
        outputs[1].stderr
    );
}

/// Rank 1's fence of its second bucket fails (a device that failed the bucket's kernels): its
/// issuing thread must not queue the buckets after it (on NCCL, rank 1's next bucket would
/// meet its peers' second: a hang or wrong sums) but abort the communicator, before its step
/// learns of the failure, so every peer quotes the issuing thread's reason. Rank 1 says its
/// fence failed, every peer names rank 1, no rank meets another's bucket (a mismatch), and
/// every rank exits, long before the 600 s timeout. (The issuing thread's own unit test shows
/// that it queues nothing more: here, which thread aborts first depends on timing.)
#[test]
fn stand_in_fence_that_fails_stops_the_issuing_thread_and_every_rank_exits() {
    let outputs = stand_in_fault(3, "fail:1", "600");
    assert_every_rank_failed_saying(&outputs, "rank 1");
    for o in outputs.iter().filter(|o| o.rank != 1) {
        assert!(
            o.stderr
                .contains("this rank's issuing thread queues no collective after it"),
            "rank {} quotes rank 1's issuing thread: {}",
            o.rank,
            o.stderr
        );
    }
    assert!(
        outputs[1]
            .stderr
            .contains("DDP_TEST_STAND_IN_FENCE=fail:1: this bucket's fence failed"),
        "rank 1 says its fence failed: {}",
        outputs[1].stderr
    );
    for o in &outputs {
        assert!(
            !o.stderr.contains("mismatch"),
            "rank {} met another rank's bucket: {}",
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
        let (_dir, _init, outputs) = run_world(3, Opt::Sgd, |rank| {
            let mut env = stand_in(&[("DDP_TIMEOUT_SECS", "600"), ("DDP_TEST_SHARDING", sharding)]);
            if rank == 1 {
                env.extend(pairs(&[("DDP_TEST_STAND_IN_FENCE", fault)]));
            }
            env
        });
        assert_rank_1_killed_and_named_by_every_peer(&outputs, &format!("{sharding}: "));
    }
}

/// A fence that never completes on rank 1 (a kernel that never ends) inside ZeRO stage 2's
/// collectives on the device path (its second staged buffer: the first reduce-scatter's
/// receive buffer) and FSDP's (its second: the first all-gather's, in forward; both waited for
/// on the calling thread), and FSDP's fifth (the first unit's reduce-scatter in backward,
/// waited for by the device engine's issuing thread). Rank 1's timeout (10 s) is well below
/// its peers' (60 s): after it, rank 1 names the collective whose kernels did not finish and
/// aborts the communicator, and its peers, still waiting in that collective, fail with rank
/// 1's reason instead of waiting out their own timeout; every rank exits. FSDP's errors name
/// FSDP's collectives, never ZeRO's or DDP's gradient buckets. (The fence wait used to have
/// no deadline: rank 1 waited forever, killed at `run_world`'s deadline.)
#[test]
fn stand_in_fence_that_never_completes_in_zero2_and_fsdp_is_named_and_every_rank_exits() {
    let cases = [
        (
            "zero2",
            "never:1",
            "has not finished the kernels that produce the buffers of its reduce_scatter",
        ),
        (
            "fsdp",
            "never:1",
            "has not finished the kernels that produce the buffers of its all_gather",
        ),
        (
            "fsdp",
            "never:4",
            "has not finished the kernels that produce FSDP unit",
        ),
    ];
    // Three independent worlds that each wait out rank 1's 10 s timeout: at once.
    let results: Vec<_> = std::thread::scope(|s| {
        let worlds: Vec<_> = cases
            .into_iter()
            .map(|(sharding, fault, stuck)| {
                s.spawn(move || {
                    let (_dir, _init, outputs) = run_world(3, Opt::Sgd, |rank| {
                        let timeout = if rank == 1 { "10" } else { "60" };
                        let mut env = stand_in(&[
                            ("DDP_TIMEOUT_SECS", timeout),
                            ("DDP_TEST_SHARDING", sharding),
                        ]);
                        if rank == 1 {
                            env.extend(pairs(&[("DDP_TEST_STAND_IN_FENCE", fault)]));
                        }
                        env
                    });
                    (sharding, fault, stuck, outputs)
                })
            })
            .collect();
        worlds
            .into_iter()
            .map(|w| w.join().expect("a world's thread panicked"))
            .collect()
    });
    for (sharding, fault, stuck, outputs) in results {
        assert_every_rank_failed_saying(&outputs, stuck);
        for o in &outputs {
            let context = format!("{sharding} {fault}: rank {}", o.rank);
            if o.rank != 1 {
                assert!(
                    o.stderr.contains("rank 1"),
                    "{context} names rank 1: {}",
                    o.stderr
                );
            }
            if sharding == "fsdp" {
                for other in ["ZeRO", "gradient bucket"] {
                    assert!(
                        !o.stderr.contains(other),
                        "{context} says {other:?}: {}",
                        o.stderr
                    );
                }
            }
        }
    }
}
