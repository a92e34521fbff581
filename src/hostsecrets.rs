//! Host secrets: paths that no read grant mounts.
//!
//! The project, a read root, an allow-once grant or a virtual environment
//! shows host paths inside the sandbox. Some host paths hold credentials
//! that nothing should carry along: the shadow and sudoers files, SSH host
//! keys, every home's `.ssh`, the coding agents' logins, cloud, registry and
//! database credentials, shell and REPL histories. This module keeps that
//! list (data, a reason per entry) and answers three questions: is a grant
//! itself such a path (then it is refused), which of them lie inside a
//! granted directory (then each is masked: an empty read-only directory or
//! an empty file over it), and is an entry of a walked tree one of them
//! (the project walk of `protected` masks it, whatever the project's
//! secret patterns say).
//!
//! Entries are absolute paths, or `~/...`: a path in a home, which applies
//! to every home: the process's, `/root`, every directory under `/home`,
//! every home in `/etc/passwd`, a granted directory itself (it may be a
//! home), and any directory of a walked tree. The last component may hold
//! `*` (any run of characters but `/`). `PI_SANDBOX_HOST_SECRETS` adds
//! entries (colon separated).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod cache;
mod kept;
pub use kept::{check_anew, KeptReads, ReadsCheck};

/// Extra entries, colon separated, added to [`DEFAULT_HOST_SECRETS`].
pub const HOST_SECRETS_ENV: &str = "PI_SANDBOX_HOST_SECRETS";

mod list;
pub use list::DEFAULT_HOST_SECRETS;

/// One entry: a directory and a last component (literal or with `*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub dir: PathBuf,
    pub leaf: String,
}

impl Entry {
    fn matches_leaf(&self, name: &str) -> bool {
        glob_match(&self.leaf, name)
    }

    /// The entry as the user would write it.
    pub fn shown(&self) -> String {
        self.dir.join(&self.leaf).display().to_string()
    }
}

/// The list in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSecrets {
    pub entries: Vec<Entry>,
    /// The `~/` entries as paths inside a home (plain names, the last may
    /// hold `*`): matched in every home and every directory of a walk.
    pub in_home: Vec<Vec<String>>,
}

/// A list's entries by directory (see [`HostSecrets::coverer`]).
pub struct Coverer<'a> {
    entries: &'a [Entry],
    by_dir: HashMap<&'a Path, Vec<usize>>,
}

impl Coverer<'_> {
    /// The same entry as [`HostSecrets::covering`]: the first in the list
    /// whose directory is a proper ancestor of `path` (component by
    /// component, as `Path` compares and hashes) and whose leaf matches the
    /// component right below it.
    pub fn covering(&self, path: &Path) -> Option<&Entry> {
        let mut first: Option<usize> = None;
        for at in path.ancestors() {
            let (Some(dir), Some(name)) = (at.parent(), at.file_name()) else { continue };
            let Some(list) = self.by_dir.get(dir) else { continue };
            let name = name.to_string_lossy();
            if let Some(&i) = list.iter().find(|&&i| self.entries[i].matches_leaf(&name)) {
                first = Some(first.map_or(i, |f| f.min(i)));
            }
        }
        first.map(|i| &self.entries[i])
    }
}

/// The home directories on this host besides the process's: `/root`,
/// every directory under `/home`, every home of `/etc/passwd` (except `/`).
pub fn system_homes() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("/root")];
    if let Ok(list) = std::fs::read_dir("/home") {
        let mut dirs: Vec<PathBuf> =
            list.flatten().filter(|d| d.file_type().is_ok_and(|t| t.is_dir())).map(|d| d.path()).collect();
        dirs.sort();
        out.extend(dirs);
    }
    // Bounded: a passwd file is small; a huge one is not read further.
    let passwd = std::fs::File::open("/etc/passwd")
        .and_then(|f| crate::beneath::read_bounded(std::os::fd::OwnedFd::from(f), 1 << 20))
        .unwrap_or_default();
    for line in String::from_utf8_lossy(&passwd).lines() {
        let Some(home) = line.split(':').nth(5) else { continue };
        let Some(home) = crate::paths::normalize(home) else { continue };
        if home != Path::new("/") && !out.contains(&home) && home.is_dir() {
            out.push(home);
        }
    }
    out
}

/// A path inside a granted directory to hide.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mask {
    pub path: PathBuf,
    pub is_dir: bool,
}

/// The last components of a list's entries: a walk passes over a name
/// that ends none of them with one lookup (a project walk looks at every
/// name, and matching each against every entry of the list was most of
/// its time), and runs the whole match only for the names that could be
/// one.
#[derive(Debug, Clone, Default)]
pub struct Leaves {
    literal: std::collections::HashSet<String>,
    globs: Vec<String>,
}

impl Leaves {
    /// Whether `leaf` could end an entry.
    pub fn may_match(&self, leaf: &str) -> bool {
        self.literal.contains(leaf) || self.globs.iter().any(|g| glob_match(g, leaf))
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    // Without allocating: this runs for every entry at every name a watch
    // sees appear.
    let Some((first, rest)) = pattern.split_once('*') else { return pattern == name };
    let (middle, last) = rest.rsplit_once('*').unwrap_or(("", rest));
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut left = &name[first.len()..name.len() - last.len()];
    for part in middle.split('*').filter(|p| !p.is_empty()) {
        match left.find(part) {
            Some(i) => left = &left[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// A build's look at the host: each directory resolved and listed once.
struct Walk<'r, 'a> {
    resolver: &'r mut crate::paths::Resolver<'a>,
    /// Directory as written -> where it resolves (`None`: it does not).
    real: std::collections::HashMap<PathBuf, Option<PathBuf>>,
    /// Canonical directory -> the names of the links in it.
    listed: std::collections::HashMap<PathBuf, std::collections::HashSet<std::ffi::OsString>>,
}

impl Walk<'_, '_> {
    /// Where `dir` (absolute, normalised) resolves: its parent's
    /// resolution and one look at its last component, which is followed
    /// by the resolver when it is a link (never through a tree the sandbox
    /// writes, by path or by device and inode).
    fn real_dir(&mut self, dir: &Path) -> Option<PathBuf> {
        if let Some(known) = self.real.get(dir) {
            return known.clone();
        }
        let real = match (dir.parent(), dir.file_name()) {
            (Some(parent), Some(name)) => self.real_dir(parent).and_then(|above| {
                let next = above.join(name);
                if self.resolver.in_tree(&next) {
                    return None;
                }
                let meta = self.resolver.lstat(&next).ok()?;
                if self.resolver.is_tree_root(&meta) {
                    None
                } else if meta.file_type().is_symlink() {
                    self.resolver.resolve(&next).ok()
                } else {
                    Some(next)
                }
            }),
            _ => Some(dir.to_path_buf()),
        };
        self.real.insert(dir.to_path_buf(), real.clone());
        real
    }

    /// The links in `dir` (canonical), listed once.
    fn links_in(&mut self, dir: &Path) -> &std::collections::HashSet<std::ffi::OsString> {
        if !self.listed.contains_key(dir) {
            self.resolver.note(dir);
            let links = std::fs::read_dir(dir)
                .map(|list| {
                    list.flatten()
                        .filter(|d| d.file_type().is_ok_and(|t| t.is_symlink()))
                        .map(|d| d.file_name())
                        .collect()
                })
                .unwrap_or_default();
            self.listed.insert(dir.to_path_buf(), links);
        }
        &self.listed[dir]
    }
}

impl HostSecrets {
    /// The defaults plus `extra` (the variable's value). `home` expands `~`;
    /// without one, `~` entries are dropped. Entries are canonicalised
    /// where their directory exists, so that a grant that reaches them
    /// through a link still sees them; a secret that is itself a link
    /// (`~/.ssh -> ~/dotfiles/ssh`) is a secret where it points as well.
    ///
    /// Nothing is resolved through `trees` (trees the sandbox can write):
    /// there an entry is taken as written.
    pub fn new(extra: Option<&str>, home: Option<&Path>, trees: &[&Path]) -> HostSecrets {
        let mut homes: Vec<PathBuf> = home.map(Path::to_path_buf).into_iter().collect();
        homes.extend(system_homes());
        HostSecrets::with_homes(extra, &homes, trees)
    }

    /// [`HostSecrets::new`] with the homes given: `~/` entries are
    /// expanded in each (none: only the absolute entries, and the `~/`
    /// entries for walks and granted directories).
    pub fn with_homes(extra: Option<&str>, homes: &[PathBuf], trees: &[&Path]) -> HostSecrets {
        cache::with_homes(extra, homes, trees, cache::RACY).0
    }

    /// The list built anew; `resolver` records what it looked at.
    fn build(extra: Option<&str>, homes: &[PathBuf], resolver: &mut crate::paths::Resolver<'_>) -> HostSecrets {
        let extra = extra.unwrap_or("").split(':').map(str::trim).filter(|s| !s.is_empty());
        let raws: Vec<&str> = DEFAULT_HOST_SECRETS.iter().map(|(p, _)| *p).chain(extra).collect();
        let mut in_home: Vec<Vec<String>> = Vec::new();
        for raw in &raws {
            let Some(rest) = raw.strip_prefix("~/") else { continue };
            let parts: Vec<String> = rest.split('/').filter(|c| !c.is_empty()).map(str::to_string).collect();
            let plain = !parts.is_empty() && parts.iter().all(|c| c != "." && c != "..");
            if plain && !in_home.contains(&parts) {
                in_home.push(parts);
            }
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut seen: std::collections::HashSet<Entry> = std::collections::HashSet::new();
        let mut add = |entry: Entry| {
            if seen.insert(entry.clone()) {
                entries.push(entry);
            }
        };
        let expanded = raws.iter().flat_map(|raw| match raw.strip_prefix("~/") {
            Some(_) => homes.iter().filter_map(|h| expand(raw, Some(h))).collect::<Vec<_>>(),
            None => expand(raw, None).into_iter().collect(),
        });
        // Entries share few directories (a home, its `.config`, ...): each
        // is resolved once, from its parent's resolution, and listed once; a
        // match needs resolving only when it is a link (its directory is
        // already canonical).
        let mut walk = Walk { resolver, real: Default::default(), listed: Default::default() };
        for path in expanded {
            let Some(leaf) = path.file_name().map(|l| l.to_string_lossy().into_owned()) else { continue };
            let Some(dir) = path.parent().and_then(crate::paths::normalize_path) else { continue };
            let real_dir = walk.real_dir(&dir);
            let entry = Entry { dir: real_dir.clone().unwrap_or(dir), leaf };
            // Where each existing match really is, when that is elsewhere:
            // none when the directory does not resolve (missing, or through
            // a tree the sandbox writes) or is in such a tree.
            let links: Vec<PathBuf> = if walk.resolver.in_tree(&entry.dir) || real_dir.is_none() {
                Vec::new()
            } else if entry.leaf.contains('*') {
                let names = walk.links_in(&entry.dir);
                names.iter().filter(|n| entry.matches_leaf(&n.to_string_lossy())).map(|n| entry.dir.join(n)).collect()
            } else {
                let named = walk.links_in(&entry.dir).contains(std::ffi::OsStr::new(&entry.leaf));
                named.then(|| entry.dir.join(&entry.leaf)).into_iter().collect()
            };
            add(entry);
            for m in links {
                let Ok(real) = walk.resolver.resolve(&m) else { continue };
                if real == m {
                    continue;
                }
                if let (Some(dir), Some(leaf)) = (real.parent(), real.file_name()) {
                    add(Entry { dir: dir.to_path_buf(), leaf: leaf.to_string_lossy().into_owned() });
                }
            }
        }
        HostSecrets { entries, in_home }
    }

    /// Nothing on the list.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.in_home.is_empty()
    }

    /// The last components of the list's entries (see [`Leaves`]).
    pub fn leaves(&self) -> Leaves {
        let mut out = Leaves::default();
        let lasts = self.in_home.iter().filter_map(|parts| parts.last()).chain(self.entries.iter().map(|e| &e.leaf));
        for leaf in lasts {
            if leaf.contains('*') {
                if !out.globs.contains(leaf) {
                    out.globs.push(leaf.clone());
                }
            } else {
                out.literal.insert(leaf.clone());
            }
        }
        out
    }

    /// [`HostSecrets::matches_in_tree`], passing over at once a name that
    /// ends no entry (`leaves` is this list's).
    pub fn matches_in_tree_with(&self, leaves: &Leaves, root: &Path, rel: &Path) -> bool {
        rel.file_name().is_some_and(|l| leaves.may_match(&l.to_string_lossy())) && self.matches_in_tree(root, rel)
    }

    /// Whether `rel` (a relative path in a walked tree) is a secret of the
    /// list there: it ends with a `~/` entry (any directory may be a home),
    /// or `root.join(rel)` is an absolute entry.
    pub fn matches_in_tree(&self, root: &Path, rel: &Path) -> bool {
        // The leaf first, without allocating: this runs for every name a
        // watch sees appear, and almost no name is one.
        let Some(leaf) = rel.file_name() else { return false };
        let leaf = leaf.to_string_lossy();
        let in_home = self.in_home.iter().any(|parts| {
            let Some(last) = parts.len().checked_sub(1) else { return false };
            glob_match(&parts[last], &leaf) && {
                let mut above = rel.components().rev().skip(1);
                parts[..last].iter().rev().all(|p| above.next().is_some_and(|c| c.as_os_str() == p.as_str()))
            }
        });
        in_home
            || self.entries.iter().any(|e| e.matches_leaf(&leaf) && root.join(rel).parent() == Some(e.dir.as_path()))
    }

    /// The entry that `path` (canonical) is or lies under, if any.
    pub fn covering(&self, path: &Path) -> Option<&Entry> {
        self.entries.iter().find(|e| {
            path.strip_prefix(&e.dir).ok().and_then(|rest| rest.components().next()).is_some_and(
                |first| matches!(first, std::path::Component::Normal(n) if e.matches_leaf(&n.to_string_lossy())),
            )
        })
    }

    /// [`HostSecrets::covering`] for many paths: the entries indexed by
    /// their directory once, then each path looked up along its ancestors
    /// (a handful of lookups instead of a match against every entry; the
    /// list has thousands on a host with many homes).
    pub fn coverer(&self) -> Coverer<'_> {
        let mut by_dir: HashMap<&Path, Vec<usize>> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            by_dir.entry(e.dir.as_path()).or_default().push(i);
        }
        Coverer { entries: &self.entries, by_dir }
    }

    /// The secrets that exist inside `root` (canonical), as canonical paths,
    /// each once, in order. A secret that is a link is masked where it
    /// points when that is inside `root` (the link itself then leads to the
    /// mask). Nothing at or under `skip` is looked at: trees the sandbox
    /// can write (the project, the session directories), where a path could
    /// be a link it planted; what is secret there is the project scan's.
    pub fn masks_under(&self, root: &Path, skip: &[&Path]) -> Vec<Mask> {
        let mut out: Vec<Mask> = Vec::new();
        let skipped = |p: &Path| skip.iter().any(|s| p.starts_with(s));
        let mut add = |p: PathBuf| {
            if skipped(&p) {
                return;
            }
            let Ok(real) = crate::paths::resolve_avoiding(&p, skip) else { return };
            if !real.starts_with(root) || real == root {
                return;
            }
            let Ok(meta) = std::fs::symlink_metadata(&real) else { return };
            let mask = Mask { path: real, is_dir: meta.is_dir() };
            if !out.contains(&mask) {
                out.push(mask);
            }
        };
        for e in &self.entries {
            if !e.dir.starts_with(root) && !root.starts_with(&e.dir) {
                continue;
            }
            if e.leaf.contains('*') {
                if skipped(&e.dir) {
                    continue;
                }
                let Ok(list) = std::fs::read_dir(&e.dir) else { continue };
                let mut names: Vec<PathBuf> = list
                    .flatten()
                    .filter(|d| e.matches_leaf(&d.file_name().to_string_lossy()))
                    .map(|d| d.path())
                    .collect();
                names.sort();
                names.into_iter().for_each(&mut add);
            } else {
                add(e.dir.join(&e.leaf));
            }
        }
        // The granted directory may itself be a home (another user's, a
        // copy of one, one on another disk). A file is none, and an entry
        // whose first component the root lacks has nothing there (one
        // look per component: the list has hundreds of entries).
        let is_dir = std::fs::symlink_metadata(root).is_ok_and(|m| m.is_dir());
        let mut present: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
        for parts in self.in_home.iter().filter(|_| is_dir) {
            let Some(first) = parts.first() else { continue };
            let there = *present
                .entry(first.as_str())
                .or_insert_with(|| first.contains('*') || std::fs::symlink_metadata(root.join(first)).is_ok());
            if !there {
                continue;
            }
            let Some((leaf, dirs)) = parts.split_last() else { continue };
            let dir: PathBuf = dirs.iter().fold(root.to_path_buf(), |d, c| d.join(c));
            if skipped(&dir) {
                continue;
            }
            if leaf.contains('*') {
                let Ok(list) = std::fs::read_dir(&dir) else { continue };
                let mut names: Vec<PathBuf> = list
                    .flatten()
                    .filter(|d| glob_match(leaf, &d.file_name().to_string_lossy()))
                    .map(|d| d.path())
                    .collect();
                names.sort();
                names.into_iter().for_each(&mut add);
            } else {
                add(dir.join(leaf));
            }
        }
        out.sort();
        out
    }
}

/// A directory to watch while a sandbox runs, and the name pattern whose
/// appearance in it makes a host secret appear inside a mounted root.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WatchPoint {
    pub dir: PathBuf,
    pub leaf: String,
}

impl HostSecrets {
    /// Where a secret that does not exist yet could appear inside `roots`
    /// (canonical): the secret's directory when it exists, else its nearest
    /// existing ancestor inside the root, watched for the next component;
    /// and each directory above that one inside the root, watched for the
    /// name below it (a directory renamed or moved in there brings the
    /// secret along, where the deeper watch looks at the one it replaced).
    /// Nothing at or under `skip` (trees the sandbox writes).
    pub fn watch_points(&self, roots: &[&Path], skip: &[&Path]) -> Vec<WatchPoint> {
        let mut out: Vec<WatchPoint> = Vec::new();
        // Hundreds of points: a set, not a scan of `out`, tells the ones seen.
        let mut seen: std::collections::HashSet<WatchPoint> = std::collections::HashSet::new();
        let mut add = |root: &Path, mut dir: PathBuf, mut leaf: String| {
            while !dir.is_dir() {
                let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { break };
                leaf = name.to_string_lossy().into_owned();
                dir = parent.to_path_buf();
            }
            if !dir.starts_with(root) || skip.iter().any(|t| dir.starts_with(t)) {
                return;
            }
            let above: Vec<WatchPoint> = dir
                .ancestors()
                .take_while(|a| *a != root && a.starts_with(root))
                .filter_map(|a| {
                    Some(WatchPoint {
                        dir: a.parent()?.to_path_buf(),
                        leaf: a.file_name()?.to_string_lossy().into_owned(),
                    })
                })
                .collect();
            for point in std::iter::once(WatchPoint { dir, leaf }).chain(above) {
                if seen.insert(point.clone()) {
                    out.push(point);
                }
            }
        };
        for e in &self.entries {
            let Some(root) = roots.iter().find(|r| e.dir.starts_with(r)) else { continue };
            add(root, e.dir.clone(), e.leaf.clone());
        }
        // A granted directory may itself be a home: its `~/` entries may
        // appear there as well (as `masks_under` masks them). Where the
        // root lacks an entry's first component, that name appearing in
        // the root is what to watch for (one look per component).
        for root in roots.iter().filter(|r| r.is_dir()) {
            let mut present: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
            for parts in &self.in_home {
                let Some((leaf, dirs)) = parts.split_last() else { continue };
                let Some(first) = parts.first() else { continue };
                let there =
                    *present.entry(first.as_str()).or_insert_with(|| first.contains('*') || root.join(first).is_dir());
                if !there && !dirs.is_empty() {
                    add(root, root.to_path_buf(), first.clone());
                    continue;
                }
                add(root, dirs.iter().fold(root.to_path_buf(), |d, c| d.join(c)), leaf.clone());
            }
        }
        out
    }
}

/// An inotify instance with one watch per directory of some points (many
/// share one: found by a map, as a command's points are hundreds and a
/// scan for each was most of the host's work for a command). A point's
/// directory that is a link is watched where it leads, as its path names
/// (a home's `.ssh` kept elsewhere by a dotfile manager): a secret that
/// appears there is one at the point's path. The points are the host's own
/// places, outside any tree a sandbox can write (see [`watch`]).
struct Watched {
    inotify: nix::sys::inotify::Inotify,
    /// Each point whose directory is watched, with its watch.
    wds: Vec<(nix::sys::inotify::WatchDescriptor, WatchPoint)>,
    /// Whether every point's directory is.
    all: bool,
}

impl Watched {
    /// None when inotify is unavailable.
    fn new(points: impl IntoIterator<Item = WatchPoint>) -> Option<Watched> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR;
        let mut by_dir: HashMap<PathBuf, Option<nix::sys::inotify::WatchDescriptor>> = HashMap::new();
        let (mut wds, mut all) = (Vec::new(), true);
        for p in points {
            let wd = match by_dir.get(&p.dir) {
                Some(wd) => *wd,
                None => {
                    let wd = inotify.add_watch(&p.dir, flags).ok();
                    by_dir.insert(p.dir.clone(), wd);
                    wd
                }
            };
            match wd {
                Some(wd) => wds.push((wd, p)),
                None => all = false,
            }
        }
        Some(Watched { inotify, wds, all })
    }
}

/// The same look as [`watch`], asked when it is wanted instead of woken:
/// made when a sandbox started ahead of need is released, asked when it
/// is claimed, so that a host secret that appeared in between (which the
/// running watch may not have read yet) keeps it from being used.
pub struct Sentinel {
    inotify: nix::sys::inotify::Inotify,
    wds: Vec<(nix::sys::inotify::WatchDescriptor, WatchPoint)>,
}

impl Sentinel {
    /// None when a point's directory cannot be watched.
    pub fn new(points: &[WatchPoint]) -> Option<Sentinel> {
        let Watched { inotify, wds, all } = Watched::new(points.iter().cloned())?;
        all.then_some(Sentinel { inotify, wds })
    }

    /// Whether no name that [`watch`] would stop a sandbox for has
    /// appeared since it was made (an overflow of the queue counts as one).
    pub fn quiet(&self) -> bool {
        use nix::sys::inotify::AddWatchFlags;
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(nix::errno::Errno::EAGAIN) => return true,
                Err(_) => return false,
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    return false;
                }
                let name = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned());
                let hit = self
                    .wds
                    .iter()
                    .any(|(wd, p)| *wd == ev.wd && name.as_deref().is_some_and(|n| glob_match(&p.leaf, n)));
                if hit {
                    return false;
                }
            }
        }
    }
}

/// Watch `points` until `stop` fires; when a matching name appears, call
/// `appeared` with its path (once: the sandbox it guards is then killed).
/// Returns at once when inotify is unavailable (each execution's check of
/// the masks remains). Its points are never in a tree the sandbox can
/// write, so only the host's own programs make its events: it is paced
/// and reads in bounded batches (see `protected::budget`), and charges
/// no sandbox.
pub async fn watch(
    points: Vec<WatchPoint>,
    appeared: impl FnOnce(PathBuf) + Send + 'static,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    use nix::sys::inotify::AddWatchFlags;
    // A point that cannot be watched is left to each execution's check.
    let Some(Watched { inotify, wds, .. }) = Watched::new(points) else { return };
    if wds.is_empty() {
        return;
    }
    let Some(inotify) = crate::inotify::Inotified::new(inotify) else { return };
    // Events were left in the queue by the last batch.
    let mut more = false;
    loop {
        if !more {
            tokio::select! {
                _ = &mut stop => return,
                ready = inotify.wait() => if !ready { return },
            }
        }
        // One bounded batch.
        let found = (|| {
            for _ in 0..WATCH_BATCH_READS {
                let events = match inotify.get().read_events() {
                    Ok(events) => events,
                    Err(nix::errno::Errno::EAGAIN) => return Ok(false),
                    Err(_) => return Ok(false),
                };
                for ev in events {
                    // One directory holds several points, all under one watch.
                    let mut here = wds.iter().filter(|(wd, _)| *wd == ev.wd).map(|(_, p)| p);
                    let name = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned());
                    let overflow = ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW);
                    let hit = here.find(|p| overflow || name.as_deref().is_some_and(|n| glob_match(&p.leaf, n)));
                    if let Some(point) = hit.or(if overflow { wds.first().map(|(_, p)| p) } else { None }) {
                        return Err(point.dir.join(name.unwrap_or_default()));
                    }
                }
            }
            Ok(true)
        })();
        match found {
            Err(path) => {
                appeared(path);
                return;
            }
            Ok(left) => more = left,
        }
        // Paced (see `protected::budget`): what comes meanwhile waits in the
        // kernel's queue.
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(crate::inotify::PACE) => {}
        }
    }
}

/// Reads of the queue in one batch of the watch's reactions.
const WATCH_BATCH_READS: usize = 16;

/// `~` and `~/x` with `home`; other paths must be absolute.
fn expand(raw: &str, home: Option<&Path>) -> Option<PathBuf> {
    if raw == "~" {
        return home.map(Path::to_path_buf);
    }
    if let Some(rest) = raw.strip_prefix("~/") {
        return home.map(|h| h.join(rest));
    }
    raw.starts_with('/').then(|| PathBuf::from(raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn globs_match_within_one_component() {
        assert!(glob_match("ssh_host_*_key", "ssh_host_ed25519_key"));
        assert!(!glob_match("ssh_host_*_key", "ssh_host_ed25519_key.pub"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "aXbYc"));
        assert!(!glob_match("a*b*c", "acb"));
        assert!(glob_match("shadow", "shadow"));
        assert!(!glob_match("shadow", "shadow-"));
    }

    #[test]
    fn home_entries_expand_and_extras_are_added() {
        let s =
            HostSecrets::new(Some("/srv/vault: ~/.config/extra ::relative"), Some(Path::new("/nonexistent-home")), &[]);
        let shown: Vec<String> = s.entries.iter().map(Entry::shown).collect();
        assert!(shown.contains(&"/nonexistent-home/.ssh".to_string()), "{shown:?}");
        assert!(shown.contains(&"/srv/vault".to_string()));
        assert!(shown.contains(&"/nonexistent-home/.config/extra".to_string()));
        assert!(!shown.iter().any(|s| s.contains("relative")));
        let no_home = HostSecrets::with_homes(None, &[], &[]);
        assert!(!no_home.entries.iter().any(|e| e.shown().contains(".aws")));
        assert!(no_home.entries.iter().any(|e| e.shown() == "/etc/shadow"));
    }

    #[test]
    fn a_secret_that_is_a_link_is_a_secret_where_it_points() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join("dotfiles/ssh")).unwrap();
        fs::write(home.join("dotfiles/ssh/id_ed25519"), "k").unwrap();
        std::os::unix::fs::symlink(home.join("dotfiles/ssh"), home.join(".ssh")).unwrap();
        let data = home.join("data");
        fs::create_dir_all(data.join("aws-creds")).unwrap();
        std::os::unix::fs::symlink(data.join("aws-creds"), home.join(".aws")).unwrap();
        let s = HostSecrets::new(None, Some(&home), &[]);
        // The target itself is refused as a grant, and anything under it.
        assert!(s.covering(&home.join("dotfiles/ssh")).is_some());
        assert!(s.covering(&home.join("dotfiles/ssh/id_ed25519")).is_some());
        assert!(s.covering(&home.join("dotfiles")).is_none());
        // A root that holds the target masks it, also when the link is outside the root.
        assert_eq!(
            s.masks_under(&home.join("dotfiles"), &[]),
            [Mask { path: home.join("dotfiles/ssh"), is_dir: true }]
        );
        assert_eq!(s.masks_under(&data, &[]), [Mask { path: data.join("aws-creds"), is_dir: true }]);
    }

    #[test]
    fn nothing_is_resolved_through_a_tree_the_sandbox_writes() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let base = fs::canonicalize(t.path()).unwrap();
        // The home directory is the project: the sandbox can plant ~/.ssh as a link.
        let home = base.join("home");
        fs::create_dir_all(home.join("real-ssh")).unwrap();
        fs::create_dir_all(base.join("elsewhere")).unwrap();
        fs::write(base.join("elsewhere/notes"), "n").unwrap();
        std::os::unix::fs::symlink(base.join("elsewhere"), home.join(".ssh")).unwrap();
        // Baseline: resolved freely, the planted link makes its target a secret.
        let free = HostSecrets::new(None, Some(&home), &[]);
        assert!(free.covering(&base.join("elsewhere/notes")).is_some());
        let guarded = HostSecrets::new(None, Some(&home), &[&home]);
        assert!(guarded.covering(&base.join("elsewhere/notes")).is_none(), "the link was followed");
        assert!(guarded.covering(&home.join(".ssh/x")).is_some(), "the entry itself stays");
        // A root outside the tree whose secret path leads into it is not looked through either.
        std::os::unix::fs::symlink(home.join("real-ssh"), base.join("elsewhere/.netrc")).unwrap();
        let s = HostSecrets::new(Some(&format!("{}/elsewhere/.netrc", base.display())), Some(&home), &[&home]);
        assert!(s.masks_under(&base, &[&home]).iter().all(|m| !m.path.starts_with(&home)));
    }

    #[test]
    fn a_secret_that_may_appear_is_watched_where_it_would() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join(".config")).unwrap();
        fs::create_dir_all(home.join("proj")).unwrap();
        let s = HostSecrets::new(Some(&format!("{}/proj/.vault", home.display())), Some(&home), &[]);
        let points = s.watch_points(&[&home], &[&home.join("proj")]);
        let has = |dir: &Path, leaf: &str| points.contains(&WatchPoint { dir: dir.to_path_buf(), leaf: leaf.into() });
        assert!(has(&home, ".aws"), "{points:?}");
        assert!(has(&home.join(".config"), "gh"));
        // ~/.cargo does not exist: its creation is watched for.
        assert!(has(&home, ".cargo"));
        assert!(!points.iter().any(|p| p.dir.starts_with(home.join("proj"))), "not in a tree the sandbox writes");
        assert!(s.watch_points(&[&home.join("proj")], &[]).iter().all(|p| p.dir.starts_with(home.join("proj"))));
    }

    #[test]
    fn a_home_s_secret_that_may_appear_in_a_granted_directory_is_watched_there() {
        // The granted directory is no home of this host's, but may be one
        // (a copy, another disk): its `~/` entries are watched in it.
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let data = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(data.join(".config")).unwrap();
        let s = HostSecrets::with_homes(None, &[], &[]);
        let points = s.watch_points(&[&data], &[]);
        let has = |dir: &Path, leaf: &str| points.contains(&WatchPoint { dir: dir.to_path_buf(), leaf: leaf.into() });
        assert!(has(&data, ".vault-token"), "{points:?}");
        assert!(has(&data, ".ssh"));
        assert!(has(&data.join(".config"), "gh"));
        // A `.config` renamed or moved in would bring its `gh` along.
        assert!(has(&data, ".config"));
        // Missing directories: their creation in the root is watched for.
        assert!(has(&data, ".aws") && has(&data, ".cargo"));
        assert!(points.iter().all(|p| p.dir.starts_with(&data)));
    }

    /// `watch` over `points` in a task: what it reports, the sender that
    /// stops it (kept alive by the caller), and the task.
    fn watching(
        points: Vec<WatchPoint>,
    ) -> (tokio::sync::oneshot::Receiver<PathBuf>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        (rx, stop, tokio::spawn(watch(points, move |p| drop(tx.send(p)), stopped)))
    }

    #[tokio::test]
    async fn the_watch_reports_a_secret_that_appears() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        let s = HostSecrets::new(None, Some(&home), &[]);
        let points = s.watch_points(&[&home], &[]);
        let (rx, _stop, task) = watching(points);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        fs::write(home.join("notes.txt"), "not a secret").unwrap();
        fs::write(home.join(".netrc"), "machine x").unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.unwrap().unwrap();
        assert_eq!(seen, home.join(".netrc"));
        task.await.unwrap();
    }

    #[tokio::test]
    async fn the_watch_sees_a_secret_in_a_point_s_directory_that_is_a_link() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let base = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(base.join("target")).unwrap();
        std::os::unix::fs::symlink(base.join("target"), base.join("link")).unwrap();
        let points = vec![WatchPoint { dir: base.join("link"), leaf: ".netrc".into() }];
        let (rx, _stop, task) = watching(points);
        // One thread: the watch adds its watches before this goes on.
        tokio::task::yield_now().await;
        fs::write(base.join("target/.netrc"), "machine x").unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.unwrap().unwrap();
        assert_eq!(seen, base.join("link/.netrc"));
        task.await.unwrap();
    }

    #[test]
    fn a_sentinel_over_a_point_s_directory_that_is_a_link_sees_a_secret_there() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let base = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(base.join("target")).unwrap();
        std::os::unix::fs::symlink(base.join("target"), base.join("link")).unwrap();
        let point = WatchPoint { dir: base.join("link"), leaf: ".netrc".into() };
        let Some(s) = Sentinel::new(&[point]) else { panic!("the link's directory is watched") };
        assert!(s.quiet());
        fs::write(base.join("target/.netrc"), "machine x").unwrap();
        assert!(!s.quiet());
    }

    #[tokio::test]
    async fn the_watch_reports_a_secret_brought_in_by_a_directory_above_it_renamed_in() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir(home.join(".config")).unwrap();
        let staged = home.join("staged");
        fs::create_dir_all(staged.join(".config/age")).unwrap();
        fs::write(staged.join(".config/age/keys.txt"), "AGE-SECRET-KEY-1").unwrap();
        let s = HostSecrets::new(None, Some(&home), &[]);
        let points = s.watch_points(&[&home], &[]);
        let (rx, _stop, task) = watching(points);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        fs::rename(home.join(".config"), home.join(".config-old")).unwrap();
        fs::rename(staged.join(".config"), home.join(".config")).unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.unwrap().unwrap();
        assert_eq!(seen, home.join(".config"));
        task.await.unwrap();
    }

    #[test]
    fn the_leaves_pass_over_only_names_that_end_no_entry() {
        let s = HostSecrets::new(None, Some(Path::new("/nonexistent-home")), &[]);
        let leaves = s.leaves();
        let root = Path::new("/nonexistent-home/proj");
        // Every entry's own last component, globbed ones spelt out, and names that are none.
        let mut rels: Vec<PathBuf> = s.in_home.iter().map(|parts| parts.iter().collect::<PathBuf>()).collect();
        rels.extend(
            ["a/.ansible/vault-x.yml", "x/.vault_pass.txt", "src/main.rs", "sub/.ssh", "credentials"]
                .map(PathBuf::from),
        );
        let absolute = PathBuf::from("/etc/ssh/ssh_host_ed25519_key");
        let mut hits = 0;
        for rel in rels.iter().map(|r| PathBuf::from(r.to_string_lossy().replace('*', "x"))) {
            let whole = s.matches_in_tree(root, &rel);
            assert_eq!(s.matches_in_tree_with(&leaves, root, &rel), whole, "{rel:?}");
            hits += usize::from(whole);
        }
        assert!(hits > 10, "the list's own entries match: {hits}");
        let etc = Path::new("/etc/ssh");
        let key = Path::new("ssh_host_ed25519_key");
        assert!(s.matches_in_tree(etc, key) && s.matches_in_tree_with(&leaves, etc, key), "{absolute:?}");
        assert!(!leaves.may_match("main.rs") && !leaves.may_match("f0.c"));
    }

    #[test]
    fn a_grant_at_or_under_a_secret_is_covered() {
        let s = HostSecrets::new(None, Some(Path::new("/nonexistent-home")), &[]);
        assert!(s.covering(Path::new("/etc/shadow")).is_some());
        assert!(s.covering(Path::new("/etc/sudoers.d/90-users")).is_some());
        assert!(s.covering(Path::new("/etc/ssh/ssh_host_rsa_key")).is_some());
        assert!(s.covering(Path::new("/nonexistent-home/.ssh/id_ed25519")).is_some());
        assert!(s.covering(Path::new("/etc/ssh/ssh_host_rsa_key.pub")).is_none());
        // The indexed form gives the same entry for every path, odd ones included.
        let c = s.coverer();
        for p in [
            "/etc/shadow",
            "/etc/sudoers.d/90-users",
            "/etc/ssh/ssh_host_rsa_key",
            "/etc/ssh/ssh_host_rsa_key.pub",
            "/nonexistent-home/.ssh/id_ed25519",
            "/nonexistent-home/.ssh",
            "/nonexistent-home//.ssh/x",
            "/nonexistent-home/./.ssh",
            "/nonexistent-home/x/../.ssh",
            "/nonexistent-home/.ssh/..",
            "/etc/..",
            "/etc",
            "/",
            "/usr/bin",
        ] {
            assert_eq!(c.covering(Path::new(p)), s.covering(Path::new(p)), "{p}");
        }
        assert!(s.covering(Path::new("/etc")).is_none());
        assert!(s.covering(Path::new("/etc/shadowy")).is_none());
        assert!(s.covering(Path::new("/nonexistent-home")).is_none());
    }

    #[test]
    fn masks_are_the_secrets_that_exist_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join(".ssh")).unwrap();
        fs::write(home.join(".ssh/id_ed25519"), "k").unwrap();
        fs::write(home.join(".netrc"), "n").unwrap();
        fs::create_dir_all(home.join("keys")).unwrap();
        fs::write(home.join("keys/a.key"), "a").unwrap();
        fs::write(home.join("keys/b.txt"), "b").unwrap();
        // A secret that is a link to a file inside the root is masked where it points.
        fs::write(home.join("real-credentials"), "c").unwrap();
        std::os::unix::fs::symlink(home.join("real-credentials"), home.join(".git-credentials")).unwrap();
        let extra = format!("{}/keys/*.key", home.display());
        let s = HostSecrets::new(Some(&extra), Some(&home), &[]);
        let masks = s.masks_under(&home, &[]);
        assert_eq!(
            masks,
            [
                Mask { path: home.join(".netrc"), is_dir: false },
                Mask { path: home.join(".ssh"), is_dir: true },
                Mask { path: home.join("keys/a.key"), is_dir: false },
                Mask { path: home.join("real-credentials"), is_dir: false },
            ]
        );
        // A root inside a secret's directory sees only what is under it.
        assert_eq!(s.masks_under(&home.join("keys"), &[]), [Mask { path: home.join("keys/a.key"), is_dir: false }]);
        assert!(s.masks_under(&home.join(".ssh"), &[]).is_empty(), "the root itself is refused, not masked");
        // Inside a tree the sandbox writes (here: the whole home is a project), nothing is looked at.
        assert!(s.masks_under(&home, &[&home]).is_empty());
        assert_eq!(s.masks_under(&home, &[&home.join(".ssh"), &home.join("keys")]).len(), 2);
    }
}
