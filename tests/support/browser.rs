//! Headless Chromium for the dashboard's tests: the DOM it rendered
//! (`--dump-dom`) or a screenshot of a page, and a few readers of that DOM
//! (opening tags, attributes, the text of an element) that are enough for
//! markup that Chromium itself serialised.

#![allow(dead_code)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the tests expect Chromium.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// How long one Chromium run may take.
const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

/// How much virtual time a page gets before Chromium dumps or shoots it:
/// the dashboard refreshes every second, and its fetches complete within
/// that budget (virtual time waits for pending fetches).
const VIRTUAL_TIME_MS: u32 = 10_000;

/// The flags of every run: headless, no sandbox (tests run as root in
/// containers), nothing fetched from outside.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Whether Chromium is installed; if not, says so on stderr.
pub fn available() -> bool {
    let there = Path::new(CHROMIUM).exists();
    if !there {
        eprintln!("skipped: {CHROMIUM} is missing (install it with `apt-get install chromium`)");
    }
    there
}

/// Runs headless Chromium on `url` with a fresh profile in `profile`;
/// returns the DOM it rendered once the page went idle or its virtual
/// clock ran out.
pub fn dump_dom(url: &str, profile: &Path) -> String {
    let (dom, stderr, ok) = run(url, profile, &["--dump-dom"]);
    assert!(
        ok && dom.contains("</html>"),
        "chromium on {url} failed; stdout:\n{dom}\nstderr:\n{stderr}"
    );
    dom
}

/// Takes a screenshot of `url` (a `width` x `height` window) into the PNG
/// `file`, with a fresh profile in `profile`; panics unless Chromium wrote a
/// PNG there.
pub fn screenshot(url: &str, profile: &Path, file: &Path, width: u32, height: u32) {
    let _ = std::fs::remove_file(file);
    let shot = format!("--screenshot={}", file.display());
    let size = format!("--window-size={width},{height}");
    let (stdout, stderr, ok) = run(url, profile, &[&shot, &size, "--hide-scrollbars"]);
    let png = std::fs::read(file).unwrap_or_default();
    assert!(
        ok && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "chromium wrote no PNG to {} for {url} ({} bytes); stdout:\n{stdout}\nstderr:\n{stderr}",
        file.display(),
        png.len()
    );
}

/// Runs Chromium with the common flags and `extra`; its stdout, its stderr
/// and whether it exited 0. Never waits past [`BROWSER_DEADLINE`].
fn run(url: &str, profile: &Path, extra: &[&str]) -> (String, String, bool) {
    let mut child = Command::new(CHROMIUM)
        .args(FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_MS}"))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().expect("chromium's stdout");
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let mut stderr = child.stderr.take().expect("chromium's stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > BROWSER_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish {url} within {BROWSER_DEADLINE:?}; stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
        status.success(),
    )
}

/// The opening tags of `html`, such as `<tr class="job" data-id="7">`.
pub fn open_tags(html: &str) -> impl Iterator<Item = &str> {
    html.match_indices('<').filter_map(move |(start, _)| {
        let rest = &html[start + 1..];
        if !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return None;
        }
        let end = rest.find('>')?;
        Some(&html[start..start + 1 + end + 1])
    })
}

/// A tag's name: `tr` for `<tr class="job">`.
pub fn tag_name(tag: &str) -> &str {
    let name = &tag[1..];
    let end = name
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .unwrap_or(name.len());
    &name[..end]
}

/// The value of an attribute of an opening tag, as Chromium writes it:
/// ` name="value"`, or ` name` alone (then the value is empty).
pub fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let quoted = format!(" {name}=\"");
    if let Some(start) = tag.find(&quoted) {
        let value = &tag[start + quoted.len()..];
        return value.find('"').map(|end| &value[..end]);
    }
    let bare = format!(" {name}");
    tag.match_indices(&bare).find_map(|(start, _)| {
        let after = &tag[start + bare.len()..];
        after
            .starts_with(|c: char| c.is_whitespace() || c == '>' || c == '/')
            .then_some("")
    })
}

/// Whether an opening tag has `class` among its classes.
pub fn has_class(tag: &str, class: &str) -> bool {
    attr(tag, "class").is_some_and(|classes| classes.split_whitespace().any(|c| c == class))
}

/// The opening tag of the element with `id`.
pub fn by_id<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    open_tags(dom).find(|tag| attr(tag, "id") == Some(id))
}

/// Whether the element with `id` carries the `hidden` attribute; panics if
/// there is no such element.
pub fn is_hidden(dom: &str, id: &str) -> bool {
    let tag = by_id(dom, id).unwrap_or_else(|| panic!("no #{id} in the page:\n{}", body_of(dom)));
    attr(tag, "hidden").is_some()
}

/// The text of the element with `id` up to its first child element,
/// unescaped: the whole text of `#logs`.
pub fn text_of(dom: &str, id: &str) -> Option<String> {
    let tag = by_id(dom, id)?;
    let rest = after(dom, tag);
    let end = rest.find('<').unwrap_or(rest.len());
    Some(unescape(&rest[..end]))
}

/// The markup of the element that `tag` (a slice of `dom`) opens, up to
/// its closing tag, elements of the same name nested inside it included.
pub fn element<'a>(dom: &'a str, tag: &'a str) -> &'a str {
    let name = tag_name(tag);
    let start = offset(dom, tag);
    let (open, close) = (format!("<{name}"), format!("</{name}>"));
    let mut depth = 1;
    let mut at = start + tag.len();
    while depth > 0 {
        let rest = &dom[at..];
        let next_close = rest.find(&close);
        let next_open = open_tags(rest)
            .find(|t| tag_name(t) == name)
            .map(|t| offset(rest, t));
        match (next_open, next_close) {
            (Some(o), Some(c)) if o < c => {
                depth += 1;
                at += o + open.len();
            }
            (_, Some(c)) => {
                depth -= 1;
                at += c + close.len();
            }
            (_, None) => return &dom[start..],
        }
    }
    &dom[start..at]
}

/// Where `inner`, a slice of `outer`, starts in it.
fn offset(outer: &str, inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

/// What follows `tag`, a slice of `dom`.
fn after<'a>(dom: &'a str, tag: &str) -> &'a str {
    &dom[offset(dom, tag) + tag.len()..]
}

/// The text of `markup` without its tags, unescaped.
pub fn strip_tags(markup: &str) -> String {
    let mut text = String::new();
    let mut rest = markup;
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        text.push(' ');
        rest = rest[open..]
            .find('>')
            .map_or("", |close| &rest[open + close + 1..]);
    }
    text.push_str(rest);
    unescape(&text)
}

/// The page's body up to its script: what failure messages show of it.
pub fn body_of(dom: &str) -> &str {
    let start = dom.find("<body").unwrap_or(0);
    let end = dom[start..]
        .find("<script")
        .map_or(dom.len(), |end| start + end);
    &dom[start..end]
}

/// Undoes the escapes Chromium writes in text.
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}
