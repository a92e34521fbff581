//! The built lists, kept between starts while nothing they were built
//! from has changed.
//!
//! Building the list resolves every entry in every home (about 1,800
//! paths, a few thousand `lstat`s: most of a cold start's own time). What a
//! build depends on is the names in the directories it looked in: a link
//! made, removed or replaced, a directory made or renamed, changes the
//! modification or change time of the directory that holds the name. So a
//! build records each directory it consulted with its device, inode and
//! both times, and a later start with the same inputs uses it only when
//! every one of them is unchanged (one `stat` each, a few dozen).
//!
//! A file system's clock ticks in steps: a change in the same step as the
//! build could leave a time unchanged. A build that saw a directory
//! changed within [`RACY`] of its start is not kept (it is built anew next
//! time).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::HostSecrets;

/// A directory changed this recently makes a build not kept.
pub const RACY: Duration = Duration::from_secs(2);

/// Lists kept at most (one per session's trees; sessions rarely differ).
const KEPT: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    extra: Option<String>,
    homes: Vec<PathBuf>,
    trees: Vec<PathBuf>,
}

/// What a directory was when it was consulted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp(dir: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(dir).ok()?;
    Some(Stamp { dev: m.dev(), ino: m.ino(), mtime: (m.mtime(), m.mtime_nsec()), ctime: (m.ctime(), m.ctime_nsec()) })
}

struct Kept {
    key: Key,
    list: HostSecrets,
    /// Every directory consulted, and what it was (`None`: absent).
    stamps: Vec<(PathBuf, Option<Stamp>)>,
}

static KEPT_LISTS: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

/// The list for these inputs, and whether it was kept from an earlier
/// build. `racy` is [`RACY`] but in tests.
pub fn with_homes(extra: Option<&str>, homes: &[PathBuf], trees: &[&Path], racy: Duration) -> (HostSecrets, bool) {
    let key = Key {
        extra: extra.map(str::to_owned),
        homes: homes.to_vec(),
        trees: trees.iter().map(|t| t.to_path_buf()).collect(),
    };
    {
        let kept = KEPT_LISTS.lock();
        if let Some(k) = kept.iter().find(|k| k.key == key) {
            if k.stamps.iter().all(|(dir, was)| stamp(dir) == *was) {
                return (k.list.clone(), true);
            }
        }
    }
    let started = SystemTime::now();
    let mut resolver = crate::paths::Resolver::new(trees);
    let list = HostSecrets::build(extra, homes, &mut resolver);
    let stamps: Vec<(PathBuf, Option<Stamp>)> = resolver
        .consulted
        .into_iter()
        .map(|dir| {
            let s = stamp(&dir);
            (dir, s)
        })
        .collect();
    let recent = |t: (i64, i64)| {
        let at = SystemTime::UNIX_EPOCH + Duration::new(t.0.max(0) as u64, t.1.clamp(0, 999_999_999) as u32);
        started.duration_since(at).map_or(true, |age| age < racy)
    };
    let steady = stamps.iter().all(|(_, s)| s.as_ref().is_none_or(|s| !recent(s.mtime) && !recent(s.ctime)));
    let mut kept = KEPT_LISTS.lock();
    kept.retain(|k| k.key != key);
    if steady {
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push(Kept { key, list: list.clone(), stamps });
    }
    (list, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Whether a list for the inputs is kept, within a few tries: other
    /// tests make directories in `/var/tmp`, which each build consults.
    fn kept_soon(extra: Option<&str>, homes: &[PathBuf], trees: &[&Path]) -> bool {
        (0..20).any(|_| with_homes(extra, homes, trees, Duration::ZERO).1)
    }

    fn has(list: &HostSecrets, path: &Path) -> bool {
        list.entries.iter().any(|e| e.dir.join(&e.leaf) == path)
    }

    #[test]
    fn a_kept_list_is_the_list_built_anew() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join("dotfiles/ssh")).unwrap();
        std::os::unix::fs::symlink(home.join("dotfiles/ssh"), home.join(".ssh")).unwrap();
        let homes = [home.clone()];
        let (first, kept) = with_homes(None, &homes, &[], Duration::ZERO);
        assert!(!kept);
        assert!(kept_soon(None, &homes, &[]), "a build with the same inputs was not kept");
        let (second, _) = with_homes(None, &homes, &[], Duration::ZERO);
        assert_eq!(first, second);
        let mut resolver = crate::paths::Resolver::new(&[]);
        assert_eq!(HostSecrets::build(None, &homes, &mut resolver), second);
        assert!(has(&second, &home.join("dotfiles/ssh")));
    }

    #[test]
    fn a_link_made_after_a_build_is_seen_by_the_next() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join("dotfiles/ssh")).unwrap();
        fs::create_dir_all(home.join(".config")).unwrap();
        fs::create_dir_all(home.join("dotfiles/gh")).unwrap();
        let homes = [home.clone()];
        let (first, _) = with_homes(None, &homes, &[], Duration::ZERO);
        assert!(!has(&first, &home.join("dotfiles/ssh")));
        assert!(kept_soon(None, &homes, &[]), "not kept");
        // Past the file system clock's step.
        std::thread::sleep(Duration::from_millis(50));
        std::os::unix::fs::symlink(home.join("dotfiles/ssh"), home.join(".ssh")).unwrap();
        let (after, kept) = with_homes(None, &homes, &[], Duration::ZERO);
        assert!(!kept, "a list from before the link was used");
        assert!(has(&after, &home.join("dotfiles/ssh")));
        // A link deeper down: a directory the build looked in, not a home.
        std::thread::sleep(Duration::from_millis(50));
        std::os::unix::fs::symlink(home.join("dotfiles/gh"), home.join(".config/gh")).unwrap();
        let (deeper, kept) = with_homes(None, &homes, &[], Duration::ZERO);
        assert!(!kept);
        assert!(has(&deeper, &home.join("dotfiles/gh")));
        // A directory that did not exist (the build looked for it in its parent).
        std::thread::sleep(Duration::from_millis(50));
        fs::create_dir_all(home.join("dotfiles/cargo")).unwrap();
        fs::write(home.join("dotfiles/cargo/credentials.toml"), "t").unwrap();
        assert!(!has(&with_homes(None, &homes, &[], Duration::ZERO).0, &home.join("dotfiles/cargo/credentials.toml")));
        std::thread::sleep(Duration::from_millis(50));
        fs::create_dir_all(home.join(".cargo")).unwrap();
        std::os::unix::fs::symlink(home.join("dotfiles/cargo/credentials.toml"), home.join(".cargo/credentials.toml"))
            .unwrap();
        let (made, kept) = with_homes(None, &homes, &[], Duration::ZERO);
        assert!(!kept);
        assert!(has(&made, &home.join("dotfiles/cargo/credentials.toml")));
    }

    #[test]
    fn a_build_over_directories_just_changed_is_not_kept() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        let homes = [home.clone()];
        // The home was made just now.
        assert!(!with_homes(None, &homes, &[], RACY).1);
        assert!(!with_homes(None, &homes, &[], RACY).1, "a build over a directory changed just now was kept");
        // Other inputs are other lists.
        assert!(kept_soon(None, &homes, &[]));
        assert!(!with_homes(Some("/srv/x"), &homes, &[], Duration::ZERO).1);
        assert!(!with_homes(None, &homes, &[Path::new("/srv")], Duration::ZERO).1);
    }
}
