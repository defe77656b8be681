//! The TCP transport: ring algorithms over a full mesh of non-blocking sockets.
//!
//! - `frame`: the header (fingerprint + payload length) in front of every payload.
//! - `duplex`: the poll-driven engine that sends and receives one step at a time.
//! - `mesh`: connection setup, the mutual token check (`auth`), rejection of strangers.
//! - `algorithms`: the collectives, built from steps.

mod algorithms;
mod duplex;
mod frame;
mod mesh;

pub(crate) use algorithms::TcpTransport;
pub(crate) use mesh::MeshSpec;
