//! The first bytes of a connection to the proxy, told apart by the first
//! byte: SOCKS5 (`0x05`), else HTTP (a request line starts with an
//! uppercase method). Each parser is given what has arrived so far and
//! answers "more", a result and the bytes it took, or a refusal; none
//! reads past its bound ([`MAX_HEAD_BYTES`], `tls::MAX_HELLO_BYTES`).

pub mod http;
pub mod socks;
pub mod tls;

/// Bytes of an HTTP head or a SOCKS exchange before it is refused.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Socks5,
}

/// The protocol a first byte starts; `None`: neither (closed).
pub fn sniff(first: u8) -> Option<Protocol> {
    match first {
        socks::VERSION => Some(Protocol::Socks5),
        b'A'..=b'Z' => Some(Protocol::Http),
        _ => None,
    }
}

/// Splits `host[:port]`: IPv6 in brackets (kept, for the canonical form to
/// read); a port of decimal digits, 1-65535. `None`: malformed.
pub fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if authority.starts_with('[') {
        let close = authority.find(']')?;
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) if !p.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => Some(super::policy::parse_port(p)?),
        None => None,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_byte_tells_the_protocol() {
        assert_eq!(sniff(5), Some(Protocol::Socks5));
        for b in *b"CGPHDO" {
            assert_eq!(sniff(b), Some(Protocol::Http));
        }
        for b in [0u8, 4, 22, b'g', b' ', 0xff] {
            assert_eq!(sniff(b), None, "{b}");
        }
    }

    #[test]
    fn authorities_split_with_bracketed_ipv6_and_strict_ports() {
        assert_eq!(split_authority("a.com:443"), Some(("a.com", Some(443))));
        assert_eq!(split_authority("a.com"), Some(("a.com", None)));
        assert_eq!(split_authority("[::1]:80"), Some(("[::1]", Some(80))));
        assert_eq!(split_authority("[::1]"), Some(("[::1]", None)));
        for bad in ["a.com:", "a.com:0", "a.com:65536", "a.com:+1", "::1", "[::1]x", "[::1", "a:1:2", "a.com: 80"] {
            assert_eq!(split_authority(bad), None, "{bad}");
        }
    }
}
