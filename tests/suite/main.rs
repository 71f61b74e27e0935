//! The integration tests, one binary (one link instead of twenty): each module is the suite of one part of the
//! injector, as its own documentation says. `cargo test --test suite server::` runs one module. The suites that
//! need a real API server or node (`tests/e2e.rs`, `tests/cluster.rs`) and the allocation count
//! (`tests/allocations.rs`, which installs its own global allocator) are binaries of their own.

#[path = "../common/mod.rs"]
mod common;
/// The reviews the benches send, pathological pods among them.
#[path = "../../benches/support/reviews.rs"]
#[allow(dead_code)]
mod reviews;

mod api_rules;
mod architecture;
mod bounds;
mod cli;
mod docs;
mod engine;
mod hold;
mod inject;
mod leaf_cache;
mod manifests;
mod overlay;
mod pathological;
mod pod_wide;
mod preview;
mod properties;
mod reload;
mod repository;
mod server;
mod tags;
mod templates;
mod validate;
mod workloads;
