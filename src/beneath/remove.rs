//! Removing a tree the sandbox could write, never following a link in
//! it and bounded against a tree that keeps refilling.
use super::*;

/// Most entries [`remove_tree`] visits (every entry of every directory,
/// each time it is listed) before it gives up on a tree that keeps
/// refilling. Far above any real tree: a site-packages is ~100,000.
const REMOVE_MAX_ENTRIES: u64 = 1 << 25;

/// Names read from one directory at a time while emptying it.
const REMOVE_BATCH: usize = 1024;

#[cfg(test)]
thread_local! {
    /// Called by the removal for every entry it visits, so that a test can
    /// keep refilling the tree.
    pub static REMOVE_HOOK: std::cell::RefCell<Option<Box<dyn FnMut()>>> = const { std::cell::RefCell::new(None) };
}

/// Delete the tree at `path`, which the host made (a session directory)
/// and whose contents the sandbox may have written; a missing `path` is
/// already deleted.
///
/// Iterative, so that neither the depth of the tree nor its width costs
/// stack or fds (std's `remove_dir_all` recurses and holds an fd per
/// level: 15,000 nested directories overflowed Node's stack). The root is
/// emptied until a listing of it finds nothing: an entry that is not a
/// directory is unlinked; a directory is emptied one level, its
/// subdirectories renamed up into the root (where a later listing of the
/// root finds them) and everything else unlinked, then removed. Every
/// step names one entry of a directory held by fd and acts with
/// `unlinkat`/`renameat`, which act on a link itself: nothing follows a
/// link, and nothing leaves the tree (a rename cannot leave the file
/// system, and a directory on another device is refused). An entry that
/// changes kind or vanishes meanwhile is simply listed again; a tree that
/// keeps refilling fails after [`REMOVE_MAX_ENTRIES`].
pub fn remove_tree(path: &Path) -> io::Result<()> {
    remove_tree_within(path, REMOVE_MAX_ENTRIES)
}

pub(super) fn remove_tree_within(path: &Path, max_entries: u64) -> io::Result<()> {
    let root = match open_emptiable(nix::fcntl::AT_FDCWD, path.as_os_str(), None) {
        Ok(Some(root)) => root,
        Ok(None) => return Ok(()),
        Err(e) => return Err(io::Error::new(e.kind(), format!("removing {}: {e}", path.display()))),
    };
    let mut rm = Removal {
        path,
        dev: root.1,
        root: root.0,
        left: max_entries,
        max: max_entries,
        tag: crate::random::random_u64(),
        seq: 0,
    };
    loop {
        rm.empty_root()?;
        match rmdir_in(nix::fcntl::AT_FDCWD, path.as_os_str()) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(()),
            // Refilled since the last listing.
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => rm.charge()?,
            Err(e) => return Err(rm.fail("rmdir", path.as_os_str(), e)),
        }
    }
}

/// Open the directory `name` of `dir` (`O_PATH`, never following a link)
/// so that it can be emptied: with `u+rwx` restored when the sandbox took
/// it away, and with its device number. `None` when it is gone; ENOTDIR
/// when it is not a directory (a link included). On another device than
/// `dev` (a mount point) it is refused.
fn open_emptiable(dir: BorrowedFd<'_>, name: &OsStr, dev: Option<u64>) -> io::Result<Option<(OwnedFd, u64)>> {
    let fd = match nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(errno(e)),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(errno)?;
    if dev.is_some_and(|dev| dev != st.st_dev) {
        return Err(io::Error::new(
            io::ErrorKind::CrossesDevices,
            "a directory on another file system (a mount point): not removed",
        ));
    }
    if st.st_mode & 0o700 != 0o700 {
        owner_only(fd.as_fd())?;
    }
    Ok(Some((fd, st.st_dev)))
}

/// Set mode 0700 on the directory held by the `O_PATH` fd `fd`, so that
/// the host, its owner, can list and empty it whatever mode the sandbox
/// left. `fchmod` refuses an `O_PATH` fd (EBADF) and a directory without
/// `r` opens no other way, so: `fchmodat2(fd, "", AT_EMPTY_PATH)` (Linux
/// 6.6), else `chmod` of `/proc/self/fd/N`, which is the inode the fd holds
/// (glibc's `fchmodat(AT_SYMLINK_NOFOLLOW)` does the same). Neither
/// resolves a name the sandbox can change.
pub(super) fn owner_only(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fchmodat2 reads the NUL-terminated empty path and nothing
    // else; `fd` is open for the duration of the call.
    let r = unsafe {
        libc::syscall(libc::SYS_fchmodat2, fd.as_raw_fd(), c"".as_ptr(), 0o700 as libc::c_uint, libc::AT_EMPTY_PATH)
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Before Linux 6.6, or refused by a seccomp filter.
        Some(libc::ENOSYS | libc::EPERM | libc::EINVAL) => owner_only_by_proc(fd),
        _ => Err(e),
    }
}

/// `chmod 0700 /proc/self/fd/N`: the magic link resolves to the inode `fd`
/// holds, whatever name it has now.
pub(super) fn owner_only_by_proc(fd: BorrowedFd<'_>) -> io::Result<()> {
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    std::fs::set_permissions(by_fd, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// `unlinkat(dir, name, 0)`: a link is unlinked, not followed; EISDIR
/// for a directory.
fn unlink_in(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(), Errno> {
    nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
}

/// `unlinkat(dir, name, AT_REMOVEDIR)`: only an empty directory goes.
fn rmdir_in(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(), Errno> {
    nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::RemoveDir)
}

/// A listing of the directory held by the `O_PATH` fd `dir` (see
/// [`list_dir`]), at most [`REMOVE_BATCH`] names; empty once the directory
/// itself has been removed.
fn list_for_removal(dir: BorrowedFd<'_>) -> io::Result<Vec<(OsString, Kind)>> {
    match nix::fcntl::openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => Ok(list_dir(fd, REMOVE_BATCH)?.0),
        Err(Errno::ENOENT) => Ok(Vec::new()),
        Err(e) => Err(errno(e)),
    }
}

/// One run of [`remove_tree`].
struct Removal<'a> {
    path: &'a Path,
    /// The tree's root, `O_PATH`.
    root: OwnedFd,
    dev: u64,
    /// Entries still to visit before giving up, of `max`.
    left: u64,
    max: u64,
    /// Random, so that the names directories are moved up to are not
    /// names the sandbox planted; `seq` counts them.
    tag: u64,
    seq: u64,
}

impl Removal<'_> {
    /// Count one more entry visited.
    fn charge(&mut self) -> io::Result<()> {
        #[cfg(test)]
        REMOVE_HOOK.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f()
            }
        });
        if self.left == 0 {
            return Err(io::Error::other(format!(
                "removing {}: still not empty after {} entries: something keeps writing into it",
                self.path.display(),
                self.max
            )));
        }
        self.left -= 1;
        Ok(())
    }

    fn fail(&self, what: &str, name: &OsStr, e: Errno) -> io::Error {
        io::Error::new(io::Error::from(e).kind(), format!("removing {}: {what} {name:?}: {e}", self.path.display()))
    }

    fn context(&self, name: &OsStr, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("removing {}: {name:?}: {e}", self.path.display()))
    }

    /// List the root until it is empty: unlink what is not a directory,
    /// empty and remove what is.
    fn empty_root(&mut self) -> io::Result<()> {
        loop {
            let batch = list_for_removal(self.root.as_fd()).map_err(|e| self.context(OsStr::new("."), e))?;
            if batch.is_empty() {
                return Ok(());
            }
            for (name, kind) in batch {
                self.charge()?;
                match kind {
                    Kind::Dir => self.remove_dir(&name)?,
                    Kind::File | Kind::Link | Kind::Other => {
                        match unlink_in(self.root.as_fd(), &name) {
                            // EISDIR: a directory by now; the next listing says so.
                            Ok(()) | Err(Errno::ENOENT | Errno::EISDIR) => {}
                            Err(e) => return Err(self.fail("unlink", &name, e)),
                        }
                    }
                }
            }
        }
    }

    /// Empty the directory `name` of the root by one level (its
    /// subdirectories move up into the root, the rest is unlinked), then
    /// remove it.
    fn remove_dir(&mut self, name: &OsStr) -> io::Result<()> {
        let dir = match open_emptiable(self.root.as_fd(), name, Some(self.dev)) {
            Ok(Some((dir, _))) => dir,
            Ok(None) => return Ok(()),
            // Not a directory by now: the next listing of the root says what.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => return Ok(()),
            Err(e) => return Err(self.context(name, e)),
        };
        loop {
            let batch = list_for_removal(dir.as_fd()).map_err(|e| self.context(name, e))?;
            if batch.is_empty() {
                break;
            }
            for (child, kind) in batch {
                self.charge()?;
                match kind {
                    Kind::Dir => self.move_up(dir.as_fd(), &child)?,
                    Kind::File | Kind::Link | Kind::Other => match unlink_in(dir.as_fd(), &child) {
                        Ok(()) | Err(Errno::ENOENT) => {}
                        Err(Errno::EISDIR) => self.move_up(dir.as_fd(), &child)?,
                        Err(e) => return Err(self.fail("unlink", &child, e)),
                    },
                }
            }
        }
        match rmdir_in(self.root.as_fd(), name) {
            // ENOTEMPTY: refilled; ENOTDIR: replaced. The root's next
            // listing finds it again either way.
            Ok(()) | Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOTDIR) => Ok(()),
            Err(e) => Err(self.fail("rmdir", name, e)),
        }
    }

    /// Rename the subdirectory `child` of `dir` into the root under a
    /// fresh name. `renameat` moves a link itself, should `child` be one by
    /// now, and cannot leave the file system.
    fn move_up(&mut self, dir: BorrowedFd<'_>, child: &OsStr) -> io::Result<()> {
        let mut restored = false;
        loop {
            self.seq += 1;
            let to = format!(".pps-rm-{:016x}-{}", self.tag, self.seq);
            match nix::fcntl::renameat(dir, child, &self.root, to.as_str()) {
                Ok(()) | Err(Errno::ENOENT) => return Ok(()),
                // The name is taken in the root: another one.
                Err(Errno::EEXIST | Errno::ENOTEMPTY | Errno::ENOTDIR | Errno::EISDIR) => self.charge()?,
                // Moving a directory writes its `..`: it needs u+w.
                Err(Errno::EACCES) if !restored => {
                    restored = true;
                    match open_emptiable(dir, child, Some(self.dev)) {
                        Ok(Some(_)) => {}
                        Ok(None) => return Ok(()),
                        // Not a directory by now: it moves as it is.
                        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {}
                        Err(e) => return Err(self.context(child, e)),
                    }
                }
                Err(e) => return Err(self.fail("rename", child, e)),
            }
        }
    }
}
