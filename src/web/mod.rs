//! The operator's web site: the server information page and the link pages (`site.rs`), what the
//! information page says (`info.rs`), and the HTTP they are served with (`http.rs`). The serving
//! itself runs on the shards (`server/web.rs`).

pub mod http;
pub mod info;
pub mod site;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What the shards share of the web site: the site, and the connections open on its own ports.
#[derive(Default)]
pub struct WebShared {
    /// The generated site; `None` when `[WEB] static_path` is not set.
    pub site: Option<Arc<site::Site>>,
    /// Connections open on the site's own ports, over all shards.
    open: AtomicUsize,
}

impl WebShared {
    pub fn new(site: Option<site::Site>) -> WebShared {
        WebShared {
            site: site.map(Arc::new),
            open: AtomicUsize::new(0),
        }
    }

    /// A new connection counted until the returned guard is dropped; `None` when `max` are open.
    pub fn admit(this: &Arc<WebShared>, max: usize) -> Option<Counted> {
        if this.open.fetch_add(1, Ordering::AcqRel) >= max {
            this.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Counted(this.clone()))
    }
}

/// A connection counted in `WebShared::open` until dropped.
pub struct Counted(Arc<WebShared>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}
