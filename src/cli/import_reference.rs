//! `smp-relay store import-reference`: the reference smp-server's data into the empty store of a
//! stopped relay (`store/reference/` reads it, the `store import` path restores it), for an
//! operator who moves from smp-server to this relay on the same data.

use std::path::Path;

use smp_relay::store::reference::{self, Problems, ReferenceSource};
use smp_relay::store::services::Services;
use smp_relay::store::{with_store, ShardStore, StoreKind, StoreSettings, WithStore};

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
    smp_relay::store::create_private_dir(data_dir)
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

/// `store export-reference`: the stopped relay's store as the reference's files in `to`.
pub fn export(
    settings: &StoreSettings,
    kind: Option<StoreKind>,
    to: &Path,
    quiet: bool,
) -> Result<(), String> {
    let data_dir = settings.data_dir.as_path();
    let kind = kind
        .or_else(|| StoreKind::found_in(data_dir))
        .ok_or_else(|| format!("{} holds no store to export", data_dir.display()))?;
    let _lock = lock_stopped(data_dir, "export reads the store it saves at a clean stop")?;
    let mut progress = Progress::new(quiet, "exported");
    let report = with_store(
        kind,
        false,
        ExportReference(settings, kind, to, &mut progress),
    );
    progress.done();
    let report = report?;
    if !report.over_quota.is_empty() {
        eprintln!(
            "smp-relay: {} queues hold more than the reference's {} messages; its start keeps \
             the first {} of each (e.g. the queue {})",
            report.over_quota.len(),
            reference::export::REFERENCE_QUOTA,
            reference::export::REFERENCE_QUOTA,
            report.over_quota[0]
        );
    }
    if !quiet {
        eprintln!(
            "smp-relay: exported {} from the {} store of {} as the reference smp-server's files \
             in {} (start it with store_queues and store_messages = memory)",
            report.counts,
            kind.name(),
            data_dir.display(),
            to.display()
        );
    }
    Ok(())
}

/// Opens every group of the stopped relay's store and its services, and writes the reference's
/// files; the store is dropped without `close` (nothing changed).
struct ExportReference<'a>(&'a StoreSettings, StoreKind, &'a Path, &'a mut Progress);

impl WithStore for ExportReference<'_> {
    type Output = Result<reference::export::ExportReport, String>;
    fn run<S: ShardStore>(self) -> Self::Output {
        let ExportReference(settings, kind, to, progress) = self;
        let store = S::open_offline(settings)?;
        let services = Services::new(kind, settings);
        services.load()?;
        futures_lite::future::block_on(reference::export::export(
            &store,
            &services.all(),
            to,
            &mut |c| progress.update(c),
        ))
    }
}
