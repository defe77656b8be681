//! Resuming on another world size: model and optimizer load as saved; the loader position is
//! translated by global sample count when exact (ddp-data), and refused otherwise.
use crate::checkpoint_common::*;
use crate::common::*;
use ddp_core::checkpoint::{CheckpointConfig, CheckpointError, FullCheckpointer, LoadOutcome};
use ddp_core::data::DataError;

fn epoch_order(world: usize, rank: usize, epoch: u64) -> Vec<usize> {
    let mut sampler = sampler_config(world, rank)
        .init(DATASET_LEN)
        .expect("sampler");
    sampler.set_epoch(epoch);
    sampler.indices().to_vec()
}

#[test]
fn two_ranks_mid_epoch_resume_on_one_rank_at_the_right_global_sample() {
    let init = init_bytes();
    let dir = tempfile::tempdir().expect("tempdir");
    // 2 ranks x 2 steps x 3 samples: 12 of epoch 0's 24 samples consumed.
    let first = run_ranks(2, |pg| {
        run(pg, &init, dir.path(), Start::Init, Stop::AtStep(2))
    });
    let saved = first[0]
        .saved
        .clone()
        .expect("saved")
        .sampler
        .expect("sampler state");
    assert_eq!((saved.epoch, saved.position, saved.num_replicas), (0, 6, 2));
    let consumed: Vec<usize> = (0..2)
        .flat_map(|r| epoch_order(2, r, 0)[..6].to_vec())
        .collect();

    let (resumed, remaining, params) = run_ranks(1, |pg| {
        let device = Default::default();
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let mut model = Mlp::<B>::new(&device, HIDDEN);
        let mut optim = burn::optim::AdamConfig::new().init::<B, Mlp<B>>();
        let LoadOutcome::Resumed(resumed) = ckpt
            .load_latest(&device, &mut model, &mut optim)
            .expect("load")
        else {
            panic!("expected a resume");
        };
        let mut loader = loader(1, 0);
        resumed
            .restore_loader(&mut loader)
            .expect("2 -> 1 translates exactly");
        let state = loader.state();
        assert_eq!(
            (state.epoch, state.position),
            (0, 12),
            "position = 12 global samples / 1 rank"
        );
        let remaining: Vec<usize> = loader.iter().flat_map(|b| b.expect("batch")).collect();
        (resumed, remaining, flat_params(&model))
    })
    .remove(0);
    assert!(resumed.info.world_size_changed());
    assert_eq!(
        (resumed.info.saved_world_size, resumed.info.world_size),
        (2, 1)
    );
    assert!(
        bitwise_eq(&params, &first[0].params),
        "the model is the one saved by 2 ranks"
    );
    assert_eq!(
        remaining,
        epoch_order(1, 0, 0)[12..].to_vec(),
        "continues at global sample 12 of the epoch order"
    );
    let mut all: Vec<usize> = consumed.into_iter().chain(remaining).collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..DATASET_LEN).collect::<Vec<_>>(),
        "every sample of the epoch exactly once"
    );

    // And training goes on from there on one rank: the rest of epoch 0 (12 samples = 4 steps
    // of 3) and all of epoch 1 (8 steps).
    let rest = run_ranks(1, |pg| {
        run(pg, &init, dir.path(), Start::Resume, Stop::Never)
    })
    .remove(0);
    assert_eq!(rest.steps, 4 + 8);
}

#[test]
fn an_epoch_boundary_translates_to_any_world_size() {
    let init = init_bytes();
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| {
        run(pg, &init, dir.path(), Start::Init, Stop::AfterEpoch(0))
    });
    let rest = run_ranks(1, |pg| {
        run(pg, &init, dir.path(), Start::Resume, Stop::Never)
    })
    .remove(0);
    assert_eq!(
        rest.steps, 8,
        "one rank trains all of epoch 1 (24 samples, batch 3)"
    );
}

#[test]
fn an_inexact_translation_is_refused_with_ddp_datas_error() {
    let init = init_bytes();
    let dir = tempfile::tempdir().expect("tempdir");
    // 1 rank, 1 step of 3 samples: 3 global samples cannot be split between 2 ranks.
    run_ranks(1, |pg| {
        run(pg, &init, dir.path(), Start::Init, Stop::AtStep(1))
    });
    let errors = run_ranks(2, |pg| {
        let device = Default::default();
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        let mut model = Mlp::<B>::new(&device, HIDDEN);
        let mut optim = burn::optim::AdamConfig::new().init::<B, Mlp<B>>();
        let resumed = ckpt
            .load_latest(&device, &mut model, &mut optim)
            .expect("model and optimizer load on any world size")
            .into_resumed()
            .expect("resumed");
        let mut loader = loader(2, pg.rank());
        resumed
            .restore_loader(&mut loader)
            .expect_err("3 global samples on 2 ranks")
    });
    for e in errors {
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                CheckpointError::Sampler {
                    source: DataError::WorldSizeChange {
                        saved: 1,
                        current: 2,
                        global_consumed: 3,
                        ..
                    },
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("step-0000000001")
                && msg.contains("world size 1")
                && msg.contains("world size 2"),
            "{msg}"
        );
    }
}

#[test]
fn resharded_restore_continues_an_inexact_move_with_every_sample_once() {
    let init = init_bytes();
    let dir = tempfile::tempdir().expect("tempdir");
    // 1 rank, 1 step of 3 samples: 3 global samples, which `restore_loader` refuses to split
    // between 2 ranks; resharded, the other 21 samples of epoch 0 are dealt over both.
    run_ranks(1, |pg| {
        run(pg, &init, dir.path(), Start::Init, Stop::AtStep(1))
    });
    let consumed = epoch_order(1, 0, 0)[..3].to_vec();
    let per_rank = run_ranks(2, |pg| {
        let device = Default::default();
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        let mut model = Mlp::<B>::new(&device, HIDDEN);
        let mut optim = burn::optim::AdamConfig::new().init::<B, Mlp<B>>();
        let resumed = ckpt
            .load_latest(&device, &mut model, &mut optim)
            .expect("load")
            .into_resumed()
            .expect("resumed");
        let mut loader = loader(2, pg.rank());
        resumed
            .restore_loader_resharded(&mut loader)
            .expect("any world size");
        let rest: Vec<usize> = loader.iter().flat_map(|b| b.expect("batch")).collect();
        // The next epoch is a fresh 2-rank epoch.
        loader.set_epoch(1);
        let next: Vec<usize> = loader.iter().flat_map(|b| b.expect("batch")).collect();
        (rest, next)
    });
    let mut seen = consumed;
    for (rest, _) in &per_rank {
        seen.extend(rest);
    }
    seen.sort_unstable();
    // 21 left over 2 ranks: 11 each, one padding repeat.
    assert_eq!(seen.len(), DATASET_LEN + 1, "{seen:?}");
    seen.dedup();
    assert_eq!(
        seen,
        (0..DATASET_LEN).collect::<Vec<_>>(),
        "every sample of the epoch at least once"
    );
    for (rank, (_, next)) in per_rank.iter().enumerate() {
        assert_eq!(
            next,
            &epoch_order(2, rank, 1),
            "rank {rank}: epoch 1 as a fresh loader"
        );
    }
}
