//! Payloads of a length only the root knows: what c10d's `broadcast_object_list` does for
//! pickled objects, for bytes the caller encodes (a manifest, a JSON summary, an error text).

use super::ProcessGroup;
use crate::error::{CommError, Result};

impl ProcessGroup {
    /// Sends `root`'s `bytes` to every rank and returns them there; the other ranks need not
    /// know the length (it travels first), and their own `bytes` are ignored: pass `Vec::new()`.
    ///
    /// # Collective
    /// Every rank calls it with the same `root`. It is two broadcasts (one when the payload is
    /// empty), in the group's order like any other collective.
    ///
    /// # Errors
    /// Those of [`ProcessGroup::broadcast`]; a length this machine cannot address.
    pub fn broadcast_bytes(&self, bytes: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        let mut len = [bytes.len() as i64];
        self.broadcast(&mut len, root)?;
        let len = usize::try_from(len[0]).map_err(|_| {
            CommError::arg(
                "broadcast_bytes",
                format!("rank {root} sent the length {}", len[0]),
            )
        })?;
        let mut buf = if self.rank() == root {
            bytes
        } else {
            vec![0u8; len]
        };
        if len > 0 {
            self.broadcast(&mut buf, root)?;
        }
        Ok(buf)
    }
}
