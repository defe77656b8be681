//! A one-node Slurm cluster started by a test: `munged`, `slurmctld` and `slurmd` in the
//! foreground, with a generated munge key and `slurm.conf` in a temporary directory, stopped
//! when the [`Cluster`] is dropped (also when the test panics).
//!
//! Plugins are the ones that work as root in a container without systemd or cgroups:
//! `proctrack/linuxproc`, `task/none`, no accounting. Needs Debian's `slurm-wlm` and `munge`.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the daemons get to come up (the test machine may be loaded).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long a job may stay in the queue after the cluster is asked to cancel it.
const DRAIN_DEADLINE: Duration = Duration::from_secs(15);

/// One daemon, with the file its output goes to.
struct Daemon {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// A running one-node cluster; `SLURM_CONF` pointed at [`Cluster::conf`] reaches it.
pub struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<Daemon>,
    /// The node's name, which Slurm puts in `SLURM_JOB_NODELIST`.
    pub node: String,
}

/// `program` from `PATH` (or `/usr/sbin`, where Debian puts the daemons), or a failure saying
/// how to install it.
pub fn find_program(program: &str) -> PathBuf {
    lookup_program(program).unwrap_or_else(|| {
        panic!(
            "{program} not found in PATH or /usr/sbin: this test starts a real Slurm \
                 cluster; install it (Debian/Ubuntu: apt-get install -y slurm-wlm munge)"
        )
    })
}

/// `program` from `PATH`, `/usr/sbin` or `/sbin`, if it is there.
pub fn lookup_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Two distinct TCP ports that were free a moment ago.
fn free_ports() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    let (a, b) = (bind(), bind());
    let port = |l: &std::net::TcpListener| l.local_addr().expect("local address").port();
    (port(&a), port(&b))
}

/// This machine's short host name (slurmd answers for it; the examples' workers resolve it as
/// rank 0's address, like on a real cluster).
fn short_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0, "gethostname failed");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    name.split('.').next().unwrap_or("localhost").to_string()
}

impl Cluster {
    /// Starts the daemons and waits until the node is idle; panics with every daemon's log if
    /// one cannot start.
    pub fn start() -> Cluster {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            panic!("slurmd must run as root to start job steps: run this test as root (CI does)");
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let root = dir.path().to_path_buf();
        for sub in ["state", "spool"] {
            std::fs::create_dir(root.join(sub)).expect("creating a Slurm directory");
        }
        let node = short_hostname();
        let conf = root.join("slurm.conf");
        std::fs::write(&conf, slurm_conf(&root, &node)).expect("writing slurm.conf");
        let key = root.join("munge.key");
        write_munge_key(&key);

        let mut cluster = Cluster {
            dir,
            conf,
            daemons: Vec::new(),
            node,
        };
        let socket = root.join("munge.sock");
        cluster.spawn(
            "munged",
            &[
                "--foreground".into(),
                "--force".into(),
                format!("--socket={}", socket.display()),
                format!("--key-file={}", key.display()),
                format!("--pid-file={}", root.join("munged.pid").display()),
                format!("--seed-file={}", root.join("munged.seed").display()),
                format!("--log-file={}", root.join("munged.file.log").display()),
            ],
        );
        cluster.wait_for("munged's socket", |_| socket.exists());
        let conf_arg = cluster.conf.display().to_string();
        cluster.spawn("slurmctld", &["-D".into(), "-f".into(), conf_arg.clone()]);
        let node = cluster.node.clone();
        cluster.spawn(
            "slurmd",
            &["-D".into(), "-f".into(), conf_arg, "-N".into(), node],
        );
        cluster.wait_for("the node to be idle", |c| {
            let out = c
                .command("sinfo")
                .args(["--noheader", "--format=%T"])
                .stderr(Stdio::null())
                .output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        cluster
    }

    /// The cluster's temporary directory (job outputs can go here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A Slurm client (`srun`, `sbatch`, `squeue`...) talking to this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = crate::common::clean_command(find_program(program).to_str().expect("UTF-8"));
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// Every daemon's output, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for d in &self.daemons {
            let text = std::fs::read_to_string(&d.log).unwrap_or_default();
            all.push_str(&format!("--- {} ({}):\n{text}\n", d.name, d.log.display()));
        }
        let file_log = self.dir.path().join("munged.file.log");
        if let Ok(text) = std::fs::read_to_string(file_log) {
            all.push_str(&format!("--- munged's log file:\n{text}\n"));
        }
        all
    }

    /// Starts `name` with its output in `<dir>/<name>.log`, in its own process group, killed
    /// if this test thread dies without dropping the cluster.
    fn spawn(&mut self, name: &'static str, args: &[String]) {
        let log = self.dir.path().join(format!("{name}.log"));
        let out = File::create(&log).expect("creating a daemon log");
        let err = out.try_clone().expect("duplicating a file handle");
        let mut cmd = Command::new(find_program(name));
        cmd.args(args)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => self.daemons.push(Daemon { name, child, log }),
            Err(e) => panic!("cannot start {name}: {e}\n{}", self.logs()),
        }
    }

    /// Polls `ready` until it holds; panics with the logs if a daemon exits or time runs out.
    fn wait_for(&mut self, what: &str, ready: impl Fn(&Cluster) -> bool) {
        let start = Instant::now();
        loop {
            if ready(self) {
                return;
            }
            let exited = self
                .daemons
                .iter_mut()
                .find_map(|d| Some((d.name, d.child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                panic!(
                    "{name} exited ({status}) while waiting for {what}:\n{}",
                    self.logs()
                );
            }
            if start.elapsed() > START_DEADLINE {
                panic!(
                    "timed out after {START_DEADLINE:?} waiting for {what}:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Cancels every job and waits (bounded) until the queue is empty, so that no job step
    /// outlives the cluster.
    ///
    /// Runs in `Drop`, also while a failed start unwinds: it never panics. A missing `scancel`
    /// or `squeue` is logged and the daemons are stopped all the same.
    fn drain(&self) {
        let (Some(scancel), Some(squeue)) = (lookup_program("scancel"), lookup_program("squeue"))
        else {
            eprintln!(
                "teardown: scancel or squeue not found; stopping the daemons without draining"
            );
            return;
        };
        let tool = |path: &Path| {
            let mut cmd = crate::common::clean_command(&path.to_string_lossy());
            cmd.env("SLURM_CONF", &self.conf);
            cmd
        };
        let _ = tool(&scancel).args(["--user=root", "--full"]).output();
        let start = Instant::now();
        while start.elapsed() < DRAIN_DEADLINE {
            let queued = tool(&squeue)
                .args(["--noheader", "--format=%i"])
                .stderr(Stdio::null())
                .output();
            match queued {
                Ok(o) if o.status.success() && o.stdout.trim_ascii().is_empty() => return,
                Ok(o) if !o.status.success() => return, // the controller is gone
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Cluster {
    /// Cancels jobs, then stops the daemons in reverse order: SIGTERM, SIGKILL after 10 s.
    fn drop(&mut self) {
        self.drain();
        for d in self.daemons.iter_mut().rev() {
            // SAFETY: plain syscall on a child this cluster started.
            unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while !matches!(d.child.try_wait(), Ok(Some(_))) {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = d.child.kill();
                    let _ = d.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A random 1 KiB key, readable by its owner only (munged refuses anything looser).
fn write_munge_key(path: &Path) {
    let mut key = vec![0u8; 1024];
    let mut urandom = File::open("/dev/urandom").expect("opening /dev/urandom");
    std::io::Read::read_exact(&mut urandom, &mut key).expect("reading /dev/urandom");
    std::fs::write(path, key).expect("writing the munge key");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .expect("restricting the munge key");
}

/// One node with 4 CPUs (more than a small CI machine has: `config_overrides` lets slurmd
/// accept that), ports picked free, state and spool under `root`.
fn slurm_conf(root: &Path, node: &str) -> String {
    let r = root.display();
    let (ctld_port, slurmd_port) = free_ports();
    format!(
        "ClusterName=ddptest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge.sock
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"
    )
}
