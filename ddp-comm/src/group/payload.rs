//! Payloads of lengths the receivers do not know: what c10d's `broadcast_object_list`,
//! `all_gather_object`, `gather_object` and `scatter_object_list` do for pickled objects, for
//! bytes the caller encodes (a manifest, a JSON summary, an error text, a rank's own state).
//! The lengths travel first; payloads of different lengths are padded to the longest for one
//! gather or scatter, as c10d does.

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
        let len = payload_sizes("broadcast_bytes", root, &len)?[0];
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

    /// Every rank's `bytes`, of any length, on every rank, by rank.
    ///
    /// # Collective
    /// Every rank calls it. It is one all-gather of the lengths, then one all-gather of the
    /// payloads padded to the longest (skipped when all are empty).
    ///
    /// # Errors
    /// Those of [`ProcessGroup::all_gather`].
    pub fn all_gather_bytes(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let (sizes, longest) = self.exchange_lengths("all_gather_bytes", bytes.len())?;
        if longest == 0 {
            return Ok(vec![Vec::new(); self.world_size()]);
        }
        let mut all = vec![0u8; longest * self.world_size()];
        self.all_gather(&padded(bytes, longest), &mut all)?;
        Ok(unpad(&all, longest, &sizes))
    }

    /// Every rank's `bytes`, of any length, on `root` only, by rank (`None` on the others):
    /// for per-rank payloads too large to send to every rank.
    ///
    /// # Collective
    /// Every rank calls it with the same `root`. It is one all-gather of the lengths, then one
    /// gather of the payloads padded to the longest (skipped when all are empty).
    ///
    /// # Errors
    /// Those of [`ProcessGroup::gather`], a `root` outside the group among them.
    pub fn gather_bytes(&self, bytes: Vec<u8>, root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let (sizes, longest) = self.exchange_lengths("gather_bytes", bytes.len())?;
        let world = self.world_size();
        let is_root = self.rank() == root;
        if longest == 0 {
            self.check_rank("gather_bytes", "root", root)?;
            return Ok(is_root.then(|| vec![Vec::new(); world]));
        }
        let mut all = is_root.then(|| vec![0u8; longest * world]);
        self.gather(&padded(bytes, longest), all.as_deref_mut(), root)?;
        Ok(all.map(|all| unpad(&all, longest, &sizes)))
    }

    /// Gives each rank its own payload of `root`'s `per_rank` (one per rank, of any length;
    /// `None` on the other ranks) and returns this rank's.
    ///
    /// # Collective
    /// Every rank calls it with the same `root`. It is one broadcast of the lengths, then one
    /// scatter of the payloads padded to the longest (skipped when all are empty).
    ///
    /// # Errors
    /// Those of [`ProcessGroup::scatter`]; on every rank, when `root` did not pass one
    /// payload per rank (the root says so before anything else moves, so no rank waits).
    pub fn scatter_bytes(&self, per_rank: Option<Vec<Vec<u8>>>, root: usize) -> Result<Vec<u8>> {
        const OP: &str = "scatter_bytes";
        let world = self.world_size();
        // Slot 0 past the lengths: how many payloads the root had, so that every rank learns
        // of a wrong count together.
        let mut lengths = vec![0i64; world + 1];
        if self.rank() == root {
            let payloads = per_rank.as_deref().unwrap_or_default();
            lengths[0] = payloads.len() as i64;
            for (length, bytes) in lengths[1..].iter_mut().zip(payloads) {
                *length = bytes.len() as i64;
            }
        }
        self.broadcast(&mut lengths, root)?;
        if lengths[0] != world as i64 {
            return Err(CommError::arg(
                OP,
                format!(
                    "rank {root} passed {} payloads for {world} ranks: the root passes \
                     Some(one payload per rank)",
                    lengths[0]
                ),
            ));
        }
        let sizes = payload_sizes(OP, root, &lengths[1..])?;
        let longest = sizes.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Ok(Vec::new());
        }
        let input = per_rank.filter(|_| self.rank() == root).map(|payloads| {
            let mut all = vec![0u8; longest * world];
            for (chunk, bytes) in all.chunks_exact_mut(longest).zip(&payloads) {
                chunk[..bytes.len()].copy_from_slice(bytes);
            }
            all
        });
        let mut mine = vec![0u8; longest];
        self.scatter(input.as_deref(), &mut mine, root)?;
        mine.truncate(sizes[self.rank()]);
        Ok(mine)
    }

    /// Every rank's payload length, by rank, and the longest.
    fn exchange_lengths(&self, op: &'static str, mine: usize) -> Result<(Vec<usize>, usize)> {
        let mut lengths = vec![0i64; self.world_size()];
        self.all_gather(&[mine as i64], &mut lengths)?;
        let sizes = lengths
            .iter()
            .enumerate()
            .map(|(rank, &n)| payload_sizes(op, rank, &[n]).map(|s| s[0]))
            .collect::<Result<Vec<_>>>()?;
        let longest = sizes.iter().copied().max().unwrap_or(0);
        Ok((sizes, longest))
    }
}

/// `lengths` as they travel (`i64`), as sizes; `from` names the rank that sent them.
fn payload_sizes(op: &'static str, from: usize, lengths: &[i64]) -> Result<Vec<usize>> {
    lengths
        .iter()
        .map(|&n| {
            usize::try_from(n)
                .map_err(|_| CommError::arg(op, format!("rank {from} sent the length {n}")))
        })
        .collect()
}

/// `bytes` with zeros up to `longest`.
fn padded(mut bytes: Vec<u8>, longest: usize) -> Vec<u8> {
    bytes.resize(longest, 0);
    bytes
}

/// The payloads of `all` (blocks of `longest` bytes), each cut to its rank's size.
fn unpad(all: &[u8], longest: usize, sizes: &[usize]) -> Vec<Vec<u8>> {
    all.chunks_exact(longest)
        .zip(sizes)
        .map(|(chunk, &n)| chunk[..n].to_vec())
        .collect()
}
