//! Settings of the relay: the data directory layout and the options of `start`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::limits;

/// Default SMP port (the reference's `defaultSMPPort`).
pub const DEFAULT_PORT: u16 = 5223;
pub const DEFAULT_DATA_DIR: &str = "./smp-data";

pub const CA_KEY_FILE: &str = "ca.key";
pub const CA_CERT_FILE: &str = "ca.crt";
pub const SERVER_KEY_FILE: &str = "server.key";
pub const SERVER_CERT_FILE: &str = "server.crt";
pub const FINGERPRINT_FILE: &str = "fingerprint";
pub const INI_FILE: &str = "smp-server.ini";
pub const LOCK_FILE: &str = "lock";

/// What `start` runs with, after the command line and the data directory are read.
#[derive(Debug, Clone)]
pub struct StartConfig {
    pub data_dir: PathBuf,
    pub ports: Vec<u16>,
    /// Number of shards, one per pinned core.
    pub shards: usize,
    pub max_connections: usize,
    pub tls_timeout: Duration,
    pub handshake_timeout: Duration,
    /// Test-only for now: ask clients for a TLS certificate (the services issue makes it real).
    pub request_client_cert: bool,
}

impl StartConfig {
    pub fn new(data_dir: &Path) -> Self {
        StartConfig {
            data_dir: data_dir.to_path_buf(),
            ports: vec![DEFAULT_PORT],
            shards: 1,
            max_connections: limits::MAX_CONNECTIONS,
            tls_timeout: limits::TLS_SETUP_TIMEOUT,
            handshake_timeout: limits::SMP_HANDSHAKE_TIMEOUT,
            request_client_cert: false,
        }
    }
}
