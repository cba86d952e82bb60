//! SMP relay protocol versions (simplexmq `Transport.hs`): the named constants every codec
//! switches on, and the version range exchanged in the handshake.

use super::encoding::{put_word16, DResult, DecodeError, Reader};

/// An SMP relay protocol version (`VersionSMP`), a Word16 on the wire.
pub type Version = u16;

/// Baseline: subscribe mode in `NEW`, explicit session id in transmissions, signatures only.
pub const SUB_MODE: Version = 6;
/// Server hello carries the signed session key; session id implied; X25519 authenticators.
pub const AUTH_CMDS: Version = 7;
/// `PRXY`/`PFWD`/`RFWD`/`PKEY`/`PRES`/`RRES`; max message 16064.
pub const SENDING_PROXY: Version = 8;
/// `SKEY`; `NEW` basic auth becomes `Maybe` plus `Bool sndSecure`; `IDS` gains the Bool.
pub const SND_AUTH_KEY: Version = 9;
/// `DELD` (older sessions get `END`).
pub const DELETED_EVENT: Version = 10;
/// Transport block encryption; max message 16048.
pub const ENCRYPTED_BLOCK: Version = 11;
/// `ERR BLOCKED` (older sessions get `ERR AUTH`).
pub const BLOCKED_ENTITY: Version = 12;
/// `proxyServer` Bool in the client hello.
pub const PROXY_SERVER_HANDSHAKE: Version = 14;
/// `NEW` queue request data, `IDS` queue mode and link id, short-link commands.
pub const SHORT_LINKS: Version = 15;
/// Client service in the hello, service-signature slot, `SOK`, `IDS` service id.
pub const SERVICE_CERTS: Version = 16;
/// `NEW`/`IDS` notifier credentials.
pub const NEW_NTF_CREDS: Version = 17;
/// `BLOCKED` may carry a client notice.
pub const CLIENT_NOTICES: Version = 18;
/// `SUBS`/`NSUBS` count and hash, `SOKS`/`ENDS` hash, `ALLS`.
pub const RCV_SERVICE: Version = 19;
/// `RSLV`/`RNAME`, `ERR NAME`.
pub const NAMES: Version = 20;
/// The web client's identity proof in the server hello comes with version 19 too (simplexmq
/// `Transport.hs`, `webClientSMPVersion`).
pub const WEB_PROOF: Version = RCV_SERVICE;

/// The lowest version any current peer speaks, and the only one legacy (no-ALPN) clients get.
pub const MIN_VERSION: Version = SUB_MODE;
/// The highest version whose wire forms these codecs implement.
pub const CURRENT_VERSION: Version = NAMES;

/// An inclusive version range (`VersionRange`: Word16 min, Word16 max, min <= max).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionRange {
    pub min: Version,
    pub max: Version,
}

/// What this relay advertises to clients that negotiated ALPN: every version whose obligations it
/// meets, up to 20 (v19: service counts and hashes; v20: `RSLV`, answered `ERR NAME NO_RESOLVER`
/// without a names resolver, as the reference does).
pub const SERVER_VERSIONS: VersionRange = VersionRange { min: 6, max: 20 };
/// What a client without ALPN is offered (simplexmq `Transport.hs`).
pub const LEGACY_SERVER_VERSIONS: VersionRange = VersionRange { min: 6, max: 6 };
/// What our client library accepts (`supportedClientSMPRelayVRange`).
pub const CLIENT_VERSIONS: VersionRange = VersionRange {
    min: MIN_VERSION,
    max: CURRENT_VERSION,
};
/// Versions usable end-to-end through a proxy (`proxiedSMPRelayVRange`).
pub const PROXIED_VERSIONS: VersionRange = VersionRange {
    min: SENDING_PROXY,
    max: CURRENT_VERSION,
};

impl VersionRange {
    /// `None` when `min > max`, which the wire format forbids.
    pub const fn new(min: Version, max: Version) -> Option<Self> {
        if min <= max {
            Some(VersionRange { min, max })
        } else {
            None
        }
    }

    pub const fn contains(&self, v: Version) -> bool {
        self.min <= v && v <= self.max
    }

    /// The common versions, `None` if there are none.
    pub fn intersect(&self, other: &VersionRange) -> Option<VersionRange> {
        VersionRange::new(self.min.max(other.min), self.max.min(other.max))
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        put_word16(out, self.min);
        put_word16(out, self.max);
    }

    pub fn decode(r: &mut Reader<'_>) -> DResult<Self> {
        let save = r.clone();
        let min = r.word16()?;
        let max = r.word16()?;
        VersionRange::new(min, max).ok_or_else(|| {
            *r = save;
            DecodeError
        })
    }
}

/// The largest `SEND` body accepted at version `v` (`maxMessageLength`); larger gives `LARGE_MSG`.
pub const fn max_message_length(v: Version) -> usize {
    if v >= ENCRYPTED_BLOCK {
        16048
    } else if v >= SENDING_PROXY {
        16064
    } else {
        16088
    }
}

/// v >= 7 sends no session id inside transmissions but still signs it (simplexmq `Transport.hs`,
/// `implySessId`).
pub const fn implies_session_id(v: Version) -> bool {
    v >= AUTH_CMDS
}

/// v >= 16 has the service-signature slot after a non-empty authorization (simplexmq `Protocol.hs`,
/// `transmissionP`).
pub const fn has_service_slot(v: Version) -> bool {
    v >= SERVICE_CERTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_rules() {
        assert!(VersionRange::new(7, 6).is_none());
        let r = VersionRange::new(6, 20).unwrap();
        assert!(r.contains(6) && r.contains(20) && !r.contains(5) && !r.contains(21));
        assert_eq!(
            r.intersect(&SERVER_VERSIONS),
            Some(VersionRange { min: 6, max: 20 })
        );
        assert_eq!(
            VersionRange::new(6, 6)
                .unwrap()
                .intersect(&PROXIED_VERSIONS),
            None
        );
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out, [0, 6, 0, 20]);
        assert_eq!(VersionRange::decode(&mut Reader::new(&out)), Ok(r));
        let mut bad = Reader::new(&[0, 7, 0, 6]);
        assert!(VersionRange::decode(&mut bad).is_err());
        assert_eq!(bad.position(), 0);
    }

    #[test]
    fn message_length_per_version() {
        assert_eq!(max_message_length(6), 16088);
        assert_eq!(max_message_length(7), 16088);
        assert_eq!(max_message_length(8), 16064);
        assert_eq!(max_message_length(10), 16064);
        assert_eq!(max_message_length(11), 16048);
        assert_eq!(max_message_length(20), 16048);
    }
}
