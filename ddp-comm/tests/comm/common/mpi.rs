//! Ranks as processes under a real `mpirun`, for the MPI transport (`Setup::Mpi`).
//!
//! A test calls [`run_test`] with its own name: outside `mpirun` it starts `mpirun -np N` on
//! this test binary filtered to that test, once per world size, and fails with the ranks'
//! output if any fails; inside, each process is one rank and runs the body. Rank 0 hosts the
//! store on a port the kernel gives it and writes that port to a file the outer process named;
//! the other ranks read it there. (A port picked by the outer process and released could be
//! taken by `mpirun`'s own daemons before rank 0 binds it: CI once failed that way.)

use ddp_comm::{CommError, ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The file where rank 0 writes the store's port, named to the ranks by the outer test.
const STORE_PORT_FILE_ENV: &str = "DDP_TEST_MPI_STORE_PORT_FILE";

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
        let dir = tempfile::tempdir().expect("a temporary directory for the store's port");
        let port_file = dir.path().join("store-port");
        let mut cmd = Command::new(mpirun());
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .args([
                "--oversubscribe",
                "--bind-to",
                "none",
                "-np",
                &n.to_string(),
            ])
            .args([
                "-x",
                &format!("{STORE_PORT_FILE_ENV}={}", port_file.display()),
            ])
            .arg(std::env::current_exe().expect("this test binary"))
            .args(["--exact", test, "--nocapture", "--test-threads=1"]);
        let (status, stdout, stderr) = run_with_deadline(&mut cmd, dir.path(), MPIRUN_DEADLINE);
        assert!(
            status.is_some_and(|s| s.success()),
            "{test} with {n} MPI ranks {}:\n{stdout}\n{stderr}",
            match status {
                Some(_) => "failed".to_string(),
                None => format!("did not finish within {MPIRUN_DEADLINE:?} (killed)"),
            }
        );
        // A filter that matched nothing would pass without running anything.
        assert_eq!(
            stdout.matches("1 passed").count(),
            n,
            "every rank runs {test}:\n{stdout}"
        );
    }
}

/// How long one `mpirun` of a test may take: MPI calls have no timeout, so a rank stuck in
/// one would otherwise hold the test (and CI) for ever.
const MPIRUN_DEADLINE: Duration = Duration::from_secs(300);

/// Runs `cmd` with its output in files under `dir`, killing it after `deadline`: its exit
/// status (`None` when killed), stdout and stderr.
fn run_with_deadline(
    cmd: &mut Command,
    dir: &Path,
    deadline: Duration,
) -> (Option<std::process::ExitStatus>, String, String) {
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let file = |p: &Path| std::fs::File::create(p).expect("an output file for mpirun");
    let mut child = cmd
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        .spawn()
        .expect("starting mpirun");
    let end = Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        if Instant::now() >= end {
            // SIGTERM first: mpirun passes it on to the ranks and cleans up after them.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let grace = Instant::now() + Duration::from_secs(10);
            while Instant::now() < grace && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (status, read(&out_path), read(&err_path))
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
    let port_file: PathBuf = std::env::var_os(STORE_PORT_FILE_ENV)
        .unwrap_or_else(|| panic!("{STORE_PORT_FILE_ENV} is not set: start ranks with run_test"))
        .into();
    let server = (rank == 0).then(|| {
        let server =
            StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("binding the store");
        publish_port(&port_file, server.local_addr().port());
        server
    });
    let port = match &server {
        Some(server) => server.local_addr().port(),
        None => read_port(&port_file, timeout),
    };
    let addr = format!("127.0.0.1:{port}");
    let result = Store::connect(&addr, StoreConfig::new().with_timeout(timeout))
        .and_then(|store| ProcessGroup::with_store(store, config(rank)))
        .and_then(body);
    vec![result]
}

/// Writes `port` to `file` whole: to a sibling first, then renamed, so a reader never sees a
/// partial number.
fn publish_port(file: &Path, port: u16) {
    let partial = file.with_extension("partial");
    std::fs::write(&partial, port.to_string()).expect("writing the store's port");
    std::fs::rename(&partial, file).expect("publishing the store's port");
}

/// Waits up to `timeout` for rank 0 to publish the store's port in `file`.
fn read_port(file: &Path, timeout: Duration) -> u16 {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            return text
                .parse()
                .unwrap_or_else(|e| panic!("{} holds {text:?}, not a port: {e}", file.display()));
        }
        assert!(
            Instant::now() < deadline,
            "rank 0 did not publish the store's port in {} within {timeout:?}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
