//! The journal store: byte-level, memory-mapped segment files per partition group.
//!
//! This crate is a placeholder until the journal issue lands; it fixes the constants that reach the
//! disk so that the relay and the inspection tool agree on them from the start.

/// Number of journal groups; partition `p` lives in group `p mod JOURNAL_GROUPS`.
pub const JOURNAL_GROUPS: u32 = 64;
