//! smp-relay: a thread-per-core SimpleX Messaging Protocol relay.
//!
//! `protocol` and `crypto` are pure (no I/O); `transport` adds TLS and block framing; `server` runs the
//! shards; `client` is the SMP client library used by the tests and the load generator.

pub mod client;
pub mod clock;
pub mod config;
pub mod counters;
pub mod crypto;
pub mod ini;
pub mod limits;
pub mod load;
pub mod log_limit;
pub mod metrics;
pub mod protocol;
pub mod server;
pub mod settings;
pub mod stats_file;
pub mod store;
pub mod transport;
pub mod web;
