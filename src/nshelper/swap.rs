//! The project's mount of a running sandbox replaced whole, in one step:
//! a new tree (the project, writable or read-only, with what goes over
//! it in a start's order: the directories above protected entries and
//! masks, the protected entries, the secret masks) is built detached in
//! the helper's private copy of the host's mounts, put beneath the
//! sandbox's current mount (`MOVE_MOUNT_BENEATH`), and the current one is
//! detached: the sandbox sees the old tree or the new one, never a tree
//! without its protections. Going to read-only, the current tree is made
//! read-only first, all its mounts (EBUSY while a file is open for
//! writing on one of them: nothing has changed, the caller restarts), so
//! that a process whose working directory or open directory is on the
//! detached tree cannot write through it either. What holds the old tree
//! (a working directory, an open file) keeps seeing it, read-only when
//! the change was to read-only; the caller moves its own processes.
//!
//! Every source is opened beneath the project without following links
//! and checked against the (device, inode) the host planned with; every
//! mount point in the new tree is found the same way.

use std::ffi::CString;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use super::mount::{
    check, components, empty, fail, in_child, namespaces, setns, sys_open_tree, sys_openat2, sys_setattr, Fd,
    MountError, Stage, AT_RECURSIVE, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, OPEN_TREE_CLONE,
    RESOLVE_NO_SYMLINKS, UMOUNT_NOFOLLOW, WALK,
};

const MOVE_MOUNT_BENEATH: libc::c_uint = 0x200;

/// What a bind over the project is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// The project's own entry at the bind's place, whose (device, inode)
    /// the host planned with.
    Project { ident: (u64, u64) },
    /// The session's empty file or directory (a secret's mask).
    Mask { is_dir: bool },
}

/// One bind over the project, at `rel` (relative, plain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    pub rel: PathBuf,
    pub from: From,
    pub read_only: bool,
}

/// The tree that replaces the mount at `at`.
#[derive(Debug, Clone, Copy)]
pub struct Replace<'a> {
    /// The project's canonical host path, and its (device, inode).
    pub project: &'a Path,
    pub ident: (u64, u64),
    pub at: &'a Path,
    pub writable: bool,
    /// In mount order.
    pub over: &'a [Over],
    pub mask_file: &'a Path,
    pub mask_dir: &'a Path,
}

/// Replace the mount at `r.at` in the sandbox of process `pid` (see the
/// module's comment). Blocking (a helper process, a few system calls per bind).
pub fn replace(pid: i32, r: &Replace<'_>) -> Result<(), MountError> {
    let parts = components(r.at)?;
    let project = plain(r.project)?;
    let mut over = Vec::with_capacity(r.over.len());
    for o in r.over {
        let rel =
            CString::new(o.rel.as_os_str().as_encoded_bytes()).map_err(|_| MountError::NotPlain(o.rel.clone()))?;
        components(&Path::new("/").join(&o.rel))?;
        if o.rel.is_absolute() {
            return Err(MountError::NotPlain(o.rel.clone()));
        }
        over.push((rel, o.from.clone(), o.read_only));
    }
    let (mnt, user) = namespaces(pid)?;
    let job = Job {
        user: user.as_raw_fd(),
        mnt: mnt.as_raw_fd(),
        project,
        ident: r.ident,
        writable: r.writable,
        over,
        mask_file: plain(r.mask_file)?,
        mask_dir: plain(r.mask_dir)?,
        parts,
    };
    let record = in_child(|| child(&job))?;
    check(record, r.at)
}

fn plain(p: &Path) -> Result<CString, MountError> {
    components(p)?;
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| MountError::NotPlain(p.to_path_buf()))
}

struct Job {
    user: RawFd,
    mnt: RawFd,
    project: CString,
    ident: (u64, u64),
    writable: bool,
    over: Vec<(CString, From, bool)>,
    mask_file: CString,
    mask_dir: CString,
    parts: Vec<CString>,
}

fn ident(fd: RawFd) -> Result<(u64, u64), i32> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes within `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(super::errno());
    }
    Ok((st.st_dev, st.st_ino))
}

fn child(job: &Job) -> [i32; 3] {
    match steps(job) {
        Ok(()) => [0, 0, 0],
        Err(record) => record,
    }
}

fn steps(job: &Job) -> Result<(), [i32; 3]> {
    let flags = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let clone = OPEN_TREE_CLONE | AT_RECURSIVE | libc::AT_EMPTY_PATH as libc::c_uint;
    setns(job.user, libc::CLONE_NEWUSER).map_err(|e| fail(Stage::JoinUser, 0, e))?;
    // SAFETY: unshare of the calling (single-threaded) child.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(fail(Stage::Unshare, 0, super::errno()));
    }
    let project =
        Fd(sys_openat2(libc::AT_FDCWD, job.project.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
            .map_err(|e| fail(Stage::OpenSource, 0, e))?);
    if ident(project.0).map_err(|e| fail(Stage::OpenSource, 0, e))? != job.ident {
        return Err(fail(Stage::SourceChanged, 0, libc::ESTALE));
    }
    let tree = Fd(sys_open_tree(project.0, empty(), clone).map_err(|e| fail(Stage::CloneSource, 0, e))?);
    // As bubblewrap's --bind and --ro-bind: a writable tree keeps the
    // host's flags (a read-only host mount in it stays so).
    let ro = if job.writable { 0 } else { MOUNT_ATTR_RDONLY };
    sys_setattr(tree.0, AT_RECURSIVE, flags | ro, 0).map_err(|e| fail(Stage::ReadOnly, 0, e))?;
    for (i, (rel, from, read_only)) in job.over.iter().enumerate() {
        let bind = match from {
            From::Project { ident: want } => {
                let src = Fd(sys_openat2(project.0, rel.as_ptr(), libc::O_PATH, WALK)
                    .map_err(|e| fail(Stage::OpenSecret, i + 1, e))?);
                if ident(src.0).map_err(|e| fail(Stage::OpenSecret, i + 1, e))? != *want {
                    return Err(fail(Stage::SourceChanged, i + 1, libc::ESTALE));
                }
                Fd(sys_open_tree(src.0, empty(), clone).map_err(|e| fail(Stage::CloneSource, i + 1, e))?)
            }
            From::Mask { is_dir } => {
                let path = if *is_dir { &job.mask_dir } else { &job.mask_file };
                Fd(sys_open_tree(libc::AT_FDCWD, path.as_ptr(), OPEN_TREE_CLONE)
                    .map_err(|e| fail(Stage::CloneMask, i + 1, e))?)
            }
        };
        let set = if *read_only { flags | MOUNT_ATTR_RDONLY } else { flags };
        sys_setattr(bind.0, AT_RECURSIVE, set, 0).map_err(|e| fail(Stage::ReadOnly, i + 1, e))?;
        // The place in the new tree (with the binds made so far), no link followed.
        let onto = Fd(sys_openat2(tree.0, rel.as_ptr(), libc::O_PATH, WALK).map_err(|e| fail(Stage::Walk, i + 1, e))?);
        super::mount::sys_move_flags(bind.0, onto.0, 0).map_err(|e| fail(Stage::MoveMask, i + 1, e))?;
    }
    setns(job.mnt, libc::CLONE_NEWNS).map_err(|e| fail(Stage::JoinMount, 0, e))?;
    let root = Fd(sys_openat2(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
        .map_err(|e| fail(Stage::OpenRoot, 0, e))?);
    let (name, parents) = job.parts.split_last().ok_or(fail(Stage::Walk, 0, libc::EINVAL))?;
    let mut parent = Fd(-1);
    for (i, part) in parents.iter().enumerate() {
        let dir = if parent.0 < 0 { root.0 } else { parent.0 };
        parent = Fd(sys_openat2(dir, part.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, WALK)
            .map_err(|e| fail(Stage::Walk, i, e))?);
    }
    let dir = if parent.0 < 0 { root.0 } else { parent.0 };
    let old = Fd(sys_openat2(dir, name.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, WALK)
        .map_err(|e| fail(Stage::Walk, parents.len(), e))?);
    if !job.writable {
        // Every mount of the current tree read-only before it goes.
        sys_setattr(old.0, AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0).map_err(|e| fail(Stage::Remount, 0, e))?;
    }
    super::mount::sys_move_flags(tree.0, old.0, MOVE_MOUNT_BENEATH).map_err(|e| fail(Stage::Attach, 0, e))?;
    // SAFETY: fchdir to an fd the child holds.
    if unsafe { libc::fchdir(dir) } != 0 {
        return Err(fail(Stage::Detach, 0, super::errno()));
    }
    // SAFETY: umount2 of one NUL-terminated name relative to the working
    // directory: the top mount there, the old tree.
    if unsafe { libc::umount2(name.as_ptr(), libc::MNT_DETACH | UMOUNT_NOFOLLOW) } != 0 {
        return Err(fail(Stage::Detach, 0, super::errno()));
    }
    Ok(())
}
