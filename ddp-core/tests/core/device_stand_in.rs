//! The device engine that drives NCCL, run on its CPU stand-in ([`Collectives::StandIn`]) with
//! ranks as threads: the same trainings as the host path, through the issuing thread, the
//! per-rank communication thread, the watchdog and abort. The process tests (`ddp-tests`) run it
//! at worlds 2-8 with injected faults.

use crate::common::*;
use crate::ddp_equivalence::{Opt, check_no_sync, check_unused_parameter, check_with};
use crate::ddp_join_hooks::check_uneven_with;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::SgdConfig;
use ddp_core::{Collectives, DdpConfig, DistributedDataParallel};

fn stand_in() -> DdpConfig {
    DdpConfig::new().with_collectives(Collectives::StandIn)
}

/// Buckets of a few parameters each, so a step has several collectives in flight.
fn small_buckets() -> DdpConfig {
    stand_in()
        .with_bucket_cap_mb(0.0005)
        .with_first_bucket_cap_mb(0.0001)
}

#[test]
fn stand_in_with_sgd_and_adam_equals_one_process_with_n_times_the_batch() {
    for world in [2, 3, 4] {
        check_with(world, Opt::Sgd, &stand_in());
        check_with(world, Opt::Adam, &small_buckets());
    }
}

#[test]
fn stand_in_with_automatic_overlap_off_equals_one_process() {
    let off = small_buckets().with_automatic_overlap(false);
    for world in [2, 3] {
        check_with(world, Opt::Adam, &off);
    }
}

#[test]
fn stand_in_at_world_one_equals_plain_training() {
    check_with(1, Opt::Sgd, &small_buckets());
}

#[test]
fn stand_in_no_sync_unused_parameters_and_join_train_as_on_the_host() {
    check_no_sync(&small_buckets());
    check_unused_parameter(&small_buckets());
    check_uneven_with(&[3, 5, 7], 1, &small_buckets());
}

/// With automatic overlap (the default), buckets leave while backward runs at world 2 (counted
/// per step by `last_step_stats`), as the NCCL engine launches them on a GPU; and they travel
/// through the stand-in's own communicator, not the process group (as NCCL's do).
#[test]
fn stand_in_launches_buckets_during_backward() {
    let (stats, stand_in_bytes) = train_four_steps(small_buckets());
    for (rank, steps) in stats.iter().enumerate() {
        let (buckets, during) = *steps.last().unwrap();
        assert!(buckets >= 3, "rank {rank}: {buckets} buckets");
        assert!(
            during >= 1,
            "rank {rank}: no bucket left during backward: {steps:?}"
        );
    }
    let (_, host_bytes) = train_four_steps(DdpConfig::new());
    assert!(
        stand_in_bytes * 2 < host_bytes,
        "the process group carried {stand_in_bytes} bytes with the stand-in, {host_bytes} without"
    );
}

/// Per rank, (buckets, buckets launched during backward) of each of 4 steps; the bytes rank 0's
/// process group carried.
fn train_four_steps(config: DdpConfig) -> (Vec<Vec<(usize, usize)>>, u64) {
    let out = run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let model = Mlp::<B>::seeded(&device, 64, 3);
        let mut ddp = DistributedDataParallel::new(model, pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        let mut per_step = Vec::new();
        for step in 0..4 {
            let idx: Vec<usize> = (0..8).map(|i| 16 * step + 2 * i + rank).collect();
            let (x, y) = batch(&idx, &device);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            ddp.optimizer_step(&mut sgd, 0.1, grads);
            let s = ddp.last_step_stats().expect("stats of a synchronised step");
            per_step.push((s.buckets, s.buckets_launched_during_backward));
        }
        (per_step, ddp.process_group().payload_bytes())
    });
    let bytes = out[0].1;
    (out.into_iter().map(|(s, _)| s).collect(), bytes)
}

/// A rank whose DDP is dropped in the middle of a step (after its forward, before its
/// backward) shuts its communicator down: its peer's bucket fails at once, naming it, instead
/// of waiting for the timeout.
#[test]
fn stand_in_peer_dropped_mid_step_is_named() {
    let results = run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let model = Mlp::<B>::seeded(&device, 16, 3);
        let mut ddp = DistributedDataParallel::new(model, pg, small_buckets()).unwrap();
        let (x, y) = batch(&[rank, rank + 2], &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        if rank == 1 {
            drop(ddp);
            return None;
        }
        let started = std::time::Instant::now();
        let err = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .err()
            .map(|e| format!("{e:#}"));
        Some((err, started.elapsed()))
    });
    let (err, took) = results[0].clone().expect("rank 0's outcome");
    let err = err.expect("rank 0's backward must fail");
    assert!(err.contains("rank 1"), "rank 0 must name rank 1: {err}");
    // The default timeout is 10 minutes: the failure came from the shutdown, not the timeout.
    assert!(
        took < std::time::Duration::from_secs(300),
        "took {took:?}: {err}"
    );
}

#[test]
fn stand_in_refuses_a_comm_hook() {
    run_ranks(1, |pg| {
        let device = Default::default();
        let model = Mlp::<B>::seeded(&device, 8, 3);
        let mut ddp = DistributedDataParallel::new(model, pg, stand_in()).unwrap();
        let err = ddp
            .register_comm_hook(ddp_core::hooks::Fp16CompressHook)
            .err()
            .map(|e| e.to_string())
            .expect("a hook beside the stand-in is an error");
        assert!(err.contains("StandIn"), "{err}");
    });
}

/// Ranks whose buckets differ (other caps) would reduce unrelated elements in NCCL: with the
/// device engine they fail before any bucket, each naming the rank that differs.
#[test]
fn stand_in_ranks_with_other_bucket_layouts_fail_naming_the_rank() {
    let errors = run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let config = if rank == 0 {
            small_buckets()
        } else {
            stand_in()
        };
        let model = Mlp::<B>::seeded(&device, 64, 3);
        let mut ddp = DistributedDataParallel::new(model, pg, config).unwrap();
        let (x, y) = batch(&[rank, rank + 2], &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .err()
            .map(|e| e.to_string())
    });
    for (rank, e) in errors.iter().enumerate() {
        let e = e
            .as_ref()
            .unwrap_or_else(|| panic!("rank {rank} must fail"));
        assert!(
            e.contains("gradient bucket layouts differ") && e.contains("rank(s) 1"),
            "rank {rank}: {e}"
        );
    }
}

/// A rank whose DDP is dropped in the middle of a step, after its backward has launched
/// buckets: the user's `step_on` closure panics right after `loss.backward()`, and unwinding
/// drops the DDP value while its buckets are in flight. The drop returns (no hang on those
/// buckets, a few log lines rather than one per poll), and the peer's next bucket fails naming
/// rank 1, well before the process group's 60 s timeout.
#[test]
fn stand_in_ddp_dropped_mid_step_after_backward_started_is_named_and_nobody_hangs() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::time::{Duration, Instant};
    let results = run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let model = Mlp::<B>::seeded(&device, 64, 3);
        let ddp = DistributedDataParallel::new(model.clone(), pg, small_buckets()).unwrap();
        let step = move |m: &Mlp<B>, step: usize| {
            let (x, y) = batch(&[4 * step + rank, 4 * step + rank + 2], &device);
            let loss = MseLoss::new().forward(m.forward(x, false), y, Reduction::Mean);
            loss.backward()
        };
        let started = Instant::now();
        if rank == 1 {
            let (unwound, logs) = crate::checkpoint_common::capture_logs(|| {
                catch_unwind(AssertUnwindSafe(move || {
                    let mut ddp = ddp;
                    ddp.step_on(&model, |m| {
                        let _grads = step(m, 0);
                        panic!("the user's code fails after backward");
                    })
                }))
            });
            assert!(unwound.is_err(), "the panic reaches the caller");
            return (None, started.elapsed(), logs);
        }
        let mut ddp = ddp;
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        let mut model = model;
        // Rank 1's buckets of step 0 may all have been reduced before it panicked: a later
        // step must fail, and none may succeed after rank 1 is gone.
        let mut err = None;
        for s in 0..3 {
            match ddp.step_on(&model, |m| drop(step(m, s))) {
                Ok(((), grads)) => {
                    model = burn::optim::Optimizer::step(&mut sgd, 0.1, model, grads)
                }
                Err(e) => {
                    err = Some(format!("{e:#}"));
                    break;
                }
            }
        }
        (err, started.elapsed(), String::new())
    });
    let (err, took, _) = &results[0];
    let err = err.as_ref().expect("rank 0 must fail once rank 1 is gone");
    assert!(err.contains("rank 1"), "rank 0 must name rank 1: {err}");
    assert!(took < &Duration::from_secs(60), "took {took:?}: {err}");
    let (_, dropped_after, logs) = &results[1];
    assert!(
        dropped_after < &Duration::from_secs(60),
        "rank 1's drop took {dropped_after:?}: {logs}"
    );
    let noisy = logs
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .count();
    assert!(
        noisy <= 8,
        "{noisy} warnings and errors while dropping: {logs}"
    );
}
