//! The proxy server: serves the listener made inside one sandbox's network
//! namespace (`nshelper::listen`), so every connection it accepts is that
//! sandbox's command's.
//!
//! Per connection, every step bounded: the first bytes within
//! [`HEAD_DEADLINE`] and [`MAX_HEAD_BYTES`]; the first byte tells SOCKS5
//! from HTTP; the destination goes through the decision (`decide`); the
//! dial within [`DIAL_DEADLINE`], to the checked addresses only. `CONNECT`:
//! after `200` the whole ClientHello is read (bounded) and its server name
//! must be the `CONNECT` host. Plain HTTP: the rebuilt head (Host written
//! from the checked authority, hop-by-hop and `Proxy-*` headers removed,
//! `Connection: close`), then exactly the body its `Content-Length` gives
//! (a chunked body is refused), one request per connection. SOCKS5:
//! `CONNECT` only. Then bytes are relayed both ways through two fixed
//! buffers until either side ends or [`IDLE_DEADLINE`] passes with none.
//! At most [`MAX_CONNECTIONS`] are served at once (the others wait in the
//! kernel's backlog). Refusals answer `403` or the SOCKS failure code,
//! with a body that names the rule and how to allow it; each decision is
//! kept (bounded) for the command's network summary.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::decide::{decide, Context, Destination, Dial, Refusal, Resolver, Reviewer};
use super::policy::{Lists, YoloReview};
use super::wire::{self, http, socks, tls, Protocol, MAX_HEAD_BYTES};

/// Connections served at once by one sandbox's proxy.
pub const MAX_CONNECTIONS: usize = 64;
/// Time for a connection's head (or SOCKS exchange), and for a tunnel's
/// ClientHello.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Time to connect to the destination.
pub const DIAL_DEADLINE: Duration = Duration::from_secs(10);
/// A relay with no byte either way for this long is closed.
pub const IDLE_DEADLINE: Duration = Duration::from_secs(300);
/// Bytes of one direction's relay buffer.
const RELAY_BUFFER: usize = 64 * 1024;
/// Decisions kept for the summary (later ones are counted only).
pub const MAX_KEPT: usize = 32;

/// What one sandbox's proxy decides by.
#[derive(Debug, Clone)]
pub struct Policy {
    pub lists: Lists,
    /// The host's own interface addresses.
    pub own: Vec<IpAddr>,
    pub yolo: bool,
    pub yolo_review: YoloReview,
}

/// One connection's outcome, for the command's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Allowed { dest: String },
    Refused { dest: Option<String>, why: String, allow_line: Option<String> },
}

/// The decisions of one sandbox's proxy.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub kept: Vec<Outcome>,
    /// Outcomes past [`MAX_KEPT`].
    pub more: usize,
}

impl Summary {
    fn push(&mut self, o: Outcome) {
        if self.kept.contains(&o) {
            return;
        }
        if self.kept.len() < MAX_KEPT {
            self.kept.push(o);
        } else {
            self.more += 1;
        }
    }

    /// Short sentences for the end of the command's result: allowed and
    /// refused destinations, and the line that would allow a refused one.
    pub fn lines(&self) -> Vec<String> {
        let allowed: Vec<&str> = self
            .kept
            .iter()
            .filter_map(|o| match o {
                Outcome::Allowed { dest } => Some(dest.as_str()),
                Outcome::Refused { .. } => None,
            })
            .collect();
        let mut out = Vec::new();
        if !allowed.is_empty() {
            out.push(format!("network: allowed {}.", allowed.join(", ")));
        }
        for o in &self.kept {
            if let Outcome::Refused { why, allow_line, .. } = o {
                let fix = allow_line.as_ref().map(|l| format!(" (to allow it: {l})")).unwrap_or_default();
                out.push(format!("network: {why}{fix}."));
            }
        }
        if self.more > 0 {
            out.push(format!("network: {} more connection outcomes not listed.", self.more));
        }
        out
    }
}

/// The reviewer where no one can review (no UI): an unmatched destination
/// is refused at once.
pub struct NoReviewer;

impl Reviewer for NoReviewer {
    async fn review(&self, _dest: &Destination) -> super::decide::Review {
        super::decide::Review::Unavailable
    }
}

/// The variables that point a command's clients at its proxy on
/// `127.0.0.1:port`: `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` (SOCKS5 with
/// names resolved by the proxy) and their lowercase forms, and `NO_PROXY`
/// for the sandbox's own loopback by name.
pub fn environment(port: u16) -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let mut env = Vec::new();
    for (name, value) in [("HTTP_PROXY", &http), ("HTTPS_PROXY", &http), ("ALL_PROXY", &socks)] {
        env.push((name.to_string(), value.clone()));
        env.push((name.to_ascii_lowercase(), value.clone()));
    }
    env.push(("NO_PROXY".into(), "localhost".into()));
    env.push(("no_proxy".into(), "localhost".into()));
    env
}

struct Shared<R, V> {
    policy: Policy,
    resolver: R,
    reviewer: V,
    summary: parking_lot::Mutex<Summary>,
}

/// Serves `listener` until the returned handle is aborted (the command's
/// end); the summary is read through [`Served::summary`].
pub struct Served<R, V> {
    shared: Arc<Shared<R, V>>,
    task: tokio::task::JoinHandle<()>,
}

impl<R, V> Served<R, V> {
    pub fn summary(&self) -> Summary {
        self.shared.summary.lock().clone()
    }
}

impl<R, V> Drop for Served<R, V> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start serving `listener` (in the runtime of the caller).
pub fn serve<R, V>(listener: TcpListener, policy: Policy, resolver: R, reviewer: V) -> Served<R, V>
where
    R: Resolver + Send + Sync + 'static,
    V: Reviewer + Send + Sync + 'static,
{
    let shared = Arc::new(Shared { policy, resolver, reviewer, summary: Default::default() });
    let s = shared.clone();
    let task = tokio::spawn(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else { return };
            let Ok((conn, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            // Finished connections are reaped as new ones come.
            while conns.try_join_next().is_some() {}
            let s = s.clone();
            conns.spawn(async move {
                let _permit = permit;
                one(conn, &s).await;
            });
        }
    });
    Served { shared, task }
}

async fn one<R: Resolver, V: Reviewer>(mut conn: TcpStream, s: &Shared<R, V>) {
    let _ = conn.set_nodelay(true);
    let mut head = Vec::with_capacity(1024);
    let mut first = [0u8; 1];
    match tokio::time::timeout(HEAD_DEADLINE, conn.read(&mut first)).await {
        Ok(Ok(1)) => head.push(first[0]),
        _ => return,
    }
    match wire::sniff(first[0]) {
        Some(Protocol::Http) => http_conn(conn, head, s).await,
        Some(Protocol::Socks5) => socks_conn(conn, head, s).await,
        None => {}
    }
}

/// Read more of a head into `buf` (bounded); false on end, error or time.
async fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>, limit: usize, until: tokio::time::Instant) -> bool {
    let room = limit.saturating_sub(buf.len()).min(4096);
    if room == 0 {
        return false;
    }
    let mut chunk = [0u8; 4096];
    match tokio::time::timeout_at(until, conn.read(&mut chunk[..room])).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
        _ => false,
    }
}

async fn decided<R: Resolver, V: Reviewer>(dest: &Destination, s: &Shared<R, V>) -> Result<Dial, Refusal> {
    let ctx = Context {
        lists: &s.policy.lists,
        own: &s.policy.own,
        granted: s.reviewer.granted(dest),
        yolo: s.policy.yolo,
        yolo_review: s.policy.yolo_review,
    };
    let r = decide(dest, &ctx, &s.resolver, &s.reviewer).await;
    let outcome = match &r {
        Ok(_) => Outcome::Allowed { dest: dest.authority() },
        Err(e) => Outcome::Refused { dest: Some(dest.authority()), why: e.to_string(), allow_line: e.allow_line() },
    };
    s.summary.lock().push(outcome);
    r
}

fn refuse<R, V>(s: &Shared<R, V>, why: String) {
    s.summary.lock().push(Outcome::Refused { dest: None, why, allow_line: None });
}

async fn dial(addrs: &[SocketAddr]) -> Option<TcpStream> {
    for a in addrs {
        if let Ok(Ok(c)) = tokio::time::timeout(DIAL_DEADLINE, TcpStream::connect(a)).await {
            // Relayed bytes go out as they come (each side already chose its own segments).
            let _ = c.set_nodelay(true);
            return Some(c);
        }
    }
    None
}

async fn http_conn<R: Resolver, V: Reviewer>(mut conn: TcpStream, mut head: Vec<u8>, s: &Shared<R, V>) {
    let until = tokio::time::Instant::now() + HEAD_DEADLINE;
    let (request, used) = loop {
        match http::parse_request(&head) {
            Ok(Some(r)) => break r,
            Ok(None) if read_more(&mut conn, &mut head, MAX_HEAD_BYTES, until).await => {}
            Ok(None) => return,
            Err(e) => {
                let why = format!("refused: {e}");
                let _ = conn.write_all(&http::refusal_response(e.status(), &why)).await;
                refuse(s, why);
                return;
            }
        }
    };
    let dest = match &request {
        http::Request::Connect(d) => d.clone(),
        http::Request::Forward(f) => f.dest.clone(),
    };
    let dial_to = match decided(&dest, s).await {
        Ok(d) => d,
        Err(e) => {
            let _ = conn.write_all(&http::refusal_response(403, &e.to_string())).await;
            return;
        }
    };
    let Some(mut up) = dial(&dial_to.addrs).await else {
        let why = format!("{} could not be reached", dest.authority());
        let _ = conn.write_all(&http::refusal_response(502, &why)).await;
        return;
    };
    match request {
        http::Request::Connect(dest) => {
            if conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
                return;
            }
            let mut hello = head.split_off(used);
            if !tunnel_hello(&mut conn, &mut hello, &dest, s).await {
                return;
            }
            if up.write_all(&hello).await.is_ok() {
                relay(conn, up).await;
            }
        }
        http::Request::Forward(f) => {
            let length = match f.body {
                http::Body::None => 0,
                http::Body::Length(n) => n,
                http::Body::Chunked => {
                    let why = "refused: a chunked request body is not forwarded (send Content-Length)".to_string();
                    let _ = conn.write_all(&http::refusal_response(400, &why)).await;
                    refuse(s, why);
                    return;
                }
            };
            let early = &head[used..];
            let early = &early[..early.len().min(usize::try_from(length).unwrap_or(usize::MAX))];
            if up.write_all(&f.head).await.is_err() || up.write_all(early).await.is_err() {
                return;
            }
            let rest = length - early.len() as u64;
            forward_body_and_answer(conn, up, rest).await;
        }
    }
}

/// The tunnel's ClientHello, read whole (bounded) into `hello`; its name
/// must be the tunnel's host. False: the tunnel is closed.
async fn tunnel_hello<R, V>(conn: &mut TcpStream, hello: &mut Vec<u8>, dest: &Destination, s: &Shared<R, V>) -> bool {
    let until = tokio::time::Instant::now() + HEAD_DEADLINE;
    loop {
        if let Some(&b) = hello.first() {
            if !tls::looks_like_tls(b) {
                if dest.port == 443 {
                    refuse(s, format!("refused: the tunnel to {} did not start TLS", dest.authority()));
                    return false;
                }
                return true;
            }
            match tls::parse_client_hello(hello) {
                Ok(Some(h)) => {
                    return match tls::check_sni(dest, &h) {
                        Ok(()) => true,
                        Err(e) => {
                            refuse(s, format!("refused: {e}"));
                            false
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    refuse(s, format!("refused: the tunnel to {}: {e}", dest.authority()));
                    return false;
                }
            }
        }
        if !read_more(conn, hello, tls::MAX_HELLO_INPUT, until).await {
            return false;
        }
    }
}

/// Send the rest of a plain request's body (`rest` bytes, no more), then
/// relay the answer until the origin ends.
async fn forward_body_and_answer(conn: TcpStream, up: TcpStream, mut rest: u64) {
    let (mut cr, mut cw) = conn.into_split();
    let (mut ur, mut uw) = up.into_split();
    let upload = async move {
        let mut buf = vec![0u8; RELAY_BUFFER];
        while rest > 0 {
            let want = buf.len().min(usize::try_from(rest).unwrap_or(usize::MAX));
            match tokio::time::timeout(IDLE_DEADLINE, cr.read(&mut buf[..want])).await {
                Ok(Ok(n)) if n > 0 => {
                    if uw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    rest -= n as u64;
                }
                _ => return,
            }
        }
    };
    let download = one_way(&mut ur, &mut cw);
    tokio::join!(upload, download);
}

/// Copy `from` to `to` until the end, an error, or an idle deadline.
async fn one_way<A: AsyncRead + Unpin, B: AsyncWrite + Unpin>(from: &mut A, to: &mut B) {
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        match tokio::time::timeout(IDLE_DEADLINE, from.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            _ => {
                let _ = to.shutdown().await;
                return;
            }
        }
    }
}

/// Relay both ways until both directions ended.
async fn relay(conn: TcpStream, up: TcpStream) {
    let (mut cr, mut cw) = conn.into_split();
    let (mut ur, mut uw) = up.into_split();
    tokio::join!(one_way(&mut cr, &mut uw), one_way(&mut ur, &mut cw));
}

async fn socks_conn<R: Resolver, V: Reviewer>(mut conn: TcpStream, mut buf: Vec<u8>, s: &Shared<R, V>) {
    let until = tokio::time::Instant::now() + HEAD_DEADLINE;
    let (no_auth, used) = loop {
        match socks::parse_greeting(&buf) {
            Ok(Some(g)) => break g,
            Ok(None) if read_more(&mut conn, &mut buf, MAX_HEAD_BYTES, until).await => {}
            _ => return,
        }
    };
    if conn.write_all(&socks::choice(no_auth)).await.is_err() || !no_auth {
        return;
    }
    let mut buf = buf.split_off(used);
    let (dest, used) = loop {
        match socks::parse_request(&buf) {
            Ok(Some(r)) => break r,
            Ok(None) if read_more(&mut conn, &mut buf, MAX_HEAD_BYTES, until).await => {}
            Ok(None) => return,
            Err(e) => {
                let _ = conn.write_all(&socks::reply(e.reply_code())).await;
                refuse(s, format!("refused (SOCKS): {e}"));
                return;
            }
        }
    };
    let Ok(dial_to) = decided(&dest, s).await else {
        let _ = conn.write_all(&socks::reply(socks::reply::NOT_ALLOWED)).await;
        return;
    };
    let Some(mut up) = dial(&dial_to.addrs).await else {
        let _ = conn.write_all(&socks::reply(socks::reply::HOST_UNREACHABLE)).await;
        return;
    };
    if conn.write_all(&socks::reply(socks::reply::SUCCEEDED)).await.is_err() {
        return;
    }
    if up.write_all(&buf[used..]).await.is_ok() {
        relay(conn, up).await;
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
