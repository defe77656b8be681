//! Resuming mid-epoch on another world size with `SamplerState::resharded_for`:
//! the samples consumed before the switch (all old ranks) and after it (all new
//! ranks) cover the epoch exactly once, plus only the documented padding.
use std::collections::HashMap;

use burn::backend::Flex;
use burn::tensor::Tensor;
use ddp_data::{
    DataError, DistributedDataLoader, DistributedDataLoaderBuilder, DistributedSampler,
    DistributedSamplerConfig, SamplerState,
};
use proptest::prelude::*;

use crate::common::{IndexDataset, TensorBatcher};

/// The sampler settings shared by every world size of a run.
#[derive(Debug, Clone, Copy)]
struct Run {
    len: usize,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
    epoch: u64,
}

impl Run {
    fn config(&self, world: usize, rank: usize) -> DistributedSamplerConfig {
        DistributedSamplerConfig::new(world, rank)
            .with_seed(self.seed)
            .with_shuffle(self.shuffle)
            .with_drop_last(self.drop_last)
    }

    /// A fresh sampler of `rank` out of `world`, at `self.epoch`.
    fn fresh(&self, world: usize, rank: usize) -> DistributedSampler {
        let mut sampler = self.config(world, rank).init(self.len).expect("valid");
        sampler.set_epoch(self.epoch);
        sampler
    }

    /// Every rank of `world` restored from `state` (resharded for `world`).
    fn restored(&self, world: usize, state: &SamplerState) -> Vec<DistributedSampler> {
        let resharded = state.resharded_for(world).expect("reshards");
        (0..world)
            .map(|rank| {
                let mut sampler = self.config(world, rank).init(self.len).expect("valid");
                sampler
                    .load_state(&resharded)
                    .expect("resharded state loads");
                sampler
            })
            .collect()
    }
}

/// Through JSON, as a checkpoint stores it.
fn round_trip(state: &SamplerState) -> SamplerState {
    let json = serde_json::to_string(state).expect("serializes");
    serde_json::from_str(&json).expect("deserializes")
}

/// Each rank consumes `steps` samples; returns what they consumed in global
/// (interleaved) order and rank 0's state afterwards.
fn consume(ranks: &mut [DistributedSampler], steps: usize) -> (Vec<usize>, SamplerState) {
    let lists: Vec<Vec<usize>> = ranks
        .iter()
        .map(|s| s.iter().take(steps).collect())
        .collect();
    for sampler in ranks.iter_mut() {
        sampler.advance(steps).expect("within the epoch");
    }
    let states: Vec<SamplerState> = ranks.iter().map(DistributedSampler::state).collect();
    assert!(
        states.iter().all(|s| *s == states[0]),
        "every rank has the same state"
    );
    let interleaved = (0..steps * lists.len())
        .map(|g| lists[g % lists.len()][g / lists.len()])
        .collect();
    (interleaved, states[0].clone())
}

/// The rest of the epoch on every rank, interleaved; checks the ranks stay in
/// lockstep (equally many samples).
fn drain(ranks: &[DistributedSampler]) -> Vec<usize> {
    let lists: Vec<Vec<usize>> = ranks.iter().map(|s| s.iter().collect()).collect();
    let per_rank = lists[0].len();
    assert!(
        lists.iter().all(|l| l.len() == per_rank),
        "ranks must stay in lockstep: {:?}",
        lists.iter().map(Vec::len).collect::<Vec<_>>()
    );
    (0..per_rank * lists.len())
        .map(|g| lists[g % lists.len()][g / lists.len()])
        .collect()
}

/// Whether `state` is the end of its epoch for every world size: complete, and something was
/// consumed (a state with nothing consumed is the start, even where the saved world size has
/// no samples per rank and so also counts as complete).
fn at_epoch_end(state: &SamplerState) -> bool {
    state.is_epoch_complete() && state.global_consumed() > 0
}

/// Checks the documented guarantee for an epoch of `order` in which `seen`
/// (everything consumed, before and after any switches) was consumed and the
/// last switch went to `world` ranks after `consumed_before` samples.
fn check_epoch_coverage(
    order: &[usize],
    seen: &[usize],
    consumed_before: usize,
    world: usize,
    drop_last: bool,
) -> Result<(), TestCaseError> {
    let len = order.len();
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for &i in seen {
        *counts.entry(i).or_default() += 1;
    }
    let rest = len - consumed_before;
    if drop_last {
        // No duplicates; only the last `rest % world` entries are skipped.
        let skipped = rest % world;
        prop_assert!(counts.values().all(|&c| c == 1), "a sample seen twice");
        prop_assert_eq!(seen.len(), len - skipped);
        for &i in &order[len - skipped..] {
            prop_assert!(!counts.contains_key(&i), "{} should be dropped", i);
        }
    } else {
        // Every sample; the extras are the padding order[0], order[1], ...
        let padding = rest.div_ceil(world) * world - rest;
        prop_assert!(padding < world);
        prop_assert_eq!(seen.len(), len + padding);
        let mut expected: HashMap<usize, usize> = order.iter().map(|&i| (i, 1)).collect();
        for p in 0..padding {
            *expected.entry(order[p % len]).or_default() += 1;
        }
        prop_assert_eq!(counts, expected);
    }
    Ok(())
}

fn run_strategy() -> impl Strategy<Value = Run> {
    (
        1usize..120,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        0u64..50,
    )
        .prop_map(|(len, seed, shuffle, drop_last, epoch)| Run {
            len,
            seed,
            shuffle,
            drop_last,
            epoch,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// N ranks consume `steps` each, then M ranks finish the epoch from the
    /// resharded state: every sample exactly once plus only the documented
    /// padding; the next epoch is a fresh M-rank sampler's.
    #[test]
    fn switching_world_size_mid_epoch_covers_the_epoch_exactly_once(
        run in run_strategy(), old_world in 1usize..8, new_world in 1usize..8, step in 0usize..1000,
    ) {
        let mut old: Vec<DistributedSampler> = (0..old_world).map(|r| run.fresh(old_world, r)).collect();
        let steps = step % (old[0].num_samples() + 1);
        let order = old[0].epoch_order().to_vec();
        let (before, state) = consume(&mut old, steps);
        let state = round_trip(&state);

        let mut new = run.restored(new_world, &state);
        let after = drain(&new);
        if at_epoch_end(&state) {
            prop_assert!(after.is_empty(), "a complete epoch stays complete");
        } else {
            let consumed = steps * old_world;
            prop_assert_eq!(&before[..], &order[..consumed], "before: a prefix of the order");
            let rest = run.len - consumed;
            let per_rank = if run.drop_last { rest / new_world } else { rest.div_ceil(new_world) };
            prop_assert_eq!(new[0].remaining(), per_rank);
            // After: the order from `consumed` on, dealt round-robin, wrapping for padding.
            let expected: Vec<usize> = (0..per_rank * new_world)
                .map(|i| order[(consumed + i) % run.len])
                .collect();
            prop_assert_eq!(&after, &expected);
            let seen: Vec<usize> = before.iter().chain(&after).copied().collect();
            check_epoch_coverage(&order, &seen, consumed, new_world, run.drop_last)?;
        }

        // The next epoch: exactly a fresh world-M sampler's.
        for (rank, sampler) in new.iter_mut().enumerate() {
            sampler.set_epoch(run.epoch + 1);
            let fresh = Run { epoch: run.epoch + 1, ..run }.fresh(new_world, rank);
            prop_assert_eq!(sampler.indices(), fresh.indices());
            prop_assert_eq!(sampler.state(), fresh.state());
        }
    }

    /// Resharding twice in one epoch (N -> M -> K) still covers the epoch.
    #[test]
    fn resharding_twice_in_one_epoch_covers_the_epoch(
        run in run_strategy(), worlds in (1usize..7, 1usize..7, 1usize..7), steps in (0usize..1000, 0usize..1000),
    ) {
        let (first, second, third) = worlds;
        let mut ranks: Vec<DistributedSampler> = (0..first).map(|r| run.fresh(first, r)).collect();
        let order = ranks[0].epoch_order().to_vec();
        let k1 = steps.0 % (ranks[0].num_samples() + 1);
        let (mut seen, state) = consume(&mut ranks, k1);

        let mut ranks = run.restored(second, &round_trip(&state));
        let k2 = steps.1 % (ranks[0].remaining() + 1);
        let first_switch = state.global_consumed();
        let first_complete = at_epoch_end(&state);
        let (more, state) = consume(&mut ranks, k2);
        seen.extend(more);
        let state = round_trip(&state);
        if !at_epoch_end(&state) {
            prop_assert_eq!(&seen[..], &order[..state.global_consumed()]);
        }

        let ranks = run.restored(third, &state);
        let consumed = state.global_consumed();
        seen.extend(drain(&ranks));
        if !at_epoch_end(&state) {
            check_epoch_coverage(&order, &seen, consumed, third, run.drop_last)?;
        } else if !first_complete {
            // The second world size finished the epoch.
            check_epoch_coverage(&order, &seen, first_switch, second, run.drop_last)?;
        }
    }

    /// On the same world size, resharding is the identity and loading is
    /// unchanged.
    #[test]
    fn same_world_size_is_unchanged(
        run in run_strategy(), world in 1usize..8, step in 0usize..1000, rank in 0usize..8,
    ) {
        let rank = rank % world;
        let mut sampler = run.fresh(world, rank);
        let steps = step % (sampler.num_samples() + 1);
        sampler.advance(steps).expect("within the epoch");
        let state = sampler.state();
        prop_assert_eq!(state.offset, 0);
        prop_assert_eq!(state.resharded_for(world).expect("reshards"), state.clone());
        let mut plain = run.config(world, rank).init(run.len).expect("valid");
        plain.load_state(&state).expect("loads");
        prop_assert_eq!(plain.iter().collect::<Vec<_>>(), sampler.iter().collect::<Vec<_>>());
        prop_assert_eq!(plain.state(), state);
    }

    /// When the global count divides by the new world size, resharding is the
    /// exact translation `load_state` already does; otherwise `load_state`
    /// still refuses a state that was not resharded.
    #[test]
    fn resharding_agrees_with_the_exact_translation(
        run in run_strategy(), old_world in 1usize..8, new_world in 1usize..8, step in 0usize..1000,
    ) {
        let mut old = run.fresh(old_world, 0);
        let steps = step % (old.num_samples() + 1);
        old.advance(steps).expect("within the epoch");
        let state = old.state();
        for rank in 0..new_world {
            let mut exact = run.config(new_world, rank).init(run.len).expect("valid");
            match exact.load_state(&state) {
                Ok(()) => {
                    let resharded = state.resharded_for(new_world).expect("reshards");
                    // 0, except at the end of an epoch on ranks without samples: it then
                    // records the whole order as consumed, so that it stays the end.
                    let expected = if at_epoch_end(&state) && resharded.num_samples() == 0 { run.len } else { 0 };
                    prop_assert_eq!(resharded.offset, expected);
                    let mut via = run.config(new_world, rank).init(run.len).expect("valid");
                    via.load_state(&resharded).expect("loads");
                    prop_assert_eq!(via.state(), exact.state());
                    prop_assert_eq!(via.iter().collect::<Vec<_>>(), exact.iter().collect::<Vec<_>>());
                }
                Err(DataError::WorldSizeChange { global_consumed, .. }) => {
                    prop_assert!(global_consumed % new_world != 0);
                    prop_assert_ne!(state.resharded_for(new_world).expect("reshards").offset, 0);
                }
                Err(other) => prop_assert!(false, "unexpected error {}", other),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The loader, with real tensor batches.

type TensorLoader = DistributedDataLoader<Flex, usize, Tensor<Flex, 2>>;

const LEN: usize = 47;
const SEED: u64 = 2026;

fn loader_config(world: usize, rank: usize) -> DistributedSamplerConfig {
    DistributedSamplerConfig::new(world, rank).with_seed(SEED)
}

fn tensor_loader(
    world: usize,
    rank: usize,
    batch: usize,
    resume: Option<SamplerState>,
) -> TensorLoader {
    let mut builder = DistributedDataLoaderBuilder::new(TensorBatcher)
        .batch_size(batch)
        .num_workers(2);
    if let Some(state) = resume {
        builder = builder.resume_from(state);
    }
    builder
        .build(IndexDataset(LEN), loader_config(world, rank))
        .expect("loader builds")
}

/// The dataset indices of a `[batch, 3]` batch (column 0 holds the index).
fn batch_indices(batch: Tensor<Flex, 2>) -> Vec<usize> {
    let values: Vec<f32> = batch.into_data().to_vec().expect("f32 batch");
    values.chunks(3).map(|row| row[0] as usize).collect()
}

/// `batches` batches of every rank's loader, interleaved by sample as the
/// ranks consumed them, and each rank's batch count.
fn take_batches(loaders: &[TensorLoader], batches: Option<usize>) -> (Vec<usize>, Vec<usize>) {
    let lists: Vec<Vec<usize>> = loaders
        .iter()
        .map(|loader| {
            loader
                .iter()
                .take(batches.unwrap_or(usize::MAX))
                .flat_map(|b| batch_indices(b.expect("batch loads")))
                .collect()
        })
        .collect();
    let per_rank = lists[0].len();
    assert!(lists.iter().all(|l| l.len() == per_rank), "lockstep");
    let interleaved = (0..per_rank * lists.len())
        .map(|g| lists[g % lists.len()][g / lists.len()])
        .collect();
    (interleaved, lists.iter().map(Vec::len).collect())
}

/// Epoch 1 on `old` ranks for `steps` batches of `batch`, saved from rank 0,
/// then finished on `new` ranks from the resharded state; returns what was seen
/// in epoch 1, the epoch order, and the new loaders.
fn switch(
    old: usize,
    new: usize,
    batch: usize,
    steps: usize,
) -> (Vec<usize>, Vec<usize>, Vec<TensorLoader>) {
    let mut loaders: Vec<TensorLoader> = (0..old)
        .map(|r| tensor_loader(old, r, batch, None))
        .collect();
    for loader in &mut loaders {
        loader.set_epoch(0);
        take_batches(std::slice::from_ref(loader), None); // a whole epoch 0 first
        loader.set_epoch(1);
    }
    let (mut seen, _) = take_batches(&loaders, Some(steps));
    let json = serde_json::to_string(&loaders[0].state()).expect("serializes");
    let saved: SamplerState = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(saved.global_consumed(), old * steps * batch);

    // Without resharding the switch is refused, and the error says what to do.
    let refused = DistributedDataLoaderBuilder::new(TensorBatcher)
        .resume_from(saved.clone())
        .build(IndexDataset(LEN), loader_config(new, 0))
        .expect_err("not a multiple of the new world size");
    assert!(
        matches!(refused, DataError::WorldSizeChange { .. }),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains(&format!("resharded_for({new})")),
        "{refused}"
    );

    let resharded = saved.resharded_for(new).expect("reshards");
    let mut resumed: Vec<TensorLoader> = (0..new)
        .map(|r| tensor_loader(new, r, batch, Some(resharded.clone())))
        .collect();
    for loader in &mut resumed {
        loader.set_epoch(1); // the usual top of the loop keeps the restored position
    }
    let (rest, _) = take_batches(&resumed, None);
    seen.extend(rest);
    let order = loader_config(new, 0).init(LEN).map(|mut s| {
        s.set_epoch(1);
        s.epoch_order().to_vec()
    });
    (seen, order.expect("valid"), resumed)
}

fn assert_next_epoch_is_fresh(new: usize, batch: usize, mut resumed: Vec<TensorLoader>) {
    for (rank, loader) in resumed.iter_mut().enumerate() {
        loader.set_epoch(2);
        let mut fresh = tensor_loader(new, rank, batch, None);
        fresh.set_epoch(2);
        let (got, _) = take_batches(std::slice::from_ref(loader), None);
        let (want, _) = take_batches(std::slice::from_ref(&fresh), None);
        assert_eq!(got, want, "epoch 2 on rank {rank} of {new}");
        assert_eq!(loader.state(), fresh.state());
    }
}

#[test]
fn loader_three_ranks_to_two_mid_epoch() {
    // 3 ranks x 1 batch of 3 = 9 consumed: odd, so 2 ranks cannot continue
    // exactly by position. 38 left: 19 each, no padding.
    let (seen, order, resumed) = switch(3, 2, 3, 1);
    assert_eq!(seen.len(), LEN);
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..LEN).collect::<Vec<_>>(), "every sample once");
    assert_eq!(seen, order, "in the epoch order");
    assert_next_epoch_is_fresh(2, 3, resumed);
}

#[test]
fn loader_two_ranks_to_three_mid_epoch() {
    // 2 ranks x 2 batches of 4 = 16 consumed; 16 % 3 != 0. 31 left: 11 per
    // rank on 3 ranks, 33 dealt, so 2 padding entries repeat order[0], order[1].
    let (seen, order, resumed) = switch(2, 3, 4, 2);
    assert_eq!(seen.len(), LEN + 2);
    assert_eq!(
        seen[..LEN],
        order[..],
        "every sample once, in the epoch order"
    );
    assert_eq!(seen[LEN..], order[..2], "padding repeats the order's start");
    assert_next_epoch_is_fresh(3, 4, resumed);
}

// ---------------------------------------------------------------------------
// The stored format and corrupt states.

/// A state as written before `offset` existed.
const OLD_FORMAT: &str = r#"{"epoch":3,"position":5,"seed":11,"num_replicas":2,"dataset_len":40,"shuffle":true,"drop_last":false}"#;

#[test]
fn states_saved_before_the_offset_field_load_unchanged() {
    let state: SamplerState = serde_json::from_str(OLD_FORMAT).expect("old format loads");
    assert_eq!(state.offset, 0);
    assert_eq!(
        serde_json::to_string(&state).unwrap(),
        OLD_FORMAT.replace('}', r#","offset":0}"#),
        "a state is written as before, with its offset"
    );
    let mut sampler = DistributedSamplerConfig::new(2, 1)
        .with_seed(11)
        .init(40)
        .unwrap();
    sampler.load_state(&state).unwrap();
    assert_eq!(
        (sampler.epoch(), sampler.position(), sampler.offset()),
        (3, 5, 0)
    );
}

/// Formats without field names or lengths (bincode, postcard) read every field in order: a
/// field left out when 0 would leave the reader short, or shift what follows.
#[test]
fn states_round_trip_through_a_format_without_field_names() {
    let config = bincode::config::standard();
    let state: SamplerState = serde_json::from_str(OLD_FORMAT).unwrap();
    for s in [state.clone(), state.resharded_for(3).unwrap()] {
        let bytes = bincode::serde::encode_to_vec(&s, config).expect("serializes");
        let (back, _): (SamplerState, usize) =
            bincode::serde::decode_from_slice(&bytes, config).expect("deserializes");
        assert_eq!(back, s);
        // Inside a larger record, the next field is not read as the offset.
        let bytes = bincode::serde::encode_to_vec((s.clone(), 7u32), config).expect("serializes");
        let (back, _): ((SamplerState, u32), usize) =
            bincode::serde::decode_from_slice(&bytes, config).expect("deserializes");
        assert_eq!(back, (s, 7));
    }
}

#[test]
fn a_resharded_state_round_trips_with_its_offset() {
    let state: SamplerState = serde_json::from_str(OLD_FORMAT).unwrap();
    // 2 x 5 = 10 consumed; on 3 ranks: offset 1, position 3.
    let resharded = state.resharded_for(3).unwrap();
    assert_eq!(
        (resharded.offset, resharded.position, resharded.num_replicas),
        (1, 3, 3)
    );
    let json = serde_json::to_string(&resharded).unwrap();
    assert!(json.contains(r#""offset":1"#), "{json}");
    assert_eq!(round_trip(&resharded), resharded);
    assert_eq!(resharded.global_consumed(), 10);
}

#[test]
fn corrupt_offset_is_rejected_naming_it() {
    let mut state: SamplerState = serde_json::from_str(OLD_FORMAT).unwrap();
    state.offset = 2;
    let err = state.resharded_for(3).unwrap_err();
    assert_eq!(
        err,
        DataError::OffsetOutOfRange {
            offset: 2,
            num_replicas: 2
        }
    );
    assert!(err.to_string().contains("offset 2"), "{err}");
    let mut sampler = DistributedSamplerConfig::new(2, 0)
        .with_seed(11)
        .init(40)
        .unwrap();
    let before = sampler.state();
    assert_eq!(sampler.load_state(&state), Err(err));
    assert_eq!(sampler.state(), before, "unchanged on error");
}

#[test]
fn resharding_for_zero_ranks_or_past_the_epoch_is_an_error() {
    let state: SamplerState = serde_json::from_str(OLD_FORMAT).unwrap();
    assert_eq!(state.resharded_for(0), Err(DataError::ZeroReplicas));
    let past = SamplerState {
        position: 21,
        ..state
    };
    assert_eq!(
        past.resharded_for(3),
        Err(DataError::PositionOutOfRange {
            position: 21,
            num_samples: 20
        })
    );
}

#[test]
fn a_resharded_state_on_the_wrong_world_size_still_translates_by_global_count() {
    let state: SamplerState = serde_json::from_str(OLD_FORMAT).unwrap();
    let for_three = state.resharded_for(3).unwrap(); // offset 1, position 3: 10 consumed
    // Loaded on 5 ranks: 10 / 5 = 2, exact.
    let mut sampler = DistributedSamplerConfig::new(5, 4)
        .with_seed(11)
        .init(40)
        .unwrap();
    sampler.load_state(&for_three).unwrap();
    assert_eq!((sampler.offset(), sampler.position()), (0, 2));
    // Loaded on 4 ranks: refused, with the true global count.
    let mut sampler = DistributedSamplerConfig::new(4, 0)
        .with_seed(11)
        .init(40)
        .unwrap();
    assert!(matches!(
        sampler.load_state(&for_three),
        Err(DataError::WorldSizeChange {
            saved: 3,
            current: 4,
            global_consumed: 10,
            ..
        })
    ));
}

/// `drop_last` with fewer samples than the saved world size: 0 samples per rank, so a fresh
/// state's position 0 is both the start and the end of its epoch. Nothing was consumed, so on
/// a world size with samples it is the start: the epoch is seen, not skipped.
#[test]
fn an_epoch_start_with_no_samples_per_rank_translates_to_the_start() {
    let run = Run {
        len: 3,
        seed: 4,
        shuffle: true,
        drop_last: true,
        epoch: 2,
    };
    let saved = run.fresh(4, 0).state();
    assert_eq!((saved.position, saved.num_samples()), (0, 0));
    assert!(saved.is_epoch_complete(), "0 samples: the start is the end");
    let resharded = saved.resharded_for(2).expect("reshards");
    assert_eq!(
        (resharded.offset, resharded.position),
        (0, 0),
        "{resharded:?}"
    );
    // Loaded as it is (the exact translation) and resharded: the whole epoch of 2 ranks.
    for state in [&saved, &resharded] {
        let seen: Vec<Vec<usize>> = (0..2)
            .map(|rank| {
                let mut sampler = run.config(2, rank).init(run.len).expect("valid");
                sampler.load_state(state).expect("loads");
                assert_eq!(sampler.epoch(), 2);
                sampler.iter().collect()
            })
            .collect();
        let fresh: Vec<Vec<usize>> = (0..2)
            .map(|rank| run.fresh(2, rank).iter().collect())
            .collect();
        assert_eq!(seen, fresh, "loading {state:?}");
        assert_eq!(
            seen.concat().len(),
            2,
            "one sample per rank, the tail dropped"
        );
    }
    // The other way round: the end of an epoch, resharded for a world size without samples,
    // is still the end when resharded (or loaded) back.
    let mut two: Vec<DistributedSampler> = (0..2).map(|rank| run.fresh(2, rank)).collect();
    let (_, end) = consume(&mut two, 1);
    assert!(at_epoch_end(&end));
    let for_four = round_trip(&end.resharded_for(4).expect("reshards"));
    assert!(at_epoch_end(&for_four), "{for_four:?}");
    for back in [
        for_four.resharded_for(2).expect("reshards"),
        for_four.clone(),
    ] {
        let rest = drain(&run.restored(2, &back));
        assert!(rest.is_empty(), "the finished epoch replayed: {rest:?}");
    }
    let mut one = run.config(1, 0).init(run.len).expect("valid");
    one.load_state(&for_four)
        .expect("the end of an epoch always translates");
    assert_eq!(one.remaining(), 0);
}
