//! The private-routing destination role (`RFWD` → `RRES`, v8+; simplexmq `Server.hs`,
//! `processForwardedCommand`): a proxy forwards a client's sealed transmission; this relay opens it
//! with the session secret and a per-command secret, executes it as the client's own, and seals the
//! answer back the same way.
//!
//! Everything here is pure (the callers count what is sealed). Which failures are a plain `ERR` to the proxy and which travel inside
//! `RRES` follows the reference's `processForwardedCommand` (`src/Simplex/Messaging/Server.hs`):
//! - plain `ERR`: no session secret (`PROXY BROKER TRANSPORT NO_AUTH`), the `RFWD` body or the inner
//!   `et` failing to open or unpad (`CRYPTO`), a `FwdTransmission` that does not parse (`CMD
//!   SYNTAX`), a batch of more than one transmission, or an answer too large to pad (`BLOCK`);
//! - inside `RRES`: everything about the inner transmission itself: a batch or transmission that
//!   does not parse (`BLOCK`), its command's parse and credential errors, `CMD PROHIBITED` for
//!   anything but SEND, SKEY, LKEY, LGET and RSLV, verification (`AUTH`, `SERVICE`), and the
//!   command's own answers and errors.

use std::sync::Arc;

use crate::crypto::sxbox::{self, cb_nonce};
use crate::protocol::batch::parse_batch;
use crate::protocol::command::{check_credentials, parse_command, Command, Runs};
use crate::protocol::encoding::put_word16;
use crate::protocol::error::TransportError;
use crate::protocol::error::{BrokerError, CommandError, ErrorType, ProxyError};
use crate::protocol::forward::{reverse_nonce, FwdResponse, FwdTransmission, PADDED_PROXIED_LEN};
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    authorized_bytes, encode_server_transmission, parse_transmission, TransmissionError,
};
use crate::protocol::version::AUTH_CMDS;
use crate::server::router::{encode, Forwarded, Session, SessionInfo};

/// The inner transmission, checked as far as the connection checks anything (simplexmq
/// `Protocol.hs` `tDecodeServer` at the forwarded version), with the allowed-command filter on top.
pub struct InnerRequest {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    /// SEND, SKEY, LKEY or LGET.
    pub command: Command,
    pub authorization: Vec<u8>,
    pub service_sig: bool,
    /// Authorized bytes with the proxy↔relay session ID implied.
    pub authorized: Vec<u8>,
}

/// What the connection does with an `RFWD`.
pub enum Decoded {
    /// A plain `ERR` to the proxy, with the `RFWD`'s corrId and an empty entity.
    Plain(ErrorType),
    /// An answer to the client that needs no queue, to be sealed into `RRES`.
    Answer {
        fwd: Box<Forwarded>,
        corr_id: Vec<u8>,
        entity_id: Vec<u8>,
        msg: BrokerMsg,
    },
    /// A command for the owner of its queue; its answer is sealed into `RRES` there.
    Route {
        fwd: Box<Forwarded>,
        request: InnerRequest,
    },
}

fn no_session_secret() -> ErrorType {
    ErrorType::Proxy(ProxyError::Broker(BrokerError::Transport(
        TransportError::NoAuth,
    )))
}

/// Opens and checks an `RFWD` received on `session` (simplexmq `Server.hs`,
/// `processForwardedCommand`).
pub fn decode_rfwd(
    session: &Session,
    session_secret: Option<&[u8; 32]>,
    outer_corr_id: &[u8],
    body: &[u8],
) -> Decoded {
    let Some(sess_secret) = session_secret else {
        return Decoded::Plain(no_session_secret());
    };
    let Ok(fwd_bytes) = sxbox::open(sess_secret, &cb_nonce(outer_corr_id), body) else {
        return Decoded::Plain(ErrorType::Crypto);
    };
    let Ok(ft) = FwdTransmission::parse(&fwd_bytes) else {
        return Decoded::Plain(ErrorType::Cmd(CommandError::Syntax));
    };
    // The forwarded version selects the inner codecs: one this relay does not serve is as
    // unparseable as a malformed FwdTransmission.
    if !crate::protocol::version::SERVER_VERSIONS.contains(ft.version) {
        return Decoded::Plain(ErrorType::Cmd(CommandError::Syntax));
    }
    let server_key = session.server_key.to_bytes();
    let cmd_secret = sxbox::dh(&server_key, &ft.key);
    let nonce = cb_nonce(ft.corr_id);
    let Ok(b) = sxbox::open_padded(&cmd_secret, &nonce, ft.et) else {
        return Decoded::Plain(ErrorType::Crypto);
    };
    let inner = Arc::new(SessionInfo {
        conn: session.conn,
        version: ft.version,
        session_id: session.session_id.clone(),
        server_key: session.server_key.clone(),
        service: None,
    });
    let fwd = Box::new(Forwarded {
        outer_corr_id: outer_corr_id.to_vec(),
        fwd_corr_id: ft.corr_id.to_vec(),
        nonce,
        cmd_secret,
        sess_secret: *sess_secret,
        inner,
    });
    let answer = |fwd, corr_id: &[u8], entity_id: &[u8], e| Decoded::Answer {
        fwd,
        corr_id: corr_id.to_vec(),
        entity_id: entity_id.to_vec(),
        msg: BrokerMsg::Err(e),
    };
    // A batch that does not parse is one failed transmission to the reference, answered inside
    // RRES; a batch of several is refused outright.
    let items = match parse_batch(&b) {
        Ok(items) => items,
        Err(_) => return answer(fwd, b"", b"", ErrorType::Block),
    };
    let [item] = items[..] else {
        return Decoded::Plain(ErrorType::Block);
    };
    let v = ft.version;
    // The session ID stays implied whatever the forwarded version: the reference changes only the
    // version of the proxy session's parameters, and that session is v7+ (it has a hello key).
    let layout = v.max(AUTH_CMDS);
    let t = match parse_transmission(layout, item) {
        Ok(t) => t,
        Err(TransmissionError::Block) => return answer(fwd, b"", b"", ErrorType::Block),
        Err(TransmissionError::BadAuthorization { corr_id, .. }) => {
            return answer(fwd, &corr_id, b"", ErrorType::Block)
        }
    };
    let cmd = match parse_command(v, t.command).and_then(|c| {
        check_credentials(&c, !t.authorization.is_empty(), t.entity_id.is_empty()).map(|_| c)
    }) {
        Ok(c) => c,
        Err(e) => return answer(fwd, t.corr_id, t.entity_id, ErrorType::Cmd(e)),
    };
    match cmd {
        _ if cmd.facts().forwarded && cmd.facts().runs == Runs::Owner => {
            let request = InnerRequest {
                corr_id: t.corr_id.to_vec(),
                entity_id: t.entity_id.to_vec(),
                command: cmd,
                authorization: t.authorization.to_vec(),
                service_sig: t.service_sig.is_some(),
                authorized: authorized_bytes(layout, &session.session_id, t.signed),
            };
            Decoded::Route { fwd, request }
        }
        // The names role is off: RSLV passes the filter and verification (unsigned, no entity)
        // and gets the answer a plain RSLV gets.
        Command::Rslv(_) => Decoded::Answer {
            fwd,
            corr_id: t.corr_id.to_vec(),
            entity_id: t.entity_id.to_vec(),
            msg: super::connection::answer(&cmd),
        },
        _ => answer(
            fwd,
            t.corr_id,
            t.entity_id,
            ErrorType::Cmd(CommandError::Prohibited),
        ),
    }
}

/// The inner answer as the client reads it: encoded at the forwarded version, session ID implied.
fn encode_inner(fwd: &Forwarded, corr_id: &[u8], entity_id: &[u8], msg: &BrokerMsg) -> Vec<u8> {
    let v = fwd.inner.version;
    let mut body = Vec::with_capacity(64);
    msg.encode(v, &mut body);
    let mut t = Vec::with_capacity(body.len() + corr_id.len() + entity_id.len() + 4);
    encode_server_transmission(
        v.max(AUTH_CMDS),
        &fwd.inner.session_id,
        corr_id,
        entity_id,
        &body,
        &mut t,
    );
    t
}

/// The body of `RRES` (simplexmq `Server.hs`, `processForwardedCommand`), or `None` when the answer
/// does not fit the padded length.
pub fn seal_response(
    fwd: &Forwarded,
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &BrokerMsg,
) -> Option<Vec<u8>> {
    let t = encode_inner(fwd, corr_id, entity_id, msg);
    let len = u16::try_from(t.len()).ok()?;
    let mut batch = Vec::with_capacity(t.len() + 3);
    batch.push(1);
    put_word16(&mut batch, len);
    batch.extend_from_slice(&t);
    let r2 = sxbox::seal_padded(
        &fwd.cmd_secret,
        &reverse_nonce(&fwd.nonce),
        &batch,
        PADDED_PROXIED_LEN,
    )
    .ok()?;
    let mut fr = Vec::with_capacity(r2.len() + fwd.fwd_corr_id.len() + 1);
    FwdResponse {
        corr_id: &fwd.fwd_corr_id,
        r2: &r2,
    }
    .encode(&mut fr);
    let n2 = cb_nonce(&fwd.outer_corr_id);
    Some(sxbox::seal(&fwd.sess_secret, &reverse_nonce(&n2), &fr))
}

/// The transmission answering the `RFWD` on the proxy's own session: `RRES` with the `RFWD`'s
/// corrId and an empty entity, or a plain `ERR BLOCK` when the inner answer is too large; and
/// whether it was sealed (the reference's `pMsgFwdsRecv` counts a forwarded command once its
/// answer is sealed, whatever that answer is).
pub fn respond(
    outer: &Session,
    fwd: &Forwarded,
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &BrokerMsg,
) -> (Vec<u8>, bool) {
    let (answer, sealed) = match seal_response(fwd, corr_id, entity_id, msg) {
        Some(efr) => (BrokerMsg::Rres(efr), true),
        None => (BrokerMsg::Err(ErrorType::Block), false),
    };
    (encode(outer, &fwd.outer_corr_id, b"", &answer), sealed)
}

#[cfg(test)]
mod tests {
    use x25519_dalek::StaticSecret;

    use super::*;
    use crate::client::proxy::{batch_of, Destination, ForwardedCommand, InnerResponse};
    use crate::client::rfwd::{open_rres, seal_rfwd};
    use crate::client::{Authorization, CommandBody, Signer};
    use crate::crypto::auth;
    use crate::protocol::command::MsgFlags;
    use crate::protocol::transmission::client_signed_bytes;
    use crate::protocol::version::Version;
    use crate::server::router::ConnRef;

    /// A destination session and the proxy's view of it, sharing one session secret.
    fn sessions(version: Version) -> (Session, [u8; 32], Destination) {
        let server_key = StaticSecret::from([7u8; 32]);
        let proxy_key = [9u8; 32];
        let server_pub = sxbox::x25519_public(&server_key.to_bytes());
        let sess_secret = sxbox::dh(&server_key.to_bytes(), &sxbox::x25519_public(&proxy_key));
        let session = Arc::new(SessionInfo {
            conn: ConnRef { shard: 0, id: 1 },
            version,
            session_id: vec![0x5a; 32],
            server_key,
            service: None,
        });
        let dest = Destination {
            session_id: vec![0x5a; 32],
            server_key: server_pub,
            sess_secret: sxbox::dh(&proxy_key, &server_pub),
        };
        assert_eq!(sess_secret, dest.sess_secret);
        (session, sess_secret, dest)
    }

    fn send(body: &[u8]) -> Command {
        Command::Send {
            flags: MsgFlags::new(false),
            body: body.to_vec(),
        }
    }

    fn ed25519() -> Signer {
        Signer::Ed25519(ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]))
    }

    /// Builds an RFWD body carrying `batch` as a proxy does; returns n2 and the body.
    fn rfwd(dest: &Destination, fc: &ForwardedCommand, batch: &[u8]) -> ([u8; 24], Vec<u8>) {
        let n2 = [0x42u8; 24];
        let fwd = fc.fwd(&fc.seal(batch).unwrap());
        (n2, seal_rfwd(&dest.sess_secret, &n2, &fwd))
    }

    fn one(
        dest: &Destination,
        fc: &ForwardedCommand,
        entity: &[u8],
        cmd: Command,
        a: Authorization,
    ) -> Vec<u8> {
        batch_of(&[fc.transmission(dest, entity, &CommandBody::Cmd(cmd), &a)]).unwrap()
    }

    /// Opens what `respond` produced as the proxy and then the client would.
    fn open(
        session: &Session,
        dest: &Destination,
        fc: &ForwardedCommand,
        n2: &[u8; 24],
        t: &[u8],
    ) -> InnerResponse {
        let raw = parse_transmission(session.version, t).unwrap();
        assert_eq!(raw.corr_id, n2, "RRES carries the RFWD's corrId");
        assert_eq!(raw.entity_id, b"", "RRES has an empty entity");
        let Ok(BrokerMsg::Rres(efr)) = BrokerMsg::parse(session.version, raw.command) else {
            panic!("not RRES: {:?}", String::from_utf8_lossy(raw.command));
        };
        let (corr, r2) = open_rres(&dest.sess_secret, n2, &efr).unwrap();
        assert_eq!(corr, fc.nonce, "FwdResponse echoes the client's corrId");
        assert_eq!(r2.len(), 16 + PADDED_PROXIED_LEN);
        fc.open_response(&r2).unwrap()
    }

    fn answer_of(d: Decoded) -> (Box<Forwarded>, Vec<u8>, Vec<u8>, BrokerMsg) {
        match d {
            Decoded::Answer {
                fwd,
                corr_id,
                entity_id,
                msg,
            } => (fwd, corr_id, entity_id, msg),
            Decoded::Plain(e) => panic!("plain {e:?}"),
            Decoded::Route { .. } => panic!("routed"),
        }
    }

    fn plain_of(d: Decoded) -> ErrorType {
        match d {
            Decoded::Plain(e) => e,
            _ => panic!("not a plain error"),
        }
    }

    #[test]
    fn round_trip_send_at_each_version() {
        for v in [6u16, 7, 8, 11, 16, 18] {
            let (session, secret, dest) = sessions(18);
            let fc = ForwardedCommand::new(v, &dest);
            let signer = ed25519();
            let b = one(
                &dest,
                &fc,
                b"sender-id",
                send(b"hello"),
                Authorization::Sign(signer.clone()),
            );
            let (n2, body) = rfwd(&dest, &fc, &b);
            let Decoded::Route { fwd, request } = decode_rfwd(&session, Some(&secret), &n2, &body)
            else {
                panic!("v{v}: not routed");
            };
            assert_eq!(fwd.inner.version, v);
            assert_eq!(fwd.inner.session_id, session.session_id);
            assert_eq!(fwd.nonce, fc.nonce);
            assert_eq!(request.corr_id, fc.nonce);
            assert_eq!(request.entity_id, b"sender-id");
            assert_eq!(request.command, send(b"hello"));
            assert!(!request.service_sig);
            // What the client signed, with the proxy↔relay session ID implied.
            let signed = client_signed_bytes(
                v,
                &dest.session_id,
                &fc.nonce,
                b"sender-id",
                &send(b"hello").to_bytes(v),
            );
            assert_eq!(request.authorized, signed, "v{v}");
            let a = auth::Authorization::from_bytes(&request.authorization).unwrap();
            assert!(auth::verify(
                &signer.public_key(),
                &a,
                &request.authorized,
                None,
                &request.corr_id
            ));

            let (t, sealed) = respond(
                &session,
                &fwd,
                &request.corr_id,
                &request.entity_id,
                &BrokerMsg::Ok,
            );
            assert!(sealed);
            let r = open(&session, &dest, &fc, &n2, &t);
            assert_eq!(
                r,
                InnerResponse {
                    corr_id: fc.nonce.to_vec(),
                    entity_id: b"sender-id".to_vec(),
                    msg: BrokerMsg::Ok
                },
                "v{v}"
            );
        }
    }

    /// The forwarded version must be one this relay serves (`SERVER_VERSIONS`, 6..=18): outside
    /// it the RFWD is a plain syntax error, as an unparseable FwdTransmission; the bounds route.
    #[test]
    fn forwarded_version_outside_the_server_range_is_a_syntax_error() {
        let (session, secret, dest) = sessions(18);
        for v in [5u16, 21] {
            let fc = ForwardedCommand::new(v, &dest);
            let b = one(&dest, &fc, b"sender-id", send(b"x"), Authorization::None);
            let (n2, body) = rfwd(&dest, &fc, &b);
            assert_eq!(
                plain_of(decode_rfwd(&session, Some(&secret), &n2, &body)),
                ErrorType::Cmd(CommandError::Syntax),
                "v{v}"
            );
        }
        for v in [6u16, 18, 20] {
            let fc = ForwardedCommand::new(v, &dest);
            let b = one(&dest, &fc, b"sender-id", send(b"x"), Authorization::None);
            let (n2, body) = rfwd(&dest, &fc, &b);
            let Decoded::Route { fwd, request } = decode_rfwd(&session, Some(&secret), &n2, &body)
            else {
                panic!("v{v}: not routed");
            };
            assert_eq!(fwd.inner.version, v);
            assert_eq!(request.command, send(b"x"), "v{v}");
        }
    }

    #[test]
    fn x25519_authenticator_is_made_for_the_destination_key() {
        let (session, secret, dest) = sessions(18);
        let fc = ForwardedCommand::new(17, &dest);
        let signer = Signer::X25519([5u8; 32]);
        let b = one(
            &dest,
            &fc,
            b"s",
            send(b"x"),
            Authorization::Sign(signer.clone()),
        );
        let (n2, body) = rfwd(&dest, &fc, &b);
        let Decoded::Route { request, .. } = decode_rfwd(&session, Some(&secret), &n2, &body)
        else {
            panic!("not routed");
        };
        let a = auth::Authorization::from_bytes(&request.authorization).unwrap();
        let sk = session.server_key.to_bytes();
        assert!(auth::verify(
            &signer.public_key(),
            &a,
            &request.authorized,
            Some(&sk),
            &request.corr_id
        ));
    }

    #[test]
    fn plain_errors() {
        let (session, secret, dest) = sessions(18);
        let fc = ForwardedCommand::new(17, &dest);
        let b = one(&dest, &fc, b"s", send(b"x"), Authorization::None);
        let (n2, body) = rfwd(&dest, &fc, &b);
        assert_eq!(
            plain_of(decode_rfwd(&session, None, &n2, &body)),
            no_session_secret()
        );
        // The body sealed for another corrId, and garbage.
        assert_eq!(
            plain_of(decode_rfwd(&session, Some(&secret), &[1u8; 24], &body)),
            ErrorType::Crypto
        );
        assert_eq!(
            plain_of(decode_rfwd(&session, Some(&secret), &n2, &[0u8; 100])),
            ErrorType::Crypto
        );
        // Opens, but is no FwdTransmission.
        let junk = seal_rfwd(&secret, &n2, b"\x18short");
        assert_eq!(
            plain_of(decode_rfwd(&session, Some(&secret), &n2, &junk)),
            ErrorType::Cmd(CommandError::Syntax)
        );
        // et sealed for another key.
        let other = ForwardedCommand::new(17, &dest);
        let fwd = fc.fwd(&other.seal(&b).unwrap());
        let wrong_et = seal_rfwd(&secret, &n2, &fwd);
        assert_eq!(
            plain_of(decode_rfwd(&session, Some(&secret), &n2, &wrong_et)),
            ErrorType::Crypto
        );
        // Two transmissions.
        let t = fc.transmission(
            &dest,
            b"s",
            &CommandBody::Cmd(send(b"x")),
            &Authorization::None,
        );
        let two = batch_of(&[t.clone(), t]).unwrap();
        let (n2, body) = rfwd(&dest, &fc, &two);
        assert_eq!(
            plain_of(decode_rfwd(&session, Some(&secret), &n2, &body)),
            ErrorType::Block
        );
    }

    #[test]
    fn errors_inside_rres() {
        let (session, secret, dest) = sessions(18);
        let fc = ForwardedCommand::new(17, &dest);
        let signer = ed25519();
        // (inner batch, expected corrId, expected entity, expected error)
        type Case = (Vec<u8>, Vec<u8>, Vec<u8>, ErrorType);
        let cases: Vec<Case> = vec![
            // No batch at all: one failed transmission with an empty corrId.
            (vec![0], vec![], vec![], ErrorType::Block),
            (b"\x01\x00\x05ab".to_vec(), vec![], vec![], ErrorType::Block),
            (
                one(
                    &dest,
                    &fc,
                    b"r",
                    Command::Sub,
                    Authorization::Sign(signer.clone()),
                ),
                fc.nonce.to_vec(),
                b"r".to_vec(),
                ErrorType::Cmd(CommandError::Prohibited),
            ),
            // Credentials are checked before the filter.
            (
                one(&dest, &fc, b"r", Command::Sub, Authorization::None),
                fc.nonce.to_vec(),
                b"r".to_vec(),
                ErrorType::Cmd(CommandError::NoAuth),
            ),
            (
                one(&dest, &fc, b"", Command::Ping, Authorization::None),
                fc.nonce.to_vec(),
                vec![],
                ErrorType::Cmd(CommandError::Prohibited),
            ),
            (
                one(
                    &dest,
                    &fc,
                    b"",
                    Command::Rslv("simplex.im".into()),
                    Authorization::None,
                ),
                fc.nonce.to_vec(),
                vec![],
                ErrorType::Name(crate::protocol::error::NameError::NoResolver),
            ),
            (
                batch_of(&[fc.transmission(
                    &dest,
                    b"s",
                    &CommandBody::Raw(b"SEND".to_vec()),
                    &Authorization::None,
                )])
                .unwrap(),
                fc.nonce.to_vec(),
                b"s".to_vec(),
                ErrorType::Cmd(CommandError::Syntax),
            ),
            (
                one(
                    &dest,
                    &fc,
                    b"s",
                    send(b"x"),
                    Authorization::Raw(vec![1; 10]),
                ),
                fc.nonce.to_vec(),
                vec![],
                ErrorType::Block,
            ),
        ];
        for (b, corr, entity, e) in cases {
            let (n2, body) = rfwd(&dest, &fc, &b);
            let (fwd, c, en, msg) = answer_of(decode_rfwd(&session, Some(&secret), &n2, &body));
            assert_eq!(
                (&c, &en, &msg),
                (&corr, &entity, &BrokerMsg::Err(e.clone()))
            );
            let r = open(
                &session,
                &dest,
                &fc,
                &n2,
                &respond(&session, &fwd, &c, &en, &msg).0,
            );
            assert_eq!(r.msg, BrokerMsg::Err(e));
            assert_eq!((r.corr_id, r.entity_id), (corr, entity));
        }
    }

    #[test]
    fn largest_send_fits_the_padded_length() {
        let (session, secret, dest) = sessions(18);
        let fc = ForwardedCommand::new(18, &dest);
        let signer = Signer::Ed448([8u8; 57]);
        let body = vec![b'm'; crate::protocol::version::max_message_length(18)];
        assert_eq!(body.len(), 16048);
        let b = one(
            &dest,
            &fc,
            &[1u8; 24],
            send(&body),
            Authorization::Sign(signer.clone()),
        );
        assert_eq!(
            b.len(),
            PADDED_PROXIED_LEN - 2,
            "exactly what pad(·, 16226) allows"
        );
        let (n2, rfwd_body) = rfwd(&dest, &fc, &b);
        let Decoded::Route { request, .. } = decode_rfwd(&session, Some(&secret), &n2, &rfwd_body)
        else {
            panic!("not routed");
        };
        assert_eq!(request.command, send(&body));
        let a = auth::Authorization::from_bytes(&request.authorization).unwrap();
        assert!(auth::verify(
            &signer.public_key(),
            &a,
            &request.authorized,
            None,
            &request.corr_id
        ));
        // One byte more does not fit.
        let b = one(
            &dest,
            &fc,
            &[1u8; 24],
            send(&[body, vec![b'm']].concat()),
            Authorization::Sign(signer),
        );
        assert!(fc.seal(&b).is_err());
    }

    #[test]
    fn an_answer_too_large_to_pad_is_a_plain_block_error() {
        let (session, secret, dest) = sessions(18);
        let fc = ForwardedCommand::new(17, &dest);
        let b = one(&dest, &fc, b"l", Command::LGet, Authorization::None);
        let (n2, body) = rfwd(&dest, &fc, &b);
        let Decoded::Route { fwd, .. } = decode_rfwd(&session, Some(&secret), &n2, &body) else {
            panic!("not routed");
        };
        let lnk = BrokerMsg::Lnk {
            sender_id: vec![1; 24],
            fixed: vec![2; 8000],
            user: vec![3; 8300],
        };
        let (t, _) = respond(&session, &fwd, &fc.nonce, b"l", &lnk);
        let raw = parse_transmission(18, &t).unwrap();
        assert_eq!(raw.corr_id, n2);
        assert_eq!(
            BrokerMsg::parse(18, raw.command),
            Ok(BrokerMsg::Err(ErrorType::Block))
        );
    }
}
