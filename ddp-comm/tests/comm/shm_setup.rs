//! Choosing the transport, and the life of shared-memory segments (ranks as threads).
use crate::common::{Setup, run_ok_with, run_world};
use ddp_comm::{
    ProcessGroup, ProcessGroupConfig, ReduceOp, Store, StoreConfig, StoreServer, TransportKind,
};
use std::path::Path;
use std::time::Duration;

/// Runs one rank per entry of `configs`, returning each rank's group or error text.
fn join_with(configs: Vec<ProcessGroupConfig>) -> Vec<Result<ProcessGroup, String>> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).unwrap();
    let addr = server.local_addr().to_string();
    std::thread::scope(|s| {
        let hs: Vec<_> = configs
            .into_iter()
            .map(|c| {
                let addr = addr.clone();
                s.spawn(move || {
                    let store =
                        Store::connect(&addr, StoreConfig::new()).map_err(|e| e.to_string())?;
                    ProcessGroup::with_store(store, c).map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn segment_names_are_unlinked_once_every_rank_has_mapped_them() {
    run_ok_with(Setup::Shm, 3, |pg| {
        let name = String::from_utf8(pg.store().get("shm/seg/0")?).unwrap();
        assert!(name.starts_with("ddp-"), "{name}");
        // The memory works; and once a collective has run, the leader (which unlinks before its
        // setup returns) has finished setting up too. (Group creation itself only waits for
        // the ring neighbours.)
        let mut v = vec![1.0f64; 1000];
        pg.all_reduce(&mut v, ReduceOp::Sum)?;
        assert_eq!(v[999], 3.0);
        assert!(
            !Path::new("/dev/shm").join(&name).exists(),
            "{name} still has a name after setup"
        );
        Ok(())
    });
}

#[test]
fn subgroups_get_their_own_shared_memory() {
    run_ok_with(Setup::Shm, 4, |pg| {
        let sub = pg.new_group(&[1, 2, 3])?;
        if let Some(sub) = sub {
            assert_eq!(sub.backend_name(), "shm+tcp");
            assert_eq!(sub.shared_memory_groups(), [vec![1, 2, 3]]);
            let mut v = vec![pg.rank() as i64; 5000];
            sub.all_reduce(&mut v, ReduceOp::Sum)?;
            assert_eq!(v, vec![6; 5000]);
        }
        pg.barrier()
    });
}

#[test]
fn auto_goes_along_with_tcp_and_with_shm() {
    let t = Duration::from_secs(20);
    let auto = |r| {
        ProcessGroupConfig::new(r, 2)
            .with_timeout(t)
            .with_transport(TransportKind::Auto)
    };
    let groups = join_with(vec![auto(0), auto(1).with_transport(TransportKind::Tcp)]);
    for g in &groups {
        assert_eq!(g.as_ref().unwrap().backend_name(), "tcp");
    }
    let groups = join_with(vec![auto(0).with_transport(TransportKind::Shm), auto(1)]);
    for g in &groups {
        assert_eq!(g.as_ref().unwrap().backend_name(), "shm+tcp");
    }
}

#[test]
fn tcp_and_shm_in_one_group_is_a_configuration_error_naming_both_ranks() {
    let t = Duration::from_secs(20);
    let results = join_with(vec![
        ProcessGroupConfig::new(0, 3)
            .with_timeout(t)
            .with_transport(TransportKind::Shm),
        ProcessGroupConfig::new(1, 3).with_timeout(t),
        ProcessGroupConfig::new(2, 3)
            .with_timeout(t)
            .with_transport(TransportKind::Tcp),
    ]);
    for r in results {
        let e = r.unwrap_err();
        assert!(
            e.contains("DDP_TRANSPORT") && e.contains("rank 2 asked for tcp but rank 0 for shm"),
            "{e}"
        );
    }
}

#[test]
fn transport_names_parse_and_bad_ones_are_rejected() {
    assert_eq!("SHM".parse::<TransportKind>().unwrap(), TransportKind::Shm);
    assert_eq!(
        " tcp ".parse::<TransportKind>().unwrap(),
        TransportKind::Tcp
    );
    assert_eq!(
        "auto".parse::<TransportKind>().unwrap(),
        TransportKind::Auto
    );
    let e = "nccl".parse::<TransportKind>().unwrap_err().to_string();
    assert!(
        e.contains("DDP_TRANSPORT: 'nccl' is not a transport (expected auto, tcp, shm or mpi)"),
        "{e}"
    );
    assert_eq!(TransportKind::default().to_string(), "auto");
}

#[test]
fn ranks_on_different_hosts_talk_tcp() {
    let t = Duration::from_secs(20);
    let groups = join_with(
        (0..3)
            .map(|r| {
                ProcessGroupConfig::new(r, 3)
                    .with_timeout(t)
                    .with_host_id(format!("host-{r}"))
            })
            .collect(),
    );
    for g in groups {
        let g = g.unwrap();
        assert_eq!(g.backend_name(), "tcp");
        assert_eq!(g.shared_memory_groups(), [vec![0], vec![1], vec![2]]);
    }
}

/// The default (no transport in the config, `DDP_TRANSPORT` unset in the test environment)
/// picks shared memory for ranks that share a host.
#[test]
fn auto_is_the_default_and_picks_shared_memory_on_one_host() {
    if std::env::var_os("DDP_TRANSPORT").is_some() {
        eprintln!("skipping: DDP_TRANSPORT is set in the environment");
        return;
    }
    let results = run_world(2, Duration::from_secs(20), |pg| Ok(pg.backend_name()));
    for r in results {
        assert_eq!(r.unwrap(), "shm+tcp");
    }
}

/// Every element of a shared-memory sum is added in rank order, whichever rank reduces its
/// slice, so the result of an element does not depend on where it sits in the buffer (DDP's
/// sums stay bitwise the same when its buckets are laid out again). The values make the order
/// visible: (2^-24 + 2^-24) + 1 is 1 + 2^-23, while rank 2 adding its own 1 first would give
/// (1 + 2^-24) + 2^-24 = 1.
#[test]
fn shm_sums_add_the_ranks_in_order_wherever_an_element_sits() {
    let tiny = f32::EPSILON / 2.0;
    let value = |rank: usize| if rank == 2 { 1.0f32 } else { tiny };
    let in_rank_order = (value(0) + value(1)) + value(2);
    assert_ne!(in_rank_order, (value(2) + value(0)) + value(1));
    let results = run_ok_with(Setup::Shm, 3, |pg| {
        // Long enough that each of the 3 ranks reduces a slice of it; and a reduce-scatter,
        // whose blocks each rank reduces in turn.
        let mut v = vec![value(pg.rank()); 3000];
        pg.all_reduce(&mut v, ReduceOp::Sum)?;
        let input = vec![value(pg.rank()); 3 * 1000];
        let mut block = vec![0.0f32; 1000];
        pg.reduce_scatter(&input, &mut block, ReduceOp::Sum)?;
        Ok((pg.rank(), v, block))
    });
    for (rank, v, block) in results {
        let at = |xs: &[f32]| {
            xs.iter()
                .position(|x| x.to_bits() != in_rank_order.to_bits())
        };
        assert_eq!(at(&v), None, "rank {rank}: all-reduce not in rank order");
        assert_eq!(
            at(&block),
            None,
            "rank {rank}: reduce-scatter not in rank order"
        );
    }
}
