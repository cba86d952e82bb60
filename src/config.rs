//! Settings of the relay.
