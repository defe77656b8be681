//! The project's central test: N ranks with batch b each train exactly like one process with
//! batch N*b, and all replicas stay bitwise identical after every step.
use crate::common::*;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use ddp_core::{DdpConfig, DistributedDataParallel};

const STEPS: usize = 5;
const PER_RANK: usize = 4;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Opt {
    Sgd,
    Adam,
}

fn init_bytes() -> Vec<u8> {
    let device = Default::default();
    let m = Mlp::<B>::seeded(&device, 16, 7);
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&rec, m.into_record(), ()).unwrap()
}

fn load(bytes: &[u8]) -> Mlp<B> {
    let device = Default::default();
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = Recorder::<B>::load(&rec, bytes.to_vec(), &device).unwrap();
    Mlp::<B>::new(&device, 16).load_record(record)
}

/// Global step `s` uses samples `s*N*b .. (s+1)*N*b`; rank `r` takes every N-th from `r`,
/// as DistributedSampler does without shuffling.
fn step_indices(step: usize, world: usize, rank: Option<usize>) -> Vec<usize> {
    let all: Vec<usize> = (step * world * PER_RANK..(step + 1) * world * PER_RANK).collect();
    match rank {
        None => all,
        Some(r) => all.into_iter().skip(r).step_by(world).collect(),
    }
}

fn train_reference(init: &[u8], world: usize, opt: Opt) -> Vec<f32> {
    let device = Default::default();
    let mut model = load(init);
    let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
    let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
    for step in 0..STEPS {
        let (x, y) = batch(&step_indices(step, world, None), &device);
        let loss = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
        let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
        model = match opt {
            Opt::Sgd => sgd.step(0.1, model, grads),
            Opt::Adam => adam.step(0.01, model, grads),
        };
    }
    flat_params(&model)
}

/// Returns each rank's parameters after every step.
fn train_ddp(init: &[u8], world: usize, opt: Opt, config: &DdpConfig) -> Vec<Vec<Vec<f32>>> {
    run_ranks(world, |pg| {
        let device = Default::default();
        // Only rank 0 starts from the reference weights; the others start from their own random
        // weights and must be overwritten at construction.
        let model = if pg.rank() == 0 {
            load(init)
        } else {
            Mlp::<B>::new(&device, 16)
        };
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(model, pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        let mut history = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(&step_indices(step, world, Some(rank)), &device);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            let grads = ddp.backward(loss).unwrap();
            match opt {
                Opt::Sgd => ddp.optimizer_step(&mut sgd, 0.1, grads),
                Opt::Adam => ddp.optimizer_step(&mut adam, 0.01, grads),
            }
            history.push(flat_params(ddp.module()));
        }
        history
    })
}

fn check(world: usize, opt: Opt) {
    check_with(world, opt, &DdpConfig::new());
}

pub(crate) fn check_with(world: usize, opt: Opt, config: &DdpConfig) {
    let init = init_bytes();
    let reference = train_reference(&init, world, opt);
    let ranks = train_ddp(&init, world, opt, config);
    for (r, history) in ranks.iter().enumerate().skip(1) {
        for (step, params) in history.iter().enumerate() {
            assert!(
                params
                    .iter()
                    .zip(&ranks[0][step])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{opt:?} world {world}: rank {r} differs from rank 0 after step {step}"
            );
        }
    }
    let diff = max_scaled_diff(&ranks[0][STEPS - 1], &reference);
    assert!(
        diff < 1e-5,
        "{opt:?} world {world}: DDP differs from the single-process run by {diff}"
    );
}

#[test]
fn sgd_with_n_ranks_equals_one_process_with_n_times_the_batch() {
    for world in [2, 3, 4] {
        check(world, Opt::Sgd);
    }
}

#[test]
fn adam_with_n_ranks_equals_one_process_with_n_times_the_batch() {
    for world in [2, 3, 4] {
        check(world, Opt::Adam);
    }
}

/// The GPU path's host staging (one device-to-host copy per bucket), on the CPU backend: small
/// buckets so several parameters share one.
#[test]
fn staging_per_bucket_with_n_ranks_equals_one_process_with_n_times_the_batch() {
    let config = DdpConfig::new()
        .with_host_staging(ddp_core::HostStaging::PerBucket)
        .with_bucket_cap_mb(0.0005)
        .with_first_bucket_cap_mb(0.0001);
    for world in [1, 2, 3, 4] {
        check_with(world, Opt::Adam, &config);
    }
}

#[test]
fn world_of_one_equals_plain_training() {
    check(1, Opt::Sgd);
}

#[test]
fn no_sync_accumulation_equals_one_big_batch() {
    check_no_sync(&DdpConfig::new());
}

pub(crate) fn check_no_sync(config: &DdpConfig) {
    // k micro-batches of b (loss scaled by 1/k) accumulated with backward_no_sync, then one
    // synchronised backward == one step on k*b per rank.
    const K: usize = 3;
    let init = init_bytes();
    let world = 2;
    let big = run_ranks(world, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(load(&init), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        let idx: Vec<usize> = (0..K * PER_RANK).map(|i| i * world + rank).collect();
        let (x, y) = batch(&idx, &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        let grads = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        ddp.optimizer_step(&mut sgd, 0.1, grads);
        flat_params(ddp.module())
    });
    let micro = run_ranks(world, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(load(&init), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        let mut grads = None;
        for k in 0..K {
            let idx: Vec<usize> = (k * PER_RANK..(k + 1) * PER_RANK)
                .map(|i| i * world + rank)
                .collect();
            let (x, y) = batch(&idx, &device);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean) / K as f32;
            if k + 1 < K {
                ddp.backward_no_sync(loss).unwrap();
            } else {
                grads = Some(ddp.backward(loss).unwrap());
            }
        }
        ddp.optimizer_step(&mut sgd, 0.1, grads.unwrap());
        flat_params(ddp.module())
    });
    assert_eq!(micro[0], micro[1], "replicas identical");
    let diff = max_scaled_diff(&micro[0], &big[0]);
    assert!(diff < 1e-5, "accumulated != big batch: {diff}");
}

#[test]
fn parameter_unused_on_one_rank_counts_as_zero_there_and_nobody_hangs() {
    check_unused_parameter(&DdpConfig::new());
}

pub(crate) fn check_unused_parameter(config: &DdpConfig) {
    let init = init_bytes();
    let results = run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(load(&init), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        for step in 0..3 {
            let (x, y) = batch(&step_indices(step, 2, Some(rank)), &device);
            // Only rank 1 uses `extra`.
            let pred = ddp.forward(|m| m.forward(x, rank == 1)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            ddp.optimizer_step(&mut sgd, 0.1, grads);
        }
        flat_params(ddp.module())
    });
    assert_eq!(results[0], results[1], "replicas stay identical");
    let before = flat_params(&load(&init));
    assert_ne!(results[0], before, "training changed the weights");
}

#[test]
fn ranks_with_different_random_weights_are_equal_after_construction() {
    let results = run_ranks(3, |pg| {
        let device = Default::default();
        let model = Mlp::<B>::new(&device, 16);
        let mine = flat_params(&model);
        let ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        (mine, flat_params(ddp.module()))
    });
    assert_ne!(
        results[0].0, results[1].0,
        "the ranks really started different"
    );
    for r in 1..3 {
        assert_eq!(
            results[r].1, results[0].0,
            "rank {r} holds rank 0's weights"
        );
    }
}

#[test]
fn mismatched_models_fail_on_every_rank_naming_the_parameter() {
    let results = run_ranks(2, |pg| {
        let device = Default::default();
        let hidden = if pg.rank() == 0 { 16 } else { 8 };
        DistributedDataParallel::new(Mlp::<B>::new(&device, hidden), pg, DdpConfig::new())
            .err()
            .map(|e| e.to_string())
    });
    for (r, e) in results.iter().enumerate() {
        let e = e.as_ref().unwrap_or_else(|| panic!("rank {r} must fail"));
        assert!(e.contains("fc1.weight"), "rank {r}: {e}");
        assert!(
            e.contains("[6, 16]") && e.contains("[6, 8]"),
            "rank {r}: {e}"
        );
    }
    assert_eq!(results[0], results[1], "same message on every rank");
}

#[test]
fn forward_outside_ddp_is_reported_not_silently_zero() {
    let results = run_ranks(1, |pg| {
        let device = Default::default();
        let mut ddp =
            DistributedDataParallel::new(Mlp::<B>::new(&device, 4), pg, DdpConfig::new()).unwrap();
        let (x, y) = batch(&[0, 1], &device);
        let pred = ddp.module().forward(x, false); // bypasses the taps
        ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .err()
            .map(|e| e.to_string())
    });
    let e = results[0].as_ref().expect("must be an error");
    assert!(e.contains("ddp.forward"), "{e}");
}

/// A loss term computed from the wrapped module itself (an L2 penalty on `ddp.module()`'s
/// weight, a layer applied outside the forward closure) would get no gradient through DDP and
/// silently not train: it is an error naming the parameters, on every rank.
#[test]
fn a_loss_term_from_the_wrapped_module_itself_is_an_error_naming_it() {
    let results = run_ranks(2, |pg| {
        let device = Default::default();
        let mut ddp =
            DistributedDataParallel::new(Mlp::<B>::new(&device, 4), pg, DdpConfig::new()).unwrap();
        let (x, y) = batch(&[0, 1], &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        let penalty = ddp.module().fc1.weight.val().powf_scalar(2.0).sum();
        let loss = MseLoss::new().forward(pred, y, Reduction::Mean) + penalty.mul_scalar(1e-3);
        ddp.backward(loss).err()
    });
    for (rank, e) in results.iter().enumerate() {
        match e {
            Some(ddp_core::DdpError::UsedOutsideForward { params }) => {
                assert_eq!(params, &["fc1.weight"], "rank {rank}")
            }
            other => panic!("rank {rank}: expected UsedOutsideForward, got {other:?}"),
        }
    }
}
