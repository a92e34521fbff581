//! The held sandbox's `/proc` hardened by a helper forked from the host
//! (see the parent module for the rules of the forked child), after
//! bubblewrap has made its mounts and before the payload runs: kernel
//! interfaces bound read-only onto themselves, and kernel information files
//! hidden under the session's empty read-only file or directory. The same
//! mounts bubblewrap's `--ro-bind-try P P` and `--ro-bind MASK P` make,
//! without its cost: bubblewrap reads the whole mount table again after
//! each bind it makes.
//!
//! Bubblewrap says the sandbox's pid before it mounts anything; the host
//! first waits until it has made its mounts (see [`wait_mounted`]). In the
//! child:
//! 1. join the user namespace that owns the sandbox's mount namespace
//!    (`NS_GET_USERNS`), then `unshare(CLONE_NEWNS)`: a private copy of the
//!    host's mounts, where the session's empty file and directory are (its
//!    shared mounts become slaves, as in bubblewrap's own namespace);
//! 2. clone the empty file or directory once per mask
//!    (`open_tree(OPEN_TREE_CLONE)`), each made read-only, nosuid and nodev;
//! 3. join the sandbox's mount namespace; each path to make read-only is
//!    opened beneath the sandbox's root without following links
//!    (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), skipped where it is
//!    missing (a kernel without that interface), cloned with its submounts,
//!    the clone made read-only, nosuid and nodev, and moved onto it;
//! 4. each mask's path is opened the same way (it must exist) and its
//!    clone moved onto it.
//!
//! The first failure ends the job with its stage, the path and the errno:
//! the caller does not release the payload. The mounts sit in the mount
//! namespace owned by the sandbox's outer user namespace, as bubblewrap's
//! do: nothing in the sandbox has a capability there, and a copy made in a
//! nested user namespace locks them (read-only, and never unmounted to
//! show what they cover). Which paths are masked is the caller's decision
//! (see `bwrap::PROC_MASKS`).

use std::cell::Cell;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::HELPER_DEADLINE;

use super::mount::{
    components, empty, fail, in_child, namespaces, setns, sys_open_tree, sys_openat2, sys_setattr, Fd, Mask,
    MountError, Stage, AT_RECURSIVE, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, OPEN_TREE_CLONE,
    RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, WALK,
};

/// What the helper mounts in a held sandbox: `read_only` paths bound
/// read-only onto themselves (skipped where missing), then `masks` (each
/// must exist) hidden under `mask_file` or `mask_dir` (host paths).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Held {
    pub read_only: Vec<PathBuf>,
    pub masks: Vec<Mask>,
    pub mask_file: PathBuf,
    pub mask_dir: PathBuf,
}

impl Held {
    pub fn is_empty(&self) -> bool {
        self.read_only.is_empty() && self.masks.is_empty()
    }
}

/// [`Held`] with every path made the C string the child uses: sandbox
/// paths relative to its root, host paths absolute.
#[derive(Debug)]
pub struct Prepared {
    read_only: Vec<CString>,
    masks: Vec<(CString, bool)>,
    mask_file: CString,
    mask_dir: CString,
    /// Each sandbox path as given, for the error.
    paths: Vec<PathBuf>,
}

/// Check and convert `held`'s paths (absolute and plain, see
/// `mount::components`).
pub fn prepare(held: &Held) -> Result<Prepared, MountError> {
    let relative = |p: &Path| -> Result<CString, MountError> {
        components(p)?;
        let rel = p.as_os_str().as_bytes().strip_prefix(b"/").unwrap_or_default();
        CString::new(rel).map_err(|_| MountError::NotPlain(p.to_path_buf()))
    };
    let host = |p: &Path| -> Result<CString, MountError> {
        components(p)?;
        CString::new(p.as_os_str().as_bytes()).map_err(|_| MountError::NotPlain(p.to_path_buf()))
    };
    // The sources are looked at only when there is something to mask.
    let source = |p: &Path| if held.masks.is_empty() { Ok(CString::default()) } else { host(p) };
    Ok(Prepared {
        read_only: held.read_only.iter().map(|p| relative(p)).collect::<Result<_, _>>()?,
        masks: held.masks.iter().map(|m| Ok((relative(&m.path)?, m.is_dir))).collect::<Result<_, MountError>>()?,
        mask_file: source(&held.mask_file)?,
        mask_dir: source(&held.mask_dir)?,
        paths: held.read_only.iter().cloned().chain(held.masks.iter().map(|m| m.path.clone())).collect(),
    })
}

/// Make `job`'s mounts in the held sandbox whose first process is `pid`.
/// Blocking (a fork, a few system calls per path, a wait).
pub fn apply(pid: i32, job: &Prepared) -> Result<(), MountError> {
    if job.read_only.is_empty() && job.masks.is_empty() {
        return Ok(());
    }
    let (mnt, user) = namespaces(pid)?;
    wait_mounted(pid, &user)?;
    // The child's clones, one per mask: memory made before the fork.
    let clones: Vec<Cell<RawFd>> = job.masks.iter().map(|_| Cell::new(-1)).collect();
    let (user_fd, mnt_fd) = (user.as_raw_fd(), mnt.as_raw_fd());
    let record = in_child(|| match steps(user_fd, mnt_fd, job, &clones) {
        Ok(()) => [0, 0, 0],
        Err(record) => record,
    })?;
    drop((mnt, user));
    let at = usize::try_from(record[1]).ok().and_then(|i| job.paths.get(i)).cloned().unwrap_or_default();
    super::mount::check(record, &at)
}

/// How often [`wait_mounted`] looks.
const MOUNTED_POLL: Duration = Duration::from_micros(200);

/// Wait until bubblewrap's process `pid` has made its mounts. Bubblewrap
/// says the pid (`--info-fd`) before it mounts anything, and says nothing
/// when it is done; but its last step before it blocks at `--block-fd` is
/// to leave `owner` (the user namespace that owns its mount namespace) for
/// a nested one (`--disable-userns`), after its last mount and after the
/// host's root is gone from its namespace. No event marks that change: it
/// is looked for every [`MOUNTED_POLL`] (a `stat`), up to the helper's
/// deadline.
fn wait_mounted(pid: i32, owner: &OwnedFd) -> Result<(), MountError> {
    let owner = super::mount::fstat(owner.as_raw_fd()).map_err(MountError::NotMounted)?;
    let path = format!("/proc/{pid}/ns/user");
    let began = Instant::now();
    loop {
        let now = std::fs::metadata(&path).map_err(MountError::NotMounted)?;
        if (now.dev(), now.ino()) != (owner.st_dev, owner.st_ino) {
            return Ok(());
        }
        if began.elapsed() > HELPER_DEADLINE {
            return Err(MountError::NotMounted(io::Error::from(io::ErrorKind::TimedOut)));
        }
        std::thread::sleep(MOUNTED_POLL);
    }
}

// Below: the forked child. Raw system calls on prepared memory only.

fn steps(user: RawFd, mnt: RawFd, job: &Prepared, clones: &[Cell<RawFd>]) -> Result<(), [i32; 3]> {
    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let first_mask = job.read_only.len();
    setns(user, libc::CLONE_NEWUSER).map_err(|e| fail(Stage::JoinUser, 0, e))?;
    // SAFETY: unshare of the calling (single-threaded) child.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(fail(Stage::Unshare, 0, super::errno()));
    }
    if !job.masks.is_empty() {
        let no_links = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
        let file = Fd(sys_openat2(libc::AT_FDCWD, job.mask_file.as_ptr(), libc::O_PATH, no_links)
            .map_err(|e| fail(Stage::CloneMask, first_mask, e))?);
        let dir = Fd(sys_openat2(libc::AT_FDCWD, job.mask_dir.as_ptr(), libc::O_PATH | libc::O_DIRECTORY, no_links)
            .map_err(|e| fail(Stage::CloneMask, first_mask, e))?);
        for (i, ((_, is_dir), slot)) in job.masks.iter().zip(clones).enumerate() {
            let from = if *is_dir { dir.0 } else { file.0 };
            let clone = sys_open_tree(from, empty(), OPEN_TREE_CLONE | libc::AT_EMPTY_PATH as libc::c_uint)
                .map_err(|e| fail(Stage::CloneMask, first_mask + i, e))?;
            slot.set(clone);
            sys_setattr(clone, 0, ro, 0).map_err(|e| fail(Stage::ReadOnly, first_mask + i, e))?;
        }
    }
    setns(mnt, libc::CLONE_NEWNS).map_err(|e| fail(Stage::JoinMount, 0, e))?;
    let root = Fd(sys_openat2(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY, RESOLVE_NO_SYMLINKS)
        .map_err(|e| fail(Stage::OpenRoot, 0, e))?);
    for (i, rel) in job.read_only.iter().enumerate() {
        let at = match sys_openat2(root.0, rel.as_ptr(), libc::O_PATH, WALK) {
            Ok(fd) => Fd(fd),
            Err(libc::ENOENT) => continue,
            Err(e) => return Err(fail(Stage::Walk, i, e)),
        };
        let clone = OPEN_TREE_CLONE | AT_RECURSIVE | libc::AT_EMPTY_PATH as libc::c_uint;
        let tree = Fd(sys_open_tree(at.0, empty(), clone).map_err(|e| fail(Stage::CloneSource, i, e))?);
        sys_setattr(tree.0, AT_RECURSIVE, ro, 0).map_err(|e| fail(Stage::ReadOnly, i, e))?;
        super::mount::sys_move(tree.0, at.0).map_err(|e| fail(Stage::Attach, i, e))?;
    }
    for (i, ((rel, _), slot)) in job.masks.iter().zip(clones).enumerate() {
        let mask = Fd(slot.replace(-1));
        let at =
            Fd(sys_openat2(root.0, rel.as_ptr(), libc::O_PATH, WALK)
                .map_err(|e| fail(Stage::Walk, first_mask + i, e))?);
        super::mount::sys_move(mask.0, at.0).map_err(|e| fail(Stage::Attach, first_mask + i, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_become_relative_to_its_root_and_a_path_that_is_not_plain_is_refused() {
        let held = Held {
            read_only: vec!["/proc/sys".into()],
            masks: vec![Mask { path: "/proc/acpi".into(), is_dir: true }],
            mask_file: "/s/mask-file".into(),
            mask_dir: "/s/mask-dir".into(),
        };
        let job = prepare(&held).unwrap();
        assert_eq!(job.read_only, [c"proc/sys".to_owned()]);
        assert_eq!(job.masks, [(c"proc/acpi".to_owned(), true)]);
        assert_eq!((job.mask_file.as_c_str(), job.mask_dir.as_c_str()), (c"/s/mask-file", c"/s/mask-dir"));
        assert_eq!(job.paths, [PathBuf::from("/proc/sys"), "/proc/acpi".into()]);
        for bad in ["/proc/../etc/shadow", "proc/keys", "/proc//keys", "/proc/keys/"] {
            let mut h = held.clone();
            h.masks[0].path = bad.into();
            assert!(matches!(prepare(&h), Err(MountError::NotPlain(_))), "{bad}");
        }
        assert!(Held::default().is_empty());
        prepare(&Held::default()).expect("nothing to mask, no sources needed");
        assert!(!held.is_empty());
    }
}
