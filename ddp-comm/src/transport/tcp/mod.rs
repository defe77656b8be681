//! The TCP transport: ring algorithms over non-blocking sockets, connected on demand.
//!
//! - `frame`: the header (fingerprint + payload length) in front of every payload.
//! - `duplex`: the poll-driven engine that sends and receives one step at a time.
//! - `acceptor`: the listener's event loop, the mutual token check (`auth`), rejection of
//!   strangers.
//! - `mesh`: connections made when first needed (the ring neighbours while the group forms).
//! - `algorithms`: the collectives, built from steps.

mod acceptor;
mod algorithms;
mod duplex;
mod failure_watch;
mod frame;
mod mesh;

pub(crate) use algorithms::TcpTransport;
pub(crate) use mesh::MeshSpec;
