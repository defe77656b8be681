//! [`EtcdServer`]: a real single-member `etcd` (Debian's `etcd-server`) for the etcd rendezvous
//! tests, on a temporary data directory and free ports of 127.0.0.1, killed on drop. Its log
//! is printed when a test fails while it runs, and is in the panic message when it cannot start.

use super::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: a first start on a busy machine writes and syncs its data directory.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A running etcd.
pub struct EtcdServer {
    child: Child,
    dir: tempfile::TempDir,
    /// The client port (`--rdzv-endpoint 127.0.0.1:<port>`).
    pub port: u16,
}

/// `text` in base64, as etcd's JSON gateway wants keys.
fn base64(text: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl EtcdServer {
    /// Starts etcd and waits until it reports itself healthy; panics with its log otherwise.
    pub fn start() -> EtcdServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let peer_port = free_port();
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log file");
        let spawned = Command::new("etcd")
            .args(["--name", "ddp-test", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("ddp-test={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log file"))
            .stderr(log)
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot start etcd ({e}): install Debian's etcd-server (apt-get install -y etcd-server), as .ci/run does"
            ),
        };
        let mut server = EtcdServer { child, dir, port };
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = server.child.try_wait().expect("try_wait") {
                panic!("etcd exited with {status} before serving\n{}", server.log());
            }
            if server
                .http("GET /health", "")
                .is_some_and(|body| body.contains("\"health\":\"true\""))
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not report itself healthy within {START_DEADLINE:?}\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills etcd now (a lost etcd), keeping its log.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// etcd's output so far.
    pub fn log(&self) -> String {
        let path: PathBuf = self.dir.path().join("etcd.log");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        format!("--- etcd log ({}) ---\n{text}", path.display())
    }

    /// Whether `key` is set, read through etcd's JSON gateway (the tests need no client).
    pub fn has_key(&self, key: &str) -> bool {
        let body = format!("{{\"key\":\"{}\"}}", base64(key.as_bytes()));
        self.http("POST /v3/kv/range", &body)
            .is_some_and(|answer| answer.contains("\"kvs\""))
    }

    /// The body of an HTTP/1.0 request to etcd's client port, `None` if it does not answer.
    fn http(&self, request_line: &str, body: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "{request_line} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("{}", self.log());
        }
    }
}

#[test]
fn base64_matches_the_standard_alphabet_and_padding() {
    assert_eq!(base64(b"/ddp/x"), "L2RkcC94");
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"a"), "YQ==");
}
