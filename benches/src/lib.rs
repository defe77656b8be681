//! Benchmarks for ddp-burn; see `benches/`.
