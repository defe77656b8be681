//! `DDP_TRANSPORT=mpi` is a transport name, and a build without the `mpi` feature says how to
//! get one instead of falling back to another transport. (With the feature, the collectives
//! run under a real mpirun in `collectives_match_local`.)

use ddp_comm::TransportKind;

#[test]
fn mpi_is_a_transport_name() {
    assert_eq!(
        " MPI ".parse::<TransportKind>().unwrap(),
        TransportKind::Mpi
    );
    assert_eq!(TransportKind::Mpi.to_string(), "mpi");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_feature_mpi_is_refused_naming_the_feature() {
    use ddp_comm::{ProcessGroupConfig, Store, StoreConfig, StoreServer};
    use std::time::Duration;

    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).unwrap();
    let timeout = Duration::from_secs(20);
    let store = Store::connect(
        &server.local_addr().to_string(),
        StoreConfig::new().with_timeout(timeout),
    )
    .unwrap();
    let config = ProcessGroupConfig::new(0, 1)
        .with_timeout(timeout)
        .with_transport(TransportKind::Mpi);
    let e = ddp_comm::ProcessGroup::with_store(store, config)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("DDP_TRANSPORT") && e.contains("`mpi` feature"),
        "{e}"
    );
}
