//! What the repository ships besides the code, checked as text: the systemd unit
//! (`deploy/smp-relay.service`) and the override the README's "Moving from smp-server" shows let
//! the relay write the directories they tell it to use; log texts have no runs of spaces left by
//! a string continuation.
//!
//! `systemd-analyze verify` (CI) checks the unit's syntax only: under `ProtectSystem=strict` the
//! whole file system is read-only to the service but for its `ReadWritePaths`, so a `--log-dir`
//! outside them fails at start (`cannot open the lock file …/lock: Read-only file system`).

use std::path::{Path, PathBuf};

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `[Service]` settings that decide what the relay may write, as systemd reads a unit and
/// then its drop-in overrides: an empty `ExecStart=` or `ReadWritePaths=` resets the list.
#[derive(Default, Debug)]
struct Service {
    exec_start: Vec<String>,
    read_write_paths: Vec<String>,
    protect_system: Option<String>,
}

impl Service {
    /// Applies the `[Service]` lines of `text` (a unit file or an override) on top.
    fn apply(&mut self, text: &str) {
        let mut in_service = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_service = line == "[Service]";
                continue;
            }
            if !in_service || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            match key.trim() {
                "ExecStart" if value.is_empty() => self.exec_start.clear(),
                "ExecStart" => self.exec_start.push(value.to_string()),
                "ReadWritePaths" if value.is_empty() => self.read_write_paths.clear(),
                "ReadWritePaths" => self.read_write_paths.extend(
                    value
                        .split_whitespace()
                        // `-` (ignore if missing) and `+` (outside the namespace) prefixes.
                        .map(|p| p.trim_start_matches(['-', '+']).to_string()),
                ),
                "ProtectSystem" => self.protect_system = Some(value.to_string()),
                _ => {}
            }
        }
    }

    /// The directories the relay is told to write (`--data-dir`, `--log-dir`).
    fn written_dirs(&self) -> Vec<PathBuf> {
        assert_eq!(
            self.exec_start.len(),
            1,
            "one ExecStart for a Type=simple service: {:?}",
            self.exec_start
        );
        let args: Vec<&str> = self.exec_start[0].split_whitespace().collect();
        let mut dirs = Vec::new();
        for (i, a) in args.iter().enumerate() {
            for flag in ["--data-dir", "--log-dir"] {
                if *a == flag {
                    dirs.push(PathBuf::from(
                        args.get(i + 1).expect("a value after the flag"),
                    ));
                } else if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
                    dirs.push(PathBuf::from(v));
                }
            }
        }
        assert!(
            !dirs.is_empty(),
            "{:?} names no directory: the relay would write ./smp-data under the service's \
             working directory, read-only under ProtectSystem=strict",
            self.exec_start[0]
        );
        dirs
    }

    /// Directories the relay is told to write that the sandbox keeps read-only.
    fn read_only_dirs(&self) -> Vec<PathBuf> {
        assert_eq!(
            self.protect_system.as_deref(),
            Some("strict"),
            "this check assumes ProtectSystem=strict (everything read-only but ReadWritePaths)"
        );
        self.written_dirs()
            .into_iter()
            .filter(|d| {
                !self
                    .read_write_paths
                    .iter()
                    .any(|rw| d.starts_with(Path::new(rw)))
            })
            .collect()
    }
}

/// The ini block after "put in the override" in the README's "Moving from smp-server".
fn readme_override() -> String {
    let readme = repo_file("README.md");
    let section = readme
        .split("### Moving from smp-server")
        .nth(1)
        .expect("the README's \"Moving from smp-server\" section");
    let after = section
        .split("put in the override")
        .nth(1)
        .expect("the override in \"Moving from smp-server\"");
    let block = after
        .split("```ini")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("an ini block after \"put in the override\"");
    block.lines().map(str::trim).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_unit_lets_the_relay_write_its_data_directory() {
    let mut unit = Service::default();
    unit.apply(&repo_file("deploy/smp-relay.service"));
    assert_eq!(
        unit.read_only_dirs(),
        Vec::<PathBuf>::new(),
        "directories of the unit's ExecStart outside its ReadWritePaths {:?}",
        unit.read_write_paths
    );
}

#[test]
fn the_readme_s_override_for_moving_from_smp_server_lets_the_relay_write_its_log_dir() {
    let mut service = Service::default();
    service.apply(&repo_file("deploy/smp-relay.service"));
    let override_text = readme_override();
    service.apply(&override_text);
    assert!(
        service
            .written_dirs()
            .contains(&PathBuf::from("/var/opt/simplex")),
        "the override runs the relay on the reference's log directory:\n{override_text}"
    );
    assert_eq!(
        service.read_only_dirs(),
        Vec::<PathBuf>::new(),
        "directories the README's override tells the relay to write that the unit's \
         ProtectSystem=strict keeps read-only (ReadWritePaths {:?}); the override must add them:\n\
         {override_text}",
        service.read_write_paths
    );
}

/// A string continued on the next line with `\` drops the next line's indentation; one continued
/// without it keeps every space (`the relay          goes on serving` in a log line).
#[test]
fn no_string_literal_carries_a_run_of_indentation() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("journal/src"), &mut files);
    assert!(files.len() > 50, "the sources were found: {}", files.len());
    let mut found = Vec::new();
    for f in &files {
        for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            // Words on both sides of 8 or more spaces inside a quoted text on one line.
            let quoted = line.split('"').skip(1).step_by(2);
            for q in quoted {
                let run = q.match_indices("        ").any(|(i, _)| {
                    let before = q[..i].chars().next_back();
                    let after = q[i..].trim_start_matches(' ').chars().next();
                    before.is_some_and(|c| c.is_alphabetic())
                        && after.is_some_and(|c| c.is_alphabetic())
                });
                if run {
                    found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "runs of spaces in texts:\n{}",
        found.join("\n")
    );
}
