//! The PostgreSQL store's own tests, in one test binary (one throwaway cluster, one link):
//! the schema and its functions (`schema.rs`), the records held only while in use (`cache.rs`),
//! faults, TLS and the lock (`faults.rs`), the
//! per-operation budgets (`budgets.rs`) and generic plans (`plans.rs`). The queue suites run on
//! this store too, through `SMP_RELAY_TEST_STORE=postgres` (`.ci/run`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod budgets;
mod cache;
mod faults;
mod plans;
mod schema;
