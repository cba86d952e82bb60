//! TLS and block framing shared by the server and the client library.
