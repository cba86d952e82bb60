//! Delivery under concurrency and crashes, in one test binary: the races (`races.rs`, T1 of
//! `docs/ARCHITECTURE.md` §3), the seeded invariant runs (`invariants.rs`, I1–I5), kills under load
//! (`crash.rs`) and services (`services.rs`). These are the tests besides the queue suites that
//! `.ci/run` runs again on the PostgreSQL store, so the binary holds exactly them; the T1 variant
//! step runs `races::t1_` here with `SMP_RELAY_TEST_LATE_REGISTRATION=1`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod crash;
mod invariants;
mod races;
mod services;
