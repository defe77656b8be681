//! The job token, and the hello every store and mesh connection starts with.
//!
//! - `hello`: the messages and the HMAC-SHA256 proofs, as pure functions over bytes.
//! - `handshake`: running it over a socket against one total deadline.
//! - `async_respond`: the accepting side on a tokio socket, for event loops.
//! - `pending`: the cap and grace period on hellos still running, for those event loops.
//!
//! Both sides of every connection prove they hold the token without sending it (a
//! challenge-response over fresh nonces from both sides), so neither a stranger nor a replayed
//! recording gets in, and a rank never talks to a server that cannot prove the token either.
//! One token limit ([`MAX_TOKEN_BYTES`]) is checked when a config is used.

mod async_respond;
mod handshake;
mod hello;
mod pending;
mod stranger_log;

pub(crate) use handshake::{HelloError, initiate};
/// The accepting side on a tokio socket (the store's and the mesh listener's event loops).
pub(crate) mod event_loop {
    pub(crate) use super::async_respond::{answer, close_gracefully, respond};
}
pub(crate) use hello::Kind;
pub(crate) use pending::{HelloSlot, PendingHellos};
pub(crate) use stranger_log::{StrangerLog, warn_stranger};

use crate::error::{CommError, Result};

/// Longest job token accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// Checks a configured token's length.
///
/// # Errors
/// [`CommError::InvalidConfig`] naming `what` when the token is longer than
/// [`MAX_TOKEN_BYTES`].
pub(crate) fn check_token(what: &str, token: &[u8]) -> Result<()> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(CommError::config(
            what,
            format!(
                "the job token has {} bytes; at most {MAX_TOKEN_BYTES} are allowed",
                token.len()
            ),
        ));
    }
    Ok(())
}

/// How a config's `Debug` shows its job token: only whether there is one, since the token is
/// a secret (the store's and the group's configs print it the same way).
pub(crate) fn redacted_token(token: &[u8]) -> &'static str {
    if token.is_empty() { "<none>" } else { "<set>" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_over_the_shared_limit_are_config_errors() {
        assert!(check_token("t", &[b'x'; MAX_TOKEN_BYTES]).is_ok());
        let e = check_token(crate::TOKEN_ENV, &[b'x'; MAX_TOKEN_BYTES + 1])
            .expect_err("too long")
            .to_string();
        assert!(
            e.starts_with("DDP_JOB_TOKEN: ") && e.contains("1024"),
            "{e}"
        );
    }
}
