//! The queue suites, in one test binary: the reference's queue scenarios (`queue_*.rs`), the
//! syntax table (`syntax.rs`), blocked queues (`block.rs`), private routing's destination role
//! (`private_routing.rs`), the configuration file (`config.rs`) and SMP over WebSocket
//! (`websocket.rs`). `.ci/run` runs this binary again on 2 shards, on the memory store and on the
//! PostgreSQL store (`SMP_RELAY_TEST_CORES`, `SMP_RELAY_TEST_STORE`, `tests/common`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod block;
mod config;
mod private_routing;
mod queue_bad_input;
mod queue_blocking;
mod queue_expiry;
mod queue_lifecycle;
mod queue_links;
mod queue_messages;
mod queue_notifications;
mod queue_persistence;
mod queue_versions;
mod syntax;
mod websocket;
