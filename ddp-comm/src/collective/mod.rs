//! What a collective is, independent of how it travels.
//!
//! - [`Fingerprint`]: the description every frame carries (sequence number, op, element type,
//!   count, root), so ranks that disagree fail with both descriptions instead of hanging.
//! - [`schedule`]: the pure arithmetic of ring algorithms (segment ranges, which segment moves at
//!   which step), unit-tested without sockets.
//!
//! # Ordering
//! Every rank of a group must issue the same collectives in the same order. The sequence number
//! in the fingerprint is how a violation is caught.

mod fingerprint;
pub(crate) mod schedule;

pub(crate) use fingerprint::{CollectiveKind, Fingerprint};
