//! The HTTP requests the proxy takes: `CONNECT host:port` and an
//! absolute-form `http://` request, parsed by `httparse` from a bounded
//! head.
//!
//! A plain request is forwarded as a rebuilt head: the origin-form
//! request line, the client's headers less the hop-by-hop ones (those
//! `Connection` names, `Keep-Alive`, `TE`, `Trailer`, `Upgrade` unless the
//! request upgrades, every `Proxy-*`), `Host` written from the checked
//! authority, and `Connection: close` (one request per connection). A
//! `Host` header the client sent must name the same host and port as the
//! request's authority; two are refused. The body's framing is told to the
//! caller (`Content-Length` or `chunked`, never both) so that it relays one
//! request's body and no more.

use super::{split_authority, MAX_HEAD_BYTES};
use crate::network::decide::{Destination, Refusal};

/// Headers one request may have.
pub const MAX_HEADERS: usize = 96;

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A plain request, ready to send to its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub dest: Destination,
    /// The rebuilt head, ending in the blank line.
    pub head: Vec<u8>,
    pub body: Body,
    /// `Upgrade` was asked for: after a `101` the connection is relayed
    /// both ways.
    pub upgrade: bool,
}

/// A request the proxy takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Connect(Destination),
    Forward(Forward),
}

/// Why a request is refused (answered `400`, or `403` for a host the
/// policy cannot take).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("the request head is longer than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("the request has more than {MAX_HEADERS} headers")]
    TooManyHeaders,
    #[error("the request is not valid HTTP/1 ({0})")]
    Syntax(String),
    #[error("the request is not a proxy request (send an absolute `http://` URL or CONNECT host:port)")]
    NotProxyForm,
    #[error("only `http://` URLs are forwarded (https goes through CONNECT)")]
    Scheme,
    #[error("the URL holds user information (`user@`), which is never forwarded")]
    UserInfo,
    #[error("the request's authority is malformed")]
    Authority,
    #[error("the Host header names `{found}`, not the request's `{authority}`")]
    HostMismatch { found: String, authority: String },
    #[error("the request has more than one Host header")]
    TwoHosts,
    #[error("the request's body framing is ambiguous ({0})")]
    Framing(&'static str),
    #[error("{0}")]
    Host(Refusal),
}

impl HttpError {
    /// The status the proxy answers with.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::TooLarge => 431,
            HttpError::Host(_) | HttpError::HostMismatch { .. } | HttpError::UserInfo => 403,
            HttpError::TooManyHeaders
            | HttpError::Syntax(_)
            | HttpError::NotProxyForm
            | HttpError::Scheme
            | HttpError::Authority
            | HttpError::TwoHosts
            | HttpError::Framing(_) => 400,
        }
    }
}

fn eq_ignore_case(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Headers never forwarded (besides those `Connection` names).
fn hop_by_hop(name: &str) -> bool {
    ["connection", "keep-alive", "te", "trailer", "upgrade", "host", "proxy-connection"]
        .iter()
        .any(|h| eq_ignore_case(name, h))
        || name.len() >= 6 && eq_ignore_case(&name[..6], "proxy-")
}

/// The destination of `host[:port]` text, `default` when it has no port.
fn destination(authority: &str, default: Option<u16>) -> Result<Destination, HttpError> {
    let (host, port) = split_authority(authority).ok_or(HttpError::Authority)?;
    let port = port.or(default).ok_or(HttpError::Authority)?;
    Destination::new(host, port).map_err(HttpError::Host)
}

/// The request at the start of `buf`, and the bytes its head took; `None`
/// while the head is incomplete (and under [`MAX_HEAD_BYTES`]).
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => return Err(HttpError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::TooManyHeaders),
        Err(e) => return Err(HttpError::Syntax(e.to_string())),
    };
    if n > MAX_HEAD_BYTES {
        return Err(HttpError::TooLarge);
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let version = req.version.unwrap_or(1);
    let mut host_header = None;
    for h in req.headers.iter() {
        if eq_ignore_case(h.name, "host") {
            if host_header.is_some() {
                return Err(HttpError::TwoHosts);
            }
            host_header = Some(std::str::from_utf8(h.value).map_err(|_| HttpError::Authority)?.trim());
        }
    }
    if method == "CONNECT" {
        let dest = destination(target, None)?;
        if let Some(found) = host_header {
            check_host(found, &dest, dest.port)?;
        }
        return Ok(Some((Request::Connect(dest), n)));
    }
    let Some(scheme_end) = target.find("://") else {
        return Err(HttpError::NotProxyForm);
    };
    if !eq_ignore_case(&target[..scheme_end], "http") {
        return Err(HttpError::Scheme);
    }
    let rest = &target[scheme_end + 3..];
    let path_at = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(path_at);
    if authority.contains('@') {
        return Err(HttpError::UserInfo);
    }
    if path.contains('#') {
        return Err(HttpError::Syntax("a fragment in the request target".into()));
    }
    let dest = destination(authority, Some(80))?;
    if let Some(found) = host_header {
        check_host(found, &dest, 80)?;
    }
    let path = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let forward = rebuild(method, &path, version, req.headers, dest)?;
    Ok(Some((Request::Forward(forward), n)))
}

/// A head (a request's, or an origin's answer) read as it arrives: the
/// parser runs once the blank line that ends it is there, or once it
/// reached [`MAX_HEAD_BYTES`], never again from the start for each new
/// piece; the search for the blank line looks only at the new bytes. So
/// each byte is looked at a bounded number of times however finely the
/// sender cuts its head.
#[derive(Debug, Default)]
pub struct HeadReader {
    /// Bytes already searched for the blank line.
    scanned: usize,
    /// Bytes looked at so far (the bound's measure).
    looked: usize,
}

impl HeadReader {
    /// Bytes this reader has looked at so far.
    pub fn looked(&self) -> usize {
        self.looked
    }

    /// `parse` over `buf` (every byte fed before, and more) once the head
    /// can be complete; `None` until then. A parser that still wants more
    /// after the blank line (which ends every head) is answered with a
    /// syntax error, so it never runs twice.
    pub fn feed<T>(
        &mut self,
        buf: &[u8],
        parse: impl FnOnce(&[u8]) -> Result<Option<T>, HttpError>,
    ) -> Result<Option<T>, HttpError> {
        let from = self.scanned.saturating_sub(2).min(buf.len());
        self.looked += buf.len() - from;
        let ended = buf[from..].windows(2).any(|w| w == b"\n\n") || buf[from..].windows(3).any(|w| w == b"\n\r\n");
        self.scanned = buf.len();
        if !ended && buf.len() < MAX_HEAD_BYTES {
            return Ok(None);
        }
        self.looked += buf.len();
        match parse(buf)? {
            Some(r) => Ok(Some(r)),
            None if buf.len() >= MAX_HEAD_BYTES => Err(HttpError::TooLarge),
            None => Err(HttpError::Syntax("the head did not end at its blank line".into())),
        }
    }
}

/// An origin's answer head: its status and the bytes the head took;
/// `None` while incomplete.
pub fn parse_response(buf: &[u8]) -> Result<Option<(u16, usize)>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_BYTES => Ok(Some((resp.code.unwrap_or(0), n))),
        Ok(httparse::Status::Complete(_)) => Err(HttpError::TooLarge),
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => Err(HttpError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HttpError::TooManyHeaders),
        Err(e) => Err(HttpError::Syntax(e.to_string())),
    }
}

/// The most of a refused `Host` header a refusal quotes: a host name is at
/// most 253 bytes, with a port 259.
const MAX_HOST_QUOTED: usize = 260;

/// A `Host` header must name the destination's host and port (`default`
/// when it has none). A refusal quotes the header on one line, cut at
/// [`MAX_HOST_QUOTED`] bytes.
fn check_host(found: &str, dest: &Destination, default: u16) -> Result<(), HttpError> {
    let mismatch = || HttpError::HostMismatch {
        found: crate::display::quoted_line(found, MAX_HOST_QUOTED),
        authority: dest.authority(),
    };
    let named = destination(found, Some(default)).map_err(|_| mismatch())?;
    if named != *dest {
        return Err(mismatch());
    }
    Ok(())
}

fn rebuild(
    method: &str,
    path: &str,
    version: u8,
    headers: &[httparse::Header<'_>],
    dest: Destination,
) -> Result<Forward, HttpError> {
    let connection_names: Vec<String> = headers
        .iter()
        .filter(|h| eq_ignore_case(h.name, "connection") || eq_ignore_case(h.name, "proxy-connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value).split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect();
    let upgrade =
        headers.iter().any(|h| eq_ignore_case(h.name, "upgrade")) && connection_names.iter().any(|t| t == "upgrade");
    let (mut length, mut chunked, mut encodings) = (None, false, 0);
    for h in headers {
        if eq_ignore_case(h.name, "content-length") {
            let v = std::str::from_utf8(h.value).map_err(|_| HttpError::Framing("Content-Length"))?.trim();
            if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HttpError::Framing("a Content-Length that is not a number"));
            }
            let v: u64 = v.parse().map_err(|_| HttpError::Framing("Content-Length"))?;
            if length.is_some_and(|l| l != v) {
                return Err(HttpError::Framing("two different Content-Length headers"));
            }
            length = Some(v);
        } else if eq_ignore_case(h.name, "transfer-encoding") {
            encodings += 1;
            chunked = eq_ignore_case(String::from_utf8_lossy(h.value).trim(), "chunked");
        }
    }
    let body = match (length, encodings, chunked) {
        (None, 0, _) => Body::None,
        (Some(0), 0, _) => Body::None,
        (Some(n), 0, _) => Body::Length(n),
        (None, 1, true) => Body::Chunked,
        (None, _, _) => return Err(HttpError::Framing("a Transfer-Encoding other than one `chunked`")),
        (Some(_), _, _) => return Err(HttpError::Framing("both Content-Length and Transfer-Encoding")),
    };
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(format!("{method} {path} HTTP/1.{version}\r\nHost: ").as_bytes());
    head.extend_from_slice(host_value(&dest).as_bytes());
    head.extend_from_slice(b"\r\n");
    for h in headers {
        let named = connection_names.iter().any(|t| eq_ignore_case(t, h.name));
        let keep_upgrade = upgrade && eq_ignore_case(h.name, "upgrade");
        if (hop_by_hop(h.name) || named) && !keep_upgrade {
            continue;
        }
        head.extend_from_slice(h.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(if upgrade { b"Connection: Upgrade\r\n\r\n" } else { b"Connection: close\r\n\r\n" });
    Ok(Forward { dest, head, body, upgrade })
}

/// The `Host` value for a destination: the port only when it is not 80.
fn host_value(dest: &Destination) -> String {
    if dest.port == 80 {
        match &dest.host {
            crate::network::addr::Host::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
            other => other.to_string(),
        }
    } else {
        dest.authority()
    }
}

/// A refusal as an HTTP response: the status, and a body that says which
/// rule refused and how to allow it. `reason` is the proxy's own text.
pub fn refusal_response(status: u16, reason: &str) -> Vec<u8> {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let body = format!("pi-sandbox network: {}\n", crate::display::one_line(reason));
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Sandbox-Refusal: 1\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::addr::HostError;

    fn parse(text: &str) -> Result<Option<(Request, usize)>, HttpError> {
        parse_request(text.as_bytes())
    }
    fn forward(text: &str) -> Forward {
        match parse(text) {
            Ok(Some((Request::Forward(f), _))) => f,
            other => panic!("{text:?}: {other:?}"),
        }
    }
    fn head(f: &Forward) -> String {
        String::from_utf8(f.head.clone()).unwrap()
    }

    #[test]
    fn connect_gives_its_canonical_destination() {
        let text = "CONNECT GitHub.com.:443 HTTP/1.1\r\nHost: github.com:443\r\nUser-Agent: curl\r\n\r\nrest";
        let Ok(Some((Request::Connect(d), n))) = parse(text) else { panic!() };
        assert_eq!((d, n), (Destination::new("github.com", 443).unwrap(), text.len() - 4));
        let Ok(Some((Request::Connect(d), _))) = parse("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n") else { panic!() };
        assert_eq!(d.authority(), "[::1]:8443");
        assert_eq!(parse("CONNECT github.com HTTP/1.1\r\n\r\n"), Err(HttpError::Authority));
        assert_eq!(parse("CONNECT github.com:0 HTTP/1.1\r\n\r\n"), Err(HttpError::Authority));
        assert!(matches!(
            parse("CONNECT github.com:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n"),
            Err(HttpError::HostMismatch { .. })
        ));
    }

    #[test]
    fn a_partial_head_waits_and_a_long_one_is_refused() {
        assert_eq!(parse("GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\n"), Ok(None));
        assert_eq!(parse("CONN"), Ok(None));
        let long = format!("GET http://a.com/ HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(&long), Err(HttpError::TooLarge));
        let complete_but_long = format!("GET http://a.com/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(&complete_but_long), Err(HttpError::TooLarge));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: v\r\n")).collect();
        assert_eq!(parse(&format!("GET http://a.com/ HTTP/1.1\r\n{many}\r\n")), Err(HttpError::TooManyHeaders));
    }

    #[test]
    fn a_head_fed_a_byte_at_a_time_is_parsed_once() {
        // The largest head taken, arriving one byte per read.
        let filler = "a".repeat(MAX_HEAD_BYTES - 200);
        let text = format!("GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\nX-Filler: {filler}\r\n\r\n");
        let mut reader = HeadReader::default();
        let mut parses = 0;
        let mut got = None;
        for end in 1..=text.len() {
            let r = reader.feed(&text.as_bytes()[..end], |b| {
                parses += 1;
                parse_request(b)
            });
            if let Some(r) = r.unwrap() {
                got = Some((r, end));
                break;
            }
        }
        let ((request, used), end) = got.expect("read whole");
        assert!(matches!(request, Request::Forward(_)));
        assert_eq!((used, end, parses), (text.len(), text.len(), 1));
        // Linear: each byte a few times, where parsing from the start on
        // every read looked at about len * len / 2.
        assert!(reader.looked() <= 4 * text.len(), "{} bytes looked at for {}", reader.looked(), text.len());
        // A head cut anywhere, bare line feeds included, still reads whole.
        let lf = "GET http://a.com/ HTTP/1.1\nHost: a.com\n\n";
        for cut in 1..lf.len() {
            let mut r = HeadReader::default();
            assert_eq!(r.feed(&lf.as_bytes()[..cut], parse_request), Ok(None), "{cut}");
            assert!(r.feed(lf.as_bytes(), parse_request).unwrap().is_some(), "{cut}");
        }
        // One that never ends is refused at the bound; an answer's status is read.
        let endless = format!("GET http://a.com/ HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(
            HeadReader::default().feed(&endless.as_bytes()[..MAX_HEAD_BYTES], parse_request),
            Err(HttpError::TooLarge)
        );
        let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nframes";
        assert_eq!(HeadReader::default().feed(answer, parse_response), Ok(Some((101, answer.len() - 6))));
    }

    #[test]
    fn a_plain_request_is_rebuilt_without_hop_by_hop_headers() {
        let f = forward(
            "GET http://Example.com/a/b?c=d HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: Basic eA==\r\n\
             Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\n\
             TE: trailers\r\nAccept: */*\r\nUpgrade: h2c\r\n\r\n",
        );
        assert_eq!(f.dest, Destination::new("example.com", 80).unwrap());
        assert_eq!(head(&f), "GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n");
        assert_eq!((f.body, f.upgrade), (Body::None, false));
        let f = forward("POST http://a.com:8080?q HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(head(&f), "POST /?q HTTP/1.0\r\nHost: a.com:8080\r\nContent-Length: 5\r\nConnection: close\r\n\r\n");
        assert_eq!(f.body, Body::Length(5));
        let f = forward("POST http://a.com/ HTTP/1.1\r\nHost: a.com:80\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(f.body, Body::Chunked);
        let f = forward("GET http://[::1]:8080/ HTTP/1.1\r\n\r\n");
        assert!(head(&f).starts_with("GET / HTTP/1.1\r\nHost: [::1]:8080\r\n"), "{}", head(&f));
    }

    #[test]
    fn a_websocket_upgrade_keeps_its_upgrade() {
        let f = forward(
            "GET http://a.com/ws HTTP/1.1\r\nHost: a.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: x\r\n\r\n",
        );
        assert!(f.upgrade);
        assert_eq!(
            head(&f),
            "GET /ws HTTP/1.1\r\nHost: a.com\r\nUpgrade: websocket\r\nSec-WebSocket-Key: x\r\nConnection: Upgrade\r\n\r\n"
        );
    }

    #[test]
    fn a_host_header_that_differs_from_the_authority_is_refused() {
        for (host, ok) in [
            ("allowed.com", true),
            ("ALLOWED.com.", true),
            ("allowed.com:80", true),
            ("evil.com", false),
            ("allowed.com:8080", false),
            ("allowed.com.evil.com", false),
            ("", false),
            ("allowed.com\0.evil", false),
        ] {
            let text = format!("GET http://allowed.com/ HTTP/1.1\r\nHost: {host}\r\n\r\n");
            let got = parse(&text);
            if ok {
                assert!(matches!(got, Ok(Some((Request::Forward(_), _)))), "{host:?}: {got:?}");
            } else {
                assert!(got.is_err(), "{host:?}: {got:?}");
            }
        }
        let e = parse("GET http://allowed.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n").unwrap_err();
        assert_eq!(e.to_string(), "the Host header names `evil.com`, not the request's `allowed.com:80`");
        assert_eq!(e.status(), 403);
        // A long header is quoted on one line, cut (the head's bound alone would let 16 KiB through).
        let long = format!("{}\u{202e}.evil.com", "a".repeat(12_000));
        let e = parse(&format!("GET http://allowed.com/ HTTP/1.1\r\nHost: {long}\r\n\r\n")).unwrap_err();
        let HttpError::HostMismatch { found, .. } = &e else { panic!("{e:?}") };
        assert_eq!(found, &format!("{}...", "a".repeat(MAX_HOST_QUOTED)));
        assert!(e.to_string().len() < 400, "{} bytes", e.to_string().len());
        let e = parse("GET http://allowed.com/ HTTP/1.1\r\nHost: x\u{202e}y\r\n\r\n").unwrap_err();
        assert!(!e.to_string().contains('\u{202e}'), "{e}");
        assert_eq!(parse("GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n"), Err(HttpError::TwoHosts));
    }

    #[test]
    fn requests_the_proxy_does_not_take_are_refused_each_with_its_reason() {
        let cases = [
            ("GET / HTTP/1.1\r\nHost: a.com\r\n\r\n", HttpError::NotProxyForm),
            ("GET https://a.com/ HTTP/1.1\r\n\r\n", HttpError::Scheme),
            ("GET ftp://a.com/ HTTP/1.1\r\n\r\n", HttpError::Scheme),
            ("GET http://user:pw@a.com/ HTTP/1.1\r\n\r\n", HttpError::UserInfo),
            ("GET http://a.com:99999/ HTTP/1.1\r\n\r\n", HttpError::Authority),
            ("GET http:///x HTTP/1.1\r\n\r\n", HttpError::Host(Refusal::Malformed { error: Some(HostError::Empty) })),
            (
                "POST http://a.com/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                HttpError::Framing("both Content-Length and Transfer-Encoding"),
            ),
            (
                "POST http://a.com/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                HttpError::Framing("two different Content-Length headers"),
            ),
            (
                "POST http://a.com/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
                HttpError::Framing("a Content-Length that is not a number"),
            ),
            (
                "POST http://a.com/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                HttpError::Framing("a Transfer-Encoding other than one `chunked`"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Err(want), "{text:?}");
        }
        assert!(matches!(parse("GET http://a.com/ HTTP/1.1\r\nBad Header\r\n\r\n"), Err(HttpError::Syntax(_))));
        assert!(matches!(parse("\x16\x03\x01"), Err(HttpError::Syntax(_))));
    }

    #[test]
    fn a_refusal_response_names_the_rule_in_its_body() {
        let r = String::from_utf8(refusal_response(403, "refused by network.deniedDomains \"*:22\"\x1b[2J")).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{r}");
        let body = r.split("\r\n\r\n").nth(1).unwrap();
        assert!(body.contains("refused by network.deniedDomains \"*:22\""), "{r}");
        assert!(!body.contains('\x1b'), "{r:?}");
        assert!(r.contains(&format!("Content-Length: {}\r\n", body.len())), "{r}");
    }
}
