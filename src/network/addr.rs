//! Host names and addresses: the one canonical form of a host that the
//! policy matches and the resolver looks up, and the check that an address
//! is public.
//!
//! [`canonical_host`] is the only way from text the sandbox sent (a CONNECT
//! authority, a SOCKS name, a `Host` header, an SNI) or the user wrote (a
//! configuration entry) to a [`Host`]: a name is lowercase ASCII (IDNA
//! UTS #46 to ASCII), with one trailing dot dropped, labels of letters,
//! digits, `-` and `_`, none empty or over 63 bytes, 253 bytes in all; an
//! address is an [`IpAddr`] in its one form. Every numeric spelling that
//! the C library's `inet_aton` would read as an IPv4 address (`2130706433`,
//! `0x7f.1`, `0177.0.0.1`, `127.1`) is that address, so that a string that
//! matched as a name can never be dialled as an address; an IPv4-mapped
//! IPv6 address is its IPv4 address; an IPv6 zone (`fe80::1%eth0`) is
//! refused. Whatever is not canonical is refused with a reason.
//!
//! [`address_class`] says why an address is not public (loopback, private,
//! link-local, CGNAT, multicast, cloud metadata, reserved, one of the
//! host's own). It does not know `allowPrivate`: the decision does.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Bytes of a name (RFC 1035, without the trailing dot).
pub const MAX_NAME_BYTES: usize = 253;
/// Bytes of one label.
pub const MAX_LABEL_BYTES: usize = 63;
/// Bytes of input looked at (a Unicode name may be longer than its ASCII
/// form; nothing sensible is longer than this).
pub const MAX_INPUT_BYTES: usize = 1024;

/// A host in its canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lowercase ASCII, no trailing dot, never an address.
    Name(String),
    Ip(IpAddr),
}

impl Host {
    pub fn name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }

    /// The host as it goes in an authority: IPv6 in brackets.
    pub fn authority(&self, port: u16) -> String {
        match self {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            other => format!("{other}:{port}"),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why a host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("the host holds a NUL byte")]
    Nul,
    #[error("the host holds a control character")]
    Control,
    #[error("the host is longer than {MAX_INPUT_BYTES} bytes")]
    InputTooLong,
    #[error("the host has an empty label")]
    EmptyLabel,
    #[error("a label of the host is longer than {MAX_LABEL_BYTES} bytes")]
    LabelTooLong,
    #[error("the host is longer than {MAX_NAME_BYTES} bytes")]
    NameTooLong,
    #[error("the host is not a valid internationalised name")]
    Idna,
    #[error("the host holds a character no host name has")]
    BadCharacter,
    #[error("a label of the host starts or ends with `-`")]
    Hyphen,
    #[error("the host is a malformed numeric address")]
    BadAddress,
    #[error("the host is an IPv6 address with a zone")]
    Zone,
}

/// The canonical form of `raw` (see the module's documentation).
pub fn canonical_host(raw: &str) -> Result<Host, HostError> {
    if raw.len() > MAX_INPUT_BYTES {
        return Err(HostError::InputTooLong);
    }
    if raw.contains('\0') {
        return Err(HostError::Nul);
    }
    if raw.chars().any(char::is_control) {
        return Err(HostError::Control);
    }
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::BadAddress)?;
        return ipv6(inner);
    }
    if raw.contains(':') {
        return ipv6(raw);
    }
    let one = raw.strip_suffix('.').unwrap_or(raw);
    if one.is_empty() {
        return Err(HostError::Empty);
    }
    if one.split('.').any(str::is_empty) {
        return Err(HostError::EmptyLabel);
    }
    let ascii = if one.is_ascii() {
        one.to_ascii_lowercase()
    } else {
        let a = idna::domain_to_ascii(one).map_err(|_| HostError::Idna)?;
        // A dot-like character (U+3002 and kin) maps to `.`: the same checks again.
        if a.is_empty() || a.ends_with('.') || a.split('.').any(str::is_empty) {
            return Err(HostError::EmptyLabel);
        }
        a
    };
    if let Some(v4) = numeric_ipv4(&ascii)? {
        return Ok(Host::Ip(IpAddr::V4(v4)));
    }
    for label in ascii.split('.') {
        if label.len() > MAX_LABEL_BYTES {
            return Err(HostError::LabelTooLong);
        }
        if !label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            return Err(HostError::BadCharacter);
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostError::Hyphen);
        }
    }
    if ascii.len() > MAX_NAME_BYTES {
        return Err(HostError::NameTooLong);
    }
    if ascii.starts_with("xn--") || ascii.contains(".xn--") {
        // A punycode label must decode to what encodes back to it.
        let (unicode, r) = idna::domain_to_unicode(&ascii);
        if r.is_err() || idna::domain_to_ascii(&unicode).ok().as_deref() != Some(ascii.as_str()) {
            return Err(HostError::Idna);
        }
    }
    Ok(Host::Name(ascii))
}

fn ipv6(text: &str) -> Result<Host, HostError> {
    if text.contains('%') {
        return Err(HostError::Zone);
    }
    let ip: Ipv6Addr = text.parse().map_err(|_| HostError::BadAddress)?;
    Ok(Host::Ip(canonical_ip(IpAddr::V6(ip))))
}

/// An address in its one form: an IPv4-mapped IPv6 address is its IPv4.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The IPv4 address a name spells the way `inet_aton` reads it, when its
/// last label is a number (decimal, `0x` hex or `0` octal); a malformed one
/// is refused (the WHATWG URL standard's rule: a name ending in a number is
/// an address or nothing).
fn numeric_ipv4(name: &str) -> Result<Option<Ipv4Addr>, HostError> {
    let parts: Vec<&str> = name.split('.').collect();
    let last = parts[parts.len() - 1];
    if !looks_numeric(last) {
        return Ok(None);
    }
    if parts.len() > 4 {
        return Err(HostError::BadAddress);
    }
    let mut values = Vec::with_capacity(parts.len());
    for p in &parts {
        values.push(number(p).ok_or(HostError::BadAddress)?);
    }
    let (head, tail) = values.split_at(values.len() - 1);
    if head.iter().any(|&v| v > 255) {
        return Err(HostError::BadAddress);
    }
    let tail_bits = 8 * (5 - values.len()) as u32;
    if tail_bits < 64 && tail[0] >> tail_bits != 0 {
        return Err(HostError::BadAddress);
    }
    let mut addr: u32 = 0;
    for (i, v) in head.iter().enumerate() {
        addr |= (*v as u32) << (24 - 8 * i as u32);
    }
    addr |= tail[0] as u32;
    Ok(Some(Ipv4Addr::from(addr)))
}

fn looks_numeric(label: &str) -> bool {
    let hex = label.strip_prefix("0x").or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// One part of a numeric address, as `inet_aton` reads it.
fn number(p: &str) -> Option<u64> {
    if p.len() > 12 {
        // Longer than any 32-bit value in any base (leading zeros included:
        // refused rather than guessed).
        return None;
    }
    if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        return if h.is_empty() { Some(0) } else { u64::from_str_radix(h, 16).ok() };
    }
    if p.len() > 1 && p.starts_with('0') {
        return u64::from_str_radix(&p[1..], 8).ok();
    }
    p.parse().ok()
}

/// Why an address is not public.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Unspecified,
    Loopback,
    Private,
    LinkLocal,
    Cgnat,
    Multicast,
    Broadcast,
    Metadata,
    Reserved,
    /// One of the host's own interface addresses.
    OwnAddress,
}

impl AddressClass {
    pub fn says(self) -> &'static str {
        match self {
            AddressClass::Unspecified => "the unspecified address",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private address",
            AddressClass::LinkLocal => "a link-local address",
            AddressClass::Cgnat => "a carrier-grade NAT address",
            AddressClass::Multicast => "a multicast address",
            AddressClass::Broadcast => "the broadcast address",
            AddressClass::Metadata => "a cloud metadata address",
            AddressClass::Reserved => "a reserved address",
            AddressClass::OwnAddress => "an address of this machine",
        }
    }
}

fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len))
}

fn v6(segments: [u16; 8], len: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = segments;
    IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len))
}

/// The ranges that are not public, most specific first (metadata before
/// link-local).
fn special_ranges() -> [(IpNet, AddressClass); 28] {
    use AddressClass::*;
    [
        (v4(169, 254, 169, 254, 32), Metadata),
        (v4(100, 100, 100, 200, 32), Metadata),
        (v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128), Metadata),
        (v4(0, 0, 0, 0, 32), Unspecified),
        (v4(0, 0, 0, 0, 8), Reserved),
        (v4(10, 0, 0, 0, 8), Private),
        (v4(100, 64, 0, 0, 10), Cgnat),
        (v4(127, 0, 0, 0, 8), Loopback),
        (v4(169, 254, 0, 0, 16), LinkLocal),
        (v4(172, 16, 0, 0, 12), Private),
        (v4(192, 0, 0, 0, 24), Reserved),
        (v4(192, 0, 2, 0, 24), Reserved),
        (v4(192, 168, 0, 0, 16), Private),
        (v4(198, 18, 0, 0, 15), Reserved),
        (v4(198, 51, 100, 0, 24), Reserved),
        (v4(203, 0, 113, 0, 24), Reserved),
        (v4(224, 0, 0, 0, 4), Multicast),
        (v4(255, 255, 255, 255, 32), Broadcast),
        (v4(240, 0, 0, 0, 4), Reserved),
        (v6([0; 8], 128), Unspecified),
        (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), Loopback),
        (v6([0; 8], 96), Reserved),
        (v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), Private),
        (v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), Reserved),
        (v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), Reserved),
        (v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), Reserved),
        (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), Private),
        (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 9), LinkLocal),
    ]
}

/// Why `ip` is not public, or `None` when it is. `own` are the host's
/// interface addresses. An IPv6 address that embeds an IPv4 one (mapped,
/// NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is judged by the IPv4 address
/// too; `ff00::/8` is multicast.
pub fn address_class(ip: IpAddr, own: &[IpAddr]) -> Option<AddressClass> {
    let ip = canonical_ip(ip);
    if own.iter().any(|o| canonical_ip(*o) == ip) {
        return Some(AddressClass::OwnAddress);
    }
    if let IpAddr::V6(v6) = ip {
        let s = v6.segments();
        if s[0] & 0xff00 == 0xff00 {
            return Some(AddressClass::Multicast);
        }
        if s[0] & 0xffc0 == 0xfec0 {
            return Some(AddressClass::Reserved); // site-local, deprecated
        }
        let embedded = if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
            Some(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
        } else if s[0] == 0x2002 {
            Some(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8))
        } else {
            None
        };
        if let Some(inner) = embedded {
            if let Some(class) = address_class(IpAddr::V4(inner), own) {
                return Some(class);
            }
        }
    }
    special_ranges().into_iter().find(|(net, _)| net.contains(&ip)).map(|(_, class)| class)
}

/// The host's own interface addresses (`getifaddrs`); empty if it fails.
pub fn own_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says its size.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
            if family == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs returned, once.
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }
    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn names_are_lowercased_idna_and_lose_one_trailing_dot() {
        let cases = [
            ("Example.COM", name("example.com")),
            ("example.com.", name("example.com")),
            ("münchen.de", name("xn--mnchen-3ya.de")),
            ("MÜNCHEN.DE", name("xn--mnchen-3ya.de")),
            ("xn--mnchen-3ya.de", name("xn--mnchen-3ya.de")),
            ("a_b.example", name("a_b.example")),
            ("1.2.3.example", name("1.2.3.example")),
            ("127.0.0.1.nip.io", name("127.0.0.1.nip.io")),
            ("localhost", name("localhost")),
        ];
        for (raw, want) in cases {
            assert_eq!(canonical_host(raw), Ok(want), "{raw:?}");
        }
    }

    #[test]
    fn malformed_names_are_refused_each_with_its_reason() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}com", "abcdefghi.".repeat(26));
        let cases = [
            ("", HostError::Empty),
            (".", HostError::Empty),
            ("example.com..", HostError::EmptyLabel),
            ("a..b", HostError::EmptyLabel),
            (".a", HostError::EmptyLabel),
            ("attacker.example\0.allowed.com", HostError::Nul),
            ("a\nb.com", HostError::Control),
            ("a\u{7f}.com", HostError::Control),
            ("a\u{85}.com", HostError::Control),
            (long_label.as_str(), HostError::LabelTooLong),
            (long_name.as_str(), HostError::NameTooLong),
            ("a b.com", HostError::BadCharacter),
            ("a/b.com", HostError::BadCharacter),
            ("user@host.com", HostError::BadCharacter),
            ("*.example.com", HostError::BadCharacter),
            ("-a.com", HostError::Hyphen),
            ("a-.com", HostError::Hyphen),
            ("xn--zz.com", HostError::Idna),
            ("a\u{3002}\u{3002}b", HostError::EmptyLabel),
        ];
        for (raw, want) in cases {
            assert_eq!(canonical_host(raw), Err(want), "{raw:?}");
        }
        assert_eq!(canonical_host(&"a".repeat(MAX_INPUT_BYTES + 1)), Err(HostError::InputTooLong));
    }

    #[test]
    fn every_numeric_spelling_of_an_ipv4_address_is_that_address() {
        for raw in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0x7F.0.0.1",
            "0177.0.0.1",
            "127.1",
            "127.0.1",
            "127.0.0.1.",
            "017700000001",
        ] {
            assert_eq!(canonical_host(raw), Ok(ip("127.0.0.1")), "{raw:?}");
        }
        assert_eq!(canonical_host("0"), Ok(ip("0.0.0.0")));
        assert_eq!(canonical_host("0x"), Ok(ip("0.0.0.0")));
        assert_eq!(canonical_host("169.254.43518"), Ok(ip("169.254.169.254")));
        for bad in ["256.0.0.1", "1.2.3.4.5", "08.0.0.1", "1.2.3.256", "4294967296", "1.2.65536", "a.1"] {
            assert!(canonical_host(bad).is_err(), "{bad:?}: {:?}", canonical_host(bad));
        }
        assert_eq!(canonical_host("a.1"), Err(HostError::BadAddress));
        // A last label that is not a number: a name, as the C library reads it too.
        assert_eq!(canonical_host("0x1g"), Ok(name("0x1g")));
        assert_eq!(canonical_host("0000000000000000001"), Err(HostError::BadAddress));
    }

    #[test]
    fn ipv6_is_canonical_mapped_is_ipv4_and_zones_are_refused() {
        assert_eq!(canonical_host("[::1]"), Ok(ip("::1")));
        assert_eq!(canonical_host("[0:0:0:0:0:0:0:1]"), Ok(ip("::1")));
        assert_eq!(canonical_host("::1"), Ok(ip("::1")));
        assert_eq!(canonical_host("[::ffff:127.0.0.1]"), Ok(ip("127.0.0.1")));
        assert_eq!(canonical_host("[::FFFF:7f00:1]"), Ok(ip("127.0.0.1")));
        assert_eq!(canonical_host("[2001:DB8::1]"), Ok(ip("2001:db8::1")));
        assert_eq!(canonical_host("[fe80::1%eth0]"), Err(HostError::Zone));
        assert_eq!(canonical_host("[fe80::1%25eth0]"), Err(HostError::Zone));
        assert_eq!(canonical_host("[::1"), Err(HostError::BadAddress));
        assert_eq!(canonical_host("[example.com]"), Err(HostError::BadAddress));
        assert_eq!(canonical_host("[127.0.0.1]"), Err(HostError::BadAddress));
    }

    #[test]
    fn canonical_forms_are_fixed_points() {
        for raw in ["Example.com.", "münchen.de", "0x7f.1", "[::ffff:1.2.3.4]", "[2001:db8::1]", "a_b.c"] {
            let once = canonical_host(raw).unwrap();
            let text = match &once {
                Host::Ip(IpAddr::V6(v)) => format!("[{v}]"),
                other => other.to_string(),
            };
            assert_eq!(canonical_host(&text), Ok(once), "{raw:?}");
        }
        assert_eq!(ip("::1").authority(443), "[::1]:443");
        assert_eq!(name("a.com").authority(80), "a.com:80");
    }

    #[test]
    fn addresses_that_are_not_public_say_why() {
        use AddressClass::*;
        let cases = [
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Reserved)),
            ("10.1.2.3", Some(Private)),
            ("100.64.0.1", Some(Cgnat)),
            ("100.100.100.200", Some(Metadata)),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("169.254.169.254", Some(Metadata)),
            ("169.254.1.1", Some(LinkLocal)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("192.168.1.1", Some(Private)),
            ("224.0.0.1", Some(Multicast)),
            ("255.255.255.255", Some(Broadcast)),
            ("240.0.0.1", Some(Reserved)),
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("::ffff:10.0.0.1", Some(Private)),
            ("::7f00:1", Some(Reserved)),
            ("64:ff9b::7f00:1", Some(Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(Metadata)),
            ("2002:7f00:1::", Some(Loopback)),
            ("fd00:ec2::254", Some(Metadata)),
            ("fd12::1", Some(Private)),
            ("fe80::1", Some(LinkLocal)),
            ("fec0::1", Some(Reserved)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Reserved)),
            ("1.1.1.1", None),
            ("172.32.0.1", None),
            ("100.128.0.1", None),
            ("2606:4700::1111", None),
            ("64:ff9b::101:101", None),
            ("2002:101:101::", None),
        ];
        for (text, want) in cases {
            assert_eq!(address_class(text.parse().unwrap(), &[]), want, "{text}");
        }
        let own: IpAddr = "203.0.114.7".parse().unwrap();
        assert_eq!(address_class(own, &[own]), Some(OwnAddress));
        assert_eq!(address_class("203.0.114.8".parse().unwrap(), &[own]), None);
        assert!(special_ranges().iter().all(|(_, c)| !c.says().is_empty()));
    }

    #[test]
    fn own_addresses_include_loopback() {
        let own = own_addresses();
        assert!(own.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{own:?}");
    }
}
