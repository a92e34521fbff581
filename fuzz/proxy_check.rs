//! The properties of the proxy's parsers (`network::wire`: HTTP, SOCKS5,
//! the TLS ClientHello) and of the one canonical host form
//! (`network::addr::canonical_host`), on arbitrary bytes a sandbox sends.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/proxy.rs`) and the
//! stable replay test (`tests/proxy_fuzz.rs`). Properties: no panic; a
//! parser never claims more bytes than it was given nor more than its
//! bound; a complete result is the same on the exact prefix it took and
//! "more" on every shorter prefix (the result does not depend on how the
//! bytes arrive); every destination is canonical (a fixed point of
//! `canonical_host`, no NUL or control byte, a port from 1); a rebuilt
//! plain-HTTP head parses again as origin-form with a `Host` equal to its
//! destination and no hop-by-hop header.

use pi_python_sandbox::network::addr::{canonical_host, Host};
use pi_python_sandbox::network::decide::Destination;
use pi_python_sandbox::network::wire::{http, sniff, socks, tls, MAX_HEAD_BYTES};

/// Check every property on one input.
pub fn check(data: &[u8]) {
    let _ = sniff(data.first().copied().unwrap_or(0));
    check_host_text(data);
    check_http(data);
    check_socks(data);
    check_tls(data);
}

fn check_destination(d: &Destination) {
    assert!(d.port != 0, "port 0 accepted");
    let text = match &d.host {
        Host::Name(n) => {
            assert!(n.bytes().all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase()), "name {n:?}");
            n.clone()
        }
        Host::Ip(std::net::IpAddr::V6(ip)) => {
            assert!(ip.to_ipv4_mapped().is_none(), "a mapped address kept as IPv6: {ip}");
            format!("[{ip}]")
        }
        Host::Ip(ip) => ip.to_string(),
    };
    assert_eq!(canonical_host(&text).as_ref(), Ok(&d.host), "not a fixed point: {text:?}");
}

fn check_host_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(host) = canonical_host(text) {
        assert!(!text.contains('\0'), "a NUL byte accepted");
        check_destination(&Destination { host, port: 1 });
    }
}

/// The same on the exact prefix, "more" on shorter ones (a few cuts).
fn cuts(n: usize) -> impl Iterator<Item = usize> {
    [0, 1, n / 2, n.saturating_sub(1)].into_iter().filter(move |&k| k < n)
}

fn check_http(data: &[u8]) {
    let Ok(Some((req, n))) = http::parse_request(data) else { return };
    assert!(n <= data.len() && n <= MAX_HEAD_BYTES, "head of {n} bytes");
    assert_eq!(http::parse_request(&data[..n]).ok().flatten(), Some((req.clone(), n)));
    for k in cuts(n) {
        assert_eq!(http::parse_request(&data[..k]), Ok(None), "a prefix of {k} bytes of a complete head");
    }
    match req {
        http::Request::Connect(d) => check_destination(&d),
        http::Request::Forward(f) => {
            check_destination(&f.dest);
            check_rebuilt(&f);
        }
    }
}

fn check_rebuilt(f: &http::Forward) {
    let mut headers = [httparse::EMPTY_HEADER; http::MAX_HEADERS + 2];
    let mut req = httparse::Request::new(&mut headers);
    let done = req.parse(&f.head).expect("the rebuilt head parses");
    assert_eq!(done, httparse::Status::Complete(f.head.len()), "the rebuilt head is one whole head");
    assert!(req.path.is_some_and(|p| p.starts_with('/')), "origin-form");
    let mut hosts = 0;
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        assert!(!name.starts_with("proxy-"), "{name} forwarded");
        assert!(!["keep-alive", "te", "trailer"].contains(&name.as_str()), "{name} forwarded");
        if name == "upgrade" {
            assert!(f.upgrade, "Upgrade forwarded without an upgrade");
        }
        if name == "host" {
            hosts += 1;
            let value = std::str::from_utf8(h.value).expect("utf-8 host");
            let want = if f.dest.port == 80 {
                f.dest.authority().strip_suffix(":80").map(str::to_owned).unwrap_or_default()
            } else {
                f.dest.authority()
            };
            assert_eq!(value, want, "Host is not the destination");
        }
    }
    assert_eq!(hosts, 1, "one Host header");
}

fn check_socks(data: &[u8]) {
    if let Ok(Some((_, n))) = socks::parse_greeting(data) {
        assert!(n <= data.len() && n <= 257);
        for k in cuts(n) {
            assert_eq!(socks::parse_greeting(&data[..k]), Ok(None));
        }
    }
    let Ok(Some((dest, n))) = socks::parse_request(data) else { return };
    assert!(n <= data.len() && n <= 262, "request of {n} bytes");
    check_destination(&dest);
    for k in cuts(n) {
        assert_eq!(socks::parse_request(&data[..k]), Ok(None), "a prefix of {k} bytes");
    }
    assert_eq!(socks::parse_request(&data[..n]), Ok(Some((dest, n))));
}

fn check_tls(data: &[u8]) {
    match tls::parse_client_hello(data) {
        Ok(Some(hello)) => {
            if let Some(sni) = &hello.sni {
                assert_eq!(canonical_host(sni), Ok(Host::Name(sni.clone())), "the server name is not canonical");
            }
        }
        Ok(None) => assert!(data.len() < tls::MAX_HELLO_INPUT, "waited for more past the bound"),
        Err(_) => {}
    }
}
