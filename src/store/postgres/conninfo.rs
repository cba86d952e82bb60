//! Connection strings as the reference's `db_connection` takes them (libpq's key-value form or a
//! `postgresql://` URL), turned into a `postgres::Config` and a TLS policy.
//!
//! Two things libpq does that the Rust client does not are done here: a URL or string without a
//! host means the default socket directory (`/var/run/postgresql`), as in the reference's default
//! `postgresql://smp@/smp_server_store`; and `sslmode=verify-ca` / `verify-full` with
//! `sslrootcert=FILE` check the server's certificate against that CA (or the system's CAs without
//! `sslrootcert`), while `require` encrypts without checking, as libpq does when no root
//! certificate is given.

use std::str::FromStr;

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres::config::{Host, SslMode};
use postgres::{Client, Config};
use postgres_openssl::MakeTlsConnector;

/// libpq's default socket directory on Debian and the reference's packages.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    /// Encrypt if asked (`require`, `prefer`), check nothing.
    None,
    /// The chain against the CA, not the name (`verify-ca`).
    Chain,
    /// The chain and the host name (`verify-full`).
    Full,
}

/// Why a connection could not be made (or used), as text.
#[derive(Debug, Clone)]
pub struct ConnectError(pub String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

/// Where and how to connect.
#[derive(Clone)]
pub struct Target {
    config: Config,
    verify: Verify,
    root_cert: Option<String>,
    shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Target {
    pub fn parse(conninfo: &str) -> Result<Target, String> {
        let mut sslmode = None;
        let mut root_cert = None;
        let rest = strip_params(conninfo, &mut |k, v| match k {
            "sslmode" => {
                sslmode = Some(v.to_string());
                true
            }
            "sslrootcert" => {
                root_cert = Some(v.to_string());
                true
            }
            _ => false,
        });
        let mut config = Config::from_str(&rest)
            .map_err(|e| format!("the database connection string {conninfo:?}: {e}"))?;
        let verify = match sslmode.as_deref() {
            None | Some("prefer") | Some("allow") => {
                config.ssl_mode(SslMode::Prefer);
                Verify::None
            }
            Some("disable") => {
                config.ssl_mode(SslMode::Disable);
                Verify::None
            }
            Some("require") => {
                config.ssl_mode(SslMode::Require);
                // libpq: with a root certificate, `require` checks the chain like `verify-ca`.
                if root_cert.is_some() {
                    Verify::Chain
                } else {
                    Verify::None
                }
            }
            Some("verify-ca") => {
                config.ssl_mode(SslMode::Require);
                Verify::Chain
            }
            Some("verify-full") => {
                config.ssl_mode(SslMode::Require);
                Verify::Full
            }
            Some(other) => {
                return Err(format!(
                    "the database connection string: sslmode {other:?} is not one of disable, \
                     allow, prefer, require, verify-ca, verify-full"
                ))
            }
        };
        if config.get_hosts().is_empty() {
            config.host_path(DEFAULT_SOCKET_DIR);
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(h) => h.clone(),
                Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let shown = format!(
            "{}@{}:{}/{}",
            config.get_user().unwrap_or("?"),
            hosts.join(","),
            config.get_ports().first().copied().unwrap_or(5432),
            config.get_dbname().unwrap_or("?")
        );
        Ok(Target {
            config,
            verify,
            root_cert,
            shown,
        })
    }

    /// `user@host:port/dbname`, for messages (never the password).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    pub fn connect(&self) -> Result<Client, ConnectError> {
        let tls = self.tls().map_err(ConnectError)?;
        self.config
            .connect(tls)
            .map_err(|e| ConnectError(super::errors::describe(&e)))
    }

    fn tls(&self) -> Result<MakeTlsConnector, String> {
        let mut b =
            SslConnector::builder(SslMethod::tls()).map_err(|e| format!("TLS set-up: {e}"))?;
        match self.verify {
            Verify::None => b.set_verify(SslVerifyMode::NONE),
            Verify::Chain | Verify::Full => {
                b.set_verify(SslVerifyMode::PEER);
                if let Some(ca) = &self.root_cert {
                    b.set_ca_file(ca)
                        .map_err(|e| format!("the database's root certificate {ca}: {e}"))?;
                }
            }
        }
        let mut tls = MakeTlsConnector::new(b.build());
        if self.verify != Verify::Full {
            tls.set_callback(|c, _| {
                c.set_verify_hostname(false);
                Ok(())
            });
        }
        Ok(tls)
    }
}

/// `conninfo` without the parameters `take` consumes (it sees each key and value): both the
/// key-value form and a URL's query string.
fn strip_params(conninfo: &str, take: &mut dyn FnMut(&str, &str) -> bool) -> String {
    let s = conninfo.trim();
    if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        let Some((base, query)) = s.split_once('?') else {
            return s.to_string();
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                !take(k, v)
            })
            .collect();
        if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        s.split_whitespace()
            .filter(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                !take(k.trim(), v.trim().trim_matches('\''))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_default_means_the_default_socket_directory() {
        let t = Target::parse("postgresql://smp@/smp_server_store").unwrap();
        assert_eq!(t.shown(), "smp@/var/run/postgresql:5432/smp_server_store");
        assert_eq!(t.verify, Verify::None);
    }

    #[test]
    fn verify_modes_and_the_root_certificate_are_taken_out_of_the_string() {
        let t = Target::parse(
            "host=db.example port=6432 user=smp dbname=s sslmode=verify-full sslrootcert=/ca.crt",
        )
        .unwrap();
        assert_eq!(t.verify, Verify::Full);
        assert_eq!(t.root_cert.as_deref(), Some("/ca.crt"));
        assert_eq!(t.shown(), "smp@db.example:6432/s");
        let t = Target::parse("postgresql://smp@db:5433/s?sslmode=verify-ca&connect_timeout=5")
            .unwrap();
        assert_eq!(t.verify, Verify::Chain);
        assert_eq!(
            t.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(5))
        );
        assert!(Target::parse("host=x sslmode=sometimes").is_err());
        assert!(Target::parse("host=x nonsense=1").is_err());
    }
}
