//! The host-secret check of the trees a shell command reads (the system's
//! TLS certificates, `/etc/alternatives`, PATH entries, the trusted extra
//! reads), kept for the session while nothing it looked at has changed.
//!
//! The check ([`HostSecrets::masks_under`] and
//! [`HostSecrets::watch_points`] of each tree) depends on the list, on
//! what each tree is, and on the names inside the tree along the paths
//! where a secret of the list could be: the tree itself and each
//! directory between it and such a path. A kept check is reused only when
//! the list and the trees' identities (device, inode, kind) are the same,
//! and an inotify watch on each of those directories has seen no event
//! since it was made: a name made, removed, renamed or changed in its
//! attributes in any of them (a link replaced by another, as
//! `update-alternatives` does, whatever the times say), the directory
//! itself removed or moved, a queue overflow, all drop it. A check that
//! met a link on such a path (its answer would depend on directories
//! outside the watched ones), a tree with more such directories than
//! [`MAX_DIRS`], a watch that cannot be added, is not kept: it is made
//! again for every command, as before.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::{glob_match, HostSecrets, Mask, WatchPoint};

/// Directories watched for one session's kept check at most.
pub const MAX_DIRS: usize = 512;

/// What one tree was when the check was made.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ident {
    path: PathBuf,
    /// (device, inode, is a directory); none: absent.
    what: Option<(u64, u64, bool)>,
}

fn ident(path: &Path) -> Ident {
    let what = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.is_dir()));
    Ident { path: path.to_path_buf(), what }
}

struct Kept {
    list: HostSecrets,
    trees: Vec<PathBuf>,
    idents: Vec<Ident>,
    masks: Vec<Mask>,
    points: Vec<WatchPoint>,
    /// Its watches; any event on it drops the kept check.
    inotify: Inotify,
    /// Which check this is (each one made gets a new number).
    made: u64,
}

/// The number of the next check kept.
static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Kept {
    /// Whether nothing was queued on the watches since they were made.
    fn quiet(&self) -> bool {
        matches!(self.inotify.read_events(), Err(nix::errno::Errno::EAGAIN))
    }
}

/// A session's kept check (see the module's text); cloning shares it.
#[derive(Default, Clone)]
pub struct KeptReads(Arc<parking_lot::Mutex<Option<Kept>>>);

/// The check of some trees: the masks of the secrets in them and where a
/// secret could appear in them while a sandbox runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadsCheck {
    pub masks: Vec<Mask>,
    pub points: Vec<WatchPoint>,
    /// Whether it came from the kept check.
    pub kept: bool,
}

/// The check of `dirs` made anew (what [`KeptReads::check`] keeps).
pub fn check_anew(list: &HostSecrets, dirs: &[PathBuf], skip: &[&Path]) -> ReadsCheck {
    let mut out = ReadsCheck::default();
    let mut seen: std::collections::HashSet<WatchPoint> = std::collections::HashSet::new();
    for dir in dirs {
        for m in list.masks_under(dir, skip) {
            if !out.masks.contains(&m) {
                out.masks.push(m);
            }
        }
        for p in list.watch_points(&[dir.as_path()], skip) {
            if seen.insert(p.clone()) {
                out.points.push(p);
            }
        }
    }
    out
}

impl KeptReads {
    /// Which check is kept, if one is.
    pub fn kept(&self) -> Option<u64> {
        self.0.lock().as_ref().map(|k| k.made)
    }

    /// Whether the check kept is `made` (see [`KeptReads::kept`]) and
    /// nothing it looked at changed since (a sandbox started ahead of need
    /// with it may still be used); a change drops it, as
    /// [`KeptReads::check`] would.
    pub fn unchanged(&self, made: u64) -> bool {
        let mut kept = self.0.lock();
        let right =
            kept.as_ref().is_some_and(|k| k.made == made && k.idents.iter().all(|i| ident(&i.path) == *i) && k.quiet());
        if !right {
            *kept = None;
        }
        right
    }

    /// The check of `dirs` (host trees shown read-only at their paths,
    /// none at or under `skip`) against `list`: the kept one while it is
    /// right, else made anew (and kept when it can be).
    pub fn check(&self, list: &HostSecrets, dirs: &[PathBuf], skip: &[&Path]) -> ReadsCheck {
        let trees: Vec<PathBuf> = skip.iter().map(|p| p.to_path_buf()).collect();
        let idents: Vec<Ident> = dirs.iter().map(|d| ident(d)).collect();
        let mut kept = self.0.lock();
        if let Some(k) = kept.as_ref() {
            if k.list == *list && k.trees == trees && k.idents == idents && k.quiet() {
                return ReadsCheck { masks: k.masks.clone(), points: k.points.clone(), kept: true };
            }
        }
        *kept = None;
        // The watches first: a change while the check is made is an event.
        let inotify = watch(list, dirs, skip);
        let made = check_anew(list, dirs, skip);
        if let Some(inotify) = inotify {
            *kept = Some(Kept {
                list: list.clone(),
                trees,
                idents,
                masks: made.masks.clone(),
                points: made.points.clone(),
                inotify,
                made: MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            });
        }
        made
    }
}

/// An inotify instance watching every directory the check of `dirs`
/// depends on; none when the check cannot be kept (see the module's text).
fn watch(list: &HostSecrets, dirs: &[PathBuf], skip: &[&Path]) -> Option<Inotify> {
    let all_watched = || {
        let mut watched: Vec<PathBuf> = Vec::new();
        for dir in dirs.iter().filter(|d| !skip.iter().any(|s| d.starts_with(s))) {
            watched_dirs(list, dir, &mut watched)?;
            if watched.len() > MAX_DIRS {
                return None;
            }
        }
        Some(watched)
    };
    let watched = all_watched()?;
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
    let flags = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW;
    for dir in &watched {
        inotify.add_watch(dir, flags).ok()?;
    }
    // What changed before a watch was there: the directories looked at
    // again, now under watch (a change from here on is an event).
    (all_watched()? == watched).then_some(inotify)
}

/// Add to `out` the directories of `root` the check looks names up in:
/// the root and each directory on the way to a path where a secret of the
/// list could be. None when a link is on such a way or is such a path.
fn watched_dirs(list: &HostSecrets, root: &Path, out: &mut Vec<PathBuf>) -> Option<()> {
    let Ok(meta) = std::fs::symlink_metadata(root) else { return Some(()) };
    if !meta.is_dir() {
        // A file holds no name; what it is, is in the kept check's key.
        return Some(());
    }
    let add = |d: PathBuf, out: &mut Vec<PathBuf>| {
        if !out.contains(&d) {
            out.push(d);
        }
    };
    add(root.to_path_buf(), out);
    let mut ways: Vec<(Vec<String>, String)> = Vec::new();
    for e in list.entries.iter().filter(|e| e.dir.starts_with(root)) {
        let Ok(rel) = e.dir.strip_prefix(root) else { continue };
        ways.push((rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect(), e.leaf.clone()));
    }
    for parts in &list.in_home {
        if let Some((leaf, above)) = parts.split_last() {
            ways.push((above.to_vec(), leaf.clone()));
        }
    }
    'ways: for (above, leaf) in ways {
        let mut dir = root.to_path_buf();
        for c in &above {
            dir.push(c);
            match std::fs::symlink_metadata(&dir) {
                Err(_) => continue 'ways,
                Ok(m) if m.is_dir() => add(dir.clone(), out),
                Ok(_) => return None,
            }
        }
        if leaf.contains('*') {
            let list = std::fs::read_dir(&dir).ok()?;
            for d in list.flatten() {
                if glob_match(&leaf, &d.file_name().to_string_lossy()) && d.file_type().ok()?.is_symlink() {
                    return None;
                }
            }
        } else if std::fs::symlink_metadata(dir.join(&leaf)).is_ok_and(|m| m.file_type().is_symlink()) {
            return None;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn list() -> HostSecrets {
        HostSecrets::with_homes(None, &[], &[])
    }

    /// Trees like the system's: a directory of certificates, one of
    /// links, a file.
    fn trees() -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
        let t = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let root = fs::canonicalize(t.path()).expect("canonical");
        fs::create_dir_all(root.join("certs/sub")).expect("mkdir");
        fs::write(root.join("certs/ca.pem"), "CA").expect("write");
        fs::create_dir(root.join("alt")).expect("mkdir");
        symlink("/usr/bin/true", root.join("alt/editor")).expect("ln");
        fs::write(root.join("file.cnf"), "x").expect("write");
        let dirs = vec![root.join("certs"), root.join("alt"), root.join("file.cnf"), root.join("absent")];
        (t, root, dirs)
    }

    fn masked(c: &ReadsCheck) -> Vec<PathBuf> {
        c.masks.iter().map(|m| m.path.clone()).collect()
    }

    #[test]
    fn a_kept_check_is_the_check_made_anew_until_a_name_changes_in_a_tree() {
        let (_t, root, dirs) = trees();
        let (list, kept) = (list(), KeptReads::default());
        let first = kept.check(&list, &dirs, &[]);
        assert!(!first.kept && first.masks.is_empty() && !first.points.is_empty(), "{first:?}");
        let second = kept.check(&list, &dirs, &[]);
        assert!(second.kept, "nothing changed, yet the check was made again");
        assert_eq!(second, ReadsCheck { kept: true, ..check_anew(&list, &dirs, &[]) });
        // A home's secret appears in a tree (any tree may be a home): the
        // next command masks it.
        fs::create_dir(root.join("certs/.ssh")).expect("mkdir");
        fs::write(root.join("certs/.ssh/id_rsa"), "KEY").expect("write");
        let after = kept.check(&list, &dirs, &[]);
        assert!(!after.kept, "a check from before the secret was used");
        assert_eq!(masked(&after), [root.join("certs/.ssh")]);
        assert!(kept.check(&list, &dirs, &[]).kept);
        // One deeper, in a directory made after the check.
        fs::create_dir(root.join("certs/.config")).expect("mkdir");
        assert!(!kept.check(&list, &dirs, &[]).kept);
        assert!(kept.check(&list, &dirs, &[]).kept);
        fs::create_dir(root.join("certs/.config/age")).expect("mkdir");
        let deeper = kept.check(&list, &dirs, &[]);
        assert!(!deeper.kept);
        assert!(masked(&deeper).contains(&root.join("certs/.config/age")), "{deeper:?}");
        // A link replaced by another (as update-alternatives does).
        assert!(kept.check(&list, &dirs, &[]).kept);
        symlink("/usr/bin/false", root.join("alt/.editor.new")).expect("ln");
        fs::rename(root.join("alt/.editor.new"), root.join("alt/editor")).expect("mv");
        assert!(!kept.check(&list, &dirs, &[]).kept, "a replaced link left the check kept");
        // A tree replaced by another directory, a file turned into one, an
        // absent one made.
        assert!(kept.check(&list, &dirs, &[]).kept);
        fs::rename(root.join("certs"), root.join("certs.old")).expect("mv");
        fs::create_dir(root.join("certs")).expect("mkdir");
        assert!(!kept.check(&list, &dirs, &[]).kept);
        assert!(kept.check(&list, &dirs, &[]).kept);
        fs::remove_file(root.join("file.cnf")).expect("rm");
        fs::create_dir_all(root.join("file.cnf/.ssh")).expect("mkdir");
        let turned = kept.check(&list, &dirs, &[]);
        assert!(!turned.kept && masked(&turned).contains(&root.join("file.cnf/.ssh")), "{turned:?}");
        fs::create_dir_all(root.join("absent/.gnupg")).expect("mkdir");
        let made = kept.check(&list, &dirs, &[]);
        assert!(!made.kept && masked(&made).contains(&root.join("absent/.gnupg")), "{made:?}");
        // Another list, other trees: made anew.
        assert!(kept.check(&list, &dirs, &[]).kept);
        assert!(!kept.check(&HostSecrets::with_homes(Some("/srv/x"), &[], &[]), &dirs, &[]).kept);
        assert!(!kept.check(&list, &dirs[..2], &[]).kept);
    }

    #[test]
    fn a_check_that_meets_a_link_on_a_secret_s_way_is_made_for_every_command() {
        let (_t, root, dirs) = trees();
        let (list, kept) = (list(), KeptReads::default());
        fs::create_dir(root.join("elsewhere")).expect("mkdir");
        symlink(root.join("elsewhere"), root.join("certs/.config")).expect("ln");
        assert!(!kept.check(&list, &dirs, &[]).kept);
        assert!(!kept.check(&list, &dirs, &[]).kept, "kept although its answer depends on an unwatched directory");
        fs::remove_file(root.join("certs/.config")).expect("rm");
        symlink(root.join("elsewhere"), root.join("alt/.ssh")).expect("ln");
        assert!(!kept.check(&list, &dirs, &[]).kept);
        assert!(!kept.check(&list, &dirs, &[]).kept, "kept although a secret's name is a link");
        fs::remove_file(root.join("alt/.ssh")).expect("rm");
        assert!(!kept.check(&list, &dirs, &[]).kept);
        assert!(kept.check(&list, &dirs, &[]).kept);
    }

    #[test]
    fn a_tree_the_sandbox_writes_is_neither_checked_nor_watched() {
        let (_t, root, dirs) = trees();
        fs::create_dir(root.join("certs/.ssh")).expect("mkdir");
        let skip = [root.join("certs")];
        let skip: Vec<&Path> = skip.iter().map(PathBuf::as_path).collect();
        let kept = KeptReads::default();
        let check = kept.check(&list(), &dirs, &skip);
        assert!(check.masks.is_empty() && check.points.iter().all(|p| !p.dir.starts_with(root.join("certs"))));
        fs::write(root.join("certs/.ssh/x"), "").expect("write");
        fs::write(root.join("certs/y"), "").expect("write");
        assert!(kept.check(&list(), &dirs, &skip).kept, "a change in a skipped tree dropped the check");
    }
}
