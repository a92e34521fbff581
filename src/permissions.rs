//! Permission modes, read roots and read-prompt decisions.
//!
//! pi-tool-permissions announces `{ mode, readRoots }` on pi's event bus;
//! this module turns such a payload into the mounts a sandbox gets, says
//! what changed in words for the user, and decides what happens when code
//! reads a path outside the mounts. It only decides: the session applies
//! the mounts and the TypeScript wrapper talks to the bus and the UI.
//! Filesystem facts (realpath) come in as a function so tests need no
//! special machine. Paths in its messages are shown through `display`:
//! read roots come from the bus and refused paths from the sandbox, and
//! either can hold anything.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::bwrap::RESERVED_MOUNTS;
use crate::display::{display_line, displayed_line, holds_stand_in};

/// The mounts a sandbox is started with (besides the fixed ones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountConfig {
    pub workspace_writable: bool,
    /// Canonical host directories, mounted read-only at their own paths.
    pub read_roots: Vec<PathBuf>,
    /// Canonical host paths inside the project whose secrets are not
    /// masked (a secret at or under one is readable; see `secrets`).
    pub unmasked: Vec<PathBuf>,
}

/// A validated `tool-permissions:mode` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeEvent {
    /// `/workspace` is writable: the edits, auto and yolo modes (anything
    /// unknown is read-only).
    pub writable: bool,
    /// Root strings as given (validated later by [`plan_mounts`]).
    pub read_roots: Vec<String>,
}

/// Parse a mode payload. Anything unexpected falls to the safe side: an
/// unknown or missing mode is read-only, a malformed `readRoots` is no
/// roots, non-string roots are dropped. A payload that is not an object
/// changes nothing (`None`).
pub fn parse_mode_event(payload: &Value) -> Option<ModeEvent> {
    let obj = payload.as_object()?;
    let writable = matches!(obj.get("mode").and_then(Value::as_str), Some("edits" | "auto" | "yolo"));
    let read_roots = obj
        .get("readRoots")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    Some(ModeEvent { writable, read_roots })
}

/// A root that was not mounted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub root: String,
    pub reason: String,
}

/// A mounted root: the path asked for and where it resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub requested: String,
    pub resolved: PathBuf,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountPlan {
    pub mounted: Vec<Mounted>,
    pub skipped: Vec<Skipped>,
    /// Granted roots inside the project that cover a masked secret: not
    /// mounted (the project is), but their secrets are no longer masked.
    pub unmasked: Vec<PathBuf>,
}

impl MountPlan {
    pub fn roots(&self) -> Vec<PathBuf> {
        self.mounted.iter().map(|m| m.resolved.clone()).collect()
    }
}

/// Lexically normalised absolute path (`.`, `..`, repeated and trailing
/// slashes removed); `None` for a relative path.
pub fn normalize(path: &str) -> Option<PathBuf> {
    if !path.starts_with('/') {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in Path::new(path).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    Some(out)
}

/// The reserved sandbox mount `p` is on or under, if any.
fn reserved(p: &Path) -> Option<&'static str> {
    if p == Path::new("/") {
        return Some("/");
    }
    RESERVED_MOUNTS.iter().copied().find(|m| p.starts_with(m))
}

/// Decide which read roots to mount. `resolve` is realpath. `secrets`:
/// the canonical host paths of the project's secrets (masked or already
/// unmasked), `None` when no start has looked yet; a root inside the
/// project that covers one (any, when unknown) goes to `unmasked`.
pub fn plan_mounts(
    roots: &[String],
    project: Option<&Path>,
    secrets: Option<&[PathBuf]>,
    resolve: impl Fn(&Path) -> std::io::Result<PathBuf>,
) -> MountPlan {
    let unmasks = |p: &Path| match (project, secrets) {
        (Some(project), _) if !p.starts_with(project) => false,
        (None, _) => false,
        (Some(_), None) => true,
        (Some(_), Some(list)) => list.iter().any(|s| s.starts_with(p)),
    };
    let mut plan = MountPlan::default();
    let mut candidates: Vec<(String, PathBuf)> = Vec::new();
    for raw in roots {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        let skip = |reason: String| Skipped { root: raw.clone(), reason };
        let Some(normal) = normalize(trimmed) else {
            plan.skipped.push(skip("not an absolute path".into()));
            continue;
        };
        // Checked on the path as given, then again where it resolves. A
        // path inside the project is the project's (mounted at
        // /workspace, whatever its host path), never a reserved mount.
        let in_project = |p: &Path| project.is_some_and(|project| p.starts_with(project));
        let why_not = |p: &Path| -> Option<String> {
            if in_project(p) {
                return Some("inside the project, already readable under /workspace".into());
            }
            reserved(p).map(|m| {
                if m == "/" {
                    "the whole filesystem".into()
                } else {
                    format!("reserved sandbox mount {m}")
                }
            })
        };
        // Inside the project: skipped, unless where it resolves (inside
        // the project too) covers a secret.
        let given = why_not(&normal);
        if let Some(reason) = &given {
            if !in_project(&normal) {
                plan.skipped.push(skip(reason.clone()));
                continue;
            }
        }
        let resolved = match (resolve(&normal), &given) {
            (Ok(r), _) => r,
            (Err(_), Some(reason)) => {
                plan.skipped.push(skip(reason.clone()));
                continue;
            }
            (Err(e), None) => {
                plan.skipped.push(skip(format!("cannot be resolved: {e}")));
                continue;
            }
        };
        if let Some(reason) = why_not(&resolved) {
            if in_project(&resolved) && unmasks(&resolved) {
                if !plan.unmasked.contains(&resolved) {
                    plan.unmasked.push(resolved);
                }
            } else {
                plan.skipped.push(skip(reason));
            }
            continue;
        }
        if let Some(reason) = given {
            plan.skipped.push(skip(reason));
            continue;
        }
        candidates.push((raw.clone(), resolved));
    }
    // Shallowest first, so that a root covered by another is seen after it.
    candidates.sort_by(|a, b| a.1.cmp(&b.1));
    for (raw, resolved) in candidates {
        if let Some(cover) = plan.mounted.iter().find(|m| resolved.starts_with(&m.resolved)) {
            if cover.resolved != resolved {
                plan.skipped.push(Skipped { root: raw, reason: format!("covered by {}", cover.resolved.display()) });
            }
            continue; // an exact duplicate is dropped silently
        }
        plan.mounted.push(Mounted { requested: raw, resolved });
    }
    plan.unmasked.sort();
    plan
}

/// The user-facing note for a change of mounts. `discarded`: a running
/// interpreter was killed.
pub fn change_notification(old: &MountConfig, new: &MountConfig, plan: &MountPlan, discarded: bool) -> Option<String> {
    let mut changes: Vec<String> = Vec::new();
    if old.workspace_writable != new.workspace_writable {
        changes.push(
            if new.workspace_writable { "/workspace is now read-write" } else { "/workspace is now read-only" }.into(),
        );
    }
    if old.read_roots != new.read_roots {
        if plan.mounted.is_empty() {
            changes.push("read roots cleared".into());
        } else {
            let list: Vec<String> = plan
                .mounted
                .iter()
                .map(|m| {
                    let shown = m.resolved.display().to_string();
                    match normalize(m.requested.trim()) {
                        Some(n) if n != m.resolved => format!("{shown} (requested as {})", m.requested.trim()),
                        _ => shown,
                    }
                })
                .collect();
            changes.push(format!("read roots mounted read-only: {}", list.join(", ")));
        }
    }
    if old.unmasked != new.unmasked {
        if new.unmasked.is_empty() {
            changes.push("secrets in the project are masked again".into());
        } else {
            let list: Vec<String> = new.unmasked.iter().map(|p| p.display().to_string()).collect();
            changes.push(format!("secrets no longer masked at or under: {}", list.join(", ")));
        }
    }
    if changes.is_empty() {
        return None;
    }
    let mut note = format!("python sandbox: {}", changes.join("; "));
    note.push_str(if discarded {
        " (the sandbox was restarted; interpreter state discarded, scratch files kept)"
    } else {
        " (applies from the next execution)"
    });
    if !plan.skipped.is_empty() {
        let list: Vec<String> = plan.skipped.iter().map(|s| format!("{} ({})", s.root, s.reason)).collect();
        note.push_str(&format!("; skipped: {}", list.join(", ")));
    }
    Some(displayed_line(note))
}

/// The directory a refused read is about: the path itself for a directory
/// listing, otherwise its parent.
pub fn covering_dir(path: &Path, is_dir: bool) -> PathBuf {
    if is_dir {
        return path.to_path_buf();
    }
    match path.parent() {
        Some(p) if p != Path::new("/") => p.to_path_buf(),
        _ => path.to_path_buf(),
    }
}

/// What to do about a read outside the mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadDecision {
    /// Ask the user through pi-tool-permissions.
    Prompt,
    /// Refuse at once, with the diagnostic for the result.
    Deny(String),
}

/// A path that cannot be put in a prompt: it holds a control or bidi
/// character (tab and newline included), or a stand-in for one, which
/// means it was escaped on its way here (the worker shows C0 controls as
/// control pictures, the addon's results show them escaped) and is not the
/// path that was read. Granting it would grant something else.
pub fn unpromptable(path: &str) -> bool {
    display_line(path) != path || holds_stand_in(path)
}

/// The longest path put in a prompt: the kernel's PATH_MAX, which the
/// worker bounds its paths to as well (a forged frame could send 128 KiB).
pub const MAX_PROMPT_PATH_BYTES: usize = 4096;

/// Decide about a refused read of `path`. `secret`: the path is a masked
/// secret of the project, and this is its host path.
pub fn read_decision(
    path: &str,
    denied: &[PathBuf],
    permissions_seen: bool,
    has_ui: bool,
    secret: Option<&Path>,
) -> ReadDecision {
    let secret_how;
    let how = match secret {
        Some(host) => {
            let dir = host.parent().unwrap_or(host);
            secret_how = format!(
                "To allow it, grant read access to its directory {} (pi-tool-permissions' readAllowPaths, or a read \
                 root), or set {} to patterns that leave it out.",
                display_line(&dir.display().to_string()),
                crate::secrets::SECRETS_ENV
            );
            secret_how.as_str()
        }
        None => {
            "To allow it, grant read access to that directory (pi-tool-permissions' readAllowPaths, \
             or a read root), or copy the data into the project or /scratch."
        }
    };
    let what = if secret.is_some() {
        "looks like a secret (it matches the secret patterns), so the sandbox hides it,"
    } else {
        "is outside the sandbox mounts"
    };
    if path.len() > MAX_PROMPT_PATH_BYTES {
        return ReadDecision::Deny(format!(
            "The code tried to read a path of {} bytes, longer than any path the system opens ({MAX_PROMPT_PATH_BYTES}); \
             it was refused without asking.",
            path.len()
        ));
    }
    if unpromptable(path) {
        return ReadDecision::Deny(format!(
            "The code tried to read {}, a path with control or bidi characters (shown escaped). It was refused \
             without asking: a prompt could not show it as it is. Rename the file, or copy the data into the \
             project or /scratch.",
            display_line(path)
        ));
    }
    let p = Path::new(path);
    if let Some(d) = denied.iter().find(|d| p.starts_with(d)) {
        return ReadDecision::Deny(format!(
            "Reads under {} were denied earlier in this session, so {path} was refused without asking again. {how}",
            d.display()
        ));
    }
    if !permissions_seen {
        return ReadDecision::Deny(format!(
            "{path} {what} and there is no permission extension (pi-tool-permissions) to ask the user. {how}"
        ));
    }
    if !has_ui {
        return ReadDecision::Deny(format!(
            "{path} {what} and this pi session has no UI to ask the user (print mode). {how}"
        ));
    }
    ReadDecision::Prompt
}

/// Diagnostic for a read the user denied (or left unanswered).
pub fn denied_diagnostic(path: &str, why: &str) -> String {
    format!(
        "Read of {} was denied ({}); reads under that directory stay unavailable for this session. \
         Use another source, or ask the user to grant read access to that directory.",
        display_line(path),
        display_line(why)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ident(p: &Path) -> std::io::Result<PathBuf> {
        Ok(p.to_path_buf())
    }

    fn plan(roots: &[&str], project: &str) -> MountPlan {
        let roots: Vec<String> = roots.iter().map(|s| s.to_string()).collect();
        plan_mounts(&roots, Some(Path::new(project)), Some(&[]), ident)
    }

    fn reasons(p: &MountPlan) -> Vec<(String, String)> {
        p.skipped.iter().map(|s| (s.root.clone(), s.reason.clone())).collect()
    }

    #[test]
    fn modes_map_to_workspace_writability() {
        for (mode, writable) in [("edits", true), ("auto", true), ("yolo", true), ("manual", false), ("bogus", false)] {
            let e = parse_mode_event(&json!({ "mode": mode, "readRoots": [] })).expect("object");
            assert_eq!(e.writable, writable, "{mode}");
        }
    }

    #[test]
    fn malformed_payloads_fall_to_the_safe_side() {
        assert_eq!(parse_mode_event(&json!(null)), None);
        assert_eq!(parse_mode_event(&json!(42)), None);
        assert_eq!(parse_mode_event(&json!("yolo")), None);
        let e = parse_mode_event(&json!({ "mode": 7, "readRoots": "/etc" })).expect("object");
        assert_eq!((e.writable, e.read_roots.len()), (false, 0));
        let e = parse_mode_event(&json!({ "mode": "edits", "readRoots": ["/a", 5, null, "/b"] })).expect("object");
        assert_eq!(e.read_roots, ["/a", "/b"]);
    }

    #[test]
    fn each_skip_reason_is_named() {
        let p = plan(
            &[
                "relative/x",
                "/",
                "/tmp/pi-scratch",
                "/usr/share",
                "/workspace",
                "/proc/1",
                "/home/u/proj/sub",
                "/home/u/proj",
            ],
            "/home/u/proj",
        );
        assert!(p.mounted.is_empty(), "{:?}", p.mounted);
        assert_eq!(
            reasons(&p),
            [
                ("relative/x".into(), "not an absolute path".into()),
                ("/".into(), "the whole filesystem".into()),
                ("/tmp/pi-scratch".into(), "reserved sandbox mount /tmp".into()),
                ("/usr/share".into(), "reserved sandbox mount /usr".into()),
                ("/workspace".into(), "reserved sandbox mount /workspace".into()),
                ("/proc/1".into(), "reserved sandbox mount /proc".into()),
                ("/home/u/proj/sub".into(), "inside the project, already readable under /workspace".into()),
                ("/home/u/proj".into(), "inside the project, already readable under /workspace".into()),
            ]
        );
    }

    #[test]
    fn a_root_inside_the_project_unmasks_the_secrets_it_covers_and_is_skipped_otherwise() {
        let roots: Vec<String> = ["/home/u/proj/sub", "/home/u/proj/docs", "/home/u/proj/.env", "/home/u/proj/link"]
            .map(String::from)
            .into();
        let secrets = [PathBuf::from("/home/u/proj/.env"), PathBuf::from("/home/u/proj/sub/deploy/key.pem")];
        let resolve = |p: &Path| -> std::io::Result<PathBuf> {
            Ok(if p == Path::new("/home/u/proj/link") { "/home/u/proj/sub/deploy".into() } else { p.to_path_buf() })
        };
        let p = plan_mounts(&roots, Some(Path::new("/home/u/proj")), Some(&secrets), resolve);
        assert!(p.mounted.is_empty(), "{:?}", p.mounted);
        assert_eq!(
            p.unmasked,
            [PathBuf::from("/home/u/proj/.env"), "/home/u/proj/sub".into(), "/home/u/proj/sub/deploy".into()]
        );
        assert_eq!(
            reasons(&p),
            [("/home/u/proj/docs".into(), "inside the project, already readable under /workspace".into())]
        );
        // Before any start the secrets are unknown: a root inside the project may cover one.
        let unknown = plan_mounts(&roots[1..2], Some(Path::new("/home/u/proj")), None, ident);
        assert_eq!((unknown.unmasked.len(), unknown.skipped.len()), (1, 0));
        let old = MountConfig::default();
        let new = MountConfig { unmasked: p.unmasked.clone(), ..Default::default() };
        let note = change_notification(&old, &new, &p, true).expect("changed");
        assert!(note.contains("secrets no longer masked at or under: /home/u/proj/.env, "), "{note}");
        assert!(change_notification(&new, &old, &MountPlan::default(), false)
            .expect("changed")
            .contains("masked again"));
    }

    #[test]
    fn a_root_containing_the_project_is_kept_and_nested_roots_are_covered() {
        let p = plan(&["/data/a/b", "/home/u", "/data/a", "/data/a/", "/etc"], "/home/u/proj");
        assert_eq!(p.roots(), [PathBuf::from("/data/a"), "/etc".into(), "/home/u".into()]);
        assert_eq!(reasons(&p), [("/data/a/b".into(), "covered by /data/a".into())]);
    }

    #[test]
    fn roots_are_resolved_and_the_resolved_path_is_checked() {
        let resolve = |p: &Path| -> std::io::Result<PathBuf> {
            match p.to_str() {
                Some("/link") => Ok("/srv/data".into()),
                Some("/sneaky") => Ok("/usr/lib".into()),
                Some("/gone") => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
                _ => Ok(p.to_path_buf()),
            }
        };
        let roots = ["/link", "/sneaky", "/gone"].map(String::from);
        let p = plan_mounts(&roots, None, None, resolve);
        assert_eq!(p.mounted, [Mounted { requested: "/link".into(), resolved: "/srv/data".into() }]);
        assert_eq!(p.skipped[0].reason, "reserved sandbox mount /usr");
        assert!(p.skipped[1].reason.starts_with("cannot be resolved"));
        let note = change_notification(
            &MountConfig::default(),
            &MountConfig { workspace_writable: false, read_roots: p.roots(), ..Default::default() },
            &p,
            true,
        )
        .expect("changed");
        assert!(note.contains("/srv/data (requested as /link)"), "{note}");
        assert!(note.contains("interpreter state discarded"), "{note}");
        assert!(note.contains("skipped: /sneaky (reserved sandbox mount /usr)"), "{note}");
    }

    #[test]
    fn no_change_no_notification() {
        let c = MountConfig { workspace_writable: true, read_roots: vec!["/a".into()], ..Default::default() };
        assert_eq!(change_notification(&c, &c.clone(), &MountPlan::default(), false), None);
        let ro = MountConfig { workspace_writable: false, ..c.clone() };
        let note = change_notification(&c, &ro, &MountPlan::default(), false).expect("changed");
        assert!(note.starts_with("python sandbox: /workspace is now read-only"), "{note}");
    }

    #[test]
    fn read_decisions() {
        let denied = vec![PathBuf::from("/etc")];
        assert!(
            matches!(read_decision("/etc/hostname", &denied, true, true, None), ReadDecision::Deny(d) if d.contains("denied earlier"))
        );
        assert!(
            matches!(read_decision("/srv/x", &[], false, true, None), ReadDecision::Deny(d) if d.contains("no permission extension"))
        );
        assert!(
            matches!(read_decision("/srv/x", &[], true, false, None), ReadDecision::Deny(d) if d.contains("no UI"))
        );
        assert_eq!(read_decision("/etcetera/x", &denied, true, true, None), ReadDecision::Prompt);
    }

    #[test]
    fn a_secret_read_has_its_own_wording_and_with_nobody_to_ask_says_how_to_allow_it() {
        let host = Some(Path::new("/home/u/proj/sub/.env.production"));
        for (seen, ui, why) in [(false, true, "no permission extension"), (true, false, "no UI")] {
            let ReadDecision::Deny(d) = read_decision("/workspace/sub/.env.production", &[], seen, ui, host) else {
                panic!("a secret with nobody to ask was prompted")
            };
            assert!(d.starts_with("/workspace/sub/.env.production looks like a secret"), "{d}");
            assert!(d.contains(why) && d.contains("/home/u/proj/sub (") && d.contains("PI_PYTHON_TOOL_SECRETS"), "{d}");
            assert!(!d.contains("outside the sandbox mounts"), "{d}");
        }
        assert_eq!(read_decision("/workspace/.env", &[], true, true, Some(Path::new("/p/.env"))), ReadDecision::Prompt);
        let denied = [PathBuf::from("/workspace")];
        assert!(matches!(
            read_decision("/workspace/.env", &denied, true, true, Some(Path::new("/p/.env"))),
            ReadDecision::Deny(d) if d.contains("denied earlier") && d.contains("PI_PYTHON_TOOL_SECRETS")
        ));
    }

    #[test]
    fn a_path_with_control_or_bidi_characters_is_refused_not_prompted() {
        let raw = [
            "/etc/\x1b]52;c;aGk=\x07x",
            "/srv/a\r\nb",
            "/srv/a\nAllow? yes",
            "/srv/a\tb",
            "/srv/\u{9b}2J",
            "/srv/\x7f",
            "/srv/report\u{202E}fdp.exe",
            "/srv/\u{2066}x\u{2069}",
        ];
        // What arrives after escaping: by the worker (C0 as pictures) or by this addon's results.
        let escaped = ["/etc/\u{241B}]52;c;aGk=\u{2407}x", "/srv/report<U+202E>fdp.exe"];
        for path in raw.iter().chain(&escaped) {
            // Refused in every situation that would otherwise prompt, before any other rule.
            let decision = read_decision(path, &[PathBuf::from("/srv")], true, true, None);
            let ReadDecision::Deny(d) = decision else { panic!("{path:?} was prompted") };
            assert!(d.contains("control or bidi characters"), "{d}");
            assert!(d.contains(&*display_line(path)), "the path is named escaped: {d}");
            assert!(d.chars().all(|c| !c.is_control() && !crate::display::is_bidi_control(c)), "{d:?}");
        }
        assert_eq!(read_decision("/srv/日本/données.csv", &[], true, true, None), ReadDecision::Prompt);
        let long = format!("/srv/{}", "a".repeat(MAX_PROMPT_PATH_BYTES));
        assert!(
            matches!(read_decision(&long, &[], true, true, None), ReadDecision::Deny(d) if d.contains("4101 bytes"))
        );
        let d = denied_diagnostic("/srv/a\x1b[2J", "no\nanswer");
        assert!(d.contains("/srv/a\u{241B}[2J") && d.contains("no\u{240A}answer"), "{d}");
    }

    #[test]
    fn a_mode_notification_shows_roots_escaped() {
        let roots = ["/srv/\x1b]0;title\x07".to_string(), "rel\n\u{202E}x".to_string()];
        let p = plan_mounts(&roots, None, None, ident);
        let note = change_notification(
            &MountConfig::default(),
            &MountConfig { workspace_writable: false, read_roots: p.roots(), ..Default::default() },
            &p,
            false,
        )
        .expect("changed");
        assert!(note.contains("/srv/\u{241B}]0;title\u{2407}"), "{note}");
        assert!(note.contains("skipped: rel\u{240A}<U+202E>x (not an absolute path)"), "{note}");
        assert!(note.chars().all(|c| !c.is_control() && !crate::display::is_bidi_control(c)), "{note:?}");
    }

    #[test]
    fn covering_dirs() {
        assert_eq!(covering_dir(Path::new("/etc/hostname"), false), PathBuf::from("/etc"));
        assert_eq!(covering_dir(Path::new("/srv/data"), true), PathBuf::from("/srv/data"));
        assert_eq!(covering_dir(Path::new("/foo"), false), PathBuf::from("/foo"));
    }

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(normalize("/a/./b/../c//"), Some("/a/c".into()));
        assert_eq!(normalize("/.."), Some("/".into()));
        assert_eq!(normalize("a/b"), None);
    }
}
