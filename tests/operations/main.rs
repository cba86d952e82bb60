//! What an operator does and sees, in one test binary: the command line (`cli.rs`), the control
//! port (`control_port.rs`), statistics (`stats.rs`), the move from smp-server (`drop_in.rs`,
//! `reference_import.rs`), store export and import (`store_transfer.rs`), the journal store on
//! disk (`journal_*.rs`, `disk_full.rs`), what the repository ships (`repository.rs`) and the
//! operator's web site in a browser (`web_page.rs`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../reference_data/mod.rs"]
mod reference_data;
#[path = "../support/mod.rs"]
mod support;

mod cli;
mod control_port;
mod disk_full;
mod drop_in;
mod journal_compaction;
mod journal_recovery;
mod journal_shards;
mod reference_import;
mod repository;
mod stats;
mod store_transfer;
mod web_page;
