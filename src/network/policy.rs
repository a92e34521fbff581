//! The network policy's grammar and matching: what `allowedDomains`,
//! `deniedDomains` and `allowPrivate` entries mean (the trusted file's
//! reading of them is `config::network`).
//!
//! A domain entry is an exact host (`github.com`, canonical by
//! [`canonical_host`]: `GitHub.com.` is `github.com`; an IP address is
//! allowed too), a strict-subdomain wildcard (`*.github.com` matches
//! `api.github.com` and `a.b.github.com`, never `github.com`; the suffix
//! needs two labels, so `*.com` is refused), or, in `deniedDomains` only,
//! a bare `*`; each with an optional `:port` (1-65535). An `allowPrivate`
//! entry is an address, a CIDR (`10.1.2.0/24`, host bits zero) or a host
//! name, with an optional port; IPv6 in brackets when a port follows. It
//! names destinations that may be private, and is also an allow entry.
//! `localhost`-class names are refused everywhere (write the address).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::addr::{canonical_host, canonical_ip, Host, HostError};

/// Which list an entry is in (a bare `*` is for `deniedDomains` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Allowed,
    Denied,
}

/// What the host part of a domain entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// This host only.
    Exact(Host),
    /// Names strictly below this one.
    Subdomains(String),
    /// Every host (`deniedDomains` only).
    Any,
}

/// One entry of `allowedDomains` or `deniedDomains`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pattern: Pattern,
    pub port: Option<u16>,
}

/// What an `allowPrivate` entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrivateTarget {
    /// An address (a /32 or /128) or a network.
    Net(IpNet),
    /// A name, and every address it resolves to.
    Name(String),
}

/// One entry of `allowPrivate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateRule {
    pub target: PrivateTarget,
    pub port: Option<u16>,
}

/// Why an entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("is empty")]
    Empty,
    #[error("has a port that is not a number from 1 to 65535")]
    Port,
    #[error("is not a host: {0}")]
    Host(HostError),
    #[error("has a `*` that is not a leading `*.` (write `*.example.com`)")]
    Star,
    #[error("matches every name of a top-level domain (write a narrower `*.name.tld`)")]
    TooWide,
    #[error("is a bare `*`, which only deniedDomains may have (an allow-all entry is never accepted)")]
    AllowAll,
    #[error("puts a wildcard on an address")]
    WildcardAddress,
    #[error("names localhost (write the address, as `127.0.0.1:PORT` in network.allowPrivate)")]
    Localhost,
    #[error("is not an address or network: {0}")]
    Net(String),
    #[error("has host bits set (write the network, `{0}`)")]
    HostBits(IpNet),
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Pattern::Exact(Host::Ip(IpAddr::V6(ip))) if self.port.is_some() => write!(f, "[{ip}]")?,
            Pattern::Exact(h) => write!(f, "{h}")?,
            Pattern::Subdomains(s) => write!(f, "*.{s}")?,
            Pattern::Any => f.write_str("*")?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for PrivateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.target {
            PrivateTarget::Net(net) if net.prefix_len() == net.max_prefix_len() => net.addr().to_string(),
            PrivateTarget::Net(net) => net.to_string(),
            PrivateTarget::Name(n) => n.clone(),
        };
        match (self.port, &self.target) {
            (Some(p), PrivateTarget::Net(IpNet::V6(_))) => write!(f, "[{host}]:{p}"),
            (Some(p), _) => write!(f, "{host}:{p}"),
            (None, _) => f.write_str(&host),
        }
    }
}

/// `localhost`, its subdomains and the usual aliases of loopback.
pub fn is_localhost_name(name: &str) -> bool {
    matches!(name, "localhost" | "localhost.localdomain" | "ip6-localhost" | "ip6-loopback")
        || name.ends_with(".localhost")
}

/// Splits `host[:port]` (IPv6 in brackets when a port follows; a bare IPv6
/// address has no port).
fn split_port(entry: &str) -> Result<(&str, Option<u16>), EntryError> {
    let (host, port) = if entry.starts_with('[') {
        match entry.rfind("]:") {
            Some(at) => (&entry[..=at], Some(&entry[at + 2..])),
            None => (entry, None),
        }
    } else if entry.matches(':').count() == 1 {
        let (h, p) = entry.split_once(':').unwrap_or((entry, ""));
        (h, Some(p))
    } else {
        (entry, None)
    };
    let port = match port {
        None => None,
        Some(p) => Some(parse_port(p).ok_or(EntryError::Port)?),
    };
    Ok((host, port))
}

/// A port: decimal digits only, 1-65535.
pub fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u16>().ok().filter(|&n| n != 0)
}

/// An entry of `allowedDomains` (`list` = Allowed) or `deniedDomains`,
/// trimmed.
pub fn parse_rule(entry: &str, list: List) -> Result<Rule, EntryError> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err(EntryError::Empty);
    }
    let (host, port) = split_port(entry)?;
    if host == "*" {
        return match list {
            List::Denied => Ok(Rule { pattern: Pattern::Any, port }),
            List::Allowed => Err(EntryError::AllowAll),
        };
    }
    let (wild, rest) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if rest.contains('*') {
        return Err(EntryError::Star);
    }
    let canon = canonical_host(rest).map_err(EntryError::Host)?;
    if let Host::Name(n) = &canon {
        if is_localhost_name(n) || (wild && n == "localhost") {
            return Err(EntryError::Localhost);
        }
    }
    let pattern = match (wild, canon) {
        (false, h) => Pattern::Exact(h),
        (true, Host::Ip(_)) => return Err(EntryError::WildcardAddress),
        (true, Host::Name(n)) if !n.contains('.') => return Err(EntryError::TooWide),
        (true, Host::Name(n)) => Pattern::Subdomains(n),
    };
    Ok(Rule { pattern, port })
}

/// An entry of `allowPrivate`, trimmed.
pub fn parse_private(entry: &str) -> Result<PrivateRule, EntryError> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err(EntryError::Empty);
    }
    let (host, port) = split_port(entry)?;
    if host.contains('*') {
        return Err(EntryError::Star);
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if bare.contains('/') {
        let net: IpNet = bare.parse().map_err(|_| EntryError::Net(bare.to_owned()))?;
        let net = match net {
            IpNet::V6(v6) => match v6.addr().to_ipv4_mapped() {
                Some(v4) if v6.prefix_len() >= 96 => {
                    IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).map_err(|_| EntryError::Net(bare.to_owned()))?
                }
                _ => IpNet::V6(v6),
            },
            v4 => v4,
        };
        if net.trunc() != net {
            return Err(EntryError::HostBits(net.trunc()));
        }
        return Ok(PrivateRule { target: PrivateTarget::Net(net), port });
    }
    let target = match canonical_host(host).map_err(EntryError::Host)? {
        Host::Ip(ip) => PrivateTarget::Net(IpNet::from(ip)),
        Host::Name(n) if is_localhost_name(&n) => return Err(EntryError::Localhost),
        Host::Name(n) => PrivateTarget::Name(n),
    };
    Ok(PrivateRule { target, port })
}

impl Rule {
    /// Whether the rule matches a canonical host and port.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.pattern, host) {
            (Pattern::Any, _) => true,
            (Pattern::Exact(h), host) => h == host,
            (Pattern::Subdomains(suffix), Host::Name(n)) => {
                n.len() > suffix.len() + 1 && n.ends_with(suffix.as_str()) && n[..n.len() - suffix.len()].ends_with('.')
            }
            (Pattern::Subdomains(_), Host::Ip(_)) => false,
        }
    }
}

impl PrivateRule {
    fn port_ok(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether the entry names this destination as the sandbox asked for it
    /// (a name, or an address literal).
    pub fn names(&self, host: &Host, port: u16) -> bool {
        self.port_ok(port)
            && match (&self.target, host) {
                (PrivateTarget::Net(net), Host::Ip(ip)) => net.contains(&canonical_ip(*ip)),
                (PrivateTarget::Name(n), Host::Name(h)) => n == h,
                _ => false,
            }
    }

    /// Whether the entry lets `host` (as asked for) reach the resolved
    /// address `ip` on `port`: a network entry by the address, a name
    /// entry by the name.
    pub fn permits(&self, host: &Host, ip: IpAddr, port: u16) -> bool {
        self.port_ok(port)
            && match &self.target {
                PrivateTarget::Net(net) => net.contains(&canonical_ip(ip)),
                PrivateTarget::Name(n) => host.name() == Some(n.as_str()),
            }
    }
}

/// Whether the python tool gets a network at all, from `network.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No network: an empty network namespace, no proxy.
    Off,
    /// Through the host's proxy, by this policy.
    Proxy,
}

/// `network.review.yolo`: what an unmatched public destination gets when
/// the session runs in yolo mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YoloReview {
    /// Allowed without review (refusals and address checks still apply).
    Allow,
    /// Reviewed as in any other mode.
    Review,
}

/// The destinations part of the policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lists {
    pub allowed: Vec<Rule>,
    pub denied: Vec<Rule>,
    pub allow_private: Vec<PrivateRule>,
}

impl Lists {
    pub const EMPTY: Lists = Lists { allowed: Vec::new(), denied: Vec::new(), allow_private: Vec::new() };

    /// The first denied entry that matches.
    pub fn denied_by(&self, host: &Host, port: u16) -> Option<&Rule> {
        self.denied.iter().find(|r| r.matches(host, port))
    }

    /// The first allow entry (an `allowedDomains` entry, else an
    /// `allowPrivate` entry) that matches, as written in canonical form.
    pub fn allowed_by(&self, host: &Host, port: u16) -> Option<String> {
        if let Some(r) = self.allowed.iter().find(|r| r.matches(host, port)) {
            return Some(format!("network.allowedDomains \"{r}\""));
        }
        self.allow_private.iter().find(|r| r.names(host, port)).map(|r| format!("network.allowPrivate \"{r}\""))
    }

    /// The `allowPrivate` entry that lets `host` reach `ip` on `port`.
    pub fn private_permit(&self, host: &Host, ip: IpAddr, port: u16) -> Option<&PrivateRule> {
        self.allow_private.iter().find(|r| r.permits(host, ip, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        parse_rule(s, List::Allowed).unwrap()
    }
    fn h(s: &str) -> Host {
        canonical_host(s).unwrap()
    }

    #[test]
    fn entries_are_trimmed_canonical_and_print_back() {
        for (entry, shown) in [
            (" GitHub.com. ", "github.com"),
            ("*.GitHub.com", "*.github.com"),
            ("registry.npmjs.org:443", "registry.npmjs.org:443"),
            ("münchen.de:80", "xn--mnchen-3ya.de:80"),
            ("93.184.216.34", "93.184.216.34"),
            ("[2001:db8::1]:443", "[2001:db8::1]:443"),
            ("2001:db8::1", "2001:db8::1"),
            ("*.co.uk", "*.co.uk"),
        ] {
            assert_eq!(rule(entry).to_string(), shown, "{entry:?}");
        }
        assert_eq!(parse_rule("*", List::Denied).unwrap().to_string(), "*");
        assert_eq!(parse_rule(" *:22 ", List::Denied), Ok(Rule { pattern: Pattern::Any, port: Some(22) }));
    }

    #[test]
    fn malformed_entries_are_refused_each_with_its_reason() {
        let cases = [
            ("", EntryError::Empty),
            ("   ", EntryError::Empty),
            ("*", EntryError::AllowAll),
            ("*:443", EntryError::AllowAll),
            ("*.com", EntryError::TooWide),
            ("*.COM.", EntryError::TooWide),
            ("*example.com", EntryError::Star),
            ("a.*.com", EntryError::Star),
            ("*.*.com", EntryError::Star),
            ("**.com", EntryError::Star),
            ("*.1.2.3.4", EntryError::WildcardAddress),
            ("example.com:0", EntryError::Port),
            ("example.com:65536", EntryError::Port),
            ("example.com:", EntryError::Port),
            ("example.com:+80", EntryError::Port),
            ("example.com:http", EntryError::Port),
            ("[::1]:", EntryError::Port),
            ("localhost", EntryError::Localhost),
            ("LOCALHOST.:8080", EntryError::Localhost),
            ("*.localhost", EntryError::Localhost),
            ("a.localhost", EntryError::Localhost),
            ("exa mple.com", EntryError::Host(HostError::BadCharacter)),
            ("a\0b.com", EntryError::Host(HostError::Nul)),
            ("a..com", EntryError::Host(HostError::EmptyLabel)),
            ("http://example.com", EntryError::Port),
            ("[fe80::1%eth0]:80", EntryError::Host(HostError::Zone)),
        ];
        for (entry, want) in cases {
            assert_eq!(parse_rule(entry, List::Allowed), Err(want), "{entry:?}");
        }
        assert_eq!(parse_rule("*.com", List::Denied), Err(EntryError::TooWide));
    }

    #[test]
    fn wildcards_match_strict_subdomains_only_and_ports_when_given() {
        let w = rule("*.example.com");
        assert!(w.matches(&h("a.example.com"), 443));
        assert!(w.matches(&h("A.B.Example.COM."), 1));
        assert!(!w.matches(&h("example.com"), 443));
        assert!(!w.matches(&h("badexample.com"), 443));
        assert!(!w.matches(&h("example.com.evil.org"), 443));
        assert!(!w.matches(&h("1.2.3.4"), 443));
        let p = rule("example.com:443");
        assert!(p.matches(&h("example.com"), 443));
        assert!(!p.matches(&h("example.com"), 80));
        assert!(!p.matches(&h("a.example.com"), 443));
        let any22 = parse_rule("*:22", List::Denied).unwrap();
        assert!(any22.matches(&h("github.com"), 22) && any22.matches(&h("10.0.0.1"), 22));
        assert!(!any22.matches(&h("github.com"), 443));
        // An address entry matches the address in every spelling.
        assert!(rule("127.0.0.1:80").matches(&h("2130706433"), 80));
        assert!(rule("[::ffff:127.0.0.1]").matches(&h("127.1"), 9));
    }

    #[test]
    fn private_entries_are_addresses_networks_or_names_with_optional_ports() {
        let cases = [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            (" 10.1.2.0/24:5432 ", "10.1.2.0/24:5432"),
            ("10.1.2.0/24", "10.1.2.0/24"),
            ("[::1]:8080", "[::1]:8080"),
            ("fd00::/8", "fd00::/8"),
            ("[fd00::/8]:5432", "[fd00::/8]:5432"),
            ("[::ffff:10.0.0.0/104]", "10.0.0.0/8"),
            ("DB.internal:5432", "db.internal:5432"),
            ("2130706433:80", "127.0.0.1:80"),
        ];
        for (entry, shown) in cases {
            assert_eq!(parse_private(entry).map(|r| r.to_string()), Ok(shown.to_owned()), "{entry:?}");
        }
        let bad = [
            ("", EntryError::Empty),
            ("10.1.2.3/24", EntryError::HostBits("10.1.2.0/24".parse().unwrap())),
            ("10.1.2.0/33", EntryError::Net("10.1.2.0/33".into())),
            ("*.internal", EntryError::Star),
            ("localhost:8080", EntryError::Localhost),
            ("127.0.0.1:99999", EntryError::Port),
        ];
        for (entry, want) in bad {
            assert_eq!(parse_private(entry), Err(want), "{entry:?}");
        }
    }

    #[test]
    fn private_entries_name_and_permit_what_they_say() {
        let net = parse_private("10.1.2.0/24:5432").unwrap();
        assert!(net.names(&h("10.1.2.9"), 5432));
        assert!(!net.names(&h("10.1.2.9"), 5433));
        assert!(!net.names(&h("db.internal"), 5432), "a network entry names no name");
        assert!(net.permits(&h("db.internal"), "10.1.2.9".parse().unwrap(), 5432));
        assert!(!net.permits(&h("db.internal"), "10.1.3.9".parse().unwrap(), 5432));
        let name = parse_private("db.internal").unwrap();
        assert!(name.names(&h("DB.internal."), 1));
        assert!(name.permits(&h("db.internal"), "10.9.9.9".parse().unwrap(), 1));
        assert!(!name.permits(&h("other.internal"), "10.9.9.9".parse().unwrap(), 1));
        let lists = Lists { allow_private: vec![parse_private("127.0.0.1:8080").unwrap()], ..Lists::EMPTY };
        assert_eq!(lists.allowed_by(&h("127.0.0.1"), 8080).as_deref(), Some("network.allowPrivate \"127.0.0.1:8080\""));
        assert_eq!(lists.allowed_by(&h("127.0.0.1"), 8081), None);
    }

    #[test]
    fn an_empty_allowlist_allows_nothing() {
        // CVE-2025-66479 was an empty list read as "no restriction".
        for host in ["example.com", "1.1.1.1", "a.b.c"] {
            assert_eq!(Lists::EMPTY.allowed_by(&h(host), 443), None, "{host}");
            assert_eq!(Lists::EMPTY.denied_by(&h(host), 443), None, "{host}");
        }
    }
}
