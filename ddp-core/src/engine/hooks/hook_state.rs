//! [`CommHookState`]: what a stateful communication hook (PowerSGD's iteration count, random
//! generator, error feedback and Q memory) hands over to be checkpointed and later restored,
//! as PyTorch's `PowerSGDState` is pickled for exact resume. It is binary (error buffers are as
//! large as the gradients), names the hook that wrote it and the hook's format version, so a
//! hook refuses a state that is not its own, and has one self-describing byte encoding
//! ([`to_bytes`](CommHookState::to_bytes)) that checkpoints store per rank.

use crate::error::CommHookStateError;

/// The first bytes of an encoded [`CommHookState`] (the envelope's own format, version 1).
const MAGIC: &[u8; 8] = b"DDPHOOK1";

/// One rank's state of a communication hook: the hook's name, the version of its format and
/// its bytes (the hook's own encoding). From [`CommHook::state`](super::CommHook::state), to
/// [`CommHook::load_state`](super::CommHook::load_state).
#[derive(Clone, PartialEq, Eq)]
pub struct CommHookState {
    hook: String,
    version: u32,
    payload: Vec<u8>,
}

impl std::fmt::Debug for CommHookState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommHookState")
            .field("hook", &self.hook)
            .field("version", &self.version)
            .field("payload_bytes", &self.payload.len())
            .finish()
    }
}

impl CommHookState {
    /// A state of hook `hook` (its [`name`](super::CommHook::name)) in format `version`.
    pub fn new(hook: impl Into<String>, version: u32, payload: Vec<u8>) -> Self {
        CommHookState {
            hook: hook.into(),
            version,
            payload,
        }
    }

    /// The name of the hook that wrote it.
    pub fn hook(&self) -> &str {
        &self.hook
    }

    /// The version of the hook's format.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The hook's bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Checks that this is a state of `hook` in format `version`: what a hook's
    /// [`load_state`](super::CommHook::load_state) asks first.
    ///
    /// # Errors
    /// [`CommHookStateError::OtherHook`], [`CommHookStateError::UnsupportedVersion`].
    pub fn check_written_by(&self, hook: &str, version: u32) -> Result<(), CommHookStateError> {
        if self.hook != hook {
            return Err(CommHookStateError::OtherHook {
                hook: hook.to_string(),
                found: self.hook.clone(),
            });
        }
        if self.version != version {
            return Err(CommHookStateError::UnsupportedVersion {
                hook: hook.to_string(),
                found: self.version,
                supported: version,
            });
        }
        Ok(())
    }

    /// The state as bytes: `DDPHOOK1`, the hook's name (u32 length, UTF-8), the version (u32)
    /// and the payload (u64 length, bytes), little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAGIC.len() + 16 + self.hook.len() + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.hook.len() as u32).to_le_bytes());
        out.extend_from_slice(self.hook.as_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// The state [`to_bytes`](Self::to_bytes) encoded.
    ///
    /// # Errors
    /// [`CommHookStateError::Corrupt`] saying what does not decode.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CommHookStateError> {
        let corrupt = |reason: &str| CommHookStateError::Corrupt {
            hook: "unknown".into(),
            reason: reason.to_string(),
        };
        let rest = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| corrupt("it does not start with DDPHOOK1"))?;
        let (len, rest) = split_u32(rest).ok_or_else(|| corrupt("truncated hook name"))?;
        let (name, rest) =
            split_at(rest, len as usize).ok_or_else(|| corrupt("truncated hook name"))?;
        let hook = std::str::from_utf8(name)
            .map_err(|_| corrupt("the hook name is not UTF-8"))?
            .to_string();
        let (version, rest) = split_u32(rest).ok_or_else(|| corrupt("truncated version"))?;
        let (len, rest) = split_u64(rest).ok_or_else(|| corrupt("truncated payload length"))?;
        let payload = usize::try_from(len)
            .ok()
            .filter(|&n| n == rest.len())
            .map(|_| rest.to_vec())
            .ok_or_else(|| {
                corrupt(&format!(
                    "the payload has {} bytes, its header says {len}",
                    rest.len()
                ))
            })?;
        Ok(CommHookState {
            hook,
            version,
            payload,
        })
    }
}

fn split_at(bytes: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (bytes.len() >= n).then(|| bytes.split_at(n))
}

fn split_u32(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = split_at(bytes, 4)?;
    Some((u32::from_le_bytes(head.try_into().ok()?), rest))
}

fn split_u64(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = split_at(bytes, 8)?;
    Some((u64::from_le_bytes(head.try_into().ok()?), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_truncation_is_named() {
        let state = CommHookState::new("PowerSGD", 3, vec![1, 2, 3, 4, 5]);
        let bytes = state.to_bytes();
        assert_eq!(CommHookState::from_bytes(&bytes).expect("decodes"), state);
        let err = CommHookState::from_bytes(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(
            err.to_string().contains("4 bytes, its header says 5"),
            "{err}"
        );
        let err = CommHookState::from_bytes(b"not a hook state").unwrap_err();
        assert!(err.to_string().contains("DDPHOOK1"), "{err}");
    }

    #[test]
    fn another_hooks_or_versions_state_is_named() {
        let state = CommHookState::new("PowerSGD", 1, Vec::new());
        assert!(state.check_written_by("PowerSGD", 1).is_ok());
        let other = state.check_written_by("fp16", 1).unwrap_err();
        assert!(
            matches!(other, CommHookStateError::OtherHook { .. }),
            "{other}"
        );
        let version = state.check_written_by("PowerSGD", 2).unwrap_err();
        assert!(
            matches!(
                version,
                CommHookStateError::UnsupportedVersion {
                    found: 1,
                    supported: 2,
                    ..
                }
            ),
            "{version}"
        );
    }
}
