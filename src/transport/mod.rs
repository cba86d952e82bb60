//! TLS and block framing shared by the server and the client library.

pub mod block;
pub mod certs;
pub mod identity;
pub mod tls;
pub mod tls_unique;
