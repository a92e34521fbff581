//! SOCKS5 (RFC 1928) as the proxy takes it: no authentication, `CONNECT`
//! only, to an IPv4 or IPv6 address or a domain name. The name goes
//! through the one canonical form (a NUL byte, a control byte, bytes that
//! are not UTF-8 are refused, never cut short), so that the name matched is
//! the name looked up.

use crate::network::decide::{Destination, Refusal};
use std::net::{Ipv4Addr, Ipv6Addr};

pub const VERSION: u8 = 5;
/// The method the proxy selects: no authentication.
pub const NO_AUTH: u8 = 0;
/// The answer when the client offers no method the proxy takes.
pub const NO_ACCEPTABLE: u8 = 0xff;

/// Reply codes.
pub mod reply {
    pub const SUCCEEDED: u8 = 0;
    pub const GENERAL_FAILURE: u8 = 1;
    pub const NOT_ALLOWED: u8 = 2;
    pub const NETWORK_UNREACHABLE: u8 = 3;
    pub const HOST_UNREACHABLE: u8 = 4;
    pub const CONNECTION_REFUSED: u8 = 5;
    pub const TTL_EXPIRED: u8 = 6;
    pub const COMMAND_NOT_SUPPORTED: u8 = 7;
    pub const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;
}

/// Why a SOCKS exchange is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocksError {
    #[error("not SOCKS version 5 (version byte {0})")]
    Version(u8),
    #[error("the greeting offers no methods")]
    NoMethods,
    #[error("only CONNECT is supported (command {0})")]
    Command(u8),
    #[error("the reserved byte is not zero")]
    Reserved,
    #[error("address type {0} is not supported")]
    AddressType(u8),
    #[error("the domain name is empty")]
    EmptyName,
    #[error("the domain name is not UTF-8")]
    NotUtf8,
    #[error("{0}")]
    Host(Refusal),
}

impl SocksError {
    /// The reply code the proxy answers with.
    pub fn reply_code(&self) -> u8 {
        match self {
            SocksError::Command(_) => reply::COMMAND_NOT_SUPPORTED,
            SocksError::AddressType(_) => reply::ADDRESS_TYPE_NOT_SUPPORTED,
            SocksError::Host(_) | SocksError::EmptyName | SocksError::NotUtf8 => reply::NOT_ALLOWED,
            SocksError::Version(_) | SocksError::NoMethods | SocksError::Reserved => reply::GENERAL_FAILURE,
        }
    }
}

/// The greeting (`05 n methods...`): whether it offers no authentication,
/// and its length; `None` while incomplete.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<(bool, usize)>, SocksError> {
    let Some(&version) = buf.first() else { return Ok(None) };
    if version != VERSION {
        return Err(SocksError::Version(version));
    }
    let Some(&n) = buf.get(1) else { return Ok(None) };
    if n == 0 {
        return Err(SocksError::NoMethods);
    }
    let end = 2 + n as usize;
    let Some(methods) = buf.get(2..end) else { return Ok(None) };
    Ok(Some((methods.contains(&NO_AUTH), end)))
}

/// The method selection answer.
pub fn choice(no_auth: bool) -> [u8; 2] {
    [VERSION, if no_auth { NO_AUTH } else { NO_ACCEPTABLE }]
}

/// The request (`05 01 00 atyp addr port`): its destination and length;
/// `None` while incomplete.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Destination, usize)>, SocksError> {
    let Some(head) = buf.get(..4) else {
        // Judge what has come so far.
        if let Some(&v) = buf.first() {
            if v != VERSION {
                return Err(SocksError::Version(v));
            }
        }
        if let Some(&c) = buf.get(1) {
            if c != 1 {
                return Err(SocksError::Command(c));
            }
        }
        if let Some(&r) = buf.get(2) {
            if r != 0 {
                return Err(SocksError::Reserved);
            }
        }
        return Ok(None);
    };
    let [version, command, reserved, atyp] = [head[0], head[1], head[2], head[3]];
    if version != VERSION {
        return Err(SocksError::Version(version));
    }
    if command != 1 {
        return Err(SocksError::Command(command));
    }
    if reserved != 0 {
        return Err(SocksError::Reserved);
    }
    let (host, at) = match atyp {
        1 => {
            let Some(b) = buf.get(4..8) else { return Ok(None) };
            (Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(), 8)
        }
        4 => {
            let Some(b) = buf.get(4..20) else { return Ok(None) };
            let mut octets = [0u8; 16];
            octets.copy_from_slice(b);
            (format!("[{}]", Ipv6Addr::from(octets)), 20)
        }
        3 => {
            let Some(&len) = buf.get(4) else { return Ok(None) };
            if len == 0 {
                return Err(SocksError::EmptyName);
            }
            let end = 5 + len as usize;
            let Some(name) = buf.get(5..end) else { return Ok(None) };
            let name = std::str::from_utf8(name).map_err(|_| SocksError::NotUtf8)?;
            (name.to_owned(), end)
        }
        other => return Err(SocksError::AddressType(other)),
    };
    let Some(p) = buf.get(at..at + 2) else { return Ok(None) };
    let port = u16::from_be_bytes([p[0], p[1]]);
    let dest = Destination::new(&host, port).map_err(SocksError::Host)?;
    Ok(Some((dest, at + 2)))
}

/// A reply with `code` and an unspecified bound address.
pub fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::addr::HostError;

    fn domain(name: &[u8], port: u16) -> Vec<u8> {
        let mut v = vec![5, 1, 0, 3, name.len() as u8];
        v.extend_from_slice(name);
        v.extend_from_slice(&port.to_be_bytes());
        v
    }

    #[test]
    fn the_greeting_selects_no_authentication_only() {
        assert_eq!(parse_greeting(&[5, 2, 2, 0, 9]), Ok(Some((true, 4))));
        assert_eq!(parse_greeting(&[5, 1, 2]), Ok(Some((false, 3))));
        assert_eq!(parse_greeting(&[5, 2, 0]), Ok(None));
        assert_eq!(parse_greeting(&[]), Ok(None));
        assert_eq!(parse_greeting(&[4, 1, 0]), Err(SocksError::Version(4)));
        assert_eq!(parse_greeting(&[5, 0]), Err(SocksError::NoMethods));
        assert_eq!(choice(true), [5, 0]);
        assert_eq!(choice(false), [5, 0xff]);
    }

    #[test]
    fn connect_requests_give_canonical_destinations() {
        let d = domain(b"GitHub.com", 443);
        assert_eq!(parse_request(&d), Ok(Some((Destination::new("github.com", 443).unwrap(), d.len()))));
        for cut in 0..d.len() {
            assert_eq!(parse_request(&d[..cut]), Ok(None), "{cut}");
        }
        let v4 = [5, 1, 0, 1, 127, 0, 0, 1, 0x1f, 0x90, 0xaa];
        assert_eq!(parse_request(&v4), Ok(Some((Destination::new("127.0.0.1", 8080).unwrap(), 10))));
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&[0, 80]);
        assert_eq!(parse_request(&v6).unwrap().unwrap().0.authority(), "[::1]:80");
        // A mapped address is its IPv4 address.
        let mut mapped = vec![5, 1, 0, 4];
        mapped.extend_from_slice(&Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets());
        mapped.extend_from_slice(&[0, 80]);
        assert_eq!(parse_request(&mapped).unwrap().unwrap().0.authority(), "10.0.0.1:80");
        // A numeric name is the address it spells.
        assert_eq!(parse_request(&domain(b"2130706433", 80)).unwrap().unwrap().0.authority(), "127.0.0.1:80");
    }

    #[test]
    fn a_name_with_a_nul_byte_is_refused_not_cut_short() {
        // The sandbox-runtime bug: `attacker.example\0.allowed.com` matched
        // `*.allowed.com` while getaddrinfo looked up `attacker.example`.
        let e = parse_request(&domain(b"attacker.example\0.allowed.com", 443)).unwrap_err();
        assert_eq!(e, SocksError::Host(Refusal::Malformed { error: Some(HostError::Nul) }));
        assert_eq!(e.reply_code(), reply::NOT_ALLOWED);
        assert_eq!(parse_request(&domain(b"a\xffb.com", 443)), Err(SocksError::NotUtf8));
        assert_eq!(parse_request(&domain(b"a\nb.com", 443)).unwrap_err().reply_code(), reply::NOT_ALLOWED);
        assert_eq!(parse_request(&[5, 1, 0, 3, 0, 0, 80]), Err(SocksError::EmptyName));
        assert!(matches!(parse_request(&domain(b"a.com", 0)), Err(SocksError::Host(Refusal::Malformed { .. }))));
    }

    #[test]
    fn other_commands_and_address_types_get_their_reply_codes() {
        assert_eq!(parse_request(&[5, 2, 0, 1]).unwrap_err().reply_code(), reply::COMMAND_NOT_SUPPORTED);
        assert_eq!(parse_request(&[5, 3]).unwrap_err(), SocksError::Command(3));
        assert_eq!(parse_request(&[5, 1, 0, 9]).unwrap_err().reply_code(), reply::ADDRESS_TYPE_NOT_SUPPORTED);
        assert_eq!(parse_request(&[5, 1, 1]), Err(SocksError::Reserved));
        assert_eq!(parse_request(&[4]), Err(SocksError::Version(4)));
        assert_eq!(reply(reply::NOT_ALLOWED), [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    }
}
