//! What a connection sees as messages flow, in one test binary: per-socket ordering
//! (`ordering.rs`, O1–O4), batched subscriptions (`batching.rs`), back-pressure
//! (`backpressure.rs`, `docs/ARCHITECTURE.md` §4), events between shards while one is held
//! (`fanout.rs`, §4), private routing's proxy role (`proxy.rs`) and `smp-load` end to end
//! (`load_smoke.rs`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod backpressure;
mod batching;
mod fanout;
mod load_smoke;
mod ordering;
mod proxy;
