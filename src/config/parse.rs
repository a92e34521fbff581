//! The trusted file's schema and the checks of its values (pure: text in,
//! configuration and errors out).
//!
//! Each top-level key is a *part* (`bash`, `userBash`, `filesystem`,
//! `env`, `network`) read on its own: an error inside a part gives that part its most
//! restrictive value, and the other parts apply. What cannot be given to
//! one part (text that is not JSON, a top level that is not an object, an
//! unknown or repeated top-level key) gives every part its most
//! restrictive value. Within a part nothing is half applied: one bad entry
//! of a list drops the whole list, so that a broken file is noticed rather
//! than half working.

use std::path::PathBuf;

use serde::Deserialize;

use super::node::{Node, SchemaError};
use super::{Bash, ConfigError, Part, PathProblem, TrustedConfig, UserBash};

/// Entries one list may have.
pub const MAX_LIST: usize = 256;
/// Bytes one path or name may have (`PATH_MAX`).
pub const MAX_ENTRY_BYTES: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Sections {
    bash: Option<Node>,
    user_bash: Option<Node>,
    filesystem: Option<Node>,
    env: Option<Node>,
    network: Option<Node>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FilesystemSection {
    additional_allow_read: Option<Node>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvSection {
    passthrough: Option<Node>,
}

/// Names the sandbox never takes from pi's environment, whatever
/// `env.passthrough` says, each with why. A trailing `*` is a prefix.
pub const REFUSED_NAMES: &[(&str, &str)] = &[
    ("LD_*", "it changes what the dynamic loader loads into every program (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT)"),
    ("GLIBC_TUNABLES", "it changes how the C library's loader and allocator behave in every program"),
    ("BASH_ENV", "it makes bash run a file before every command"),
    ("ENV", "it makes sh run a file when it starts"),
    ("SHELLOPTS", "it changes how bash runs every command"),
    ("BASHOPTS", "it changes how bash runs every command"),
    ("HOME", "the sandbox sets its own: the session's private home"),
    ("TMPDIR", "the sandbox sets its own: the command's private /tmp"),
    ("TMP", "the sandbox sets its own: the command's private /tmp"),
    ("TEMP", "the sandbox sets its own: the command's private /tmp"),
    ("HTTP_PROXY", "the sandbox's network proxy sets it"),
    ("HTTPS_PROXY", "the sandbox's network proxy sets it"),
    ("ALL_PROXY", "the sandbox's network proxy sets it"),
    ("NO_PROXY", "the sandbox's network proxy sets it"),
    ("http_proxy", "the sandbox's network proxy sets it"),
    ("https_proxy", "the sandbox's network proxy sets it"),
    ("all_proxy", "the sandbox's network proxy sets it"),
    ("no_proxy", "the sandbox's network proxy sets it"),
];

/// Why `name` is never passed, when it is one of [`REFUSED_NAMES`].
pub fn refused_name(name: &str) -> Option<&'static str> {
    REFUSED_NAMES.iter().find_map(|(pattern, why)| {
        let hit = match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *pattern,
        };
        hit.then_some(*why)
    })
}

/// A POSIX environment variable name: letters, digits and `_`, not
/// starting with a digit.
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= MAX_ENTRY_BYTES
}

/// What a file's text gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub config: TrustedConfig,
    pub errors: Vec<ConfigError>,
    /// The parts the file set (and that apply).
    pub set: Vec<Part>,
    /// The parts an error made most restrictive.
    pub fell_back: Vec<Part>,
}

impl Parsed {
    pub(super) fn whole_file(error: ConfigError) -> Parsed {
        Parsed {
            config: TrustedConfig::most_restrictive(Part::ALL),
            errors: vec![error],
            set: Vec::new(),
            fell_back: Part::ALL.to_vec(),
        }
    }
}

/// The configuration a file's text gives, and what was wrong with it.
/// Never fails: what is wrong falls back, part by part (see the module's
/// documentation).
pub fn parse(text: &str) -> Parsed {
    let root: Node = match serde_json::from_str(text) {
        Ok(root) => root,
        Err(e) => return Parsed::whole_file(ConfigError::Syntax { detail: e.to_string() }),
    };
    if !matches!(root, Node::Object(_)) {
        let found = root.kind();
        return Parsed::whole_file(ConfigError::WrongType { key: String::new(), expected: "an object", found });
    }
    let sections = match Sections::deserialize(root) {
        Ok(s) => s,
        Err(e) => return Parsed::whole_file(schema_error("", e)),
    };
    let mut config = TrustedConfig::DEFAULT;
    let (mut errors, mut set, mut fell_back) = (Vec::new(), Vec::new(), Vec::new());
    let mut part = |p: Part, result: Result<(), ConfigError>| match result {
        Ok(()) => set.push(p),
        Err(e) => {
            errors.push(e);
            fell_back.push(p);
        }
    };
    if let Some(node) = sections.bash {
        part(Part::Bash, choice::<Bash>("bash", node).map(|v| config.bash = v));
    }
    if let Some(node) = sections.user_bash {
        part(Part::UserBash, choice::<UserBash>("userBash", node).map(|v| config.user_bash = v));
    }
    if let Some(node) = sections.filesystem {
        part(Part::Filesystem, filesystem(node).map(|v| config.additional_allow_read = v));
    }
    if let Some(node) = sections.env {
        part(Part::Env, env(node).map(|v| config.env_passthrough = v));
    }
    if let Some(node) = sections.network {
        let result = super::network::network(node);
        if let Err(e) = &result {
            config.network.off_because = Some(e.to_string());
        }
        part(Part::Network, result.map(|v| config.network = v));
    }
    for p in &fell_back {
        config.fall_back(*p);
    }
    Parsed { config, errors, set, fell_back }
}

/// A serde error of the object at `key` (`""`: the top level).
fn schema_error(key: &str, e: SchemaError) -> ConfigError {
    let join = |field: &str| if key.is_empty() { field.to_owned() } else { format!("{key}.{field}") };
    match e {
        SchemaError::UnknownField { field, expected } => ConfigError::UnknownKey { key: join(&field), known: expected },
        SchemaError::DuplicateField { field } => ConfigError::DuplicateKey { key: join(field) },
        SchemaError::UnknownVariant { variant, expected } => {
            ConfigError::NotAChoice { key: key.to_owned(), found: variant, choices: expected }
        }
        SchemaError::Other(detail) => ConfigError::Schema { key: key.to_owned(), detail },
    }
}

/// One of the strings of enum `T`.
fn choice<T: for<'de> Deserialize<'de>>(key: &str, node: Node) -> Result<T, ConfigError> {
    if !matches!(node, Node::String(_)) {
        return Err(ConfigError::WrongType { key: key.to_owned(), expected: "a string", found: node.kind() });
    }
    T::deserialize(node).map_err(|e| schema_error(key, e))
}

/// The object at `key`, read as section `T`.
pub(super) fn section<T: for<'de> Deserialize<'de>>(key: &str, node: Node) -> Result<T, ConfigError> {
    if !matches!(node, Node::Object(_)) {
        return Err(ConfigError::WrongType { key: key.to_owned(), expected: "an object", found: node.kind() });
    }
    T::deserialize(node).map_err(|e| schema_error(key, e))
}

/// The strings of the array at `key`, each checked by `check` (which
/// returns the entry as kept); duplicates dropped, first kept.
pub(super) fn list<T: PartialEq>(
    key: &str,
    node: Node,
    mut check: impl FnMut(String, &str) -> Result<T, ConfigError>,
) -> Result<Vec<T>, ConfigError> {
    let Node::Array(items) = node else {
        return Err(ConfigError::WrongType { key: key.to_owned(), expected: "an array", found: node.kind() });
    };
    if items.len() > MAX_LIST {
        return Err(ConfigError::TooMany { key: key.to_owned(), max: MAX_LIST });
    }
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("{key}[{i}]");
        let Node::String(s) = item else {
            return Err(ConfigError::WrongType { key: at, expected: "a string", found: item.kind() });
        };
        let kept = check(at.clone(), &s)?;
        if !out.contains(&kept) {
            out.push(kept);
        }
    }
    Ok(out)
}

fn filesystem(node: Node) -> Result<Vec<PathBuf>, ConfigError> {
    let s: FilesystemSection = section("filesystem", node)?;
    match s.additional_allow_read {
        None => Ok(Vec::new()),
        Some(node) => list("filesystem.additionalAllowRead", node, |key, p| {
            read_path(p).map_err(|problem| ConfigError::Path { key, path: p.to_owned(), problem })
        }),
    }
}

/// An entry of `filesystem.additionalAllowRead`, normalised.
pub fn read_path(p: &str) -> Result<PathBuf, PathProblem> {
    if p.is_empty() {
        return Err(PathProblem::Empty);
    }
    if p.contains('\0') {
        return Err(PathProblem::Nul);
    }
    if p.len() > MAX_ENTRY_BYTES {
        return Err(PathProblem::TooLong);
    }
    if !p.starts_with('/') {
        return Err(PathProblem::Relative);
    }
    if p.split('/').any(|c| c == "..") {
        return Err(PathProblem::DotDot);
    }
    let normal = crate::paths::normalize(p).ok_or(PathProblem::Relative)?;
    if normal.as_os_str() == "/" {
        return Err(PathProblem::Root);
    }
    Ok(normal)
}

fn env(node: Node) -> Result<Vec<String>, ConfigError> {
    let s: EnvSection = section("env", node)?;
    match s.passthrough {
        None => Ok(Vec::new()),
        Some(node) => list("env.passthrough", node, |key, name| {
            if !is_env_name(name) {
                return Err(ConfigError::EnvName { key, name: name.to_owned() });
            }
            match refused_name(name) {
                Some(why) => Err(ConfigError::EnvRefused { key, name: name.to_owned(), why }),
                None => Ok(name.to_owned()),
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        parse(text).errors.iter().map(|e| e.to_string()).collect()
    }

    const ALL_SET: &str = r#"{
        "bash": "host",
        "userBash": "sandbox",
        "filesystem": { "additionalAllowRead": ["/home/u/.nvm/", "/opt//tools/./bin", "/home/u/.nvm"] },
        "env": { "passthrough": ["NPM_TOKEN", "_x1", "NPM_TOKEN"] }
    }"#;

    #[test]
    fn a_valid_file_sets_every_key_normalised_and_deduplicated() {
        let Parsed { config, errors, .. } = parse(ALL_SET);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            config,
            TrustedConfig {
                bash: Bash::Host,
                user_bash: UserBash::Sandbox,
                additional_allow_read: vec![PathBuf::from("/home/u/.nvm"), PathBuf::from("/opt/tools/bin")],
                env_passthrough: vec!["NPM_TOKEN".into(), "_x1".into()],
                network: crate::config::NetworkConfig::DEFAULT,
            }
        );
    }

    #[test]
    fn an_empty_object_and_empty_sections_are_the_defaults() {
        for text in [r#"{}"#, r#"{"filesystem": {}, "env": {}}"#, r#"{"env": {"passthrough": []}}"#] {
            let parsed = parse(text);
            assert_eq!((parsed.config, parsed.errors), (TrustedConfig::DEFAULT, vec![]), "{text}");
        }
    }

    #[test]
    fn text_that_is_not_json_makes_every_part_most_restrictive() {
        for text in ["", "{", r#"{"bash": "host",}"#, "// c\n{}", r#"{'bash': 'host'}"#, "{} {}", "\u{feff}{}"] {
            let Parsed { config, errors, .. } = parse(text);
            assert_eq!(config, TrustedConfig::most_restrictive(Part::ALL), "{text:?}");
            assert!(matches!(errors.as_slice(), [ConfigError::Syntax { .. }]), "{text:?}: {errors:?}");
            assert!(errors[0].to_string().starts_with("not valid JSON: "), "{}", errors[0]);
        }
        assert_eq!(errors("[1]"), ["the file: expected an object, found an array"]);
        assert_eq!(parse("null").config, TrustedConfig::most_restrictive(Part::ALL));
    }

    #[test]
    fn an_unknown_or_repeated_top_level_key_makes_every_part_most_restrictive() {
        let text = r#"{"bash": "host", "env": {"passthrough": ["A"]}, "userbash": "sandbox"}"#;
        let Parsed { config, errors: errs, .. } = parse(text);
        assert_eq!(config, TrustedConfig::most_restrictive(Part::ALL));
        assert_eq!(
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["userbash: unknown key (the keys here are bash, userBash, filesystem, env, network)"]
        );
        assert_eq!(errors(r#"{"bash": "host", "bash": "sandbox"}"#), ["bash: duplicate key"]);
        assert_eq!(parse(r#"{"bash": "host", "bash": "host"}"#).config, TrustedConfig::most_restrictive(Part::ALL));
    }

    #[test]
    fn an_error_in_one_part_falls_back_for_that_part_only() {
        let text = r#"{
            "bash": "host",
            "userBash": "sandbox",
            "filesystem": { "additionalAllowRead": ["/opt/a", "rel/b"] },
            "env": { "passthrough": ["NPM_TOKEN"] }
        }"#;
        let Parsed { config, errors: errs, .. } = parse(text);
        assert_eq!(
            config,
            TrustedConfig {
                bash: Bash::Host,
                user_bash: UserBash::Sandbox,
                additional_allow_read: vec![],
                env_passthrough: vec!["NPM_TOKEN".into()],
                network: crate::config::NetworkConfig::DEFAULT,
            }
        );
        assert_eq!(
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["filesystem.additionalAllowRead[1]: `rel/b` is not an absolute path (write it from `/`; `~` is not expanded)"]
        );
        // Several parts wrong: each falls back, each is named, the rest applies.
        let Parsed { config, errors: errs, .. } =
            parse(r#"{"bash": "hots", "userBash": 1, "env": {"passthrough": ["OK"]}}"#);
        assert_eq!(config.bash, Bash::Sandbox);
        assert_eq!(config.user_bash, UserBash::Sandbox);
        assert_eq!(config.env_passthrough, ["OK"]);
        assert_eq!(
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["bash: `hots` is not one of \"sandbox\", \"host\"", "userBash: expected a string, found a number"]
        );
    }

    #[test]
    fn wrong_types_name_their_key_path() {
        let cases = [
            (r#"{"bash": true}"#, "bash: expected a string, found a boolean"),
            (r#"{"bash": null}"#, "bash: expected a string, found null"),
            (r#"{"userBash": ["host"]}"#, "userBash: expected a string, found an array"),
            (r#"{"filesystem": []}"#, "filesystem: expected an object, found an array"),
            (
                r#"{"filesystem": {"additionalAllowRead": "/opt"}}"#,
                "filesystem.additionalAllowRead: expected an array, found a string",
            ),
            (
                r#"{"filesystem": {"additionalAllowRead": ["/a", "/b", 3]}}"#,
                "filesystem.additionalAllowRead[2]: expected a string, found a number",
            ),
            (r#"{"env": "A"}"#, "env: expected an object, found a string"),
            (r#"{"env": {"passthrough": [null]}}"#, "env.passthrough[0]: expected a string, found null"),
        ];
        for (text, want) in cases {
            assert_eq!(errors(text), [want], "{text}");
        }
    }

    #[test]
    fn unknown_and_repeated_keys_inside_a_part_name_their_path() {
        let Parsed { config, errors: errs, .. } = parse(r#"{"bash": "host", "filesystem": {"allowRead": ["/opt"]}}"#);
        assert_eq!(config.bash, Bash::Host);
        assert_eq!(
            errs.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["filesystem.allowRead: unknown key (the keys here are additionalAllowRead)"]
        );
        assert_eq!(
            errors(r#"{"env": {"passthrough": ["A"], "passthrough": ["B"]}}"#),
            ["env.passthrough: duplicate key"]
        );
        assert_eq!(
            errors(r#"{"env": {"Passthrough": []}}"#),
            ["env.Passthrough: unknown key (the keys here are passthrough)"]
        );
    }

    #[test]
    fn bad_read_paths_are_refused_each_with_its_reason() {
        let cases = [
            ("", PathProblem::Empty),
            ("opt/tools", PathProblem::Relative),
            ("./opt", PathProblem::Relative),
            ("~/.nvm", PathProblem::Relative),
            ("/opt/\0x", PathProblem::Nul),
            ("/opt/../etc", PathProblem::DotDot),
            ("/opt/a/..", PathProblem::DotDot),
            ("/", PathProblem::Root),
            ("//./", PathProblem::Root),
        ];
        for (p, want) in cases {
            assert_eq!(read_path(p), Err(want), "{p:?}");
        }
        assert_eq!(read_path(&format!("/{}", "a".repeat(MAX_ENTRY_BYTES))), Err(PathProblem::TooLong));
        assert_eq!(read_path("/opt/..x/./"), Ok(PathBuf::from("/opt/..x")));
        let text = r#"{"filesystem": {"additionalAllowRead": ["/opt/../etc"]}}"#;
        assert_eq!(
            errors(text),
            ["filesystem.additionalAllowRead[0]: `/opt/../etc` has a `..` component (write the path it means)"]
        );
        let text = r#"{"filesystem": {"additionalAllowRead": ["/a\u0000b"]}}"#;
        assert_eq!(errors(text), ["filesystem.additionalAllowRead[0]: `/a\\0b` holds a NUL byte"]);
    }

    #[test]
    fn bad_and_refused_environment_names_are_named_with_why() {
        for bad in ["", "1A", "A-B", "A B", "A=B", "É", "BASH_FUNC_f%%"] {
            assert!(!is_env_name(bad), "{bad:?}");
        }
        for good in ["A", "_", "a1", "NPM_TOKEN", "LD"] {
            assert!(is_env_name(good), "{good:?}");
        }
        assert_eq!(
            errors(r#"{"env": {"passthrough": ["OK", "A-B"]}}"#),
            ["env.passthrough[1]: `A-B` is not an environment variable name (letters, digits and `_`, not starting with a digit)"]
        );
        let refused = parse(r#"{"bash": "host", "env": {"passthrough": ["OK", "LD_PRELOAD"]}}"#);
        assert_eq!(refused.config.env_passthrough, Vec::<String>::new());
        assert_eq!(refused.config.bash, Bash::Host);
        assert_eq!(
            refused.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["env.passthrough[1]: `LD_PRELOAD` is never passed: it changes what the dynamic loader loads into every program (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT)"]
        );
        for name in ["LD_LIBRARY_PATH", "LD_AUDIT", "GLIBC_TUNABLES", "BASH_ENV", "HOME", "TMPDIR", "https_proxy"] {
            assert!(refused_name(name).is_some(), "{name}");
        }
        for name in ["LDFLAGS", "LD", "PATH", "NPM_TOKEN", "HOMEBREW_PREFIX"] {
            assert_eq!(refused_name(name), None, "{name}");
        }
        assert!(REFUSED_NAMES.iter().all(|(_, why)| !why.is_empty()));
    }

    #[test]
    fn a_list_past_its_cap_is_refused() {
        let names: Vec<String> = (0..=MAX_LIST).map(|i| format!("\"N{i}\"")).collect();
        let text = format!(r#"{{"env": {{"passthrough": [{}]}}}}"#, names.join(","));
        assert_eq!(errors(&text), [format!("env.passthrough: more than {MAX_LIST} entries")]);
    }
}
