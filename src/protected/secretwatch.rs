//! The watch on a project's secrets while a sandbox runs, in every mode:
//! a name that looks like a secret (or a new name of a masked file's
//! inode) appearing in the project means the sandbox's masks are stale.
//! The sandbox is then stopped (the watch kills it the moment inotify
//! reports the name, and the check before every execution drains the same
//! queue, so no execution starts on a stale plan), and the next sandbox is
//! planned afresh, with the new secret masked.
//!
//! The watches are added during the start's one walk, on each directory
//! before it is listed (so nothing made in between is missed), through the
//! directory's own fd (a planted link is never followed). Directories that
//! appear later are watched and listed in turn, up to [`MAX_WATCHES`]; past
//! that, or when inotify is not available or its queue overflowed, the
//! check before each execution walks the project again instead (and the
//! watch's own reactions at most every [`BACKGROUND_CHECK`]).
//!
//! The reactions are charged to the sandbox's budget (see `budget`): a
//! sandbox that keeps the watch busy is stopped.
//!
//! What is not watched, as the walk does not mask there: dependency trees,
//! protected directories, and the inside of a masked directory. A
//! protected name in a writable mode is the guard's (it makes it inert).

use std::collections::HashMap;

use crate::display::one_line;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};

use super::*;

/// Most directories one sandbox's watch holds (each is one inotify watch
/// of the user's budget, `fs.inotify.max_user_watches`).
pub const MAX_WATCHES: usize = 65_536;

/// Most protected names that appeared a watch keeps for the guard to
/// judge (see [`SecretWatch::protection_kept`]); past it the project is
/// walked again.
const MAX_NAMED: usize = 256;

/// Git's files that say where a repository's hooks are
/// (`core.hooksPath`): one made, removed or moved inside a protected
/// entry changes what the plan protects.
const GIT_CONFIG_NAMES: &[&str] = &["config", "config.worktree", "commondir"];

/// Most entries the watch lists in new directories over a sandbox's life
/// (each directory counts as one more); past it the check before each
/// execution walks instead.
pub const MAX_LISTED: usize = 200_000;

/// Reads of the queue in one batch of the watch's reactions.
const BATCH_READS: usize = 16;

/// Reads of the queue before an execution: a queue that fills faster is
/// not drained, the project is walked instead.
const DRAIN_READS: usize = 256;

/// Added through `/proc/self/fd/N` of the directory's own fd (a magic
/// link to what was opened beneath the project, so it is followed).
/// Names removed or moved away matter only to a writable project's
/// protection (see [`SecretWatch::protection_kept`]).
const FLAGS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

/// Why a start's masks are stale: what appeared in the project, by its
/// host path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// A path on the host-secret list.
    #[error("{} is a host secret and appeared in the project", one_line(.0))]
    HostSecret(PathBuf),
    /// A name that looks like a secret.
    #[error("{} looks like a secret and appeared in the project", one_line(.0))]
    Secret(PathBuf),
    /// A new name of a masked file's inode.
    #[error("{} is a new name (a hard link) of a masked secret", one_line(.0))]
    HardLink(PathBuf),
}

/// The watches added during a start's walk (see `plan_start`).
pub struct Watching {
    inotify: Option<Inotify>,
    wds: HashMap<WatchDescriptor, PathBuf>,
    /// Every directory the walk entered is watched.
    complete: bool,
}

impl std::fmt::Debug for Watching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watching").field("watches", &self.wds.len()).field("complete", &self.complete).finish()
    }
}

impl Watching {
    pub(super) fn new() -> Watching {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok();
        let complete = inotify.is_some();
        Watching { inotify, wds: HashMap::new(), complete }
    }

    /// Watch directory `rel`, open as `fd` (before it is listed).
    pub(super) fn add_fd(&mut self, rel: &Path, fd: std::os::fd::BorrowedFd<'_>) {
        let Some(inotify) = &self.inotify else { return };
        if self.wds.len() >= MAX_WATCHES {
            self.complete = false;
            return;
        }
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        match inotify.add_watch(path.as_str(), FLAGS) {
            Ok(wd) => {
                self.wds.insert(wd, rel.to_path_buf());
            }
            // The user's watch budget is used up: the check before each
            // execution walks instead.
            Err(_) => self.complete = false,
        }
    }

    /// Inotify watches in use.
    pub fn watches(&self) -> usize {
        self.wds.len()
    }
}

/// What the watch compares the project with: the start's plan.
pub(super) struct Plan {
    pub(super) tree: Tree,
    pub(super) rules: Rules,
    pub(super) secrets: SecretRules,
    /// The host-secret list, masked in the project too.
    pub(super) host: HostSecrets,
    /// Its last components (see `hostsecrets::Leaves`).
    pub(super) leaves: crate::hostsecrets::Leaves,
    /// The masked and unmasked secrets of the start.
    pub(super) report: MaskReport,
    /// (device, inode) of every masked file.
    pub(super) idents: HashSet<Ident>,
    pub(super) writable: bool,
    /// A writable project's protected entries and links (see [`Guarded`]).
    pub(super) guarded: Guarded,
}

/// What a writable project's plan protects, as the watch looks at events:
/// a name removed or moved away here changes the plan.
#[derive(Debug, Default)]
pub(super) struct Guarded {
    /// The protected entries and links.
    pub(super) entries: HashSet<PathBuf>,
    /// Those, the directories above them and above each expected name.
    pub(super) removal: HashSet<PathBuf>,
}

impl Guarded {
    pub(super) fn of(found: &Found) -> Guarded {
        let mut g = Guarded::default();
        for rel in found.entries.iter().map(|(r, _, _)| r).chain(found.links.iter().map(|(l, _)| l)) {
            g.entries.insert(rel.clone());
            g.removal.extend(rel.ancestors().map(Path::to_path_buf));
        }
        for rel in &found.expected {
            g.removal.extend(rel.ancestors().skip(1).map(Path::to_path_buf));
        }
        g
    }
}

struct State {
    wds: HashMap<WatchDescriptor, PathBuf>,
    complete: bool,
    /// Entries listed in new directories so far (bounded by
    /// [`MAX_LISTED`]: a sandbox moving a tree to and fro cannot make the
    /// host list it without end).
    listed: usize,
    /// Why the plan is stale, once it is (it stays so).
    stale: Option<String>,
    /// When a reaction last walked the project.
    walked: Option<std::time::Instant>,
    /// A writable project: a protected entry, a directory above one or a
    /// git configuration file in one was removed, moved or made since the
    /// walk, or more protected names appeared than are kept (it stays so).
    replan: bool,
    /// Protected names that appeared since the guard last judged them.
    named: Vec<PathBuf>,
}

/// A running sandbox's watch on the project's secrets.
pub struct SecretWatch {
    plan: Plan,
    inotify: Option<crate::inotify::Inotified>,
    raw: Option<Inotify>,
    state: parking_lot::Mutex<State>,
}

impl std::fmt::Debug for SecretWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretWatch").finish_non_exhaustive()
    }
}

impl SecretWatch {
    pub(super) fn new(watching: Watching, plan: Plan) -> SecretWatch {
        let Watching { inotify, wds, complete } = watching;
        SecretWatch {
            plan,
            inotify: None,
            raw: inotify,
            state: parking_lot::Mutex::new(State {
                wds,
                complete,
                listed: 0,
                stale: None,
                walked: None,
                replan: false,
                named: Vec::new(),
            }),
        }
    }

    /// Inotify watches in use.
    pub fn watches(&self) -> usize {
        self.state.lock().wds.len()
    }

    /// Register the inotify instance with tokio (from the runtime).
    pub fn register(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.inotify = crate::inotify::Inotified::new(raw);
            if self.inotify.is_none() {
                self.state.lock().complete = false;
            }
        }
    }

    fn instance(&self) -> Option<&Inotify> {
        self.inotify.as_ref().map(|i| i.get()).or(self.raw.as_ref())
    }

    /// What is queued now (non-blocking).
    fn read_events(&self) -> Vec<InotifyEvent> {
        self.instance().and_then(|i| i.read_events().ok()).unwrap_or_default()
    }

    /// Blocking: whether the start's masks are stale, and why. Reads what
    /// inotify queued (every name made before this call is in the queue);
    /// walks the project when the watch does not cover all of it, or when
    /// the queue fills faster than it is read.
    pub fn stale(&self) -> Option<String> {
        let mut state = self.state.lock();
        if state.stale.is_some() {
            return state.stale.clone();
        }
        let drained = match self.drain(&mut state, DRAIN_READS) {
            Err(why) => {
                state.stale = Some(why.to_string());
                return state.stale.clone();
            }
            Ok(drained) => drained,
        };
        if !drained || !state.complete {
            state.stale = self.walk_again();
        }
        state.stale.clone()
    }

    /// Blocking: one batch of the watch's reactions (at most
    /// [`BATCH_READS`] reads of the queue): why the masks are stale, or
    /// whether events are left. Where the watch does not cover the whole
    /// project, the project is walked again at most every
    /// [`BACKGROUND_CHECK`] (the check before each execution always walks).
    fn react(&self) -> (Option<String>, bool) {
        let mut state = self.state.lock();
        if state.stale.is_some() {
            return (state.stale.clone(), false);
        }
        let drained = match self.drain(&mut state, BATCH_READS) {
            Err(why) => {
                state.stale = Some(why.to_string());
                return (state.stale.clone(), false);
            }
            Ok(drained) => drained,
        };
        let due = state.walked.is_none_or(|at| at.elapsed() >= BACKGROUND_CHECK);
        if !state.complete && due {
            state.walked = Some(std::time::Instant::now());
            drop(state);
            let found = self.walk_again();
            let mut state = self.state.lock();
            if state.stale.is_none() {
                state.stale = found;
            }
            return (state.stale.clone(), !drained);
        }
        (None, !drained)
    }

    /// Read and look at what the queue holds, at most `reads` times:
    /// whether it is empty now, or why the masks are stale.
    fn drain(&self, state: &mut State, reads: usize) -> Result<bool, Stale> {
        for _ in 0..reads {
            let events = self.read_events();
            if events.is_empty() {
                return Ok(true);
            }
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    state.complete = false;
                    continue;
                }
                if self.plan.writable {
                    if let Some(dir) = state.wds.get(&ev.wd).cloned() {
                        let rel = ev.name.as_ref().map_or(dir.clone(), |n| dir.join(n));
                        self.protection_event(state, &rel, ev.mask);
                    }
                }
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    state.wds.remove(&ev.wd);
                    continue;
                }
                if !ev.mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
                    continue;
                }
                let (Some(dir), Some(name)) = (state.wds.get(&ev.wd).cloned(), ev.name) else { continue };
                let is_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR);
                if let Some(why) = self.look(state, &dir.join(&name), is_dir) {
                    return Err(why);
                }
            }
        }
        Ok(false)
    }

    /// Blocking: whether a writable project's protection is still the
    /// walk's: every directory the walk entered watched and the queue
    /// drained without an overflow, no protected entry, directory above
    /// one or git configuration file in one removed, moved or made, and
    /// every protected name that appeared since judged by `planned` (the
    /// guard: at the end of a command it makes them inert first; between
    /// commands one the host made means the walk must bind it). Names made
    /// and removed elsewhere (`touch x`, a build's output) keep the walk.
    pub fn protection_kept(&self, planned: impl FnOnce(&[PathBuf]) -> bool) -> bool {
        let mut state = self.state.lock();
        if state.stale.is_some() {
            return false;
        }
        match self.drain(&mut state, DRAIN_READS) {
            Err(why) => {
                state.stale = Some(why.to_string());
                return false;
            }
            Ok(drained) if !drained || !state.complete || state.replan => return false,
            Ok(_) => {}
        }
        if state.named.is_empty() || planned(&state.named) {
            state.named.clear();
            return true;
        }
        false
    }

    /// What event `mask` on `rel` means for a writable project's plan.
    fn protection_event(&self, state: &mut State, rel: &Path, mask: AddWatchFlags) {
        let g = &self.plan.guarded;
        let gone = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        let name = rel.file_name().unwrap_or_default();
        let git_config = name.to_str().is_some_and(|n| GIT_CONFIG_NAMES.contains(&n))
            && rel.ancestors().skip(1).any(|a| g.entries.contains(a));
        if git_config || (mask.intersects(gone) && g.removal.contains(rel)) {
            state.replan = true;
            return;
        }
        if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
            && (g.removal.contains(rel) || self.plan.rules.names.contains(name) || name == SKILL_FILE)
        {
            self.name_appeared(state, rel);
        }
    }

    /// Keep `rel` for the guard to judge (bounded).
    fn name_appeared(&self, state: &mut State, rel: &Path) {
        if state.named.len() >= MAX_NAMED {
            state.replan = true;
        } else if !state.named.iter().any(|n| n == rel) {
            state.named.push(rel.to_path_buf());
        }
    }

    /// One new entry `rel` (a directory by the event's word when it is
    /// already gone): a secret by name, a new name of a masked file, or a
    /// directory to watch and look into.
    fn look(&self, state: &mut State, rel: &Path, is_dir: bool) -> Option<Stale> {
        let p = &self.plan;
        let name = rel.file_name()?;
        let st = p.tree.lstat(rel).ok().flatten();
        let kind = match &st {
            Some(st) => Kind::of(st),
            None if is_dir => Kind::Dir,
            None => Kind::File,
        };
        if p.writable && p.rules.protects(&p.tree, rel, name) {
            return None;
        }
        let host = p.tree.path().join(rel);
        let allowed = p.report.unmasked.iter().any(|m| rel.starts_with(&m.rel));
        if p.host.matches_in_tree_with(&p.leaves, p.tree.path(), rel) {
            return Some(Stale::HostSecret(host));
        }
        if p.secrets.matches(name, kind) && !allowed {
            return Some(Stale::Secret(host));
        }
        if let Some(st) = &st {
            if kind == Kind::File && p.idents.contains(&ident(st)) && !p.report.hides(&sandbox(rel)) {
                return Some(Stale::HardLink(host));
            }
        }
        if kind != Kind::Dir || p.rules.protects(&p.tree, rel, name) || is_dependency(name) {
            return None;
        }
        // A new directory: watched, then listed (what was made in it
        // before the watch is seen by the listing).
        let mut queue = std::collections::VecDeque::from([rel.to_path_buf()]);
        while let Some(dir) = queue.pop_front() {
            if state.wds.len() >= MAX_WATCHES || state.listed >= MAX_LISTED {
                state.complete = false;
                return None;
            }
            match self.instance().and_then(|i| add_watch(i, &p.tree, &dir)) {
                Some(wd) => {
                    state.wds.insert(wd, dir.clone());
                }
                None => state.complete = false,
            }
            let room = MAX_LISTED - state.listed;
            let Ok((entries, more)) = p.tree.list(&dir, room) else { continue };
            // The directory itself counts: empty ones made and removed
            // without end are bounded too.
            state.listed += entries.len() + 1;
            if more {
                state.complete = false;
            }
            for (n, k) in entries {
                let child = dir.join(&n);
                if p.writable && (p.rules.names.contains(&n) || n == SKILL_FILE) {
                    self.name_appeared(state, &child);
                }
                if p.writable && p.rules.protects(&p.tree, &child, &n) {
                    continue;
                }
                let on_host_list = p.host.matches_in_tree_with(&p.leaves, p.tree.path(), &child);
                if on_host_list
                    || (p.secrets.matches(&n, k) && !p.report.unmasked.iter().any(|m| child.starts_with(&m.rel)))
                {
                    return Some(Stale::Secret(p.tree.path().join(&child)));
                }
                if k == Kind::File && !p.idents.is_empty() {
                    if let Ok(Some(st)) = p.tree.lstat(&child) {
                        if p.idents.contains(&ident(&st)) {
                            return Some(Stale::HardLink(p.tree.path().join(&child)));
                        }
                    }
                }
                if k == Kind::Dir && !p.rules.protects(&p.tree, &child, &n) && !is_dependency(&n) {
                    queue.push_back(child);
                }
            }
        }
        None
    }

    /// The whole walk of a start again: a secret the masks miss.
    fn walk_again(&self) -> Option<String> {
        let p = &self.plan;
        let survey = p.rules.survey(&p.tree, &p.secrets, &p.host, None);
        let found = mask_list(&p.tree, &survey.secrets);
        let known = |rel: &Path| {
            p.report.masked.iter().chain(&p.report.unmasked).any(|m| rel == m.rel || (m.dir && rel.starts_with(&m.rel)))
        };
        found.into_iter().find(|m| !known(&m.rel)).map(|m| Stale::Secret(p.tree.path().join(&m.rel)).to_string())
    }

    /// Until `stop` fires: when the plan turns stale, `stale` is called
    /// once (it kills the sandbox) and the watch ends. The reactions are
    /// charged to `budget` and paced (see `budget`).
    pub async fn run(
        self: std::sync::Arc<Self>,
        stale: impl FnOnce(String) + Send + 'static,
        budget: std::sync::Arc<Budget>,
        mut stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let Some(inotify) = &self.inotify else { return };
        let mut more = false;
        loop {
            if !more {
                tokio::select! {
                    _ = &mut stop => return,
                    ready = inotify.wait() => {
                        if !ready {
                            return;
                        }
                    }
                }
            }
            let (me, b) = (self.clone(), budget.clone());
            let Ok((found, left)) =
                tokio::task::spawn_blocking(move || b.charge("looking for secrets in new names", || me.react())).await
            else {
                return;
            };
            if let Some(why) = found {
                stale(why);
                return;
            }
            if budget.exceeded() {
                return;
            }
            more = left;
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(super::budget::PACE) => {}
            }
        }
    }
}

fn is_dependency(name: &OsStr) -> bool {
    name.to_str().is_some_and(|n| scan::DEPENDENCY_DIRS.contains(&n))
}

fn sandbox(rel: &Path) -> PathBuf {
    Path::new(crate::bwrap::WORKSPACE).join(rel)
}

/// Watch directory `rel` of `tree` through its own fd.
fn add_watch(inotify: &Inotify, tree: &Tree, rel: &Path) -> Option<WatchDescriptor> {
    let fd = tree.dir(rel).ok()?;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    inotify.add_watch(path.as_str(), FLAGS).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_reason_says_what_appeared_on_one_line() {
        let path = || PathBuf::from("/p/a\nb");
        assert_eq!(Stale::HostSecret(path()).to_string(), "/p/a␊b is a host secret and appeared in the project");
        assert_eq!(Stale::Secret(path()).to_string(), "/p/a␊b looks like a secret and appeared in the project");
        assert_eq!(Stale::HardLink(path()).to_string(), "/p/a␊b is a new name (a hard link) of a masked secret");
    }
}
