//! The web site: the server information page, filled at start from the relay's settings, the link
//! pages the SimpleX apps' links open (`LINK_PAGES`, as the reference's site has them: simplexmq
//! `apps/smp-server/SMPWeb.hs`), their style and scripts, and the apps' `.well-known` files. The
//! pages are this repository's own (`web/`), built into the binary.
//!
//! The site is generated once at start and served from memory (`server/web.rs`), so what is served
//! is never a half-written file; it is also written to `[WEB] static_path` for the operator (and a
//! web server in front of the relay), each file written beside its place and renamed into it.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

/// The paths under which the apps' links open the link page (`https://<relay>/a#…`).
pub const LINK_PAGES: &[&str] = &["contact", "invitation", "a", "c", "g", "r", "i"];

const INDEX: &str = include_str!("../../web/index.html");
const LINK: &[u8] = include_bytes!("../../web/link.html");
const MEDIA: &[(&str, &[u8])] = &[
    ("style.css", include_bytes!("../../web/media/style.css")),
    ("link.js", include_bytes!("../../web/media/link.js")),
    ("qr.js", include_bytes!("../../web/media/qr.js")),
];
const WELL_KNOWN: &[(&str, &[u8])] = &[
    (
        "assetlinks.json",
        include_bytes!("../../web/well-known/assetlinks.json"),
    ),
    (
        "apple-app-site-association",
        include_bytes!("../../web/well-known/apple-app-site-association"),
    ),
];

/// How long a browser may keep the style and scripts without asking again: they change only with
/// the relay's version, and a page loads them anew after at most this long.
const MEDIA_MAX_AGE: Duration = Duration::from_secs(3600);
/// Files smaller than this are sent as they are: compression would save less than its header.
const GZIP_FROM_BYTES: usize = 512;

/// One file of the site.
#[derive(Debug)]
pub struct File {
    pub body: Vec<u8>,
    /// The body compressed, for clients that accept gzip (text files only).
    pub gzip: Option<Vec<u8>>,
    pub content_type: &'static str,
    /// `Some`: browsers may keep it this long without asking again; `None`: ask each time.
    pub max_age: Option<Duration>,
}

/// The generated site, by path (`/index.html`, `/a/index.html`, `/media/style.css`, …).
#[derive(Debug)]
pub struct Site {
    files: HashMap<String, File>,
    /// When it was generated, in seconds since the epoch: every file's `Last-Modified`.
    pub generated_at: u64,
}

impl Site {
    /// The site, with the server information page filled with `fields` (`info::fields`).
    pub fn generate(fields: &[(&str, String)], generated_at: u64) -> Result<Site, String> {
        let mut site = Site {
            files: HashMap::new(),
            generated_at,
        };
        let index = render(INDEX, fields)?;
        site.add("/index.html", index.into_bytes(), None);
        for page in LINK_PAGES {
            site.add(&format!("/{page}/index.html"), LINK.to_vec(), None);
        }
        for (name, body) in MEDIA {
            site.add(
                &format!("/media/{name}"),
                body.to_vec(),
                Some(MEDIA_MAX_AGE),
            );
        }
        for (name, body) in WELL_KNOWN {
            site.add(&format!("/.well-known/{name}"), body.to_vec(), None);
        }
        Ok(site)
    }

    fn add(&mut self, path: &str, body: Vec<u8>, max_age: Option<Duration>) {
        let content_type = content_type(path);
        let gzip = (content_type != "application/octet-stream" && body.len() >= GZIP_FROM_BYTES)
            .then(|| gzip(&body));
        self.files.insert(
            path.to_string(),
            File {
                body,
                gzip,
                content_type,
                max_age,
            },
        );
    }

    /// The file a request path names: a file's own path, or a folder's (`/`, `/a/`, `/a`) index.
    /// Nothing else: the site is what `generate` made, so no path leads outside it, and a folder
    /// without an index (`/media/`) is not listed.
    pub fn lookup(&self, path: &str) -> Option<&File> {
        if !path.starts_with('/') {
            return None;
        }
        if let Some(f) = self.files.get(path).filter(|_| !path.ends_with('/')) {
            return Some(f);
        }
        let folder = path.strip_suffix('/').unwrap_or(path);
        self.files.get(&format!("{folder}/index.html"))
    }

    /// Every file's path.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Writes the site's files under `dir` (made if missing): each is written beside its place and
    /// renamed into it, so a reader of the folder never sees a half-written file. Other files in
    /// the folder are left as they are.
    pub fn write_to(&self, dir: &Path) -> io::Result<()> {
        let mut paths: Vec<&String> = self.files.keys().collect();
        paths.sort();
        for path in paths {
            let target = dir.join(path.trim_start_matches('/'));
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut name = target.file_name().unwrap_or_default().to_os_string();
            name.push(".new");
            let temporary = target.with_file_name(name);
            let mut f = std::fs::File::create(&temporary)?;
            f.write_all(&self.files[path].body)?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&temporary, &target)?;
        }
        Ok(())
    }
}

fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        // The apps' association file has no extension and is JSON.
        _ if path.ends_with("/apple-app-site-association") => "application/json",
        _ => "application/octet-stream",
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

/// Fills `template`: `{{name}}` is the field's value, HTML-escaped (safe in text and in quoted
/// attributes); `{{#name}}…{{/name}}` keeps its content only when the field is set and not empty.
/// A field not given is empty. A section left open, or a closing marker without its opening, is an
/// error naming it (the templates are built in, so a test catches it).
pub fn render(template: &str, fields: &[(&str, String)]) -> Result<String, String> {
    let value = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after.find("}}").ok_or_else(|| {
            format!(
                "an unclosed marker at {:?}",
                &rest[at..rest.len().min(at + 30)]
            )
        })?;
        let marker = after[..end].trim();
        rest = &after[end + 2..];
        if let Some(name) = marker.strip_prefix('#') {
            let close = format!("{{{{/{name}}}}}");
            let inner_end = rest
                .find(&close)
                .ok_or_else(|| format!("the section {{{{#{name}}}}} is not closed"))?;
            if !value(name).is_empty() {
                out.push_str(&render(&rest[..inner_end], fields)?);
            }
            rest = &rest[inner_end + close.len()..];
        } else if let Some(name) = marker.strip_prefix('/') {
            return Err(format!("{{{{/{name}}}}} closes no section"));
        } else {
            escape_into(&mut out, value(marker));
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn sections_are_kept_only_when_their_field_is_set_and_values_are_escaped() {
        let t = "<p>{{#a}}A={{a}}{{#b}} B={{b}}{{/b}};{{/a}}{{#c}}C{{/c}}</p>";
        assert_eq!(
            render(t, &f(&[("a", "<x&\"'>")])).unwrap(),
            "<p>A=&lt;x&amp;&quot;&#39;&gt;;</p>"
        );
        assert_eq!(
            render(t, &f(&[("a", "1"), ("b", "2"), ("c", "")])).unwrap(),
            "<p>A=1 B=2;</p>"
        );
        assert!(render("{{#a}}x", &[]).unwrap_err().contains("not closed"));
        assert!(render("x{{/a}}", &[])
            .unwrap_err()
            .contains("closes no section"));
        assert!(render("x{{a", &[]).is_err());
    }

    #[test]
    fn the_built_in_pages_render_with_every_field_and_with_none() {
        let all: Vec<(&str, String)> = crate::web::info::KEYS
            .iter()
            .chain(&[
                "persistence",
                "information",
                "admin",
                "complaints",
                "onion_host",
            ])
            .map(|k| (*k, format!("value-of-{k}")))
            .collect();
        for fields in [all, Vec::new()] {
            let site = Site::generate(&fields, 0).unwrap();
            let index = std::str::from_utf8(&site.lookup("/").unwrap().body)
                .unwrap()
                .to_string();
            assert!(!index.contains("{{") && !index.contains("}}"), "{index}");
        }
    }

    #[test]
    fn paths_name_the_site_files_and_folders_only() {
        let site = Site::generate(&[], 0).unwrap();
        for p in [
            "/",
            "/index.html",
            "/a",
            "/a/",
            "/contact/",
            "/media/qr.js",
            "/.well-known/assetlinks.json",
        ] {
            assert!(site.lookup(p).is_some(), "{p}");
        }
        for p in [
            "/media/",
            "/media",
            "/.well-known/",
            "/x",
            "/a/b",
            "/index.html/",
            "/../index.html",
            "",
        ] {
            assert!(site.lookup(p).is_none(), "{p}");
        }
        let aasa = site
            .lookup("/.well-known/apple-app-site-association")
            .unwrap();
        assert_eq!(aasa.content_type, "application/json");
        let json: serde_json::Value = serde_json::from_slice(&aasa.body).unwrap();
        assert!(json["applinks"]["details"][0]["components"].is_array());
        let qr = site.lookup("/media/qr.js").unwrap();
        let unzipped = {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&qr.gzip.as_ref().unwrap()[..])
                .read_to_end(&mut out)
                .unwrap();
            out
        };
        assert_eq!(unzipped, qr.body);
    }

    #[test]
    fn writing_the_site_replaces_its_files_and_keeps_the_others() {
        let dir = std::env::temp_dir().join(format!("smp-relay-site-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("a/index.html"), "old").unwrap();
        std::fs::write(dir.join("operator.txt"), "mine").unwrap();
        let site = Site::generate(&[], 0).unwrap();
        site.write_to(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join("a/index.html")).unwrap(), LINK);
        assert_eq!(std::fs::read(dir.join("operator.txt")).unwrap(), b"mine");
        let written = site.paths().count();
        let mut on_disk = 0;
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                assert!(!p.to_string_lossy().ends_with(".new"), "{p:?} left behind");
                if p.is_dir() {
                    stack.push(p)
                } else {
                    on_disk += 1
                }
            }
        }
        assert_eq!(on_disk, written + 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
