//! The job token, as the store and the TCP mesh check it.
//!
//! One limit for both ([`MAX_TOKEN_BYTES`], checked when a config is used, so a long token is a
//! clear config error rather than a hello the other side refuses) and one comparison, in
//! constant time, so a stranger cannot learn the token byte by byte from response times.

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

/// Whether `a == b`, taking the same time whatever bytes differ (the length is not secret).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from turning the fold into an early-exit comparison.
    std::hint::black_box(diff) == 0
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

    #[test]
    fn equality_is_exact() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(constant_time_eq(b"", b""));
    }
}
