//! The proxy against local origins, with a fake resolver and no reviewer
//! (a test listener on `127.0.0.1:0` stands in for the sandbox's).

use super::*;
use crate::network::policy::{parse_private, parse_rule, List};
use crate::network::tunnel::{grown_pipes, GROW_AFTER, MAX_GROWN_PIPES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Default)]
struct Names {
    table: HashMap<String, Vec<IpAddr>>,
    asked: AtomicUsize,
}

impl Resolver for Arc<Names> {
    async fn resolve(&self, name: &str, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.table.get(name).cloned().ok_or_else(|| std::io::Error::other("no such name"))
    }
}

/// An origin that answers every connection with what it received (the
/// head, and for a tunnel the first bytes), and counts connections.
async fn origin() -> (u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 65536 {
                    match tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", got.len());
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.write_all(&got).await;
            });
        }
    });
    (port, count, task)
}

struct Setup {
    proxy: SocketAddr,
    served: Served<Arc<Names>, NoReviewer>,
    names: Arc<Names>,
}

async fn proxy(allowed: &[&str], private: &[String], names: &[(&str, &str)]) -> Setup {
    proxy_within(allowed, private, names, Bounds::default()).await
}

async fn proxy_within(allowed: &[&str], private: &[String], names: &[(&str, &str)], bounds: Bounds) -> Setup {
    let lists = Lists {
        allowed: allowed.iter().map(|e| parse_rule(e, List::Allowed).unwrap()).collect(),
        denied: vec![parse_rule("*:22", List::Denied).unwrap()],
        allow_private: private.iter().map(|e| parse_private(e).unwrap()).collect(),
    };
    let mut n = Names::default();
    for (name, ip) in names {
        n.table.insert(name.to_string(), vec![ip.parse().unwrap()]);
    }
    let names = Arc::new(n);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = l.local_addr().unwrap();
    let policy = Policy { lists, own: vec![], yolo: false, yolo_review: YoloReview::Allow, bounds };
    let served = serve(l, policy, names.clone(), NoReviewer);
    Setup { proxy, served, names }
}

/// Send `bytes` to the proxy; everything it answers until it closes.
async fn exchange(proxy: SocketAddr, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    c.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_plain_request_allowed_by_allow_private_reaches_the_origin_rewritten() {
    let (port, count, _o) = origin().await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    let req = format!(
        "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic eDp5\r\n\
         Connection: keep-alive\r\n\r\n"
    );
    let out = exchange(s.proxy, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains("GET /x HTTP/1.1\r\n"), "{out}");
    assert!(out.contains(&format!("Host: 127.0.0.1:{port}\r\n")), "{out}");
    assert!(!out.contains("Proxy-Authorization") && !out.contains("keep-alive"), "{out}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(s.served.summary().lines(), vec![format!("network: allowed 127.0.0.1:{port}.")]);
}

#[tokio::test]
async fn a_host_header_other_than_the_authority_is_refused_before_any_connection() {
    let (port, count, _o) = origin().await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    let req = format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: evil.example\r\n\r\n");
    let out = exchange(s.proxy, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("the Host header names `evil.example`"), "{out}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_empty_allowlist_without_a_reviewer_refuses_a_name_before_any_lookup() {
    // CVE-2025-66479's regression: an empty list is not "allow all".
    let s = proxy(&[], &[], &[("example.com", "93.184.216.34")]).await;
    let out = exchange(s.proxy, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("no one can review it") && out.contains("network.allowedDomains"), "{out}");
    assert_eq!(s.names.asked.load(Ordering::SeqCst), 0);
    let lines = s.served.summary().lines();
    assert!(lines[0].contains("(to allow it: network.allowedDomains \"example.com:443\")"), "{lines:?}");
}

#[tokio::test]
async fn a_denied_port_and_an_address_no_entry_names_are_refused_with_their_rule() {
    let s = proxy(&["example.com"], &[], &[("example.com", "93.184.216.34")]).await;
    let out = exchange(s.proxy, b"CONNECT example.com:22 HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 403") && out.contains("refused by network.deniedDomains \"*:22\""), "{out}");
    let out = exchange(s.proxy, b"CONNECT 127.0.0.1:80 HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 403") && out.contains("is an IP address that no allow entry names"), "{out}");
}

#[tokio::test]
async fn a_name_that_resolves_to_a_private_address_is_refused_unless_allow_private_names_it() {
    let (port, count, _o) = origin().await;
    let req = format!("GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n");
    let s = proxy(&["origin.test"], &[], &[("origin.test", "127.0.0.1")]).await;
    let out = exchange(s.proxy, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 403") && out.contains("resolves to 127.0.0.1"), "{out}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
    // Baseline: the same request with the name in allowPrivate goes through.
    let s = proxy(&[], &["origin.test".to_string()], &[("origin.test", "127.0.0.1")]).await;
    let out = exchange(s.proxy, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_tunnel_whose_tls_server_name_is_not_its_host_is_closed_before_the_origin_gets_a_byte() {
    let (port, _count, _o) = origin().await;
    let s = proxy(&[], &["origin.test".to_string()], &[("origin.test", "127.0.0.1")]).await;
    let connect = format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n");
    let mut lying = connect.clone().into_bytes();
    lying.extend(tls::build_client_hello(Some(b"other.test"), &[]));
    let out = exchange(s.proxy, &lying).await;
    assert_eq!(out, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert!(s.served.summary().lines().iter().any(|l| l.contains("`other.test` is not the CONNECT host")));
    // Baseline: the matching name reaches the origin (which echoes it).
    let mut honest = connect.into_bytes();
    honest.extend(tls::build_client_hello(Some(b"origin.test"), &[]));
    let out = exchange(s.proxy, &honest).await;
    assert!(out.contains("200 Connection established\r\n\r\nHTTP/1.1 200 OK"), "{out}");
}

#[tokio::test]
async fn a_socks_name_with_a_nul_byte_is_refused_and_a_clean_one_connects() {
    let (port, count, _o) = origin().await;
    let s = proxy(&["*.allowed.test"], &["127.0.0.1".to_string()], &[("a.allowed.test", "127.0.0.1")]).await;
    let socks_to = |name: &[u8]| {
        let mut b = vec![5, 1, 0, 5, 1, 0, 3, name.len() as u8];
        b.extend_from_slice(name);
        b.extend_from_slice(&port.to_be_bytes());
        b
    };
    let out = exchange(s.proxy, &socks_to(b"evil.test\0.a.allowed.test")).await.into_bytes();
    assert_eq!(out[..4], [5, 0, 5, socks::reply::NOT_ALLOWED], "{out:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
    let mut clean = socks_to(b"a.allowed.test");
    clean.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    let out = exchange(s.proxy, &clean).await.into_bytes();
    assert_eq!(out[..4], [5, 0, 5, socks::reply::SUCCEEDED], "{out:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// Whether the memory test `name` runs here: tests of one binary share a
/// process and run in parallel, so a test that measures the resident memory
/// runs alone in a fresh process of this binary (where this is true) and the
/// caller, false here, only checks that it ran and passed.
fn alone(name: &str) -> bool {
    const ALONE: &str = "PPS_TEST_ALONE";
    if std::env::var_os(ALONE).is_some_and(|v| v == name) {
        return true;
    }
    let full = format!("network::proxy::tests::{name}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &full, "--test-threads=1", "--nocapture"])
        .env(ALONE, name)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("1 passed"), "the test did not run alone: {said}");
    eprint!("{said}");
    false
}

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_keep_host_memory_bounded_and_the_proxy_serving() {
    if !alone("a_thousand_connections_keep_host_memory_bounded_and_the_proxy_serving") {
        return;
    }
    let (port, count, _o) = origin().await;
    let s = proxy(&["example.com"], &[format!("127.0.0.1:{port}")], &[("example.com", "93.184.216.34")]).await;
    let before = rss_kib();
    let mut peak = before;
    for _wave in 0..4 {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..250 {
            let proxy = s.proxy;
            set.spawn(async move { exchange(proxy, b"CONNECT example.com:22 HTTP/1.1\r\n\r\n").await });
        }
        while let Some(out) = set.join_next().await {
            let out = out.unwrap();
            assert!(out.contains("refused by network.deniedDomains \"*:22\""), "{out}");
        }
        peak = peak.max(rss_kib());
    }
    let grew = peak.saturating_sub(before);
    eprintln!("1,000 refused connections: resident memory grew {grew} KiB (from {before} KiB)");
    assert!(grew < 48 * 1024, "grew {grew} KiB");
    // One summary line for the thousand identical refusals, and the proxy still serves.
    assert_eq!(s.served.summary().kept.len(), 1);
    let req = format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    assert!(exchange(s.proxy, req.as_bytes()).await.starts_with("HTTP/1.1 200"));
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_hold_their_slots_only_until_the_head_deadline() {
    if !alone("slow_heads_hold_their_slots_only_until_the_head_deadline") {
        return;
    }
    let (port, count, _o) = origin().await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    let before = rss_kib();
    // Every slot taken by a head that comes a byte at a time and never ends.
    let mut slow = Vec::new();
    for _ in 0..MAX_CONNECTIONS + 8 {
        let mut c = TcpStream::connect(s.proxy).await.unwrap();
        c.write_all(b"GET http://").await.unwrap();
        slow.push(c);
    }
    let trickle = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let mut closed = 0;
        while started.elapsed() < HEAD_DEADLINE + Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            closed = 0;
            for c in &mut slow {
                if c.write_all(b"a").await.is_err() {
                    closed += 1;
                }
            }
        }
        closed
    });
    // An honest request meanwhile waits for a slot, and is served once the slow ones are cut.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    let req = format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut c = TcpStream::connect(s.proxy).await.unwrap();
    c.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(HEAD_DEADLINE * 3, c.read_to_end(&mut out)).await.unwrap().unwrap();
    let waited = started.elapsed();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&out));
    assert!(waited > Duration::from_secs(5) && waited < HEAD_DEADLINE * 2, "waited {waited:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let closed = trickle.await.unwrap();
    assert!(closed >= MAX_CONNECTIONS, "{closed} slow heads were cut");
    let grew = rss_kib().saturating_sub(before);
    eprintln!("{} slow heads: resident memory grew {grew} KiB", MAX_CONNECTIONS + 8);
    assert!(grew < 16 * 1024, "grew {grew} KiB");
}

/// Upload `Content-Length: 1 GiB` through the proxy to an origin that reads
/// (or not) for `for_how_long`; the bytes the client could send.
async fn upload(proxy: SocketAddr, port: u16, for_how_long: Duration) -> u64 {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "POST http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n\r\n",
        1u64 << 30
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0u64;
    let until = tokio::time::Instant::now() + for_how_long;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, c.write(&chunk)).await {
        if n == 0 {
            break;
        }
        sent += n as u64;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_upload_to_a_stalled_upstream_stops_at_the_buffers() {
    if !alone("a_large_upload_to_a_stalled_upstream_stops_at_the_buffers") {
        return;
    }
    // An origin that accepts and never reads, and one that reads everything.
    let stalled = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalled_port = stalled.local_addr().unwrap().port();
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = stalled.accept().await {
            held.push(c);
        }
    });
    let reading = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reading_port = reading.local_addr().unwrap().port();
    let _reader = tokio::spawn(async move {
        while let Ok((mut c, _)) = reading.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let s = proxy(&[], &[format!("127.0.0.1:{stalled_port}"), format!("127.0.0.1:{reading_port}")], &[]).await;
    // Baseline: to a reading origin the upload flows.
    let flowing = upload(s.proxy, reading_port, Duration::from_secs(2)).await;
    let before = rss_kib();
    let stuck = upload(s.proxy, stalled_port, Duration::from_secs(3)).await;
    let grew = rss_kib().saturating_sub(before);
    eprintln!(
        "upload in 2 s to a reading origin: {} MiB; in 3 s to a stalled one: {} MiB (kernel buffers), resident memory grew {grew} KiB",
        flowing >> 20,
        stuck >> 20
    );
    assert!(flowing > 4 * stuck.max(1 << 20), "flowing {flowing} stuck {stuck}");
    assert!(stuck < 64 << 20, "stuck {stuck}");
    assert!(grew < 8 * 1024, "grew {grew} KiB");
}

/// A listener whose connections are answered by `serve`.
async fn origin_doing<F, Fut>(serve: F) -> (u16, tokio::task::JoinHandle<()>)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(serve(c));
        }
    });
    (port, task)
}

/// Write to `c` until a write waits `stall` (the buffers are full) or
/// fails; the bytes written.
async fn fill(c: &mut TcpStream, stall: Duration) -> u64 {
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while let Ok(Ok(n)) = tokio::time::timeout(stall, c.write(&chunk)).await {
        if n == 0 {
            break;
        }
        sent += n as u64;
    }
    sent
}

/// Whether `c` is closed by its peer within `within` (end, reset, or a
/// failing write), reading and discarding what comes.
async fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    let until = tokio::time::Instant::now() + within;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(until, c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_loses_its_tunnel_at_the_write_bound() {
    // An origin that never reads (and holds its end open), and one that
    // sends without end; each side's writes stall once the buffers fill.
    let (deaf, _d) = origin_doing(|c| async move {
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(c);
    })
    .await;
    let (loud, _l) = origin_doing(|mut c| async move {
        let chunk = vec![b'y'; 64 * 1024];
        while c.write_all(&chunk).await.is_ok() {}
    })
    .await;
    let bounds = Bounds { write: Duration::from_secs(1), ..Bounds::default() };
    let private = [format!("127.0.0.1:{deaf}"), format!("127.0.0.1:{loud}")];
    let s = proxy_within(&[], &private, &[], bounds).await;
    let tunnel = |port: u16| async move {
        let mut c = TcpStream::connect(s.proxy).await.unwrap();
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut ok = [0u8; 39];
        c.read_exact(&mut ok).await.unwrap();
        assert_eq!(&ok[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
        // The first bytes (not TLS, on a port other than 443) start the relay.
        c.write_all(b"hi").await.unwrap();
        c
    };
    // The client sends to the origin that never reads: the proxy's write
    // to it stalls, and the tunnel is closed at the bound.
    let mut c = tunnel(deaf).await;
    let sent = fill(&mut c, Duration::from_secs(2)).await;
    assert!(
        closed_within(&mut c, Duration::from_secs(10)).await,
        "the tunnel to the deaf origin stayed open ({sent} bytes sent)"
    );
    // The client never reads what the loud origin sends: closed too.
    let c = tunnel(loud).await;
    let mut stalled = c;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(closed_within(&mut stalled, Duration::from_secs(10)).await, "the tunnel from the loud origin stayed open");
    // Baseline: a client that reads keeps the loud tunnel (more than the
    // write bound) and gets its bytes.
    let mut reading = tunnel(loud).await;
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, reading.read(&mut buf)).await {
        assert!(n > 0, "the reading client's tunnel was closed after {got} bytes");
        got += n as u64;
    }
    assert!(got > 1 << 20, "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_tunnels_grow_their_pipes_up_to_the_process_bound_and_give_them_back() {
    if !alone("busy_tunnels_grow_their_pipes_up_to_the_process_bound_and_give_them_back") {
        return;
    }
    let (loud, _l) = origin_doing(|mut c| async move {
        let chunk = vec![b'y'; 64 * 1024];
        while c.write_all(&chunk).await.is_ok() {}
    })
    .await;
    let s = proxy(&[], &[format!("127.0.0.1:{loud}")], &[]).await;
    // More busy tunnels than the bound, each read past GROW_AFTER and then
    // held open without reading.
    let mut held = Vec::new();
    for _ in 0..MAX_GROWN_PIPES + 4 {
        let mut c = TcpStream::connect(s.proxy).await.unwrap();
        c.write_all(format!("CONNECT 127.0.0.1:{loud} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut ok = [0u8; 39];
        c.read_exact(&mut ok).await.unwrap();
        c.write_all(b"hi").await.unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        while got < 4 * GROW_AFTER {
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0, "the tunnel closed after {got} bytes");
            got += n as u64;
        }
        held.push(c);
    }
    // Each took a grown pipe while one was free (without the bound, all
    // of them would hold one).
    let grown = grown_pipes();
    eprintln!("{} busy tunnels: {grown} grown pipes", held.len());
    assert_eq!(grown, MAX_GROWN_PIPES);
    // Closed tunnels give theirs back.
    drop(held);
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while grown_pipes() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(grown_pipes(), 0);
}

/// An origin that takes one request head and answers `101` (then echoes
/// every byte back) when it asks for an upgrade, `200` otherwise (and
/// counts the heads it read).
async fn websocket_origin() -> (u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let heads = Arc::new(AtomicUsize::new(0));
    let h = heads.clone();
    let (port, task) = origin_doing(move |mut c| {
        let h = h.clone();
        async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf).await {
                    Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                    _ => return,
                }
            }
            h.fetch_add(1, Ordering::SeqCst);
            let at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            let rest = got.split_off(at);
            if !String::from_utf8_lossy(&got).contains("Upgrade: websocket") {
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno").await;
                // Keeps the connection open for another request, as keep-alive does.
                while let Ok(n) = c.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        h.fetch_add(1, Ordering::SeqCst);
                    }
                }
                return;
            }
            let _ = c
                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                .await;
            let _ = c.write_all(&rest).await;
            while let Ok(n) = c.read(&mut buf).await {
                if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (port, heads, task)
}

#[tokio::test]
async fn a_websocket_upgrade_is_relayed_both_ways_after_the_101() {
    let (port, heads, _o) = websocket_origin().await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    let mut c = TcpStream::connect(s.proxy).await.unwrap();
    let req = format!(
        "GET http://127.0.0.1:{port}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Key: x\r\n\r\n"
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"), "{}", String::from_utf8_lossy(&answer));
    // Frames both ways, several times, through the same tunnel.
    for round in 0..3 {
        let frame = format!("frame {round}");
        c.write_all(frame.as_bytes()).await.unwrap();
        let mut echo = vec![0u8; frame.len()];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut echo)).await.unwrap().unwrap();
        assert_eq!(echo, frame.as_bytes());
    }
    assert_eq!(heads.load(Ordering::SeqCst), 1);
    assert_eq!(s.served.summary().lines(), vec![format!("network: allowed 127.0.0.1:{port}.")]);
}

#[tokio::test]
async fn an_upgrade_the_origin_declines_is_answered_and_nothing_more_is_forwarded() {
    let (port, heads, _o) = websocket_origin().await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    // The request asks for h2c (the origin declines with 200), and a second
    // request for another host follows it on the same connection.
    let req = format!(
        "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n\
         GET /smuggled HTTP/1.1\r\nHost: other.example\r\n\r\n"
    );
    let out = exchange(s.proxy, req.as_bytes()).await;
    assert_eq!(out, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno");
    assert_eq!(heads.load(Ordering::SeqCst), 1, "the origin read a second request");
}

#[tokio::test]
async fn an_origin_that_speaks_first_is_heard_through_a_tunnel_before_the_client_sends() {
    // An SMTP-like origin: a greeting first, then every line echoed.
    let (port, _o) = origin_doing(|mut c| async move {
        let _ = c.write_all(b"220 ready\r\n").await;
        let mut buf = [0u8; 1024];
        while let Ok(n) = c.read(&mut buf).await {
            if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    })
    .await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    let mut c = TcpStream::connect(s.proxy).await.unwrap();
    c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let want = b"HTTP/1.1 200 Connection established\r\n\r\n220 ready\r\n";
    let mut got = vec![0u8; want.len()];
    // Well within the head bound (10 s), with nothing sent by the client.
    tokio::time::timeout(Duration::from_secs(3), c.read_exact(&mut got))
        .await
        .expect("the greeting never came")
        .unwrap();
    assert_eq!(&got[..], &want[..]);
    c.write_all(b"HELO a\r\n").await.unwrap();
    let mut echo = [0u8; 8];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut echo)).await.unwrap().unwrap();
    assert_eq!(&echo, b"HELO a\r\n");
}

#[tokio::test]
async fn a_taken_summary_starts_afresh_for_the_next_call() {
    let (port, _count, _o) = origin().await;
    let s = proxy(&[], &[format!("127.0.0.1:{port}")], &[]).await;
    let get = |p: u16| format!("GET http://127.0.0.1:{p}/ HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n\r\n");
    assert!(exchange(s.proxy, get(port).as_bytes()).await.starts_with("HTTP/1.1 200 OK"));
    assert_eq!(s.served.take_summary().lines(), vec![format!("network: allowed 127.0.0.1:{port}.")]);
    // The next call's summary holds its own decisions only.
    assert!(s.served.take_summary().lines().is_empty());
    assert!(exchange(s.proxy, get(22).as_bytes()).await.starts_with("HTTP/1.1 403"));
    let lines = s.served.take_summary().lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("127.0.0.1:22") && !lines[0].contains(&format!(":{port}")), "{lines:?}");
}

/// Byte `i` of the stream [`a_bulk_transfer_to_the_client_arrives_whole_and_in_order`] sends:
/// no period of a page or a buffer, so a piece lost, doubled or moved shows.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i / 4093) as u8
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_transfer_to_the_client_arrives_whole_and_in_order() {
    // Alone: the direction toward the client must find one of the
    // process's grown pipes free, so that past GROW_AFTER it goes on by
    // copying (tunnel::copied) instead of splicing.
    if !alone("a_bulk_transfer_to_the_client_arrives_whole_and_in_order") {
        return;
    }
    const TOTAL: u64 = 8 * GROW_AFTER + 12_345;
    let (bulk, _b) = origin_doing(|mut c| async move {
        let mut hi = [0u8; 2];
        c.read_exact(&mut hi).await.unwrap();
        let mut sent = 0u64;
        while sent < TOTAL {
            let n = (TOTAL - sent).min(100_003);
            let piece: Vec<u8> = (sent..sent + n).map(pattern).collect();
            c.write_all(&piece).await.unwrap();
            sent += n;
        }
    })
    .await;
    let s = proxy(&[], &[format!("127.0.0.1:{bulk}")], &[]).await;
    let mut c = TcpStream::connect(s.proxy).await.unwrap();
    c.write_all(format!("CONNECT 127.0.0.1:{bulk} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut ok = [0u8; 39];
    c.read_exact(&mut ok).await.unwrap();
    c.write_all(b"hi").await.unwrap();
    let (mut got, mut held_seen) = (0u64, 0);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf)).await.unwrap().unwrap();
        if n == 0 {
            break;
        }
        for (k, byte) in buf[..n].iter().enumerate() {
            let i = got + k as u64;
            assert_eq!(*byte, pattern(i), "byte {i} of {TOTAL}");
        }
        got += n as u64;
        if got > 2 * GROW_AFTER && got < 6 * GROW_AFTER {
            held_seen = held_seen.max(grown_pipes());
        }
    }
    assert_eq!(got, TOTAL);
    // The direction toward the client took the bulk path (the only one
    // that moved past GROW_AFTER).
    assert_eq!(held_seen, 1);
}
