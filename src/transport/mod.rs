//! TLS, block framing and the WebSocket layout, shared by the server and the client library.

pub mod block;
pub mod certs;
pub mod identity;
pub mod reissue;
pub mod service_cert;
pub mod tls;
pub mod tls_chacha;
pub mod tls_unique;
pub mod websocket;
