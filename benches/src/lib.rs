//! Benchmarks live in `benches/`; this library holds what they share.
