//! Protected paths of a writable project.
//!
//! In the edits, auto and yolo modes `/workspace` is writable, but some
//! names in a project are read by host tools that then run code or trust
//! what they find: git's configuration and hooks, editor tasks, agent
//! settings, shell start-up files, package-manager configuration. This
//! module decides which entries are protected and keeps them so:
//!
//! - [`plan`] walks the project once (bounded, see `scan`) and finds every
//!   protected name at any depth, every repository (`.git` directory or
//!   file) and whatever `core.hooksPath` names, read from the repository's
//!   and the user's git configuration files directly (git itself is never
//!   run on the host in the project: its fsmonitor would run). Each entry
//!   becomes a read-only bind whose source is an fd opened beneath the
//!   project without following links (bubblewrap's `--ro-bind-fd`); the
//!   directories above a nested entry are bound onto themselves first, so
//!   that they are mount points and cannot be renamed away.
//! - A protected name that did not exist at the start cannot be mounted
//!   without creating it in the user's project. The [`Guard`] notices one
//!   that appears (at the end of every execution, on every stop of the
//!   sandbox, and in between through an inotify watch on the directories
//!   that hold protected names) and makes it inert at once: it is renamed
//!   in place, in the same directory, to a name no tool reads, never
//!   copied or deleted. A protected link that is replaced is put back the
//!   same way. The host cannot tell who made a name, so one the user's own
//!   editor creates while a writable sandbox exists is renamed too; the
//!   note says how to restore it.
//!
//! Every file operation goes through `beneath`.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::OFlag;

use crate::beneath::{self, Kind, Tree};
use crate::gitconfig::inside;
pub use crate::gitconfig::HostGit;
use crate::scan::{self, Limits, Summary, Visit};

/// A protected name and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub reason: &'static str,
}

const fn rule(name: &'static str, reason: &'static str) -> Rule {
    Rule { name, reason }
}

const GIT: &str = "git runs hooks, fsmonitor, filters and aliases named by a repository";
const HOOKS: &str = "commit hooks that git runs on the host";
const EDITOR: &str = "editor tasks and settings that run commands when the folder is opened";
const AGENT: &str = "coding-agent settings, commands and extensions that run on the host";
const SHELL: &str = "shell start-up files that a host shell may source";
const PACKAGES: &str = "package-manager configuration and plugins that run on install or build";

/// The default protected names, matched at any depth of the project (the
/// whole directory when the name is one). Compared with sandbox-runtime's
/// mandatory-deny list and Codex's, plus agent and package-manager configs.
pub const DEFAULT_PROTECTED: &[Rule] = &[
    rule(".git", GIT),
    rule(".gitconfig", GIT),
    rule(".gitmodules", GIT),
    rule(".hg", "Mercurial runs hooks from .hg/hgrc"),
    rule(".husky", HOOKS),
    rule(".pre-commit-config.yaml", HOOKS),
    rule(".pi", AGENT),
    rule(".claude", AGENT),
    rule(".codex", AGENT),
    rule(".cursor", AGENT),
    rule(".gemini", AGENT),
    rule(".mcp.json", "MCP servers that agents start on the host"),
    rule(".vscode", EDITOR),
    rule(".idea", EDITOR),
    rule(".devcontainer", EDITOR),
    rule(".envrc", "direnv runs it when a shell enters the directory"),
    rule(".bashrc", SHELL),
    rule(".bash_profile", SHELL),
    rule(".bash_login", SHELL),
    rule(".bash_logout", SHELL),
    rule(".profile", SHELL),
    rule(".zshrc", SHELL),
    rule(".zprofile", SHELL),
    rule(".zshenv", SHELL),
    rule(".zlogin", SHELL),
    rule(".ripgreprc", "ripgrep reads options (a preprocessor command) from it"),
    rule(".npmrc", PACKAGES),
    rule(".yarnrc", PACKAGES),
    rule(".yarnrc.yml", PACKAGES),
    rule(".yarn", "yarn runs the release and plugins kept in .yarn"),
    rule(".pnpmfile.cjs", PACKAGES),
    rule(".cargo", "cargo reads runners, linkers and aliases from .cargo/config.toml"),
];

/// Replaces [`DEFAULT_PROTECTED`]: a colon-separated list; an entry with a
/// `/` is a path relative to the project, any other a name matched at any
/// depth (empty: protect nothing).
pub const PROTECTED_ENV: &str = "PI_PYTHON_TOOL_PROTECTED";

/// The inert name's mark: `NAME.pi-inert`, `NAME.pi-inert-2`, ...
pub const INERT_MARK: &str = ".pi-inert";

/// At most this many read-only binds; a project with more protected
/// entries is reported as not fully protected.
pub const MAX_BINDS: usize = 1024;

/// What is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// A name, at any depth.
    Name(String),
    /// A path relative to the project.
    Path(PathBuf),
}

/// The patterns in force: `override_list` (from the environment) or the
/// default. Entries that are not plain relative paths are dropped.
pub fn patterns(override_list: Option<&str>) -> Vec<Pattern> {
    let Some(list) = override_list else {
        return DEFAULT_PROTECTED.iter().map(|r| Pattern::Name(r.name.into())).collect();
    };
    let mut out = Vec::new();
    for entry in list.split(':').map(str::trim).filter(|s| !s.is_empty()) {
        let rel = Path::new(entry.trim_matches('/'));
        if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            continue;
        }
        let p = if rel.components().count() == 1 {
            Pattern::Name(rel.to_string_lossy().into_owned())
        } else {
            Pattern::Path(rel.to_path_buf())
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The patterns in force for this process.
pub fn patterns_from_env() -> Vec<Pattern> {
    patterns(std::env::var(PROTECTED_ENV).ok().as_deref())
}

/// The patterns as the user wrote them (for `status`).
pub fn describe(patterns: &[Pattern]) -> Vec<String> {
    patterns
        .iter()
        .map(|p| match p {
            Pattern::Name(n) => n.clone(),
            Pattern::Path(p) => p.display().to_string(),
        })
        .collect()
}

/// One bind mount over the writable workspace: `fd` is its source, opened
/// beneath the project; `rel` where it goes under `/workspace`.
#[derive(Debug)]
pub struct Bind {
    pub fd: OwnedFd,
    pub rel: PathBuf,
    pub read_only: bool,
}

/// The protection of one sandbox start.
#[derive(Debug)]
pub struct Plan {
    /// In mount order: the directories above nested entries (read-write,
    /// onto themselves), then the protected entries (read-only).
    pub binds: Vec<Bind>,
    pub guard: Guard,
    /// What the user should know about the plan (an incomplete scan, a
    /// hooks path outside the project, ...).
    pub notes: Vec<String>,
}

/// A sink for notes to the user.
pub type Notes = std::sync::Arc<parking_lot::Mutex<Vec<String>>>;

/// Keeps the protected names of a running writable sandbox.
#[derive(Debug)]
pub struct Guard {
    tree: Tree,
    names: HashSet<OsString>,
    limits: Limits,
    /// Protected entries that existed at the start (relative paths).
    present: HashSet<PathBuf>,
    /// The first missing component of each protected path that did not
    /// exist at the start.
    expected: Vec<PathBuf>,
    /// Protected links: (relative path, target), put back when replaced.
    links: Vec<(PathBuf, PathBuf)>,
    /// Directories that hold protected names: checked cheaply at the end
    /// of every execution and watched in between.
    holders: Vec<PathBuf>,
    /// Where notes found between executions go (the session's, for its
    /// next result).
    pending: Notes,
    walking: AtomicBool,
    /// Processes the code left running: the whole project is checked
    /// every [`BACKGROUND_CHECK`] while they may be.
    background: AtomicBool,
    /// A later walk stopped at its bound (told once).
    told_incomplete: AtomicBool,
    pub scan: Summary,
}

/// How often the whole project is checked while the code's background
/// processes may still run.
pub const BACKGROUND_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Plan the protection of `project` (its canonical path).
pub fn plan(project: &Path, patterns: &[Pattern], limits: Limits, git: &HostGit, sink: Notes) -> std::io::Result<Plan> {
    let tree = Tree::open(project)?;
    let names: HashSet<OsString> = patterns
        .iter()
        .filter_map(|p| match p {
            Pattern::Name(n) => Some(OsString::from(n)),
            Pattern::Path(_) => None,
        })
        .collect();
    let mut found: Vec<(PathBuf, Kind)> = Vec::new();
    let summary = scan::walk(&tree, limits, |rel, kind| {
        if rel.file_name().is_some_and(|n| names.contains(n)) {
            found.push((rel.to_path_buf(), kind));
            return Visit::Skip;
        }
        Visit::Descend
    });
    let mut notes = Vec::new();
    if !summary.complete {
        notes.push(format!(
            "the project scan for protected paths stopped after {} entries (depth {}): protected names further in are \
             not protected; raise PI_PYTHON_TOOL_SCAN_ENTRIES or PI_PYTHON_TOOL_SCAN_DEPTH",
            summary.entries, limits.max_depth
        ));
    }
    let mut wanted: Vec<PathBuf> = patterns
        .iter()
        .filter_map(|p| match p {
            Pattern::Path(p) => Some(p.clone()),
            Pattern::Name(_) => None,
        })
        .collect();
    wanted.extend(crate::gitconfig::protected_paths(project, &tree, &found, git));
    let mut expected = Vec::new();
    for rel in wanted {
        if found.iter().any(|(f, _)| rel.starts_with(f)) {
            continue; // already covered
        }
        match first_missing(&tree, &rel) {
            Ok(None) => {
                if let Ok(Some(st)) = tree.lstat(&rel) {
                    found.push((rel, Kind::of(&st)));
                }
            }
            Ok(Some(missing)) => {
                if !expected.contains(&missing) {
                    expected.push(missing)
                }
            }
            Err(e) => notes.push(format!("{} cannot be protected: {e}", rel.display())),
        }
    }
    // Links: put back when replaced; a target inside the project is protected.
    let mut links = Vec::new();
    for (rel, kind) in found.clone() {
        if kind != Kind::Link {
            continue;
        }
        let Ok(target) = tree.read_link(&rel) else { continue };
        if let Some(t) = inside(project, rel.parent().unwrap_or(Path::new("")), &target) {
            if let Ok(Some(st)) = tree.lstat(&t) {
                if Kind::of(&st) != Kind::Link && !found.iter().any(|(f, _)| t.starts_with(f)) {
                    found.push((t, Kind::of(&st)));
                }
            }
        }
        links.push((rel, target));
    }
    let (binds, more) = binds(&tree, &found, &mut notes);
    if more {
        notes.push(format!("more than {MAX_BINDS} protected entries: the rest stay writable"));
    }
    let mut holders: Vec<PathBuf> = vec![PathBuf::new()];
    for rel in found.iter().map(|(r, _)| r).chain(&expected) {
        let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        if !holders.contains(&parent) {
            holders.push(parent);
        }
    }
    let guard = Guard {
        tree,
        names,
        limits,
        present: found.iter().map(|(r, _)| r.clone()).collect(),
        expected,
        links,
        holders,
        pending: sink,
        walking: AtomicBool::new(false),
        background: AtomicBool::new(false),
        told_incomplete: AtomicBool::new(!summary.complete),
        scan: summary,
    };
    Ok(Plan { binds, guard, notes })
}

/// `None` when `rel` exists; else its shallowest missing prefix.
fn first_missing(tree: &Tree, rel: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut prefix = PathBuf::new();
    for c in rel.components() {
        prefix.push(c);
        if tree.lstat(&prefix)?.is_none() {
            return Ok(Some(prefix));
        }
    }
    Ok(None)
}

/// Open the binds for `found` (links excluded): every directory above a
/// nested entry once, shallowest first, then the entries.
fn binds(tree: &Tree, found: &[(PathBuf, Kind)], notes: &mut Vec<String>) -> (Vec<Bind>, bool) {
    let mut entries: Vec<&PathBuf> = found.iter().filter(|(_, k)| *k != Kind::Link).map(|(r, _)| r).collect();
    entries.sort();
    entries.dedup();
    // An entry inside another one is covered by it.
    let outer: Vec<&PathBuf> =
        entries.iter().copied().filter(|e| !entries.iter().any(|o| *o != *e && e.starts_with(o))).collect();
    let mut anchors: Vec<PathBuf> = Vec::new();
    for e in &outer {
        let mut a = e.parent();
        while let Some(p) = a.filter(|p| !p.as_os_str().is_empty()) {
            if !anchors.iter().any(|x| x == p) {
                anchors.push(p.to_path_buf());
            }
            a = p.parent();
        }
    }
    anchors.sort_by_key(|a| a.components().count());
    let mut out = Vec::new();
    let mut more = false;
    let all = anchors.iter().map(|a| (a, false)).chain(outer.iter().map(|e| (*e, true)));
    for (rel, read_only) in all {
        if out.len() == MAX_BINDS {
            more = true;
            break;
        }
        match tree.open_at(rel, OFlag::O_PATH) {
            Ok(fd) => out.push(Bind { fd, rel: rel.clone(), read_only }),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => notes.push(format!("{} could not be protected: {e}", rel.display())),
        }
    }
    (out, more)
}

/// `a/b` -> `'/project/a/b'`, quoted for a shell.
fn shell_path(root: &Path, rel: &Path) -> String {
    format!("'{}'", root.join(rel).display().to_string().replace('\'', r"'\''"))
}

impl Guard {
    /// Directories whose new entries matter (relative paths).
    pub fn holders(&self) -> &[PathBuf] {
        &self.holders
    }

    /// Whether a new entry `name` of holder `dir` may be protected.
    pub fn matters(&self, dir: &Path, name: &OsStr) -> bool {
        self.names.contains(name)
            || self.expected.iter().any(|e| e.parent() == Some(dir) && e.file_name() == Some(name))
            || self.links.iter().any(|(l, _)| l.parent() == Some(dir) && l.file_name() == Some(name))
    }

    /// The cheap check: the protected names of the holder directories,
    /// the expected paths and the links. Returns notes for the user.
    pub fn check_holders(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for holder in &self.holders {
            let Ok(dir) = self.tree.dir(holder) else { continue };
            for name in &self.names {
                let rel = holder.join(name);
                if self.present.contains(&rel) {
                    continue;
                }
                if let Ok(Some(_)) = beneath::stat_in(dir.as_fd(), name) {
                    notes.extend(self.make_inert(&rel));
                }
            }
        }
        self.check_expected_and_links(&mut notes);
        notes
    }

    /// The whole check: the bounded walk again, then the expected paths and
    /// the links.
    pub fn check_all(&self) -> Vec<String> {
        let mut new = Vec::new();
        let walked = scan::walk(&self.tree, self.limits, |rel, _| {
            if rel.file_name().is_some_and(|n| self.names.contains(n)) {
                if !self.present.contains(rel) {
                    new.push(rel.to_path_buf());
                }
                return Visit::Skip;
            }
            Visit::Descend
        });
        let mut notes: Vec<String> = new.iter().filter_map(|rel| self.make_inert(rel)).collect();
        if !walked.complete && !self.told_incomplete.swap(true, Ordering::AcqRel) {
            notes.push(format!(
                "The project now has more than {} entries (or is deeper than {}): protected names created further in \
                 are not found by the check; raise PI_PYTHON_TOOL_SCAN_ENTRIES or PI_PYTHON_TOOL_SCAN_DEPTH",
                self.limits.max_entries, self.limits.max_depth
            ));
        }
        self.check_expected_and_links(&mut notes);
        notes
    }

    /// Say whether the code left processes running (from each result).
    pub fn set_background(&self, running: bool) {
        self.background.store(running, Ordering::Release);
    }

    /// [`Guard::check_all`] into the pending notes, unless one runs already.
    pub fn check_all_pending(&self) {
        if self.walking.swap(true, Ordering::AcqRel) {
            return;
        }
        let notes = self.check_all();
        self.walking.store(false, Ordering::Release);
        self.pending.lock().extend(notes);
    }

    /// Check one new entry of a holder directory (from the watch).
    pub fn check_entry(&self, dir: &Path, name: &OsStr) {
        let rel = dir.join(name);
        if self.present.contains(&rel) && !self.links.iter().any(|(l, _)| *l == rel) {
            return;
        }
        let mut notes = Vec::new();
        if self.names.contains(name) && !self.present.contains(&rel) {
            notes.extend(self.make_inert(&rel));
        }
        self.check_expected_and_links(&mut notes);
        self.pending.lock().extend(notes);
    }

    fn check_expected_and_links(&self, notes: &mut Vec<String>) {
        for rel in &self.expected {
            if let Ok(Some(_)) = self.tree.lstat(rel) {
                notes.extend(self.make_inert(rel));
            }
        }
        for (rel, target) in &self.links {
            match self.tree.read_link(rel) {
                Ok(now) if now == *target => continue,
                _ => {}
            }
            let moved = match self.tree.lstat(rel) {
                Ok(Some(_)) => self.make_inert(rel),
                _ => None,
            };
            let restored = match self.tree.symlink(target, rel) {
                Ok(()) => "it was put back".to_string(),
                Err(e) => format!(
                    "it could NOT be put back ({e}): check {} before using the project",
                    shell_path(self.tree.path(), rel)
                ),
            };
            notes.push(format!(
                "The protected link {} -> {} was replaced in the project; {restored}.{}",
                rel.display(),
                target.display(),
                moved.map(|m| format!(" {m}")).unwrap_or_default()
            ));
        }
    }

    /// Rename `rel` in place to the first free `NAME.pi-inert[-N]`.
    /// `None` when it vanished meanwhile.
    fn make_inert(&self, rel: &Path) -> Option<String> {
        let (dir, name) = match self.tree.parent(rel) {
            Ok(p) => p,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return None,
            Err(e) => {
                return Some(format!(
                    "{} appeared in the project but could NOT be made inert ({e}): check {} before using the project",
                    rel.display(),
                    shell_path(self.tree.path(), rel)
                ))
            }
        };
        let mut last_err = None;
        for n in 1..=64u32 {
            let mut new = name.clone();
            new.push(INERT_MARK);
            if n > 1 {
                new.push(format!("-{n}"));
            }
            match beneath::rename_noreplace(dir.as_fd(), &name, &new) {
                Ok(()) => {
                    let moved = rel.with_file_name(&new);
                    return Some(format!(
                        "{} appeared in the project while the sandbox could write it; host tools could run code from it, \
                         so it was renamed to {}. If you made it yourself, restore it with: mv {} {}",
                        rel.display(),
                        moved.display(),
                        shell_path(self.tree.path(), &moved),
                        shell_path(self.tree.path(), rel)
                    ));
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last_err = Some(e),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return None,
                Err(e) => {
                    last_err = Some(e);
                    break;
                }
            }
        }
        let e = last_err.map(|e| e.to_string()).unwrap_or_default();
        Some(format!(
            "{} appeared in the project but could NOT be made inert ({e}): check {} before using the project",
            rel.display(),
            shell_path(self.tree.path(), rel)
        ))
    }
}

/// The inotify instance, as tokio wants it.
struct InotifyFd(nix::sys::inotify::Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Watch the holder directories of `guard` for new entries until `stop`
/// fires, checking each one that matters; an overflowed queue triggers the
/// whole check. Watches are added through the directories' own fds, so a
/// directory swapped for a link is never followed.
pub async fn watch(guard: std::sync::Arc<Guard>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let Ok(inotify) = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) else {
        tracing::warn!("no inotify: protected names are checked at the end of each execution only");
        return;
    };
    let mut wds = Vec::new();
    for holder in guard.holders() {
        let Ok(dir) = guard.tree.dir(holder) else { continue };
        let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR;
        if let Ok(wd) = inotify.add_watch(path.as_str(), flags) {
            wds.push((wd, holder.clone()));
        }
    }
    // SAFETY: the inotify fd is owned by the wrapper inside the AsyncFd and
    // stays open until the AsyncFd (and its registration) is dropped.
    let Ok(fd) = (unsafe { tokio::io::unix::AsyncFd::register(InotifyFd(inotify)) }) else { return };
    let mut tick = tokio::time::interval(BACKGROUND_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {
                if guard.background.load(Ordering::Acquire) {
                    let g = guard.clone();
                    let _ = tokio::task::spawn_blocking(move || g.check_all_pending()).await;
                }
            }
            ready = fd.readable() => {
                let Ok(mut ready) = ready else { return };
                let events = match fd.get_ref().0.read_events() {
                    Ok(events) => events,
                    Err(nix::errno::Errno::EAGAIN) => { ready.clear_ready(); continue; }
                    Err(_) => return,
                };
                let g = guard.clone();
                let (wds2, events): (Vec<_>, Vec<_>) = (wds.clone(), events);
                // File system work off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || {
                    for ev in events {
                        if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                            g.check_all_pending();
                            continue;
                        }
                        let (Some(name), Some((_, dir))) = (ev.name.as_ref(), wds2.iter().find(|(wd, _)| *wd == ev.wd)) else { continue };
                        if g.matters(dir, name) {
                            g.check_entry(dir, name);
                        }
                    }
                }).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp() -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "pps-protected-{}-{:x}",
            std::process::id(),
            crate::rundir::random_u64()
        ));
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::canonicalize(&p).expect("canonical")
    }

    fn rels(plan: &Plan) -> Vec<(String, bool)> {
        plan.binds.iter().map(|b| (b.rel.to_string_lossy().into_owned(), b.read_only)).collect()
    }

    #[test]
    fn patterns_from_a_list() {
        assert_eq!(
            patterns(Some(".a: b/c ::/d/: ../x")),
            [Pattern::Name(".a".into()), Pattern::Path("b/c".into()), Pattern::Name("d".into())]
        );
        assert!(patterns(Some("")).is_empty());
        assert_eq!(patterns(None).len(), DEFAULT_PROTECTED.len());
        assert!(DEFAULT_PROTECTED.iter().all(|r| !r.reason.is_empty() && !r.name.contains('/')));
    }

    #[test]
    fn every_repository_and_protected_name_is_planned_with_mount_points_above() {
        let p = tmp();
        for d in [".git/hooks", "sub/deep/.git", "sub/.vscode", "lib/tools/hooks", "config/pi", "node_modules/x/.git"] {
            std::fs::create_dir_all(p.join(d)).expect("mkdir");
        }
        std::fs::write(p.join(".git/config"), "[core]\n\thooksPath = lib/tools/hooks\n").expect("write");
        std::fs::write(p.join("sub/deep/.git/config"), "[core]\n").expect("write");
        std::fs::write(p.join("wt.git"), "").expect("write");
        std::fs::create_dir_all(p.join("worktree")).expect("mkdir");
        std::fs::write(p.join("worktree/.git"), "gitdir: /elsewhere/repo.git/worktrees/w\n").expect("write");
        symlink("config/pi", p.join(".pi")).expect("link");
        let plan =
            plan(&p, &patterns(None), scan::DEFAULT_LIMITS, &HostGit::default(), Notes::default()).expect("plan");
        let binds = rels(&plan);
        for (rel, ro) in [
            ("sub", false),
            ("sub/deep", false),
            ("lib", false),
            ("lib/tools", false),
            ("worktree", false),
            ("node_modules", false),
            ("node_modules/x", false),
            (".git", true),
            ("sub/deep/.git", true),
            ("sub/.vscode", true),
            ("lib/tools/hooks", true),
            ("config/pi", true),
            ("worktree/.git", true),
        ] {
            assert!(binds.contains(&(rel.to_string(), ro)), "{rel} ({ro}) not in {binds:?}");
        }
        let first_ro = binds.iter().position(|(_, ro)| *ro).expect("read-only binds");
        assert!(binds[first_ro..].iter().all(|(_, ro)| *ro), "mount points come first: {binds:?}");
        assert!(!binds.iter().any(|(r, _)| r == ".pi"), "a link is not mounted over");
        assert_eq!(plan.guard.links, [(PathBuf::from(".pi"), PathBuf::from("config/pi"))]);
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn a_new_protected_name_is_renamed_in_place_and_a_replaced_link_is_put_back() {
        let p = tmp();
        std::fs::create_dir_all(p.join("sub")).expect("mkdir");
        std::fs::create_dir_all(p.join("config/pi")).expect("mkdir");
        symlink("config/pi", p.join(".pi")).expect("link");
        let plan = plan(
            &p,
            &patterns(Some(".envrc:.git:.pi:tools/hooks")),
            scan::DEFAULT_LIMITS,
            &HostGit::default(),
            Notes::default(),
        )
        .expect("plan");
        let g = &plan.guard;
        assert!(g.check_holders().is_empty() && g.check_all().is_empty(), "nothing new yet");
        std::fs::write(p.join(".envrc"), "evil").expect("write");
        std::fs::write(p.join(".envrc.pi-inert"), "taken").expect("write");
        std::fs::create_dir_all(p.join("sub/.git")).expect("mkdir");
        std::fs::create_dir_all(p.join("tools/hooks")).expect("mkdir");
        std::fs::remove_file(p.join(".pi")).expect("rm");
        std::fs::create_dir_all(p.join(".pi/extensions")).expect("mkdir");
        let notes = g.check_holders().join("\n");
        assert!(notes.contains(".envrc appeared in the project"), "{notes}");
        assert_eq!(std::fs::read_to_string(p.join(".envrc.pi-inert-2")).expect("renamed"), "evil");
        assert!(notes.contains("tools appeared"), "{notes}");
        assert!(p.join("tools.pi-inert/hooks").is_dir());
        assert!(notes.contains("The protected link .pi -> config/pi was replaced"), "{notes}");
        assert_eq!(std::fs::read_link(p.join(".pi")).expect("link"), PathBuf::from("config/pi"));
        assert!(p.join(".pi.pi-inert/extensions").is_dir(), "the replacement is kept, inert");
        assert!(p.join("sub/.git").is_dir(), "the cheap check does not walk");
        let notes = g.check_all().join("\n");
        assert!(notes.contains("sub/.git appeared"), "{notes}");
        assert!(p.join("sub/.git.pi-inert").is_dir() && !p.join("sub/.git").exists());
        // A project grown past the walk's bound is said once, not silently checked in part.
        let small = super::plan(
            &p,
            &patterns(Some(".git")),
            Limits { max_entries: 64, max_depth: 24 },
            &HostGit::default(),
            Notes::default(),
        )
        .expect("plan");
        assert!(small.guard.check_all().iter().all(|n| !n.contains("more than")), "complete so far");
        for i in 0..80 {
            std::fs::write(p.join(format!("junk{i}")), "").expect("write");
        }
        let told: Vec<String> =
            small.guard.check_all().into_iter().filter(|n| n.contains("more than 64 entries")).collect();
        assert_eq!(told.len(), 1, "{told:?}");
        assert!(small.guard.check_all().iter().all(|n| !n.contains("more than")), "told once");
        std::fs::remove_dir_all(&p).expect("cleanup");
    }
}
