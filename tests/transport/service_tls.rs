//! Client certificates at the TLS layer against a started relay (simplexmq `Transport/Server.hs`,
//! `validateClientCertificate`; chain shapes of `Transport/Shared.hs`, `chainIdCaCerts`): the
//! relay always asks for one; a client without one, or with a valid 1- or 2-certificate chain,
//! gets an ordinary SMP session; a chain that is too long, out of date, wrongly signed or not
//! EdDSA makes the TLS handshake fail, and the relay goes on serving others.

use crate::common;

use common::Relay;
use openssl::asn1::Asn1Time;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::x509::{X509NameBuilder, X509};
use rustls::AlertDescription;
use smp_relay::client::queue::{self, KeyAlg, RecipientKeys};
use smp_relay::client::{Client, ClientCert, ClientError, ClientOptions, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;

fn with_cert(cert: ClientCert) -> ClientOptions {
    ClientOptions {
        tls_cert: Some(cert),
        ..ClientOptions::default()
    }
}

/// PING, then NEW: an ordinary session works end to end.
fn ping_and_new(c: &mut Client) {
    assert_eq!(c.ping().expect("PING").msg, Ok(BrokerMsg::Pong));
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let corr = smp_relay::client::new_corr_id();
    let t = ClientTransmission::new(&corr, b"", Command::New(queue::new_queue(&keys)))
        .signed(keys.auth.clone());
    c.send_batch(&[t]).expect("send NEW");
    let r = c.recv_for(&corr).expect("NEW response");
    assert!(matches!(r.msg, Ok(BrokerMsg::Ids(_))), "{:?}", r.msg);
    assert_eq!(c.service_id(), None);
}

/// The relay refuses the chain during TLS with `alert`: the client sees it at its first read,
/// before any SMP handshake block. The relay then still serves other clients.
fn assert_refused(relay: &Relay, cert: ClientCert, alert: AlertDescription, what: &str) {
    match relay.connect(with_cert(cert)) {
        Ok(_) => panic!("{what}: the relay accepted the chain"),
        Err(ClientError::Tls(rustls::Error::AlertReceived(a))) => assert_eq!(a, alert, "{what}"),
        Err(e) => panic!("{what}: not a TLS alert: {e:?}"),
    }
    relay.assert_serves();
}

fn openssl_self_signed(key: &PKey<Private>, digest: MessageDigest) -> Vec<u8> {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "simplex").unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(30).unwrap())
        .unwrap();
    b.sign(key, digest).unwrap();
    b.build().to_der().unwrap()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn fresh_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng)
}

#[test]
fn a_client_without_a_certificate_is_served() {
    let relay = Relay::start();
    let mut c = relay.client();
    assert!(!c.cert_sent());
    ping_and_new(&mut c);
}

#[test]
fn valid_one_and_two_certificate_chains_get_an_ordinary_session() {
    let relay = Relay::start();
    for cert in [ClientCert::self_signed(), ClientCert::with_ca()] {
        let cert = cert.expect("credentials");
        let n = cert.chain.len();
        let mut c = relay
            .connect(with_cert(cert))
            .unwrap_or_else(|e| panic!("{n} certificates: {e}\n{}", relay.log_text()));
        assert!(c.cert_sent(), "the relay asked for the certificate");
        ping_and_new(&mut c);
    }
    // An ordinary client still works alongside.
    ping_and_new(&mut relay.client());
}

#[test]
fn refused_chains_fail_the_tls_handshake() {
    let relay = Relay::start();

    let one = ClientCert::self_signed().unwrap();
    let long = ClientCert {
        chain: vec![one.chain[0].clone(); 5],
        key: one.key.clone(),
    };
    assert_refused(
        &relay,
        long,
        AlertDescription::CertificateUnknown,
        "5 certificates",
    );

    let key = fresh_key();
    let expired = ClientCert::self_signed_with_dates(key, now() - 3 * 86400, now() - 86400);
    assert_refused(
        &relay,
        expired.unwrap(),
        AlertDescription::CertificateExpired,
        "expired",
    );

    let key = fresh_key();
    let future = ClientCert::self_signed_with_dates(key, now() + 86400, now() + 3 * 86400);
    assert_refused(
        &relay,
        future.unwrap(),
        AlertDescription::CertificateExpired,
        "not yet valid",
    );

    let mut bad_sig = ClientCert::self_signed().unwrap();
    let last = bad_sig.chain[0].len() - 1;
    bad_sig.chain[0][last] ^= 0x01;
    assert_refused(
        &relay,
        bad_sig,
        AlertDescription::DecryptError,
        "wrong signature",
    );

    // A 2-certificate chain whose CA is not the leaf's issuer's key.
    let a = ClientCert::with_ca().unwrap();
    let b = ClientCert::with_ca().unwrap();
    let swapped = ClientCert {
        chain: vec![a.chain[0].clone(), b.chain[1].clone()],
        key: a.key,
    };
    assert_refused(
        &relay,
        swapped,
        AlertDescription::DecryptError,
        "leaf not signed by the CA",
    );

    // RSA and ECDSA leaves (the client's Ed25519 key does not match; the chain is refused first).
    let rsa = PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
    let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
    let ec = PKey::from_ec_key(openssl::ec::EcKey::generate(&group).unwrap()).unwrap();
    for (what, key) in [("RSA", rsa), ("ECDSA", ec)] {
        let cert = ClientCert {
            chain: vec![openssl_self_signed(&key, MessageDigest::sha256())],
            key: fresh_key(),
        };
        assert_refused(&relay, cert, AlertDescription::CertificateUnknown, what);
    }

    // And after all of them a valid chain is still accepted.
    let mut c = relay
        .connect(with_cert(ClientCert::self_signed().unwrap()))
        .expect("valid chain");
    ping_and_new(&mut c);
}
