//! Sharded checkpoints: written at world 4 (each rank its own shard), resumed at world 2, 3
//! and 4 with the exact saved state, and training goes on as an uninterrupted run; a missing
//! or altered shard is skipped for the previous checkpoint; a SIGKILL before the commit keeps
//! the previous checkpoint; a sharded checkpoint converts to a full one the rank-0
//! `FullCheckpointer` loads.
use crate::common::*;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, Optimizer};
use ddp_core::checkpoint::sharded::{
    SHARDED_CRASH_POINTS, SHARDED_MANIFEST_FILE, ShardedManifest, convert_to_full,
    model_shard_file, optimizer_shard_file,
};
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, INVALID_SUFFIX, InvalidReason,
    LATEST_FILE, LoadOutcome, TrainingState, checkpoint_name,
};
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    checkpoint::sharded::{ShardedCheckpointError, ShardedCheckpointer},
    zero::ZeroRedundancyOptimizer,
};
use std::path::Path;

const LR: f64 = 0.01;
/// Even, so the first step after a resume uses every parameter, as step 0 did: the fresh DDP
/// lays its buckets out as the uninterrupted run did, and sums in the same order.
const SAVE_AT: usize = 2;
const STEPS: usize = 6;
const SEED: u64 = 5;

type MlpAdam = OptimizerAdaptor<Adam, Mlp<B>, B>;
type Zero = ZeroRedundancyOptimizer<MlpAdam, Mlp<B>, B>;

fn adam() -> MlpAdam {
    AdamConfig::new().init()
}

/// Trains over global steps `steps`; `extra` is used on even steps only, so some steps leave
/// it without a gradient.
fn train<O: Optimizer<Mlp<B>, B>>(
    ddp: &mut DistributedDataParallel<B, Mlp<B>>,
    optim: &mut O,
    steps: std::ops::Range<usize>,
) {
    train_mlp(ddp, optim, LR, steps);
}

fn ddp(model: Mlp<B>, pg: &ddp_core::comm::ProcessGroup) -> DistributedDataParallel<B, Mlp<B>> {
    DistributedDataParallel::new(model, pg.clone(), DdpConfig::new()).expect("ddp")
}

/// A model whose values differ from the saved ones, so a load that leaves it alone shows.
fn other_model() -> Mlp<B> {
    Mlp::seeded(&Default::default(), HIDDEN, SEED + 100)
}

fn sharded(dir: &Path, pg: &ddp_core::comm::ProcessGroup) -> ShardedCheckpointer {
    ShardedCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("sharded checkpointer")
}

fn full(dir: &Path, pg: &ddp_core::comm::ProcessGroup) -> FullCheckpointer {
    FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer")
}

fn bitwise(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn assert_replicas_identical(ranks: &[Vec<f32>], what: &str) {
    for (r, p) in ranks.iter().enumerate() {
        assert!(
            bitwise(p, &ranks[0]),
            "{what}: rank {r} differs from rank 0"
        );
    }
}

fn manifest(dir: &Path, step: usize) -> ShardedManifest {
    let path = dir
        .join(checkpoint_name(step as u64))
        .join(SHARDED_MANIFEST_FILE);
    serde_json::from_slice(&std::fs::read(path).expect("manifest")).expect("parse manifest")
}

/// What a resumed run saw: the parameters right after the load, after training to `STEPS`,
/// and the world size the checkpoint was saved at.
struct Resume {
    loaded: Vec<f32>,
    trained: Vec<f32>,
    saved_world: usize,
}

fn resumed_outcome(outcome: LoadOutcome) -> (usize, u64) {
    match outcome {
        LoadOutcome::Resumed(r) => (r.info.saved_world_size, r.state.global_step),
        fresh => panic!("expected a resume, got {fresh}"),
    }
}

/// Where a resumed run takes its state from.
enum Source<'a> {
    /// The sharded checkpoint in this directory.
    Sharded(&'a Path),
    /// The rank-0 full checkpoint in this directory.
    Full(&'a Path),
    /// Rank 0's model and optimizer state in memory: the run continued with no checkpoint.
    Memory(&'a Mlp<B>, &'a <MlpAdam as Optimizer<Mlp<B>, B>>::Record),
}

/// Plain DDP + Adam at `world` from `source`, trained from `SAVE_AT` to `STEPS`.
fn resume_plain(world: usize, source: &Source) -> Vec<Resume> {
    run_ranks(world, |pg| {
        let device = Default::default();
        let (mut model, mut optim) = (other_model(), adam());
        let saved_world = match source {
            Source::Sharded(dir) => {
                let outcome = sharded(dir, &pg)
                    .load_latest(&device, &mut model, &mut optim)
                    .expect("load sharded");
                resumed_outcome(outcome)
            }
            Source::Full(dir) => {
                let outcome = full(dir, &pg)
                    .load_latest(&device, &mut model, &mut optim)
                    .expect("load full");
                resumed_outcome(outcome)
            }
            Source::Memory(m, record) => {
                model = (*m).clone();
                optim = optim.load_record((*record).clone());
                (4, SAVE_AT as u64)
            }
        };
        assert_eq!(saved_world.1, SAVE_AT as u64);
        let loaded = flat_params(&model);
        let mut ddp = ddp(model, &pg);
        train(&mut ddp, &mut optim, SAVE_AT..STEPS);
        Resume {
            loaded,
            trained: flat_params(ddp.module()),
            saved_world: saved_world.0,
        }
    })
}

#[test]
fn saved_at_world_4_resumes_at_2_3_and_4_as_an_uninterrupted_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full_dir = tempfile::tempdir().expect("tempdir");
    // The uninterrupted world-4 run saves at SAVE_AT, sharded and (for reference) rank-0 full.
    let reference = run_ranks(4, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim = adam();
        train(&mut ddp, &mut optim, 0..SAVE_AT);
        let state = TrainingState::new(0, SAVE_AT as u64);
        let saved = sharded(dir.path(), &pg)
            .save(ddp.module(), &optim, &state)
            .expect("sharded save");
        full(full_dir.path(), &pg)
            .save(ddp.module(), &optim, &state)
            .expect("full save");
        let at_save = flat_params(ddp.module());
        let memory = (ddp.module().clone(), optim.to_record());
        train(&mut ddp, &mut optim, SAVE_AT..STEPS);
        (saved, at_save, flat_params(ddp.module()), memory)
    });
    let (saved, at_save, uninterrupted, _) = reference[0].clone();
    let (memory_model, memory_record) = &reference[0].3;
    assert_replicas_identical(
        &reference.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
        "uninterrupted",
    );

    // Every rank wrote its own pair of files, each holding some of the model.
    let m = manifest(dir.path(), SAVE_AT);
    assert_eq!((m.world_size, m.shards.len()), (4, 4));
    for rank in 0..4 {
        let model = saved.path.join(model_shard_file(rank, 4));
        let optim = saved.path.join(optimizer_shard_file(rank, 4));
        assert!(model.is_file() && optim.is_file(), "rank {rank}'s shard");
        assert!(
            m.tensors.values().any(|t| t.rank == rank),
            "rank {rank} holds no tensor: {:?}",
            m.tensors
        );
    }
    assert_eq!(m.tensors.len(), 6, "3 linear layers, weight and bias");
    let sizes: Vec<(u64, u64)> = m
        .shards
        .iter()
        .map(|s| (s.model.size, s.optimizer.size))
        .collect();
    eprintln!("world 4 shard sizes (model, optimizer) bytes by rank: {sizes:?}");

    for world in [4, 2, 3] {
        let from_sharded = resume_plain(world, &Source::Sharded(dir.path()));
        let from_full = resume_plain(world, &Source::Full(full_dir.path()));
        let from_memory = resume_plain(world, &Source::Memory(memory_model, memory_record));
        for (rank, r) in from_sharded.iter().enumerate() {
            assert_eq!(r.saved_world, 4);
            assert!(
                bitwise(&r.loaded, &at_save),
                "world {world} rank {rank}: the loaded model is not the saved one"
            );
            // Bitwise at every world size: the same state, continued the same way.
            assert!(
                bitwise(&r.trained, &from_memory[rank].trained),
                "world {world} rank {rank}: resuming from shards differs from continuing in memory"
            );
            assert!(
                bitwise(&r.trained, &from_full[rank].trained),
                "world {world} rank {rank}: resuming from shards differs from resuming from the full checkpoint"
            );
        }
        let trained: Vec<Vec<f32>> = from_sharded.iter().map(|r| r.trained.clone()).collect();
        assert_replicas_identical(&trained, &format!("world {world}"));
        let diff = max_scaled_diff(&trained[0], &uninterrupted);
        eprintln!("resumed at world {world}: max scaled |resumed - uninterrupted at 4| = {diff:e}");
        if world == 4 {
            assert!(
                bitwise(&trained[0], &uninterrupted),
                "same world size: bitwise the uninterrupted run ({diff:e})"
            );
        } else {
            // Averaging the same global batch over 2 or 3 ranks instead of 4 may round
            // differently in the last bit (zero/mod.rs), so compare within a tolerance.
            assert!(diff <= 1e-6, "world {world}: {diff:e}");
        }
    }
}

#[test]
fn a_burn_optimizer_through_the_state_trait_is_the_replicated_save_and_load() {
    let (by_trait, by_save) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    run_ranks(2, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim = adam();
        train(&mut ddp, &mut optim, 0..SAVE_AT);
        let state = TrainingState::new(0, SAVE_AT as u64);
        sharded(by_trait.path(), &pg)
            .save_state(ddp.module(), &optim, &state)
            .expect("save_state");
        sharded(by_save.path(), &pg)
            .save(ddp.module(), &optim, &state)
            .expect("save");
    });
    let resume = |dir: &Path, through_trait: bool| {
        run_ranks(3, |pg| {
            let (mut model, mut optim) = (other_model(), adam());
            let ckpt = sharded(dir, &pg);
            let outcome = if through_trait {
                ckpt.load_latest_state(&Default::default(), &mut model, &mut optim)
            } else {
                ckpt.load_latest(&Default::default(), &mut model, &mut optim)
            };
            assert_eq!(resumed_outcome(outcome.expect("load")), (2, SAVE_AT as u64));
            // Replicated: every rank got every parameter's state back.
            let entries = optim.to_record().len();
            let mut ddp = ddp(model, &pg);
            train(&mut ddp, &mut optim, SAVE_AT..STEPS);
            (entries, flat_params(ddp.module()))
        })
    };
    let (a, b) = (resume(by_trait.path(), true), resume(by_save.path(), false));
    for (rank, ((entries_a, params_a), (entries_b, params_b))) in a.iter().zip(&b).enumerate() {
        assert_eq!((*entries_a, *entries_b), (6, 6), "rank {rank}");
        assert!(
            bitwise(params_a, params_b),
            "rank {rank}: the two paths differ"
        );
    }
}

#[test]
fn zero_shards_resume_at_2_and_3_with_each_rank_reading_only_its_own_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full_dir = tempfile::tempdir().expect("tempdir");
    let reference = run_ranks(4, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim: Zero = ZeroRedundancyOptimizer::new(adam(), pg.clone());
        train(&mut ddp, &mut optim, 0..SAVE_AT);
        let state = TrainingState::new(0, SAVE_AT as u64);
        sharded(dir.path(), &pg)
            .save_state(ddp.module(), &optim, &state)
            .expect("sharded save");
        optim
            .save_checkpoint(&full(full_dir.path(), &pg), ddp.module(), &state)
            .expect("full save");
        let at_save = flat_params(ddp.module());
        train(&mut ddp, &mut optim, SAVE_AT..STEPS);
        (at_save, flat_params(ddp.module()))
    });
    let (at_save, uninterrupted) = reference[0].clone();

    for world in [4, 2, 3] {
        let resume = |from_full: bool| {
            run_ranks(world, |pg| {
                let device = Default::default();
                let mut model = other_model();
                let mut optim: Zero = ZeroRedundancyOptimizer::new(adam(), pg.clone());
                let outcome = if from_full {
                    full(full_dir.path(), &pg)
                        .load_latest(&device, &mut model, &mut optim)
                        .expect("load full")
                } else {
                    sharded(dir.path(), &pg)
                        .load_latest_state(&device, &mut model, &mut optim)
                        .expect("load sharded")
                };
                assert_eq!(resumed_outcome(outcome), (4, SAVE_AT as u64));
                let entries = optim.local_state().len();
                let loaded = flat_params(&model);
                let mut ddp = ddp(model, &pg);
                train(&mut ddp, &mut optim, SAVE_AT..STEPS);
                (loaded, entries, flat_params(ddp.module()))
            })
        };
        let from_sharded = resume(false);
        let from_full = resume(true);
        // All 6 tensors had a gradient before the save; the ranks' loaded entries partition them.
        let entries: Vec<usize> = from_sharded.iter().map(|r| r.1).collect();
        assert_eq!(
            entries.iter().sum::<usize>(),
            6,
            "world {world}: {entries:?}"
        );
        assert!(
            entries.iter().all(|&n| n < 6),
            "world {world}: a rank loaded every parameter's state: {entries:?}"
        );
        for (rank, r) in from_sharded.iter().enumerate() {
            assert!(
                bitwise(&r.0, &at_save),
                "world {world} rank {rank}: loaded model"
            );
            assert!(
                bitwise(&r.2, &from_full[rank].2),
                "world {world} rank {rank}: ZeRO from shards differs from ZeRO from the full checkpoint"
            );
        }
        let diff = max_scaled_diff(&from_sharded[0].2, &uninterrupted);
        eprintln!(
            "ZeRO resumed at world {world}: max scaled diff to the uninterrupted run = {diff:e}"
        );
        if world == 4 {
            assert!(bitwise(&from_sharded[0].2, &uninterrupted), "{diff:e}");
        } else {
            assert!(diff <= 1e-6, "world {world}: {diff:e}");
        }
    }
}

/// Saves steps 1 and 2 at world 2; returns the parameters at step 1.
fn save_two_steps(dir: &Path) -> Vec<f32> {
    run_ranks(2, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim = adam();
        let ckpt = sharded(dir, &pg);
        train(&mut ddp, &mut optim, 0..1);
        ckpt.save(ddp.module(), &optim, &TrainingState::new(0, 1))
            .expect("save 1");
        let at_1 = flat_params(ddp.module());
        train(&mut ddp, &mut optim, 1..2);
        ckpt.save(ddp.module(), &optim, &TrainingState::new(0, 2))
            .expect("save 2");
        at_1
    })
    .remove(0)
}

/// Skipped checkpoints: name and reason.
type Skipped = Vec<(String, InvalidReason)>;

/// Loads the latest at world 2: (step, skipped checkpoints, parameters) per rank.
fn load_latest_at_2(dir: &Path) -> Vec<(u64, Skipped, Vec<f32>)> {
    run_ranks(2, |pg| {
        let (mut model, mut optim) = (other_model(), adam());
        let outcome = sharded(dir, &pg)
            .load_latest(&Default::default(), &mut model, &mut optim)
            .expect("load");
        let invalid = outcome
            .invalid()
            .iter()
            .map(|i| (i.name.clone(), i.reason.clone()))
            .collect();
        let resumed = outcome.into_resumed().expect("resumed");
        (resumed.state.global_step, invalid, flat_params(&model))
    })
}

#[test]
fn a_missing_or_altered_shard_is_a_clear_error_and_the_previous_checkpoint_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at_1 = save_two_steps(dir.path());
    let step2 = dir.path().join(checkpoint_name(2));
    let name2 = checkpoint_name(2);

    // Altered: one byte of rank 1's optimizer shard.
    let optim1 = step2.join(optimizer_shard_file(1, 2));
    let original = std::fs::read(&optim1).expect("read");
    let mut altered = original.clone();
    let last = altered.len() - 1;
    altered[last] ^= 0x55;
    std::fs::write(&optim1, &altered).expect("alter");
    for (step, invalid, params) in load_latest_at_2(dir.path()) {
        assert_eq!(step, 1, "falls back to the previous checkpoint");
        assert!(bitwise(&params, &at_1));
        assert!(
            matches!(&invalid[..], [(n, InvalidReason::HashMismatch { file, .. })]
                if *n == name2 && *file == optimizer_shard_file(1, 2)),
            "{invalid:?}"
        );
    }
    put_back_set_aside(dir.path(), &name2);
    let errors = run_ranks(2, |pg| {
        let (mut model, mut optim) = (other_model(), adam());
        sharded(dir.path(), &pg)
            .load(&name2, &Default::default(), &mut model, &mut optim)
            .expect_err("an altered shard")
            .to_string()
    });
    for e in &errors {
        assert!(
            e.contains(&name2) && e.contains(&optimizer_shard_file(1, 2)) && e.contains("sha256"),
            "{e}"
        );
    }

    // Missing: rank 0's model shard.
    std::fs::write(&optim1, &original).expect("restore");
    std::fs::remove_file(step2.join(model_shard_file(0, 2))).expect("remove");
    for (step, invalid, params) in load_latest_at_2(dir.path()) {
        assert_eq!(step, 1);
        assert!(bitwise(&params, &at_1));
        assert!(
            matches!(&invalid[..], [(n, InvalidReason::MissingFile { file })]
                if *n == name2 && *file == model_shard_file(0, 2)),
            "{invalid:?}"
        );
    }
    put_back_set_aside(dir.path(), &name2);
    let errors = run_ranks(2, |pg| {
        let (mut model, mut optim) = (other_model(), adam());
        sharded(dir.path(), &pg)
            .load(&name2, &Default::default(), &mut model, &mut optim)
            .expect_err("a missing shard")
    });
    for e in errors {
        let text = e.to_string();
        assert!(
            text.contains(&model_shard_file(0, 2)) && text.contains("missing"),
            "{text}"
        );
        assert!(
            matches!(
                e,
                ShardedCheckpointError::Checkpoint(
                    CheckpointError::Invalid { .. } | CheckpointError::Rank0Failed { .. }
                )
            ),
            "{text}"
        );
    }
}

/// The fallback load set checkpoint `name` aside as `<name>.invalid` (renamed, not deleted);
/// renames it back, the documented way to resume a repaired checkpoint.
fn put_back_set_aside(dir: &Path, name: &str) {
    let aside = dir.join(format!("{name}{INVALID_SUFFIX}"));
    assert!(aside.is_dir(), "{name} was not set aside at the load");
    assert!(!dir.join(name).exists());
    std::fs::rename(&aside, dir.join(name)).expect("rename back");
}

#[test]
fn an_invalid_checkpoint_skipped_at_load_is_set_aside_and_outlives_pruning() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_two_steps(dir.path());
    let name2 = checkpoint_name(2);
    std::fs::remove_file(dir.path().join(&name2).join(model_shard_file(1, 2))).expect("remove");
    run_ranks(2, |pg| {
        let (mut model, mut optim) = (other_model(), adam());
        let config = CheckpointConfig::new(dir.path()).with_keep_last(1);
        let ckpt = ShardedCheckpointer::new(config, pg.clone()).expect("new");
        let outcome = ckpt
            .load_latest(&Default::default(), &mut model, &mut optim)
            .expect("load");
        let mut ddp = ddp(model, &pg);
        let invalid = outcome.invalid().to_vec();
        assert_eq!(
            outcome.into_resumed().expect("resumed").state.global_step,
            1
        );
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        assert_eq!(
            invalid[0].set_aside.as_deref(),
            Some(format!("{name2}{INVALID_SUFFIX}").as_str())
        );
        // Saves past the invalid checkpoint's step, keeping one: it neither counts nor goes.
        for step in [3, 4] {
            train(&mut ddp, &mut optim, 0..1);
            ckpt.save(ddp.module(), &optim, &TrainingState::new(0, step))
                .expect("save");
        }
    });
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [format!("{name2}{INVALID_SUFFIX}"), checkpoint_name(4)],
        "the set-aside checkpoint survives keep_last(1)"
    );
}

/// Set in the child process of the crash test: the checkpoint directory it saves into.
const CHILD_DIR_ENV: &str = "DDP_SHARDED_CRASH_TEST_DIR";

/// The child of `a_sigkill_before_the_commit_keeps_the_previous_checkpoint`: saves step 2 at
/// world 2 into `CHILD_DIR_ENV`, where the crash point set in its environment kills it.
#[test]
#[ignore = "runs only as the child process of the sharded crash test"]
fn sharded_crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    run_ranks(2, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim = adam();
        train(&mut ddp, &mut optim, 0..2);
        sharded(Path::new(&dir), &pg)
            .save(ddp.module(), &optim, &TrainingState::new(0, 2))
            .expect("save 2");
    });
}

#[test]
fn a_sigkill_before_the_commit_keeps_the_previous_checkpoint() {
    for point in SHARDED_CRASH_POINTS {
        let dir = tempfile::tempdir().expect("tempdir");
        let at_1 = run_ranks(2, |pg| {
            let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
            let mut optim = adam();
            train(&mut ddp, &mut optim, 0..1);
            sharded(dir.path(), &pg)
                .save(ddp.module(), &optim, &TrainingState::new(0, 1))
                .expect("save 1");
            flat_params(ddp.module())
        })
        .remove(0);
        crate::checkpoint_common::run_child_killed_at(
            "checkpoint_sharded::sharded_crash_child",
            CHILD_DIR_ENV,
            dir.path(),
            point,
        );
        let committed = *point == "sharded-after-rename";
        let latest = std::fs::read_to_string(dir.path().join(LATEST_FILE)).expect("latest");
        assert_eq!(latest.trim(), checkpoint_name(1), "{point}: latest moved");
        let staging_left = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-"));
        assert_eq!(staging_left, !committed, "{point}: staging directory");

        let (step, params) = run_ranks(2, |pg| {
            let (mut model, mut optim) = (other_model(), adam());
            let outcome = sharded(dir.path(), &pg)
                .load_latest(&Default::default(), &mut model, &mut optim)
                .expect("load");
            (resumed_outcome(outcome).1, flat_params(&model))
        })
        .remove(0);
        let expected = if committed { 2 } else { 1 };
        assert_eq!(step, expected, "{point}");
        if !committed {
            assert!(bitwise(&params, &at_1), "{point}");
        }
        let leftovers = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .count();
        assert_eq!(leftovers, 0, "{point}: `new` removes the staging directory");
    }
}

#[test]
fn a_sharded_checkpoint_converts_to_a_full_one_the_checkpointer_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full_dir = tempfile::tempdir().expect("tempdir");
    let consolidated_dir = tempfile::tempdir().expect("tempdir");
    let at_save = run_ranks(4, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim: Zero = ZeroRedundancyOptimizer::new(adam(), pg.clone());
        train(&mut ddp, &mut optim, 0..SAVE_AT);
        sharded(dir.path(), &pg)
            .save_state(ddp.module(), &optim, &TrainingState::new(0, SAVE_AT as u64))
            .expect("sharded save");
        // The same state, gathered on rank 0 by ZeRO into a full checkpoint.
        optim
            .save_checkpoint(
                &full(consolidated_dir.path(), &pg),
                ddp.module(),
                &TrainingState::new(0, SAVE_AT as u64),
            )
            .expect("consolidated save");
        flat_params(ddp.module())
    })
    .remove(0);
    let name = checkpoint_name(SAVE_AT as u64);
    let converted = convert_to_full::<B, Mlp<B>, MlpAdam, _>(
        dir.path(),
        &name,
        full_dir.path(),
        &Default::default(),
    )
    .expect("convert");
    assert_eq!(
        (converted.name.as_str(), converted.global_step),
        (name.as_str(), SAVE_AT as u64)
    );

    // The rank-0 FullCheckpointer resumes from it at world 1, and training goes on exactly as from
    // the shards and as from ZeRO's own consolidated checkpoint.
    let from_full = resume_plain(1, &Source::Full(full_dir.path())).remove(0);
    let from_shards = resume_plain(1, &Source::Sharded(dir.path())).remove(0);
    let from_consolidated = resume_plain(1, &Source::Full(consolidated_dir.path())).remove(0);
    assert_eq!(from_full.saved_world, 4);
    assert!(bitwise(&from_full.loaded, &at_save), "the converted model");
    assert!(
        bitwise(&from_full.trained, &from_consolidated.trained),
        "the converted optimizer state differs from ZeRO's consolidated one"
    );
    assert!(
        bitwise(&from_full.trained, &from_shards.trained),
        "converted and sharded resumes differ"
    );

    let err = convert_to_full::<B, Mlp<B>, MlpAdam, _>(
        dir.path(),
        "../elsewhere",
        full_dir.path(),
        &Default::default(),
    )
    .expect_err("not a checkpoint name");
    assert!(err.to_string().contains("../elsewhere"), "{err}");

    // The target is a checkpoint directory like any other: a job using it holds its lock, and
    // `latest` never moves below a newer valid checkpoint there.
    let older = checkpoint_name(SAVE_AT as u64 - 1);
    copy_dir(&dir.path().join(&name), &dir.path().join(&older));
    let mut renamed = manifest(dir.path(), SAVE_AT - 1);
    renamed.name = older.clone();
    renamed.global_step -= 1;
    std::fs::write(
        dir.path().join(&older).join(SHARDED_MANIFEST_FILE),
        serde_json::to_vec_pretty(&renamed).expect("serialise"),
    )
    .expect("write manifest");
    let convert_older = || {
        convert_to_full::<B, Mlp<B>, MlpAdam, _>(
            dir.path(),
            &older,
            full_dir.path(),
            &Default::default(),
        )
    };
    match convert_older().expect_err("below the converted step") {
        ShardedCheckpointError::Checkpoint(CheckpointError::NewerCheckpointExists {
            newer,
            ..
        }) => assert_eq!(newer, name),
        other => panic!("expected NewerCheckpointExists, got {other}"),
    }
    run_ranks(1, |pg| {
        let _job = full(full_dir.path(), &pg);
        let err = convert_to_full::<B, Mlp<B>, MlpAdam, _>(
            dir.path(),
            &name,
            full_dir.path(),
            &Default::default(),
        )
        .expect_err("the directory is in use");
        assert!(
            err.to_string().contains("in use") || err.to_string().contains("lock"),
            "{err}"
        );
    });
}

/// Copies the files of directory `from` into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// A copy of step 2 under a newer name is not resumed as that step: its manifest names step 2.
/// It is skipped (set aside), step 2 loads, and `rewind_to` removes the checkpoints above a step.
#[test]
fn a_renamed_sharded_checkpoint_is_skipped_and_rewind_to_removes_newer_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    save_two_steps(dir.path());
    let fake = dir.path().join("step-0000099999");
    std::fs::create_dir(&fake).expect("mkdir");
    for entry in std::fs::read_dir(dir.path().join(checkpoint_name(2))).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), fake.join(entry.file_name())).expect("copy");
    }
    for (step, skipped, _) in load_latest_at_2(dir.path()) {
        assert_eq!(step, 2);
        assert!(
            matches!(skipped.as_slice(), [(name, InvalidReason::NameMismatch { .. })] if name == "step-0000099999"),
            "{skipped:?}"
        );
    }
    let removed = run_ranks(2, |pg| {
        sharded(dir.path(), &pg).rewind_to(1).expect("rewind")
    });
    for r in &removed {
        assert_eq!(
            r,
            &vec![checkpoint_name(2)],
            "rank 0's answer on every rank"
        );
    }
    for (step, skipped, _) in load_latest_at_2(dir.path()) {
        assert_eq!(step, 1, "{skipped:?}");
    }
}

/// Ranks whose checkpoint directories are not one shared directory (each its own here, as on
/// hosts without a shared filesystem): the save fails, and the rank that cannot see rank 0's
/// staging directory says why, instead of a bare "No such file or directory".
#[test]
fn a_save_without_a_shared_directory_says_the_ranks_must_share_it() {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let outcomes = run_ranks(2, |pg| {
        let ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        sharded(dirs[pg.rank()].path(), &pg)
            .save(ddp.module(), &adam(), &TrainingState::new(0, 1))
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let rank1 = outcomes[1]
        .as_ref()
        .expect_err("rank 1 cannot write its shard");
    assert!(
        rank1.contains("need a filesystem every rank shares"),
        "{rank1}"
    );
    assert!(
        outcomes[0].is_err(),
        "rank 0 committed a partial checkpoint"
    );
}

#[test]
fn a_sharded_save_whose_latest_cannot_be_written_says_it_committed_and_is_resumed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let latest = dir.path().join(LATEST_FILE);
    let errors = run_ranks(2, |pg| {
        let mut ddp = ddp(Mlp::seeded(&Default::default(), HIDDEN, SEED), &pg);
        let mut optim = adam();
        train(&mut ddp, &mut optim, 0..SAVE_AT);
        if pg.rank() == 0 {
            ddp_core::checkpoint::inject_write_error(&latest, libc::ENOSPC);
        }
        pg.barrier().expect("barrier");
        let saved = sharded(dir.path(), &pg).save(
            ddp.module(),
            &optim,
            &TrainingState::new(0, SAVE_AT as u64),
        );
        pg.barrier().expect("barrier");
        if pg.rank() == 0 {
            ddp_core::checkpoint::clear_write_error(&latest);
        }
        saved.expect_err("the latest write failed").to_string()
    });
    for (rank, message) in errors.iter().enumerate() {
        assert!(
            message.contains(&format!(
                "checkpoint {} is committed and is what a resume takes",
                checkpoint_name(SAVE_AT as u64)
            )),
            "rank {rank}: {message}"
        );
    }
    let resumed = run_ranks(2, |pg| {
        let (mut model, mut optim) = (other_model(), adam());
        let outcome = sharded(dir.path(), &pg)
            .load_latest(&Default::default(), &mut model, &mut optim)
            .expect("load");
        resumed_outcome(outcome)
    });
    assert_eq!(resumed, vec![(2, SAVE_AT as u64); 2]);
}
