//! Securing by the sender and short links: SKEY, LKEY, LGET (sender side), LSET, LDEL (recipient
//! side) (simplexmq `Server.hs`, `Protocol.hs`).

use super::{err, service_refusal};
use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::{Command, QueueMode};
use crate::protocol::error::ErrorType;
use crate::protocol::response::BrokerMsg;
use crate::server::directory::IdSpace;
use crate::server::owner::{Owner, Turn};
use crate::server::router::{Request, Session};
use crate::store::{MessageStore, QueueLink, QueueRec, QueueStore};

impl<S: QueueStore + MessageStore> Owner<S> {
    /// SKEY (by sender ID), LKEY and LGET (by link ID).
    pub(super) async fn sender_link_command(
        &self,
        session: &Session,
        req: &Request,
        _turn: &mut Turn,
    ) -> BrokerMsg {
        let q = match self.lookup(session, req) {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        if let Some(e) = service_refusal(req) {
            return err(e);
        }
        match &req.command {
            Command::SKey(k) | Command::LKey(k) => {
                // Only a messaging queue whose sender key is unset or this one may be secured by its
                // sender; anything else is verified against a dummy key, then refused.
                let allowed = q.queue_mode == Some(QueueMode::Messaging)
                    && q.sender_key.as_ref().is_none_or(|s| s == k);
                if !allowed {
                    self.dummy_verify(session, req);
                    return err(ErrorType::Auth);
                }
                if !self.verify_with(session, req, k) {
                    return err(ErrorType::Auth);
                }
                let q = match self.queue_wrapper(q).await {
                    Ok(q) => q,
                    Err(e) => return err(e),
                };
                let q = match self.secure(q, k.clone()).await {
                    Ok(q) => q,
                    Err(e) => return err(e),
                };
                if matches!(req.command, Command::LKey(_)) {
                    link_data(&q)
                } else {
                    BrokerMsg::Ok
                }
            }
            Command::LGet => {
                if !q.is_contact() {
                    return err(ErrorType::Auth);
                }
                match self.queue_wrapper(q).await {
                    Ok(q) => link_data(&q),
                    Err(e) => err(e),
                }
            }
            _ => err(ErrorType::Internal),
        }
    }

    async fn secure(&self, mut q: QueueRec, k: PublicAuthKey) -> Result<QueueRec, ErrorType> {
        if q.sender_key.is_none() {
            q.sender_key = Some(k);
            self.update(q.clone()).await?;
            self.stats.borrow_mut().queues_secured += 1;
        }
        Ok(q)
    }

    /// LSET: sets or updates the short-link data; the fixed part cannot change, nor the link ID,
    /// and a link ID of another queue cannot be taken.
    pub(super) async fn lset(
        &self,
        mut q: QueueRec,
        link_id: Vec<u8>,
        fixed: Vec<u8>,
        user: Vec<u8>,
    ) -> BrokerMsg {
        if q.is_secured_messaging() {
            return err(ErrorType::Auth);
        }
        let rid = q.recipient_id.clone();
        match &q.link {
            Some(l) if l.link_id != link_id || l.fixed != fixed => return err(ErrorType::Auth),
            Some(_) => {}
            None => {
                if !self.directory.insert(IdSpace::Link, &link_id, &rid) {
                    return err(ErrorType::Auth);
                }
            }
        }
        let had_link = q.link.is_some();
        q.link = Some(Box::new(QueueLink {
            link_id: link_id.clone(),
            fixed,
            user,
        }));
        match self.update(q).await {
            Ok(()) => BrokerMsg::Ok,
            Err(e) => {
                if !had_link {
                    self.directory.remove(IdSpace::Link, &link_id, &rid);
                }
                err(e)
            }
        }
    }

    /// LDEL: removes the link and its data; OK when there is none.
    pub(super) async fn ldel(&self, mut q: QueueRec) -> BrokerMsg {
        let Some(l) = q.link.take() else {
            return BrokerMsg::Ok;
        };
        let rid = q.recipient_id.clone();
        match self.update(q).await {
            Ok(()) => {
                self.directory.remove(IdSpace::Link, &l.link_id, &rid);
                BrokerMsg::Ok
            }
            Err(e) => err(e),
        }
    }
}

fn link_data(q: &QueueRec) -> BrokerMsg {
    match &q.link {
        Some(l) => BrokerMsg::Lnk {
            sender_id: q.sender_id.clone(),
            fixed: l.fixed.clone(),
            user: l.user.clone(),
        },
        None => err(ErrorType::Auth),
    }
}
