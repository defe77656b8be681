//! Unit tests of [`PowerSgdHook`]: its arithmetic when DDP lays buckets out again, and its
//! state taken and restored.

use super::state_format::{POWERSGD_STATE_VERSION, Snapshot};
use super::*;
use ddp_comm::{ProcessGroupConfig, Store, StoreConfig, StoreServer};

/// A process group of one rank, and the store server it needs kept alive.
fn one_rank_group() -> (StoreServer, ProcessGroup) {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("store");
    let store =
        Store::connect(&server.local_addr().to_string(), StoreConfig::new()).expect("store");
    let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1)).expect("group");
    (server, pg)
}

fn bucket(path: &str, values: &[f32]) -> GradBucket {
    let params = vec![BucketParam {
        path: path.into(),
        shape: vec![4, 4],
        offset: 0,
    }];
    GradBucket::new(0, true, values.to_vec(), params)
}

/// Bucket 0 holds `a` until DDP lays the buckets out again, then `b` of the same size: the
/// error `a` left must not be added to `b`'s gradient.
#[test]
fn a_bucket_laid_out_again_starts_without_the_old_parameters_error() {
    let (_server, pg) = one_rank_group();
    let mut hook = PowerSgdConfig::new()
        .with_start_iter(2)
        .with_warm_start(false)
        .init()
        .expect("hook");
    let grad: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    for _ in 0..3 {
        hook.reduce(&mut bucket("a", &grad), &pg).expect("reduce");
    }
    assert!(
        hook.error[&0].iter().any(|e| *e != 0.0),
        "rank 1 leaves an error"
    );
    let mut relaid = bucket("b", &grad);
    hook.reduce(&mut relaid, &pg).expect("reduce");
    // The new error is what this step's approximation missed of `grad` alone.
    let missed: Vec<f32> = grad
        .iter()
        .zip(relaid.buffer())
        .map(|(g, o)| g - o)
        .collect();
    assert_eq!(hook.error[&0], missed);
}

/// A state goes into a fresh hook of the same settings whole, and one whose buffers do not
/// fit its saved layout is refused by name.
#[test]
fn a_state_restores_whole_and_one_that_does_not_fit_is_refused() {
    let (_server, pg) = one_rank_group();
    let config = PowerSgdConfig::new().with_start_iter(2);
    let mut hook = config.init().expect("hook");
    let grad: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    for _ in 0..3 {
        hook.reduce(&mut bucket("a", &grad), &pg).expect("reduce");
    }
    let state = hook.state().expect("PowerSGD has a state");
    let mut fresh = config.init().expect("hook");
    fresh.load_state(state.clone()).expect("restore");
    assert_eq!(fresh.state(), Some(state.clone()));
    assert_eq!(fresh.iterations(), 3);

    let mut snapshot = Snapshot::decode(state.payload()).expect("decodes");
    snapshot.buckets[0]
        .error
        .as_mut()
        .expect("error feedback")
        .pop();
    let short = CommHookState::new(POWERSGD, POWERSGD_STATE_VERSION, snapshot.encode());
    let err = config.init().expect("hook").load_state(short).unwrap_err();
    assert!(
        matches!(err, CommHookStateError::LayoutMismatch { bucket: 0, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("15 elements, its parameters 16"),
        "{err}"
    );
}
