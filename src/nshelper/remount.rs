//! The read-only flag of one mount of a running sandbox, set or cleared
//! by a helper process of the host (see the parent module for the rules
//! of the helper): the project's mount made writable or read-only
//! in place when the permission mode changes, without a restart.
//!
//! In the child: join the user namespace that owns the sandbox's mount
//! namespace, then that mount namespace; find the mount beneath the
//! sandbox's root one component at a time with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: a link on the way fails the
//! job, it is never followed); check that the path is a mount's root (its
//! mount differs from its parent's); `mount_setattr` on that one mount,
//! never its submounts (what is bound over the project, protected paths
//! and secret masks, stays read-only).
//!
//! The kernel refuses to make a mount read-only while a file is open for
//! writing on it (EBUSY): the caller restarts the sandbox instead. A file
//! opened read-only before the mount became writable stays read-only
//! (its open mode is fixed at open).

use std::path::Path;

use super::mount::{
    check, components, fail, in_child, mount_id, namespaces, setns, sys_openat2, sys_setattr, Fd, MountError, Stage,
    MOUNT_ATTR_RDONLY, RESOLVE_NO_SYMLINKS, WALK,
};
use std::ffi::CString;
use std::os::fd::{AsRawFd, RawFd};

/// Make the mount at `at` in the sandbox of process `pid` read-only
/// (`read_only`) or writable. Only that mount: its submounts keep their
/// flags. Blocking (a helper process and a few system calls).
pub fn set_read_only(pid: i32, at: &Path, read_only: bool) -> Result<(), MountError> {
    let parts = components(at)?;
    let (mnt, user) = namespaces(pid)?;
    let job = RemountJob { user: user.as_raw_fd(), mnt: mnt.as_raw_fd(), parts, read_only };
    let record = in_child(|| remount_child(&job))?;
    check(record, at)
}

struct RemountJob {
    user: RawFd,
    mnt: RawFd,
    parts: Vec<CString>,
    read_only: bool,
}

fn remount_child(job: &RemountJob) -> [i32; 3] {
    let steps = || -> Result<(), [i32; 3]> {
        setns(job.user, libc::CLONE_NEWUSER).map_err(|e| fail(Stage::JoinUser, 0, e))?;
        setns(job.mnt, libc::CLONE_NEWNS).map_err(|e| fail(Stage::JoinMount, 0, e))?;
        let root =
            Fd(sys_openat2(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
                .map_err(|e| fail(Stage::OpenRoot, 0, e))?);
        let mut parent = Fd(-1);
        let mut cur = Fd(-1);
        for (i, part) in job.parts.iter().enumerate() {
            let dir = if cur.0 < 0 { root.0 } else { cur.0 };
            let fd = Fd(sys_openat2(dir, part.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, WALK)
                .map_err(|e| fail(Stage::Walk, i, e))?);
            parent = std::mem::replace(&mut cur, fd);
        }
        let last = job.parts.len() - 1;
        let above = if parent.0 < 0 { root.0 } else { parent.0 };
        let (here, there) = (mount_id(cur.0), mount_id(above));
        match (here, there) {
            (Ok(a), Ok(b)) if a != b => {}
            (Err(e), _) | (_, Err(e)) => return Err(fail(Stage::Kind, last, e)),
            _ => return Err(fail(Stage::Kind, last, libc::EINVAL)),
        }
        let (set, clear) = if job.read_only { (MOUNT_ATTR_RDONLY, 0) } else { (0, MOUNT_ATTR_RDONLY) };
        sys_setattr(cur.0, 0, set, clear).map_err(|e| fail(Stage::Remount, last, e))
    };
    match steps() {
        Ok(()) => [0, 0, 0],
        Err(record) => record,
    }
}
