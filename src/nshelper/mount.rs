//! A read-only tree attached to a running sandbox, or detached from it,
//! by a helper process of the host (see the parent module for the rules
//! of the helper: raw system calls on memory prepared before it starts,
//! one fixed-size record back).
//!
//! Attaching, in the child (facts: `docs/permissions.md`, "How a grant
//! reaches a running sandbox"):
//! 1. join the user namespace that owns the sandbox's mount namespace
//!    (`NS_GET_USERNS`, asked by the parent: with `--disable-userns` the
//!    sandbox's processes sit in a nested one), then `unshare(CLONE_NEWNS)`:
//!    a private copy of the host's mounts that the helper is privileged
//!    over, whose changes never reach the host;
//! 2. in that copy, bind the session's empty file or directory over every
//!    host secret inside the source (each opened with
//!    `RESOLVE_NO_SYMLINKS`), then clone the source with its submounts
//!    (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`): the masks are part of
//!    the detached tree before anything of it is reachable from inside;
//!    the tree is made read-only, nosuid and nodev as bubblewrap's
//!    `--ro-bind` makes it;
//! 3. join the sandbox's mount namespace and find the mount point beneath
//!    the sandbox's root, one component at a time with `openat2`
//!    (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): a link anywhere on the way
//!    fails the attach, it is never followed. Missing components are made
//!    with `mkdirat` (a file mount point with `O_CREAT | O_EXCL |
//!    O_NOFOLLOW`) through a detached writable clone of the root mount: the
//!    sandbox's own mount of its root stays read-only throughout, so there
//!    is no moment in which the sandbox could write there. They are made
//!    only where the whole way lies on the root mount;
//! 4. `move_mount` the tree onto the fd of the mount point.
//!
//! Detaching joins the same two namespaces, opens the mount point's parent
//! the same way and unmounts the last component with `MNT_DETACH` and
//! `UMOUNT_NOFOLLOW`: a file already open under it stays readable by the
//! process that holds it, new opens fail.
//!
//! What is attached and where (the grant, its masks) is the caller's
//! decision; this module checks only that the paths are plain and the
//! masks are inside the source.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::{errno, in_helper};

/// One tree to attach: `source` (a canonical host path: a link on the way
/// fails the attach) at `at` inside the sandbox, with `masks` (host paths
/// strictly under `source`) hidden under `mask_file` or `mask_dir`.
#[derive(Debug, Clone, Copy)]
pub struct Attach<'a> {
    pub source: &'a Path,
    pub at: &'a Path,
    pub is_dir: bool,
    pub masks: &'a [Mask],
    pub mask_file: &'a Path,
    pub mask_dir: &'a Path,
}

/// A host secret to hide in the tree: its host path (strictly inside the
/// source) and whether it is a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub path: PathBuf,
    pub is_dir: bool,
}

/// A step of the helper, for what failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    JoinUser,
    Unshare,
    CloneMask,
    OpenSecret,
    MoveMask,
    OpenSource,
    SourceChanged,
    CloneSource,
    ReadOnly,
    JoinMount,
    OpenRoot,
    /// A component of the mount point could not be opened without
    /// following a link (ELOOP: it is one).
    Walk,
    /// A missing component lies under another mount than the root.
    NotOnRoot,
    WritableRoot,
    MakePoint,
    Kind,
    Attach,
    Detach,
    /// The mount's read-only flag could not be changed (EBUSY: a file is
    /// open for writing on it).
    Remount,
}

const STAGES: [Stage; 19] = [
    Stage::JoinUser,
    Stage::Unshare,
    Stage::CloneMask,
    Stage::OpenSecret,
    Stage::MoveMask,
    Stage::OpenSource,
    Stage::SourceChanged,
    Stage::CloneSource,
    Stage::ReadOnly,
    Stage::JoinMount,
    Stage::OpenRoot,
    Stage::Walk,
    Stage::NotOnRoot,
    Stage::WritableRoot,
    Stage::MakePoint,
    Stage::Kind,
    Stage::Attach,
    Stage::Detach,
    Stage::Remount,
];

impl Stage {
    fn code(self) -> i32 {
        STAGES.iter().position(|s| *s == self).map_or(-1, |i| i as i32 + 1)
    }

    fn of(code: i32) -> Option<Stage> {
        STAGES.get(usize::try_from(code - 1).ok()?).copied()
    }

    fn words(self) -> &'static str {
        match self {
            Stage::JoinUser => "joining the user namespace that owns the sandbox's mounts",
            Stage::Unshare => "making the helper's private mount namespace",
            Stage::CloneMask => "cloning the empty mask",
            Stage::OpenSecret => "opening a host secret to mask without following links",
            Stage::MoveMask => "binding the mask over a host secret",
            Stage::OpenSource => "opening the source without following links",
            Stage::SourceChanged => "checking the source (it is another file than the one the host checked)",
            Stage::CloneSource => "cloning the source tree",
            Stage::ReadOnly => "making the tree read-only",
            Stage::JoinMount => "joining the sandbox's mount namespace",
            Stage::OpenRoot => "opening the sandbox's root",
            Stage::Walk => "opening the mount point beneath the sandbox's root without following links",
            Stage::NotOnRoot => "making the mount point (its parent is under another mount)",
            Stage::WritableRoot => "cloning the sandbox's root writable to make the mount point",
            Stage::MakePoint => "making the mount point",
            Stage::Kind => "checking the mount point (it is not a directory or a file as the source is)",
            Stage::Attach => "attaching the tree",
            Stage::Detach => "detaching the tree",
            Stage::Remount => "changing the mount's read-only flag",
        }
    }
}

/// Why an attach or a detach did not happen. Nothing is left attached.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{} is not an absolute path without `.`, `..` or an empty component", crate::display::one_line(.0))]
    NotPlain(PathBuf),
    #[error("{} is deeper than {MAX_DEPTH} components", crate::display::one_line(.0))]
    TooDeep(PathBuf),
    #[error(
        "the host secret {} is not inside {}",
        crate::display::one_line(mask),
        crate::display::one_line(source_dir)
    )]
    MaskOutside { mask: PathBuf, source_dir: PathBuf },
    #[error("{} could not be opened without following links: {source}", crate::display::one_line(path))]
    Source { path: PathBuf, source: io::Error },
    #[error("{} is {} and the grant is for {}", crate::display::one_line(path), if *dir { "a directory" } else { "not a directory" }, if *dir { "a file" } else { "a directory" })]
    SourceKind { path: PathBuf, dir: bool },
    #[error("the sandbox's mount namespace could not be opened: {0}")]
    Namespace(io::Error),
    #[error("the user namespace that owns the sandbox's mounts could not be found: {0}")]
    Owner(io::Error),
    #[error("the helper process could not be started: {0}")]
    Fork(io::Error),
    #[error("the helper did not report ({0})")]
    NoReport(String),
    /// Bubblewrap did not reach the end of its mounts (it ended, or took
    /// longer than the helper's deadline).
    #[error("bubblewrap did not finish its mounts: {0}")]
    NotMounted(io::Error),
    #[error("the helper failed {} (at {}): {source}", .stage.words(), crate::display::one_line(at))]
    Step { stage: Stage, at: PathBuf, source: io::Error },
}

/// The deepest mount point handled (components of `at`).
pub const MAX_DEPTH: usize = 64;

/// How long an attach took, for the caller's log and the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    pub took: Duration,
}

/// Attach `a` to the sandbox whose process `pid` is in it. Blocking (a
/// helper process, a few dozen system calls, a wait: about a millisecond).
pub fn attach(pid: i32, a: &Attach<'_>) -> Result<Attached, MountError> {
    let began = std::time::Instant::now();
    let parts = components(a.at)?;
    let source = plain(a.source)?;
    let mut masks = Vec::with_capacity(a.masks.len());
    for m in a.masks {
        if !m.path.starts_with(a.source) || m.path == a.source {
            return Err(MountError::MaskOutside { mask: m.path.clone(), source_dir: a.source.to_path_buf() });
        }
        masks.push((plain(&m.path)?, m.is_dir));
    }
    let ident = source_ident(a.source, a.is_dir)?;
    let (mnt, user) = namespaces(pid)?;
    let job = AttachJob {
        user: user.as_raw_fd(),
        mnt: mnt.as_raw_fd(),
        source,
        ident,
        is_dir: a.is_dir,
        masks,
        mask_file: plain(a.mask_file)?,
        mask_dir: plain(a.mask_dir)?,
        parts,
    };
    let record = in_child(|| attach_child(&job))?;
    drop((mnt, user));
    check(record, a.at)?;
    Ok(Attached { took: began.elapsed() })
}

/// Detach what is mounted at `at` in the sandbox of process `pid`.
pub fn detach(pid: i32, at: &Path) -> Result<(), MountError> {
    let parts = components(at)?;
    let (mnt, user) = namespaces(pid)?;
    let job = DetachJob { user: user.as_raw_fd(), mnt: mnt.as_raw_fd(), parts };
    let record = in_child(|| detach_child(&job))?;
    check(record, at)
}

pub(super) fn check(record: [i32; 3], at: &Path) -> Result<(), MountError> {
    let [what, _, errno] = record;
    if what == 0 {
        return Ok(());
    }
    match Stage::of(what) {
        Some(stage) => {
            Err(MountError::Step { stage, at: at.to_path_buf(), source: io::Error::from_raw_os_error(errno) })
        }
        None => Err(MountError::NoReport(format!("record {what}"))),
    }
}

/// The components of an absolute, plain path, as C strings (at least one).
pub(super) fn components(at: &Path) -> Result<Vec<CString>, MountError> {
    let bad = || MountError::NotPlain(at.to_path_buf());
    let mut out = Vec::new();
    for (i, c) in at.components().enumerate() {
        match c {
            Component::RootDir if i == 0 => {}
            Component::Normal(name) => out.push(CString::new(name.as_bytes()).map_err(|_| bad())?),
            _ => return Err(bad()),
        }
    }
    // Written as the components say (no `//`, `/./` or trailing `/`).
    let written: usize = out.iter().map(|c| c.as_bytes().len() + 1).sum();
    if out.is_empty() || !at.is_absolute() || written != at.as_os_str().len() {
        return Err(bad());
    }
    if out.len() > MAX_DEPTH {
        return Err(MountError::TooDeep(at.to_path_buf()));
    }
    Ok(out)
}

fn plain(p: &Path) -> Result<CString, MountError> {
    components(p)?;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| MountError::NotPlain(p.to_path_buf()))
}

/// The source's device and inode, looked at without following links.
fn source_ident(source: &Path, is_dir: bool) -> Result<(u64, u64), MountError> {
    let err = |e: io::Error| MountError::Source { path: source.to_path_buf(), source: e };
    let path = plain(source)?;
    let fd = open_no_links(libc::AT_FDCWD, &path, libc::O_PATH).map_err(err)?;
    let st = fstat(fd.as_raw_fd()).map_err(err)?;
    let dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    if dir != is_dir || (!dir && st.st_mode & libc::S_IFMT != libc::S_IFREG) {
        return Err(MountError::SourceKind { path: source.to_path_buf(), dir });
    }
    Ok((st.st_dev, st.st_ino))
}

/// The sandbox's mount namespace and the user namespace that owns it.
pub(super) fn namespaces(pid: i32) -> Result<(OwnedFd, OwnedFd), MountError> {
    let mnt = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).map_err(MountError::Namespace)?;
    let mnt = OwnedFd::from(mnt);
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd.
    let user = unsafe { libc::ioctl(mnt.as_raw_fd(), NS_GET_USERNS) };
    if user < 0 {
        return Err(MountError::Owner(io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd the ioctl made (close-on-exec).
    Ok((mnt, unsafe { OwnedFd::from_raw_fd(user) }))
}

/// Run `job` in a helper process and take its record.
pub(super) fn in_child(job: impl Fn() -> [i32; 3]) -> Result<[i32; 3], MountError> {
    let report = in_helper(|| (job(), -1)).map_err(MountError::Fork)?;
    report.map(|(record, _)| record).map_err(|e| MountError::NoReport(e.to_string()))
}

const NS_GET_USERNS: libc::c_ulong = 0xb701;
pub(super) const OPEN_TREE_CLONE: libc::c_uint = 1;
pub(super) const AT_RECURSIVE: libc::c_uint = 0x8000;
pub(super) const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
pub(super) const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(super) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(super) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(super) const RESOLVE_NO_MAGICLINKS: u64 = 0x2;
pub(super) const RESOLVE_NO_SYMLINKS: u64 = 0x4;
pub(super) const RESOLVE_BENEATH: u64 = 0x8;
pub(super) const UMOUNT_NOFOLLOW: libc::c_int = 0x8;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const EMPTY: &[u8; 1] = b"\0";

pub(super) fn empty() -> *const libc::c_char {
    EMPTY.as_ptr().cast()
}

// Raw system calls, each returning the fd or 0, or -errno. Used by the
// parent and by the helper alike: no allocation.

pub(super) fn sys_openat2(
    dir: RawFd,
    path: *const libc::c_char,
    flags: libc::c_int,
    resolve: u64,
) -> Result<RawFd, i32> {
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: 0, resolve };
    // SAFETY: openat2 reads a NUL-terminated path and an open_how of the given size.
    let r =
        unsafe { libc::syscall(libc::SYS_openat2, dir, path, &how as *const OpenHow, std::mem::size_of::<OpenHow>()) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as RawFd)
    }
}

fn open_no_links(dir: RawFd, path: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    let fd = sys_openat2(dir, path.as_ptr(), flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        .map_err(io::Error::from_raw_os_error)?;
    // SAFETY: a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes within `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

pub(super) fn sys_open_tree(dir: RawFd, path: *const libc::c_char, flags: libc::c_uint) -> Result<RawFd, i32> {
    // SAFETY: open_tree reads a NUL-terminated path.
    let r = unsafe { libc::syscall(libc::SYS_open_tree, dir, path, flags | libc::O_CLOEXEC as libc::c_uint) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as RawFd)
    }
}

pub(super) fn sys_setattr(fd: RawFd, flags: libc::c_uint, set: u64, clear: u64) -> Result<(), i32> {
    let attr = MountAttr { attr_set: set, attr_clr: clear, propagation: 0, userns_fd: 0 };
    // SAFETY: mount_setattr reads the empty path and a mount_attr of the given size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            empty(),
            flags | libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub(super) fn sys_move(tree: RawFd, onto: RawFd) -> Result<(), i32> {
    sys_move_flags(tree, onto, 0)
}

/// `move_mount` of the detached tree `tree` onto `onto`, both fds, with
/// `flags` added to the two empty-path flags.
pub(super) fn sys_move_flags(tree: RawFd, onto: RawFd, flags: libc::c_uint) -> Result<(), i32> {
    // SAFETY: move_mount of two fds with empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            empty(),
            onto,
            empty(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH | flags,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn close(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: close of an fd the child opened.
        unsafe { libc::close(fd) };
    }
}

pub(super) fn setns(fd: RawFd, flag: libc::c_int) -> Result<(), i32> {
    // SAFETY: setns on an fd prepared before the helper started.
    if unsafe { libc::setns(fd, flag) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// The mount id of `fd`'s mount.
pub(super) fn mount_id(fd: RawFd) -> Result<u64, i32> {
    // SAFETY: an all-zero statx is valid; statx fills it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx of an fd, with the empty path, into `stx`.
    let r = unsafe { libc::statx(fd, empty(), libc::AT_EMPTY_PATH, libc::STATX_MNT_ID, &mut stx) };
    if r != 0 {
        return Err(errno());
    }
    Ok(stx.stx_mnt_id)
}

// Below: the helpers. Raw system calls on prepared memory only.

struct AttachJob {
    user: RawFd,
    mnt: RawFd,
    source: CString,
    ident: (u64, u64),
    is_dir: bool,
    masks: Vec<(CString, bool)>,
    mask_file: CString,
    mask_dir: CString,
    parts: Vec<CString>,
}

struct DetachJob {
    user: RawFd,
    mnt: RawFd,
    parts: Vec<CString>,
}

pub(super) fn fail(stage: Stage, index: usize, errno: i32) -> [i32; 3] {
    [stage.code(), index as i32, errno]
}

/// An fd the child closes when it goes out of scope (no allocation).
pub(super) struct Fd(pub(super) RawFd);

impl Drop for Fd {
    fn drop(&mut self) {
        close(self.0);
    }
}

fn attach_child(job: &AttachJob) -> [i32; 3] {
    match attach_steps(job) {
        Ok(()) => [0, 0, 0],
        Err(record) => record,
    }
}

fn attach_steps(job: &AttachJob) -> Result<(), [i32; 3]> {
    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    setns(job.user, libc::CLONE_NEWUSER).map_err(|e| fail(Stage::JoinUser, 0, e))?;
    // SAFETY: unshare of the calling (single-threaded) child.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(fail(Stage::Unshare, 0, errno()));
    }
    // The masks, in the helper's private copy of the host's mounts.
    for (i, (path, is_dir)) in job.masks.iter().enumerate() {
        let from = if *is_dir { &job.mask_dir } else { &job.mask_file };
        let mask =
            Fd(sys_open_tree(libc::AT_FDCWD, from.as_ptr(), OPEN_TREE_CLONE)
                .map_err(|e| fail(Stage::CloneMask, i, e))?);
        sys_setattr(mask.0, 0, ro, 0).map_err(|e| fail(Stage::ReadOnly, i, e))?;
        let secret =
            Fd(sys_openat2(libc::AT_FDCWD, path.as_ptr(), libc::O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
                .map_err(|e| fail(Stage::OpenSecret, i, e))?);
        sys_move(mask.0, secret.0).map_err(|e| fail(Stage::MoveMask, i, e))?;
    }
    let source =
        Fd(sys_openat2(libc::AT_FDCWD, job.source.as_ptr(), libc::O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
            .map_err(|e| fail(Stage::OpenSource, 0, e))?);
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes within `st`.
    if unsafe { libc::fstat(source.0, &mut st) } != 0 {
        return Err(fail(Stage::OpenSource, 0, errno()));
    }
    if (st.st_dev, st.st_ino) != job.ident {
        return Err(fail(Stage::SourceChanged, 0, libc::ESTALE));
    }
    let tree =
        Fd(sys_open_tree(source.0, empty(), OPEN_TREE_CLONE | AT_RECURSIVE | libc::AT_EMPTY_PATH as libc::c_uint)
            .map_err(|e| fail(Stage::CloneSource, 0, e))?);
    sys_setattr(tree.0, AT_RECURSIVE, ro, 0).map_err(|e| fail(Stage::ReadOnly, 0, e))?;
    setns(job.mnt, libc::CLONE_NEWNS).map_err(|e| fail(Stage::JoinMount, 0, e))?;
    let point = Fd(mount_point(&job.parts, job.is_dir)?);
    sys_move(tree.0, point.0).map_err(|e| fail(Stage::Attach, 0, e))
}

/// Single-component resolution flags: beneath the fd, no link followed.
pub(super) const WALK: u64 = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

/// The mount point `parts` beneath the sandbox's root (the helper's root
/// since it joined the mount namespace), made where it is missing.
fn mount_point(parts: &[CString], is_dir: bool) -> Result<RawFd, [i32; 3]> {
    let root = Fd(sys_openat2(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
        .map_err(|e| fail(Stage::OpenRoot, 0, e))?);
    let root_mount = mount_id(root.0).map_err(|e| fail(Stage::OpenRoot, 0, e))?;
    let last = parts.len() - 1;
    let kind = |i: usize| if i < last || is_dir { libc::O_DIRECTORY } else { 0 };
    let mut cur = Fd(-1);
    let mut on_root = true;
    for (i, part) in parts.iter().enumerate() {
        let dir = if cur.0 < 0 { root.0 } else { cur.0 };
        match sys_openat2(dir, part.as_ptr(), libc::O_PATH | kind(i), WALK) {
            Ok(fd) => {
                if i < last {
                    on_root = on_root && mount_id(fd).is_ok_and(|m| m == root_mount);
                }
                cur = Fd(fd);
            }
            Err(libc::ENOENT) if !on_root => return Err(fail(Stage::NotOnRoot, i, libc::EXDEV)),
            Err(libc::ENOENT) => {
                make_missing(root.0, parts, i, is_dir)?;
                // The same components again, on the sandbox's own mount.
                for (j, part) in parts.iter().enumerate().skip(i) {
                    let dir = if cur.0 < 0 { root.0 } else { cur.0 };
                    let fd = sys_openat2(dir, part.as_ptr(), libc::O_PATH | kind(j), WALK)
                        .map_err(|e| fail(Stage::Walk, j, e))?;
                    cur = Fd(fd);
                }
                break;
            }
            Err(e) => return Err(fail(Stage::Walk, i, e)),
        }
    }
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes within `st`.
    if unsafe { libc::fstat(cur.0, &mut st) } != 0 {
        return Err(fail(Stage::Kind, last, errno()));
    }
    let want = if is_dir { libc::S_IFDIR } else { libc::S_IFREG };
    if st.st_mode & libc::S_IFMT != want {
        return Err(fail(Stage::Kind, last, libc::ENOTDIR));
    }
    let fd = cur.0;
    std::mem::forget(cur);
    Ok(fd)
}

/// Make `parts[from..]` (the last a file unless `is_dir`) through a
/// detached, writable clone of the root mount: the same directories, and
/// the sandbox's own mount of them never writable.
fn make_missing(root: RawFd, parts: &[CString], from: usize, is_dir: bool) -> Result<(), [i32; 3]> {
    let writable = Fd(sys_open_tree(root, empty(), OPEN_TREE_CLONE | libc::AT_EMPTY_PATH as libc::c_uint)
        .map_err(|e| fail(Stage::WritableRoot, from, e))?);
    sys_setattr(writable.0, 0, 0, MOUNT_ATTR_RDONLY).map_err(|e| fail(Stage::WritableRoot, from, e))?;
    let mut cur = Fd(-1);
    let last = parts.len() - 1;
    for (i, part) in parts.iter().enumerate() {
        let dir = if cur.0 < 0 { writable.0 } else { cur.0 };
        if i >= from && i == last && !is_dir {
            // SAFETY: openat of a NUL-terminated name beneath an fd the child holds.
            let fd = unsafe {
                libc::openat(
                    dir,
                    part.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    0o444,
                )
            };
            if fd < 0 {
                return Err(fail(Stage::MakePoint, i, errno()));
            }
            close(fd);
            return Ok(());
        }
        // SAFETY: mkdirat of a NUL-terminated name beneath an fd the child holds.
        if i >= from && unsafe { libc::mkdirat(dir, part.as_ptr(), 0o755) } != 0 && errno() != libc::EEXIST {
            return Err(fail(Stage::MakePoint, i, errno()));
        }
        let fd = sys_openat2(dir, part.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, WALK)
            .map_err(|e| fail(Stage::Walk, i, e))?;
        cur = Fd(fd);
    }
    Ok(())
}

fn detach_child(job: &DetachJob) -> [i32; 3] {
    let steps = || -> Result<(), [i32; 3]> {
        setns(job.user, libc::CLONE_NEWUSER).map_err(|e| fail(Stage::JoinUser, 0, e))?;
        setns(job.mnt, libc::CLONE_NEWNS).map_err(|e| fail(Stage::JoinMount, 0, e))?;
        let (name, parents) = job.parts.split_last().ok_or(fail(Stage::Walk, 0, libc::EINVAL))?;
        let mut cur =
            Fd(sys_openat2(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
                .map_err(|e| fail(Stage::OpenRoot, 0, e))?);
        for (i, part) in parents.iter().enumerate() {
            cur = Fd(sys_openat2(cur.0, part.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, WALK)
                .map_err(|e| fail(Stage::Walk, i, e))?);
        }
        // SAFETY: fchdir to an fd the child holds.
        if unsafe { libc::fchdir(cur.0) } != 0 {
            return Err(fail(Stage::Detach, parents.len(), errno()));
        }
        // SAFETY: umount2 of one NUL-terminated name relative to the
        // working directory, the last component not followed.
        if unsafe { libc::umount2(name.as_ptr(), libc::MNT_DETACH | UMOUNT_NOFOLLOW) } != 0 {
            return Err(fail(Stage::Detach, parents.len(), errno()));
        }
        Ok(())
    };
    match steps() {
        Ok(()) => [0, 0, 0],
        Err(record) => record,
    }
}
