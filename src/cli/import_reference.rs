//! `smp-relay store import-reference`: the reference smp-server's data into the empty store of a
//! stopped relay (`store/reference/` reads it, the `store import` path restores it), for an
//! operator who moves from smp-server to this relay on the same data.

use std::path::Path;

use smp_relay::store::reference::{self, Problems, ReferenceSource};
use smp_relay::store::{with_store, StoreKind, StoreSettings};

use super::{lock_stopped, Import, Progress};

/// Problems of each kind listed on stderr; the rest are counted.
const PROBLEMS_SHOWN: usize = 20;

pub fn run(
    settings: &StoreSettings,
    kind: StoreKind,
    from: &Path,
    quiet: bool,
) -> Result<(), String> {
    let data_dir = settings.data_dir.as_path();
    if !from.is_dir() {
        return Err(format!(
            "{} is not a directory; pass the reference's log directory (default /var/opt/simplex) \
             with --from",
            from.display()
        ));
    }
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let _lock = lock_stopped(data_dir, "import writes the store it opens at start")?;
    let data = reference::read_dir(from)?;
    let report = data.report.clone();
    show("skipped (does not parse)", &report.unparseable);
    show(
        "left out (the reference would not apply it)",
        &report.ignored,
    );
    let source = ReferenceSource::new(data.services, data.queues);
    let mut progress = Progress::new(quiet, "imported");
    let imported = with_store(kind, false, Import(settings, kind, source, &mut progress));
    progress.done();
    let imported = imported?;
    if !quiet {
        let messages = match &report.messages_from {
            Some(p) => format!("messages from {}", p.display()),
            None => "no messages".into(),
        };
        let ntfs = match &report.notifications_from {
            Some(p) => format!("notifications from {}", p.display()),
            None => "no notifications".into(),
        };
        eprintln!(
            "smp-relay: imported the reference's data (queues from {}, {messages}, {ntfs}) into \
             the {} store of {}: read {}; written {}; {} lines skipped as unparseable, {} records \
             left out",
            report.store_log.display(),
            kind.name(),
            data_dir.display(),
            imported.read,
            imported.written,
            report.unparseable.total,
            report.ignored.total,
        );
    }
    Ok(())
}

fn show(what: &str, p: &Problems) {
    for problem in p.kept.iter().take(PROBLEMS_SHOWN) {
        eprintln!("smp-relay: {what}: {problem}");
    }
    if p.total > PROBLEMS_SHOWN {
        eprintln!("smp-relay: … and {} more {what}", p.total - PROBLEMS_SHOWN);
    }
}
