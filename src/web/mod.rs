//! The operator's web site: the server information page and the link pages (`site.rs`), what the
//! information page says (`info.rs`), and the HTTP they are served with (`http.rs`). The serving
//! itself runs on the shards (`server/web.rs`).

pub mod http;
pub mod info;
pub mod site;
