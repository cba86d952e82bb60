//! The owner's side of the shard's inbox: each `OwnerMsg` and control-port request becomes a job
//! of the pipeline (`pipeline.rs`) holding the queues it touches, in the per-queue order
//! (`docs/ARCHITECTURE.md` §2), or is answered at once when it touches no queue's order.

use std::rc::Rc;

use super::pipeline::{Keys, Pipeline};
use super::services::{FoldDone, FoldJob, SERVICE_FOLD_CHUNK};
use super::Owner;
use crate::server::control::request::ControlMsg;
use crate::server::messages::{ConnMsg, OwnerMsg, ShardMsg};
use crate::server::router::{CountHash, ServiceKey, Session};
use crate::server::shard::context::ShardContext;
use crate::server::shard::rounds::shard_stats;
use crate::store::{EntityId, MessageStore, QueueStore, ShardStore};

/// Verifies in one batch the signatures of the block parts among `msgs`, messages the shard's inbox
/// held together, before any of them becomes a job (`Owner::batch_verify_across`).
pub fn verify_across<S: QueueStore + MessageStore>(owner: &Owner<S>, msgs: &mut [ShardMsg]) {
    let mut parts: Vec<(
        crate::server::router::ConnRef,
        &mut [crate::server::router::Request],
    )> = msgs
        .iter_mut()
        .filter_map(|m| match m {
            ShardMsg::Owner(OwnerMsg::Work {
                session, requests, ..
            }) => Some((session.conn, requests.as_mut_slice())),
            _ => None,
        })
        .collect();
    owner.batch_verify_across(&mut parts);
}

/// The owner's messages of the inbox, as jobs of the pipeline (or at once, for what touches no
/// queue's order). The owner simulation (`sim.rs`) goes through here too.
pub fn owner_job<S: QueueStore + MessageStore + 'static>(
    owner: &Rc<Owner<S>>,
    pipeline: &Pipeline,
    msg: OwnerMsg,
) {
    let o = owner.clone();
    match msg {
        OwnerMsg::Work {
            session,
            block_seq,
            requests,
        } => {
            let keys = o.work_keys(&requests);
            let conn = session.conn;
            pipeline.submit(
                keys,
                Some(conn),
                Box::pin(async move { o.process(session, block_seq, requests).await }),
            );
        }
        OwnerMsg::Closed { conn } => pipeline.closed(conn, move || o.connection_closed(conn)),
        OwnerMsg::Redeliver { conn, items } => {
            let rids: Vec<Vec<u8>> = items.iter().filter_map(|i| o.pending_queue(i)).collect();
            pipeline.submit(
                Keys::of(rids.iter().map(Vec::as_slice)),
                Some(conn),
                Box::pin(async move { o.redeliver(conn, items).await }),
            );
        }
        OwnerMsg::ReturnNtfs { notifier_id, ntfs } => {
            let rid = o.notifier_queue(&notifier_id);
            pipeline.submit(
                Keys::of(rid.as_deref()),
                None,
                Box::pin(async move { o.store_ntfs(&notifier_id, ntfs).await }),
            );
        }
        #[cfg(feature = "test-kit")]
        OwnerMsg::RegisterSub {
            session,
            recipient_id,
            epoch,
        } => o.register_sub(&session, &recipient_id, epoch),
        OwnerMsg::ServiceCount {
            key,
            reply_to,
            round,
        } => {
            let part = o.services.count(&key);
            o.mesh.send(reply_to, ConnMsg::ServicePart { round, part });
        }
        OwnerMsg::ServiceTake {
            key,
            session,
            answered,
            round,
        } => take_service(o, pipeline, key, session, answered, round),
        OwnerMsg::ServiceSubscribed {
            key,
            session,
            hash,
            newly,
        } => o.service_subscribed(key, session, hash, newly),
        OwnerMsg::ServiceDropped { key, hash } => o.service_dropped(&key, hash),
        OwnerMsg::ServiceSwitch { key, session } => o.service_switch(&key, &session),
        OwnerMsg::ServiceCurrent {
            key,
            conn,
            reply_to,
            round,
        } => {
            let part = o.services.current(&key, conn);
            o.mesh.send(reply_to, ConnMsg::ServicePart { round, part });
        }
        OwnerMsg::ConnSubs {
            conn,
            reply_to,
            round,
        } => {
            let part = (o.subscriptions_of(conn) as i64, [0; 16]);
            o.mesh.send(reply_to, ConnMsg::ServicePart { round, part });
        }
        OwnerMsg::Tick => {
            o.sweep_ntf_queues();
            expire(o, pipeline, None)
        }
        OwnerMsg::ExpireNow { done } => expire(o, pipeline, Some(done)),
    }
}

/// The control port's requests (`server/control/`): numbers and connections are answered at once;
/// a queue operation is a job holding its queue, in the per-queue order like any command on it.
pub fn control_job<S: ShardStore>(
    ctx: &ShardContext,
    owner: &Rc<Owner<S>>,
    pipeline: &Pipeline,
    msg: ControlMsg,
) {
    match msg {
        ControlMsg::Stats { reply } => {
            let _ = reply.try_send(Box::new(shard_stats(ctx, owner)));
        }
        ControlMsg::Clients { reply } => {
            let by_conn = owner.by_conn.borrow();
            let subs = by_conn
                .iter()
                .map(|(c, e)| ((c.shard, c.id), e.subs.len(), e.ntf_subs.len()))
                .filter(|(_, q, n)| q + n > 0)
                .collect();
            let part = crate::server::control::shard_clients(
                ctx,
                subs,
                owner.subs.borrow().len(),
                owner.ntf_subs.borrow().len(),
            );
            let _ = reply.try_send(part);
        }
        // A job over every queue, so that no operation is halfway through what is saved.
        ControlMsg::Save { reply } => {
            let o = owner.clone();
            let settings = crate::server::store_settings(&ctx.config);
            let groups = crate::server::router::groups_of_shard(ctx.shard_id, ctx.mesh.shards());
            pipeline.submit(
                Keys::Everything,
                None,
                Box::pin(async move {
                    let _ = reply.try_send(o.store.save_running(&settings, &groups));
                }),
            );
        }
        ControlMsg::Queue {
            recipient_id,
            op,
            reply,
        } => {
            let o = owner.clone();
            pipeline.submit(
                Keys::of([recipient_id.as_slice()]),
                None,
                Box::pin(async move {
                    let _ = reply.try_send(o.control_queue(&recipient_id, op).await);
                }),
            );
        }
    }
}

/// The periodic expiration (`done`: told when it has run). On a store that never waits, one job
/// over every queue; on one that waits, a job per `EXPIRE_QUEUES_PER_JOB` queues that may hold
/// messages, each on those queues only, and one for the notifications, so that no job holds the
/// whole shard while the database works (`docs/ARCHITECTURE.md` §2).
fn expire<S: QueueStore + MessageStore + 'static>(
    o: Rc<Owner<S>>,
    pipeline: &Pipeline,
    done: Option<flume::Sender<()>>,
) {
    if !o.store.waits() {
        pipeline.submit(
            Keys::Everything,
            None,
            Box::pin(async move {
                o.expire().await;
                if let Some(d) = done {
                    let _ = d.send(());
                }
            }),
        );
        return;
    }
    let candidates = o.store.expiry_candidates();
    let chunks: Vec<Vec<crate::store::EntityId>> = candidates
        .chunks(crate::limits::EXPIRE_QUEUES_PER_JOB)
        .map(<[crate::store::EntityId]>::to_vec)
        .collect();
    // Jobs left, and `done` told when the last one ends.
    let left = Rc::new(std::cell::Cell::new(chunks.len() + 1));
    let done = Rc::new(std::cell::RefCell::new(done));
    let finish = move || {
        left.set(left.get() - 1);
        if left.get() == 0 {
            if let Some(d) = done.borrow_mut().take() {
                let _ = d.send(());
            }
        }
    };
    for chunk in chunks {
        let (o, finish) = (o.clone(), finish.clone());
        pipeline.submit(
            Keys::of(chunk.iter().map(|r| &r[..])),
            None,
            Box::pin(async move {
                o.expire_queues(&chunk).await;
                finish();
            }),
        );
    }
    pipeline.submit(
        Keys::Queues(Vec::new()),
        None,
        Box::pin(async move {
            o.expire_ntfs().await;
            finish();
        }),
    );
}

/// `SUBS`/`NSUBS` on this owner (`OwnerMsg::ServiceTake`): the connection becomes the service's
/// subscriber at once, then the service's queues are folded in jobs of `SERVICE_FOLD_CHUNK`,
/// each holding its queues (their order with SENDs, ACKs and SUBs is the per-queue order, §2);
/// the connection's shard hears when the last has ended.
fn take_service<S: QueueStore + MessageStore + 'static>(
    o: Rc<Owner<S>>,
    pipeline: &Pipeline,
    key: ServiceKey,
    session: Session,
    answered: CountHash,
    round: u64,
) {
    let home = o.mesh.owner_of(&key.0) == o.shard;
    let (queues, prev) = o.take_service(&key, &session, answered, home);
    let reply_to = session.conn.shard;
    let mesh = o.mesh.clone();
    let chunks: Vec<Vec<EntityId>> = queues
        .chunks(SERVICE_FOLD_CHUNK)
        .map(<[EntityId]>::to_vec)
        .collect();
    let done = FoldDone::new(chunks.len(), move || {
        mesh.send(
            reply_to,
            ConnMsg::ServicePart {
                round,
                part: (0, [0; 16]),
            },
        )
    });
    for chunk in chunks {
        let (o, key, session) = (o.clone(), key.clone(), session.clone());
        let job = FoldJob(done.clone());
        pipeline.submit(
            Keys::of(chunk.iter().map(Vec::as_slice)),
            Some(session.conn),
            Box::pin(async move {
                match key.1 {
                    crate::protocol::command::ServiceRole::Notifier => {
                        o.fold_ntf_chunk(&key, &session, chunk).await
                    }
                    _ => o.fold_service_chunk(&key, &session, prev, chunk).await,
                }
                drop(job);
            }),
        );
    }
}
