//! Exact resume: stopping (after an epoch, or mid-epoch), saving, and resuming into a fresh
//! model, a fresh Adam and a fresh shuffled loader ends bitwise equal to an uninterrupted run,
//! for world sizes 1 and 2 (ranks as threads).
use crate::checkpoint_common::*;
use crate::common::{mlp_from, run_ranks};

/// Final parameters of every rank after the uninterrupted run.
fn uninterrupted(world: usize, init: &[u8]) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(world, |pg| {
        run(pg, init, dir.path(), Start::Init, Stop::Never)
    })
    .into_iter()
    .map(|r| {
        assert_eq!(
            r.steps as u64,
            EPOCHS * steps_per_epoch(world),
            "the reference run trains every step"
        );
        r.params
    })
    .collect()
}

fn steps_per_epoch(world: usize) -> u64 {
    (DATASET_LEN / world).div_ceil(BATCH_PER_RANK) as u64
}

/// Trains until `stop`, saves, then resumes (in fresh ranks) with `start`; returns every
/// rank's final parameters.
fn interrupted(world: usize, init: &[u8], stop: Stop, start: Start) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = run_ranks(world, |pg| run(pg, init, dir.path(), Start::Init, stop));
    let saved = first[0]
        .saved
        .clone()
        .expect("the first run saved a checkpoint");
    let sampler = saved.sampler.clone().expect("sampler state saved");
    match stop {
        Stop::AtStep(_) => assert!(
            sampler.position > 0 && !sampler.is_epoch_complete(),
            "a mid-epoch stop must save a mid-epoch position: {sampler:?}"
        ),
        Stop::AfterEpoch(_) => assert!(sampler.is_epoch_complete(), "{sampler:?}"),
        Stop::Never => unreachable!(),
    }
    let second = run_ranks(world, |pg| run(pg, init, dir.path(), start, Stop::Never));
    let total = first[0].steps + second[0].steps;
    assert_eq!(
        total as u64,
        EPOCHS * steps_per_epoch(world),
        "{stop:?}: steps before + after the resume"
    );
    let resumed = second[0].resumed.as_ref().expect("resumed");
    assert_eq!(
        resumed.state, saved,
        "the resumed training state is the saved one"
    );
    assert!(resumed.invalid.is_empty());
    assert!(!resumed.info.world_size_changed());
    second.into_iter().map(|r| r.params).collect()
}

fn check(world: usize, stop: Stop) {
    let init = init_bytes();
    let reference = uninterrupted(world, &init);
    let resumed = interrupted(world, &init, stop, Start::Resume);
    for rank in 0..world {
        assert!(
            bitwise_eq(&reference[rank], &reference[0]),
            "world {world}: reference rank {rank} differs from rank 0"
        );
        assert!(
            bitwise_eq(&resumed[rank], &reference[0]),
            "world {world}, {stop:?}: rank {rank} after the resume is not bitwise equal to the uninterrupted run"
        );
    }
}

#[test]
fn resume_after_one_epoch_is_bitwise_exact_world_1() {
    check(1, Stop::AfterEpoch(0));
}

#[test]
fn resume_after_one_epoch_is_bitwise_exact_world_2() {
    check(2, Stop::AfterEpoch(0));
}

#[test]
fn resume_mid_epoch_is_bitwise_exact_world_1() {
    // 8 steps per epoch: stop in the middle of epoch 1 (after epoch 0's 8 and 3 more).
    check(1, Stop::AtStep(11));
    // And in the middle of the first epoch.
    check(1, Stop::AtStep(3));
}

#[test]
fn resume_mid_epoch_is_bitwise_exact_world_2() {
    // 4 steps per epoch: stop after 2 steps of epoch 0, and after 1 step of epoch 1.
    check(2, Stop::AtStep(2));
    check(2, Stop::AtStep(5));
}

/// The test would pass vacuously if optimizer or sampler state did not matter: show that
/// dropping either changes the result.
#[test]
fn optimizer_and_sampler_state_both_matter() {
    let init = init_bytes();
    let reference = uninterrupted(2, &init);
    let no_optim = interrupted(
        2,
        &init,
        Stop::AtStep(2),
        Start::ResumeWithoutOptimizerState,
    );
    assert!(
        !bitwise_eq(&no_optim[0], &reference[0]),
        "resuming with a fresh Adam should differ from the uninterrupted run"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| {
        run(pg, &init, dir.path(), Start::Init, Stop::AtStep(2))
    });
    let no_loader = run_ranks(2, |pg| {
        run(
            pg,
            &init,
            dir.path(),
            Start::ResumeWithoutLoaderState,
            Stop::Never,
        )
    });
    assert!(
        !bitwise_eq(&no_loader[0].params, &reference[0]),
        "resuming without the loader position should differ from the uninterrupted run"
    );
}

/// Without a shared filesystem every rank has its own checkpoint directory and only rank 0's is
/// written; a later run resumes on every rank, bitwise exactly, because rank 0 sends the
/// checkpoint to the ranks whose directory is empty.
#[test]
fn resume_with_a_directory_per_rank_is_bitwise_exact_world_2() {
    let world = 2;
    let init = init_bytes();
    let reference = uninterrupted(world, &init);
    let dirs: Vec<tempfile::TempDir> = (0..world)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let own_dir = |rank: usize| dirs[rank].path().join("checkpoints");
    run_ranks(world, |pg| {
        let dir = own_dir(pg.rank());
        run(pg, &init, &dir, Start::Init, Stop::AfterEpoch(0))
    });
    let written = |rank: usize| -> Vec<String> {
        match std::fs::read_dir(own_dir(rank)) {
            Ok(entries) => entries
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    };
    assert!(
        written(0).contains(&ddp_core::checkpoint::LATEST_FILE.to_string()),
        "rank 0 wrote its checkpoint: {:?}",
        written(0)
    );
    assert_eq!(
        written(1),
        Vec::<String>::new(),
        "rank 1's directory stays empty"
    );

    let second = run_ranks(world, |pg| {
        let dir = own_dir(pg.rank());
        run(pg, &init, &dir, Start::Resume, Stop::Never)
    });
    for (rank, r) in second.iter().enumerate() {
        let resumed = r.resumed.as_ref().expect("resumed");
        assert_eq!(resumed.state.epoch, 0, "rank {rank}");
        assert!(
            bitwise_eq(&r.params, &reference[0]),
            "rank {rank} resumed from rank 0's checkpoint is not bitwise equal to the uninterrupted run"
        );
    }
    assert_eq!(written(1), Vec::<String>::new(), "rank 1 never writes");
}

/// Checkpoint files are deterministic: two identical runs write the same `model.safetensors`
/// bytes, and so do repeated saves of one model (burn hands its metadata over in a `HashMap`,
/// whose order differs between maps: eight saves would almost surely show it).
#[test]
fn identical_runs_write_identical_model_bytes() {
    use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, MODEL_FILE, TrainingState};
    let init = init_bytes();
    let model_bytes = |dir: &std::path::Path| -> Vec<u8> {
        let ckpt =
            std::fs::read_to_string(dir.join(ddp_core::checkpoint::LATEST_FILE)).expect("latest");
        std::fs::read(dir.join(ckpt.trim()).join(MODEL_FILE)).expect("model file")
    };
    let train_once = || {
        let dir = tempfile::tempdir().expect("tempdir");
        run_ranks(2, |pg| {
            run(pg, &init, dir.path(), Start::Init, Stop::AfterEpoch(0))
        });
        model_bytes(dir.path())
    };
    let (a, b) = (train_once(), train_once());
    assert!(
        !a.is_empty() && a == b,
        "two identical runs wrote different model bytes"
    );

    let dirs: Vec<tempfile::TempDir> = (0..8)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    run_ranks(1, |pg| {
        let model = mlp_from(&init);
        for dir in &dirs {
            let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone())
                .expect("checkpointer");
            ckpt.save(&model, &adam(), &TrainingState::new(0, 1))
                .expect("save");
        }
    });
    let first = model_bytes(dirs[0].path());
    for (i, dir) in dirs.iter().enumerate() {
        assert!(
            model_bytes(dir.path()) == first,
            "save {i} of the same model wrote different bytes"
        );
    }
}

/// PowerSGD's state (step count, generator, per-rank error feedback, Q memory) in checkpoints
/// of both formats: a resume that restores it continues bit for bit, one that does not differs.
mod powersgd_state {
    use crate::common::{B, Mlp, batch, flat_params, run_ranks};
    use burn::nn::loss::{MseLoss, Reduction};
    use burn::optim::{Adam, AdamConfig, adaptor::OptimizerAdaptor};
    use ddp_core::checkpoint::sharded::ShardedCheckpointer;
    use ddp_core::checkpoint::{
        CheckpointConfig, FullCheckpointer, LoadOutcome, Resumed, TrainingState,
        comm_hook_state_file,
    };
    use ddp_core::hooks::{CommHookState, CommHookStateError, Fp16CompressHook, PowerSgdConfig};
    use ddp_core::{DdpError, DistributedDataParallel, comm::ProcessGroup};
    use std::path::Path;

    type Ddp = DistributedDataParallel<B, Mlp<B>>;
    type Optim = OptimizerAdaptor<Adam, Mlp<B>, B>;
    /// Registers a hook with a fresh wrapper.
    type Register = Box<dyn FnOnce(&mut Ddp)>;

    const HIDDEN: usize = 64;
    const BEFORE_SAVE: usize = 4;
    const AFTER_SAVE: usize = 3;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Format {
        Full,
        Sharded,
    }

    /// Compression from step 2 on, with warm start and error feedback (the defaults).
    fn powersgd(rank: usize) -> ddp_core::hooks::PowerSgdHook {
        PowerSgdConfig::new()
            .with_start_iter(2)
            .with_rank(rank)
            .init()
            .expect("hook")
    }

    fn wrapped(pg: ProcessGroup, model: Mlp<B>) -> Ddp {
        let mut ddp = Ddp::new(model, pg, ddp_core::DdpConfig::new()).expect("ddp");
        ddp.register_comm_hook(powersgd(1)).expect("register");
        ddp
    }

    /// Step `step` of rank `rank`: four samples of its own, so the ranks' errors differ.
    fn train_step(ddp: &mut Ddp, optim: &mut Optim, rank: usize, step: usize) {
        let idx: Vec<usize> = (0..4)
            .map(|i| ((rank * 97 + step * 13) * 4 + i) % 500)
            .collect();
        let (x, y) = batch(&idx, &Default::default());
        let loss = ddp
            .forward(|m| MseLoss::new().forward(m.forward(x, false), y, Reduction::Mean))
            .expect("forward");
        let grads = ddp.backward(loss).expect("backward");
        ddp.optimizer_step(optim, 0.01, grads);
    }

    fn save(ddp: &Ddp, optim: &Optim, pg: &ProcessGroup, dir: &Path, format: Format, hook: bool) {
        let hook_state = if hook {
            ddp.comm_hook_state().expect("hook state")
        } else {
            None
        };
        assert_eq!(hook_state.is_some(), hook, "PowerSGD keeps a state");
        let state = TrainingState::new(0, BEFORE_SAVE as u64).with_comm_hook_state(hook_state);
        let config = CheckpointConfig::new(dir);
        match format {
            Format::Full => {
                let ckpt = FullCheckpointer::new(config, pg.clone()).expect("checkpointer");
                ckpt.save(ddp.module(), optim, &state).expect("save");
            }
            Format::Sharded => {
                let ckpt = ShardedCheckpointer::new(config, pg.clone()).expect("checkpointer");
                ckpt.save(ddp.module(), optim, &state).expect("save");
            }
        }
    }

    /// Trains `BEFORE_SAVE` steps, saves (with the hook's state when `hook`), trains
    /// `AFTER_SAVE` more: every rank's parameters.
    fn uninterrupted(dir: &Path, format: Format, hook: bool) -> Vec<Vec<f32>> {
        let initial = Mlp::<B>::seeded(&Default::default(), HIDDEN, 5);
        run_ranks(2, |pg| {
            let rank = pg.rank();
            let mut ddp = wrapped(pg.clone(), initial.clone());
            let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
            for step in 0..BEFORE_SAVE {
                train_step(&mut ddp, &mut optim, rank, step);
            }
            save(&ddp, &optim, &pg, dir, format, hook);
            for step in BEFORE_SAVE..BEFORE_SAVE + AFTER_SAVE {
                train_step(&mut ddp, &mut optim, rank, step);
            }
            flat_params(ddp.module())
        })
    }

    /// A fresh model, optimizer and checkpointer of `world` ranks resuming from `dir`.
    fn load(pg: &ProcessGroup, dir: &Path, format: Format) -> (Mlp<B>, Optim, Resumed) {
        let device = Default::default();
        let mut model = Mlp::<B>::new(&device, HIDDEN);
        let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
        let config = CheckpointConfig::new(dir);
        let outcome = match format {
            Format::Full => FullCheckpointer::new(config, pg.clone())
                .expect("checkpointer")
                .load_latest(&device, &mut model, &mut optim)
                .expect("load"),
            Format::Sharded => ShardedCheckpointer::new(config, pg.clone())
                .expect("checkpointer")
                .load_latest(&device, &mut model, &mut optim)
                .expect("load"),
        };
        let LoadOutcome::Resumed(resumed) = outcome else {
            panic!("nothing to resume in {}", dir.display());
        };
        (model, optim, *resumed)
    }

    /// Resumes from `dir` in fresh ranks, restoring the hook's state when `restore`, and trains
    /// `AFTER_SAVE` steps: every rank's parameters.
    fn resumed(dir: &Path, format: Format, restore: bool) -> Vec<Vec<f32>> {
        run_ranks(2, |pg| {
            let rank = pg.rank();
            let (model, mut optim, resumed) = load(&pg, dir, format);
            let mut ddp = wrapped(pg, model);
            let state = resumed
                .state
                .comm_hook_state
                .expect("this rank's hook state");
            if restore {
                ddp.load_comm_hook_state(state).expect("restore");
            }
            for step in BEFORE_SAVE..BEFORE_SAVE + AFTER_SAVE {
                train_step(&mut ddp, &mut optim, rank, step);
            }
            flat_params(ddp.module())
        })
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn check_bitwise_resume(format: Format) {
        let dir = tempfile::tempdir().expect("tempdir");
        let reference = uninterrupted(dir.path(), format, true);
        let checkpoint = dir.path().join("step-0000000004");
        for rank in 0..2 {
            assert!(
                checkpoint.join(comm_hook_state_file(rank, 2)).is_file(),
                "{format:?}: rank {rank}'s hook state has a file of its own"
            );
        }
        let restored = resumed(dir.path(), format, true);
        let without = resumed(dir.path(), format, false);
        for rank in 0..2 {
            assert!(
                bits(&restored[rank]) == bits(&reference[rank]),
                "{format:?}: rank {rank} resumed with the hook's state is not bitwise the \
                 uninterrupted run"
            );
        }
        assert!(
            bits(&without[0]) != bits(&reference[0]),
            "{format:?}: resuming without the hook's state should differ (else this test \
             proves nothing)"
        );
    }

    #[test]
    fn powersgd_resume_is_bitwise_exact_with_its_state_full_checkpoint() {
        check_bitwise_resume(Format::Full);
    }

    #[test]
    fn powersgd_resume_is_bitwise_exact_with_its_state_sharded_checkpoint() {
        check_bitwise_resume(Format::Sharded);
    }

    /// A checkpoint saved without a hook state loads, and gives back none.
    #[test]
    fn a_checkpoint_without_hook_state_still_loads() {
        for format in [Format::Full, Format::Sharded] {
            let dir = tempfile::tempdir().expect("tempdir");
            uninterrupted(dir.path(), format, false);
            let states = run_ranks(2, |pg| load(&pg, dir.path(), format).2.state);
            for state in states {
                assert_eq!(state.comm_hook_state, None, "{format:?}");
                assert_eq!(state.global_step, BEFORE_SAVE as u64, "{format:?}");
            }
        }
    }

    /// The error feedback belongs to a rank: at another world size it does not come back.
    #[test]
    fn hook_states_are_dropped_at_another_world_size() {
        for format in [Format::Full, Format::Sharded] {
            let dir = tempfile::tempdir().expect("tempdir");
            uninterrupted(dir.path(), format, true);
            let states = run_ranks(1, |pg| load(&pg, dir.path(), format).2.state);
            assert_eq!(states[0].comm_hook_state, None, "{format:?}");
        }
    }

    /// A state goes only into the hook (and settings) that wrote it, with a named error.
    #[test]
    fn a_mismatched_hook_refuses_the_state_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        uninterrupted(dir.path(), Format::Full, true);
        let errors = run_ranks(2, |pg| {
            let (model, _, resumed) = load(&pg, dir.path(), Format::Full);
            let state = resumed.state.comm_hook_state.expect("hook state");
            let attempt = |hook: Option<Register>, state: CommHookState| {
                let mut ddp =
                    Ddp::new(model.clone(), pg.clone(), ddp_core::DdpConfig::new()).expect("ddp");
                if let Some(register) = hook {
                    register(&mut ddp);
                }
                match ddp.load_comm_hook_state(state) {
                    Err(DdpError::CommHookState(e)) => e,
                    other => panic!("expected a hook-state error, got {other:?}"),
                }
            };
            let other_rank: Register =
                Box::new(|ddp| ddp.register_comm_hook(powersgd(2)).expect("register"));
            let fp16: Register =
                Box::new(|ddp| ddp.register_comm_hook(Fp16CompressHook).expect("register"));
            let plain: Register =
                Box::new(|ddp| ddp.register_comm_hook(powersgd(1)).expect("register"));
            let plain_again: Register =
                Box::new(|ddp| ddp.register_comm_hook(powersgd(1)).expect("register"));
            let foreign = CommHookState::new("MyHook", 1, Vec::new());
            let newer = CommHookState::new(state.hook(), 99, state.payload().to_vec());
            vec![
                attempt(Some(other_rank), state.clone()),
                attempt(Some(fp16), state.clone()),
                attempt(None, state),
                attempt(Some(plain), foreign),
                attempt(Some(plain_again), newer),
            ]
        });
        for errors in errors {
            let [rank, stateless, no_hook, other, version] = errors.try_into().expect("five");
            assert!(
                matches!(&rank, CommHookStateError::ConfigMismatch { setting: "rank", saved, current, .. } if saved == "1" && current == "2"),
                "{rank}"
            );
            assert!(rank.to_string().contains("configure the hook"), "{rank}");
            assert!(
                matches!(&stateless, CommHookStateError::Stateless { found, .. } if found == "PowerSGD"),
                "{stateless}"
            );
            assert!(
                matches!(&no_hook, CommHookStateError::NoHookRegistered { .. }),
                "{no_hook}"
            );
            assert!(
                no_hook.to_string().contains("register_comm_hook"),
                "{no_hook}"
            );
            assert!(
                matches!(&other, CommHookStateError::OtherHook { found, hook } if found == "MyHook" && hook == "PowerSGD"),
                "{other}"
            );
            assert!(
                matches!(
                    &version,
                    CommHookStateError::UnsupportedVersion {
                        found: 99,
                        supported: 1,
                        ..
                    }
                ),
                "{version}"
            );
        }
    }
}
