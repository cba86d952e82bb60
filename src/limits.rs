//! Named limits.
