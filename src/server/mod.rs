//! The relay: shards, listeners, connections.
