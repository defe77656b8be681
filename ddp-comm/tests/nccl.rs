//! NCCL groups (feature `cuda`): collectives at world size 1 on device and host buffers, the
//! unique-id rendezvous, and clear errors on machines without CUDA.
//!
//! Tests that need a GPU are `#[ignore]`d with that reason, so `cargo test` lists them as not
//! run; `.ci/gpu-checks` runs them with `--ignored` on a GPU machine, where a missing driver, GPU
//! or libnccl fails them with what to install or set.
#![cfg(feature = "cuda")]

use ddp_comm::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use ddp_comm::watchdog::CollectiveLabel;
use ddp_comm::{
    CommError, NCCL_DEFAULT_TIMEOUT, NcclBackend, NcclBackendConfig, NcclDtype, NcclElement,
    NcclError, ProcessGroup, ProcessGroupConfig, ReduceOp, Store, StoreConfig, StoreServer, bf16,
    cuda_device_count, f16,
};
use std::time::Duration;

const ALL_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Product,
];

fn store_pair() -> (StoreServer, Store) {
    let config = StoreConfig::new().with_timeout(Duration::from_secs(30));
    let server = StoreServer::bind("127.0.0.1:0", config.clone()).expect("bind a store");
    let store = Store::connect(&server.local_addr().to_string(), config).expect("connect");
    (server, store)
}

/// Fails, saying what is missing, unless this machine has a CUDA driver and a GPU.
fn require_gpu() {
    assert!(
        ddp_comm::cuda_driver_present(),
        "no CUDA driver found (libcuda could not be loaded): this test needs an NVIDIA GPU"
    );
    match cuda_device_count() {
        Ok(0) => panic!("the CUDA driver is installed but sees no GPU"),
        Ok(_) => {}
        Err(e) => panic!("counting GPUs failed: {e}"),
    }
}

/// Creates a group; fails saying what to install or set when NCCL cannot be loaded.
fn create(store: &Store, config: NcclBackendConfig) -> NcclBackend {
    NcclBackend::new(store, config).unwrap_or_else(|e| {
        panic!("creating a world-1 NCCL group failed (point LD_LIBRARY_PATH at libnccl): {e}")
    })
}

/// A world-1 group on device 0.
fn world_one(name: &str) -> NcclBackend {
    require_gpu();
    let (_server, store) = store_pair();
    create(&store, NcclBackendConfig::new(0, 1, 0).with_name(name))
}

fn upload<T: DeviceRepr>(g: &NcclBackend, host: &[T]) -> CudaSlice<T> {
    g.stream().clone_htod(host).expect("copy to the device")
}

fn download<T: DeviceRepr>(g: &NcclBackend, dev: &CudaSlice<T>) -> Vec<T> {
    let host = g.stream().clone_dtoh(dev).expect("copy to the host");
    g.stream().synchronize().expect("synchronize");
    host
}

/// At world size 1 every reduction of a buffer is the buffer itself.
fn all_reduce_keeps_values<T: NcclElement>(g: &NcclBackend, values: &[T]) {
    for op in ALL_OPS {
        let mut dev = upload(g, values);
        g.all_reduce(&mut dev, op).expect("device all_reduce");
        assert_eq!(download(g, &dev), values, "device all_reduce {op}");
        let mut host = values.to_vec();
        g.all_reduce_host(&mut host, op).expect("host all_reduce");
        assert_eq!(host, values, "host all_reduce {op}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn all_reduce_at_world_one_returns_the_input_for_every_op_and_type() {
    let g = world_one("all-reduce");
    all_reduce_keeps_values(&g, &[1.5f32, -2.0, 3.25, 0.0]);
    all_reduce_keeps_values(&g, &[1.5f64, -2.0, 1e300]);
    all_reduce_keeps_values(&g, &[7i32, -3, i32::MAX]);
    all_reduce_keeps_values(&g, &[7i64, -3, i64::MIN]);
    all_reduce_keeps_values(&g, &[0u8, 1, 255]);
    all_reduce_keeps_values(&g, &[f16::from_f32(1.5), f16::from_f32(-0.25)]);
    all_reduce_keeps_values(&g, &[bf16::from_f32(1.5), bf16::from_f32(-0.25)]);
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn all_reduce_on_a_view_leaves_the_rest_of_the_buffer_alone() {
    let g = world_one("view");
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let mut dev = upload(&g, &values);
    let mut view = dev.slice_mut(2..5);
    g.all_reduce(&mut view, ReduceOp::Sum)
        .expect("all_reduce on a view");
    assert_eq!(download(&g, &dev), values);
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn broadcast_from_root_zero_keeps_the_root_values() {
    let g = world_one("broadcast");
    let values = [3i64, -1, 42];
    let mut dev = upload(&g, &values);
    g.broadcast(&mut dev, 0).expect("device broadcast");
    assert_eq!(download(&g, &dev), values);
    let mut host = values;
    g.broadcast_host(&mut host, 0).expect("host broadcast");
    assert_eq!(host, values);
    let e = g.broadcast_host(&mut host, 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("root 1 is out of range for world size 1"),
        "{e}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn all_gather_at_world_one_copies_send_into_recv() {
    let g = world_one("all-gather");
    let send = upload(&g, &[1.0f32, 2.0, 3.0]);
    let mut recv = g.stream().alloc_zeros::<f32>(3).expect("alloc");
    g.all_gather(&send, &mut recv).expect("device all_gather");
    assert_eq!(download(&g, &recv), [1.0, 2.0, 3.0]);
    let mut host = [0u8; 2];
    g.all_gather_host(&[9u8, 8], &mut host)
        .expect("host all_gather");
    assert_eq!(host, [9, 8]);
    let e = g.all_gather_host(&[9u8, 8], &mut [0u8; 3]).unwrap_err();
    assert!(
        matches!(e, CommError::InvalidArgument { .. }),
        "wrong sizes must be rejected before NCCL sees them: {e}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn reduce_scatter_at_world_one_reduces_into_recv() {
    let g = world_one("reduce-scatter");
    let send = upload(&g, &[4i32, 5]);
    let mut recv = g.stream().alloc_zeros::<i32>(2).expect("alloc");
    g.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
        .expect("device reduce_scatter");
    assert_eq!(download(&g, &recv), [4, 5]);
    let mut host = [0.0f64; 2];
    g.reduce_scatter_host(&[0.5, -0.5], &mut host, ReduceOp::Max)
        .expect("host reduce_scatter");
    assert_eq!(host, [0.5, -0.5]);
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn barrier_and_synchronize_return_and_the_group_stays_usable() {
    let g = world_one("barrier");
    g.barrier().expect("barrier");
    g.synchronize().expect("synchronize");
    let mut v = [1.0f32; 4];
    g.all_reduce_host(&mut v, ReduceOp::Sum)
        .expect("all_reduce after barrier");
    assert_eq!(v, [1.0; 4]);
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn async_host_all_reduce_gives_the_buffer_back_with_the_result() {
    let g = world_one("async");
    let first = g.all_reduce_host_async(vec![1.0f32, 2.0], ReduceOp::Sum);
    let second = g.all_reduce_host_async(vec![-4i64; 3], ReduceOp::Min);
    let empty = g.all_reduce_host_async(Vec::<u8>::new(), ReduceOp::Max);
    assert_eq!(second.wait().expect("second"), [-4; 3]);
    assert_eq!(first.wait().expect("first"), [1.0, 2.0]);
    assert!(empty.wait().expect("empty").is_empty());
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn a_group_is_usable_from_another_thread() {
    let g = world_one("threads");
    let clone = g.clone();
    let out = std::thread::spawn(move || {
        let mut v = [2u8, 3];
        clone.all_reduce_host(&mut v, ReduceOp::Product).map(|()| v)
    })
    .join()
    .expect("thread");
    assert_eq!(out.expect("all_reduce from another thread"), [2, 3]);
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn unique_id_is_published_under_the_group_name_and_a_name_is_used_once() {
    require_gpu();
    let (_server, store) = store_pair();
    let g = create(
        &store,
        NcclBackendConfig::new(0, 1, 0).with_name("exchange"),
    );
    let id = store
        .get("nccl/exchange/unique_id")
        .expect("rank 0 published the id");
    assert_eq!(id.len(), 128);
    assert_eq!((g.rank(), g.world_size(), g.device()), (0, 1, 0));
    drop(g);
    let e = NcclBackend::new(
        &store,
        NcclBackendConfig::new(0, 1, 0).with_name("exchange"),
    )
    .unwrap_err();
    assert!(
        matches!(e, CommError::Nccl(NcclError::NameInUse { .. })),
        "{e}"
    );
    // Another name is another group on the same store.
    let other = create(
        &store,
        NcclBackendConfig::new(0, 1, 0).with_name("exchange-2"),
    );
    assert_eq!(other.world_size(), 1);
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn a_process_group_has_one_nccl_backend_kept_with_it() {
    require_gpu();
    let (_server, store) = store_pair();
    let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1)).expect("world 1");
    let g = pg
        .nccl(pg.local_rank())
        .unwrap_or_else(|e| panic!("the process group's NCCL backend: {e}"));
    assert_eq!(g.device(), pg.local_rank());
    let mut v = [5i32, 6];
    g.all_reduce_host(&mut v, ReduceOp::Avg)
        .expect("all_reduce");
    assert_eq!(v, [5, 6]);
    // A second call, from a clone, is the same communicator (no second rendezvous).
    let again = pg.clone().nccl(pg.local_rank()).expect("the same backend");
    assert_eq!(again.name(), g.name());
    let mut w = [7i32];
    again
        .all_reduce_host(&mut w, ReduceOp::Sum)
        .expect("all_reduce");
    assert_eq!(w, [7]);
    // One device per rank per group.
    let e = pg.nccl(pg.local_rank() + 1).unwrap_err();
    assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("new_group"), "{e}");
    // Aborting the group aborts its backend.
    pg.abort("test abort");
    assert!(g.all_reduce_host(&mut w, ReduceOp::Sum).is_err());
}

/// Runs on every machine: without a driver, creating a group is a clear error; with one, a
/// device this machine does not have is named as missing (both before NCCL is touched).
#[test]
fn a_group_this_machine_cannot_make_is_an_error_not_a_panic() {
    let (_server, store) = store_pair();
    if !ddp_comm::cuda_driver_present() {
        let e = NcclBackend::new(&store, NcclBackendConfig::new(0, 1, 0)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("no CUDA driver found (libcuda could not be loaded)"),
            "{e}"
        );
        assert!(matches!(&e, CommError::Nccl(n) if n.is_unavailable()));
        assert!(matches!(
            cuda_device_count(),
            Err(CommError::Nccl(NcclError::DriverNotFound))
        ));
        // The same through a process group's backend, which stays uncreated.
        let (_server, store) = store_pair();
        let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1)).expect("world 1");
        let e = pg.nccl(0).unwrap_err();
        assert!(
            matches!(&e, CommError::Nccl(n) if n.is_unavailable()),
            "{e}"
        );
        return;
    }
    let count = cuda_device_count().expect("the driver counts its GPUs");
    let e = NcclBackend::new(&store, NcclBackendConfig::new(0, 1, count)).unwrap_err();
    assert!(
        matches!(&e, CommError::Nccl(NcclError::NoSuchDevice { device, .. }) if *device == count),
        "{e}"
    );
}

/// The DDP engine's path: an all-reduce of a device address that returns at once, then its
/// completion with GPU timing.
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn raw_async_all_reduce_gives_the_values_and_a_gpu_timing() {
    let g = world_one("raw-async");
    let values = [1.5f32, -2.0, 3.25, 0.0, 7.0];
    for round in 1..=2u64 {
        let dev = upload(&g, &values);
        let (ptr, record) = dev.device_ptr(g.stream());
        drop(record);
        let label = CollectiveLabel::new("all_reduce").with_bucket(3);
        // SAFETY: `dev` is a live allocation of 5 f32 on the group's device and stream, not
        // touched by another stream until the work completes (we wait for it below).
        let work = unsafe {
            g.all_reduce_raw_async(ptr, values.len(), NcclDtype::F32, ReduceOp::Sum, label)
        }
        .expect("raw all_reduce");
        assert_eq!(
            work.seq(),
            round,
            "each collective gets the next sequence number"
        );
        // `wait` reads both timing events back (a CUDA error there fails it); the timing's
        // order is clamped by construction, so it is not asserted here.
        let _timing = work.wait().expect("wait, reading the timing events");
        assert_eq!(download(&g, &dev), values, "round {round}");
    }
}

/// A rank alone in a world of two cannot form the communicator: the init gives up after the
/// timeout with an error naming the group, instead of hanging.
#[test]
#[ignore = "needs an NVIDIA GPU, its driver and libnccl; .ci/gpu-checks runs it"]
fn init_without_the_other_rank_times_out_with_the_group_named() {
    require_gpu();
    let (_server, store) = store_pair();
    let config = NcclBackendConfig::new(0, 2, 0)
        .with_name("lonely")
        .with_timeout(Duration::from_secs(3));
    match NcclBackend::new(&store, config) {
        Err(CommError::Nccl(NcclError::InitTimeout {
            group, world_size, ..
        })) => assert_eq!((group.as_str(), world_size), ("lonely", 2)),
        Err(e) => panic!("expected an init timeout, got {e}"),
        Ok(_) => panic!("a group of 2 formed with one rank"),
    }
}

/// Runs without a GPU: the timeout a group gets by default and from a process group.
#[test]
fn the_group_timeout_defaults_to_ten_minutes_and_follows_the_process_group() {
    assert_eq!(
        NcclBackendConfig::new(0, 1, 0).timeout,
        NCCL_DEFAULT_TIMEOUT
    );
    assert_eq!(NCCL_DEFAULT_TIMEOUT, Duration::from_secs(600));
    let (_server, store) = store_pair();
    let pg = ProcessGroup::with_store(
        store,
        ProcessGroupConfig::new(0, 1).with_timeout(Duration::from_secs(42)),
    )
    .expect("world 1");
    assert_eq!(
        NcclBackendConfig::for_process_group(&pg).timeout,
        Duration::from_secs(42)
    );
}

/// Runs without a GPU: a DDP engine waits for its collectives on other threads.
#[test]
fn nccl_work_and_the_group_can_move_between_threads() {
    fn movable<T: Send>() {}
    fn shareable<T: Send + Sync>() {}
    movable::<ddp_comm::NcclWork>();
    shareable::<NcclBackend>();
    movable::<ddp_comm::watchdog::WatchedWork>();
    shareable::<ddp_comm::watchdog::Watchdog>();
}
