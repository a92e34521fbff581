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
//! (a chunked body is refused), one request per connection; an `Upgrade`
//! answered `101` becomes a tunnel to the same destination. SOCKS5:
//! `CONNECT` only. Then bytes are relayed both ways through two fixed
//! buffers (a tunnel: through pipes with splice(2), `tunnel`, the bytes
//! never copied into the proxy) until either side ends or
//! [`IDLE_DEADLINE`] passes with none;
//! a peer that does not take a written piece within [`WRITE_DEADLINE`]
//! loses the connection. Heads are parsed as they arrive, each byte a
//! bounded number of times (`http::HeadReader`, `tls::HelloReader`).
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
use super::tunnel::{relay, relay_halves};
use super::wire::{self, http, socks, tls, Protocol, MAX_HEAD_BYTES};

/// Connections served at once by one sandbox's proxy.
pub const MAX_CONNECTIONS: usize = 64;
/// Time for a connection's head (or SOCKS exchange), and for a tunnel's
/// ClientHello.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Time to connect to the destination.
pub const DIAL_DEADLINE: Duration = Duration::from_secs(10);
/// A relay direction with no byte for this long is closed; so is a
/// plain request whose origin has not answered.
pub const IDLE_DEADLINE: Duration = Duration::from_secs(300);
/// Time for a peer to take one piece the proxy writes it (at most a relay
/// buffer): a peer that stops reading loses its connection, never holds a
/// slot and its buffers for good.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(60);
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
    pub bounds: Bounds,
}

/// The proxy's time bounds (the constants above; shorter in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub head: Duration,
    pub dial: Duration,
    pub idle: Duration,
    pub write: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { head: HEAD_DEADLINE, dial: DIAL_DEADLINE, idle: IDLE_DEADLINE, write: WRITE_DEADLINE }
    }
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

/// Lists a running proxy reads at each connection (the python tool's,
/// which lives across calls: `/sandbox allow` reaches it at once).
pub type LiveLists = Arc<parking_lot::RwLock<Lists>>;

struct Shared<R, V> {
    policy: Policy,
    /// When set, the lists in force instead of `policy.lists`.
    live: Option<LiveLists>,
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

    /// Its reviewer (a desk serving many calls is told when each starts).
    pub fn reviewer(&self) -> &V {
        &self.shared.reviewer
    }

    /// The decisions since the last take, and a fresh summary for the
    /// next ones (a proxy that serves many calls: the python tool's).
    pub fn take_summary(&self) -> Summary {
        std::mem::take(&mut *self.shared.summary.lock())
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
    serve_live(listener, policy, None, resolver, reviewer)
}

/// [`serve`], with the lists read from `live` at each connection when set.
pub fn serve_live<R, V>(
    listener: TcpListener,
    policy: Policy,
    live: Option<LiveLists>,
    resolver: R,
    reviewer: V,
) -> Served<R, V>
where
    R: Resolver + Send + Sync + 'static,
    V: Reviewer + Send + Sync + 'static,
{
    let shared = Arc::new(Shared { policy, live, resolver, reviewer, summary: Default::default() });
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
    match tokio::time::timeout(s.policy.bounds.head, conn.read(&mut first)).await {
        Ok(Ok(1)) => head.push(first[0]),
        _ => return,
    }
    match wire::sniff(first[0]) {
        Some(Protocol::Http) => http_conn(conn, head, s).await,
        Some(Protocol::Socks5) => socks_conn(conn, head, s).await,
        None => {}
    }
}

/// Read `conn` into `buf` (at most `limit` bytes, until `until`) and hand
/// `parse` everything so far each time more came, until it answers.
/// `Ok(None)`: the peer ended, the bound or the time passed first.
async fn read_parsed<C: AsyncRead + Unpin, T, E>(
    conn: &mut C,
    buf: &mut Vec<u8>,
    limit: usize,
    until: tokio::time::Instant,
    mut parse: impl FnMut(&[u8]) -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let mut chunk = [0u8; 4096];
    loop {
        if !buf.is_empty() {
            if let Some(r) = parse(buf)? {
                return Ok(Some(r));
            }
        }
        let room = limit.saturating_sub(buf.len()).min(chunk.len());
        if room == 0 {
            return Ok(None);
        }
        match tokio::time::timeout_at(until, conn.read(&mut chunk[..room])).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return Ok(None),
        }
    }
}

/// Write all of `bytes` within the write bound; false: the peer did not
/// take them (or is gone), and the connection is to be dropped.
async fn put<W: AsyncWrite + Unpin>(to: &mut W, bytes: &[u8], b: &Bounds) -> bool {
    matches!(tokio::time::timeout(b.write, to.write_all(bytes)).await, Ok(Ok(())))
}

async fn decided<R: Resolver, V: Reviewer>(dest: &Destination, s: &Shared<R, V>) -> Result<Dial, Refusal> {
    let live = s.live.as_ref().map(|l| l.read().clone());
    let ctx = Context {
        lists: live.as_ref().unwrap_or(&s.policy.lists),
        own: &s.policy.own,
        granted: s.reviewer.granted(dest),
        yolo: s.policy.yolo || s.reviewer.yolo(),
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

async fn dial(addrs: &[SocketAddr], b: &Bounds) -> Option<TcpStream> {
    for a in addrs {
        if let Ok(Ok(c)) = tokio::time::timeout(b.dial, TcpStream::connect(a)).await {
            // Relayed bytes go out as they come (each side already chose its own segments).
            let _ = c.set_nodelay(true);
            return Some(c);
        }
    }
    None
}

async fn http_conn<R: Resolver, V: Reviewer>(mut conn: TcpStream, mut head: Vec<u8>, s: &Shared<R, V>) {
    let b = &s.policy.bounds;
    let until = tokio::time::Instant::now() + b.head;
    let mut reader = http::HeadReader::default();
    let parsed = read_parsed(&mut conn, &mut head, MAX_HEAD_BYTES, until, |buf| reader.feed(buf, http::parse_request));
    let (request, used) = match parsed.await {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            let why = format!("refused: {e}");
            put(&mut conn, &http::refusal_response(e.status(), &why), b).await;
            refuse(s, why);
            return;
        }
    };
    let dest = match &request {
        http::Request::Connect(d) => d.clone(),
        http::Request::Forward(f) => f.dest.clone(),
    };
    let dial_to = match decided(&dest, s).await {
        Ok(d) => d,
        Err(e) => {
            put(&mut conn, &http::refusal_response(403, &e.to_string()), b).await;
            return;
        }
    };
    let Some(mut up) = dial(&dial_to.addrs, b).await else {
        let why = format!("{} could not be reached", dest.authority());
        put(&mut conn, &http::refusal_response(502, &why), b).await;
        return;
    };
    match request {
        http::Request::Connect(dest) => {
            if !put(&mut conn, b"HTTP/1.1 200 Connection established\r\n\r\n", b).await {
                return;
            }
            let mut hello = head.split_off(used);
            if tunnel_hello(&mut conn, &up, &mut hello, &dest, s).await && put(&mut up, &hello, b).await {
                relay(conn, up, b).await;
            }
        }
        http::Request::Forward(f) => {
            let length = match f.body {
                http::Body::None => 0,
                http::Body::Length(n) => n,
                http::Body::Chunked => {
                    let why = "refused: a chunked request body is not forwarded (send Content-Length)".to_string();
                    put(&mut conn, &http::refusal_response(400, &why), b).await;
                    refuse(s, why);
                    return;
                }
            };
            let mut early = head.split_off(used);
            let after = early.split_off(early.len().min(usize::try_from(length).unwrap_or(usize::MAX)));
            if !put(&mut up, &f.head, b).await || !put(&mut up, &early, b).await {
                return;
            }
            let rest = length - early.len() as u64;
            if f.upgrade {
                upgrade(conn, up, rest, after, b).await;
            } else {
                forward_body_and_answer(conn, up, rest, b).await;
            }
        }
    }
}

/// The tunnel's ClientHello, read whole (bounded) into `hello`; its name
/// must be the tunnel's host. False: the tunnel is closed.
/// On a port other than 443 the origin may speak first (SMTP, FTP, MySQL):
/// its first bytes, before any of the client's, start the relay (a client
/// there could as well have sent a first byte that is not TLS).
async fn tunnel_hello<R, V>(
    conn: &mut TcpStream,
    up: &TcpStream,
    hello: &mut Vec<u8>,
    dest: &Destination,
    s: &Shared<R, V>,
) -> bool {
    let until = tokio::time::Instant::now() + s.policy.bounds.head;
    if hello.is_empty() {
        let first = read_parsed(conn, hello, 1, until, |_| Ok::<_, ()>(Some(())));
        let origin_first = async {
            if dest.port == 443 {
                std::future::pending::<()>().await;
            }
            let _ = up.readable().await;
        };
        tokio::select! {
            r = first => if !matches!(r, Ok(Some(()))) {
                return false;
            },
            () = origin_first => return true,
        }
    }
    if !tls::looks_like_tls(hello[0]) {
        if dest.port == 443 {
            refuse(s, format!("refused: the tunnel to {} did not start TLS", dest.authority()));
            return false;
        }
        return true;
    }
    let mut reader = tls::HelloReader::default();
    match read_parsed(conn, hello, tls::MAX_HELLO_INPUT, until, |buf| reader.feed(buf)).await {
        Ok(Some(h)) => match tls::check_sni(dest, &h) {
            Ok(()) => true,
            Err(e) => {
                refuse(s, format!("refused: {e}"));
                false
            }
        },
        Ok(None) => false,
        Err(e) => {
            refuse(s, format!("refused: the tunnel to {}: {e}", dest.authority()));
            false
        }
    }
}

/// Send the rest of a plain request's body (`rest` bytes, no more), then
/// relay the answer until the origin ends.
async fn forward_body_and_answer(conn: TcpStream, up: TcpStream, rest: u64, b: &Bounds) {
    let (mut cr, mut cw) = conn.into_split();
    let (mut ur, uw) = up.into_split();
    let upload = body(&mut cr, uw, rest, b);
    let download = one_way(&mut ur, &mut cw, b);
    tokio::join!(upload, download);
}

/// Copy `rest` bytes of a request's body from `from` to `to`, then end
/// `to` (dropped: its write side shut). False: the client or the origin
/// failed, or was too slow.
async fn body<A: AsyncRead + Unpin, B: AsyncWrite + Unpin>(from: &mut A, mut to: B, mut rest: u64, b: &Bounds) -> bool {
    let mut buf = vec![0u8; RELAY_BUFFER.min(usize::try_from(rest).unwrap_or(usize::MAX)).max(1)];
    while rest > 0 {
        let want = buf.len().min(usize::try_from(rest).unwrap_or(usize::MAX));
        match tokio::time::timeout(b.idle, from.read(&mut buf[..want])).await {
            Ok(Ok(n)) if n > 0 => {
                if !put(&mut to, &buf[..n], b).await {
                    return false;
                }
                rest -= n as u64;
            }
            _ => return false,
        }
    }
    true
}

/// An `Upgrade` request (a WebSocket) sent: the rest of its body, then the
/// origin's answer head. A `101` makes the connection a tunnel to the same
/// checked destination, relayed both ways like a `CONNECT` (with `after`,
/// what the client sent past the request, first); any other answer is
/// relayed as a plain request's.
async fn upgrade(conn: TcpStream, up: TcpStream, rest: u64, after: Vec<u8>, b: &Bounds) {
    let (mut cr, mut cw) = conn.into_split();
    let (mut ur, mut uw) = up.into_split();
    if !body(&mut cr, &mut uw, rest, b).await {
        return;
    }
    let mut answer = Vec::with_capacity(1024);
    let until = tokio::time::Instant::now() + b.idle;
    let mut reader = http::HeadReader::default();
    let parsed = read_parsed(&mut ur, &mut answer, MAX_HEAD_BYTES, until, |buf| reader.feed(buf, http::parse_response));
    let Ok(Some((status, _))) = parsed.await else {
        return;
    };
    if !put(&mut cw, &answer, b).await {
        return;
    }
    if status != 101 {
        drop(uw);
        one_way(&mut ur, &mut cw, b).await;
        return;
    }
    if put(&mut uw, &after, b).await {
        relay_halves((cr, cw), (ur, uw), b).await;
    }
}

/// Copy `from` to `to` until the end (then `to` is shut for writing) or
/// the idle bound; true: ended cleanly. False: an error, or `to` did not
/// take a piece within the write bound.
async fn one_way<A: AsyncRead + Unpin, B: AsyncWrite + Unpin>(from: &mut A, to: &mut B, b: &Bounds) -> bool {
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        match tokio::time::timeout(b.idle, from.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                if !put(to, &buf[..n], b).await {
                    return false;
                }
            }
            Ok(Ok(_)) => {
                let _ = tokio::time::timeout(b.write, to.shutdown()).await;
                return true;
            }
            _ => {
                let _ = tokio::time::timeout(b.write, to.shutdown()).await;
                return false;
            }
        }
    }
}

async fn socks_conn<R: Resolver, V: Reviewer>(mut conn: TcpStream, mut buf: Vec<u8>, s: &Shared<R, V>) {
    let b = &s.policy.bounds;
    let until = tokio::time::Instant::now() + b.head;
    let Ok(Some((no_auth, used))) =
        read_parsed(&mut conn, &mut buf, MAX_HEAD_BYTES, until, socks::parse_greeting).await
    else {
        return;
    };
    if !put(&mut conn, &socks::choice(no_auth), b).await || !no_auth {
        return;
    }
    let mut buf = buf.split_off(used);
    let (dest, used) = match read_parsed(&mut conn, &mut buf, MAX_HEAD_BYTES, until, socks::parse_request).await {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            put(&mut conn, &socks::reply(e.reply_code()), b).await;
            refuse(s, format!("refused (SOCKS): {e}"));
            return;
        }
    };
    let Ok(dial_to) = decided(&dest, s).await else {
        put(&mut conn, &socks::reply(socks::reply::NOT_ALLOWED), b).await;
        return;
    };
    let Some(mut up) = dial(&dial_to.addrs, b).await else {
        put(&mut conn, &socks::reply(socks::reply::HOST_UNREACHABLE), b).await;
        return;
    };
    if put(&mut conn, &socks::reply(socks::reply::SUCCEEDED), b).await && put(&mut up, &buf[used..], b).await {
        relay(conn, up, b).await;
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
