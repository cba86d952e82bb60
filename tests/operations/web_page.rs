//! The operator's web site (`[WEB] static_path`, served on `[WEB] http`) as a browser shows it:
//! Debian's headless Chromium loads the relay's pages, and the tests read the DOM after the
//! scripts ran (`--dump-dom`) or decode the QR code from a screenshot (`--screenshot`).
//!
//! The server information page (`web/index.html`): every `[INFORMATION]` value in its
//! `data-field` element as the operator wrote it (the browser's text decodes back to it, so the
//! relay escaped it), the `onion-location` of an `.onion` host, and no heading left without
//! content when a part is not set. The link page (`web/link.html`, `media/link.js`, `media/qr.js`):
//! the app's link and the https link it shows, exactly, and a QR code that decodes to that link at
//! phone and desktop sizes, in both colour schemes.
//!
//! The screenshots are kept in `target/tmp/web-screenshots` (CI keeps them as artifacts) for a
//! person to look at.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, Relay, RelayOptions, TempDir};

const CHROMIUM: &str = "/usr/bin/chromium";
/// A page load takes about a second; a browser still running after this is stuck.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);
const PHONE: (u32, u32) = (390, 844);
const DESKTOP: (u32, u32) = (1280, 900);

/// A short link's key: 32 bytes in base64url without padding, as the apps write it.
const SHORT_KEY: &str = "pY3r7kQe1Zt9x0Lm4bV8cN2sW6dJ5hG3fA7uK0oI1qE";

// ---------------------------------------------------------------------------------------------
// The browser

/// Runs headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=FILE`, …) on a fresh
/// profile; returns its stdout. Killed, with its helper processes, after `BROWSER_TIMEOUT`.
fn chromium(args: &[String], url: &str) -> Vec<u8> {
    use std::os::unix::process::CommandExt;
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium; \
         .ci/run installs it)"
    );
    let profile = TempDir::new("chromium").expect("a temp dir");
    // Output into files, not pipes: a helper process that outlives the browser cannot hold them
    // open and keep the test waiting.
    let (out_path, err_path) = (profile.path().join("stdout"), profile.path().join("stderr"));
    let file = |p: &Path| std::fs::File::create(p).expect("a browser output file");
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            // Containers give /dev/shm 64 MB, too little for a renderer: use /tmp instead.
            "--disable-dev-shm-usage",
            // The page's scripts run at DOMContentLoaded with no timer: the DOM is dumped (or the
            // screenshot taken) once they are done, however slow the machine.
            "--virtual-time-budget=5000",
        ])
        .arg(format!(
            "--user-data-dir={}",
            profile.path().join("profile").display()
        ))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(file(&out_path))
        .stderr(file(&err_path))
        // Its own process group, so that a stuck browser is killed with its renderers.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {CHROMIUM}: {e}"));
    let started = Instant::now();
    let status = common::wait_exit(&mut child, BROWSER_TIMEOUT);
    let stderr = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let Some(status) = status else {
        // SAFETY: kill(2) on the process group of our own child, which has not been reaped (it
        // was still running when `wait_exit` returned).
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = child.wait();
        panic!(
            "chromium did not finish {url} within {BROWSER_TIMEOUT:?} ({args:?}):\n{}",
            stderr()
        );
    };
    assert!(
        status.success(),
        "chromium {args:?} {url} exited {status}:\n{}",
        stderr()
    );
    println!(
        "chromium {} {url}: {:.2} s",
        args.join(" "),
        started.elapsed().as_secs_f64()
    );
    std::fs::read(&out_path).expect("the browser's stdout")
}

/// The DOM of `url` after its scripts ran, at `size`.
fn dom(url: &str, size: (u32, u32)) -> Element {
    let out = chromium(&[window(size), "--dump-dom".into()], url);
    let html = String::from_utf8(out).expect("the DOM is UTF-8");
    assert!(
        html.contains("<html") && html.contains("</html>"),
        "no document from {url}:\n{html}"
    );
    assert!(
        !html.contains("{{"),
        "{url}: a template marker left:\n{html}"
    );
    parse_html(&html)
}

fn window((w, h): (u32, u32)) -> String {
    format!("--window-size={w},{h}")
}

/// Where the screenshots are kept (CI keeps `target/tmp` as artifacts).
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot folder");
    dir
}

/// A screenshot of `url` at `size` (dark: the reader prefers a dark colour scheme) into the
/// screenshot folder as `name`; returns its path.
fn screenshot(url: &str, size: (u32, u32), dark: bool, name: &str) -> PathBuf {
    let path = screenshot_dir().join(name);
    // A failed run must not leave the previous run's picture to be checked.
    let _ = std::fs::remove_file(&path);
    let mut args = vec![window(size), format!("--screenshot={}", path.display())];
    if dark {
        args.push("--force-dark-mode".into());
    }
    chromium(&args, url);
    assert!(path.exists(), "chromium wrote no screenshot of {url}");
    println!("screenshot: {}", path.display());
    path
}

/// The image's luma, row by row, with its width and height.
fn read_png_luma(path: &Path) -> (usize, usize, Vec<u8>) {
    let bytes = std::fs::read(path).expect("the screenshot");
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a PNG of a sane size")];
    let info = reader.next_frame(&mut buf).expect("the PNG's pixels");
    let (w, h) = (info.width as usize, info.height as usize);
    let channels = info.color_type.samples();
    let luma = buf[..info.buffer_size()]
        .chunks_exact(info.line_size)
        .flat_map(|row| row[..w * channels].chunks_exact(channels))
        .map(|px| match px {
            [g] | [g, _] => *g,
            [r, g, b] | [r, g, b, _] => {
                ((299 * u32::from(*r) + 587 * u32::from(*g) + 114 * u32::from(*b)) / 1000) as u8
            }
            _ => unreachable!("1 to 4 samples a pixel"),
        })
        .collect::<Vec<u8>>();
    assert_eq!(luma.len(), w * h, "{}: pixels", path.display());
    (w, h, luma)
}

/// The texts of the QR codes in the picture, each checked for its quiet zone: light all round,
/// 4 modules wide (ISO/IEC 18004), so that a phone's camera finds the code's edge.
fn decode_qr_codes(path: &Path) -> Vec<String> {
    use rqrr::BitGrid;
    let (w, h, luma) = read_png_luma(path);
    let mut img = rqrr::PreparedImage::prepare_from_greyscale(w, h, |x, y| luma[y * w + x]);
    let mut texts = Vec::new();
    for g in img.detect_grids() {
        let text = match g.decode() {
            Ok((_, text)) => text,
            Err(e) => panic!("{}: a QR code that does not decode: {e}", path.display()),
        };
        let xs = g.bounds.map(|p| p.x);
        let ys = g.bounds.map(|p| p.y);
        let (x0, x1) = (*xs.iter().min().unwrap(), *xs.iter().max().unwrap());
        let (y0, y1) = (*ys.iter().min().unwrap(), *ys.iter().max().unwrap());
        let module = f64::from(x1 - x0) / g.grid.size() as f64;
        // The ring from 2 px outside the code's corners (which the detector places to a pixel or
        // so) to 2 px short of 4 modules out.
        let (inner, outer) = (2, (4.0 * module) as i32 - 2);
        let dark = |x: i32, y: i32| {
            x < 0
                || y < 0
                || x >= w as i32
                || y >= h as i32
                || luma[y as usize * w + x as usize] < 128
        };
        let within =
            |x: i32, y: i32, d: i32| x >= x0 - d && x <= x1 + d && y >= y0 - d && y <= y1 + d;
        let dark_in_ring = (y0 - outer..=y1 + outer)
            .flat_map(|y| (x0 - outer..=x1 + outer).map(move |x| (x, y)))
            .filter(|&(x, y)| !within(x, y, inner) && dark(x, y))
            .count();
        assert_eq!(
            dark_in_ring,
            0,
            "{}: the QR code at ({x0},{y0})-({x1},{y1}), {module:.1} px a module, has no light \
             quiet zone of 4 modules",
            path.display()
        );
        texts.push(text);
    }
    texts
}

// ---------------------------------------------------------------------------------------------
// The DOM as Chromium writes it (`--dump-dom`: the serialised document, attributes in double
// quotes, `&`, `<`, `>` and quotes escaped): enough of HTML to find elements and read their text.

#[derive(Debug)]
enum Node {
    Element(Element),
    Text(String),
}

#[derive(Debug)]
struct Element {
    tag: String,
    attrs: Vec<(String, String)>,
    children: Vec<Node>,
}

const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr",
];

impl Element {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The text content, as `textContent` gives it.
    fn text(&self) -> String {
        let mut s = String::new();
        for c in &self.children {
            match c {
                Node::Text(t) => s.push_str(t),
                Node::Element(e) => s.push_str(&e.text()),
            }
        }
        s
    }

    fn child_elements(&self) -> impl Iterator<Item = &Element> {
        self.children.iter().filter_map(|c| match c {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
    }

    /// This element and every element in it, in document order.
    fn all(&self) -> Vec<&Element> {
        let mut out = vec![self];
        for c in self.child_elements() {
            out.extend(c.all());
        }
        out
    }

    fn find_all(&self, pred: impl Fn(&Element) -> bool) -> Vec<&Element> {
        self.all().into_iter().filter(|e| pred(e)).collect()
    }

    /// The one element that `pred` picks: `None` when there is none, a panic when more.
    fn find(&self, what: &str, pred: impl Fn(&Element) -> bool) -> Option<&Element> {
        let found = self.find_all(pred);
        assert!(found.len() <= 1, "{} elements are {what}", found.len());
        found.into_iter().next()
    }

    fn by_id(&self, id: &str) -> Option<&Element> {
        self.find(&format!("#{id}"), |e| e.attr("id") == Some(id))
    }

    fn by_field(&self, field: &str) -> Option<&Element> {
        self.find(&format!("data-field={field}"), |e| {
            e.attr("data-field") == Some(field)
        })
    }

    fn tag(&self, tag: &str) -> &Element {
        self.find(tag, |e| e.tag == tag)
            .unwrap_or_else(|| panic!("no <{tag}>"))
    }

    fn is_hidden(&self) -> bool {
        self.attr("hidden").is_some()
    }
}

/// Parses the serialised DOM into a tree under a `#document` element.
fn parse_html(html: &str) -> Element {
    let mut stack = vec![Element {
        tag: "#document".into(),
        attrs: Vec::new(),
        children: Vec::new(),
    }];
    let close = |stack: &mut Vec<Element>| {
        let e = stack.pop().expect("an open element");
        let parent = stack.last_mut().expect("the document stays open");
        parent.children.push(Node::Element(e));
    };
    let mut rest = html;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("<!--") {
            let end = r.find("-->").expect("a closed comment");
            rest = &r[end + 3..];
        } else if let Some(r) = rest.strip_prefix("<!") {
            rest = &r[r.find('>').expect("a closed doctype") + 1..];
        } else if let Some(r) = rest.strip_prefix("</") {
            let end = r.find('>').expect("a closed end tag");
            let tag = r[..end].trim().to_ascii_lowercase();
            rest = &r[end + 1..];
            assert!(
                stack.iter().skip(1).any(|e| e.tag == tag),
                "</{tag}> closes no open element"
            );
            while stack.last().expect("open").tag != tag {
                close(&mut stack);
            }
            close(&mut stack);
        } else if rest.starts_with('<') && rest[1..].starts_with(|c: char| c.is_ascii_alphabetic())
        {
            let (element, self_closing, after) = parse_start_tag(&rest[1..]);
            rest = after;
            let tag = element.tag.clone();
            stack.push(element);
            if self_closing || VOID.contains(&tag.as_str()) {
                close(&mut stack);
            } else if tag == "script" || tag == "style" {
                let end = rest.find(&format!("</{tag}")).expect("a closed script");
                let raw = &rest[..end];
                if !raw.is_empty() {
                    let e = stack.last_mut().expect("open");
                    e.children.push(Node::Text(raw.into()));
                }
                rest = &rest[end..];
            }
        } else {
            // A `<` that starts no tag is text (Chromium writes `&lt;`, but be lenient).
            let end = match rest.strip_prefix('<') {
                Some(r) => r.find('<').map_or(rest.len(), |i| i + 1),
                None => rest.find('<').unwrap_or(rest.len()),
            };
            let text = decode_entities(&rest[..end]);
            stack
                .last_mut()
                .expect("open")
                .children
                .push(Node::Text(text));
            rest = &rest[end..];
        }
    }
    while stack.len() > 1 {
        close(&mut stack);
    }
    stack.pop().expect("the document")
}

/// `tag attr="v" …>` (after the `<`): the element, whether it ended in `/>`, and the rest.
fn parse_start_tag(s: &str) -> (Element, bool, &str) {
    let name_end = s
        .find(|c: char| c.is_ascii_whitespace() || c == '>' || c == '/')
        .expect("a whole start tag");
    let mut e = Element {
        tag: s[..name_end].to_ascii_lowercase(),
        attrs: Vec::new(),
        children: Vec::new(),
    };
    let mut rest = &s[name_end..];
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("/>") {
            return (e, true, r);
        }
        if let Some(r) = rest.strip_prefix('>') {
            return (e, false, r);
        }
        let end = rest
            .find(|c: char| c.is_ascii_whitespace() || c == '=' || c == '>' || c == '/')
            .expect("a whole attribute");
        assert!(
            end > 0,
            "an attribute name at {:?}",
            &rest[..rest.len().min(40)]
        );
        let name = rest[..end].to_ascii_lowercase();
        rest = rest[end..].trim_start();
        let value = if let Some(r) = rest.strip_prefix('=') {
            let r = r.trim_start();
            let (value, after) = match r.chars().next() {
                Some(q @ ('"' | '\'')) => {
                    let end = r[1..].find(q).expect("a closed attribute value") + 1;
                    (&r[1..end], &r[end + 1..])
                }
                _ => {
                    let end = r
                        .find(|c: char| c.is_ascii_whitespace() || c == '>')
                        .expect("an attribute value");
                    (&r[..end], &r[end..])
                }
            };
            rest = after;
            decode_entities(value)
        } else {
            String::new()
        };
        e.attrs.push((name, value));
    }
}

/// The character references Chromium writes; any other fails the test, so that a value is never
/// compared half-decoded.
fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let r = &rest[at + 1..];
        let end = r.find(';').unwrap_or_else(|| panic!("a bare & in {s:?}"));
        let name = &r[..end];
        let c = match name {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            "nbsp" => '\u{a0}',
            _ => {
                let code = if let Some(hex) = name.strip_prefix("#x").or(name.strip_prefix("#X")) {
                    u32::from_str_radix(hex, 16).ok()
                } else {
                    name.strip_prefix('#').and_then(|d| d.parse().ok())
                };
                code.and_then(char::from_u32)
                    .unwrap_or_else(|| panic!("an unknown character reference &{name}; in {s:?}"))
            }
        };
        out.push(c);
        rest = &r[end + 1..];
    }
    out.push_str(rest);
    out
}

#[test]
fn the_dom_reader_reads_what_chromium_writes() {
    let doc = parse_html(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">\
         <script src=\"/x.js\" defer=\"\"></script></head><body><!-- a <p> -->\
         <p id=\"a\" hidden=\"\">A &amp; B &lt;c&gt; &#39;d&#x27;</p>\
         <a href=\"?x=1&amp;y=&quot;2&quot;\">l<br>m</a><ul></ul></body></html>",
    );
    let p = doc.by_id("a").expect("p#a");
    assert_eq!(p.text(), "A & B <c> 'd'");
    assert!(p.is_hidden());
    let a = doc.tag("a");
    assert_eq!(a.attr("href"), Some("?x=1&y=\"2\""));
    assert_eq!(a.text(), "lm");
    assert!(doc.tag("ul").children.is_empty());
    assert_eq!(doc.tag("body").child_elements().count(), 3);
}

// ---------------------------------------------------------------------------------------------
// The server information page

/// Every `[INFORMATION]` key, with values that need escaping in HTML text and attributes.
const FULL_INFORMATION: &[(&str, &str)] = &[
    (
        "source_code",
        "https://git.example.com/ops/smp-relay?ref=main&view=tree",
    ),
    ("usage_conditions", "https://example.com/conditions"),
    (
        "condition_amendments",
        "https://example.com/conditions/amendments-2025",
    ),
    ("server_country", "de"),
    ("operator", "Example & Sons <ops> \"Relays\" Ltd's"),
    ("operator_country", "gb"),
    ("website", "https://example.com/?lang=en&ref=relay"),
    (
        "admin_simplex",
        "https://smp.example.com/a#Xq0a9vB3nR7tY2uK5wE8iO1pL4sD6fG0hJ3kZ9cV7bN",
    ),
    ("admin_email", "admin@example.com"),
    ("admin_pgp", "https://example.com/keys/admin.asc"),
    (
        "admin_pgp_fingerprint",
        "0123 4567 89AB CDEF 0123  4567 89AB CDEF 0123 4567",
    ),
    (
        "complaints_simplex",
        "https://smp.example.com/a#Mn4bV7cX0zL3kJ6hG9fD2sA5pO8iU1yT4rE7wQ0eR3t?h=smp2.example.com",
    ),
    ("complaints_email", "abuse+smp@example.com"),
    ("complaints_pgp", "https://example.com/keys/abuse.asc"),
    (
        "complaints_pgp_fingerprint",
        "FEDC BA98 7654 3210 FEDC  BA98 7654 3210 FEDC BA98",
    ),
    ("hosting", "Hosting <GmbH> & Co. KG"),
    ("hosting_country", "nl"),
    ("hosting_type", "dedicated"),
];

const ONION: &str = "abcdefghijklmnop.onion";

/// `smp-server.ini` as `init` wrote it (`original`) with `info` after the `[INFORMATION]` line and,
/// when given, another `[TRANSPORT] host`.
fn write_ini(dir: &Path, original: &str, host: Option<&str>, info: &[(&str, &str)]) {
    let mut out = String::new();
    let (mut section, mut information, mut host_line) = (String::new(), false, false);
    for line in original.lines() {
        if line.starts_with('[') {
            section = line.to_string();
        }
        match host {
            Some(h) if section == "[TRANSPORT]" && line.starts_with("host = ") => {
                out.push_str(&format!("host = {h}\n"));
                host_line = true;
                continue;
            }
            _ => {}
        }
        out.push_str(line);
        out.push('\n');
        if line == "[INFORMATION]" {
            information = true;
            for (k, v) in info {
                out.push_str(&format!("{k} = {v}\n"));
            }
        }
    }
    assert!(
        information,
        "init's smp-server.ini has no [INFORMATION] line"
    );
    assert!(
        host.is_none() || host_line,
        "init's smp-server.ini has no `host = ` line in [TRANSPORT]"
    );
    std::fs::write(dir.join("smp-server.ini"), out).expect("write smp-server.ini");
}

fn value<'a>(info: &[(&str, &'a str)], key: &str) -> &'a str {
    info.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("{key} is not set"))
}

/// The element of `field`, which must be there.
fn field<'a>(doc: &'a Element, name: &str) -> &'a Element {
    doc.by_field(name)
        .unwrap_or_else(|| panic!("no data-field={name} on the page"))
}

/// The one link in the element of `field`.
fn link_in<'a>(doc: &'a Element, name: &str) -> &'a Element {
    field(doc, name)
        .find(&format!("a link in data-field={name}"), |e| e.tag == "a")
        .unwrap_or_else(|| panic!("no link in data-field={name}"))
}

/// The section headed by `heading_id` (`aria-labelledby`).
fn section<'a>(doc: &'a Element, heading_id: &str) -> Option<&'a Element> {
    doc.find(&format!("the section of #{heading_id}"), |e| {
        e.tag == "section" && e.attr("aria-labelledby") == Some(heading_id)
    })
}

/// The rows (`<div>`s of a `dl`) of the section headed by `heading_id`, by their `dt` text.
fn rows<'a>(doc: &'a Element, heading_id: &str) -> Vec<(String, &'a Element)> {
    let s = section(doc, heading_id).unwrap_or_else(|| panic!("no section #{heading_id}"));
    s.tag("dl")
        .child_elements()
        .map(|div| (div.tag("dt").text(), div.tag("dd")))
        .collect()
}

/// No part of the body is a heading or a list without content: every section has more than its
/// heading, every `dl` and `ul` has items, every row of a `dl` its term and a value.
fn assert_nothing_empty(doc: &Element, what: &str) {
    let body = doc.tag("body");
    for e in body.all() {
        match e.tag.as_str() {
            "section" => assert!(
                e.child_elements().any(|c| !c.tag.starts_with('h')),
                "{what}: a section with nothing but its heading: {e:?}"
            ),
            "dl" | "ul" => assert!(
                e.child_elements().next().is_some(),
                "{what}: an empty <{}>: {e:?}",
                e.tag
            ),
            _ => {}
        }
        if e.tag == "dl" {
            for row in e.child_elements() {
                let has = |tag: &str| row.find_all(|c| c.tag == tag).len() == 1;
                assert!(
                    has("dt") && has("dd"),
                    "{what}: a row of a <dl> without its term and value: {row:?}"
                );
                assert!(
                    !row.tag("dd").text().trim().is_empty(),
                    "{what}: a row without a value: {row:?}"
                );
            }
        }
    }
}

/// The configuration rows, always shown, with what this test's relays are set to (`init`'s file:
/// a store that keeps queues and messages, 21 days, no statistics, NEW open to all).
fn assert_configuration(doc: &Element, what: &str) {
    assert!(
        section(doc, "config-h").is_some(),
        "{what}: no configuration section"
    );
    for (name, shown) in [
        ("persistence", "Queues and messages"),
        ("message_expiration", "21 days"),
        ("stats_enabled", "No"),
        ("new_queues_allowed", "Yes"),
        ("basic_auth_enabled", "No"),
    ] {
        assert_eq!(field(doc, name).text(), shown, "{what}: {name}");
    }
    assert_eq!(field(doc, "software").text(), "smp-relay", "{what}");
    assert!(
        !field(doc, "version").text().trim().is_empty(),
        "{what}: version"
    );
}

/// The `[INFORMATION]` fields the page may show (`condition_amendments` as `usage_amendments`).
const INFORMATION_FIELDS: &[&str] = &[
    "source_code",
    "website",
    "usage_conditions",
    "usage_amendments",
    "server_country",
    "operator",
    "operator_country",
    "hosting",
    "hosting_country",
    "hosting_type",
    "admin_simplex",
    "admin_email",
    "admin_pgp",
    "admin_pgp_fingerprint",
    "complaints_simplex",
    "complaints_email",
    "complaints_pgp",
    "complaints_pgp_fingerprint",
];

/// `start`'s flags for the site in `dir`, served over HTTP on `port`.
fn site_args(dir: &Path, port: u16) -> Vec<String> {
    let dir = dir.display().to_string();
    vec![
        "--web-static-path".into(),
        dir,
        "--web-http".into(),
        port.to_string(),
    ]
}

/// The relay could listen on the site's port (a web port it cannot listen on is only logged, and
/// the relay serves SMP without it).
fn assert_serves_site(relay: &Relay, port: u16) {
    let log = relay.log_text();
    assert!(
        !log.contains("the web site is not served"),
        "the relay serves no web site on port {port}:\n{log}"
    );
}

/// Starts the stopped relay again with its site on a new port (the previous run's socket may
/// not be released yet, and the relay would start without the site); returns the page's URL.
fn restart_with_site(relay: &mut Relay, site: &Path) -> String {
    let port = common::free_port();
    let args = site_args(site, port);
    relay.restart_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_serves_site(relay, port);
    format!("http://127.0.0.1:{port}/")
}

#[test]
fn the_information_page_shows_every_configured_field_and_no_empty_section() {
    let dir = TempDir::new("web-info").expect("a temp dir");
    common::init(dir.path());
    let original = std::fs::read_to_string(dir.path().join("smp-server.ini")).expect("the ini");
    let site = dir.path().join("www");
    let web_port = common::free_port();
    let url = format!("http://127.0.0.1:{web_port}/");

    // 1. Everything set, and an .onion host.
    let info = FULL_INFORMATION;
    write_ini(
        dir.path(),
        &original,
        Some(&format!("smp.example.com,{ONION}")),
        info,
    );
    let mut relay = Relay::start_in(
        dir,
        RelayOptions {
            extra_args: site_args(&site, web_port),
            ..RelayOptions::default()
        },
    );
    assert_serves_site(&relay, web_port);
    assert!(
        site.join("index.html").exists(),
        "no index.html in static_path"
    );
    let doc = dom(&url, DESKTOP);
    let what = "every key set";
    let onion = doc.tag("head").find("onion-location", |e| {
        e.tag == "meta" && e.attr("http-equiv") == Some("onion-location")
    });
    assert_eq!(
        onion.and_then(|m| m.attr("content")),
        Some(format!("http://{ONION}").as_str()),
        "the onion-location of [TRANSPORT] host"
    );
    for id in ["public-h", "admin-h", "complaints-h", "config-h"] {
        assert!(doc.by_id(id).is_some(), "{what}: no #{id}");
    }
    // Links: the text and the target are the value as written (the `&` and quotes decode back).
    for (key, name) in [
        ("source_code", "source_code"),
        ("website", "website"),
        ("usage_conditions", "usage_conditions"),
        ("condition_amendments", "usage_amendments"),
    ] {
        let v = value(info, key);
        assert_eq!(field(&doc, name).text(), v, "{key}");
        assert_eq!(link_in(&doc, name).attr("href"), Some(v), "{key}");
    }
    assert_eq!(field(&doc, "server_country").text(), "DE");
    assert_eq!(field(&doc, "hosting_type").text(), "Dedicated");
    // Names: the text is the name as written, then its country in capitals.
    for (name, country) in [("operator", "GB"), ("hosting", "NL")] {
        let shown = format!("{} ({country})", value(info, name));
        assert_eq!(field(&doc, name).text(), shown, "{name}");
        let c = field(&doc, name)
            .by_field(&format!("{name}_country"))
            .unwrap_or_else(|| panic!("no {name}_country inside {name}"));
        assert_eq!(c.text(), format!("({country})"));
    }
    for group in ["admin", "complaints"] {
        let key = |k: &str| format!("{group}_{k}");
        let simplex = link_in(&doc, &key("simplex"));
        assert_eq!(simplex.attr("href"), Some(value(info, &key("simplex"))));
        assert_eq!(simplex.text(), "SimpleX address");
        let email = value(info, &key("email"));
        assert_eq!(field(&doc, &key("email")).text(), email);
        assert_eq!(
            link_in(&doc, &key("email")).attr("href"),
            Some(format!("mailto:{email}").as_str())
        );
        let pgp = link_in(&doc, &key("pgp"));
        assert_eq!(pgp.attr("href"), Some(value(info, &key("pgp"))));
        assert_eq!(
            pgp.attr("data-field"),
            Some(key("pgp_fingerprint").as_str())
        );
        assert_eq!(pgp.text(), value(info, &key("pgp_fingerprint")));
    }
    assert!(
        doc.by_field("no_source_code").is_none(),
        "{what}: the notice"
    );
    assert_eq!(rows(&doc, "public-h").len(), 8, "{what}: public rows");
    assert_configuration(&doc, what);
    assert_nothing_empty(&doc, what);
    for (size, size_name) in [(PHONE, "phone"), (DESKTOP, "desktop")] {
        for (dark, scheme) in [(false, ""), (true, "-dark")] {
            screenshot(&url, size, dark, &format!("index-{size_name}{scheme}.png"));
        }
    }
    // The whole page, for a person to look at: a window as tall as the page at each width.
    screenshot(&url, (PHONE.0, 2300), false, "index-phone-full.png");
    screenshot(&url, (DESKTOP.0, 1700), false, "index-desktop-full.png");

    // 2. Only the source and the operator: no contacts, none of the other rows, nothing empty.
    relay.stop();
    let info = &[
        ("source_code", value(FULL_INFORMATION, "source_code")),
        ("operator", value(FULL_INFORMATION, "operator")),
    ];
    write_ini(relay.dir.path(), &original, None, info);
    let url = restart_with_site(&mut relay, &site);
    let doc = dom(&url, DESKTOP);
    let what = "source_code and operator";
    assert!(
        doc.find("a meta", |e| e.attr("http-equiv") == Some("onion-location"))
            .is_none(),
        "{what}: an onion-location without an .onion host"
    );
    assert!(section(&doc, "admin-h").is_none() && doc.by_id("admin-h").is_none());
    assert!(section(&doc, "complaints-h").is_none() && doc.by_id("complaints-h").is_none());
    assert_eq!(field(&doc, "source_code").text(), info[0].1);
    assert_eq!(field(&doc, "operator").text(), info[1].1, "no country");
    for name in INFORMATION_FIELDS {
        if !["source_code", "operator"].contains(name) {
            assert!(doc.by_field(name).is_none(), "{what}: {name} is shown");
        }
    }
    let public: Vec<String> = rows(&doc, "public-h").into_iter().map(|(t, _)| t).collect();
    assert_eq!(public, ["Source code", "Operator"], "{what}: public rows");
    assert_configuration(&doc, what);
    assert_nothing_empty(&doc, what);

    // 3. No [INFORMATION]: the notice that asks for source_code, and the configuration.
    relay.stop();
    write_ini(relay.dir.path(), &original, None, &[]);
    let url = restart_with_site(&mut relay, &site);
    let doc = dom(&url, PHONE);
    let what = "no [INFORMATION]";
    let public = rows(&doc, "public-h");
    assert_eq!(public.len(), 1, "{what}: public rows");
    assert_eq!(public[0].1.attr("data-field"), Some("no_source_code"));
    assert!(
        public[0].1.text().contains("source_code = URL"),
        "{what}: the notice"
    );
    for name in INFORMATION_FIELDS {
        assert!(doc.by_field(name).is_none(), "{what}: {name} is shown");
    }
    assert!(doc.by_id("admin-h").is_none() && doc.by_id("complaints-h").is_none());
    assert_configuration(&doc, what);
    assert_nothing_empty(&doc, what);
    println!("screenshots in {}", screenshot_dir().display());
}

// ---------------------------------------------------------------------------------------------
// The link page

/// What the link page shows for `url`: the app's link (`#open-in-app`) and the https link
/// (`#link-text`), which must both be visible.
struct LinkPage {
    kind: String,
    app_link: String,
    https_link: String,
}

fn link_page(url: &str) -> LinkPage {
    let doc = dom(url, PHONE);
    let connect = doc.by_id("link-connect").expect("#link-connect");
    assert!(!connect.is_hidden(), "{url}: the connect section is hidden");
    assert!(
        doc.by_id("link-incomplete")
            .expect("#link-incomplete")
            .is_hidden(),
        "{url}: says the link is incomplete"
    );
    assert!(
        !doc.by_id("link-qr-box").expect("#link-qr-box").is_hidden()
            && doc
                .by_id("link-qr-error")
                .expect("#link-qr-error")
                .is_hidden(),
        "{url}: the QR code was not drawn"
    );
    assert!(!doc
        .by_id("link-text-row")
        .expect("#link-text-row")
        .is_hidden());
    LinkPage {
        kind: doc.by_id("link-kind").expect("#link-kind").text(),
        app_link: doc
            .by_id("open-in-app")
            .and_then(|a| a.attr("href"))
            .expect("#open-in-app's href")
            .to_string(),
        https_link: doc.by_id("link-text").expect("#link-text").text(),
    }
}

/// A one-time invitation's fragment as the apps write it (`/invitation#/?v=…&smp=…&e2e=…`):
/// the queue's address and keys, percent-encoded, about 450 characters.
fn invitation_fragment() -> String {
    let smp = "smp%3A%2F%2F1OwYGt-yqOfe2IyVHhxz3ohqo3aCCMjtB-8wn4X_aoY%3D%40smp1.example.com\
               %2FvZzS3mTw0JpKUm_Q4eHqpD7B2Lg9sYcN%23%2F%3Fv%3D1-4%26dh%3DMCowBQYDK2VuAyEA\
               xjk9s0Lq3_Fh7vWm2uNc8RpTe5gYb1ZdXo4HiAaKw2E%253D%26srv%3Dbylepyau3ty4czmn77q4fgl\
               gsmsbb7ffdlqlf7bfvhqfu6dgmzbqfbqd.onion";
    let e2e = "v%3D2-3%26x3dh%3DMEIwBQYDK2VvAzkAq7rT0xV4eYb2Kc9Lm5Wn8Pd1Fs6Gh3Jk0Az7Xq2Ew9Rt4Yu1\
               Io8Pl5Mn6Bv3Cx2Za7Sd0Fg4Hj1%253D%252CMEIwBQYDK2VvAzkAp2Lk8Jh5Gf3Ds1Az9Xc7Vb4Nm2Q\
               w6Er8Ty1Ui3Op5As7Df9Gh2Jk4Lz6Xc8Vb0Nm1Qw3%253D";
    format!("/?v=2-7&smp={smp}&e2e={e2e}")
}

#[test]
fn the_link_page_opens_the_app_and_its_qr_code_decodes_to_the_link() {
    assert_eq!(SHORT_KEY.len(), 43);
    let web_port = common::free_port();
    let dir = TempDir::new("web-link").expect("a temp dir");
    common::init(dir.path());
    let site = dir.path().join("www");
    let relay = Relay::start_in(
        dir,
        RelayOptions {
            extra_args: site_args(&site, web_port),
            ..RelayOptions::default()
        },
    );
    assert_serves_site(&relay, web_port);
    let origin = format!("127.0.0.1:{web_port}");
    let host = "127.0.0.1";

    // A short contact address, as the apps share it: the page's host goes into `h`.
    let short_url = format!("http://{origin}/a/#{SHORT_KEY}");
    let short_link = format!("https://{origin}/a#{SHORT_KEY}");
    let page = link_page(&short_url);
    assert_eq!(page.kind, "SimpleX contact address");
    assert_eq!(page.https_link, short_link);
    assert_eq!(page.app_link, format!("simplex:/a#{SHORT_KEY}?h={host}"));

    // A short link naming other servers: this host goes first, the other parameters stay.
    let page = link_page(&format!(
        "http://{origin}/a#{SHORT_KEY}?h=smp2.example.com&p=5224"
    ));
    assert_eq!(
        page.https_link,
        format!("https://{origin}/a#{SHORT_KEY}?h=smp2.example.com&p=5224")
    );
    assert_eq!(
        page.app_link,
        format!("simplex:/a#{SHORT_KEY}?h={host},smp2.example.com&p=5224")
    );

    // A long one-time invitation: the app gets the fragment as it is.
    let fragment = invitation_fragment();
    assert!(fragment.len() > 400, "{}", fragment.len());
    let page = link_page(&format!("http://{origin}/invitation#{fragment}"));
    assert_eq!(page.kind, "SimpleX one-time invitation");
    assert_eq!(
        page.https_link,
        format!("https://{origin}/invitation#{fragment}")
    );
    assert_eq!(page.app_link, format!("simplex:/invitation#{fragment}"));

    // Without the fragment: the page says the link is incomplete and offers nothing to open.
    let doc = dom(&format!("http://{origin}/a/"), PHONE);
    assert!(!doc
        .by_id("link-incomplete")
        .expect("#link-incomplete")
        .is_hidden());
    assert!(doc
        .by_id("link-connect")
        .expect("#link-connect")
        .is_hidden());

    // The long invitation's QR code on a phone: wider than the screen at its natural size, so
    // the browser scales it down.
    let shot = screenshot(
        &format!("http://{origin}/invitation#{fragment}"),
        PHONE,
        false,
        "invitation-phone.png",
    );
    assert_eq!(
        decode_qr_codes(&shot),
        [format!("https://{origin}/invitation#{fragment}")],
        "the QR code in {}",
        shot.display()
    );

    // The QR code of the short link, as a phone and a desktop browser draw it, in both colour
    // schemes (the code stays black on white). At 390x844 it is above the fold (it ends about
    // 570 px down), so the phone's own window size is used.
    for (size, size_name) in [(PHONE, "phone"), (DESKTOP, "desktop")] {
        for (dark, scheme) in [(false, ""), (true, "-dark")] {
            let name = format!("link-{size_name}{scheme}.png");
            let shot = screenshot(&short_url, size, dark, &name);
            assert_eq!(
                decode_qr_codes(&shot),
                [short_link.as_str()],
                "the QR code in {}",
                shot.display()
            );
        }
    }
}
