//! Host-side file operations on trees the sandbox can write.
//!
//! A writable project and the scratch directory change while the host looks
//! at them: any component of a path inside them may be replaced by a
//! symbolic link between one system call and the next. Every host-side
//! open, stat, rename, link restore or read on such a tree goes through a
//! [`Tree`]: a directory fd for the tree's root (a path the host chose, not
//! one the sandbox can change) and paths relative to it that are resolved
//! beneath that fd without following any symbolic or magic link at any
//! component. `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` does that atomically in the kernel; where it is
//! missing (Linux before 5.6) or refused (a container's seccomp profile
//! answers EPERM) the path is walked one component at a time with
//! `O_PATH | O_NOFOLLOW | O_DIRECTORY`, each step relative to the fd of the
//! last. Which of the two is learnt once per process. Renames and link restores act on the fd of the directory that
//! holds the name, so they can never land outside the tree.
//!
//! Deleting a whole tree ([`remove_tree`]) holds its root the same way and
//! acts one entry of a held directory at a time, without recursion.
//!
//! This module only resolves and acts; what to protect is `protected`'s
//! decision.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// Kind of a directory entry, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Link,
    Other,
}

impl Kind {
    pub fn of(st: &FileStat) -> Kind {
        match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFLNK => Kind::Link,
            _ => Kind::Other,
        }
    }
}

/// How a path is resolved; `Auto` uses `openat2` and walks only where the
/// kernel lacks it or a seccomp filter refuses it. Tests force the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    Auto,
    Walk,
}

/// Whether `openat2` can be used in this process, as far as known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Openat2 {
    Unknown = 0,
    Usable = 1,
    Refused = 2,
}

/// [`Openat2`] for this process: the kernel and the seccomp filter the
/// process runs under do not change while it runs.
static OPENAT2: AtomicU8 = AtomicU8::new(Openat2::Unknown as u8);

impl Openat2 {
    fn from_u8(v: u8) -> Openat2 {
        match v {
            1 => Openat2::Usable,
            2 => Openat2::Refused,
            _ => Openat2::Unknown,
        }
    }

    /// What a probe of `openat2` says: ENOSYS before Linux 5.6; EPERM from
    /// a seccomp profile that refuses calls it does not know (Docker's
    /// default before 20.10, many CI and build sandboxes). The probe opens
    /// the root itself `O_PATH`, which fails with EPERM for no other
    /// reason. Any other failure (EMFILE, ENOMEM) says nothing about
    /// `openat2`: ask again next time.
    fn from_probe(probe: Result<(), Errno>) -> Openat2 {
        match probe {
            Ok(()) => Openat2::Usable,
            Err(Errno::ENOSYS | Errno::EPERM) => Openat2::Refused,
            Err(_) => Openat2::Unknown,
        }
    }
}

/// The verdict `state` holds, running `probe` (once, in practice) while it
/// holds none.
fn learn(state: &AtomicU8, probe: impl FnOnce() -> Result<(), Errno>) -> Openat2 {
    match Openat2::from_u8(state.load(Ordering::Relaxed)) {
        Openat2::Unknown => {}
        known @ (Openat2::Usable | Openat2::Refused) => return known,
    }
    let verdict = Openat2::from_probe(probe());
    match verdict {
        Openat2::Unknown => {}
        Openat2::Usable | Openat2::Refused => state.store(verdict as u8, Ordering::Relaxed),
    }
    verdict
}

/// The root of a tree the sandbox can write, held open.
#[derive(Debug)]
pub struct Tree {
    fd: OwnedFd,
    path: PathBuf,
    resolver: Resolver,
    /// Mounts inside the tree that every sandbox shown it has masked
    /// whole (see [`Tree::masking`]).
    masked_mounts: std::collections::BTreeSet<u64>,
}

/// Split `rel` into plain names. Anything else (`..`, `.`, a root, an empty
/// path) is refused: a relative path from the host's own plan has none.
fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not a plain relative path: {}", rel.display()),
                ))
            }
        }
    }
    Ok(out)
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

#[cfg(test)]
type WalkHook = Option<Box<dyn FnMut(usize)>>;

#[cfg(test)]
thread_local! {
    /// Called by the walk between two components (with the index of the
    /// next one), so that a test can swap a directory for a link there.
    pub static WALK_HOOK: std::cell::RefCell<WalkHook> = const { std::cell::RefCell::new(None) };
}

impl Tree {
    /// Open the root `path`, which must be a directory and not a link
    /// itself. The caller vouches for the path above the root.
    pub fn open(path: &Path) -> io::Result<Tree> {
        Tree::open_with(path, Resolver::Auto)
    }

    pub fn open_with(path: &Path, resolver: Resolver) -> io::Result<Tree> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", path.display())))?;
        Ok(Tree { fd, path: path.to_path_buf(), resolver, masked_mounts: Default::default() })
    }

    /// The same root, through a copy of its fd.
    pub fn try_clone(&self) -> io::Result<Tree> {
        Ok(Tree {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
            resolver: self.resolver,
            masked_mounts: self.masked_mounts.clone(),
        })
    }

    /// This tree, told the mount ids of the mounts inside it that the
    /// sandbox sees masked whole (`submounts`): [`Tree::masked_mount`]
    /// answers for them.
    pub fn masking(mut self, mounts: std::collections::BTreeSet<u64>) -> Tree {
        self.masked_mounts = mounts;
        self
    }

    /// Whether the directory `dir` (opened beneath the root) is the root
    /// of a mount the sandbox sees masked whole: its mount (`statx`'s
    /// `STATX_MNT_ID` of the open directory itself, nothing resolved by
    /// name) is one of those the tree was told of, and not the root's own.
    /// `false` where the kernel does not give mount ids (before 5.8).
    pub fn masked_mount(&self, dir: BorrowedFd<'_>) -> bool {
        if self.masked_mounts.is_empty() {
            return false;
        }
        match (mount_id(dir), mount_id(self.fd.as_fd())) {
            (Some(here), Some(root)) => here != root && self.masked_mounts.contains(&here),
            _ => false,
        }
    }

    /// The host path of the root (for messages; never for access).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Open `rel` beneath the root with `flags` (`O_CLOEXEC | O_NOFOLLOW`
    /// are always added). Fails with ELOOP when any component, the last
    /// included, is a symbolic link, and never resolves outside the root.
    pub fn open_at(&self, rel: &Path, flags: OFlag) -> io::Result<OwnedFd> {
        let how = match self.resolver {
            Resolver::Auto => learn(&OPENAT2, || self.probe_openat2()),
            Resolver::Walk => Openat2::Refused,
        };
        self.open_by(rel, flags, how)
    }

    /// [`Tree::open_at`], with `openat2` only when `how` says it works.
    fn open_by(&self, rel: &Path, flags: OFlag, how: Openat2) -> io::Result<OwnedFd> {
        let parts = names(rel)?;
        let flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let fd = match how {
            Openat2::Usable => self.openat2(rel, flags)?,
            Openat2::Refused | Openat2::Unknown => self.walk(&parts, flags)?,
        };
        // O_PATH | O_NOFOLLOW opens a trailing link itself: refuse it.
        let st = nix::sys::stat::fstat(&fd).map_err(errno)?;
        if Kind::of(&st) == Kind::Link {
            return Err(errno(Errno::ELOOP));
        }
        Ok(fd)
    }

    fn openat2(&self, rel: &Path, flags: OFlag) -> io::Result<OwnedFd> {
        let how = OpenHow::new().flags(flags).resolve(
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        nix::fcntl::openat2(self.fd.as_fd(), rel, how).map_err(errno)
    }

    /// `openat2` of the root itself, `O_PATH`, with the flags every call
    /// uses (a seccomp filter cannot see them: they sit behind a pointer).
    fn probe_openat2(&self) -> Result<(), Errno> {
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC).resolve(
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        nix::fcntl::openat2(self.fd.as_fd(), ".", how).map(drop)
    }

    /// One component at a time, each relative to the fd of the last: an
    /// intermediate component must be a real directory (`O_DIRECTORY` with
    /// `O_NOFOLLOW` refuses a link), the last is opened with `O_NOFOLLOW`.
    fn walk(&self, parts: &[&OsStr], flags: OFlag) -> io::Result<OwnedFd> {
        let mut cur: Option<OwnedFd> = None;
        for (i, part) in parts.iter().enumerate() {
            #[cfg(test)]
            WALK_HOOK.with(|h| {
                if let Some(f) = h.borrow_mut().as_mut() {
                    f(i)
                }
            });
            let dir = cur.as_ref().map(|f| f.as_fd()).unwrap_or(self.fd.as_fd());
            let last = i + 1 == parts.len();
            let step =
                if last { flags } else { OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC };
            let next = nix::fcntl::openat(dir, *part, step, Mode::empty()).map_err(|e| match e {
                Errno::ENOTDIR if !last => {
                    // A link (or a file) where a directory was expected.
                    errno(Errno::ELOOP)
                }
                e => errno(e),
            })?;
            cur = Some(next);
        }
        match cur {
            Some(fd) => Ok(fd),
            // An empty path is the root itself.
            None => self.fd.try_clone(),
        }
    }

    /// The directory `rel` (the root for an empty path), as an `O_PATH` fd.
    pub fn dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        if rel.as_os_str().is_empty() {
            return self.fd.try_clone();
        }
        self.open_at(rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
    }

    /// The directory holding the last component of `rel`, and that name.
    pub fn parent(&self, rel: &Path) -> io::Result<(OwnedFd, OsString)> {
        let parts = names(rel)?;
        let Some((name, _)) = parts.split_last() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the root has no parent in its tree"));
        };
        let dir = self.dir(rel.parent().unwrap_or(Path::new("")))?;
        Ok((dir, name.to_os_string()))
    }

    /// `lstat` of `rel`: `None` when it (or a directory above it) does not
    /// exist. A link above it is an error, a link at it is reported as one.
    pub fn lstat(&self, rel: &Path) -> io::Result<Option<FileStat>> {
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        stat_in(dir.as_fd(), &name)
    }

    /// The target of the link `rel`.
    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let (dir, name) = self.parent(rel)?;
        read_link_in(dir.as_fd(), &name)
    }

    /// Create the link `rel` -> `target` (the directory above must exist).
    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        nix::unistd::symlinkat(target, dir.as_fd(), name.as_os_str()).map_err(errno)
    }

    /// The entries of directory `rel` (see [`list_dir`]).
    pub fn list(&self, rel: &Path, max: usize) -> io::Result<(Vec<(OsString, Kind)>, bool)> {
        list_dir(self.open_dir(rel)?, max)
    }

    /// Directory `rel`, opened for reading.
    pub fn open_dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        let fd = if rel.as_os_str().is_empty() {
            nix::fcntl::openat(
                self.fd.as_fd(),
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno)?
        } else {
            self.open_at(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?
        };
        Ok(fd)
    }

    /// A regular file of at most `max` bytes, read whole.
    pub fn read_regular(&self, rel: &Path, max: u64) -> io::Result<Vec<u8>> {
        let fd = self.open_at(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?;
        read_bounded(fd, max)
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` for a missing name.
pub fn stat_in(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<FileStat>> {
    match nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(errno(e)),
    }
}

/// `readlinkat(dir, name)`.
pub fn read_link_in(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<PathBuf> {
    let target = nix::fcntl::readlinkat(dir, name).map_err(errno)?;
    Ok(PathBuf::from(target))
}

/// Rename `from` to `to` inside the one directory `dir`, never replacing
/// an existing `to` (`renameat2(RENAME_NOREPLACE)`): the entry stays on its
/// file system and in its directory, whatever it is.
pub fn rename_noreplace(dir: BorrowedFd<'_>, from: &OsStr, to: &OsStr) -> io::Result<()> {
    nix::fcntl::renameat2(dir, from, dir, to, nix::fcntl::RenameFlags::RENAME_NOREPLACE).map_err(errno)
}

/// Move the entry `from` of `from_dir` to `to` in `to_dir` (both held
/// directories of one file system), never replacing an existing `to`: the
/// entry itself moves, whatever it is (a link is moved, never followed).
pub fn move_noreplace(from_dir: BorrowedFd<'_>, from: &OsStr, to_dir: BorrowedFd<'_>, to: &OsStr) -> io::Result<()> {
    nix::fcntl::renameat2(from_dir, from, to_dir, to, nix::fcntl::RenameFlags::RENAME_NOREPLACE).map_err(errno)
}

/// The mount id of the file `fd` is open on, where the kernel gives one.
pub fn mount_id(fd: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: an all-zero statx is valid; statx fills it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx of the fd itself (the empty path), into `stx`.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    (r == 0 && stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id)
}

/// `mkdirat(dir, name, mode)`.
pub fn make_dir_in(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode)).map_err(errno)
}

/// Open the entry `name` of `dir` as a directory without following a link
/// (one component: nothing else to resolve).
pub fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)
}

/// The names in directory `fd` (not `.` and `..`), with their kind as
/// `lstat` sees it, at most `max` of them; the flag says whether more were
/// left out.
pub fn list_dir(fd: OwnedFd, max: usize) -> io::Result<(Vec<(OsString, Kind)>, bool)> {
    let raw = fd.as_raw_fd();
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(errno)?;
    let mut out = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if out.len() == max {
            return Ok((out, true));
        }
        let name = OsStr::from_bytes(name).to_os_string();
        let kind = match entry.file_type() {
            Some(nix::dir::Type::Directory) => Kind::Dir,
            Some(nix::dir::Type::File) => Kind::File,
            Some(nix::dir::Type::Symlink) => Kind::Link,
            Some(_) => Kind::Other,
            // File systems without d_type: ask.
            None => {
                // SAFETY: `raw` is the fd owned by `dir`, alive for the loop.
                let dirfd = unsafe { BorrowedFd::borrow_raw(raw) };
                stat_in(dirfd, &name)?.map(|st| Kind::of(&st)).unwrap_or(Kind::Other)
            }
        };
        out.push((name, kind));
    }
    Ok((out, false))
}

/// Read an open regular file of at most `max` bytes.
pub fn read_bounded(fd: OwnedFd, max: u64) -> io::Result<Vec<u8>> {
    let file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > max {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("larger than {max} bytes")));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(max).read_to_end(&mut data)?;
    Ok(data)
}

mod remove;
pub use remove::remove_tree;
#[cfg(test)]
use remove::{owner_only, owner_only_by_proc, remove_tree_within, REMOVE_HOOK};

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Tmp(PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            // What std's remove_dir_all could not delete (too deep, or made
            // unreadable), remove_tree can.
            let _ = remove_tree(&self.0);
        }
    }
    fn tmp(tag: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!(
            "pps-beneath-{tag}-{}-{:x}",
            std::process::id(),
            crate::random::random_u64()
        ));
        std::fs::create_dir_all(p.join("a/b")).expect("mkdir");
        std::fs::write(p.join("a/b/f"), "inside").expect("write");
        Tmp(p)
    }

    fn both(root: &Path) -> [Tree; 2] {
        [Tree::open_with(root, Resolver::Auto).expect("open"), Tree::open_with(root, Resolver::Walk).expect("open")]
    }

    #[test]
    fn plain_paths_resolve_with_either_resolver() {
        let t = tmp("plain");
        for tree in both(&t.0) {
            assert_eq!(tree.read_regular(Path::new("a/b/f"), 100).expect("read"), b"inside");
            assert!(tree.lstat(Path::new("a/missing/x")).expect("lstat").is_none());
            assert!(tree.lstat(Path::new("a/b")).expect("lstat").is_some());
        }
    }

    #[test]
    fn a_link_at_any_component_is_refused() {
        let t = tmp("links");
        let outside = tmp("outside");
        std::fs::write(outside.0.join("secret"), "host").expect("write");
        symlink(&outside.0, t.0.join("abs")).expect("link");
        symlink("a/b", t.0.join("rel")).expect("link");
        symlink("f", t.0.join("a/b/last")).expect("link");
        symlink("/proc/self/root", t.0.join("magic")).expect("link");
        for tree in both(&t.0) {
            for rel in ["abs/secret", "rel/f", "a/b/last", "magic/etc/hostname", "abs", "rel"] {
                let err = tree.read_regular(Path::new(rel), 100).expect_err(rel);
                assert!(
                    matches!(err.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)),
                    "{rel} with {:?}: {err}",
                    tree.resolver
                );
            }
            for bad in ["../x", "/etc/passwd", "a/../a/b/f", ""] {
                assert!(tree.read_regular(Path::new(bad), 100).is_err(), "{bad}");
            }
            // lstat of a name that is a link reports the link itself.
            let st = tree.lstat(Path::new("a/b/last")).expect("lstat").expect("exists");
            assert_eq!(Kind::of(&st), Kind::Link);
            assert!(tree.lstat(Path::new("abs/secret")).is_err(), "a link above the name is an error");
        }
    }

    #[test]
    fn a_directory_swapped_for_a_link_between_steps_is_refused() {
        let t = tmp("swap");
        let outside = tmp("swap-out");
        std::fs::create_dir_all(outside.0.join("b")).expect("mkdir");
        std::fs::write(outside.0.join("b/f"), "host").expect("write");
        let tree = Tree::open_with(&t.0, Resolver::Walk).expect("open");
        let (root, out) = (t.0.clone(), outside.0.clone());
        WALK_HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |i| {
                if i == 1 {
                    // After `a` was opened: replace it with a link outside.
                    std::fs::rename(root.join("a"), root.join("a-moved")).expect("move");
                    symlink(&out, root.join("a")).expect("link");
                }
            }))
        });
        // The walk already holds the real `a`: it reads the original file.
        let got = tree.read_regular(Path::new("a/b/f"), 100);
        WALK_HOOK.with(|h| *h.borrow_mut() = None);
        assert_eq!(got.expect("the held directory is used"), b"inside");
        // A fresh resolution meets the link and refuses it.
        for tree in both(&t.0) {
            let err = tree.read_regular(Path::new("a/b/f"), 100).expect_err("link");
            assert!(matches!(err.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)), "{err}");
        }
    }

    #[test]
    fn racing_link_swaps_never_reach_outside() {
        let t = tmp("race");
        let outside = tmp("race-out");
        std::fs::create_dir_all(outside.0.join("b")).expect("mkdir");
        std::fs::write(outside.0.join("b/f"), "host").expect("write");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (root, out, flag) = (t.0.clone(), outside.0.clone(), stop.clone());
        let swapper = std::thread::spawn(move || {
            let mut n = 0u32;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) && n < 20_000 {
                let _ = std::fs::rename(root.join("a"), root.join("a-real"));
                let _ = symlink(&out, root.join("a"));
                let _ = std::fs::remove_file(root.join("a"));
                let _ = std::fs::rename(root.join("a-real"), root.join("a"));
                n += 1;
            }
        });
        for tree in both(&t.0) {
            for _ in 0..5_000 {
                if let Ok(data) = tree.read_regular(Path::new("a/b/f"), 100) {
                    assert_eq!(data, b"inside", "read a file outside the tree");
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().expect("swapper");
    }

    #[test]
    fn renames_stay_in_their_directory_and_never_replace() {
        let t = tmp("rename");
        let tree = Tree::open(&t.0).expect("open");
        std::fs::write(t.0.join("a/taken"), "x").expect("write");
        let (dir, name) = tree.parent(Path::new("a/b")).expect("parent");
        assert_eq!(
            rename_noreplace(dir.as_fd(), &name, OsStr::new("taken")).expect_err("taken").raw_os_error(),
            Some(libc::EEXIST)
        );
        rename_noreplace(dir.as_fd(), &name, OsStr::new("b2")).expect("rename");
        assert!(t.0.join("a/b2/f").exists());
        tree.symlink(Path::new("b2"), Path::new("a/b")).expect("symlink");
        assert_eq!(tree.read_link(Path::new("a/b")).expect("readlink"), PathBuf::from("b2"));
    }

    /// Run `f` on a thread with a small stack, failing after `secs`: a
    /// removal that recursed per level would overflow it, one that looped
    /// would time out.
    fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                let _ = tx.send(f());
            })
            .expect("spawn");
        rx.recv_timeout(std::time::Duration::from_secs(secs)).expect("finished in time")
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
    }

    #[test]
    fn a_tree_deeper_than_path_max_is_removed_without_recursing() {
        const DEPTH: usize = 20_000;
        let t = tmp("deep");
        // Built relative to the fd of the level above: the path of the
        // deepest level is ~40,000 bytes, ten times PATH_MAX.
        let mut fd = nix::fcntl::open(&t.0, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).expect("open");
        for i in 0..DEPTH {
            nix::sys::stat::mkdirat(&fd, "d", Mode::from_bits_truncate(0o700)).expect("mkdirat");
            if i % 1000 == 0 {
                nix::fcntl::openat(&fd, "f", OFlag::O_CREAT | OFlag::O_WRONLY, Mode::from_bits_truncate(0o600))
                    .expect("file");
            }
            fd = nix::fcntl::openat(&fd, "d", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW, Mode::empty())
                .expect("open level");
        }
        drop(fd);
        let root = t.0.clone();
        let (result, most_fds) = bounded(120, move || {
            let before = open_fds();
            let most = std::rc::Rc::new(std::cell::Cell::new(0));
            let (seen, n) = (most.clone(), std::cell::Cell::new(0u32));
            REMOVE_HOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    n.set(n.get() + 1);
                    if n.get() % 500 == 0 {
                        seen.set(seen.get().max(open_fds().saturating_sub(before)));
                    }
                }))
            });
            let result = remove_tree(&root).map_err(|e| e.to_string());
            REMOVE_HOOK.with(|h| *h.borrow_mut() = None);
            (result, most.get())
        });
        result.expect("removed");
        assert!(!t.0.exists());
        // Other tests open a few fds meanwhile; one per level would be
        // thousands.
        assert!(most_fds < 100, "{most_fds} more fds open during the removal");
    }

    #[test]
    fn links_inside_the_tree_leave_their_targets_alone() {
        let t = tmp("rm-links");
        let outside = tmp("rm-links-out");
        let out = &outside.0;
        std::fs::write(out.join("secret"), "host").expect("write");
        std::fs::write(out.join("hard-target"), "host").expect("write");
        std::fs::create_dir(out.join("dir")).expect("mkdir");
        std::fs::write(out.join("dir/kept"), "host").expect("write");
        symlink(out, t.0.join("to-outside")).expect("link");
        symlink(out.join("dir"), t.0.join("a/b/to-dir")).expect("link");
        symlink(out.join("secret"), t.0.join("a/to-file")).expect("link");
        symlink("../../../..", t.0.join("a/b/up")).expect("link");
        symlink("/", t.0.join("a/slash")).expect("link");
        std::fs::hard_link(out.join("hard-target"), t.0.join("a/b/hard")).expect("hard link");
        remove_tree(&t.0).expect("removed");
        assert!(!t.0.exists());
        assert_eq!(std::fs::read(out.join("secret")).expect("secret"), b"host");
        assert_eq!(std::fs::read(out.join("hard-target")).expect("hard"), b"host");
        assert_eq!(std::fs::read(out.join("dir/kept")).expect("kept"), b"host");
        // Not a file gone from /tmp, its parent: the `up` link led there.
        assert!(outside.0.exists());
    }

    #[test]
    fn fifos_and_sockets_inside_are_removed() {
        let t = tmp("rm-special");
        nix::unistd::mkfifo(&t.0.join("a/fifo"), Mode::from_bits_truncate(0o600)).expect("mkfifo");
        let _listening = std::os::unix::net::UnixListener::bind(t.0.join("a/b/sock")).expect("bind");
        std::fs::write(t.0.join("a/b/no-mode"), "x").expect("write");
        std::fs::set_permissions(t.0.join("a/b/no-mode"), std::os::unix::fs::PermissionsExt::from_mode(0o000))
            .expect("chmod");
        // Opening the FIFO would block: removal must never open one.
        let root = t.0.clone();
        bounded(30, move || remove_tree(&root).map_err(|e| e.to_string())).expect("removed");
        assert!(!t.0.exists());
    }

    #[test]
    fn a_missing_root_is_removed_and_a_root_that_is_a_link_is_refused() {
        let t = tmp("rm-root");
        remove_tree(&t.0.join("missing")).expect("missing is already removed");
        symlink(t.0.join("a"), t.0.join("link")).expect("link");
        let err = remove_tree(&t.0.join("link")).expect_err("a link as the root");
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory, "{err}");
        assert_eq!(std::fs::read(t.0.join("a/b/f")).expect("kept"), b"inside");
    }

    #[test]
    fn a_tree_that_keeps_refilling_fails_within_the_bound() {
        let t = tmp("rm-refill");
        let (root, n) = (t.0.clone(), std::cell::Cell::new(0u64));
        REMOVE_HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                n.set(n.get() + 1);
                let _ = std::fs::create_dir(root.join(format!("new-{}", n.get())));
                let _ = std::fs::write(root.join(format!("new-{}/f", n.get())), "x");
            }))
        });
        let got = remove_tree_within(&t.0, 1_000);
        REMOVE_HOOK.with(|h| *h.borrow_mut() = None);
        let err = got.expect_err("never empty");
        assert!(err.to_string().contains("still not empty after 1000 entries"), "{err}");
        remove_tree(&t.0).expect("removed once nothing refills it");
        assert!(!t.0.exists());
    }

    #[test]
    fn entries_changing_during_the_removal_stay_inside() {
        let t = tmp("rm-race");
        let outside = tmp("rm-race-out");
        std::fs::write(outside.0.join("secret"), "host").expect("write");
        for i in 0..200 {
            std::fs::create_dir_all(t.0.join(format!("w{i}/x/y"))).expect("mkdir");
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (root, out, flag) = (t.0.clone(), outside.0.clone(), stop.clone());
        // Never create_dir_all: that would recreate the removed root.
        let writer = std::thread::spawn(move || {
            for i in 0..5_000u32 {
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let d = root.join(format!("w{}", i % 200));
                let _ = std::fs::create_dir(d.join("x"));
                let _ = std::fs::write(d.join(format!("x/f{i}")), "x");
                let _ = std::fs::rename(d.join("x"), d.join("x-moved"));
                let _ = symlink(&out, d.join("x"));
                let _ = std::fs::remove_file(d.join("x"));
                let _ = std::fs::rename(d.join("x-moved"), d.join("x"));
                let _ = symlink(&out, d.join(format!("x/l{i}")));
            }
        });
        let root = t.0.clone();
        let got = bounded(120, move || remove_tree(&root).map_err(|e| e.to_string()));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().expect("writer");
        got.expect("removed");
        assert!(!t.0.exists());
        assert_eq!(std::fs::read(outside.0.join("secret")).expect("secret"), b"host");
    }

    /// Drop CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER from this
    /// thread's effective set (capabilities are per thread), so that root
    /// meets permission bits as any other owner does. False where that
    /// could not be done.
    fn drop_dac_caps_on_this_thread() -> bool {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const V3: u32 = 0x2008_0522;
        const DAC: u32 = (1 << 1) | (1 << 2) | (1 << 3);
        let mut head = Header { version: V3, pid: 0 };
        let mut data = [Data::default(); 2];
        // SAFETY: capget reads the header and writes two `Data`, the v3
        // layout; pid 0 is this thread.
        if unsafe { libc::syscall(libc::SYS_capget, &mut head, data.as_mut_ptr()) } != 0 {
            return false;
        }
        data[0].effective &= !DAC;
        // SAFETY: as above; capset only reads. Lowering the effective set
        // needs no privilege.
        unsafe { libc::syscall(libc::SYS_capset, &mut head, data.as_ptr()) == 0 }
    }

    #[test]
    fn directories_made_unreadable_inside_are_restored_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let t = tmp("rm-modes");
        let outside = tmp("rm-modes-out");
        let set = |p: &Path, mode: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
        std::fs::create_dir_all(t.0.join("a/locked/sub")).expect("mkdir");
        std::fs::write(t.0.join("a/locked/sub/g"), "x").expect("write");
        for (dir, mode) in [("a/locked/sub", 0o000), ("a/locked", 0o000), ("a/b", 0o300), ("a", 0o500)] {
            set(&t.0.join(dir), mode).expect("chmod");
        }
        std::fs::create_dir(t.0.join("noexec")).expect("mkdir");
        std::fs::write(t.0.join("noexec/f"), "x").expect("write");
        set(&t.0.join("noexec"), 0o600).expect("chmod");
        // A link to a directory outside that lacks u+w: restoring modes must
        // never reach it.
        std::fs::create_dir(outside.0.join("dir")).expect("mkdir");
        set(&outside.0.join("dir"), 0o500).expect("chmod");
        symlink(outside.0.join("dir"), t.0.join("to-outside")).expect("link");
        let root = t.0.clone();
        let (dropped, result) = bounded(30, move || {
            let dropped = drop_dac_caps_on_this_thread();
            if dropped {
                // The test means something: these directories are closed to us now.
                let denied = std::fs::metadata(root.join("noexec/f")).map(drop);
                assert_eq!(denied.expect_err("noexec").kind(), io::ErrorKind::PermissionDenied);
                let denied = std::fs::read_dir(root.join("a/locked")).map(drop);
                assert_eq!(denied.expect_err("locked").kind(), io::ErrorKind::PermissionDenied);
                set(&root, 0o000).expect("chmod root");
                let denied = std::fs::read_dir(&root).map(drop);
                assert_eq!(denied.expect_err("root").kind(), io::ErrorKind::PermissionDenied);
            }
            (dropped, remove_tree(&root).map_err(|e| e.to_string()))
        });
        if !dropped {
            eprintln!(
                "NOTE: could not drop CAP_DAC_OVERRIDE on a thread; as root this test does not exercise mode restoring"
            );
        }
        result.expect("removed");
        assert!(!t.0.exists());
        let mode = std::fs::metadata(outside.0.join("dir")).expect("outside").permissions().mode();
        assert_eq!(mode & 0o777, 0o500, "the mode of a link's target changed");
    }

    #[test]
    fn modes_are_restored_on_the_held_directory_not_on_its_name() {
        use std::os::unix::fs::PermissionsExt;
        let t = tmp("rm-held");
        let outside = tmp("rm-held-out");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        let set = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
        let open = |p: &Path| {
            nix::fcntl::open(p, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW, Mode::empty()).expect("open")
        };
        set(&outside.0.join("a"), 0o500);
        // Both ways (fchmodat2 where the kernel has it, /proc always): the
        // name is swapped for a link outside after the directory was opened.
        for (i, restore) in [owner_only as fn(BorrowedFd<'_>) -> io::Result<()>, owner_only_by_proc].iter().enumerate()
        {
            let held = t.0.join(format!("held{i}"));
            std::fs::create_dir(&held).expect("mkdir");
            set(&held, 0o000);
            let fd = open(&held);
            std::fs::rename(&held, t.0.join(format!("moved{i}"))).expect("move");
            symlink(outside.0.join("a"), &held).expect("link");
            restore(fd.as_fd()).expect("restore");
            assert_eq!(mode(&t.0.join(format!("moved{i}"))), 0o700);
            assert_eq!(mode(&outside.0.join("a")), 0o500, "the link's target changed");
        }
    }

    #[test]
    fn openat2_refused_by_seccomp_or_missing_means_the_walk_from_then_on() {
        let never = || -> Result<(), Errno> { panic!("probed again after a verdict") };
        for (probe, verdict) in
            [(Err(Errno::EPERM), Openat2::Refused), (Err(Errno::ENOSYS), Openat2::Refused), (Ok(()), Openat2::Usable)]
        {
            let state = AtomicU8::new(Openat2::Unknown as u8);
            assert_eq!(learn(&state, || probe), verdict, "{probe:?}");
            assert_eq!(learn(&state, never), verdict, "{probe:?} is remembered");
        }
        // A failure that says nothing about openat2 is not remembered.
        let state = AtomicU8::new(Openat2::Unknown as u8);
        assert_eq!(learn(&state, || Err(Errno::EMFILE)), Openat2::Unknown);
        assert_eq!(learn(&state, || Ok(())), Openat2::Usable);
        // This process has a verdict, whichever: the probe cannot fail here.
        let t = tmp("probe");
        let tree = Tree::open(&t.0).expect("open");
        let here = learn(&OPENAT2, || tree.probe_openat2());
        assert_ne!(here, Openat2::Unknown);
        eprintln!("openat2 on this host: {here:?}");
    }

    #[test]
    fn every_verdict_resolves_the_same_and_refuses_links() {
        let t = tmp("verdicts");
        symlink("a/b", t.0.join("rel")).expect("link");
        symlink("f", t.0.join("a/b/last")).expect("link");
        let tree = Tree::open(&t.0).expect("open");
        let mut verdicts = vec![Openat2::Refused, Openat2::Unknown];
        match learn(&OPENAT2, || tree.probe_openat2()) {
            Openat2::Usable => verdicts.push(Openat2::Usable),
            other @ (Openat2::Refused | Openat2::Unknown) => {
                eprintln!("NOTE: openat2 is {other:?} on this host; only the walk is tested")
            }
        }
        for how in verdicts {
            let fd = tree.open_by(Path::new("a/b/f"), OFlag::O_RDONLY, how).expect("open");
            assert_eq!(read_bounded(fd, 100).expect("read"), b"inside", "{how:?}");
            for rel in ["rel/f", "a/b/last"] {
                let err = tree.open_by(Path::new(rel), OFlag::O_RDONLY, how).expect_err(rel);
                assert!(matches!(err.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)), "{rel} {how:?}: {err}");
            }
        }
    }
}
