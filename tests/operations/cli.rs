//! The operator's command line: `init` writes credentials and prints the server address, refuses to
//! overwrite; `start` refuses a second instance on the same data directory, and serves certificates
//! made as the reference makes them (Ed448 and Ed25519); every subcommand has `--help`.

use crate::common;
use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{run_bin, run_cli, Relay, TempDir};

const CREDENTIAL_FILES: [&str; 5] = [
    "ca.key",
    "ca.crt",
    "server.key",
    "server.crt",
    "fingerprint",
];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn init_writes_credentials_and_prints_the_address() {
    let dir = TempDir::new("cli-init").expect("a temp dir");
    let out = run_cli(
        dir.path(),
        &[
            "init",
            "--host",
            "127.0.0.1",
            "--port",
            "7001",
            "--no-password",
        ],
    );
    assert!(out.status.success(), "init: {}", text(&out.stderr));
    for f in CREDENTIAL_FILES {
        assert!(dir.path().join(f).is_file(), "{f} written");
    }
    let fp = std::fs::read_to_string(dir.path().join("fingerprint")).expect("fingerprint");
    let fp = fp.trim();
    // The fingerprint is base64url (with padding) of SHA-256 over the CA certificate's DER
    // (simplexmq `Transport/Client.hs`).
    let ca = common::cert_der(dir.path(), "ca.crt");
    assert_eq!(
        common::decode_fingerprint(fp),
        Some(openssl::sha::sha256(&ca))
    );
    assert!(fp.ends_with('='), "base64url with padding: {fp}");
    let stdout = text(&out.stdout);
    let address = format!("smp://{fp}@127.0.0.1:7001");
    assert!(
        stdout.lines().any(|l| l.trim() == address),
        "expected a line {address:?} in:\n{stdout}"
    );
    // The online certificate is issued by the CA and is Ed25519.
    let leaf = openssl::x509::X509::from_der(&common::cert_der(dir.path(), "server.crt"))
        .expect("server.crt");
    let ca = openssl::x509::X509::from_der(&ca).expect("ca.crt");
    assert!(leaf
        .verify(&ca.public_key().expect("CA key"))
        .expect("verify"));
    assert_eq!(
        leaf.public_key().expect("leaf key").id(),
        openssl::pkey::Id::ED25519
    );
}

#[test]
fn init_with_a_password_puts_it_in_the_address() {
    let dir = TempDir::new("cli-pass").expect("a temp dir");
    let out = run_cli(dir.path(), &["init", "--host", "127.0.0.1"]);
    assert!(out.status.success(), "init: {}", text(&out.stderr));
    let fp = std::fs::read_to_string(dir.path().join("fingerprint")).expect("fingerprint");
    let prefix = format!("smp://{}:", fp.trim());
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no address with a password in:\n{stdout}"));
    let password = &line[prefix.len()..line.find('@').expect("@host")];
    assert!(!password.is_empty(), "{line}");
    // The default port is left out, as the reference prints the address.
    assert!(line.ends_with("@127.0.0.1"), "default port: {line}");
    // `address` prints it again, and every start logs it (with the port it serves on).
    let again = run_cli(dir.path(), &["address"]);
    assert!(again.status.success(), "address: {}", text(&again.stderr));
    assert_eq!(text(&again.stdout).trim(), line);
    let mut relay = Relay::start_in(dir, common::RelayOptions::default());
    let served = format!("{line}:{}", relay.port);
    assert!(
        relay.log_shows(&format!("server address: {served}")),
        "{}",
        relay.log_text()
    );
    relay.stop();
}

#[test]
fn init_refuses_to_overwrite() {
    let dir = TempDir::new("cli-twice").expect("a temp dir");
    common::init(dir.path());
    let before: Vec<Vec<u8>> = CREDENTIAL_FILES
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).expect("read"))
        .collect();
    let out = run_cli(
        dir.path(),
        &["init", "--host", "127.0.0.1", "--no-password"],
    );
    assert!(!out.status.success(), "second init must fail");
    assert!(!text(&out.stderr).trim().is_empty(), "and say why");
    let after: Vec<Vec<u8>> = CREDENTIAL_FILES
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).expect("read"))
        .collect();
    assert!(before == after, "credentials unchanged");
}

#[test]
fn second_start_on_the_same_data_dir_fails() {
    let relay = Relay::start();
    let port = common::free_port().to_string();
    let out = run_cli(
        relay.dir.path(),
        &["start", "--port", &port, "--cores", "1"],
    );
    assert!(!out.status.success(), "second start must fail");
    let msg = format!("{}{}", text(&out.stdout), text(&out.stderr)).to_lowercase();
    assert!(
        msg.contains("already running") || msg.contains("lock"),
        "message should say the data dir is in use:\n{msg}"
    );
    relay.assert_serves();
}

/// A log that goes to a file or a pipe (stderr not a terminal) is plain text: no colour codes.
#[test]
fn a_log_written_to_a_pipe_has_no_colour_codes() {
    let relay = Relay::start();
    relay.assert_serves();
    let log = relay.log_text();
    assert!(log.contains("listening"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "no terminal escape sequences in a piped log:\n{log:?}"
    );
}

/// Subcommand names listed under "Commands:" in the top-level help.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.trim_start().starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn help_works_for_every_subcommand() {
    let out = run_bin(&["--help"]);
    assert!(out.status.success());
    let top = text(&out.stdout);
    let cmds = subcommands(&top);
    for expected in ["init", "start"] {
        assert!(cmds.iter().any(|c| c == expected), "{expected} in:\n{top}");
    }
    for c in &cmds {
        let out = run_bin(&[c, "--help"]);
        assert!(out.status.success(), "{c} --help");
        let help = text(&out.stdout);
        assert!(help.contains("Usage"), "{c} --help:\n{help}");
    }
    let init_help = text(&run_bin(&["init", "--help"]).stdout);
    for flag in ["--host", "--port", "--no-password"] {
        assert!(init_help.contains(flag), "init --help mentions {flag}");
    }
    let start_help = text(&run_bin(&["start", "--help"]).stdout);
    for flag in ["--port", "--cores"] {
        assert!(start_help.contains(flag), "start --help mentions {flag}");
    }
    // The defaults of the settings' table (`settings.rs`), each after its flag's help.
    for default in [
        "(ini `[RELAY] quota`) [default: 128]",
        "(ini `[RELAY] tls_timeout_secs`) [default: 60]",
        "(ini `[STORE_LOG] expire_messages_days`) [default: 1814400 (21 days)]",
    ] {
        assert!(
            start_help.contains(default),
            "start --help shows {default:?}:\n{start_help}"
        );
    }
}

/// Certificates made as the reference's `init -a ED448` makes them (Ed448 CA and online key) are
/// served unchanged: this relay's client and OpenSSL's TLS client both complete the handshake
/// (the CertificateVerify and the hello's signed session key are Ed448 signatures), and a queue
/// works over it. Ed25519, the reference's default, likewise.
#[test]
fn certificates_made_as_the_reference_makes_them_are_served_ed448_and_ed25519() {
    for alg in ["ED448", "ED25519"] {
        let dir = TempDir::new("cli-reference-certs").expect("a temp dir");
        common::reference_certificates(dir.path(), alg, "127.0.0.1");
        let relay = Relay::start_in(dir, common::RelayOptions::default());
        let mut c = relay.client();
        let q = support::create(&mut c);
        support::send_ok(&mut c, &q, None, b"over an Ed448 or Ed25519 certificate");
        support::expect_body(&mut c, &q, b"over an Ed448 or Ed25519 certificate");
        let s = common::wire::openssl_connect(relay.addr, Some(&[b"smp/1"]), false)
            .unwrap_or_else(|e| panic!("{alg}: OpenSSL's TLS client: {e}"));
        let leaf = s.ssl().peer_certificate().expect("a certificate");
        let want = match alg {
            "ED448" => openssl::pkey::Id::ED448,
            _ => openssl::pkey::Id::ED25519,
        };
        assert_eq!(leaf.public_key().unwrap().id(), want, "{alg}");
    }
}

/// What a supervisor's restart-on-failure does: the relay ends (SIGKILL, or SIGTERM) while clients
/// hold idle connections, and is started again at once on the same port, once. The old process's
/// accepted sockets linger (FIN-WAIT-2, up to `tcp_fin_timeout`) and its listeners can outlive it
/// for a moment; neither may keep the new relay from listening.
#[test]
fn restart_at_once_after_kill_or_stop_with_live_connections() {
    for (how, cores) in [("SIGKILL", 1), ("SIGTERM", 2), ("SIGKILL", 2)] {
        let mut relay = Relay::start_with(common::RelayOptions {
            cores,
            ..Default::default()
        });
        let idle: Vec<_> = (0..8).map(|_| relay.client()).collect();
        if how == "SIGKILL" {
            relay.kill();
        } else {
            let status = relay.stop();
            assert!(status.success(), "{how}: clean stop: {status:?}");
        }
        if let Err(e) = relay.restart_once() {
            panic!("{how}, {cores} shards: an immediate restart failed: {e}");
        }
        relay.assert_serves();
        drop(idle);
    }
}

/// `start` on `dir` must fail at once; returns its stderr.
fn start_fails(dir: &std::path::Path, extra: &[&str]) -> String {
    let port = common::free_port().to_string();
    let mut args = vec!["start", "--port", &port];
    args.extend_from_slice(extra);
    let out = run_cli(dir, &args);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "start must fail; stderr:\n{stderr}");
    assert!(
        !stderr.contains("smp-relay cert"),
        "no advice to run a command that does not exist:\n{stderr}"
    );
    stderr
}

/// Two directories initialised separately: two identities.
fn two_inits() -> (TempDir, TempDir) {
    let (a, b) = (
        TempDir::new("cli-own").expect("a temp dir"),
        TempDir::new("cli-other").expect("a temp dir"),
    );
    common::init(a.path());
    common::init(b.path());
    (a, b)
}

fn copy_from(from: &TempDir, to: &TempDir, file: &str) {
    std::fs::copy(from.path().join(file), to.path().join(file)).expect("copy");
}

#[test]
fn start_refuses_a_ca_crt_that_did_not_issue_server_crt() {
    let (dir, other) = two_inits();
    copy_from(&other, &dir, "ca.crt");
    let stderr = start_fails(dir.path(), &["--cores", "1"]);
    for f in ["server.crt", "ca.crt"] {
        let path = dir.path().join(f).display().to_string();
        assert!(stderr.contains(&path), "names {path}:\n{stderr}");
    }
    assert!(stderr.contains("not issued by"), "says why:\n{stderr}");
}

#[test]
fn start_refuses_a_fingerprint_that_is_not_the_ca_s() {
    let (dir, other) = two_inits();
    // A consistent identity from the other init, under this directory's fingerprint.
    for f in ["ca.crt", "server.crt", "server.key"] {
        copy_from(&other, &dir, f);
    }
    let stderr = start_fails(dir.path(), &["--cores", "1"]);
    for f in ["fingerprint", "ca.crt"] {
        let path = dir.path().join(f).display().to_string();
        assert!(stderr.contains(&path), "names {path}:\n{stderr}");
    }
}

#[test]
fn start_names_both_files_when_server_key_does_not_match_server_crt() {
    let (dir, other) = two_inits();
    copy_from(&other, &dir, "server.key");
    let stderr = start_fails(dir.path(), &["--cores", "1"]);
    for f in ["server.key", "server.crt"] {
        let path = dir.path().join(f).display().to_string();
        assert!(stderr.contains(&path), "names {path}:\n{stderr}");
    }
    assert!(stderr.contains("init"), "says how to recover:\n{stderr}");
}

#[test]
fn start_names_a_missing_server_key_instead_of_initialising() {
    let dir = TempDir::new("cli-nokey").expect("a temp dir");
    common::init(dir.path());
    std::fs::remove_file(dir.path().join("server.key")).expect("remove server.key");
    let stderr = start_fails(dir.path(), &["--cores", "1"]);
    let path = dir.path().join("server.key").display().to_string();
    assert!(stderr.contains(&path), "names {path}:\n{stderr}");
    assert!(stderr.contains("missing"), "{stderr}");
    assert!(!stderr.contains("initialising"), "{stderr}");
    assert!(
        !dir.path().join("server.key").exists(),
        "no new key written"
    );
}

#[test]
fn a_corrupt_group_file_is_reported_by_its_file_not_as_shard_0() {
    let dir = TempDir::new("cli-group").expect("a temp dir");
    common::init(dir.path());
    let store = dir.path().join("memory-store");
    std::fs::create_dir_all(&store).expect("store dir");
    // Group 63 is shard 1's with two shards (`router::groups_of_shard`).
    std::fs::write(store.join("group-63.bin"), b"not a group file").expect("write");
    let stderr = start_fails(dir.path(), &["--cores", "2", "--store", "memory"]);
    let path = store.join("group-63.bin").display().to_string();
    assert!(stderr.contains(&path), "names {path}:\n{stderr}");
    assert!(!stderr.contains("shard 0"), "not shard 0's:\n{stderr}");
}

#[test]
fn cores_over_the_shard_limit_is_an_error_not_cut() {
    let dir = TempDir::new("cli-cores").expect("a temp dir");
    common::init(dir.path());
    let max = smp_relay::limits::MAX_SHARDS.to_string();
    let over = (smp_relay::limits::MAX_SHARDS + 1).to_string();
    let stderr = start_fails(dir.path(), &["--cores", &over]);
    assert!(stderr.contains("--cores"), "{stderr}");
    assert!(stderr.contains(&format!("1 to {max}")), "{stderr}");
}

// --- the open-file limit --------------------------------------------------------------------------

/// `start` with the open-file limit set to `soft`/`hard` before it runs, as a shell's `ulimit -n`
/// would.
fn start_with_nofile(dir: &std::path::Path, soft: u64, hard: u64, extra: &[&str]) -> Command {
    start_with_limit(dir, libc::RLIMIT_NOFILE, soft, hard, extra)
}

/// `start` with the limit `resource` set to `soft`/`hard` before it runs.
fn start_with_limit(
    dir: &std::path::Path,
    resource: libc::__rlimit_resource_t,
    soft: u64,
    hard: u64,
    extra: &[&str],
) -> Command {
    use std::os::unix::process::CommandExt;
    let port = common::free_port().to_string();
    let mut cmd = Command::new(common::BIN);
    cmd.args([
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "start",
        "--port",
        &port,
    ])
    .args(["--cores", "1"])
    .args(extra)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the child being started.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            if libc::setrlimit(resource, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// The soft and hard "Max open files" of a running process.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let mut n = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    (n.next().expect("soft"), n.next().expect("hard"))
}

/// This process's hard open-file limit: children cannot go above it.
fn own_hard_limit() -> u64 {
    open_file_limits(std::process::id()).1
}

const SHELL_SOFT_LIMIT: u64 = 1024;

#[test]
fn start_raises_its_open_file_limit_to_fit_max_connections() {
    let max_connections: u64 = 3000;
    let hard = own_hard_limit();
    assert!(
        hard > max_connections * 2,
        "this test needs a hard limit over {}",
        max_connections * 2
    );
    let dir = TempDir::new("cli-nofile").expect("a temp dir");
    common::init(dir.path());
    let cmd = start_with_nofile(
        dir.path(),
        SHELL_SOFT_LIMIT,
        hard,
        &["--max-connections", &max_connections.to_string()],
    );
    let (mut child, _log) = smp_relay::load::proc::wait_listening(
        {
            let mut cmd = cmd;
            cmd.spawn().expect("spawn")
        },
        common::START_TIMEOUT,
    )
    .expect("relay starts");
    let (soft, _) = open_file_limits(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        soft >= max_connections,
        "soft open-file limit {soft} below --max-connections {max_connections}"
    );
}

#[test]
fn start_refuses_max_connections_the_hard_limit_cannot_hold() {
    let dir = TempDir::new("cli-nofile-low").expect("a temp dir");
    common::init(dir.path());
    let hard = 2 * SHELL_SOFT_LIMIT;
    let cmd = start_with_nofile(
        dir.path(),
        SHELL_SOFT_LIMIT,
        hard,
        &["--max-connections", "5000"],
    );
    let out = common::wait_output(
        {
            let mut cmd = cmd;
            cmd.spawn().expect("spawn")
        },
        Duration::from_secs(30),
    );
    let msg = text(&out.stderr);
    assert!(!out.status.success(), "start must fail:\n{msg}");
    for what in ["--max-connections", "ulimit", "LimitNOFILE"] {
        assert!(msg.contains(what), "names {what}:\n{msg}");
    }
}

#[test]
fn the_default_connection_limit_fits_a_low_hard_limit() {
    let dir = TempDir::new("cli-nofile-default").expect("a temp dir");
    common::init(dir.path());
    let hard = 4 * SHELL_SOFT_LIMIT;
    let cmd = start_with_nofile(dir.path(), SHELL_SOFT_LIMIT, hard, &[]);
    let (mut child, log) = smp_relay::load::proc::wait_listening(
        {
            let mut cmd = cmd;
            cmd.spawn().expect("spawn")
        },
        common::START_TIMEOUT,
    )
    .expect("the default starts, with fewer connections");
    let (soft, _) = open_file_limits(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(soft, hard, "raised as far as the hard limit allows");
    let log = log.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(
        log.contains("RLIMIT_NOFILE"),
        "says why it holds fewer:\n{log}"
    );
}

#[test]
fn start_on_a_directory_with_only_a_configuration_says_how_to_initialise() {
    let dir = TempDir::new("cli-ini-only").expect("a temp dir");
    std::fs::write(dir.path().join("smp-server.ini"), "[RELAY]\nquota = 2\n").expect("write ini");
    let stderr = start_fails(dir.path(), &["--cores", "1"]);
    let ini = dir.path().join("smp-server.ini").display().to_string();
    assert!(stderr.contains(&ini), "names {ini}:\n{stderr}");
    assert!(stderr.contains("no keys"), "{stderr}");
    assert!(!stderr.contains("initialising"), "{stderr}");
    assert!(
        !dir.path().join("ca.crt").exists(),
        "nothing written besides the operator's file"
    );
}

#[test]
fn start_refuses_a_hard_limit_below_what_the_shards_need() {
    let dir = TempDir::new("cli-nofile-tiny").expect("a temp dir");
    common::init(dir.path());
    let cmd = start_with_nofile(dir.path(), SHELL_SOFT_LIMIT, SHELL_SOFT_LIMIT, &[]);
    let out = common::wait_output(
        {
            let mut cmd = cmd;
            cmd.spawn().expect("spawn")
        },
        Duration::from_secs(30),
    );
    let msg = text(&out.stderr);
    assert!(!out.status.success(), "start must fail:\n{msg}");
    for what in ["RLIMIT_NOFILE", "LimitNOFILE", "--cores"] {
        assert!(msg.contains(what), "names {what}:\n{msg}");
    }
}

/// `--log-level debug` shows each connection: its peer, version, open and close; and the stop's
/// last line says what the store holds.
#[test]
fn debug_logs_name_each_connection_and_the_stop_says_what_was_saved() {
    let mut relay = Relay::start_with(common::RelayOptions {
        extra_args: vec!["--log-level".into(), "debug".into()],
        ..Default::default()
    });
    let mut c = relay.client();
    let q = support::create(&mut c);
    support::send_ok(&mut c, &q, None, b"kept over the stop");
    drop(c);
    // The close is logged when the relay sees the socket end: wait for it before the stop, which
    // may otherwise come first (the connection then ends with the relay, unlogged).
    let closed = |l: &str| {
        l.contains("peer=Some(127.0.0.1:")
            && l.contains("connection")
            && (l.contains("closed") || l.contains("ended"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !relay.log_text().lines().any(closed) && std::time::Instant::now() < deadline {
        common::sleep(std::time::Duration::from_millis(20));
    }
    let status = relay.stop();
    assert!(status.success(), "{status:?}");
    let log = relay.log_text();
    let open = log
        .lines()
        .find(|l| l.contains("connection open"))
        .unwrap_or_else(|| panic!("no connection open line:\n{log}"));
    assert!(open.contains("peer=Some(127.0.0.1:"), "{open}");
    assert!(open.contains("version=20"), "{open}");
    assert!(log.lines().any(closed), "{log}");
    // The stop's last line may still be in the pipe when the exit is seen (another thread reads
    // it): `log_shows` waits for it.
    assert!(
        relay.log_shows("store holds 1 queues and 1 messages"),
        "{}",
        relay.log_text()
    );
}

/// `cert` makes a new online certificate under the same CA, as the reference's `cert`: the
/// fingerprint (the server address) stays, the algorithm and common name are the current
/// certificate's unless given, and the relay serves the new one; without `ca.key` it says so.
#[test]
fn cert_makes_a_new_online_certificate_under_the_same_ca() {
    let dir = TempDir::new("cli-cert").expect("a temp dir");
    common::reference_certificates(dir.path(), "ED448", "127.0.0.1");
    let fingerprint = std::fs::read_to_string(dir.path().join("fingerprint")).unwrap();
    let leaf = |dir: &Path| std::fs::read(dir.join("server.crt")).unwrap();
    let before = leaf(dir.path());
    let out = run_cli(dir.path(), &["cert"]);
    assert!(out.status.success(), "cert: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Ed448, CN=127.0.0.1"),
        "{}",
        text(&out.stdout)
    );
    assert_ne!(leaf(dir.path()), before, "a new certificate");
    let out = run_cli(
        dir.path(),
        &[
            "cert",
            "--sign-algorithm",
            "ED25519",
            "--cn",
            "relay.example.com",
        ],
    );
    assert!(
        out.status.success(),
        "cert -a ED25519: {}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("fingerprint")).unwrap(),
        fingerprint,
        "the address stays"
    );
    let cert = openssl::x509::X509::from_pem(&leaf(dir.path())).unwrap();
    let cn = cert
        .subject_name()
        .entries_by_nid(openssl::nid::Nid::COMMONNAME)
        .next()
        .unwrap();
    assert_eq!(cn.data().as_slice(), b"relay.example.com");
    let relay = Relay::start_in(dir, common::RelayOptions::default());
    let s = common::wire::openssl_connect(relay.addr, Some(&[b"smp/1"]), false).expect("TLS");
    let served = s.ssl().peer_certificate().expect("a certificate");
    assert_eq!(
        served.to_der().unwrap(),
        cert.to_der().unwrap(),
        "the new one is served"
    );
    assert_eq!(
        served.public_key().unwrap().id(),
        openssl::pkey::Id::ED25519
    );
    relay
        .client()
        .ping()
        .expect("clients accept it under the old address");

    let offline = TempDir::new("cli-cert-offline").expect("a temp dir");
    common::reference_certificates(offline.path(), "ED25519", "127.0.0.1");
    std::fs::remove_file(offline.path().join("ca.key")).unwrap();
    let out = run_cli(offline.path(), &["cert"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("ca.key"),
        "{}",
        text(&out.stderr)
    );
}

/// The reference's two directories: `init` and `address` find them through the reference's
/// environment variables (SMP_SERVER_CFG_PATH, SMP_SERVER_LOG_PATH), `start` through
/// `--config-dir` and `--log-dir`: the identity and configuration stay in the first, the store
/// goes to the second.
#[test]
fn the_reference_directories_by_environment_and_by_option() {
    let etc = TempDir::new("cli-etc").expect("a temp dir");
    let var = TempDir::new("cli-var").expect("a temp dir");
    let (cfg, log) = (etc.path().join("simplex"), var.path().join("simplex"));
    let with_env = |args: &[&str]| common::run_with_reference_env(&cfg, &log, args);
    let out = with_env(&["init", "--host", "relay.example", "--no-password"]);
    assert!(out.status.success(), "init: {}", text(&out.stderr));
    let printed = text(&out.stdout).trim().to_string();
    for f in CREDENTIAL_FILES.iter().chain(&["smp-server.ini"]) {
        assert!(
            cfg.join(f).is_file(),
            "{f} is not in the configuration directory"
        );
        assert!(!log.join(f).exists(), "{f} is in the log directory");
    }
    assert!(log.is_dir(), "init did not make the log directory");
    let out = with_env(&["address"]);
    assert!(out.status.success(), "address: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), printed);
    assert!(printed.ends_with("@relay.example"), "{printed}");

    // `start` with the options: a message kept over a restart lives in the log directory.
    let data = TempDir::new("cli-var-data").expect("a temp dir");
    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::rename(&log, data.path()).unwrap();
    let mut relay = Relay::start_in(
        data,
        common::RelayOptions {
            extra_args: vec!["--config-dir".into(), cfg.to_str().unwrap().into()],
            ..Default::default()
        },
    );
    let mut c = relay.client();
    let q = support::create(&mut c);
    support::send_ok(&mut c, &q, None, b"in the log directory");
    drop(c);
    assert!(relay.stop().success());
    // The test starts it on another port; the rest of the address is the same.
    let (without_port, _) = printed.rsplit_once(':').unwrap();
    assert!(
        relay.log_text().contains(without_port),
        "{}",
        relay.log_text()
    );
    let entries = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let mut expected_cfg: Vec<String> = CREDENTIAL_FILES
        .iter()
        .chain(&["smp-server.ini"])
        .map(|s| s.to_string())
        .collect();
    expected_cfg.sort();
    assert_eq!(
        entries(&cfg),
        expected_cfg,
        "the store wrote into the configuration directory"
    );
    assert!(
        entries(relay.dir.path())
            .iter()
            .any(|e| e == "journal" || e == "memory-store" || e == "postgres-store"),
        "no store in the log directory: {:?}",
        entries(relay.dir.path())
    );
    relay.restart_with(&["--config-dir", cfg.to_str().unwrap()]);
    let mut c = relay.client();
    let m = support::sub_with_msg(&mut c, &q);
    assert_eq!(m.msg.body(), Some(&b"in the log directory"[..]));
    drop(c);
    relay.stop();

    // A configuration directory without the identity (a typo) is not initialised anew: the
    // store's users know the old address.
    let typo = etc.path().join("simplx");
    let out = common::run_with_reference_env(&typo, relay.dir.path(), &["start"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("holds no server identity") && stderr.contains("init"),
        "{stderr}"
    );
    assert!(!typo.join("server.key").exists(), "start made an identity");
}

/// Locked memory (RLIMIT_MEMLOCK) below the 512 KiB glommio needs for each shard's io_uring: a
/// soft limit the hard one allows to raise is raised; otherwise `start` says how to raise it
/// instead of every shard failing.
#[test]
fn start_raises_or_names_a_locked_memory_limit_below_what_io_uring_needs() {
    let dir = TempDir::new("cli-memlock").expect("a temp dir");
    common::init(dir.path());
    let mut cmd = start_with_limit(dir.path(), libc::RLIMIT_MEMLOCK, 65536, 65536, &[]);
    let out = common::wait_output(cmd.spawn().expect("spawn"), Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("RLIMIT_MEMLOCK allows 64 KiB") && stderr.contains("LimitMEMLOCK"),
        "{stderr}"
    );

    let mut cmd = start_with_limit(dir.path(), libc::RLIMIT_MEMLOCK, 65536, 1 << 20, &[]);
    let child = cmd.spawn().expect("spawn");
    let (mut child, log) =
        smp_relay::load::proc::wait_listening(child, Duration::from_secs(30)).expect("listening");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .unwrap()
        .to_string();
    assert_eq!(
        line.split_whitespace().nth(3),
        Some("524288"),
        "{line}\n{}",
        log.lock().map(|l| l.join("\n")).unwrap_or_default()
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The first port an unprivileged process may bind (`net.ipv4.ip_unprivileged_port_start`, 1024
/// unless the host lowered it).
fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

/// A port below 1024 that an unprivileged user may not bind is refused for that reason, not
/// reported as in use: `start --port P` as `nobody` names root and `CAP_NET_BIND_SERVICE`. CI
/// runs as root, where the bind succeeds, so the relay runs as `nobody` (uid and gid 65534, no
/// supplementary groups: root's capabilities go with the uid), from a copy of the binary in a
/// directory any user can read, on a data directory owned by `nobody`.
#[test]
fn a_privileged_port_is_named_as_such_not_as_in_use() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    let start = unprivileged_port_start();
    assert!(
        start > 1,
        "net.ipv4.ip_unprivileged_port_start is {start}: every port is unprivileged on this host, \
         so the refusal this test checks cannot happen"
    );
    let root = unsafe { libc::geteuid() } == 0;
    // A privileged port no one listens on (as root, one that binds); unprivileged, any is refused.
    let port = (1..start)
        .rev()
        .find(|p| !root || std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
        .expect("a free privileged port");

    let bin_dir = TempDir::new("cli-privileged-bin").expect("a temp dir");
    let bin = bin_dir.path().join("smp-relay");
    std::fs::copy(common::BIN, &bin).expect("copy the binary");
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = TempDir::new("cli-privileged-data").expect("a temp dir");
    if root {
        let c = std::ffi::CString::new(data.path().to_str().unwrap()).unwrap();
        // SAFETY: chown(2) on a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), NOBODY, NOBODY) }, 0);
    }

    let mut cmd = Command::new(&bin);
    cmd.args(["--data-dir", data.path().to_str().unwrap()])
        .args(["start", "--cores", "1", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if root {
        // SAFETY: setgroups, setgid and setuid are async-signal-safe and change only the child.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = common::wait_output(cmd.spawn().expect("spawn"), common::COMMAND_TIMEOUT);
    let stderr = common::strip_ansi(&text(&out.stderr));
    assert!(!out.status.success(), "start must fail:\n{stderr}");
    assert!(
        !stderr.contains("in use"),
        "nothing listens on port {port}; the refusal is a permission:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("port {port} may not be listened on by this user"))
            && stderr.contains("CAP_NET_BIND_SERVICE")
            && stderr.contains("below 1024"),
        "the cause named:\n{stderr}"
    );
}

/// Every file under `dir` and `dir` itself with their modes (permission bits).
fn modes_under(dir: &Path) -> Vec<(std::path::PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = vec![(
        dir.to_path_buf(),
        std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
    )];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(modes_under(&p));
        } else {
            out.push((
                p.clone(),
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            ));
        }
    }
    out
}

/// A queue record holds the queue's keys and DH secret, so a data directory the relay makes is
/// its user's alone (0700), and so are the store's directories and files (0600); the keys were
/// 0600 already. A directory someone else made readable is warned about at start.
#[test]
fn the_store_is_readable_by_the_relay_s_user_alone() {
    let parent = TempDir::new("cli-modes").expect("a temp dir");
    let data = parent.path().join("data");
    let out = run_cli(&data, &["init", "--no-password"]);
    assert!(out.status.success(), "init: {}", text(&out.stderr));
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&data), 0o700, "init makes the data directory 0700");
    // `start` on a directory that does not exist initialises it the same way.
    let auto = parent.path().join("auto");
    let port = common::free_port().to_string();
    let child = Command::new(common::BIN)
        .args([
            "--data-dir",
            auto.to_str().unwrap(),
            "start",
            "--cores",
            "1",
        ])
        .args(["--port", &port])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (mut child, log) =
        smp_relay::load::proc::wait_listening(child, common::START_TIMEOUT).expect("listening");
    assert_eq!(
        mode(&auto),
        0o700,
        "start initialises the data directory 0700"
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !log.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("may be read by other users")),
        "no warning about a 0700 directory"
    );

    for store in ["journal", "memory"] {
        // A data directory others may read: the start warns, naming the fix.
        let dir = TempDir::new("cli-modes-store").expect("a temp dir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        common::init(dir.path());
        let opts = common::RelayOptions {
            extra_args: vec!["--store".into(), store.into()],
            ..common::RelayOptions::default()
        };
        let mut relay = Relay::start_in(dir, opts);
        let mut c = relay.client();
        let q = support::create(&mut c);
        support::send_ok(&mut c, &q, None, b"a message");
        drop(c);
        assert!(
            relay.log_shows("may be read by other users (mode 0755)")
                && relay.log_shows(&format!("chmod 700 {}", relay.dir.path().display())),
            "{store}: start warns about a data directory others may read:\n{}",
            relay.log_text()
        );
        assert!(relay.stop().success());
        let store_dir = relay.dir.path().join(if store == "journal" {
            "journal"
        } else {
            "memory-store"
        });
        let modes = modes_under(&store_dir);
        assert!(modes.len() > 1, "{store}: files were written: {modes:?}");
        for (p, m) in modes {
            let want = if p.is_dir() { 0o700 } else { 0o600 };
            assert_eq!(m, want, "{store}: {} is {m:04o}", p.display());
        }
    }
}
