//! ZeroRedundancyOptimizer: the same parameters as plain DDP with Adam, each rank holding about
//! `1/world` of Adam's state, and checkpoints that resume at another world size.
use crate::checkpoint_common::capture_logs;
use crate::common::*;
use burn::module::{Module, ParamId};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{Adam, AdamConfig, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use ddp_core::checkpoint::sharded::ShardedCheckpointer;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, LoadOutcome, TrainingState,
    checkpoint_name,
};
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    comm::ProcessGroup,
    zero::{ZeroError, ZeroRedundancyOptimizer},
};
use std::collections::BTreeSet;
use std::path::Path;

const LR: f64 = 0.01;

type MlpAdam = OptimizerAdaptor<Adam, Mlp<B>, B>;
type MlpZero = ZeroRedundancyOptimizer<MlpAdam, Mlp<B>, B>;

fn adam<M: burn::module::AutodiffModule<B>>() -> OptimizerAdaptor<Adam, M, B> {
    AdamConfig::new()
        .with_weight_decay(Some(WeightDecayConfig::new(1e-2)))
        .init()
}

/// Trains `ddp` over global steps `steps` with `optim`; `extra` is used on even steps only, so
/// some steps leave it without a gradient.
fn train<O: Optimizer<Mlp<B>, B>>(
    ddp: &mut DistributedDataParallel<B, Mlp<B>>,
    optim: &mut O,
    steps: std::ops::Range<usize>,
) {
    train_mlp(ddp, optim, LR, steps);
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn assert_replicas_identical(ranks: &[Vec<f32>], what: &str) {
    for (r, p) in ranks.iter().enumerate() {
        assert!(
            p.iter()
                .zip(&ranks[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: rank {r}'s parameters differ from rank 0's"
        );
    }
}

const STEPS: usize = 6;

#[test]
fn same_parameters_as_plain_ddp_with_adam_at_world_1_to_4() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    for world in 1..=4 {
        let plain = run_ranks(world, |pg| {
            let mut ddp =
                DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
            let mut optim: MlpAdam = adam();
            train(&mut ddp, &mut optim, 0..STEPS);
            flat_params(ddp.module())
        });
        let zero = run_ranks(world, |pg| {
            let mut ddp =
                DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
            let mut optim =
                ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone());
            train(&mut ddp, &mut optim, 0..STEPS);
            flat_params(ddp.module())
        });
        assert_replicas_identical(&zero, &format!("world {world}"));
        let diff = max_abs_diff(&zero[0], &plain[0]);
        eprintln!("world {world}: max |ZeRO - plain DDP| = {diff:e}");
        assert!(
            diff <= 1e-6,
            "world {world}: ZeRO differs from plain DDP + Adam by {diff}"
        );
        let moved = max_abs_diff(&zero[0], &flat_params(&mlp_from(&init)));
        assert!(
            moved > 1e-3,
            "world {world}: training moved nothing ({moved})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Memory: twelve equal layers, so a balanced partition is exact at world 1-4.

#[derive(Module, Debug)]
struct Deep<B: Backend> {
    layers: Vec<Linear<B>>,
    act: Relu,
}

impl<B: Backend> Deep<B> {
    fn new(device: &B::Device) -> Self {
        Deep {
            layers: (0..12)
                .map(|_| LinearConfig::new(16, 16).init(device))
                .collect(),
            act: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for layer in &self.layers {
            x = self.act.forward(layer.forward(x));
        }
        x
    }
}

/// Each rank's optimizer state after two steps: its serialised size and its parameter ids.
fn deep_state(world: usize, init: &[u8]) -> Vec<(usize, BTreeSet<u64>)> {
    run_ranks(world, |pg| {
        let device = Default::default();
        let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
        let record = Recorder::<B>::load(&rec, init.to_vec(), &device).expect("load");
        let model = Deep::<B>::new(&device).load_record(record);
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        let mut optim =
            ZeroRedundancyOptimizer::new(adam::<Deep<B>>(), ddp.process_group().clone());
        for step in 0..2 {
            let n = GLOBAL_BATCH / world;
            let xs: Vec<f32> = (0..n * 16)
                .map(|k| (((step * 31 + rank * 7 + k * 13) % 19) as f32 - 9.0) / 9.0)
                .collect();
            let x = Tensor::<B, 2>::from_data(TensorData::new(xs, [n, 16]), &device);
            let pred = ddp.forward(|m| m.forward(x)).unwrap();
            let loss = MseLoss::new().forward(pred.clone(), pred.ones_like(), Reduction::Mean);
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut optim, LR, grads);
        }
        let bytes = Recorder::<B>::record(&rec, optim.local_state(), ()).expect("record");
        assert_eq!(optim.local_state_bytes().unwrap(), bytes.len());
        let ids = optim.local_state().keys().map(ParamId::val).collect();
        (bytes.len(), ids)
    })
}

#[test]
fn each_rank_keeps_about_one_over_world_of_the_adam_state() {
    let init = record_bytes(&Deep::<B>::new(&Default::default()));
    let full = deep_state(1, &init).remove(0);
    assert_eq!(full.1.len(), 24, "world 1 holds every parameter's state");
    for world in 2..=4 {
        let ranks = deep_state(world, &init);
        let sizes: Vec<usize> = ranks.iter().map(|(b, _)| *b).collect();
        eprintln!(
            "world {world}: optimizer state bytes per rank {sizes:?} (world 1: {})",
            full.0
        );
        let mut seen = BTreeSet::new();
        for (r, (_, ids)) in ranks.iter().enumerate() {
            for id in ids {
                assert!(
                    seen.insert(*id),
                    "world {world}: rank {r} holds state another rank also holds"
                );
            }
        }
        assert_eq!(
            seen, full.1,
            "world {world}: the shards together are the whole state"
        );
        let bound = full.0 as f64 / world as f64 * 1.05;
        for (r, bytes) in sizes.iter().enumerate() {
            assert!(
                (*bytes as f64) <= bound,
                "world {world}: rank {r} holds {bytes} bytes of optimizer state, over 1.05 x {} / {world}",
                full.0
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: saved at world 2, resumed at world 1, 2 and 3.

const SAVE_AT: usize = 3;

/// Trains from `init` with ZeRO for `0..SAVE_AT` and saves; returns this rank's parameters.
fn train_and_save(pg: ProcessGroup, init: &[u8], dir: &Path) -> Vec<f32> {
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer");
    let mut ddp = DistributedDataParallel::new(mlp_from(init), pg, DdpConfig::new()).unwrap();
    let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone());
    train(&mut ddp, &mut optim, 0..SAVE_AT);
    let state = TrainingState::new(0, SAVE_AT as u64);
    optim
        .save_checkpoint(&ckpt, ddp.module(), &state)
        .expect("save");
    flat_params(ddp.module())
}

/// How a resumed run treats the optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    /// ZeRO, its state loaded from the checkpoint.
    Zero,
    /// Plain Adam, its state loaded from the checkpoint ZeRO wrote.
    Plain,
    /// ZeRO with a fresh state (a control: the state matters).
    ZeroWithoutState,
}

/// A fresh random model resumed from `dir` trains `SAVE_AT..STEPS`; returns its parameters and
/// the ids of the parameters whose state the ZeRO optimizer holds (empty for `Plain`).
fn resume(pg: ProcessGroup, dir: &Path, how: Resume) -> (Vec<f32>, BTreeSet<u64>) {
    let device = Default::default();
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer");
    let mut model = Mlp::<B>::new(&device, HIDDEN);
    let mut zero = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone());
    let mut plain: MlpAdam = adam();
    let outcome = match how {
        Resume::Plain => ckpt.load_latest(&device, &mut model, &mut plain),
        _ => ckpt.load_latest(&device, &mut model, &mut zero),
    }
    .expect("load_latest");
    let LoadOutcome::Resumed(resumed) = outcome else {
        panic!("expected a resume, got {outcome}");
    };
    assert_eq!(resumed.state.global_step, SAVE_AT as u64);
    let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
    let mut held = BTreeSet::new();
    match how {
        Resume::Zero => {
            train(&mut ddp, &mut zero, SAVE_AT..STEPS);
            held = zero.local_state().keys().map(ParamId::val).collect();
        }
        Resume::Plain => train(&mut ddp, &mut plain, SAVE_AT..STEPS),
        Resume::ZeroWithoutState => {
            let mut fresh =
                ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone());
            train(&mut ddp, &mut fresh, SAVE_AT..STEPS)
        }
    }
    (flat_params(ddp.module()), held)
}

/// Checks that the ranks' shards of the state are disjoint and hold all six tensors of the Mlp.
fn assert_sharded(ranks: &[(Vec<f32>, BTreeSet<u64>)], world: usize) {
    let mut seen = BTreeSet::new();
    for (r, (_, ids)) in ranks.iter().enumerate() {
        for id in ids {
            assert!(
                seen.insert(*id),
                "resumed at world {world}: rank {r} holds state another rank also holds"
            );
        }
    }
    assert_eq!(
        seen.len(),
        6,
        "resumed at world {world}: the shards together are the whole state"
    );
}

fn params_only(ranks: Vec<(Vec<f32>, BTreeSet<u64>)>) -> Vec<Vec<f32>> {
    ranks.into_iter().map(|(p, _)| p).collect()
}

#[test]
fn saved_at_world_2_resumes_at_world_1_2_and_3_like_an_uninterrupted_run() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, 31));
    let uninterrupted = run_ranks(2, |pg| {
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone());
        train(&mut ddp, &mut optim, 0..STEPS);
        flat_params(ddp.module())
    })
    .remove(0);
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| train_and_save(pg, &init, dir.path()));

    // Same world size: the same operations in the same order, so bitwise equal.
    let same = run_ranks(2, |pg| resume(pg, dir.path(), Resume::Zero));
    assert_sharded(&same, 2);
    let same = params_only(same);
    assert_replicas_identical(&same, "resumed at world 2");
    assert!(
        same[0]
            .iter()
            .zip(&uninterrupted)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "resumed at world 2: differs from the uninterrupted run by {}",
        max_abs_diff(&same[0], &uninterrupted)
    );
    // Other world sizes: the gradient average rounds differently.
    for (world, how) in [(3, Resume::Zero), (1, Resume::Zero), (1, Resume::Plain)] {
        let ranks = run_ranks(world, |pg| resume(pg, dir.path(), how));
        if how == Resume::Zero {
            assert_sharded(&ranks, world);
        }
        let ranks = params_only(ranks);
        assert_replicas_identical(&ranks, &format!("resumed at world {world}"));
        let diff = max_abs_diff(&ranks[0], &uninterrupted);
        eprintln!("resumed at world {world} ({how:?}): max |resumed - uninterrupted| = {diff:e}");
        assert!(
            diff <= 1e-6,
            "resumed at world {world} ({how:?}): differs from the uninterrupted run by {diff}"
        );
    }
    // Control: without the optimizer state the run ends elsewhere.
    let control = run_ranks(3, |pg| resume(pg, dir.path(), Resume::ZeroWithoutState))
        .remove(0)
        .0;
    let diff = max_abs_diff(&control, &uninterrupted);
    assert!(
        diff > 1e-4,
        "a fresh optimizer state changed nothing ({diff})"
    );
}

/// burn's `Optimizer::to_record` cannot fail, so a ZeRO shard handed to the plain save once
/// became a checkpoint of rank 0's shard alone, and a resume lost the other ranks' state.
#[test]
fn a_plain_checkpoint_save_of_a_sharded_state_fails_on_every_rank_and_writes_nothing() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).unwrap();
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone());
        train(&mut ddp, &mut optim, 0..1);
        let ((), right) = capture_logs(|| {
            optim
                .save_checkpoint(&ckpt, ddp.module(), &TrainingState::new(0, 1))
                .unwrap();
        });
        let wrong = ckpt
            .save(ddp.module(), &optim, &TrainingState::new(0, 2))
            .map(|saved| saved.name);
        // The refused save left the job able to go on: the right save still works after it.
        optim
            .save_checkpoint(&ckpt, ddp.module(), &TrainingState::new(0, 3))
            .unwrap();
        (right, wrong)
    });
    let (right, _) = &results[0];
    assert!(
        !right.contains("to_record without consolidate_state"),
        "{right}"
    );
    let wrong: Vec<_> = results.into_iter().map(|(_, wrong)| wrong).collect();
    assert_refused_on_every_rank(&wrong);
    assert_eq!(
        step_dirs(dir.path()),
        [checkpoint_name(1), checkpoint_name(3)],
        "the refused save at step 2 left something behind"
    );
}

/// A plain `FullCheckpointer::save` of `optim` at step 2 (what the tests expect refused), then
/// `save_checkpoint` at step 3 (the right save, which gathers the whole state): the plain
/// save's outcome.
fn plain_save_then_save_checkpoint(
    ckpt: &FullCheckpointer,
    model: &Mlp<B>,
    optim: &mut MlpZero,
) -> Result<String, CheckpointError> {
    let plain = ckpt
        .save(model, optim, &TrainingState::new(0, 2))
        .map(|saved| saved.name);
    optim
        .save_checkpoint(ckpt, model, &TrainingState::new(0, 3))
        .expect("save_checkpoint after the refused save");
    plain
}

/// Every rank's plain save was refused with the variant itself, not only rank 0: a caller that
/// matches on it to fall back to `save_checkpoint` (a collective) must do so on every rank,
/// or rank 0 waits alone in it.
fn assert_refused_on_every_rank(results: &[Result<String, CheckpointError>]) {
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(e @ CheckpointError::PartialOptimizerState { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains("shard of this rank only")
                        && message.contains("save_checkpoint"),
                    "rank {rank}: {message}"
                );
            }
            other => panic!("rank {rank}: expected PartialOptimizerState, got {other:?}"),
        }
    }
}

/// The checkpoint directories in `dir`, sorted.
fn step_dirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    names
}

/// How many parameters have optimizer state in the full checkpoint `name` of `dir`.
fn state_entries(dir: &Path, name: &str) -> usize {
    run_ranks(1, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg).unwrap();
        let (mut model, mut plain): (Mlp<B>, MlpAdam) =
            (Mlp::new(&Default::default(), HIDDEN), adam());
        ckpt.load(name, &Default::default(), &mut model, &mut plain)
            .expect("load");
        plain.to_record().len()
    })
    .remove(0)
}

/// An in-process rewind: a full checkpoint loaded into a ZeRO optimizer that has stepped (so
/// knows its partition) left `to_record` giving this rank's entries of the loaded state,
/// unflagged, and the plain save wrote rank 0's shard as if it were the whole state.
#[test]
fn a_plain_save_after_a_full_load_into_a_stepped_zero_optimizer_fails_on_every_rank() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).unwrap();
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone());
        train(&mut ddp, &mut optim, 0..1);
        optim
            .save_checkpoint(&ckpt, ddp.module(), &TrainingState::new(0, 1))
            .expect("save_checkpoint");
        let mut model = ddp.module().clone();
        ckpt.load(
            &checkpoint_name(1),
            &Default::default(),
            &mut model,
            &mut optim,
        )
        .expect("load");
        plain_save_then_save_checkpoint(&ckpt, &model, &mut optim)
    });
    assert_refused_on_every_rank(&results);
    assert_eq!(
        step_dirs(dir.path()),
        [checkpoint_name(1), checkpoint_name(3)],
        "the refused save at step 2 left something behind"
    );
    assert_eq!(state_entries(dir.path(), &checkpoint_name(3)), 6);
}

/// A sharded checkpoint gives each rank only its own parameters' state: a plain save of it
/// before the next step wrote rank 0's part alone.
#[test]
fn a_plain_save_of_a_zero_state_loaded_from_a_sharded_checkpoint_fails_on_every_rank() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    let (sharded_dir, full_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let results = run_ranks(2, |pg| {
        let sharded =
            ShardedCheckpointer::new(CheckpointConfig::new(sharded_dir.path()), pg.clone())
                .unwrap();
        let full =
            FullCheckpointer::new(CheckpointConfig::new(full_dir.path()), pg.clone()).unwrap();
        let mut ddp =
            DistributedDataParallel::new(mlp_from(&init), pg.clone(), DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone());
        train(&mut ddp, &mut optim, 0..1);
        sharded
            .save_state(ddp.module(), &optim, &TrainingState::new(0, 1))
            .expect("save_state");
        let mut model = Mlp::<B>::new(&Default::default(), HIDDEN);
        let mut fresh = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg);
        sharded
            .load_latest_state(&Default::default(), &mut model, &mut fresh)
            .expect("load_latest_state");
        plain_save_then_save_checkpoint(&full, &model, &mut fresh)
    });
    assert_refused_on_every_rank(&results);
    assert_eq!(
        step_dirs(full_dir.path()),
        [checkpoint_name(3)],
        "the refused save at step 2 left something behind"
    );
    assert_eq!(state_entries(full_dir.path(), &checkpoint_name(3)), 6);
}

/// A full checkpoint loaded into a fresh ZeRO optimizer is held whole until the first step:
/// the plain save writes every parameter's state, and is not refused.
#[test]
fn a_plain_save_of_a_full_state_loaded_into_a_fresh_zero_optimizer_writes_the_whole_state() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).unwrap();
        let mut ddp =
            DistributedDataParallel::new(mlp_from(&init), pg.clone(), DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone());
        train(&mut ddp, &mut optim, 0..1);
        optim
            .save_checkpoint(&ckpt, ddp.module(), &TrainingState::new(0, 1))
            .expect("save_checkpoint");
        let mut model = Mlp::<B>::new(&Default::default(), HIDDEN);
        let mut fresh = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg);
        ckpt.load_latest(&Default::default(), &mut model, &mut fresh)
            .expect("load_latest");
        ckpt.save(&model, &fresh, &TrainingState::new(0, 2))
            .expect("a plain save of the whole loaded state");
    });
    assert_eq!(
        step_dirs(dir.path()),
        [checkpoint_name(1), checkpoint_name(2)]
    );
    assert_eq!(state_entries(dir.path(), &checkpoint_name(2)), 6);
}

/// A full checkpoint loaded into a fresh ZeRO optimizer, saved as a sharded checkpoint before
/// the first step (a run moving to sharded checkpoints): it was refused, each rank holding the
/// other ranks' entries of the whole state. Each rank now writes its part, and training on from
/// that sharded checkpoint is bitwise what training on from the full load is.
#[test]
fn a_sharded_save_of_a_full_state_loaded_into_a_fresh_zero_optimizer_resumes_exactly() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    let (full_dir, sharded_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let ranks = run_ranks(2, |pg| {
        let full =
            FullCheckpointer::new(CheckpointConfig::new(full_dir.path()), pg.clone()).unwrap();
        let sharded =
            ShardedCheckpointer::new(CheckpointConfig::new(sharded_dir.path()), pg.clone())
                .unwrap();
        let mut ddp =
            DistributedDataParallel::new(mlp_from(&init), pg.clone(), DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone());
        train(&mut ddp, &mut optim, 0..1);
        optim
            .save_checkpoint(&full, ddp.module(), &TrainingState::new(0, 1))
            .expect("save_checkpoint");

        // Trains steps 1..3 from a model and a fresh ZeRO optimizer that `load` filled.
        let train_on = |load: &dyn Fn(&mut Mlp<B>, &mut MlpZero)| {
            let mut model = Mlp::<B>::new(&Default::default(), HIDDEN);
            let mut optim = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone());
            load(&mut model, &mut optim);
            let mut ddp =
                DistributedDataParallel::new(model, pg.clone(), DdpConfig::new()).unwrap();
            train(&mut ddp, &mut optim, 1..3);
            flat_params(ddp.module())
        };
        let from_full = train_on(&|model, optim| {
            full.load_latest(&Default::default(), model, optim)
                .expect("load_latest");
        });
        let from_sharded = train_on(&|model, optim| {
            full.load_latest(&Default::default(), model, optim)
                .expect("load_latest");
            sharded
                .save_state(model, optim, &TrainingState::new(0, 1))
                .expect("a sharded save of the whole loaded state");
            let mut fresh_model = Mlp::<B>::new(&Default::default(), HIDDEN);
            let mut fresh = ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone());
            sharded
                .load_latest_state(&Default::default(), &mut fresh_model, &mut fresh)
                .expect("load_latest_state");
            (*model, *optim) = (fresh_model, fresh);
        });
        (from_full, from_sharded)
    });
    for (rank, (from_full, from_sharded)) in ranks.iter().enumerate() {
        assert!(
            from_full
                .iter()
                .zip(from_sharded)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {rank}: training on from the sharded checkpoint differs from the full load's"
        );
    }
}

/// The errors of rank 0's first two steps (`make`'s optimizer over `ddp`, from `init`) when rank
/// 1 aborts the group after backward, in place of its step.
pub(crate) fn steps_after_a_peer_fails(
    init: &[u8],
    make: impl Fn(&mut DistributedDataParallel<B, Mlp<B>>) -> MlpZero + Sync,
) -> (Option<ZeroError>, Option<ZeroError>) {
    let mut results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(mlp_from(init), pg, DdpConfig::new()).unwrap();
        let mut optim = make(&mut ddp);
        let (x, y) = batch(&contiguous_shard(0, 2, rank), &Default::default());
        let pred = ddp.forward(|m| m.forward(x, true)).unwrap();
        let grads = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        if rank == 1 {
            ddp.process_group().abort("rank 1 ran out of memory");
            return None;
        }
        let module = ddp.module().clone();
        let first = optim.try_step(LR, module.clone(), grads);
        let second = optim.try_step(LR, module, burn::optim::GradientsParams::new());
        Some((first.err(), second.err()))
    });
    let (first, second) = results.swap_remove(0).expect("rank 0's outcome");
    assert!(
        matches!(second, Some(ZeroError::Poisoned { .. })),
        "a step after a failure must be refused: {second:?}"
    );
    (first, second)
}

#[test]
fn a_peer_that_fails_mid_step_fails_the_step_with_its_reason_and_poisons_the_optimizer() {
    let init = record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN));
    let (first, _) = steps_after_a_peer_fails(&init, |ddp| {
        ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), ddp.process_group().clone())
    });
    match first {
        Some(e @ ZeroError::Broadcast { .. }) => assert!(
            e.to_string().contains("rank 1 ran out of memory"),
            "the error does not carry the peer's reason: {e}"
        ),
        other => panic!("expected a broadcast error, got {other:?}"),
    }
}

/// One parameter in two places: `b` is `a`.
#[derive(Module, Debug)]
struct Tied<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

/// A tied parameter would get two owners (each stepping it, and the consolidated state holding
/// it twice, which failed the first checkpoint save); it is refused at the first step, on
/// every rank, naming where it appears again.
#[test]
fn a_tied_parameter_is_refused_at_the_first_step_naming_it() {
    let errors = run_ranks(2, |pg| {
        let device = Default::default();
        let a = LinearConfig::new(4, 4).init::<B>(&device);
        let model = Tied { b: a.clone(), a };
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        let mut zero = ZeroRedundancyOptimizer::new(adam(), ddp.process_group().clone());
        let x = Tensor::<B, 2>::ones([2, 4], &device);
        let pred = ddp.forward(|m| m.b.forward(m.a.forward(x))).unwrap();
        let grads = ddp.backward(pred.sum()).unwrap();
        let first = zero.try_step(LR, ddp.module().clone(), grads);
        let later = zero.consolidate_state(ddp.module());
        (first.err(), later.err())
    });
    for (rank, (first, later)) in errors.into_iter().enumerate() {
        match first {
            Some(ZeroError::TiedParameter { path }) => assert_eq!(path, "b.weight"),
            other => panic!("rank {rank}: expected a tied-parameter error, got {other:?}"),
        }
        assert!(
            matches!(later, Some(ZeroError::Poisoned { .. })),
            "rank {rank}: {later:?}"
        );
    }
}
