//! The accepting side of the hello on a tokio socket, for the event loops (the store server
//! and a rank's mesh listener). The same steps as the blocking `respond` ([`Responder`]); the
//! caller puts the whole exchange under one `tokio::time` deadline.

use super::handshake::{Responder, Verified, refusal_bytes, verdict_bytes};
use super::hello::Kind;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads the hello, proves the token, checks the initiator's proof. On failure the initiator
/// has been told why (when it can still hear it), the connection is closed gracefully, and
/// the reason is returned for the log. The caller checks the claims, then calls [`answer`].
///
/// # Errors
/// The reason the connection is refused.
pub(crate) async fn respond(
    stream: &mut TcpStream,
    token: &[u8],
    kind: Kind,
) -> Result<Verified, String> {
    let mut r = Responder::new(token, kind);
    let mut fixed = [0u8; Responder::FIXED];
    read_part(stream, &mut fixed, "no complete hello").await?;
    let claims_len = or_refuse(stream, r.head(&fixed)).await?;
    let mut claims = vec![0u8; claims_len];
    read_part(stream, &mut claims, "truncated hello").await?;
    let challenge = or_refuse(stream, r.claims(&claims)).await?;
    stream
        .write_all(&challenge)
        .await
        .map_err(|e| format!("could not send the challenge: {e}"))?;
    let mut proof = [0u8; Responder::PROOF];
    read_part(stream, &mut proof, "no proof").await?;
    or_refuse(stream, r.proof(&proof)).await
}

/// Fills `buf` from the initiator; `what` names the missing part in the error.
async fn read_part(stream: &mut TcpStream, buf: &mut [u8], what: &str) -> Result<(), String> {
    match stream.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// One step of the hello: its value, or, where the step refuses the initiator, the reason
/// once the initiator has been told ([`refuse`]).
async fn or_refuse<T>(stream: &mut TcpStream, step: Result<T, String>) -> Result<T, String> {
    match step {
        Ok(v) => Ok(v),
        Err(reason) => Err(refuse(stream, reason).await),
    }
}

/// Ends an accepted hello: `Ok` admits the initiator; `Err` refuses it with the message and
/// closes the connection gracefully.
///
/// # Errors
/// The socket failed.
pub(crate) async fn answer(
    stream: &mut TcpStream,
    verdict: Result<(), &str>,
) -> Result<(), String> {
    let sent = stream
        .write_all(&verdict_bytes(verdict))
        .await
        .map_err(|e| format!("could not send the verdict: {e}"));
    if verdict.is_err() {
        close_gracefully(stream).await;
    }
    sent
}

/// Tells the initiator why it is refused (if it still listens); returns the reason.
async fn refuse(stream: &mut TcpStream, reason: String) -> String {
    let _ = stream.write_all(&refusal_bytes(&reason)).await;
    close_gracefully(stream).await;
    reason
}

/// Most bytes read and thrown away while closing a refused connection.
const DRAIN_BYTES: usize = 64 << 10;
/// Longest time spent on that.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Sends our end of the stream, then reads what the peer still sends (a little, briefly)
/// before the socket is closed: closing with unread bytes would reset the connection, and the
/// peer would lose the refusal it has not read yet.
pub(crate) async fn close_gracefully(stream: &mut TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0;
        while total < DRAIN_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
}
