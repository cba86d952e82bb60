//! The load generator behind `smp-load` (issue 5): the subscription scenarios (storm,
//! individual, displace, idle; see `scenario.rs`; a service's SUBS, `service_subs.rs`; the
//! reconnect storm after a restart, `reconnect.rs`) measured against a relay running as a separate
//! process, with its CPU and memory read from `/proc`, and the crypto floor the figures are
//! compared with.

pub mod creds;
pub mod floor;
pub mod proc;
pub mod reconnect;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod service_subs;
