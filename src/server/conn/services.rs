//! The connection's side of `SUBS`/`NSUBS` (`docs/ARCHITECTURE.md` §5, "Services"): the fan-outs
//! that count the service's queues on every owner and make this connection the service's
//! subscriber, and the answers they write (`SOKS`, then `ALLS`). What each owner does for them is
//! `owner/commands/service.rs` and `owner/jobs.rs` (`take_service`); the state owners keep,
//! `owner/services.rs`.

use std::cell::RefCell;
use std::collections::HashSet;

use glommio::channels::local_channel::LocalSender;

use super::dispatch::ServiceJob;
use super::output::{Output, OutputState};
use crate::protocol::command::ServiceRole;
use crate::protocol::error::ErrorType;
use crate::protocol::response::BrokerMsg;
use crate::server::messages::OwnerMsg;
use crate::server::router::{CountHash, Group, Session};
use crate::server::shard::context::ShardContext;

/// `SUBS`/`NSUBS` (simplexmq `Server.hs`, `sharedSubscribeService`): the service's count and ID
/// hash gathered from every owner answer it (`SOKS`, as the block's answer); then every owner
/// makes this connection the service's subscriber and (SUBS) hands it the service's queues'
/// messages, after which `ALLS` follows. A second one on the same connection is answered what
/// the first was, and does nothing else.
pub(super) async fn subscribe_service(
    ctx: &ShardContext,
    info: &Session,
    subscribed: &RefCell<HashSet<ServiceRole>>,
    job: ServiceJob,
    out: &LocalSender<Output>,
    state: &OutputState,
    seq: u64,
) {
    let Some(service) = info.service.as_ref() else {
        return;
    };
    let answer = |msg: BrokerMsg, block_seq: Option<u64>, corr_id: &[u8], entity: &[u8]| {
        let t = crate::server::router::encode(info, corr_id, entity, &msg);
        let _ = out.try_send(Output {
            groups: state.admit(vec![Group::plain(vec![t])], false).kept,
            block_seq,
        });
    };
    let soks = |(count, ids_hash): CountHash| BrokerMsg::Soks { count, ids_hash };
    let key = (service.service_id.clone(), job.role);
    let reply_to = ctx.shard_id;
    if subscribed.borrow().contains(&job.role) {
        // What the connection holds now: its count grew with its service SUBs since, or fell to 0
        // if another connection took the service over.
        let home = ctx.mesh.owner_of(&service.service_id);
        let current = ctx
            .gather_services(Some(home), |round| OwnerMsg::ServiceCurrent {
                key: key.clone(),
                conn: info.conn,
                reply_to,
                round,
            })
            .await
            .unwrap_or((0, [0; 16]));
        answer(soks(current), Some(seq), &job.corr_id, &service.service_id);
        return;
    }
    subscribed.borrow_mut().insert(job.role);
    let counted = ctx
        .gather_services(None, |round| OwnerMsg::ServiceCount {
            key: key.clone(),
            reply_to,
            round,
        })
        .await;
    let Some(counted) = counted else {
        answer(
            BrokerMsg::Err(ErrorType::Internal),
            Some(seq),
            &job.corr_id,
            &service.service_id,
        );
        return;
    };
    let stats = match job.role {
        ServiceRole::Notifier => &ctx.conn_stats.ntf_services,
        _ => &ctx.conn_stats.rcv_services,
    };
    stats.borrow_mut().count_subs(job.expected, counted);
    if let Some((n, h)) = job.expected.filter(|e| e.0 >= 0 && *e != counted) {
        tracing::debug!(
            expected = n,
            counted = counted.0,
            same_hash = h == counted.1,
            "SUBS counts differ"
        );
    }
    answer(soks(counted), Some(seq), &job.corr_id, &service.service_id);
    // A connection that closed meanwhile must not become the subscriber: its owners may have
    // forgotten it already (`OwnerMsg::Closed` was sent when it left the table).
    if !ctx.connections_table.borrow().contains_key(&info.conn.id) {
        return;
    }
    let session = info.clone();
    let taken = ctx
        .gather_services(None, |round| OwnerMsg::ServiceTake {
            key: key.clone(),
            session: session.clone(),
            answered: counted,
            round,
        })
        .await;
    // ALLS follows every MSG of the fold, as the reference's (which writes both to one queue):
    // those the output bound dropped to markers come first, when they are asked for again.
    if taken.is_some() && job.role == ServiceRole::Messaging {
        let alls = crate::server::router::encode(info, b"", b"", &BrokerMsg::Alls);
        if let Some(alls) = state.after_held(alls) {
            ctx.deliver(info.conn, vec![Group::plain(vec![alls])], None);
        }
    }
}
