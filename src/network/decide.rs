//! A connection's decision: the policy's steps in order, for one canonical
//! destination, ending in the checked addresses to dial or a refusal that
//! names its rule and the line that would allow it.
//!
//! 1. built-in refusals: a `localhost`-class name; an IP address no allow
//!    entry names (addresses are never reviewed);
//! 2. `deniedDomains`: refused, naming the entry;
//! 3. an allow entry (`allowedDomains`, `allowPrivate`) or a grant: go on;
//! 4. yolo (unless `review.yolo` is `"review"`), else the [`Reviewer`],
//!    **before** any lookup;
//! 5. one lookup through the [`Resolver`]; every address must be public
//!    or named by `allowPrivate`; the addresses checked are the ones to
//!    dial (no second lookup).
//!
//! The resolver and the reviewer are parameters (the system's resolver in
//! use, fakes in tests), and so are the host's own addresses. Parsing the
//! destination (and refusing a malformed one) is the wire's; dialling is
//! the server's.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::addr::{address_class, canonical_host, AddressClass, Host, HostError};
use super::policy::{is_localhost_name, Lists, YoloReview};

/// How long one lookup may take.
pub const LOOKUP_DEADLINE: Duration = Duration::from_secs(10);
/// Addresses of one lookup that are checked and kept.
pub const MAX_ADDRESSES: usize = 16;

/// Where a connection goes: a canonical host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    pub host: Host,
    pub port: u16,
}

impl Destination {
    /// From the text of a host (canonicalised here) and a port.
    pub fn new(host: &str, port: u16) -> Result<Destination, Refusal> {
        if port == 0 {
            return Err(Refusal::Malformed { error: None });
        }
        let host = canonical_host(host).map_err(|e| Refusal::Malformed { error: Some(e) })?;
        Ok(Destination { host, port })
    }

    /// `host:port`, IPv6 in brackets.
    pub fn authority(&self) -> String {
        self.host.authority(self.port)
    }
}

/// What the review answered for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    Allowed,
    Denied,
    /// No one can review (no UI, no reviewer).
    Unavailable,
    /// The dialog was dismissed, timed out or aborted, or too many were
    /// open.
    Cancelled,
}

/// Looks a name up: the system's `getaddrinfo` in use, a fake in tests.
pub trait Resolver {
    fn resolve(&self, name: &str, port: u16) -> impl Future<Output = io::Result<Vec<IpAddr>>> + Send;
}

/// Asks whether a destination may be reached (the dialog or the bus).
pub trait Reviewer {
    /// A grant of this command or session covers the destination.
    fn granted(&self, _dest: &Destination) -> bool {
        false
    }
    /// The reviewer's session is in yolo mode now (a reviewer that serves
    /// many calls, as the python tool's, learns the mode at each call).
    fn yolo(&self) -> bool {
        false
    }
    fn review(&self, dest: &Destination) -> impl Future<Output = Review> + Send;
}

/// The system's resolver: `getaddrinfo` on tokio's blocking pool.
pub struct SystemResolver;

impl Resolver for SystemResolver {
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        let found = tokio::net::lookup_host((name, port)).await?;
        Ok(found.map(|a| a.ip()).take(MAX_ADDRESSES).collect())
    }
}

/// What the decision knows besides the destination.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub lists: &'a Lists,
    /// The host's own interface addresses.
    pub own: &'a [IpAddr],
    /// A grant of this command or session covers the destination.
    pub granted: bool,
    /// The session runs in yolo mode.
    pub yolo: bool,
    pub yolo_review: YoloReview,
}

/// Why a connection went on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Because {
    /// An allow entry, as the configuration line that names it.
    Entry(String),
    Grant,
    Reviewed,
    Yolo,
}

/// A connection that may go on: the addresses checked, to dial in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dial {
    pub addrs: Vec<SocketAddr>,
    pub because: Because,
}

/// Why a connection is refused. Each says which rule and how to allow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("refused: the destination is malformed{}", .error.map(|e| format!(" ({e})")).unwrap_or_default())]
    Malformed { error: Option<HostError> },
    #[error(
        "refused: `{host}` is a localhost name, never reached through the proxy; to reach a service of this \
         machine, add \"127.0.0.1:PORT\" to network.allowPrivate"
    )]
    Localhost { host: String },
    #[error(
        "refused: {} is an IP address that no allow entry names (addresses are never reviewed); to allow \
         it, add \"{}\" to network.allowedDomains (a public address) or network.allowPrivate (a private one)",
        .dest.authority(), .dest.authority()
    )]
    Literal { dest: Destination },
    #[error("refused by network.deniedDomains \"{entry}\" ({}); to allow it, remove that entry", .dest.authority())]
    Denied { dest: Destination, entry: String },
    #[error(
        "refused: {} matches no network.allowedDomains entry and no one can review it; to allow it, add \"{}\" \
         to network.allowedDomains",
        .dest.authority(), .dest.authority()
    )]
    NoReviewer { dest: Destination },
    #[error("refused at review: {}", .dest.authority())]
    DeniedAtReview { dest: Destination },
    #[error("refused: the review of {} was cancelled or timed out", .dest.authority())]
    ReviewCancelled { dest: Destination },
    #[error("refused: {} could not be resolved ({detail})", .dest.host)]
    Lookup { dest: Destination, detail: String },
    #[error(
        "refused: {} resolves to {ip}, {}; to allow it, add \"{}\" to network.allowPrivate",
        .dest.host, .class.says(), Host::Ip(*.ip).authority(.dest.port)
    )]
    NotPublic { dest: Destination, ip: IpAddr, class: AddressClass },
}

impl Refusal {
    /// The configuration entry that would allow the connection, when one
    /// would (for the command's network summary).
    pub fn allow_line(&self) -> Option<String> {
        match self {
            Refusal::Literal { dest } => Some(format!("network.allowedDomains \"{}\"", dest.authority())),
            Refusal::NoReviewer { dest } | Refusal::DeniedAtReview { dest } | Refusal::ReviewCancelled { dest } => {
                Some(format!("network.allowedDomains \"{}\"", dest.authority()))
            }
            Refusal::NotPublic { dest, ip, .. } => {
                Some(format!("network.allowPrivate \"{}\"", Host::Ip(*ip).authority(dest.port)))
            }
            Refusal::Malformed { .. } | Refusal::Localhost { .. } | Refusal::Denied { .. } | Refusal::Lookup { .. } => {
                None
            }
        }
    }
}

/// Steps 1-4 without the reviewer: refused, allowed (and why), or to be
/// reviewed. Pure.
pub fn gate(dest: &Destination, ctx: &Context<'_>) -> Result<Option<Because>, Refusal> {
    let allowed = ctx.lists.allowed_by(&dest.host, dest.port);
    match &dest.host {
        Host::Name(n) if is_localhost_name(n) => return Err(Refusal::Localhost { host: n.clone() }),
        Host::Ip(_) if allowed.is_none() => return Err(Refusal::Literal { dest: dest.clone() }),
        _ => {}
    }
    if let Some(rule) = ctx.lists.denied_by(&dest.host, dest.port) {
        return Err(Refusal::Denied { dest: dest.clone(), entry: rule.to_string() });
    }
    if let Some(entry) = allowed {
        return Ok(Some(Because::Entry(entry)));
    }
    if ctx.granted {
        return Ok(Some(Because::Grant));
    }
    if ctx.yolo && ctx.yolo_review == YoloReview::Allow {
        return Ok(Some(Because::Yolo));
    }
    Ok(None)
}

/// Step 5 on the addresses a lookup gave (or the literal): each public or
/// permitted by `allowPrivate`, else the connection is refused.
pub fn check_addresses(dest: &Destination, found: &[IpAddr], ctx: &Context<'_>) -> Result<Vec<SocketAddr>, Refusal> {
    if found.is_empty() {
        return Err(Refusal::Lookup { dest: dest.clone(), detail: "no address".into() });
    }
    let mut out = Vec::new();
    for ip in found.iter().take(MAX_ADDRESSES) {
        let ip = super::addr::canonical_ip(*ip);
        if let Some(class) = address_class(ip, ctx.own) {
            if ctx.lists.private_permit(&dest.host, ip, dest.port).is_none() {
                return Err(Refusal::NotPublic { dest: dest.clone(), ip, class });
            }
        }
        let addr = SocketAddr::new(ip, dest.port);
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    Ok(out)
}

/// The whole decision for one connection.
pub async fn decide<R: Resolver, V: Reviewer>(
    dest: &Destination,
    ctx: &Context<'_>,
    resolver: &R,
    reviewer: &V,
) -> Result<Dial, Refusal> {
    let because = match gate(dest, ctx)? {
        Some(b) => b,
        None => match reviewer.review(dest).await {
            Review::Allowed => Because::Reviewed,
            Review::Denied => return Err(Refusal::DeniedAtReview { dest: dest.clone() }),
            Review::Unavailable => return Err(Refusal::NoReviewer { dest: dest.clone() }),
            Review::Cancelled => return Err(Refusal::ReviewCancelled { dest: dest.clone() }),
        },
    };
    let found = match &dest.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => match tokio::time::timeout(LOOKUP_DEADLINE, resolver.resolve(name, dest.port)).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return Err(Refusal::Lookup { dest: dest.clone(), detail: e.to_string() }),
            Err(_) => return Err(Refusal::Lookup { dest: dest.clone(), detail: "the lookup timed out".into() }),
        },
    };
    let addrs = check_addresses(dest, &found, ctx)?;
    Ok(Dial { addrs, because })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::policy::{parse_private, parse_rule, List};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Answers from a table; counts and records every lookup.
    #[derive(Default)]
    struct FakeResolver {
        answers: HashMap<String, Vec<IpAddr>>,
        asked: Mutex<Vec<String>>,
    }

    impl FakeResolver {
        fn with(pairs: &[(&str, &[&str])]) -> FakeResolver {
            let answers = pairs
                .iter()
                .map(|(n, ips)| (n.to_string(), ips.iter().map(|i| i.parse().unwrap()).collect()))
                .collect();
            FakeResolver { answers, asked: Mutex::new(Vec::new()) }
        }
        fn asked(&self) -> Vec<String> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl Resolver for FakeResolver {
        async fn resolve(&self, name: &str, _port: u16) -> io::Result<Vec<IpAddr>> {
            self.asked.lock().unwrap().push(name.to_owned());
            self.answers.get(name).cloned().ok_or_else(|| io::Error::other("no such name"))
        }
    }

    struct FakeReviewer {
        answer: Review,
        count: AtomicUsize,
    }

    impl FakeReviewer {
        fn new(answer: Review) -> FakeReviewer {
            FakeReviewer { answer, count: AtomicUsize::new(0) }
        }
        fn count(&self) -> usize {
            self.count.load(Ordering::SeqCst)
        }
    }

    impl Reviewer for FakeReviewer {
        async fn review(&self, _dest: &Destination) -> Review {
            self.count.fetch_add(1, Ordering::SeqCst);
            self.answer
        }
    }

    fn lists(allowed: &[&str], denied: &[&str], private: &[&str]) -> Lists {
        Lists {
            allowed: allowed.iter().map(|e| parse_rule(e, List::Allowed).unwrap()).collect(),
            denied: denied.iter().map(|e| parse_rule(e, List::Denied).unwrap()).collect(),
            allow_private: private.iter().map(|e| parse_private(e).unwrap()).collect(),
        }
    }

    fn ctx(lists: &Lists) -> Context<'_> {
        Context { lists, own: &[], granted: false, yolo: false, yolo_review: YoloReview::Allow }
    }

    fn dest(host: &str, port: u16) -> Destination {
        Destination::new(host, port).unwrap()
    }

    async fn run(l: &Lists, d: &Destination, r: &FakeResolver, v: &FakeReviewer) -> Result<Dial, Refusal> {
        decide(d, &ctx(l), r, v).await
    }

    const PUBLIC: &str = "93.184.216.34";

    #[tokio::test]
    async fn an_allowed_name_resolves_once_and_dials_the_checked_address() {
        let l = lists(&["github.com", "*.github.com"], &["uploads.github.com", "*:22"], &[]);
        let r = FakeResolver::with(&[("api.github.com", &[PUBLIC, "2606:4700::1"])]);
        let v = FakeReviewer::new(Review::Denied);
        let dial = run(&l, &dest("API.GitHub.com.", 443), &r, &v).await.unwrap();
        assert_eq!(dial.because, Because::Entry("network.allowedDomains \"*.github.com\"".into()));
        assert_eq!(dial.addrs, vec![format!("{PUBLIC}:443").parse().unwrap(), "[2606:4700::1]:443".parse().unwrap()]);
        assert_eq!((r.asked(), v.count()), (vec!["api.github.com".to_string()], 0));
    }

    #[tokio::test]
    async fn denied_wins_and_names_its_entry_with_no_lookup() {
        let l = lists(&["*.github.com"], &["uploads.github.com", "*:22"], &["10.0.0.5"]);
        let r = FakeResolver::with(&[("uploads.github.com", &[PUBLIC])]);
        let v = FakeReviewer::new(Review::Allowed);
        let e = run(&l, &dest("uploads.github.com", 443), &r, &v).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "refused by network.deniedDomains \"uploads.github.com\" (uploads.github.com:443); to allow it, remove that entry"
        );
        let e = run(&l, &dest("api.github.com", 22), &r, &v).await.unwrap_err();
        assert!(matches!(&e, Refusal::Denied { entry, .. } if entry == "*:22"), "{e}");
        let e = run(&l, &dest("10.0.0.5", 22), &r, &v).await.unwrap_err();
        assert!(
            matches!(&e, Refusal::Denied { entry, .. } if entry == "*:22"),
            "allowPrivate does not beat a denial: {e}"
        );
        assert!(r.asked().is_empty() && v.count() == 0);
    }

    #[tokio::test]
    async fn an_unmatched_name_is_reviewed_before_any_lookup() {
        let l = lists(&[], &[], &[]);
        let r = FakeResolver::with(&[("example.org", &[PUBLIC])]);
        for (answer, want_lookup) in
            [(Review::Denied, false), (Review::Unavailable, false), (Review::Cancelled, false), (Review::Allowed, true)]
        {
            let r = FakeResolver::with(&[("example.org", &[PUBLIC])]);
            let v = FakeReviewer::new(answer);
            let got = run(&l, &dest("example.org", 443), &r, &v).await;
            assert_eq!(v.count(), 1);
            assert_eq!(!r.asked().is_empty(), want_lookup, "{answer:?}: {:?}", r.asked());
            match answer {
                Review::Denied => assert_eq!(got.unwrap_err().to_string(), "refused at review: example.org:443"),
                Review::Unavailable => assert_eq!(
                    got.unwrap_err().to_string(),
                    "refused: example.org:443 matches no network.allowedDomains entry and no one can review it; to allow it, add \"example.org:443\" to network.allowedDomains"
                ),
                Review::Cancelled => {
                    assert_eq!(got.unwrap_err().to_string(), "refused: the review of example.org:443 was cancelled or timed out")
                }
                Review::Allowed => assert_eq!(got.unwrap().because, Because::Reviewed),
            }
        }
        // A grant, or yolo, skips the review; yolo with review.yolo "review" does not.
        let v = FakeReviewer::new(Review::Denied);
        let mut c = ctx(&l);
        c.granted = true;
        assert_eq!(decide(&dest("example.org", 443), &c, &r, &v).await.unwrap().because, Because::Grant);
        let mut c = ctx(&l);
        c.yolo = true;
        assert_eq!(decide(&dest("example.org", 443), &c, &r, &v).await.unwrap().because, Because::Yolo);
        c.yolo_review = YoloReview::Review;
        assert!(matches!(decide(&dest("example.org", 443), &c, &r, &v).await, Err(Refusal::DeniedAtReview { .. })));
        assert_eq!(v.count(), 1);
    }

    #[tokio::test]
    async fn an_empty_allowlist_never_allows_all() {
        // CVE-2025-66479: `allowedDomains: []` gave no restriction at all.
        let l = lists(&[], &[], &[]);
        let r = FakeResolver::with(&[("example.org", &[PUBLIC])]);
        let v = FakeReviewer::new(Review::Unavailable);
        for host in ["example.org", PUBLIC, "127.0.0.1", "[::1]"] {
            let got = run(&l, &dest(host, 443), &r, &v).await;
            assert!(got.is_err(), "{host}: {got:?}");
        }
        assert!(r.asked().is_empty());
    }

    #[tokio::test]
    async fn ip_literals_are_never_reviewed_and_need_an_allow_entry() {
        let l = lists(&[PUBLIC], &[], &["127.0.0.1:8080"]);
        let r = FakeResolver::default();
        let v = FakeReviewer::new(Review::Allowed);
        for host in ["2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]", "127.0.0.1"] {
            let dial = run(&l, &dest(host, 8080), &r, &v).await.unwrap();
            assert_eq!(dial.addrs, vec!["127.0.0.1:8080".parse().unwrap()], "{host}");
            let e = run(&l, &dest(host, 8081), &r, &v).await.unwrap_err();
            assert!(matches!(e, Refusal::Literal { .. }), "{host}: {e}");
        }
        assert!(run(&l, &dest(PUBLIC, 443), &r, &v).await.is_ok());
        let e = run(&l, &dest("1.1.1.1", 443), &r, &v).await.unwrap_err();
        assert_eq!(e.allow_line().as_deref(), Some("network.allowedDomains \"1.1.1.1:443\""));
        assert_eq!((v.count(), r.asked().len()), (0, 0));
        // An allowedDomains entry naming a private address is not enough.
        let l = lists(&["10.0.0.1"], &[], &[]);
        let e = run(&l, &dest("10.0.0.1", 80), &r, &v).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "refused: 10.0.0.1 resolves to 10.0.0.1, a private address; to allow it, add \"10.0.0.1:80\" to network.allowPrivate"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_private_address_is_refused_unless_allow_private_names_it() {
        let l = lists(&["*.example.com"], &[], &[]);
        let v = FakeReviewer::new(Review::Allowed);
        let cases: [(&str, &[&str], AddressClass); 5] = [
            ("a.example.com", &["127.0.0.1"], AddressClass::Loopback),
            ("b.example.com", &[PUBLIC, "10.1.2.3"], AddressClass::Private),
            ("c.example.com", &["169.254.169.254"], AddressClass::Metadata),
            ("d.example.com", &["::ffff:192.168.0.1"], AddressClass::Private),
            ("e.example.com", &["100.64.1.1"], AddressClass::Cgnat),
        ];
        for (name, ips, class) in cases {
            let r = FakeResolver::with(&[(name, ips)]);
            let e = run(&l, &dest(name, 443), &r, &v).await.unwrap_err();
            assert!(matches!(&e, Refusal::NotPublic { class: c, .. } if *c == class), "{name}: {e}");
        }
        // The host's own address is refused like loopback.
        let own: Vec<IpAddr> = vec!["203.0.114.7".parse().unwrap()];
        let r = FakeResolver::with(&[("own.example.com", &["203.0.114.7"])]);
        let c = Context { own: &own, ..ctx(&l) };
        let e = decide(&dest("own.example.com", 443), &c, &r, &v).await.unwrap_err();
        assert!(matches!(e, Refusal::NotPublic { class: AddressClass::OwnAddress, .. }), "{e}");
        // allowPrivate by network (and port), or by name.
        let l = lists(&["*.example.com"], &[], &["10.1.2.0/24:5432", "db.internal"]);
        let r = FakeResolver::with(&[("b.example.com", &["10.1.2.3"]), ("db.internal", &["10.9.9.9"])]);
        assert!(run(&l, &dest("b.example.com", 5432), &r, &v).await.is_ok());
        assert!(run(&l, &dest("b.example.com", 443), &r, &v).await.is_err());
        let dial = run(&l, &dest("db.internal", 5432), &r, &v).await.unwrap();
        assert_eq!(dial.because, Because::Entry("network.allowPrivate \"db.internal\"".into()));
    }

    #[tokio::test]
    async fn localhost_names_and_failed_lookups_are_refused() {
        let l = lists(&[], &[], &["127.0.0.1"]);
        let r = FakeResolver::default();
        let v = FakeReviewer::new(Review::Allowed);
        for host in ["localhost", "LOCALHOST.", "a.localhost", "ip6-localhost"] {
            let e = run(&l, &dest(host, 80), &r, &v).await.unwrap_err();
            assert!(matches!(e, Refusal::Localhost { .. }), "{host}: {e}");
        }
        let e = run(&l, &dest("nowhere.example", 80), &r, &v).await.unwrap_err();
        assert_eq!(e.to_string(), "refused: nowhere.example could not be resolved (no such name)");
        assert_eq!(Destination::new("a\0b.com", 80), Err(Refusal::Malformed { error: Some(HostError::Nul) }));
        assert_eq!(Destination::new("a.com", 0), Err(Refusal::Malformed { error: None }));
        let r = FakeResolver::with(&[("empty.example", &[])]);
        assert!(matches!(run(&l, &dest("empty.example", 80), &r, &v).await, Err(Refusal::Lookup { .. })));
    }

    #[tokio::test]
    async fn a_rebinding_answer_cannot_slip_a_private_address_in() {
        // One lookup, every address checked: a public first answer with a
        // private second is refused whole, and the dial list is what was checked.
        let l = lists(&["rebind.example"], &[], &[]);
        let r = FakeResolver::with(&[("rebind.example", &[PUBLIC, "127.0.0.1"])]);
        let v = FakeReviewer::new(Review::Allowed);
        assert!(matches!(run(&l, &dest("rebind.example", 80), &r, &v).await, Err(Refusal::NotPublic { .. })));
        assert_eq!(r.asked().len(), 1);
        let many: Vec<String> = (0..40).map(|i| format!("93.184.216.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let r = FakeResolver::with(&[("rebind.example", &many)]);
        assert_eq!(run(&l, &dest("rebind.example", 80), &r, &v).await.unwrap().addrs.len(), MAX_ADDRESSES);
    }
}
