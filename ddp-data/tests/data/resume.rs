//! Saving and restoring the loader's state mid-epoch, across epochs and
//! across world sizes.
use crate::common::{Collect, IndexDataset, collect_epoch, index_loader};
use ddp_data::{DataError, DistributedDataLoaderBuilder, DistributedSamplerConfig, SamplerState};

const EPOCHS: u64 = 3;

fn config(world: usize, rank: usize) -> DistributedSamplerConfig {
    DistributedSamplerConfig::new(world, rank).with_seed(11)
}

/// Every batch of epochs `0..EPOCHS`, run without interruption.
fn uninterrupted(
    len: usize,
    world: usize,
    rank: usize,
    batch: usize,
    workers: usize,
) -> Vec<Vec<usize>> {
    let mut loader = index_loader(len, config(world, rank), batch, workers);
    let mut batches = Vec::new();
    for epoch in 0..EPOCHS {
        loader.set_epoch(epoch);
        batches.extend(collect_epoch(&loader));
    }
    batches
}

/// Consumes `k` batches (counting across epochs), returns the state as JSON.
fn run_and_save(len: usize, world: usize, rank: usize, batch: usize, k: usize) -> String {
    let mut loader = index_loader(len, config(world, rank), batch, 2);
    let mut consumed = 0;
    for epoch in 0..EPOCHS {
        loader.set_epoch(epoch);
        if consumed == k {
            break;
        }
        for item in loader.iter() {
            item.expect("batch loads");
            consumed += 1;
            if consumed == k {
                break;
            }
        }
        if consumed == k {
            break;
        }
    }
    serde_json::to_string(&loader.state()).expect("state serializes")
}

/// Restores `json` and runs the usual loop from the saved epoch.
fn resume(
    json: &str,
    len: usize,
    world: usize,
    rank: usize,
    batch: usize,
    workers: usize,
) -> Vec<Vec<usize>> {
    let state: SamplerState = serde_json::from_str(json).expect("state deserializes");
    let mut loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(batch)
        .num_workers(workers)
        .resume_from(state.clone())
        .build(IndexDataset(len), config(world, rank))
        .expect("state loads");
    let mut batches = Vec::new();
    for epoch in state.epoch..EPOCHS {
        loader.set_epoch(epoch);
        batches.extend(collect_epoch(&loader));
    }
    batches
}

#[test]
fn resumed_loader_yields_exactly_the_remaining_batches_after_every_step() {
    let (len, world, batch) = (53, 2, 4); // 27 samples per rank: 7 batches per epoch
    for rank in 0..world {
        let full = uninterrupted(len, world, rank, batch, 0);
        assert_eq!(full.len(), 7 * EPOCHS as usize);
        for k in 0..full.len() {
            let json = run_and_save(len, world, rank, batch, k);
            let rest = resume(&json, len, world, rank, batch, 3);
            assert_eq!(rest, full[k..], "rank {rank}, resumed after {k} batches");
        }
    }
}

#[test]
fn state_saved_at_end_of_epoch_resumes_with_next_epoch() {
    let mut loader = index_loader(40, config(2, 1), 5, 2);
    loader.set_epoch(0);
    let epoch0 = collect_epoch(&loader);
    let state = loader.state();
    assert_eq!((state.epoch, state.position), (0, 20));
    assert!(state.is_epoch_complete());

    let json = serde_json::to_string(&state).unwrap();
    let rest = resume(&json, 40, 2, 1, 5, 0);
    let full = uninterrupted(40, 2, 1, 5, 0);
    assert_eq!(full[..epoch0.len()], epoch0);
    assert_eq!(rest, full[epoch0.len()..], "epoch 0 is not replayed");
}

/// With `drop_last`, the tail that no batch covers is part of the epoch all the same: a state
/// saved after the last batch is an epoch boundary, which resumes at any world size (here 3
/// ranks from 4: 896 samples consumed would not divide among 3 ranks mid-epoch).
#[test]
fn with_drop_last_a_state_saved_after_the_last_batch_is_an_epoch_boundary() {
    for workers in [0, 2] {
        let mut loader = DistributedDataLoaderBuilder::new(Collect)
            .batch_size(32)
            .drop_last(true)
            .num_workers(workers)
            .build(IndexDataset(1000), config(4, 0))
            .unwrap();
        loader.set_epoch(0);
        assert_eq!(collect_epoch(&loader).len(), 7); // 250 samples: 7 batches, 26 left out
        let state = loader.state();
        assert!(state.is_epoch_complete(), "{state:?} ({workers} workers)");
        for (world, rank) in [(3, 2), (1, 0), (4, 3)] {
            let mut resumed = DistributedDataLoaderBuilder::new(Collect)
                .batch_size(32)
                .drop_last(true)
                .num_workers(workers)
                .resume_from(state.clone())
                .build(IndexDataset(1000), config(world, rank))
                .unwrap_or_else(|e| panic!("resuming on {world} ranks: {e}"));
            assert_eq!(resumed.remaining(), 0, "epoch 0 is over on {world} ranks");
            resumed.set_epoch(1);
            assert_eq!(
                collect_epoch(&resumed),
                uninterrupted_drop_last(world, rank, 1),
                "epoch 1 on {world} ranks"
            );
        }
    }
}

/// Epoch `epoch` of `IndexDataset(1000)` in batches of 32 with `drop_last`.
fn uninterrupted_drop_last(world: usize, rank: usize, epoch: u64) -> Vec<Vec<usize>> {
    let mut loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(32)
        .drop_last(true)
        .build(IndexDataset(1000), config(world, rank))
        .unwrap();
    loader.set_epoch(epoch);
    collect_epoch(&loader)
}

#[test]
fn state_saved_right_after_set_epoch_resumes_at_the_start_of_that_epoch() {
    let mut loader = index_loader(40, config(2, 0), 5, 0);
    collect_epoch(&loader);
    loader.set_epoch(1);
    let state = loader.state();
    assert_eq!((state.epoch, state.position), (1, 0));
    let rest = resume(&serde_json::to_string(&state).unwrap(), 40, 2, 0, 5, 2);
    assert_eq!(rest, uninterrupted(40, 2, 0, 5, 0)[4..]);
}

#[test]
fn state_counts_only_batches_handed_out_not_prefetched() {
    let loader = DistributedDataLoaderBuilder::new(Collect)
        .batch_size(3)
        .num_workers(4)
        .prefetch(8)
        .build(IndexDataset(100), config(1, 0))
        .unwrap();
    let mut iter = loader.iter();
    iter.next().unwrap().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50)); // let workers run ahead
    assert_eq!(loader.state().position, 3);
    iter.next().unwrap().unwrap();
    assert_eq!(loader.state().position, 6);
}

#[test]
fn state_from_rank_zero_restores_every_rank() {
    let json = run_and_save(61, 3, 0, 4, 5);
    for rank in 0..3 {
        let rest = resume(&json, 61, 3, rank, 4, 1);
        assert_eq!(rest, uninterrupted(61, 3, rank, 4, 0)[5..], "rank {rank}");
    }
}

#[test]
fn only_the_first_iteration_after_a_restore_resumes() {
    let json = run_and_save(30, 1, 0, 4, 3);
    let state: SamplerState = serde_json::from_str(&json).unwrap();
    let mut loader = index_loader(30, config(1, 0), 4, 0);
    loader.load_state(&state).unwrap();
    assert_eq!(loader.remaining(), 5);
    assert_eq!(collect_epoch(&loader).len(), 5);
    // A second pass over the same epoch (e.g. evaluation) is a whole epoch.
    assert_eq!(loader.remaining(), 8);
    assert_eq!(collect_epoch(&loader).len(), 8);
}

/// The indices rank `rank` of `world` consumes from epoch position `from`.
fn rank_rest(len: usize, world: usize, rank: usize, from: usize) -> Vec<usize> {
    let mut sampler = config(world, rank).init(len).unwrap();
    sampler.set_position(from).unwrap();
    sampler.iter().collect()
}

#[test]
fn world_size_change_continues_exactly_by_global_sample_count() {
    let len = 50;
    // 4 ranks each consumed 3 batches of 2 = 24 global samples.
    let json = run_and_save(len, 4, 0, 2, 3);
    let saved: SamplerState = serde_json::from_str(&json).unwrap();
    assert_eq!(saved.global_consumed(), 24);

    let consumed: Vec<usize> = (0..4)
        .flat_map(|rank| rank_rest(len, 4, rank, 0).into_iter().take(6))
        .collect();
    let mut seen = consumed.clone();
    for new_rank in 0..2 {
        let mut loader = index_loader(len, config(2, new_rank), 5, 0);
        loader.load_state(&saved).unwrap();
        assert_eq!(
            loader.state().position,
            12,
            "24 global samples over 2 ranks"
        );
        let rest: Vec<usize> = collect_epoch(&loader).concat();
        assert_eq!(rest, rank_rest(len, 2, new_rank, 12));
        seen.extend(rest);
    }
    // Together: every index exactly once (50 splits evenly over 2 ranks).
    seen.sort_unstable();
    assert_eq!(seen, (0..len).collect::<Vec<_>>());
}

#[test]
fn world_size_change_that_cannot_be_exact_is_rejected_naming_both_sizes() {
    // 3 ranks x 1 sample = 3 global samples: not a multiple of 2.
    let json = run_and_save(50, 3, 0, 1, 1);
    let state: SamplerState = serde_json::from_str(&json).unwrap();
    let result = DistributedDataLoaderBuilder::new(Collect)
        .resume_from(state)
        .build(IndexDataset(50), config(2, 0));
    let err = result.unwrap_err();
    assert_eq!(
        err,
        DataError::WorldSizeChange {
            saved: 3,
            current: 2,
            epoch: 0,
            global_consumed: 3
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("world size 3") && message.contains("world size 2"),
        "{message}"
    );
}

#[test]
fn world_size_change_at_an_epoch_boundary_always_loads() {
    let json = run_and_save(50, 3, 0, 17, 1); // 17 per rank: epoch 0 complete
    let state: SamplerState = serde_json::from_str(&json).unwrap();
    assert!(state.is_epoch_complete());
    let rest = resume(&json, 50, 4, 2, 5, 0);
    // Epoch 0 done; epochs 1 and 2 in full on the new world size.
    assert_eq!(rest, uninterrupted(50, 4, 2, 5, 0)[3..]);
}

#[test]
fn state_of_another_dataset_is_rejected() {
    let json = run_and_save(50, 2, 0, 4, 2);
    let state: SamplerState = serde_json::from_str(&json).unwrap();
    let err = DistributedDataLoaderBuilder::new(Collect)
        .resume_from(state)
        .build(IndexDataset(51), config(2, 0))
        .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::StateMismatch {
                field: "dataset_len",
                ..
            }
        ),
        "{err}"
    );
}
