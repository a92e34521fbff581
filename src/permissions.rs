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

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::bwrap::RESERVED_MOUNTS;
use crate::display::{display_line, displayed_line, holds_stand_in};
use crate::hostsecrets::{HostSecrets, Mask};

/// The mounts a sandbox is started with (besides the fixed ones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountConfig {
    pub workspace_writable: bool,
    /// Canonical host directories, mounted read-only at their own paths.
    pub read_roots: Vec<PathBuf>,
    /// Paths allowed once (see [`OnceMount`]): mounted in the next sandbox
    /// only, and dropped when it ends.
    pub once: Vec<OnceMount>,
    /// Canonical host paths inside the project whose secrets are not
    /// masked (a secret at or under one is readable; see `secrets`).
    pub unmasked: Vec<PathBuf>,
    /// A secret of the project allowed once: unmasked in the next sandbox
    /// only, like [`MountConfig::once`].
    pub unmasked_once: Vec<PathBuf>,
}

impl MountConfig {
    /// The same mounts without the allow-once paths.
    pub fn lasting(&self) -> MountConfig {
        MountConfig { once: Vec::new(), unmasked_once: Vec::new(), ..self.clone() }
    }

    /// Whether it holds anything allowed once.
    pub fn has_once(&self) -> bool {
        !self.once.is_empty() || !self.unmasked_once.is_empty()
    }
}

/// A path the user allowed to read once: exactly the file that was read,
/// or the directory that was listed, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnceMount {
    /// Where the code read it (lexically normalised), the mount point.
    pub path: PathBuf,
    /// Where it resolves on the host, the mount source.
    pub source: PathBuf,
    pub is_dir: bool,
}

/// A validated `tool-permissions:mode` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeEvent {
    /// `/workspace` is writable: the edits, auto and yolo modes (anything
    /// unknown is read-only).
    pub writable: bool,
    /// Root strings as given (validated later by [`plan_mounts`]).
    pub read_roots: Vec<String>,
    /// The mode's name as given (at most 64 bytes), for `status`.
    pub mode: Option<String>,
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
    let mode = obj.get("mode").and_then(Value::as_str).filter(|m| !m.is_empty() && m.len() <= 64).map(str::to_string);
    Some(ModeEvent { writable, read_roots, mode })
}

/// What planning read roots needs besides the roots: the canonical project
/// (roots inside it are skipped), the home directory (for `~`) and the
/// host secrets (never mounted, masked inside a root).
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub project: Option<&'a Path>,
    pub home: Option<&'a Path>,
    pub secrets: &'a HostSecrets,
    /// Host trees the sandbox can write besides the project (the session
    /// directories, scratch among them): a path through them may be a link
    /// it planted, so nothing there is granted.
    pub writable: &'a [PathBuf],
    /// The canonical host paths of the project's secrets (masked or
    /// already unmasked), `None` when no start has looked yet.
    pub project_secrets: Option<&'a [PathBuf]>,
}

impl Context<'_> {
    /// Where `path` (absolute, normalised) resolves, following links one
    /// component at a time: an error when it cannot be resolved, or when
    /// the resolution passes through a tree the sandbox can write (the
    /// project, the session directories), found by path or, for a bind
    /// mount or another name of a tree's root, by device and inode. There a
    /// name could be a link the sandbox planted (or make one later), so the
    /// host never follows it into a grant.
    pub fn resolve(&self, path: &Path) -> std::io::Result<PathBuf> {
        crate::paths::resolve_avoiding(path, &self.sandbox_trees())
    }

    /// The trees a host secret is never looked for in.
    fn sandbox_trees(&self) -> Vec<&Path> {
        self.project.into_iter().chain(self.writable.iter().map(PathBuf::as_path)).collect()
    }

    /// Why `p` (a path as given, or where it resolves) is never granted.
    pub fn refusal(&self, p: &Path) -> Option<Refusal> {
        // A path inside the project is the project's (mounted at
        // /workspace, whatever its host path), never a reserved mount.
        if self.project.is_some_and(|project| p.starts_with(project)) {
            return Some(Refusal::InsideProject);
        }
        if let Some(m) = reserved(p) {
            return Some(if m == "/" { Refusal::WholeFilesystem } else { Refusal::Reserved(m) });
        }
        if self.writable.iter().any(|w| p.starts_with(w)) {
            return Some(Refusal::SessionDirs);
        }
        self.secrets.covering(p).map(|e| Refusal::HostSecret(e.shown()))
    }
}

/// Why a root (or an allow-once path) is not mounted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a pattern, not a directory")]
    Pattern,
    #[error("~ without a home directory")]
    NoHome,
    #[error("another user's home directory")]
    OtherHome,
    #[error("not an absolute path")]
    NotAbsolute,
    #[error("the whole filesystem")]
    WholeFilesystem,
    #[error("reserved sandbox mount {0}")]
    Reserved(&'static str),
    #[error("inside the project, already readable under /workspace")]
    InsideProject,
    #[error("inside the session's own directories, which the sandbox writes")]
    SessionDirs,
    #[error("a host secret ({0}), never mounted; see {env}", env = crate::hostsecrets::HOST_SECRETS_ENV)]
    HostSecret(String),
    #[error("cannot be resolved: {0}")]
    Unresolvable(String),
    #[error("covered by {}", crate::display::one_line(&.0))]
    Covered(PathBuf),
    #[error(
        "the same directory as {} (both resolve to {})",
        crate::display::one_line(requested),
        crate::display::one_line(resolved)
    )]
    SameAs { requested: String, resolved: PathBuf },
}

/// A root as a person or a client wrote it, as an absolute path: `~` is
/// the home directory, a relative path is taken from the project, and a
/// trailing `/**`, `/*` or `/` (a glob for "everything under") is dropped.
pub fn root_path(raw: &str, ctx: &Context) -> Result<PathBuf, Refusal> {
    let mut text = raw.trim();
    loop {
        let stripped = text.strip_suffix("/**").or_else(|| text.strip_suffix("/*"));
        match stripped {
            Some(rest) if !rest.is_empty() => text = rest,
            _ => break,
        }
    }
    if text.contains(['*', '?', '[']) {
        return Err(Refusal::Pattern);
    }
    let absolute = if text == "~" || text.starts_with("~/") {
        let Some(home) = ctx.home else { return Err(Refusal::NoHome) };
        home.join(text.trim_start_matches('~').trim_start_matches('/'))
    } else if text.starts_with('/') {
        PathBuf::from(text)
    } else if text.starts_with('~') {
        return Err(Refusal::OtherHome);
    } else {
        let Some(project) = ctx.project else { return Err(Refusal::NotAbsolute) };
        project.join(text)
    };
    let normal = normalize_path(&absolute).ok_or(Refusal::NotAbsolute)?;
    // The sandbox's name for the project (a prompt about /workspace/.env
    // makes a client offer /workspace): the project's host path.
    match (ctx.project, normal.strip_prefix(crate::bwrap::WORKSPACE)) {
        (Some(project), Ok(rest)) => Ok(project.join(rest)),
        _ => Ok(normal),
    }
}

/// A root that was not mounted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub root: String,
    pub reason: Refusal,
}

/// A mounted root: the path asked for, where it resolved, and the host
/// secrets masked inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub requested: String,
    pub resolved: PathBuf,
    pub masked: Vec<Mask>,
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

pub use crate::paths::{normalize, normalize_path};

/// The reserved sandbox mount `p` is on or under, if any.
fn reserved(p: &Path) -> Option<&'static str> {
    if p == Path::new("/") {
        return Some("/");
    }
    RESERVED_MOUNTS
        .iter()
        .chain(crate::runtime_paths::RESERVED.iter().flat_map(|r| r.iter()))
        .copied()
        .find(|m| p.starts_with(m))
}

/// Decide which read roots to mount. `resolve` is realpath.
pub fn plan_mounts(roots: &[String], ctx: &Context, resolve: impl Fn(&Path) -> std::io::Result<PathBuf>) -> MountPlan {
    let mut plan = MountPlan::default();
    let mut candidates: Vec<(String, PathBuf, PathBuf)> = Vec::new();
    for raw in roots {
        if raw.trim().is_empty() {
            continue;
        }
        let skip = |reason: Refusal| Skipped { root: raw.clone(), reason };
        let normal = match root_path(raw, ctx) {
            Ok(p) => p,
            Err(reason) => {
                plan.skipped.push(skip(reason));
                continue;
            }
        };
        // Inside the project: skipped, unless it covers one of its secrets,
        // which it unmasks. Taken as written, never resolved: a link there
        // could be the sandbox's, and the masks are planned on real paths.
        if ctx.project.is_some_and(|project| normal.starts_with(project)) {
            // Secrets not known yet (no start so far): any real entry may hold one.
            let covers = match ctx.project_secrets {
                // A secret under it, or the masked directory it is in
                // (then just it is opened, see `secrets::holes`).
                Some(list) => list.iter().any(|s| s.starts_with(&normal) || normal.starts_with(s)),
                // Looked at beneath the project, never through a link in it.
                None => ctx.project.is_some_and(|project| {
                    let rel = normal.strip_prefix(project).unwrap_or(Path::new(""));
                    rel.as_os_str().is_empty()
                        || crate::beneath::Tree::open(project).is_ok_and(|tree| {
                            matches!(tree.lstat(rel), Ok(Some(st)) if crate::beneath::Kind::of(&st) != crate::beneath::Kind::Link)
                        })
                }),
            };
            if covers {
                if !plan.unmasked.contains(&normal) {
                    plan.unmasked.push(normal);
                }
            } else {
                plan.skipped.push(skip(Refusal::InsideProject));
            }
            continue;
        }
        // Checked on the path as given, then again where it resolves.
        if let Some(reason) = ctx.refusal(&normal) {
            plan.skipped.push(skip(reason));
            continue;
        }
        let resolved = match resolve(&normal) {
            Ok(r) => r,
            Err(e) => {
                plan.skipped.push(skip(Refusal::Unresolvable(e.to_string())));
                continue;
            }
        };
        if let Some(reason) = ctx.refusal(&resolved) {
            plan.skipped.push(skip(reason));
            continue;
        }
        candidates.push((raw.clone(), normal, resolved));
    }
    // Shallowest first, so that a root covered by another is seen after it.
    candidates.sort_by(|a, b| a.2.cmp(&b.2));
    let mut asked: Vec<PathBuf> = Vec::new();
    for (raw, normal, resolved) in candidates {
        if let Some(cover) = plan.mounted.iter().find(|m| resolved.starts_with(&m.resolved)) {
            if cover.resolved != resolved {
                plan.skipped.push(Skipped { root: raw, reason: Refusal::Covered(cover.resolved.clone()) });
            } else if !asked.contains(&normal) {
                // Another name (a link) for a root already mounted.
                let reason = Refusal::SameAs { requested: cover.requested.trim().to_string(), resolved };
                plan.skipped.push(Skipped { root: raw, reason });
            }
            asked.push(normal);
            continue; // the same root written twice is dropped silently
        }
        asked.push(normal);
        let masked = ctx.secrets.masks_under(&resolved, &ctx.sandbox_trees());
        plan.mounted.push(Mounted { requested: raw, resolved, masked });
    }
    plan.unmasked.sort();
    plan
}

/// `/etc (host secrets masked: /etc/shadow, /etc/gshadow)`.
pub fn shown_with_masks(path: &Path, masked: &[Mask]) -> String {
    if masked.is_empty() {
        return crate::display::one_line(&path).to_string();
    }
    let list: Vec<String> = masked.iter().map(|m| crate::display::one_line(&m.path).to_string()).collect();
    format!("{} (host secrets masked: {})", crate::display::one_line(&path), list.join(", "))
}

/// What a change did to the sandbox, after the notification's list (a
/// result leaves it out: its own state statement says it).
pub const CHANGE_DISCARDED: &str = " (the sandbox was restarted; interpreter state discarded, scratch files kept)";
/// What a change does while no sandbox runs.
pub const CHANGE_LATER: &str = " (applies from the next execution)";
/// What a change that reached the running sandbox did (see
/// [`change_live`]).
pub const CHANGE_LIVE: [&str; 6] = [
    " (detached from the running sandbox now; interpreter state kept)",
    " (added to the running sandbox at its next execution; interpreter state kept)",
    " (interpreter state kept: the removed roots are detached from the running sandbox now, the added ones \
     attached at its next execution)",
    " (made read-only in the running sandbox now; interpreter state kept)",
    " (made writable in the running sandbox at its next execution; interpreter state kept)",
    " (the running sandbox has it read-only already; interpreter state kept)",
];

/// What a change from `old` to `new` that reaches the running sandbox
/// (no restart) does: a revoked read root is detached at once, an added
/// one attached at the next execution; a project made read-only at once,
/// writable at the next execution (see `worker::mode`).
pub fn change_live(old: &MountConfig, new: &MountConfig) -> &'static str {
    match (old.workspace_writable, new.workspace_writable) {
        (true, false) => return CHANGE_LIVE[3],
        (false, true) => return CHANGE_LIVE[4],
        _ => {}
    }
    let removed = old.read_roots.iter().any(|r| !new.read_roots.contains(r));
    let added = new.read_roots.iter().any(|r| !old.read_roots.contains(r));
    match (removed, added) {
        (true, false) => CHANGE_LIVE[0],
        (false, _) => CHANGE_LIVE[1],
        (true, true) => CHANGE_LIVE[2],
    }
}

/// How a notification says that the project was made writable.
pub const NOW_WRITABLE: &str = "/workspace is now read-write";

/// How [`held_read_only`] says it.
pub const HELD: &str = "/workspace stays read-only although the mode allows writes";
/// How a start (or a running sandbox, see `worker::mode`) says it in a
/// note of the first result: left out of a result that says [`HELD`].
pub const HELD_NOTE: &str =
    "/workspace is mounted READ-ONLY for this sandbox although the permission mode allows writes";

/// A notification of a change to a writable mode whose project cannot be
/// protected (`why`, see `protected::writable_refusal`): it says that the
/// project stays read-only, and why, where it said read-write; a running
/// sandbox keeps its read-only project and its interpreter (see
/// `worker::mode`).
pub fn held_read_only(note: &str, why: &str) -> String {
    let held = format!("{HELD}: {}", why.trim_end_matches('.'));
    displayed_line(note.replacen(NOW_WRITABLE, &held, 1).replacen(CHANGE_LIVE[4], CHANGE_LIVE[5], 1))
}

/// The user-facing note for a change of mounts. `discarded`: a running
/// interpreter was killed.
pub fn change_notification(old: &MountConfig, new: &MountConfig, plan: &MountPlan, discarded: bool) -> Option<String> {
    let mut changes: Vec<String> = Vec::new();
    if old.workspace_writable != new.workspace_writable {
        changes.push(if new.workspace_writable { NOW_WRITABLE } else { "/workspace is now read-only" }.into());
    }
    if old.read_roots != new.read_roots {
        if plan.mounted.is_empty() {
            changes.push("read roots cleared".into());
        } else {
            let list: Vec<String> = plan
                .mounted
                .iter()
                .map(|m| {
                    let shown = shown_with_masks(&m.resolved, &m.masked);
                    if Path::new(m.requested.trim()) != m.resolved {
                        format!("{shown} (requested as {})", m.requested.trim())
                    } else {
                        shown
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
            let list: Vec<String> = new.unmasked.iter().map(|p| crate::display::one_line(&p).to_string()).collect();
            changes.push(format!("secrets no longer masked at or under: {}", list.join(", ")));
        }
    }
    if changes.is_empty() {
        // Nothing changed, but what was asked for was not mounted: say why.
        if plan.skipped.is_empty() {
            return None;
        }
        let list: Vec<String> = plan.skipped.iter().map(|s| format!("{} ({})", s.root, s.reason)).collect();
        return Some(format!("python sandbox: read roots not mounted: {}", list.join(", ")));
    }
    let mut note = format!("python sandbox: {}", changes.join("; "));
    note.push_str(if discarded { CHANGE_DISCARDED } else { CHANGE_LATER });
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

/// A path that cannot be put in a prompt: it holds a control, bidi or
/// other invisible format character (tab and newline included), or a
/// stand-in for one, which means it was escaped on its way here (the
/// worker shows C0 controls as control pictures, the addon's results show
/// them escaped) and is not the path that was read. Granting it would
/// grant something else.
pub fn unpromptable(path: &str) -> bool {
    display_line(path) != path || holds_stand_in(path) || path.chars().any(crate::display::is_format_char)
}

/// A path that is not written as the plain absolute path it names (`.`,
/// `..`, `//`, a trailing `/`, or relative). The worker sends only plain
/// ones; another could make a prompt, a denial and a mount disagree.
pub fn not_plain(path: &str) -> bool {
    normalize(path).is_none_or(|n| n.as_os_str() != path)
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
    if not_plain(path) {
        return ReadDecision::Deny(format!(
            "The code tried to read {}, which is not written as the plain absolute path it names; it was refused \
             without asking: a prompt must show exactly the path it grants.",
            display_line(path)
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
            crate::display::one_line(&d)
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

    static NO_SECRETS: HostSecrets = HostSecrets { entries: Vec::new(), in_home: Vec::new() };

    fn ctx(project: Option<&str>) -> Context<'_> {
        Context {
            project: project.map(Path::new),
            home: Some(Path::new("/home/u")),
            secrets: &NO_SECRETS,
            writable: &[],
            project_secrets: Some(&[]),
        }
    }

    fn plan(roots: &[&str], project: &str) -> MountPlan {
        let roots: Vec<String> = roots.iter().map(|s| s.to_string()).collect();
        plan_mounts(&roots, &ctx(Some(project)), ident)
    }

    /// The notification for mounting `p`'s roots over the defaults.
    fn note_from_defaults(p: &MountPlan, discarded: bool) -> String {
        let new = MountConfig { read_roots: p.roots(), ..MountConfig::default() };
        change_notification(&MountConfig::default(), &new, p, discarded).expect("changed")
    }

    fn reasons(p: &MountPlan) -> Vec<(String, String)> {
        p.skipped.iter().map(|s| (s.root.clone(), s.reason.to_string())).collect()
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
                ("relative/x".into(), "inside the project, already readable under /workspace".into()),
                ("/".into(), "the whole filesystem".into()),
                ("/tmp/pi-scratch".into(), "reserved sandbox mount /tmp".into()),
                ("/usr/share".into(), "reserved sandbox mount /usr".into()),
                ("/workspace".into(), "inside the project, already readable under /workspace".into()),
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
        // A link inside the project is never followed (it could be the sandbox's): taken as written.
        let resolve = |p: &Path| -> std::io::Result<PathBuf> {
            Ok(if p == Path::new("/home/u/proj/link") { "/home/u/proj/sub/deploy".into() } else { p.to_path_buf() })
        };
        let c = Context { project_secrets: Some(&secrets), ..ctx(Some("/home/u/proj")) };
        let p = plan_mounts(&roots, &c, resolve);
        assert!(p.mounted.is_empty(), "{:?}", p.mounted);
        assert_eq!(p.unmasked, [PathBuf::from("/home/u/proj/.env"), "/home/u/proj/sub".into()]);
        assert_eq!(
            reasons(&p),
            [
                ("/home/u/proj/docs".into(), "inside the project, already readable under /workspace".into()),
                ("/home/u/proj/link".into(), "inside the project, already readable under /workspace".into()),
            ]
        );
        // Before any start the secrets are unknown: a root inside the project may cover one.
        // (A real entry only: a name that does not exist, or a link, covers nothing.)
        let t = tempfile::tempdir().unwrap();
        let proj = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(proj.join("docs")).unwrap();
        std::os::unix::fs::symlink(proj.join("docs"), proj.join("link")).unwrap();
        std::fs::create_dir(proj.join("docs/sub")).unwrap();
        // "link/sub" exists only through the link: looked at beneath the project, it does not.
        let roots: Vec<String> =
            ["docs", "missing", "link", "link/sub"].map(|r| proj.join(r).display().to_string()).into();
        let proj_str = proj.display().to_string();
        let unknown = plan_mounts(&roots, &Context { project_secrets: None, ..ctx(Some(&proj_str)) }, ident);
        assert_eq!(unknown.unmasked, [proj.join("docs")]);
        assert_eq!(unknown.skipped.len(), 3);
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
        let p = plan_mounts(&roots, &ctx(None), resolve);
        assert_eq!(p.mounted, [Mounted { requested: "/link".into(), resolved: "/srv/data".into(), masked: vec![] }]);
        assert_eq!(p.skipped[0].reason, Refusal::Reserved("/usr"));
        assert!(matches!(p.skipped[1].reason, Refusal::Unresolvable(_)));
        let note = note_from_defaults(&p, true);
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
    fn a_change_that_reaches_the_running_sandbox_says_when_and_that_state_is_kept() {
        let with = |roots: &[&str]| MountConfig {
            read_roots: roots.iter().map(PathBuf::from).collect(),
            ..Default::default()
        };
        let (a, ab, b) = (with(&["/a"]), with(&["/a", "/b"]), with(&["/b"]));
        assert!(change_live(&ab, &a).contains("detached from the running sandbox now"));
        assert!(change_live(&a, &ab).contains("added to the running sandbox at its next execution"));
        let both = change_live(&a, &b);
        assert!(both.contains("removed roots are detached") && both.contains("added ones attached"), "{both}");
        let writable = MountConfig { workspace_writable: true, ..a.clone() };
        assert!(change_live(&writable, &a).contains("made read-only in the running sandbox now"));
        assert!(change_live(&a, &writable).contains("made writable in the running sandbox at its next execution"));
        assert!(CHANGE_LIVE.iter().all(|s| s.contains("interpreter state kept")));
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
            assert!(d.contains(why) && d.contains("/home/u/proj/sub (") && d.contains("PI_SANDBOX_SECRETS"), "{d}");
            assert!(!d.contains("outside the sandbox mounts"), "{d}");
        }
        assert_eq!(read_decision("/workspace/.env", &[], true, true, Some(Path::new("/p/.env"))), ReadDecision::Prompt);
        let denied = [PathBuf::from("/workspace")];
        assert!(matches!(
            read_decision("/workspace/.env", &denied, true, true, Some(Path::new("/p/.env"))),
            ReadDecision::Deny(d) if d.contains("denied earlier") && d.contains("PI_SANDBOX_SECRETS")
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
        // Not the plain path it names: a denial of /home/u would not see it.
        let denied = [PathBuf::from("/home/u")];
        for p in ["/srv/x/../../home/u/a.pdf", "/srv//a", "/srv/a/", "/srv/./a", "srv/a"] {
            assert!(
                matches!(read_decision(p, &denied, true, true, None), ReadDecision::Deny(d) if d.contains("plain absolute path")),
                "{p}"
            );
        }
        // Invisible characters a prompt could not show: zero-width, joiners, tags.
        for p in ["/srv/a\u{200B}b", "/srv/a\u{200D}b", "/srv/a\u{00AD}b", "/srv/tag\u{E0041}\u{E0042}"] {
            assert!(matches!(read_decision(p, &[], true, true, None), ReadDecision::Deny(_)), "{p:?}");
        }
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
        let p = plan_mounts(&roots, &ctx(None), ident);
        let note = note_from_defaults(&p, false);
        assert!(note.contains("/srv/\u{241B}]0;title\u{2407}"), "{note}");
        assert!(note.contains("skipped: rel\u{240A}<U+202E>x (not an absolute path)"), "{note}");
        assert!(note.chars().all(|c| !c.is_control() && !crate::display::is_bidi_control(c)), "{note:?}");
    }

    #[test]
    fn roots_as_a_client_writes_them_are_normalised() {
        let c = ctx(Some("/home/u/proj"));
        for (raw, want) in [
            ("~/data/**", "/home/u/data"),
            ("~", "/home/u"),
            (" /srv/data/* ", "/srv/data"),
            ("/srv/data/", "/srv/data"),
            ("../shared", "/home/u/shared"),
            ("/srv/a/../b", "/srv/b"),
        ] {
            assert_eq!(root_path(raw, &c), Ok(PathBuf::from(want)), "{raw}");
        }
        assert_eq!(root_path("/workspace/sub", &c), Ok(PathBuf::from("/home/u/proj/sub")));
        assert_eq!(root_path("/workspace", &c), Ok(PathBuf::from("/home/u/proj")));
        assert_eq!(root_path("/workspaces/x", &c), Ok(PathBuf::from("/workspaces/x")));
        assert_eq!(root_path("/srv/*/x", &c), Err(Refusal::Pattern));
        assert_eq!(root_path("~bob/x", &c), Err(Refusal::OtherHome));
        assert_eq!(root_path("x", &ctx(None)), Err(Refusal::NotAbsolute));
        let p = plan_mounts(&["~/data/**".to_string()], &c, ident);
        let note = note_from_defaults(&p, false);
        assert!(note.contains("/home/u/data (requested as ~/data/**)"), "{note}");
    }

    #[test]
    fn resolution_never_passes_through_a_tree_the_sandbox_writes() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let b = std::fs::canonicalize(t.path()).unwrap();
        let project = b.join("proj");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(b.join("private.txt"), "host-private").unwrap();
        // The user's own link to the project, and a link the sandbox planted in it.
        std::os::unix::fs::symlink(&project, b.join("work")).unwrap();
        std::os::unix::fs::symlink(b.join("private.txt"), project.join("report.csv")).unwrap();
        std::fs::create_dir(b.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink("../private.txt", b.join("elsewhere/rel")).unwrap();
        let c = Context {
            project: Some(&project),
            home: None,
            secrets: &NO_SECRETS,
            writable: &[],
            project_secrets: Some(&[]),
        };
        // Baseline: realpath follows the planted link out of the project.
        assert_eq!(std::fs::canonicalize(b.join("work/report.csv")).unwrap(), b.join("private.txt"));
        let err = c.resolve(&b.join("work/report.csv")).unwrap_err().to_string();
        assert!(err.contains("which the sandbox can write"), "{err}");
        let p = plan_mounts(&[b.join("work").display().to_string()], &c, |p| c.resolve(p));
        assert!(p.mounted.is_empty() && p.skipped[0].reason.to_string().contains("which the sandbox can write"));
        // Links elsewhere resolve as realpath does.
        assert_eq!(c.resolve(&b.join("elsewhere/rel")).unwrap(), b.join("private.txt"));
        assert_eq!(c.resolve(&b.join("private.txt")).unwrap(), b.join("private.txt"));
        assert!(c.resolve(&b.join("missing")).is_err());
    }

    #[test]
    fn a_link_to_a_mounted_root_is_named() {
        let resolve = |p: &Path| -> std::io::Result<PathBuf> {
            Ok(if p == Path::new("/srv/link") { "/srv/data".into() } else { p.to_path_buf() })
        };
        let roots = ["/srv/data", "/srv/link", "/srv/data/"].map(String::from);
        let p = plan_mounts(&roots, &ctx(None), resolve);
        assert_eq!(p.roots(), [PathBuf::from("/srv/data")]);
        assert_eq!(
            reasons(&p),
            [("/srv/link".into(), "the same directory as /srv/data (both resolve to /srv/data)".into())]
        );
    }

    #[test]
    fn host_secrets_are_refused_as_roots_and_masked_inside_them() {
        // Not under /tmp, a reserved sandbox mount.
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".netrc"), "machine x").unwrap();
        let secrets = HostSecrets::new(None, Some(&home), &[]);
        let c = Context { project: None, home: Some(&home), secrets: &secrets, writable: &[], project_secrets: None };
        let roots = [home.display().to_string(), "~/.ssh".into(), "/etc/shadow".into()];
        let p = plan_mounts(&roots, &c, |p| std::fs::canonicalize(p));
        assert_eq!(p.roots(), std::slice::from_ref(&home));
        let masked: Vec<PathBuf> = p.mounted[0].masked.iter().map(|m| m.path.clone()).collect();
        assert_eq!(masked, [home.join(".netrc"), home.join(".ssh")]);
        assert!(
            p.skipped[0]
                .reason
                .to_string()
                .starts_with(&format!("a host secret ({}/.ssh), never mounted", home.display())),
            "{:?}",
            p.skipped
        );
        assert!(p.skipped[1].reason.to_string().starts_with("a host secret (/etc/shadow)"), "{:?}", p.skipped);
        let note = note_from_defaults(&p, false);
        assert!(
            note.contains(&format!("(host secrets masked: {}/.netrc, {}/.ssh)", home.display(), home.display())),
            "{note}"
        );
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
