//! The guard of a running writable sandbox: it keeps the protected names
//! of the plan protected while the sandbox can write the project, making
//! every name that appears (or is replaced) inert at once, through the
//! checks at the end of each execution, an inotify watch on the
//! directories that hold protected names, and every few seconds a walk
//! (or, while the project's secret watch covers every directory, the
//! protected names that watch saw appear).

use super::*;

/// Keeps the protected names of a running writable sandbox.
#[derive(Debug)]
pub struct Guard {
    pub(super) tree: Tree,
    pub(super) rules: Rules,
    /// What was protected at the start.
    pub(super) found: Found,
    /// Directories that hold protected names: checked cheaply at the end
    /// of every execution and watched in between.
    pub(super) holders: Vec<PathBuf>,
    /// Where notes found between executions go.
    pub(super) pending: Notes,
    pub(super) tainted: Tainted,
    pub(super) walking: AtomicBool,
    /// A walk was asked for while one ran: it runs once more.
    pub(super) again: AtomicBool,
    /// The sandbox's process group and where to say why it was killed:
    /// a name that cannot be made inert, or a project that outgrew the
    /// walk, ends the sandbox.
    pub(super) armed: parking_lot::Mutex<Option<(i32, KillSlot)>>,
    /// What the host may spend on the sandbox (its renames and the
    /// watch's reactions), once armed.
    pub(super) budget: parking_lot::Mutex<Option<std::sync::Arc<Budget>>>,
    /// One repair at a time, its notes handed over before the next: the
    /// check at the end of an execution then waits for the watch's and
    /// finds its notes already in the sink, instead of finding the repair
    /// done and the note still on its way (it would reach a later result).
    pub(super) repairing: parking_lot::Mutex<()>,
    pub scan: Summary,
    /// The project's secret watch, when it runs beside this guard: the
    /// periodic check reads it instead of walking while it covers the
    /// project (see [`Guard::check_periodic`]).
    pub(super) follows: parking_lot::Mutex<Option<std::sync::Arc<SecretWatch>>>,
}

/// How often the whole project is checked while a writable sandbox runs.
pub const BACKGROUND_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// How a check went wrong in a way that ends the sandbox.
enum Breach {
    /// A name could not be made inert.
    Stuck(PathBuf),
    /// The project grew past what a walk can check.
    Outgrown(String),
}

impl Guard {
    /// Directories whose new entries matter (relative paths).
    pub fn holders(&self) -> &[PathBuf] {
        &self.holders
    }

    /// Let the guard end the sandbox `group`, saying why in `killed_for`.
    pub fn arm(&self, group: i32, killed_for: KillSlot) {
        *self.armed.lock() = Some((group, killed_for));
    }

    /// Count the renames and the reactions of this guard against `budget`.
    pub fn set_budget(&self, budget: std::sync::Arc<Budget>) {
        *self.budget.lock() = Some(budget);
    }

    fn budget(&self) -> Option<std::sync::Arc<Budget>> {
        self.budget.lock().clone()
    }

    fn present(&self, rel: &Path) -> Option<Ident> {
        self.found.entries.iter().find(|(r, _, _)| r == rel).map(|(_, _, i)| *i)
    }

    fn is_link(&self, rel: &Path) -> bool {
        self.found.links.iter().any(|(l, _)| l == rel)
    }

    /// Whether a new entry `name` of holder `dir` may be protected.
    pub fn matters(&self, dir: &Path, name: &OsStr) -> bool {
        self.rules.names.contains(name)
            || self.found.expected.iter().any(|e| e.parent() == Some(dir) && e.file_name() == Some(name))
            || self.found.links.iter().any(|(l, _)| l.parent() == Some(dir) && l.file_name() == Some(name))
    }

    /// An entry at `rel` now (with `st`) that is not what was protected.
    fn is_new(&self, rel: &Path, st: &nix::sys::stat::FileStat) -> bool {
        !self.is_link(rel) && self.present(rel) != Some(ident(st))
    }

    /// The cheap check: the protected names of the holder directories,
    /// the expected paths and the links. Returns notes for the user.
    pub fn check_holders(&self) -> Vec<String> {
        let _one = self.repairing.lock();
        let mut notes = Vec::new();
        let mut breaches = Vec::new();
        for holder in &self.holders {
            let Ok(dir) = self.tree.dir(holder) else { continue };
            for name in &self.rules.names {
                let rel = holder.join(name);
                if name == SKILLS && !holds_skills(&self.tree, &rel) {
                    continue;
                }
                if let Ok(Some(st)) = beneath::stat_in(dir.as_fd(), name) {
                    if self.is_new(&rel, &st) {
                        self.inert(&rel, &mut notes, &mut breaches);
                    }
                }
            }
        }
        self.check_expected_and_links(&mut notes, &mut breaches);
        self.breached(breaches, &mut notes);
        notes
    }

    /// The whole check: the walk again, then the expected paths and the
    /// links.
    pub fn check_all(&self) -> Vec<String> {
        self.check_all_into(None)
    }

    /// [`Guard::check_all`]; with `sink`, its notes go there before the
    /// next repair may start.
    fn check_all_into(&self, sink: Option<&Notes>) -> Vec<String> {
        let mut notes = Vec::new();
        let mut breaches = Vec::new();
        let mut new = Vec::new();
        let walked = scan::walk(&self.tree, self.rules.limits, |rel, kind| {
            let Some(name) = rel.file_name() else { return Visit::Descend };
            if self.rules.protects(&self.tree, rel, name) {
                if let Ok(Some(st)) = self.tree.lstat(rel) {
                    if self.is_new(rel, &st) {
                        new.push(rel.to_path_buf());
                    }
                }
                return Visit::Skip;
            }
            if kind == Kind::Dir && name.to_str().is_some_and(|n| scan::DEPENDENCY_DIRS.contains(&n)) {
                return Visit::Skip;
            }
            Visit::Descend
        });
        let _one = self.repairing.lock();
        for rel in &new {
            self.inert(rel, &mut notes, &mut breaches);
        }
        if !walked.complete {
            let why = match &walked.unreadable {
                Some(dir) => format!("{} in the project can no longer be read", crate::display::one_line(&dir)),
                None => format!(
                    "the project grew past {} entries (or deeper than {}) outside dependency trees",
                    self.rules.limits.max_entries, self.rules.limits.max_depth
                ),
            };
            breaches.push(Breach::Outgrown(why));
        }
        self.check_expected_and_links(&mut notes, &mut breaches);
        self.breached(breaches, &mut notes);
        match sink {
            Some(sink) => {
                sink.lock().extend(notes);
                Vec::new()
            }
            None => notes,
        }
    }

    /// [`Guard::check_all`] into the pending notes, on the host's own
    /// schedule (the periodic walk, the end of an execution); a call while
    /// a walk runs makes that walk run once more, charged to the budget.
    pub fn check_all_pending(&self) {
        self.check_all_pending_as(false);
    }

    /// [`Guard::check_all_pending`]; `reaction`: a walk the sandbox's
    /// doing asked for (an overflowed queue), charged to the budget.
    fn check_all_pending_as(&self, reaction: bool) {
        self.again.store(true, Ordering::Release);
        if self.walking.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut charged = reaction;
        while self.again.swap(false, Ordering::AcqRel) {
            match self.budget().filter(|_| charged) {
                Some(b) => drop(b.charge("walking the project again", || self.check_all_into(Some(&self.pending)))),
                None => drop(self.check_all_into(Some(&self.pending))),
            }
            charged = true;
        }
        self.walking.store(false, Ordering::Release);
        // A request that came between the last loop and the release.
        if self.again.load(Ordering::Acquire) {
            self.check_all_pending_as(true);
        }
    }

    /// Let the periodic check read `watch`, the project's secret watch of
    /// the same sandbox (it watches every directory the walk entered).
    pub fn follow(&self, watch: std::sync::Arc<SecretWatch>) {
        *self.follows.lock() = Some(watch);
    }

    /// The check every [`BACKGROUND_CHECK`]: the protected names the
    /// project's secret watch saw appear, made inert where new, while it
    /// covers every directory the walk entered (a large project is not
    /// walked every few seconds); else the whole check.
    pub fn check_periodic(&self) {
        let watch = self.follows.lock().clone();
        if !watch.is_some_and(|w| w.protection_kept(|rels| self.settle_named(rels))) {
            self.check_all_pending();
        }
    }

    /// Check one new entry of a holder directory (from the watch).
    pub fn check_entry(&self, dir: &Path, name: &OsStr) {
        let _one = self.repairing.lock();
        let rel = dir.join(name);
        let mut notes = Vec::new();
        let mut breaches = Vec::new();
        if self.rules.protects(&self.tree, &rel, name) {
            if let Ok(Some(st)) = self.tree.lstat(&rel) {
                if self.is_new(&rel, &st) {
                    self.inert(&rel, &mut notes, &mut breaches);
                }
            }
        }
        self.check_expected_and_links(&mut notes, &mut breaches);
        self.breached(breaches, &mut notes);
        self.pending.lock().extend(notes);
    }

    /// Whether the protected name that appeared at `rel` (a watch saw it)
    /// leaves the project as this plan protects it: gone again (made
    /// inert), not protected (a `skills` directory without a skill), the
    /// planned entry itself, or a protected link pointing where it did.
    /// A `SKILL.md` stands for the `skills` directory two levels up.
    pub fn as_planned(&self, rel: &Path) -> bool {
        let Some(rel) = subject(rel) else { return true };
        if let Some((_, target)) = self.found.links.iter().find(|(l, _)| *l == rel) {
            return self.tree.read_link(&rel).is_ok_and(|now| now == *target);
        }
        let Some(name) = rel.file_name() else { return true };
        match self.tree.lstat(&rel) {
            Ok(None) => true,
            Ok(Some(st)) => {
                let protected = self.rules.protects(&self.tree, &rel, name) || self.found.expected.contains(&rel);
                !(protected && self.is_new(&rel, &st))
            }
            Err(_) => false,
        }
    }

    /// At the end of an execution: make inert each protected name a watch
    /// saw appear at `rels` that is not as planned; whether all of them
    /// are as planned now (else the whole check must run).
    pub fn settle_named(&self, rels: &[PathBuf]) -> bool {
        for rel in rels {
            if !self.as_planned(rel) {
                if let Some(subject) = subject(rel) {
                    if let Some(name) = subject.file_name() {
                        self.check_entry(subject.parent().unwrap_or(Path::new("")), name);
                    }
                }
            }
        }
        rels.iter().all(|r| self.as_planned(r))
    }

    /// Whether the project still holds exactly what this sandbox
    /// protected (a spare is only used when it does).
    pub fn still_matches(&self) -> bool {
        matches!(self.rules.discover(&self.tree), Ok((found, _)) if found == self.found)
    }

    fn check_expected_and_links(&self, notes: &mut Vec<String>, breaches: &mut Vec<Breach>) {
        for rel in &self.found.expected {
            if let Ok(Some(_)) = self.tree.lstat(rel) {
                self.inert(rel, notes, breaches);
            }
        }
        for (rel, target) in &self.found.links {
            match self.tree.read_link(rel) {
                Ok(now) if now == *target => continue,
                _ => {}
            }
            if let Ok(Some(_)) = self.tree.lstat(rel) {
                self.inert(rel, notes, breaches);
            }
            let restored = match self.tree.symlink(target, rel) {
                Ok(()) => "it was put back".to_string(),
                Err(e) => format!(
                    "it could NOT be put back ({e}): check {} before using the project",
                    shell_path(self.tree.path(), rel)
                ),
            };
            notes.push(format!(
                "The protected link {} -> {} was replaced in the project; {restored}.",
                crate::display::one_line(&rel),
                crate::display::one_line(&target)
            ));
        }
    }

    /// End the sandbox for what cannot be kept safe while it runs.
    fn breached(&self, breaches: Vec<Breach>, notes: &mut Vec<String>) {
        if breaches.is_empty() {
            return;
        }
        let mut why = Vec::new();
        for b in breaches {
            match b {
                Breach::Stuck(rel) => {
                    let mut t = self.tainted.lock();
                    if !t.contains(&rel) {
                        t.push(rel.clone());
                    }
                    why.push(format!("{} could not be made inert", crate::display::one_line(&rel)));
                }
                Breach::Outgrown(w) => why.push(w),
            }
        }
        let why = why.join("; ");
        if let Some((group, killed_for)) = &*self.armed.lock() {
            killed_for.lock().get_or_insert_with(|| super::HostKill::Breach(why.clone()));
            crate::spawn::kill_group(*group);
        }
        notes.push(format!("The sandbox was stopped: {why}. Until that is resolved the project is mounted read-only."));
    }

    /// Rename `rel` in place to an inert name (`NAME.pi-inert`, else with a
    /// random suffix). A parent the sandbox made unwritable is made
    /// writable again first (the host owns it). A name that cannot be
    /// renamed is a breach.
    fn inert(&self, rel: &Path, notes: &mut Vec<String>, breaches: &mut Vec<Breach>) {
        let (dir, name) = match self.tree.parent(rel) {
            Ok(p) => p,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
            Err(e) => {
                notes.push(format!(
                    "{} appeared in the project but could NOT be made inert ({e})",
                    crate::display::one_line(&rel)
                ));
                breaches.push(Breach::Stuck(rel.to_path_buf()));
                return;
            }
        };
        let candidates = (0..8).map(|n| {
            let mut new = name.clone();
            new.push(INERT_MARK);
            if n > 0 {
                new.push(format!("-{:08x}", crate::random::random_u64() as u32));
            }
            new
        });
        let mut last_err = None;
        let mut fixed_parent = false;
        for new in candidates {
            let mut tried = beneath::rename_noreplace(dir.as_fd(), &name, &new);
            if matches!(&tried, Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)))
                && !fixed_parent
            {
                fixed_parent = true;
                if make_writable(&self.tree, rel.parent().unwrap_or(Path::new(""))).is_ok() {
                    tried = beneath::rename_noreplace(dir.as_fd(), &name, &new);
                }
            }
            match tried {
                Ok(()) => {
                    if let Some(b) = self.budget() {
                        b.renamed(rel);
                    }
                    let moved = rel.with_file_name(&new);
                    notes.push(format!(
                        "{} appeared in the project while the sandbox could write it; host tools could run code from it, \
                         so it was renamed to {}. If you made it yourself, restore it with: mv {} {}",
                        crate::display::one_line(&rel),
                        crate::display::one_line(&moved),
                        shell_path(self.tree.path(), &moved),
                        shell_path(self.tree.path(), rel)
                    ));
                    return;
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last_err = Some(e),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
                Err(e) => {
                    last_err = Some(e);
                    break;
                }
            }
        }
        let e = last_err.map(|e| e.to_string()).unwrap_or_default();
        notes.push(format!(
            "{} appeared in the project but could NOT be made inert ({e}): check {} before using the project",
            crate::display::one_line(&rel),
            shell_path(self.tree.path(), rel)
        ));
        breaches.push(Breach::Stuck(rel.to_path_buf()));
    }
}

/// What a protected name that appeared at `rel` is about: itself, or for
/// a `SKILL.md` the `skills` directory it makes a pi skill (none when
/// there is none).
fn subject(rel: &Path) -> Option<PathBuf> {
    if rel.file_name().is_none_or(|n| n != SKILL_FILE) {
        return Some(rel.to_path_buf());
    }
    let skills = rel.parent()?.parent()?;
    (skills.file_name()? == SKILLS).then(|| skills.to_path_buf())
}

/// The guard's inotify instance and its watches on the holder
/// directories, made before the sandbox starts: what code in the sandbox
/// does with its user's inotify budget afterwards cannot take them away.
#[derive(Debug)]
pub struct Watcher {
    inotify: nix::sys::inotify::Inotify,
    wds: Vec<(nix::sys::inotify::WatchDescriptor, PathBuf)>,
}

/// How the guard gets its inotify instance: `inotify_init1` (a
/// parameter, so that a test can make it fail).
pub type InotifyInit = fn() -> nix::Result<nix::sys::inotify::Inotify>;

/// The real [`InotifyInit`].
pub fn inotify_init() -> nix::Result<nix::sys::inotify::Inotify> {
    use nix::sys::inotify::{InitFlags, Inotify};
    Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
}

impl Watcher {
    /// The instance alone (the watches come with the plan, see
    /// [`Watcher::watch_holders`]).
    pub fn new(init: InotifyInit) -> nix::Result<Watcher> {
        Ok(Watcher { inotify: init()?, wds: Vec::new() })
    }

    /// Watch the holder directories of `guard`, through the directories'
    /// own fds, so that a directory swapped for a link is never followed.
    /// A directory that is gone is skipped (the walk sees what comes in
    /// its place); a watch the kernel refuses for want of budget is an
    /// error.
    pub fn watch_holders(&mut self, guard: &Guard) -> nix::Result<()> {
        use nix::sys::inotify::AddWatchFlags;
        for holder in guard.holders() {
            let Ok(dir) = guard.tree.dir(holder) else { continue };
            let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
            let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR;
            match self.inotify.add_watch(path.as_str(), flags) {
                Ok(wd) => self.wds.push((wd, holder.clone())),
                Err(e @ (nix::errno::Errno::ENOSPC | nix::errno::Errno::ENOMEM)) => return Err(e),
                Err(_) => continue,
            }
        }
        Ok(())
    }
}

/// Keep `guard` until `stop` fires: the periodic check every
/// [`BACKGROUND_CHECK`], always (see [`Guard::check_periodic`]), and in between the new entries of the
/// holder directories that `watcher` reports (an overflowed queue
/// triggers the whole check). Without a watcher, or once its instance
/// fails, the periodic walk goes on alone. The reactions are charged to
/// the guard's budget and paced (see `budget`).
pub async fn watch(
    guard: std::sync::Arc<Guard>,
    watcher: Option<Watcher>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    use nix::sys::inotify::AddWatchFlags;
    let (inotify, wds) = match watcher {
        Some(Watcher { inotify, wds }) => (crate::inotify::Inotified::new(inotify).map(std::sync::Arc::new), wds),
        None => (None, Vec::new()),
    };
    if inotify.is_none() {
        tracing::warn!("no inotify: protected names are checked every few seconds and at the end of each execution");
    }
    let mut inotify = inotify;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + BACKGROUND_CHECK, BACKGROUND_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let wds = std::sync::Arc::new(wds);
    // Events were left in the queue by the last batch.
    let mut more = false;
    loop {
        let woke = if more {
            true
        } else {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => false,
                ready = wait_events(inotify.as_deref()) => ready,
            }
        };
        if !woke {
            let g = guard.clone();
            let _ = tokio::task::spawn_blocking(move || g.check_periodic()).await;
            continue;
        }
        let Some(instance) = inotify.clone() else {
            more = false;
            continue;
        };
        let (g, wds) = (guard.clone(), wds.clone());
        // The reads and the file system work off the runtime's threads,
        // measured; a batch is bounded, what is left waits for the next.
        let batch = tokio::task::spawn_blocking(move || {
            let react = || {
                let mut overflow = false;
                for _ in 0..BATCH_READS {
                    let events = match instance.get().read_events() {
                        Ok(events) => events,
                        Err(nix::errno::Errno::EAGAIN) => return Batch::Done { overflow },
                        Err(_) => return Batch::Failed,
                    };
                    for ev in events {
                        if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                            overflow = true;
                            continue;
                        }
                        let (Some(name), Some((_, dir))) = (ev.name.as_ref(), wds.iter().find(|(wd, _)| *wd == ev.wd))
                        else {
                            continue;
                        };
                        if g.matters(dir, name) {
                            g.check_entry(dir, name);
                        }
                    }
                }
                Batch::More { overflow }
            };
            let batch = match g.budget() {
                Some(b) => b.charge("renaming protected names", react),
                None => react(),
            };
            if matches!(batch, Batch::Done { overflow: true } | Batch::More { overflow: true }) {
                g.check_all_pending_as(true);
            }
            batch
        })
        .await
        .unwrap_or(Batch::Failed);
        more = matches!(batch, Batch::More { .. });
        if guard.budget().is_some_and(|b| b.exceeded()) {
            // The budget stopped the sandbox: its queue is not worth the
            // host's time any more. One last walk, once its processes had
            // the time to die, makes inert what it left.
            tokio::time::sleep(LAST_WALK_AFTER).await;
            let g = guard.clone();
            let _ = tokio::task::spawn_blocking(move || g.check_all_pending()).await;
            return;
        }
        if batch == Batch::Failed {
            // The instance failed: the periodic walk goes on alone.
            inotify = None;
            continue;
        }
        // Paced: what comes meanwhile waits in the kernel's queue.
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(super::budget::PACE) => {}
        }
    }
}

/// How long after the budget stopped a sandbox the guard walks the last
/// time (a killed process group is gone within milliseconds).
const LAST_WALK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Reads of the queue in one batch of the guard's reactions.
const BATCH_READS: usize = 16;

/// How one batch of the guard's reactions ended.
#[derive(Debug, PartialEq, Eq)]
enum Batch {
    /// The queue is empty.
    Done { overflow: bool },
    /// Events are left.
    More { overflow: bool },
    /// The instance failed.
    Failed,
}

/// Wait until `inotify` has events (`true`); never, without one, and
/// never again once it failed.
async fn wait_events(inotify: Option<&crate::inotify::Inotified>) -> bool {
    match inotify {
        Some(i) if i.wait().await => true,
        _ => std::future::pending().await,
    }
}

/// Blocking: wait (bounded) for a killed sandbox's init to exit (the
/// kernel ends every other process of the namespace before it does), so
/// that no process of it can still create a name, then walk the project
/// afresh for protected names it left.
pub fn settle_and_check(guard: &Guard, init: Option<i32>, notes: &Notes) {
    if let Some(init) = init {
        let until = std::time::Instant::now() + crate::limits::CLEANUP_DEADLINE;
        while !crate::spawn::exited(init) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let found = guard.check_all();
    notes.lock().extend(found);
}
