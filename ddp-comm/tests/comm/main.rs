//! All of this crate's integration tests in one binary: burn is linked once instead of
//! once per file. Each module is one former test file; `cargo test --test comm NAME`
//! filters as before.

mod common;
#[path = "../support/proc_net_tcp.rs"]
mod proc_net_tcp;

mod abort_is_prompt;
mod byte_payloads;
mod failures_are_named;
mod gone_before_connecting;
mod groups_and_init;
mod hello_is_mutual;
mod mesh_flood;
mod mesh_strangers;
mod mpi_selection;
mod reinit_on_one_store;
mod shm_setup;
mod stand_in;
mod store_contract;
mod store_multi_get;
mod store_strangers;
mod watchdog_names_the_stuck;
