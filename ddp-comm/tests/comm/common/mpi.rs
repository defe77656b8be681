//! Ranks as processes under a real `mpirun`, for the MPI transport (`Setup::Mpi`).
//!
//! A test calls [`run_test`] with its own name: outside `mpirun` it starts `mpirun -np N` on
//! this test binary filtered to that test, once per world size, and fails with the ranks'
//! output if any fails; inside, each process is one rank and runs the body. Rank 0 hosts the
//! store on a port the outer process picked.

use ddp_comm::{CommError, ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The store's port, passed to the ranks by the outer test.
const STORE_PORT_ENV: &str = "DDP_TEST_MPI_STORE_PORT";

/// This process's place in the MPI job, if `mpirun` started it.
fn mpi_place() -> Option<(usize, usize)> {
    let get = |k: &str| std::env::var(k).ok()?.parse().ok();
    Some((get("OMPI_COMM_WORLD_RANK")?, get("OMPI_COMM_WORLD_SIZE")?))
}

/// Runs `body(world size)` in every rank of `mpirun -np n` for each `n` of `worlds`.
pub fn run_test(test: &str, worlds: impl IntoIterator<Item = usize>, body: impl Fn(usize)) {
    if let Some((_, size)) = mpi_place() {
        body(size);
        return;
    }
    for n in worlds {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let out = Command::new(mpirun())
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .args([
                "--oversubscribe",
                "--bind-to",
                "none",
                "-np",
                &n.to_string(),
            ])
            .args(["-x", &format!("{STORE_PORT_ENV}={port}")])
            .arg(std::env::current_exe().expect("this test binary"))
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .output()
            .expect("starting mpirun");
        assert!(
            out.status.success(),
            "{test} with {n} MPI ranks failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A filter that matched nothing would pass without running anything.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.matches("1 passed").count(),
            n,
            "every rank runs {test}:\n{stdout}"
        );
    }
}

/// `mpirun` from `PATH`, or a failure that says how to install it.
fn mpirun() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("mpirun"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "mpirun not found in PATH: the MPI transport's tests run their ranks under a \
                 real Open MPI (Debian/Ubuntu: apt-get install -y openmpi-bin libopenmpi-dev)"
            )
        })
}

/// In a rank under `mpirun`: joins a world of `n` with this process's MPI rank and runs
/// `body`; one result, this rank's.
pub fn run_this_rank<T>(
    n: usize,
    timeout: Duration,
    config: impl Fn(usize) -> ProcessGroupConfig,
    body: impl Fn(ProcessGroup) -> Result<T, CommError>,
) -> Vec<Result<T, CommError>> {
    let (rank, size) = mpi_place().expect("Setup::Mpi runs only under mpirun (see run_test)");
    assert_eq!(
        size, n,
        "the test asked for {n} ranks, mpirun started {size}"
    );
    let port: u16 = std::env::var(STORE_PORT_ENV)
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{STORE_PORT_ENV} is not set: start ranks with run_test"));
    let addr = format!("127.0.0.1:{port}");
    let _server = (rank == 0)
        .then(|| StoreServer::bind(&addr, StoreConfig::new()).expect("binding the store"));
    let result = Store::connect(&addr, StoreConfig::new().with_timeout(timeout))
        .and_then(|store| ProcessGroup::with_store(store, config(rank)))
        .and_then(body);
    vec![result]
}
