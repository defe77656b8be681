//! The `etcd` backend: the elastic rendezvous in an etcd v3 cluster (`--rdzv-endpoint` is an
//! etcd client address), so no node of the job is a single point of failure: any node can
//! die, the job's state stays in etcd and the others re-form.
//!
//! Keys live under `/ddp/<rdzv-id>/`. Counters and first-writer-wins values are transactions
//! (compare the key's revision, then put). Each launcher's heartbeat is the key `hb/<node id>`
//! attached to a lease of its own (TTL = `--rdzv-heartbeat-timeout`, kept alive five times
//! per timeout): when a node dies or freezes, etcd drops its key and the others see it gone.
//!
//! The client is async: it runs on a current-thread tokio runtime driven by a thread of the
//! backend's own (`etcd_runtime`), which also keeps the lease alive (`etcd_heartbeat`); the
//! synchronous round protocol waits on it request by request, each with a time limit.

use super::backend::{BackendError, RendezvousBackend};
use super::etcd_heartbeat::{Heartbeat, grant_and_put, keep_alive, ttl_secs};
use super::etcd_runtime::{REQUEST_TIMEOUT, RuntimeThread, call};
use crate::error::LaunchError;
use crate::plan::elastic_settings::ElasticSettings;
use crate::signals::SignalGuard;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use std::collections::HashSet;
use std::future::Future;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// How long a launcher keeps trying to reach etcd at start (at most `--join-timeout`).
const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// The etcd backend of one launcher.
pub(crate) struct EtcdBackend {
    client: Client,
    /// `/ddp/<rdzv-id>/`.
    prefix: String,
    heartbeat: Option<Heartbeat>,
    heartbeat_timeout: Duration,
    heartbeat_interval: Duration,
    endpoint: String,
    advertised_host: String,
    /// Last field: the runtime stops after everything that uses it is gone.
    runtime: RuntimeThread,
}

impl EtcdBackend {
    /// Connects to the etcd server at `--rdzv-endpoint`, retrying for a while (it may be
    /// starting), stopping on a signal.
    pub(crate) fn connect(
        settings: &ElasticSettings,
        join_timeout: Duration,
        node_id: &str,
        signals: &SignalGuard,
    ) -> Result<EtcdBackend, LaunchError> {
        let endpoint = settings.endpoint.to_string();
        let err = |reason: String| settings.rendezvous_error(node_id, reason);
        let addr = settings.endpoint.resolve().map_err(err)?;
        let wait = CONNECT_WAIT.min(join_timeout);
        let deadline = Instant::now() + wait;
        // A plain connection first: it tells whether anything listens there, and which of this
        // host's addresses reaches it (the address the other nodes will use for this one).
        let local = loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            match TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT) {
                Ok(stream) => {
                    break stream
                        .local_addr()
                        .map_err(|e| err(format!("cannot tell this node's own address: {e}")))?;
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(err(format!(
                        "cannot reach the etcd server within {wait:?} (is etcd running there, serving clients on that address?): {e}"
                    )));
                }
                Err(e) => {
                    tracing::debug!(%addr, %e, "etcd not reachable yet");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        };
        let runtime =
            RuntimeThread::start().map_err(|e| err(format!("cannot start its runtime: {e}")))?;
        let url = format!("http://{endpoint}");
        let options = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        let client = call(
            &runtime,
            &endpoint,
            "connect",
            Client::connect([url], Some(options)),
        )
        .map_err(|e| err(format!("cannot connect to the etcd server: {e}")))?;
        let backend = EtcdBackend {
            client,
            prefix: format!("/ddp/{}/", settings.job_id),
            heartbeat: None,
            heartbeat_timeout: settings.heartbeat_timeout,
            heartbeat_interval: settings.heartbeat_interval(),
            endpoint: endpoint.clone(),
            advertised_host: local.ip().to_string(),
            runtime,
        };
        // Something listens; whether it speaks etcd v3 shows on the first request.
        let mut client = backend.client.clone();
        call(&backend.runtime, &endpoint, "status", async move {
            client.status().await
        })
        .map_err(|e| err(format!("the server does not answer as etcd v3 does: {e}")))?;
        tracing::info!(%endpoint, "connected to the etcd rendezvous");
        Ok(backend)
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn call<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, BackendError> {
        call(&self.runtime, &self.endpoint, what, request)
    }

    /// The key-value pair at the full key `key`.
    fn get_kv(&self, key: &str) -> Result<Option<KeyValue>, BackendError> {
        let mut client = self.client.clone();
        let k = key.to_string();
        let mut response = self.call("get", async move { client.get(k, None).await })?;
        Ok(response.take_kvs().into_iter().next())
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse, BackendError> {
        let mut client = self.client.clone();
        self.call("transaction", async move { client.txn(txn).await })
    }

    /// Puts `value` at the full key `key` if `compare` holds; returns the value afterwards.
    fn put_if(&self, key: &str, compare: Compare, value: &[u8]) -> Result<Vec<u8>, BackendError> {
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)]);
        let response = self.txn(txn)?;
        if response.succeeded() {
            return Ok(value.to_vec());
        }
        Ok(response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            })
            .unwrap_or_default())
    }
}

/// Parses a counter's value.
fn counter(key: &str, raw: &[u8]) -> Result<i64, BackendError> {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            BackendError(format!(
                "the counter {key} holds {:?}, not a number",
                String::from_utf8_lossy(raw)
            ))
        })
}

impl RendezvousBackend for EtcdBackend {
    fn add(&mut self, key: &str, delta: i64) -> Result<i64, BackendError> {
        let key = self.key(key);
        // Read, then write if nobody wrote in between (the key's revision is unchanged).
        loop {
            let (value, unchanged) = match self.get_kv(&key)? {
                Some(kv) => (
                    counter(&key, kv.value())?,
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision()),
                ),
                None => (
                    0,
                    Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                ),
            };
            if delta == 0 {
                return Ok(value);
            }
            let new = value + delta;
            let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(
                key.as_str(),
                new.to_string(),
                None,
            )]);
            if self.txn(txn)?.succeeded() {
                return Ok(new);
            }
        }
    }

    fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, BackendError> {
        let key = self.key(key);
        // As the c10d store: an empty `expected` matches a missing key.
        let compare = if expected.is_empty() {
            Compare::create_revision(key.as_str(), CompareOp::Equal, 0)
        } else {
            Compare::value(key.as_str(), CompareOp::Equal, expected)
        };
        self.put_if(&key, compare, desired)
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.get_kv(&self.key(key))?.map(|kv| kv.value().to_vec()))
    }

    fn start_heartbeat(&mut self, node_id: &str) -> Result<(), BackendError> {
        let key = self.key(&format!("hb/{node_id}"));
        let ttl = ttl_secs(self.heartbeat_timeout);
        let lease = grant_and_put(
            &self.runtime,
            &self.endpoint,
            self.client.clone(),
            key.clone(),
            ttl,
        )?;
        let lease = Arc::new(AtomicI64::new(lease));
        let task = self.runtime.handle.spawn(keep_alive(
            self.client.clone(),
            key,
            ttl,
            self.heartbeat_interval,
            Arc::clone(&lease),
        ));
        self.heartbeat = Some(Heartbeat { lease, task });
        Ok(())
    }

    fn dead_nodes(&mut self, node_ids: &[String]) -> Result<Vec<String>, BackendError> {
        let prefix = self.key("hb/");
        let mut client = self.client.clone();
        let p = prefix.clone();
        let response = self.call("get heartbeats", async move {
            client
                .get(p, Some(GetOptions::new().with_prefix().with_keys_only()))
                .await
        })?;
        let alive: HashSet<&[u8]> = response
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().strip_prefix(prefix.as_bytes()))
            .collect();
        Ok(node_ids
            .iter()
            .filter(|id| !alive.contains(id.as_bytes()))
            .cloned()
            .collect())
    }

    fn advertised_host(&self) -> String {
        self.advertised_host.clone()
    }

    fn close(self: Box<Self>, _signals: &SignalGuard) {
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.task.abort();
            // Gone at once, rather than after the TTL: the others need not wait for it.
            let mut client = self.client.clone();
            let lease = heartbeat.lease.load(Ordering::Relaxed);
            if let Err(e) = self.call("revoke the heartbeat lease", async move {
                client.lease_revoke(lease).await
            }) {
                tracing::debug!(%e, "cannot revoke the heartbeat lease; it expires by itself");
            }
        }
    }
}
