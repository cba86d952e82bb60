//! TLS 1.3 for SMP on rustls, sans-I/O: configs plus per-connection state machines that take and give
//! bytes, so the server can drive them from glommio sockets and the client from std sockets.
//! Both sides capture the client's handshake bytes and compute tls-unique (the SMP session id) from
//! them with `tls_unique::client_finished`, since rustls does not expose Finished messages.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::{ring as ring_provider, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::Acceptor;
use rustls::server::NoServerSessionStorage;
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, DistinguishedName, KeyLog,
    ProtocolVersion, ServerConfig, ServerConnection, SignatureScheme,
};

use crate::crypto::keys::ED448_KEY_LEN;
use crate::protocol::version::{VersionRange, LEGACY_SERVER_VERSIONS, SERVER_VERSIONS};
use crate::transport::certs::{self, LeafKey, ServerCredentials};
use crate::transport::service_cert::{self, ServiceCertError};
use crate::transport::tls_unique::{self, TlsUniqueError};

/// The SMP ALPN protocol id.
pub const ALPN_SMP: &[u8] = b"smp/1";
/// What the server accepts, in its order of preference (simplexmq `Transport.hs`,
/// `alpnSupportedSMPHandshakes`); `http/1.1` is web-port mode.
pub const SERVER_ALPN: [&[u8]; 3] = [ALPN_SMP, b"h2", ALPN_HTTP11];
/// HTTP/1.1's ALPN id, the only one the WebSocket ports offer.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";
/// Upper bound on the bytes captured during one handshake. A client flight is a ClientHello or two
/// and at most a small certificate chain; a peer sending more is refused instead of buffered.
pub const MAX_HANDSHAKE_CAPTURE_BYTES: usize = crate::limits::TLS_CAPTURE_MAX_BYTES;

const CLIENT_HS_SECRET_LABEL: &str = "CLIENT_HANDSHAKE_TRAFFIC_SECRET";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS I/O: {0}")]
    Io(#[from] io::Error),
    #[error("TLS handshake sent more than {MAX_HANDSHAKE_CAPTURE_BYTES} bytes")]
    CaptureOverflow,
    #[error("TLS handshake is not complete")]
    HandshakeIncomplete,
    #[error("connection closed during the TLS handshake")]
    UnexpectedEof,
    #[error("TLS handshake did not negotiate TLS 1.3")]
    NotTls13,
    #[error("client handshake traffic secret was not logged exactly once")]
    NoHandshakeSecret,
    #[error("tls-unique: {0}")]
    TlsUnique(#[from] TlsUniqueError),
}

/// Server TLS options. None are left: the server always sends a CertificateRequest, a client
/// certificate is optional, and a chain that is sent is validated (`transport::service_cert`), as
/// the reference does (simplexmq `Transport/Server.hs`). Kept so callers need not change.
#[derive(Debug, Clone, Copy, Default)]
pub struct TlsOptions {}

/// Version range offered in the server hello: legacy 6..6 without ALPN, the full range with any
/// (simplexmq `Transport.hs`).
pub fn alpn_versions(alpn: Option<&[u8]>) -> VersionRange {
    match alpn {
        None => LEGACY_SERVER_VERSIONS,
        Some(_) => SERVER_VERSIONS,
    }
}

/// The ring provider narrowed to what SMP uses: TLS 1.3 suites with ChaCha20 first (the only one the
/// reference client offers; its records sealed by OpenSSL, `transport::tls_chacha`), and X25519
/// first among key-exchange groups.
fn provider() -> CryptoProvider {
    use ring_provider::cipher_suite as cs;
    let mut p = ring_provider::default_provider();
    p.cipher_suites = vec![
        super::tls_chacha::suite(),
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_AES_128_GCM_SHA256,
    ];
    p.kx_groups = ring_provider::ALL_KX_GROUPS.to_vec();
    p
}

/// The TLS 1.3 suites a client offers, in its order of preference. The relay takes the client's
/// order (rustls' default), so each kind of client gets the suite it prefers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClientSuites {
    /// ChaCha20-Poly1305 alone, as the SimpleX apps and the reference's SMP proxy offer (simplexmq
    /// `Transport.hs`, `defaultSupportedParams`).
    #[default]
    Apps,
    /// AES-128-GCM, AES-256-GCM, then ChaCha20-Poly1305, as a browser on a machine with AES
    /// instructions offers them (the web clients, over WebSocket).
    Web,
}

/// The ring provider with only `suites` offered, X25519 first among key-exchange groups.
fn client_provider(suites: ClientSuites) -> CryptoProvider {
    use ring_provider::cipher_suite as cs;
    let mut p = provider();
    p.cipher_suites = match suites {
        ClientSuites::Apps => vec![super::tls_chacha::suite()],
        ClientSuites::Web => vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            super::tls_chacha::suite(),
        ],
    };
    p
}

/// Server config shared by all connections; `AcceptState` clones it per connection to add a key log.
pub fn server_config(
    creds: &ServerCredentials,
    _opts: &TlsOptions,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = builder.with_client_cert_verifier(Arc::new(ServiceClientChain { provider }));
    let chain = creds
        .chain_der
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    let mut config = match &creds.leaf_key {
        LeafKey::Ed25519(k) => builder.with_single_cert(chain, ed25519_pkcs8(k))?,
        LeafKey::Ed448(k) => {
            let signing = Arc::new(Ed448Signing(Arc::new(*k)));
            let certified = rustls::sign::CertifiedKey::new(chain, signing);
            certified.keys_match()?;
            builder.with_cert_resolver(Arc::new(OneCert(Arc::new(certified))))
        }
    };
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    // Resumption would skip the full handshake and change what both sides take as the session id.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.max_early_data_size = 0;
    config.key_log = Arc::new(rustls::NoKeyLog {});
    Ok(Arc::new(config))
}

/// The WebSocket ports' config: `base` with ALPN `http/1.1` only. A browser offers `h2` too; the
/// upgrade is HTTP/1.1's (RFC 6455), so `h2` must never be chosen there. A client offering neither
/// gets no ALPN, and is served all the same (`server/conn/mod.rs`).
pub fn websocket_config(base: &Arc<ServerConfig>) -> Arc<ServerConfig> {
    let mut config = ServerConfig::clone(base);
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Arc::new(config)
}

/// The config for web clients on a shared port (`[WEB] https`, `cert`, `key`): the web
/// certificate chain and key read from these PEM files (any key the provider signs with: RSA,
/// ECDSA, Ed25519), ALPN `http/1.1` only (the WebSocket upgrade is HTTP/1.1's) and no
/// CertificateRequest (a browser would ask its user for a certificate). Resumption stays off: the
/// session ID is tls-unique here too. The error names the file and what is wrong with it.
pub fn web_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| {
            format!(
                "cannot read the web certificate file {}: {e}",
                path.display()
            )
        })
    };
    let cert_pem = read(cert)?;
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "{}: no certificate in it (a PEM `CERTIFICATE` block is expected)",
            cert.display()
        ));
    }
    let key_pem = read(key)?;
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| format!("{}: not a PEM private key: {e}", key.display()))?
        .ok_or_else(|| format!("{}: no private key in it", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        // Fails on a key TLS cannot sign with, or one that is not the certificate's.
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            format!(
                "{} with {}: {e} (the key must be the certificate's, RSA, ECDSA or Ed25519)",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.max_early_data_size = 0;
    Ok(Arc::new(config))
}

/// The one certificate of the SMP ports (with a key of our own signing: Ed448).
#[derive(Debug)]
struct OneCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for OneCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Ed448 for rustls, which has no Ed448 signer of its own: the handshake's CertificateVerify
/// signed with OpenSSL's Ed448 (`crypto::auth::sign_ed448`), offered when the client lists
/// `ed448` among its signature schemes (simplexmq's TLS stack does: its servers may have Ed448
/// certificates, `init -a ED448`).
struct Ed448Signing(Arc<[u8; ED448_KEY_LEN]>);

impl std::fmt::Debug for Ed448Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("Ed448Signing")
    }
}

impl rustls::sign::SigningKey for Ed448Signing {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn rustls::sign::Signer>> {
        offered
            .contains(&SignatureScheme::ED448)
            .then(|| Box::new(Ed448Signing(self.0.clone())) as Box<dyn rustls::sign::Signer>)
    }

    fn public_key(&self) -> Option<rustls::pki_types::SubjectPublicKeyInfoDer<'_>> {
        let public = crate::crypto::auth::ed448_public(&self.0);
        let spki = crate::crypto::keys::PublicAuthKey::Ed448(public).to_spki();
        Some(rustls::pki_types::SubjectPublicKeyInfoDer::from(spki))
    }

    fn algorithm(&self) -> rustls::SignatureAlgorithm {
        rustls::SignatureAlgorithm::ED448
    }
}

impl rustls::sign::Signer for Ed448Signing {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        Ok(crate::crypto::auth::sign_ed448(&self.0, message).to_vec())
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ED448
    }
}

fn ed25519_pkcs8(key: &ed25519_dalek::SigningKey) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certs::ed25519_pkcs8_v1_der(key)))
}

/// SMP peers sign with EdDSA only, both ways (simplexmq `Transport.hs`, `defaultSupportedParams`).
const EDDSA_SCHEMES: [SignatureScheme; 2] = [SignatureScheme::ED25519, SignatureScheme::ED448];

/// Verifies a TLS 1.3 CertificateVerify: Ed25519 through rustls/ring, Ed448 (which ring lacks,
/// and which the reference's own test certificates use) through `crypto::auth::ed448_verify`.
fn eddsa_tls13_verify(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    provider: &CryptoProvider,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    match dss.scheme {
        SignatureScheme::ED25519 => rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider.signature_verification_algorithms,
        ),
        SignatureScheme::ED448 => ed448_verify_with_cert(message, cert, dss.signature()),
        _ => Err(rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into()),
    }
}

fn ed448_verify_with_cert(
    message: &[u8],
    cert: &CertificateDer<'_>,
    signature: &[u8],
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let bad_cert = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding);
    let bad_sig = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature);
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| bad_cert())?;
    let spki = parsed.public_key();
    if spki.algorithm.algorithm.to_id_string() != "1.3.101.113" {
        return Err(bad_sig());
    }
    let key: &[u8; 57] = spki
        .subject_public_key
        .data
        .as_ref()
        .try_into()
        .map_err(|_| bad_cert())?;
    let sig: &[u8; 114] = signature.try_into().map_err(|_| bad_sig())?;
    if crate::crypto::auth::ed448_verify(key, message, sig) {
        Ok(HandshakeSignatureValid::assertion())
    } else {
        Err(bad_sig())
    }
}

/// Asks every client for a certificate, accepts none (an ordinary client), and validates a chain
/// that is sent by the reference's rules (`service_cert::validate_chain`, simplexmq
/// `Transport/Server.hs`, `validateClientCertificate`); a refused chain aborts the handshake with
/// an alert. The CertificateVerify signature is checked too, so the client proves it holds the
/// leaf key. The chain stays readable with `ServerConnection::peer_certificates`.
#[derive(Debug)]
struct ServiceClientChain {
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for ServiceClientChain {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let chain: Vec<Vec<u8>> = std::iter::once(end_entity)
            .chain(intermediates)
            .map(|c| c.as_ref().to_vec())
            .collect();
        service_cert::validate_chain(&chain, now.as_secs()).map_err(client_chain_error)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::PeerIncompatible::Tls12NotOffered.into())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        eddsa_tls13_verify(message, cert, dss, &self.provider)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        EDDSA_SCHEMES.to_vec()
    }
}

/// The rustls error (and so the TLS alert) for a refused client chain: `certificate_expired`,
/// `decrypt_error` (bad signature), `unknown_ca`, `decode_error`, and `certificate_unknown` for
/// the rest, close to the reference's `CertificateReject*` reasons.
fn client_chain_error(e: ServiceCertError) -> rustls::Error {
    use rustls::CertificateError as C;
    let c = match e {
        ServiceCertError::Expired => C::Expired,
        ServiceCertError::NotYetValid => C::NotValidYet,
        ServiceCertError::BadSignature => C::BadSignature,
        ServiceCertError::UnknownCa | ServiceCertError::SelfSigned => C::UnknownIssuer,
        ServiceCertError::Parse => C::BadEncoding,
        ServiceCertError::LeafKey
        | ServiceCertError::UnsupportedSignature
        | ServiceCertError::Empty
        | ServiceCertError::TooLong(_)
        | ServiceCertError::LeafNotV3
        | ServiceCertError::NotCa => C::Other(rustls::OtherError(Arc::new(e))),
    };
    rustls::Error::InvalidCertificate(c)
}

/// Keeps this connection's CLIENT_HANDSHAKE_TRAFFIC_SECRET (one config clone per connection, so
/// there is exactly one). A second value means something unexpected; it is then refused.
#[derive(Debug, Default)]
struct HandshakeSecretLog {
    state: Mutex<SecretSlot>,
}

#[derive(Debug, Default)]
enum SecretSlot {
    #[default]
    Empty,
    One(Vec<u8>),
    Conflict,
}

impl KeyLog for HandshakeSecretLog {
    fn will_log(&self, label: &str) -> bool {
        label == CLIENT_HS_SECRET_LABEL
    }

    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if label != CLIENT_HS_SECRET_LABEL {
            return;
        }
        if let Ok(mut slot) = self.state.lock() {
            *slot = match &*slot {
                SecretSlot::Empty => SecretSlot::One(secret.to_vec()),
                _ => SecretSlot::Conflict,
            };
        }
    }
}

impl HandshakeSecretLog {
    fn take(&self) -> Result<Vec<u8>, TlsError> {
        let mut slot = self.state.lock().map_err(|_| TlsError::NoHandshakeSecret)?;
        match std::mem::take(&mut *slot) {
            SecretSlot::One(s) => Ok(s),
            _ => Err(TlsError::NoHandshakeSecret),
        }
    }
}

/// Appends to a bounded capture buffer.
fn capture(buf: &mut Vec<u8>, bytes: &[u8]) -> Result<(), TlsError> {
    if buf.len() + bytes.len() > MAX_HANDSHAKE_CAPTURE_BYTES {
        return Err(TlsError::CaptureOverflow);
    }
    buf.extend_from_slice(bytes);
    Ok(())
}

fn session_id(
    protocol: Option<ProtocolVersion>,
    suite: Option<rustls::SupportedCipherSuite>,
    key_log: &HandshakeSecretLog,
    captured: &[u8],
) -> Result<Vec<u8>, TlsError> {
    if protocol != Some(ProtocolVersion::TLSv1_3) {
        return Err(TlsError::NotTls13);
    }
    let suite = suite.ok_or(TlsError::NotTls13)?;
    let secret = key_log.take()?;
    Ok(tls_unique::client_finished(captured, suite, &secret)?)
}

/// Server side of one TLS handshake. Feed it every byte read from the socket, send what
/// `take_output` yields, and call `finish` once `is_handshaking` is false.
///
/// The ClientHello is read first (rustls' `Acceptor`) so that ALPN follows the client's order, as
/// the reference does: the first protocol of the client's list that the server supports wins
/// (rustls alone would pick by the server's order).
pub struct AcceptState {
    base: Arc<ServerConfig>,
    /// On a shared port, the config for a ClientHello that names a host (`web_config`).
    web: Option<Arc<ServerConfig>>,
    stage: Stage,
    captured: Vec<u8>,
    key_log: Arc<HandshakeSecretLog>,
    /// An alert rustls produced while refusing the ClientHello, to send before closing.
    alert: Vec<u8>,
}

enum Stage {
    Hello(Box<Acceptor>),
    Handshake(Box<ServerConnection>),
    Failed,
}

impl AcceptState {
    pub fn new(base: &Arc<ServerConfig>) -> Result<Self, TlsError> {
        Ok(Self {
            base: base.clone(),
            web: None,
            stage: Stage::Hello(Box::default()),
            captured: Vec::new(),
            key_log: Arc::new(HandshakeSecretLog::default()),
            alert: Vec::new(),
        })
    }

    /// On a port shared with web clients: a ClientHello naming a host (SNI) is served with
    /// `web`, one naming none with the base config, as the reference's shared port (simplexmq
    /// `Transport/Server.hs`, `onServerNameIndication`: any host name, unchecked). The connection
    /// then says which (`ServerConnection::server_name`).
    pub fn with_web(mut self, web: Option<&Arc<ServerConfig>>) -> Self {
        self.web = web.cloned();
        self
    }

    /// Processes bytes received from the client, in chunks of any size. On error, `take_output`
    /// may still hold an alert worth sending before closing.
    ///
    /// Application data arriving with the client Finished is buffered in the connection; rustls
    /// refuses more than 16 KiB of it (an error here). SMP clients send nothing before the
    /// server hello, so only a misbehaving peer gets there.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), TlsError> {
        if self.is_handshaking() {
            // Captured before rustls sees them, so the Finished that completes the handshake is in.
            // Only up to the bound: bytes past it can only matter if the handshake is still going
            // once they are processed, which is refused below (and a Finished beyond the bound
            // makes the extraction fail closed).
            let room = MAX_HANDSHAKE_CAPTURE_BYTES.saturating_sub(self.captured.len());
            if room == 0 {
                return Err(TlsError::CaptureOverflow);
            }
            self.captured
                .extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        while !bytes.is_empty() {
            match &mut self.stage {
                Stage::Hello(acceptor) => {
                    if acceptor.read_tls(&mut bytes)? == 0 {
                        break;
                    }
                    self.accept_hello()?;
                }
                Stage::Handshake(conn) => {
                    if conn.read_tls(&mut bytes)? == 0 {
                        break;
                    }
                    conn.process_new_packets()?;
                }
                Stage::Failed => return Err(TlsError::HandshakeIncomplete),
            }
        }
        if self.is_handshaking() && self.captured.len() >= MAX_HANDSHAKE_CAPTURE_BYTES {
            return Err(TlsError::CaptureOverflow);
        }
        Ok(())
    }

    /// Once the whole ClientHello is in: picks ALPN by the client's order and starts the
    /// connection with a per-connection config that logs this handshake's secret.
    fn accept_hello(&mut self) -> Result<(), TlsError> {
        let Stage::Hello(acceptor) = &mut self.stage else {
            return Ok(());
        };
        let accepted = match acceptor.accept() {
            Ok(None) => return Ok(()),
            Ok(Some(a)) => a,
            Err((e, mut alert)) => {
                let _ = alert.write_all(&mut self.alert);
                self.stage = Stage::Failed;
                return Err(e.into());
            }
        };
        let base = match &self.web {
            Some(web) if accepted.client_hello().server_name().is_some() => web,
            _ => &self.base,
        };
        let mut config = ServerConfig::clone(base);
        config.key_log = self.key_log.clone();
        let offered: Option<Vec<Vec<u8>>> = accepted
            .client_hello()
            .alpn()
            .map(|list| list.map(|p| p.to_vec()).collect());
        if let Some(offered) = offered {
            // With no protocol in common the server's list stays, and rustls refuses the handshake
            // with no_application_protocol, as the reference does.
            if let Some(first) = offered.iter().find(|p| config.alpn_protocols.contains(p)) {
                config.alpn_protocols = vec![first.clone()];
            }
        }
        match accepted.into_connection(Arc::new(config)) {
            Ok(mut conn) => {
                conn.process_new_packets()?;
                self.stage = Stage::Handshake(Box::new(conn));
                Ok(())
            }
            Err((e, mut alert)) => {
                let _ = alert.write_all(&mut self.alert);
                self.stage = Stage::Failed;
                Err(e.into())
            }
        }
    }

    pub fn is_handshaking(&self) -> bool {
        match &self.stage {
            Stage::Handshake(conn) => conn.is_handshaking(),
            _ => true,
        }
    }

    pub fn wants_write(&self) -> bool {
        !self.alert.is_empty() || matches!(&self.stage, Stage::Handshake(c) if c.wants_write())
    }

    /// Appends the TLS bytes to send to the client.
    pub fn take_output(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.alert);
        if let Stage::Handshake(conn) = &mut self.stage {
            while conn.wants_write() {
                // Writing into a Vec cannot fail; stop rather than spin if it ever did.
                if !matches!(conn.write_tls(out), Ok(n) if n > 0) {
                    break;
                }
            }
        }
    }

    /// The client bytes captured so far (for diagnostics and tests).
    pub fn captured(&self) -> &[u8] {
        &self.captured
    }

    /// The connection, once the ClientHello has been accepted.
    pub fn connection(&self) -> Option<&ServerConnection> {
        match &self.stage {
            Stage::Handshake(conn) => Some(conn),
            _ => None,
        }
    }

    /// Once the handshake is complete: the connection (application data the client sent along
    /// with its Finished is already buffered in it) and the tls-unique session id.
    pub fn finish(self) -> Result<(ServerConnection, Vec<u8>), TlsError> {
        let Stage::Handshake(conn) = self.stage else {
            return Err(TlsError::HandshakeIncomplete);
        };
        if conn.is_handshaking() {
            return Err(TlsError::HandshakeIncomplete);
        }
        let id = session_id(
            conn.protocol_version(),
            conn.negotiated_cipher_suite(),
            &self.key_log,
            &self.captured,
        )?;
        Ok((*conn, id))
    }
}

/// Accepts any server chain at the TLS level: SMP checks the chain against the address
/// fingerprint after the handshake (simplexmq `Transport/Client.hs`). The handshake signature is
/// still verified.
///
/// A web client (`web`) takes any certificate's signature scheme the provider verifies: it meets
/// the web certificate of a shared port (RSA, ECDSA), and checks the relay's identity in the SMP
/// handshake instead (`client::handshake`, the web challenge).
#[derive(Debug)]
struct AcceptAnyServerChain {
    provider: Arc<CryptoProvider>,
    web: bool,
}

impl ServerCertVerifier for AcceptAnyServerChain {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::PeerIncompatible::Tls12NotOffered.into())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        match dss.scheme {
            SignatureScheme::ED25519 | SignatureScheme::ED448 => {
                eddsa_tls13_verify(message, cert, dss, &self.provider)
            }
            _ if self.web => rustls::crypto::verify_tls13_signature(message, cert, dss, algs),
            _ => Err(rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into()),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        let mut schemes = EDDSA_SCHEMES.to_vec();
        if self.web {
            let algs = &self.provider.signature_verification_algorithms;
            for scheme in algs.supported_schemes() {
                if !schemes.contains(&scheme) {
                    schemes.push(scheme);
                }
            }
        }
        schemes
    }
}

/// A web client's config: as `client_config`, but naming the host (SNI), as browsers do, and taking
/// any server certificate scheme (`AcceptAnyServerChain::web`).
pub fn web_client_config(
    alpn: Vec<Vec<u8>>,
    suites: ClientSuites,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut config = client_config_inner(alpn, None, true, suites)?;
    config.enable_sni = true;
    Ok(Arc::new(config))
}

/// Client config: TLS 1.3, no SNI (SMP clients never send it: simplexmq `Transport/Client.hs`), no
/// resumption, `alpn` offered as given (empty = no ALPN extension, a legacy client), the apps'
/// suite.
pub fn client_config(alpn: Vec<Vec<u8>>) -> Result<Arc<ClientConfig>, TlsError> {
    client_config_offering(alpn, ClientSuites::Apps)
}

/// As `client_config`, offering `suites`.
pub fn client_config_offering(
    alpn: Vec<Vec<u8>>,
    suites: ClientSuites,
) -> Result<Arc<ClientConfig>, TlsError> {
    client_config_inner(alpn, None, false, suites).map(Arc::new)
}

/// As `client_config`, presenting `chain` (DER, leaf first) with an Ed25519 key when asked.
/// The chain is sent as given, even when the key is not the leaf's (so tests can present chains
/// a server must refuse); the handshake then fails at the CertificateVerify.
pub fn client_config_with_cert(
    alpn: Vec<Vec<u8>>,
    chain: Vec<Vec<u8>>,
    key: &ed25519_dalek::SigningKey,
) -> Result<Arc<ClientConfig>, TlsError> {
    Ok(client_config_with_cert_sent(alpn, chain, key, ClientSuites::Apps)?.0)
}

/// Set once a client actually sent its certificate chain: the server asked for one
/// (CertificateRequest) and accepts Ed25519 signatures. The reference client offers service
/// credentials in its hello only then (simplexmq `Transport.hs`, `certificateSent`). One flag per
/// config: make a config per connection to read it per connection.
#[derive(Debug, Clone, Default)]
pub struct CertSent(Arc<AtomicBool>);

impl CertSent {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// As `client_config_with_cert`, with the flag telling whether the chain was sent. An empty chain
/// is never sent (the client then answers a CertificateRequest with no certificate).
pub fn client_config_with_cert_sent(
    alpn: Vec<Vec<u8>>,
    chain: Vec<Vec<u8>>,
    key: &ed25519_dalek::SigningKey,
    suites: ClientSuites,
) -> Result<(Arc<ClientConfig>, CertSent), TlsError> {
    let sent = CertSent::default();
    let provider = Arc::new(provider());
    let certified = if chain.is_empty() {
        None
    } else {
        let signer = provider.key_provider.load_private_key(ed25519_pkcs8(key))?;
        let chain = chain.into_iter().map(CertificateDer::from).collect();
        Some(Arc::new(rustls::sign::CertifiedKey::new(chain, signer)))
    };
    let resolver = Arc::new(ClientCertResolver {
        certified,
        sent: sent.clone(),
    });
    Ok((
        Arc::new(client_config_inner(alpn, Some(resolver), false, suites)?),
        sent,
    ))
}

/// Presents one Ed25519 chain when the server asks and accepts Ed25519, and records that it did.
#[derive(Debug)]
struct ClientCertResolver {
    certified: Option<Arc<rustls::sign::CertifiedKey>>,
    sent: CertSent,
}

impl ResolvesClientCert for ClientCertResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let certified = self.certified.clone()?;
        if !sigschemes.contains(&SignatureScheme::ED25519) {
            return None;
        }
        self.sent.0.store(true, Ordering::Relaxed);
        Some(certified)
    }

    fn has_certs(&self) -> bool {
        self.certified.is_some()
    }
}

fn client_config_inner(
    alpn: Vec<Vec<u8>>,
    identity: Option<Arc<ClientCertResolver>>,
    web: bool,
    suites: ClientSuites,
) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(client_provider(suites));
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServerChain { provider, web }));
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(resolver) => builder.with_client_cert_resolver(resolver),
    };
    config.alpn_protocols = alpn;
    config.enable_sni = false;
    config.resumption = rustls::client::Resumption::disabled();
    config.enable_early_data = false;
    Ok(config)
}

/// Client side of one TLS handshake: records what the client writes so it can compute its own
/// Finished. Drive it with `handshake_blocking` over a std stream, or with `read_tls_from` /
/// `write_tls_to` from any event loop.
pub struct ClientCapture {
    conn: ClientConnection,
    captured: Vec<u8>,
    key_log: Arc<HandshakeSecretLog>,
}

/// A writer that records the bytes its inner writer actually accepted.
struct TeeWriter<'a> {
    inner: &'a mut dyn Write,
    captured: &'a mut Vec<u8>,
    overflow: bool,
}

impl TeeWriter<'_> {
    /// Captures the first `n` bytes of `bufs`, the part the inner writer accepted.
    fn record(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(buf.len());
            if capture(self.captured, &buf[..take]).is_err() {
                self.overflow = true;
            }
            n -= take;
        }
    }
}

impl Write for TeeWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.record(&[io::IoSlice::new(buf)], n);
        Ok(n)
    }

    // rustls writes its queued records with one vectored write.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let n = self.inner.write_vectored(bufs)?;
        self.record(bufs, n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl ClientCapture {
    /// `server_name` is only used for certificate checks the SMP layer does itself (SNI is off);
    /// any name or IP works.
    pub fn new(
        base: &Arc<ClientConfig>,
        server_name: ServerName<'static>,
    ) -> Result<Self, TlsError> {
        let key_log = Arc::new(HandshakeSecretLog::default());
        let mut config = (**base).clone();
        config.key_log = key_log.clone();
        Ok(Self {
            conn: ClientConnection::new(Arc::new(config), server_name)?,
            captured: Vec::new(),
            key_log,
        })
    }

    /// Writes pending TLS bytes to `w`, capturing them. Everything written until `finish` is
    /// captured: rustls stops "handshaking" as soon as it queues the client Finished, before it
    /// is written, so the handshaking flag cannot mark the end of the capture.
    pub fn write_tls_to(&mut self, w: &mut dyn Write) -> Result<usize, TlsError> {
        let mut tee = TeeWriter {
            inner: w,
            captured: &mut self.captured,
            overflow: false,
        };
        let n = self.conn.write_tls(&mut tee)?;
        if tee.overflow {
            return Err(TlsError::CaptureOverflow);
        }
        Ok(n)
    }

    /// Reads TLS bytes from `r` and processes them; Ok(0) means end of stream.
    pub fn read_tls_from(&mut self, r: &mut dyn Read) -> Result<usize, TlsError> {
        let n = self.conn.read_tls(r)?;
        self.conn.process_new_packets()?;
        Ok(n)
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    pub fn connection(&self) -> &ClientConnection {
        &self.conn
    }

    pub fn captured(&self) -> &[u8] {
        &self.captured
    }

    /// Runs the handshake to completion on a blocking stream, flushing the client Finished.
    pub fn handshake_blocking<S: Read + Write>(&mut self, sock: &mut S) -> Result<(), TlsError> {
        loop {
            while self.conn.wants_write() {
                self.write_tls_to(sock)?;
            }
            if !self.conn.is_handshaking() {
                return Ok(());
            }
            match self.read_tls_from(sock) {
                Ok(0) => return Err(TlsError::UnexpectedEof),
                Ok(_) => {}
                Err(e) => {
                    // Best effort: tell the server why (an alert) before giving up.
                    while self.conn.wants_write() {
                        if self.write_tls_to(sock).is_err() {
                            break;
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Once the handshake is complete and its bytes written: the connection and the session id.
    pub fn finish(self) -> Result<(ClientConnection, Vec<u8>), TlsError> {
        if self.conn.is_handshaking() || self.conn.wants_write() {
            return Err(TlsError::HandshakeIncomplete);
        }
        let id = session_id(
            self.conn.protocol_version(),
            self.conn.negotiated_cipher_suite(),
            &self.key_log,
            &self.captured,
        )?;
        Ok((self.conn, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> ServerCredentials {
        certs::generated_for_tests("tls")
    }

    /// Runs client and server state machines against each other in memory.
    fn run(
        server: &Arc<ServerConfig>,
        client: &Arc<ClientConfig>,
    ) -> Result<(ServerConnection, Vec<u8>, ClientConnection, Vec<u8>), TlsError> {
        let mut s = AcceptState::new(server)?;
        let mut c = ClientCapture::new(client, ServerName::try_from("localhost").unwrap())?;
        for _ in 0..20 {
            let mut to_server = Vec::new();
            while c.conn.wants_write() {
                c.write_tls_to(&mut to_server)?;
            }
            s.feed(&to_server)?;
            let mut to_client = Vec::new();
            s.take_output(&mut to_client);
            if !to_client.is_empty() {
                c.read_tls_from(&mut to_client.as_slice())?;
            }
            if !s.is_handshaking() && !c.is_handshaking() && !c.conn.wants_write() {
                let (sc, sid) = s.finish()?;
                let (cc, cid) = c.finish()?;
                return Ok((sc, sid, cc, cid));
            }
        }
        Err(TlsError::HandshakeIncomplete)
    }

    #[test]
    fn in_memory_handshake_agrees_on_session_id_and_alpn() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let alpn = vec![b"foo".to_vec(), ALPN_SMP.to_vec()];
        let (chain, key) = self_signed_client();
        let clients = [
            client_config(alpn.clone()).unwrap(),
            client_config_with_cert(alpn, chain.clone(), &key).unwrap(),
        ];
        for (with_cert, client) in clients.iter().enumerate() {
            let (sc, sid, cc, cid) = run(&server, client).unwrap();
            assert_eq!(sid, cid);
            assert_eq!(sid.len(), 32);
            assert_eq!(sc.alpn_protocol(), Some(ALPN_SMP));
            assert_eq!(cc.alpn_protocol(), Some(ALPN_SMP));
            assert_eq!(
                sc.negotiated_cipher_suite().unwrap().suite(),
                rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            );
            let server_chain = cc.peer_certificates().unwrap();
            assert_eq!(server_chain.len(), 2);
            assert_eq!(server_chain[1].as_ref(), creds.chain_der[1].as_slice());
            // The server reads the client's chain after the handshake.
            let peer: Vec<&[u8]> = sc
                .peer_certificates()
                .unwrap_or_default()
                .iter()
                .map(|c| c.as_ref())
                .collect();
            let expected: Vec<&[u8]> = if with_cert == 1 {
                vec![chain[0].as_slice()]
            } else {
                vec![]
            };
            assert_eq!(peer, expected);
        }
    }

    /// A 1-certificate Ed25519 chain (rcgen's default dates: 1975 to 4096) and its key.
    fn self_signed_client() -> (Vec<Vec<u8>>, ed25519_dalek::SigningKey) {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let rc_key =
            rcgen::KeyPair::try_from(certs::ed25519_pkcs8_v1_der(&key).as_slice()).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["svc".into()])
            .unwrap()
            .self_signed(&rc_key)
            .unwrap();
        (vec![cert.der().to_vec()], key)
    }

    #[test]
    fn a_refused_client_chain_aborts_the_handshake() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let (chain, key) = self_signed_client();
        let long = vec![chain[0].clone(); 5];
        let client = client_config_with_cert(vec![ALPN_SMP.to_vec()], long, &key).unwrap();
        let err = run(&server, &client).err();
        assert!(
            matches!(
                &err,
                Some(TlsError::Rustls(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::Other(_)
                )))
            ),
            "{err:?}"
        );
        // The server still serves an ordinary client afterwards (nothing is left behind).
        let client = client_config(vec![ALPN_SMP.to_vec()]).unwrap();
        assert!(run(&server, &client).is_ok());
    }

    #[test]
    fn two_connections_get_different_session_ids() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let client = client_config(vec![ALPN_SMP.to_vec()]).unwrap();
        let (_, a, _, _) = run(&server, &client).unwrap();
        let (_, b, _, _) = run(&server, &client).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn no_alpn_is_legacy_and_unknown_alpn_fails() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let (sc, _, _, _) = run(&server, &client_config(vec![]).unwrap()).unwrap();
        assert_eq!(sc.alpn_protocol(), None);
        assert_eq!(alpn_versions(sc.alpn_protocol()), LEGACY_SERVER_VERSIONS);
        assert_eq!(alpn_versions(Some(b"http/1.1")), SERVER_VERSIONS);
        let err = run(&server, &client_config(vec![b"foo".to_vec()]).unwrap()).err();
        assert!(
            matches!(
                err,
                Some(TlsError::Rustls(rustls::Error::NoApplicationProtocol))
            ),
            "{err:?}"
        );
    }

    #[test]
    fn ed448_handshake_signature_check() {
        use openssl::pkey::PKey;
        use openssl::sign::Signer;
        let key = PKey::generate_ed448().unwrap();
        let mut name = openssl::x509::X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "ed448").unwrap();
        let name = name.build();
        let mut b = openssl::x509::X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&openssl::asn1::Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&openssl::asn1::Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        b.sign(&key, openssl::hash::MessageDigest::null()).unwrap();
        let cert = CertificateDer::from(b.build().to_der().unwrap());
        let message = b"TLS 1.3, server CertificateVerify\x00transcript hash";
        let sig = Signer::new_without_digest(&key)
            .unwrap()
            .sign_oneshot_to_vec(message)
            .unwrap();
        assert!(ed448_verify_with_cert(message, &cert, &sig).is_ok());
        let mut tampered = sig.clone();
        tampered[3] ^= 1;
        assert!(ed448_verify_with_cert(message, &cert, &tampered).is_err());
        assert!(ed448_verify_with_cert(b"other", &cert, &sig).is_err());
        assert!(ed448_verify_with_cert(message, &cert, &sig[..113]).is_err());
        // An Ed25519 certificate cannot carry an Ed448 signature.
        let creds = creds();
        let ed25519_cert = CertificateDer::from(creds.chain_der[0].clone());
        assert!(ed448_verify_with_cert(message, &ed25519_cert, &sig).is_err());
    }

    #[test]
    fn finish_before_handshake_end_is_refused() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let s = AcceptState::new(&server).unwrap();
        assert!(matches!(s.finish(), Err(TlsError::HandshakeIncomplete)));
    }

    #[test]
    fn capture_is_bounded() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let mut s = AcceptState::new(&server).unwrap();
        // Bypass rustls' own limits to check the capture bound itself.
        s.captured = vec![22u8; MAX_HANDSHAKE_CAPTURE_BYTES];
        assert!(matches!(s.feed(&[22]), Err(TlsError::CaptureOverflow)));
    }

    #[test]
    fn large_feed_with_finished_and_data_is_accepted() {
        // Finished and 15 KiB of application data in one feed (the server reads up to 32 KiB).
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let client = client_config(vec![ALPN_SMP.to_vec()]).unwrap();
        let mut s = AcceptState::new(&server).unwrap();
        let mut c =
            ClientCapture::new(&client, ServerName::try_from("localhost").unwrap()).unwrap();
        while c.is_handshaking() {
            let mut to_server = Vec::new();
            while c.conn.wants_write() {
                c.write_tls_to(&mut to_server).unwrap();
            }
            s.feed(&to_server).unwrap();
            let mut to_client = Vec::new();
            s.take_output(&mut to_client);
            c.read_tls_from(&mut to_client.as_slice()).unwrap();
        }
        let mut last = Vec::new();
        while c.conn.wants_write() {
            c.write_tls_to(&mut last).unwrap();
        }
        let (mut cc, cid) = c.finish().unwrap();
        let data = vec![0x5a; 15 * 1024];
        cc.writer().write_all(&data).unwrap();
        while cc.wants_write() {
            cc.write_tls(&mut last).unwrap();
        }
        assert!(last.len() > 15 * 1024);
        s.feed(&last).unwrap();
        let (mut sc, sid) = s.finish().unwrap();
        assert_eq!(sid, cid);
        let mut got = vec![0u8; data.len()];
        sc.reader().read_exact(&mut got).unwrap();
        assert_eq!(got, data);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let creds = creds();
        let server = server_config(&creds, &TlsOptions::default()).unwrap();
        let mut s = AcceptState::new(&server).unwrap();
        assert!(s.feed(b"GET / HTTP/1.1\r\n\r\n").is_err());
        let mut out = Vec::new();
        s.take_output(&mut out);
        assert!(!out.is_empty(), "an alert is queued");
    }
}
