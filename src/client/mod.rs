//! SMP client library: connect, handshake at a chosen version, send batches, match responses by corrId.
