//! The bounded walk of a project tree.
//!
//! One breadth-first walk, bounded by the number of entries it reads and by
//! depth (never by time, so that the same project gives the same answer on
//! a loaded machine). Dependency trees (`node_modules`, virtual
//! environments, build outputs) are walked last, so that a large one cannot
//! use up the bound before the project's own directories are seen. Links
//! are reported as links and never followed; every directory is opened
//! through [`Tree`], beneath the root. A directory that is the root of a
//! mount every sandbox sees masked whole (a `proc` inside the project,
//! see `Tree::masking`) is passed over: nothing in it is shown. The caller
//! decides what an entry means and whether to descend into a directory.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::beneath::{Kind, Tree};

/// Directory names walked after everything else.
pub const DEPENDENCY_DIRS: &[&str] = &[
    "node_modules",
    ".venv",
    "venv",
    "target",
    "__pycache__",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".pytest_cache",
    ".gradle",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Directory entries read at most.
    pub max_entries: usize,
    /// Deepest directory level descended into (the root is level 0).
    pub max_depth: usize,
}

pub const DEFAULT_LIMITS: Limits = Limits { max_entries: 500_000, max_depth: 24 };
/// Override the bounds (whole numbers; anything else keeps the default).
pub const ENTRIES_ENV: &str = "PI_SANDBOX_SCAN_ENTRIES";
pub const DEPTH_ENV: &str = "PI_SANDBOX_SCAN_DEPTH";

/// The bounds in force: `entries` and `depth` as given in the environment.
pub fn limits(entries: Option<&str>, depth: Option<&str>) -> Limits {
    let parse = |v: Option<&str>, default: usize| v.and_then(|v| v.trim().parse().ok()).unwrap_or(default);
    Limits {
        max_entries: parse(entries, DEFAULT_LIMITS.max_entries),
        max_depth: parse(depth, DEFAULT_LIMITS.max_depth),
    }
}

/// What the visitor wants done with a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    Descend,
    Skip,
}

/// How far a walk got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Entries read.
    pub entries: usize,
    /// Every directory within the depth was read to the end.
    pub complete: bool,
    /// The first directory that could not be read (not one that vanished).
    pub unreadable: Option<PathBuf>,
    /// Mounts passed over because every sandbox sees them masked whole
    /// (see `Tree::masking`).
    pub masked_mounts: usize,
}

/// Walk `tree` breadth-first, calling `visit(rel, kind)` for every entry.
/// A directory that vanished is passed over; one that cannot be read (or
/// became a link) makes the walk incomplete: it never follows what the
/// sandbox put there.
pub fn walk(tree: &Tree, limits: Limits, visit: impl FnMut(&Path, Kind) -> Visit) -> Summary {
    walk_opened(tree, limits, visit, |_, _| {})
}

/// [`walk`] of the directory `start` of `tree` only (opened beneath the
/// root like every other; `rel`s passed to `visit` are from the root, and
/// depth counts from the root too).
pub fn walk_from(tree: &Tree, start: &Path, limits: Limits, visit: impl FnMut(&Path, Kind) -> Visit) -> Summary {
    walk_from_opened(tree, start, limits, visit, |_, _| {})
}

/// [`walk`], calling `opened(rel, fd)` with each directory's fd after it
/// is opened and before it is read (a watch added there misses nothing
/// that the listing does not see).
pub fn walk_opened(
    tree: &Tree,
    limits: Limits,
    visit: impl FnMut(&Path, Kind) -> Visit,
    opened: impl FnMut(&Path, std::os::fd::BorrowedFd<'_>),
) -> Summary {
    walk_from_opened(tree, Path::new(""), limits, visit, opened)
}

/// [`walk_from`] and [`walk_opened`] in one.
pub fn walk_from_opened(
    tree: &Tree,
    start: &Path,
    limits: Limits,
    mut visit: impl FnMut(&Path, Kind) -> Visit,
    mut opened: impl FnMut(&Path, std::os::fd::BorrowedFd<'_>),
) -> Summary {
    let depth = start.components().count();
    let mut queue: VecDeque<(PathBuf, usize)> = VecDeque::from([(start.to_path_buf(), depth)]);
    let mut later: VecDeque<(PathBuf, usize)> = VecDeque::new();
    let mut summary = Summary { entries: 0, complete: true, unreadable: None, masked_mounts: 0 };
    while let Some((dir, depth)) = queue.pop_front().or_else(|| later.pop_front()) {
        let room = limits.max_entries.saturating_sub(summary.entries);
        let listed = tree.open_dir(&dir).map(|fd| {
            // A mount every sandbox sees masked whole: nothing in it is
            // shown, so nothing in it is looked for or watched.
            if tree.masked_mount(std::os::fd::AsFd::as_fd(&fd)) {
                return None;
            }
            opened(&dir, std::os::fd::AsFd::as_fd(&fd));
            Some(crate::beneath::list_dir(fd, room))
        });
        // One the walk may not open (debugfs's root is 0700): the same
        // question of its mount, through an `O_PATH` descriptor.
        let masked_shut = |e: &std::io::Error| {
            matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
                && tree
                    .open_at(&dir, nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY)
                    .is_ok_and(|fd| tree.masked_mount(std::os::fd::AsFd::as_fd(&fd)))
        };
        let listed = match listed {
            Ok(None) => {
                summary.masked_mounts += 1;
                continue;
            }
            Err(e) if masked_shut(&e) => {
                summary.masked_mounts += 1;
                continue;
            }
            Ok(Some(listed)) => listed,
            Err(e) => Err(e),
        };
        let (entries, more) = match listed {
            Ok(listed) => listed,
            // Gone since it was listed: nothing there to find.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            // Unreadable, or turned into a link: what it holds is unknown.
            Err(_) => {
                summary.complete = false;
                summary.unreadable.get_or_insert(dir);
                continue;
            }
        };
        summary.entries += entries.len();
        for (name, kind) in entries {
            let rel = dir.join(&name);
            if visit(&rel, kind) == Visit::Skip || kind != Kind::Dir {
                continue;
            }
            if depth + 1 > limits.max_depth {
                summary.complete = false;
                continue;
            }
            let deferred = name.to_str().is_some_and(|n| DEPENDENCY_DIRS.contains(&n));
            if deferred { &mut later } else { &mut queue }.push_back((rel, depth + 1));
        }
        if more {
            summary.complete = false;
            break;
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn walks_breadth_first_with_dependency_trees_last_and_stops_at_its_bounds() {
        let root =
            std::env::temp_dir().join(format!("pps-scan-{}-{:x}", std::process::id(), crate::random::random_u64()));
        for d in ["node_modules/pkg/deep", "src/a/b", "docs"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        std::fs::write(root.join("src/a/b/f.py"), "").expect("write");
        std::fs::write(root.join("node_modules/pkg/deep/x.js"), "").expect("write");
        symlink("/etc", root.join("src/etc-link")).expect("link");
        let tree = Tree::open(&root).expect("open");
        let mut seen = Vec::new();
        let all = walk(&tree, DEFAULT_LIMITS, |rel, kind| {
            seen.push((rel.to_string_lossy().into_owned(), kind));
            Visit::Descend
        });
        assert!(all.complete);
        assert_eq!(all.entries, seen.len());
        let order: Vec<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
        let pos = |p: &str| order.iter().position(|o| *o == p).unwrap_or_else(|| panic!("{p} not seen in {order:?}"));
        assert!(pos("src/a/b/f.py") < pos("node_modules/pkg"), "dependency trees come last: {order:?}");
        assert!(seen.contains(&("src/etc-link".into(), Kind::Link)));
        assert!(!order.iter().any(|p| p.starts_with("src/etc-link/")), "a link was followed");
        let bounded = walk(&tree, Limits { max_entries: 4, max_depth: 24 }, |_, _| Visit::Descend);
        assert_eq!((bounded.entries, bounded.complete), (4, false));
        let shallow = walk(&tree, Limits { max_entries: 1000, max_depth: 1 }, |_, _| Visit::Descend);
        assert!(!shallow.complete);
        // A directory swapped for a link after it was listed is not read
        // through: the walk is incomplete and says where.
        let raced = walk(&tree, DEFAULT_LIMITS, |rel, _| {
            if rel == Path::new("docs") {
                std::fs::rename(root.join("docs"), root.join("docs-real")).expect("move");
                symlink("docs-real", root.join("docs")).expect("link");
            }
            Visit::Descend
        });
        assert!(!raced.complete);
        assert_eq!(raced.unreadable.as_deref(), Some(Path::new("docs")));
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn a_mount_the_sandbox_sees_masked_is_passed_over_and_no_other() {
        use std::os::fd::AsFd;
        // The host's /proc: a mount of its own below /, on every Linux.
        let proc = std::fs::File::open("/proc").expect("/proc");
        let proc_id = crate::beneath::mount_id(proc.as_fd()).expect("statx gives mount ids");
        let host = Tree::open(Path::new("/")).expect("open /");
        let bound = Limits { max_entries: 50, max_depth: 1 };
        let read = walk_from(&host, Path::new("proc"), bound, |_, _| Visit::Skip);
        assert!(read.entries > 0 && read.masked_mounts == 0, "{read:?}");
        let masking = host.try_clone().expect("clone").masking(std::collections::BTreeSet::from([proc_id]));
        let passed =
            walk_from(&masking, Path::new("proc"), bound, |rel, _| panic!("{rel:?} in a masked mount was seen"));
        assert_eq!((passed.entries, passed.masked_mounts, passed.complete), (0, 1, true), "{passed:?}");
        // A copy keeps what it masks; the root's own mount is never passed
        // over, even when named.
        let copy = masking.try_clone().expect("clone");
        assert!(copy.masked_mount(proc.as_fd()));
        let root_id = crate::beneath::mount_id(host.root_fd()).expect("mount id");
        let own = host.try_clone().expect("clone").masking(std::collections::BTreeSet::from([root_id]));
        let top = walk(&own, Limits { max_entries: 5, max_depth: 0 }, |_, _| Visit::Skip);
        assert_eq!((top.entries, top.masked_mounts), (5, 0), "{top:?}");
    }
}
