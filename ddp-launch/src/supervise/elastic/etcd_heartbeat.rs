//! The heartbeat of a launcher in etcd: the key `hb/<node id>` attached to a lease of its own,
//! kept alive by a task on the client's runtime. When the launcher dies, freezes or is cut off,
//! etcd drops the key after the lease's TTL, and the other nodes see it gone.

use super::backend::BackendError;
use super::etcd_runtime::{REQUEST_TIMEOUT, RuntimeThread, call};
use etcd_client::{Client, PutOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// The heartbeat lease and the task that keeps it alive.
pub(super) struct Heartbeat {
    /// The lease now holding the heartbeat key (a new one if the old one expired).
    pub(super) lease: Arc<AtomicI64>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

/// A lease's TTL in whole seconds (etcd's unit), at least 1.
pub(super) fn ttl_secs(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_secs_f64().ceil() as u64)
        .unwrap_or(i64::MAX)
        .max(1)
}

/// Grants a lease of `ttl` seconds and puts `key` with it; returns the lease id.
pub(super) fn grant_and_put(
    runtime: &RuntimeThread,
    endpoint: &str,
    client: Client,
    key: String,
    ttl: i64,
) -> Result<i64, BackendError> {
    let mut lease_client = client.clone();
    let granted = call(runtime, endpoint, "grant a heartbeat lease", async move {
        lease_client.lease_grant(ttl, None).await
    })?;
    if granted.ttl() != ttl {
        tracing::info!(
            requested = ttl,
            granted = granted.ttl(),
            "etcd changed the heartbeat lease's TTL"
        );
    }
    let id = granted.id();
    let mut put_client = client;
    call(runtime, endpoint, "put the heartbeat key", async move {
        put_client
            .put(key, "1", Some(PutOptions::new().with_lease(id)))
            .await
    })?;
    Ok(id)
}

/// Keeps the heartbeat lease alive every `interval`, until aborted. When the lease expired
/// anyway (this node was frozen or cut off for longer than its TTL, so the others dropped it),
/// a new lease brings the heartbeat key back: the node is alive again and may join.
pub(super) async fn keep_alive(
    client: Client,
    key: String,
    ttl: i64,
    interval: Duration,
    lease: Arc<AtomicI64>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stream = None;
    loop {
        ticker.tick().await;
        let id = lease.load(Ordering::Relaxed);
        if stream.is_none() {
            let mut c = client.clone();
            match tokio::time::timeout(REQUEST_TIMEOUT, c.lease_keep_alive(id)).await {
                Ok(Ok(pair)) => stream = Some(pair),
                Ok(Err(e)) => {
                    tracing::warn!(%e, "cannot keep the heartbeat lease alive in etcd");
                    continue;
                }
                Err(_) => {
                    tracing::warn!("etcd did not answer the heartbeat lease keep-alive");
                    continue;
                }
            }
        }
        let Some((keeper, responses)) = stream.as_mut() else {
            continue;
        };
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            keeper.keep_alive().await?;
            responses.message().await
        })
        .await;
        match answer {
            Ok(Ok(Some(response))) if response.ttl() > 0 => {}
            Ok(Ok(Some(_))) => {
                tracing::warn!("the heartbeat lease expired in etcd; taking a new one");
                stream = None;
                let mut c = client.clone();
                let renewed = tokio::time::timeout(REQUEST_TIMEOUT, async {
                    let granted = c.lease_grant(ttl, None).await?;
                    c.put(
                        key.as_str(),
                        "1",
                        Some(PutOptions::new().with_lease(granted.id())),
                    )
                    .await?;
                    Ok::<i64, etcd_client::Error>(granted.id())
                })
                .await;
                match renewed {
                    Ok(Ok(id)) => lease.store(id, Ordering::Relaxed),
                    Ok(Err(e)) => tracing::warn!(%e, "cannot renew the heartbeat lease"),
                    Err(_) => tracing::warn!("etcd did not answer the heartbeat lease renewal"),
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                tracing::warn!("the heartbeat lease keep-alive stream broke; reopening it");
                stream = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds_and_at_least_one() {
        assert_eq!(ttl_secs(Duration::from_secs(3)), 3);
        assert_eq!(ttl_secs(Duration::from_millis(2500)), 3);
        assert_eq!(ttl_secs(Duration::from_millis(500)), 1);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
    }
}
