//! The rank-0 checkpoint format: rank 0 writes the whole model, optimizer state and training
//! state as one checkpoint directory ([`FullCheckpointer`]), and on resume reads and
//! broadcasts it, so no shared filesystem is needed. The directory handling, durability and
//! collectives under it are the [storage layer](super::storage), shared with
//! [sharded checkpoints](super::sharded).
//!
//! - `checkpointer.rs`: [`FullCheckpointer`], its save, loads, rewind and listing.
//! - `writer.rs`: one checkpoint written atomically (files, manifest, rename, `latest`).
//! - `reader.rs`: what a valid checkpoint of this format is, and the search for one.
//! - `restore.rs`: a verified checkpoint loaded into the model and optimizer on every rank.

mod checkpointer;
mod reader;
mod restore;
mod writer;

pub use checkpointer::FullCheckpointer;
pub(crate) use reader::read_one;
pub(crate) use writer::write_checkpoint;
