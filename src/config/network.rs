//! The `network` part of the trusted file: the proxy's mode, its lists
//! (grammar in `network::policy`), the python tool's network, and yolo's
//! review.
//!
//! ```json
//! { "network": {
//!     "mode": "proxy",
//!     "allowedDomains": ["github.com", "*.github.com", "registry.npmjs.org:443"],
//!     "deniedDomains": ["uploads.github.com", "*:22"],
//!     "allowPrivate": ["127.0.0.1:8080", "10.1.2.0/24:5432"],
//!     "python": false,
//!     "review": { "yolo": "allow" } } }
//! ```
//!
//! Every key is optional; the defaults are `mode: "proxy"`, empty lists
//! (every public destination reviewed, never "allow all"), `python: false`
//! and `review.yolo: "allow"`. Any error in the part turns the network off
//! for every sandbox ([`NetworkConfig::off`]), with the error as the
//! reason; entries are trimmed and deduplicated.

use serde::Deserialize;

use super::node::Node;
use super::parse::{list, section};
use super::ConfigError;
use crate::network::policy::{parse_private, parse_rule, List, Lists, Mode, YoloReview};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NetworkSection {
    mode: Option<Node>,
    allowed_domains: Option<Node>,
    denied_domains: Option<Node>,
    allow_private: Option<Node>,
    python: Option<Node>,
    review: Option<Node>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewSection {
    yolo: Option<Node>,
}

/// What the trusted file says about the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub mode: Mode,
    pub lists: Lists,
    /// The python tool gets the same proxy (its default: no network).
    pub python: bool,
    pub review_yolo: YoloReview,
    /// Why the network is off when an error turned it off (the error's
    /// text, to show in every sandbox's result).
    pub off_because: Option<String>,
}

impl NetworkConfig {
    pub const DEFAULT: NetworkConfig = NetworkConfig {
        mode: Mode::Proxy,
        lists: Lists::EMPTY,
        python: false,
        review_yolo: YoloReview::Allow,
        off_because: None,
    };

    /// The network off for every sandbox, because of `reason`.
    pub fn off(reason: String) -> NetworkConfig {
        NetworkConfig { mode: Mode::Off, off_because: Some(reason), ..NetworkConfig::DEFAULT }
    }
}

const MODES: &[&str] = &["off", "proxy"];
const YOLO: &[&str] = &["allow", "review"];

/// One of `choices` at `key`.
fn word(key: &str, node: Node, choices: &'static [&'static str]) -> Result<&'static str, ConfigError> {
    let Node::String(s) = node else {
        return Err(ConfigError::WrongType { key: key.to_owned(), expected: "a string", found: node.kind() });
    };
    choices.iter().copied().find(|c| *c == s).ok_or(ConfigError::NotAChoice { key: key.to_owned(), found: s, choices })
}

/// The `network` part.
pub fn network(node: Node) -> Result<NetworkConfig, ConfigError> {
    let s: NetworkSection = section("network", node)?;
    let mut c = NetworkConfig::DEFAULT;
    if let Some(node) = s.mode {
        c.mode = match word("network.mode", node, MODES)? {
            "off" => Mode::Off,
            _ => Mode::Proxy,
        };
    }
    let entry = |key: String, e: &str, problem| ConfigError::Entry { key, entry: e.trim().to_owned(), problem };
    if let Some(node) = s.allowed_domains {
        c.lists.allowed =
            list("network.allowedDomains", node, |key, e| parse_rule(e, List::Allowed).map_err(|p| entry(key, e, p)))?;
    }
    if let Some(node) = s.denied_domains {
        c.lists.denied =
            list("network.deniedDomains", node, |key, e| parse_rule(e, List::Denied).map_err(|p| entry(key, e, p)))?;
    }
    if let Some(node) = s.allow_private {
        c.lists.allow_private =
            list("network.allowPrivate", node, |key, e| parse_private(e).map_err(|p| entry(key, e, p)))?;
    }
    if let Some(node) = s.python {
        let Node::Bool(b) = node else {
            return Err(ConfigError::WrongType {
                key: "network.python".into(),
                expected: "a boolean",
                found: node.kind(),
            });
        };
        c.python = b;
    }
    if let Some(node) = s.review {
        let r: ReviewSection = section("network.review", node)?;
        if let Some(node) = r.yolo {
            c.review_yolo = match word("network.review.yolo", node, YOLO)? {
                "review" => YoloReview::Review,
                _ => YoloReview::Allow,
            };
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Part, TrustedConfig};
    use super::*;
    use crate::network::addr::canonical_host;

    fn errors(text: &str) -> Vec<String> {
        parse(text).errors.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn the_issues_example_parses_and_every_key_has_its_default() {
        let text = r#"{ "network": {
            "allowedDomains": ["github.com", "*.github.com", "registry.npmjs.org:443", " github.com "],
            "deniedDomains": ["uploads.github.com", "*:22"],
            "allowPrivate": ["127.0.0.1:8080", "10.1.2.0/24:5432"],
            "python": false } }"#;
        let p = parse(text);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let n = p.config.network;
        assert_eq!((n.mode, n.python, n.review_yolo, n.off_because), (Mode::Proxy, false, YoloReview::Allow, None));
        let shown = |v: Vec<String>| v;
        assert_eq!(
            shown(n.lists.allowed.iter().map(|r| r.to_string()).collect()),
            ["github.com", "*.github.com", "registry.npmjs.org:443"]
        );
        assert_eq!(shown(n.lists.denied.iter().map(|r| r.to_string()).collect()), ["uploads.github.com", "*:22"]);
        assert_eq!(
            shown(n.lists.allow_private.iter().map(|r| r.to_string()).collect()),
            ["127.0.0.1:8080", "10.1.2.0/24:5432"]
        );
        assert!(p.set.contains(&Part::Network));
        // No network key: the defaults, proxy with empty lists.
        assert_eq!(parse("{}").config.network, NetworkConfig::DEFAULT);
        assert_eq!(parse(r#"{"network": {}}"#).config.network, NetworkConfig::DEFAULT);
        let all = parse(r#"{"network": {"mode": "off", "python": true, "review": {"yolo": "review"}}}"#);
        assert!(all.errors.is_empty(), "{:?}", all.errors);
        let n = all.config.network;
        assert_eq!((n.mode, n.python, n.review_yolo), (Mode::Off, true, YoloReview::Review));
    }

    #[test]
    fn a_malformed_entry_or_key_turns_the_network_off_with_the_reason_and_leaves_the_rest() {
        let cases = [
            (r#"{"network": {"allowedDomains": ["ok.com", "*"]}}"#,
             "network.allowedDomains[1]: `*` is a bare `*`, which only deniedDomains may have (an allow-all entry is never accepted)"),
            (r#"{"network": {"allowedDomains": ["*.com"]}}"#,
             "network.allowedDomains[0]: `*.com` matches every name of a top-level domain (write a narrower `*.name.tld`)"),
            (r#"{"network": {"deniedDomains": ["a.com:99999"]}}"#,
             "network.deniedDomains[0]: `a.com:99999` has a port that is not a number from 1 to 65535"),
            (r#"{"network": {"allowPrivate": ["10.1.2.3/24"]}}"#,
             "network.allowPrivate[0]: `10.1.2.3/24` has host bits set (write the network, `10.1.2.0/24`)"),
            (r#"{"network": {"mode": "on"}}"#, "network.mode: `on` is not one of \"off\", \"proxy\""),
            (r#"{"network": {"python": "yes"}}"#, "network.python: expected a boolean, found a string"),
            (r#"{"network": {"review": {"yolo": "deny"}}}"#,
             "network.review.yolo: `deny` is not one of \"allow\", \"review\""),
            (r#"{"network": {"review": {"Yolo": "allow"}}}"#,
             "network.review.Yolo: unknown key (the keys here are yolo)"),
            (r#"{"network": {"allowDomains": []}}"#,
             "network.allowDomains: unknown key (the keys here are mode, allowedDomains, deniedDomains, allowPrivate, python, review)"),
            (r#"{"network": {"allowedDomains": "github.com"}}"#,
             "network.allowedDomains: expected an array, found a string"),
            (r#"{"network": []}"#, "network: expected an object, found an array"),
            (r#"{"network": {"allowedDomains": ["a\u0000b.allowed.com"]}}"#,
             "network.allowedDomains[0]: `a\\0b.allowed.com` is not a host: the host holds a NUL byte"),
        ];
        for (text, want) in cases {
            let p = parse(&format!("{}, \"bash\": \"host\"}}", &text[..text.len() - 1]));
            assert_eq!(p.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(), [want], "{text}");
            assert_eq!(p.config.network, NetworkConfig::off(want.to_owned()), "{text}");
            assert!(p.fell_back.contains(&Part::Network));
            assert_eq!(p.config.bash, super::super::Bash::Host, "the other parts apply: {text}");
        }
        // A whole file that is not JSON: the network is off too, with the reason.
        let p = parse("{");
        assert_eq!(p.config.network.mode, Mode::Off);
        assert_eq!(p.config.network.off_because.as_deref(), Some(super::super::NETWORK_OFF_REASON));
        assert_eq!(TrustedConfig::most_restrictive(&[Part::Network]).network.mode, Mode::Off);
        assert_eq!(errors(r#"{"network": {"mode": "proxy", "mode": "off"}}"#), ["network.mode: duplicate key"]);
    }

    #[test]
    fn an_empty_allowlist_is_no_allow_entry_and_the_network_stays_proxied() {
        // CVE-2025-66479: `allowedDomains: []` meant no restriction at all.
        let n = parse(r#"{"network": {"allowedDomains": [], "deniedDomains": []}}"#).config.network;
        assert_eq!(n.mode, Mode::Proxy);
        assert!(n.lists.allowed.is_empty());
        assert_eq!(n.lists.allowed_by(&canonical_host("example.com").unwrap(), 443), None);
    }
}
