//! Elastic jobs (`--nnodes MIN:MAX`, `--rdzv-backend c10d` or `etcd`): this node's launcher joins
//! rendezvous rounds ([`round`]) over a [`backend::RendezvousBackend`], runs its workers with
//! the round's world size and ranks, and when the round ends (a node failed, died, left, or a
//! new one asked in) stops them and joins the next round. The workers resume from their
//! latest checkpoint; the launcher only restarts them.

mod agent;
mod backend;
#[cfg(feature = "etcd")]
mod etcd_backend;
#[cfg(feature = "etcd")]
mod etcd_heartbeat;
#[cfg(feature = "etcd")]
mod etcd_runtime;
mod members;
mod round;
mod store_backend;

pub(crate) use agent::run_elastic;
