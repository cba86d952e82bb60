//! The proxy's side of `RFWD` → `RRES`, sans I/O: the reference's `forwardSMPTransmission`
//! (simplex-chat/simplexmq `src/Simplex/Messaging/Client.hs`) seals a `FwdTransmission` with the
//! session secret and a fresh corrId `n2`, and opens the answer with `reverse(n2)`. Both client stacks drive it: the test proxy (`client::proxy`) and the
//! relay's proxy sessions (`server::proxy::session`).

use crate::crypto::sxbox;
use crate::protocol::forward::{reverse_nonce, FwdResponse};

/// Why an `RRES` body did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RresError {
    /// The box does not open with sessSecret and reverse(n2) (`PCECryptoError`).
    Crypto,
    /// It opens, but is no `FwdResponse`.
    Parse,
}

/// The `RFWD` body: SXbox_nopad(sessSecret, n2, fwd), `fwd` being an encoded `FwdTransmission`
/// (`FwdTransmission::to_bytes`), or anything else a test wants the destination to open.
pub fn seal_rfwd(sess_secret: &[u8; 32], n2: &[u8; 24], fwd: &[u8]) -> Vec<u8> {
    sxbox::seal(sess_secret, n2, fwd)
}

/// Opens an `RRES` body with sessSecret and reverse(n2) and returns the `FwdResponse` parts: the
/// echoed corrId and `r2`.
pub fn open_rres(
    sess_secret: &[u8; 32],
    n2: &[u8; 24],
    efr: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), RresError> {
    let fr = sxbox::open(sess_secret, &reverse_nonce(n2), efr).map_err(|_| RresError::Crypto)?;
    let r = FwdResponse::parse(&fr).map_err(|_| RresError::Parse)?;
    Ok((r.corr_id.to_vec(), r.r2.to_vec()))
}
