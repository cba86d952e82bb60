//! This relay's own counters: the `smprelay_…` families of the metrics file, after the
//! reference's (`metrics::render`). Each is declared once, below — its field, its metric name,
//! and its doc comment, which is the metric's help — and counted where it happens: a store, an
//! owner (`Owner::stats`, its `relay` field) and a shard's connections (`ConnStats`,
//! `server/shard/context.rs`) each keep a [`RelayCounters`] and bump the fields that concern
//! them; a shard's numbers are
//! their sum (`metrics::MetricsSnapshot::relay`). Adding a counter is one line here plus the
//! `+= 1` where it happens.

/// Declares [`RelayCounters`]; see the module comment.
macro_rules! relay_counters {
    ($( $(#[doc = $doc:literal])+ $field:ident => $name:literal; )*) => {
        /// The relay's own counters (see the module comment).
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct RelayCounters {
            $( $(#[doc = $doc])+ pub $field: u64, )*
        }

        impl RelayCounters {
            /// Adds `o`'s counts to these.
            pub fn add(&mut self, o: &RelayCounters) {
                $( self.$field = self.$field.saturating_add(o.$field); )*
            }

            /// Takes a baseline `o` from these.
            pub fn minus(&mut self, o: &RelayCounters) {
                $( self.$field = self.$field.saturating_sub(o.$field); )*
            }

            /// `(metric name, help, value)` of each counter, in declaration order.
            pub fn families(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$( ($name, concat!($($doc),+).trim_start(), self.$field), )*]
            }

            /// Distinct numbers from `from + 1` on (tests that must tell fields apart).
            pub fn numbered(from: u64) -> RelayCounters {
                let mut n = from;
                let mut next = || { n += 1; n };
                RelayCounters { $( $field: next(), )* }
            }
        }
    };
}

relay_counters! {
    /// Store reads of one queue's first message.
    store_peek_first_calls => "smprelay_store_peek_first_calls_total";
    /// Store reads of the first messages of a batch of queues (one per SUB batch).
    store_peek_first_many_calls => "smprelay_store_peek_first_many_calls_total";
    /// Batch verifications of Ed25519 signatures (a block part, or parts of several connections
    /// that reached an owner together).
    verify_batches => "smprelay_verify_batches_total";
    /// Signatures verified in those batches (÷ batches: their mean size).
    verify_batch_signatures => "smprelay_verify_batch_signatures_total";
    /// Batches that failed; their signatures were then verified one by one.
    verify_batch_fallbacks => "smprelay_verify_batch_fallbacks_total";
    /// Connections closed for causing too many failed signature verifications.
    verify_budget_closes => "smprelay_verify_budget_closes_total";
    /// MSG deliveries dropped to a marker while their connection's output was over its bound.
    output_drops => "smprelay_output_drops_total";
    /// Times a connection asked its owners again for what it held (dropped MSGs, more
    /// notifications).
    output_reasks => "smprelay_output_reasks_total";
    /// Connections closed for not reading their output.
    slow_reader_closes => "smprelay_slow_reader_closes_total";
    /// Store writes (messages and queue records).
    store_writes => "smprelay_store_writes_total";
    /// Store deletions (messages and queues).
    store_deletes => "smprelay_store_deletes_total";
    /// Queue records the PostgreSQL store read because it did not hold them (its cache's
    /// misses).
    store_records_read => "smprelay_store_records_read_total";
    /// Queue records the PostgreSQL store let go to stay within its cache (`pg_queue_cache`).
    store_records_evicted => "smprelay_store_records_evicted_total";
    /// Journal groups whose sync failed: they take no change until the relay restarts.
    store_sync_failures => "smprelay_store_sync_failures_total";
    /// Changes refused because their journal group's sync had failed.
    store_sync_refused => "smprelay_store_sync_refused_total";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_is_one_family_with_its_help() {
        let c = RelayCounters::numbered(0);
        let f = c.families();
        assert_eq!(f.len(), 15);
        let mut names: Vec<&str> = f.iter().map(|(n, _, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), f.len(), "a name used twice");
        for (i, (name, help, v)) in f.iter().enumerate() {
            assert!(
                name.starts_with("smprelay_") && name.ends_with("_total"),
                "{name}"
            );
            assert!(
                !help.is_empty() && !help.starts_with(' ') && help.ends_with('.'),
                "{help:?}"
            );
            assert!(!help.contains('\n') && !help.contains("  "), "{help:?}");
            assert_eq!(*v, i as u64 + 1);
        }
        // A multi-line doc comment is one help line.
        assert!(f.iter().any(|(_, h, _)| h.contains(
            "asked its owners again for what it held (dropped MSGs, more notifications)."
        )));
        let mut sum = c;
        sum.add(&c);
        sum.minus(&c);
        assert_eq!(sum, c);
    }
}
