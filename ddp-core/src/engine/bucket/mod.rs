//! Gradient buckets: parameters grouped so that one all-reduce moves many small gradients.
//!
//! - `assign.rs`: `assign_buckets`, the pure grouping rule (caps, small first bucket).
//! - `caps.rs`: the caps, lowered for small models so that they still form several buckets.
//! - `layout.rs`: which bucket each parameter's gradient belongs to.
//!
//! Parameters fill buckets in reverse registration order at first (the order backward usually
//! produces them), then, after the first iteration, in the order their gradients actually
//! arrived on rank 0, which every rank adopts so that all ranks launch the same all-reduces in
//! the same order.

mod assign;
mod caps;
mod layout;

pub(crate) use caps::BucketCaps;
pub(crate) use layout::BucketLayout;
