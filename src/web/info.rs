//! What the server information page says: the operator's `[INFORMATION]` (checked as the
//! reference checks it, simplexmq `src/Simplex/Messaging/Server/Main.hs`, `serverPublicInfo`) and
//! the relay's public configuration (`Server/Information.hs`, `ServerPublicConfig`), as the
//! template fields `site.rs` fills.

use std::time::Duration;

/// `[INFORMATION]`, each key as set (values checked by `Information::set`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Information {
    values: Vec<(&'static str, String)>,
}

/// The keys of `[INFORMATION]`.
pub const KEYS: &[&str] = &[
    "source_code",
    "usage_conditions",
    "condition_amendments",
    "server_country",
    "operator",
    "operator_country",
    "website",
    "admin_simplex",
    "admin_email",
    "admin_pgp",
    "admin_pgp_fingerprint",
    "complaints_simplex",
    "complaints_email",
    "complaints_pgp",
    "complaints_pgp_fingerprint",
    "hosting",
    "hosting_country",
    "hosting_type",
];

/// `hosting_type`'s values, as the file writes them and as the page shows them.
const HOSTING_TYPES: &[(&str, &str)] = &[
    ("virtual", "Virtual"),
    ("dedicated", "Dedicated"),
    ("colocation", "Colocation"),
    ("owned", "Owned"),
];

impl Information {
    /// Sets `key` (one of `KEYS`) to `value`; the error says what the value should be. Countries
    /// are ISO 3166 two-letter codes (kept in capitals), `hosting_type` one of four words and a
    /// SimpleX address a link the apps open.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let key = *KEYS
            .iter()
            .find(|k| **k == key)
            .ok_or_else(|| format!("`{key}` is not a key of [INFORMATION]"))?;
        let value = if key.ends_with("country") {
            if value.len() != 2 || !value.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err("an ISO 3166 two-letter country code, e.g. DE".into());
            }
            value.to_ascii_uppercase()
        } else if key == "hosting_type" {
            HOSTING_TYPES
                .iter()
                .find(|(k, _)| *k == value)
                .map(|(_, shown)| shown.to_string())
                .ok_or("virtual, dedicated, colocation or owned")?
        } else if key.ends_with("_simplex") {
            let link = ["https://", "simplex:/"]
                .iter()
                .any(|p| value.starts_with(p) && value.contains('#'));
            if !link || value.contains(char::is_whitespace) {
                return Err(
                    "a SimpleX contact address, as the app shows it (https://…#… or simplex:/…#…)"
                        .into(),
                );
            }
            value.to_string()
        } else {
            value.to_string()
        };
        self.values.retain(|(k, _)| *k != key);
        self.values.push((key, value));
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// Whether any key is set.
    pub fn is_empty(&self) -> bool {
        self.values.iter().all(|(_, v)| v.is_empty())
    }
}

/// What the page says of the relay's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicConfig {
    /// Whether queues, and messages, survive a restart.
    pub keeps_queues: bool,
    pub keeps_messages: bool,
    pub message_ttl: Duration,
    /// `[STORE_LOG] log_stats`.
    pub stats: bool,
    /// `[AUTH] new_queues`.
    pub new_queues: bool,
    /// `[AUTH] create_password` is set.
    pub basic_auth: bool,
}

/// The build's commit, when the build was given one (`SMP_RELAY_COMMIT=$(git rev-parse HEAD)
/// cargo build --release`).
pub const COMMIT: Option<&str> = option_env!("SMP_RELAY_COMMIT");
/// Where the relay's source is published, for the commit's link.
pub const SOURCE: &str = env!("CARGO_PKG_REPOSITORY");

/// The template fields of the server information page (`web/index.html`): each set field with
/// its value. A field that is not set leaves out the sections named after it.
pub fn fields(
    info: &Information,
    config: &PublicConfig,
    onion_host: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut f: Vec<(&'static str, String)> = Vec::new();
    let yes_no = |b: bool| if b { "Yes" } else { "No" }.to_string();
    f.push((
        "persistence",
        match (config.keeps_queues, config.keeps_messages) {
            (false, _) => "In-memory only",
            (true, false) => "Queues",
            (true, true) => "Queues and messages",
        }
        .into(),
    ));
    f.push(("message_expiration", ttl_text(config.message_ttl.as_secs())));
    f.push(("stats_enabled", yes_no(config.stats)));
    f.push(("new_queues_allowed", yes_no(config.new_queues)));
    f.push(("basic_auth_enabled", yes_no(config.basic_auth)));
    f.push(("software", "smp-relay".into()));
    f.push(("version", crate::metrics::VERSION.into()));
    if let Some(commit) = COMMIT.filter(|c| !c.is_empty()) {
        f.push(("commit", commit.into()));
        f.push(("short_commit", commit.chars().take(7).collect()));
        if !SOURCE.is_empty() {
            f.push(("commit_url", format!("{SOURCE}/commit/{commit}")));
        }
    }
    if let Some(host) = onion_host {
        f.push(("onion_host", host.into()));
    }
    // Without `source_code` the reference shows none of the rest (its licence asks for the
    // source first), and neither does this page.
    let Some(source) = info.get("source_code") else {
        f.push(("no_source_code", "yes".into()));
        return f;
    };
    f.push(("information", "yes".into()));
    f.push(("source_code", source.into()));
    let copy = |f: &mut Vec<(&'static str, String)>, key: &'static str, field: &'static str| {
        if let Some(v) = info.get(key) {
            f.push((field, v.into()));
        }
    };
    copy(&mut f, "website", "website");
    copy(&mut f, "server_country", "server_country");
    copy(&mut f, "hosting_type", "hosting_type");
    if info.get("usage_conditions").is_some() {
        copy(&mut f, "usage_conditions", "usage_conditions");
        copy(&mut f, "condition_amendments", "usage_amendments");
    }
    for (name, country) in [
        ("operator", "operator_country"),
        ("hosting", "hosting_country"),
    ] {
        if info.get(name).is_some() {
            copy(&mut f, name, name);
            copy(&mut f, country, country);
        }
    }
    for group in ["admin", "complaints"] {
        contacts(info, group, &mut f);
    }
    f
}

/// A contact group (`admin`, `complaints`): shown when it has an address or an email, or a PGP
/// key with its fingerprint (a key without one, or a fingerprint alone, is not shown).
fn contacts(info: &Information, group: &'static str, f: &mut Vec<(&'static str, String)>) {
    // Each field is named as its key, `KEYS`' own 'static name.
    let set = |what: &str| {
        let key = format!("{group}_{what}");
        let key = *KEYS.iter().find(|k| **k == key)?;
        Some((key, info.get(key)?.to_string()))
    };
    let (simplex, email) = (set("simplex"), set("email"));
    let pgp = set("pgp").zip(set("pgp_fingerprint"));
    if simplex.is_none() && email.is_none() && pgp.is_none() {
        return;
    }
    f.push((group, "yes".into()));
    f.extend(simplex);
    f.extend(email);
    if let Some((uri, fingerprint)) = pgp {
        f.push(uri);
        f.push(fingerprint);
    }
}

/// A lifetime in seconds as the apps word it: months of 30 days, weeks for 7 and 14 days, then
/// hours, minutes and seconds, the zero parts left out ("1 month 5 days", "21 days").
pub fn ttl_text(secs: u64) -> String {
    if secs == 0 {
        return "0 sec".into();
    }
    let (mins, s) = (secs / 60, secs % 60);
    let (hours, m) = (mins / 60, mins % 60);
    let (days, h) = (hours / 24, hours % 24);
    let (months, d) = (days / 30, days % 30);
    let mut parts = Vec::new();
    match months {
        0 => {}
        1 => parts.push("1 month".to_string()),
        n => parts.push(format!("{n} months")),
    }
    match d {
        0 => {}
        1 => parts.push("1 day".into()),
        7 => parts.push("1 week".into()),
        14 => parts.push("2 weeks".into()),
        n => parts.push(format!("{n} days")),
    }
    match h {
        0 => {}
        1 => parts.push("1 hour".into()),
        n => parts.push(format!("{n} hours")),
    }
    if m > 0 {
        parts.push(format!("{m} min"));
    }
    if s > 0 {
        parts.push(format!("{s} sec"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_are_worded_as_the_apps_word_them() {
        assert_eq!(ttl_text(21 * 86_400), "21 days");
        assert_eq!(ttl_text(7 * 86_400), "1 week");
        assert_eq!(ttl_text(30 * 86_400), "1 month");
        assert_eq!(
            ttl_text(74 * 86_400 + 3600 + 61),
            "2 months 2 weeks 1 hour 1 min 1 sec"
        );
        assert_eq!(ttl_text(45 * 86_400), "1 month 15 days");
        assert_eq!(ttl_text(0), "0 sec");
    }

    #[test]
    fn values_are_checked_and_normalised() {
        let mut i = Information::default();
        assert!(i.set("server_country", "de").is_ok());
        assert_eq!(i.get("server_country"), Some("DE"));
        assert!(i.set("server_country", "DEU").is_err());
        assert!(i.set("hosting_type", "dedicated").is_ok());
        assert_eq!(i.get("hosting_type"), Some("Dedicated"));
        assert!(i.set("hosting_type", "cloud").is_err());
        assert!(i
            .set("admin_simplex", "https://smp.example.com/a#abc")
            .is_ok());
        assert!(i.set("admin_simplex", "mailto:x").is_err());
        assert!(i.set("colour", "x").is_err());
    }

    fn config() -> PublicConfig {
        PublicConfig {
            keeps_queues: true,
            keeps_messages: true,
            message_ttl: Duration::from_secs(21 * 86_400),
            stats: false,
            new_queues: true,
            basic_auth: false,
        }
    }

    fn has(f: &[(&str, String)], key: &str) -> bool {
        f.iter().any(|(k, _)| *k == key)
    }

    #[test]
    fn without_source_code_only_the_configuration_is_shown() {
        let mut i = Information::default();
        i.set("operator", "Example").unwrap();
        let f = fields(&i, &config(), None);
        assert!(has(&f, "no_source_code") && !has(&f, "information") && !has(&f, "operator"));
        assert!(f.contains(&("persistence", "Queues and messages".into())));
        assert!(f.contains(&("message_expiration", "21 days".into())));
    }

    #[test]
    fn contact_groups_need_an_address_an_email_or_a_whole_pgp_key() {
        let mut i = Information::default();
        i.set("source_code", "https://example.com/src").unwrap();
        i.set("admin_pgp", "https://example.com/key").unwrap();
        i.set("complaints_email", "c@example.com").unwrap();
        let f = fields(&i, &config(), Some("abc.onion"));
        assert!(!has(&f, "admin") && !has(&f, "admin_pgp"));
        assert!(has(&f, "complaints") && has(&f, "complaints_email"));
        assert!(f.contains(&("onion_host", "abc.onion".into())));
        i.set("admin_pgp_fingerprint", "AB CD").unwrap();
        let f = fields(&i, &config(), None);
        assert!(has(&f, "admin") && has(&f, "admin_pgp") && has(&f, "admin_pgp_fingerprint"));
    }
}
