//! What the sandbox's processes hold in a read root revoked live (see
//! `live_grants::revoke`). Detaching a mount takes it away from new
//! lookups by path only: a working directory, a root or a descriptor on
//! the detached tree keeps the whole tree readable, files made there
//! later included. Before the detach, the sandbox's processes are stopped
//! ([`Frozen`]), so that none can pass such a thing on while they are
//! looked at; after it, every task's working directory, root and open
//! directories are compared by mount id with the mounts the revoked roots
//! had ([`mount_ids`]). One on them means the sandbox restarts; an open
//! file keeps that file only, as it would anywhere.
//!
//! Everything read here is the sandbox's to shape: link targets are never
//! read as names (the object is looked at through the `/proc` link, by
//! `statx`), and the work is bounded whatever the sandbox holds.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// At most this many links are looked at (working directories, roots and
/// descriptors of every task; threads that share a table count each): a
/// few hundred milliseconds of the host's time at most. More means the
/// sandbox restarts.
const MAX_LINKS: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error("the sandbox's processes could not be listed: {0}")]
    List(#[source] io::Error),
    #[error("the sandbox's mount table could not be read: {0}")]
    Mounts(#[source] io::Error),
    #[error("not every process of the sandbox stopped within {0:?} to be looked at")]
    NotStopped(Duration),
    #[error("the sandbox's processes hold more than {MAX_LINKS} descriptors and directories to look at")]
    TooMany,
    #[error("what a process of the sandbox holds could not be looked at: {0}")]
    Look(#[source] io::Error),
}

/// What a process held on a revoked mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// "its working directory", "its root directory" or "an open directory".
    pub what: &'static str,
    /// The revoked root the mount belonged to.
    pub root: PathBuf,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a process of the sandbox held {} in the revoked read root {}, which would have kept the whole tree readable",
            self.what,
            crate::display::one_line(&self.root)
        )
    }
}

/// The mount ids at each of `roots` and beneath it in the mount namespace
/// of process `pid`, as `/proc/PID/mountinfo` lists them (mount points as
/// that process's root sees them), each with its root.
pub fn mount_ids(pid: i32, roots: &[PathBuf]) -> Result<HashMap<u64, PathBuf>, HeldError> {
    let text = std::fs::read(format!("/proc/{pid}/mountinfo")).map_err(HeldError::Mounts)?;
    Ok(ids_in(&text, roots))
}

fn ids_in(text: &[u8], roots: &[PathBuf]) -> HashMap<u64, PathBuf> {
    let mut out = HashMap::new();
    for line in text.split(|&b| b == b'\n') {
        let mut fields = line.split(|&b| b == b' ');
        let Some(id) = fields.next().and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok()) else {
            continue;
        };
        let Some(point) = fields.nth(3) else { continue };
        let point = unescape(point);
        for root in roots {
            let root = root.as_os_str().as_bytes();
            if point.starts_with(root) && (point.len() == root.len() || point[root.len()] == b'/') {
                out.insert(id, PathBuf::from(std::ffi::OsStr::from_bytes(root)));
            }
        }
    }
    out
}

/// A mount point as the kernel writes it: space, tab, newline and
/// backslash as three octal digits after a backslash.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let digits =
            field.get(i + 1..i + 4).filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match digits {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

struct Stopped {
    pid: i32,
    pidfd: OwnedFd,
    /// Stopped already before this stopped it: left stopped.
    was_stopped: bool,
}

/// The processes of a sandbox's PID namespace, stopped (SIGSTOP, through
/// a pidfd each, so that a reused pid is never signalled). Dropping it
/// continues them; [`Frozen::leave_stopped`] does not (for a sandbox about
/// to be killed).
pub struct Frozen {
    procs: Vec<Stopped>,
}

impl Frozen {
    /// Stop every process in the PID namespace of `inside` (a process of
    /// the sandbox, as the host numbers it), until a listing made after
    /// all were seen stopped finds no new one; or fail after `wait`.
    pub fn stop(inside: i32, wait: Duration) -> Result<Frozen, HeldError> {
        let ns = std::fs::metadata(format!("/proc/{inside}/ns/pid")).map_err(HeldError::List)?;
        let ns = (ns.dev(), ns.ino());
        // Never the host's own namespace (everything there would stop).
        let own = std::fs::metadata("/proc/self/ns/pid").map_err(HeldError::List)?;
        if (own.dev(), own.ino()) == ns {
            return Err(HeldError::List(io::Error::other("the process is in the host's own PID namespace")));
        }
        let mut frozen = Frozen { procs: Vec::new() };
        let mut known = HashSet::new();
        let deadline = Instant::now() + wait;
        let mut settled = false;
        loop {
            let added = frozen.stop_new(ns, &mut known)?;
            if !added && settled {
                return Ok(frozen);
            }
            settled = !added && frozen.procs.iter().all(|p| all_stopped(p.pid));
            if !settled {
                if Instant::now() > deadline {
                    return Err(HeldError::NotStopped(wait));
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    }

    /// Stop the processes of namespace `ns` not in `known`; whether any was.
    fn stop_new(&mut self, ns: (u64, u64), known: &mut HashSet<i32>) -> Result<bool, HeldError> {
        let mut added = false;
        for entry in std::fs::read_dir("/proc").map_err(HeldError::List)? {
            let Some(pid) = entry.ok().and_then(|e| e.file_name().to_str()?.parse::<i32>().ok()) else { continue };
            if known.contains(&pid) {
                continue;
            }
            let Some(pidfd) = pidfd_open(pid) else { continue };
            // Its namespace, read after the pidfd was taken: a pid reused
            // since is a process that ended, which no signal reaches.
            let in_ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).is_ok_and(|m| (m.dev(), m.ino()) == ns);
            if !in_ns {
                continue;
            }
            let was_stopped = all_stopped(pid);
            known.insert(pid);
            added = true;
            if send(&pidfd, libc::SIGSTOP) {
                self.procs.push(Stopped { pid, pidfd, was_stopped });
            }
        }
        Ok(added)
    }

    /// The first thing a task of a stopped process holds on one of the
    /// mounts `ids`, or `None`.
    pub fn holding(&self, ids: &HashMap<u64, PathBuf>) -> Result<Option<Held>, HeldError> {
        let mut budget = MAX_LINKS;
        for p in &self.procs {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", p.pid)) else { continue };
            for task in tasks.flatten() {
                let dir = task.path();
                for (link, what) in [("cwd", "its working directory"), ("root", "its root directory")] {
                    if let Some(root) = on(&dir.join(link), ids, &mut budget, false)? {
                        return Ok(Some(Held { what, root }));
                    }
                }
                let Ok(fds) = std::fs::read_dir(dir.join("fd")) else { continue };
                for fd in fds.flatten() {
                    // An open file keeps that file only, as it would anywhere.
                    if let Some(root) = on(&fd.path(), ids, &mut budget, true)? {
                        return Ok(Some(Held { what: "an open directory", root }));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Forget the processes without continuing them: they are about to be
    /// killed, and must not run on the detached tree until then.
    pub fn leave_stopped(mut self) {
        self.procs.clear();
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for p in self.procs.iter().filter(|p| !p.was_stopped) {
            send(&p.pidfd, libc::SIGCONT);
        }
    }
}

/// The revoked root whose mount the object behind `/proc` link `link`
/// is on (a directory only, with `dirs_only`), or `None`. A link gone
/// (its task ended) is nothing.
fn on(
    link: &Path,
    ids: &HashMap<u64, PathBuf>,
    budget: &mut usize,
    dirs_only: bool,
) -> Result<Option<PathBuf>, HeldError> {
    *budget = budget.checked_sub(1).ok_or(HeldError::TooMany)?;
    match mount_id(link) {
        Ok((_, false)) if dirs_only => Ok(None),
        Ok((id, _)) => Ok(ids.get(&id).cloned()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => Ok(None),
        Err(e) => Err(HeldError::Look(e)),
    }
}

/// The mount id of what `link` leads to (followed: a `/proc` link leads
/// to the object itself, whatever name it shows), and whether it is a
/// directory. Cached attributes only: a network file system the object
/// may be on is never asked.
fn mount_id(link: &Path) -> io::Result<(u64, bool)> {
    let path = CString::new(link.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statx is given a NUL-terminated path and a zeroed out-buffer of its own type.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` and `st` outlive the call.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_MNT_ID | libc::STATX_TYPE,
            &mut st,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    Ok((st.stx_mnt_id, u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR))
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Send `sig` through `pidfd`; whether it was sent.
fn send(pidfd: &OwnedFd, sig: i32) -> bool {
    // SAFETY: pidfd_send_signal takes a pidfd, a signal, a null info and flags.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0) == 0 }
}

/// Whether every task of process `pid` is stopped, traced-stopped or
/// dead (a process gone counts as stopped).
fn all_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.flatten().all(|t| {
        let Ok(stat) = std::fs::read(t.path().join("stat")) else { return true };
        // The state follows the name, which may hold anything: after the last ')'.
        let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2));
        matches!(state, Some(b'T' | b't' | b'Z' | b'X'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_ids_take_the_root_and_what_is_beneath_it_only() {
        let table = b"20 1 0:5 / / rw - tmpfs none rw\n\
            31 20 8:1 /data /var/tmp/my\\040root ro - ext4 /dev/sda1 ro\n\
            32 31 0:7 / /var/tmp/my\\040root/.ssh ro - tmpfs none ro\n\
            33 20 8:1 /x /var/tmp/my\\040rootless ro - ext4 /dev/sda1 ro\n\
            34 20 8:1 /x /var/tmp ro - ext4 /dev/sda1 ro\n";
        let root = PathBuf::from("/var/tmp/my root");
        let ids = ids_in(table, std::slice::from_ref(&root));
        let mut got: Vec<_> = ids.keys().copied().collect();
        got.sort();
        assert_eq!(got, [31, 32]);
        assert_eq!(ids[&32], root);
    }

    #[test]
    fn a_mount_point_is_unescaped_as_the_kernel_escapes_it() {
        assert_eq!(unescape(b"/a\\040b\\011c\\012d\\134e\\9"), b"/a b\tc\nd\\e\\9");
    }

    #[test]
    fn a_link_is_looked_at_through_the_object_and_the_work_is_bounded() {
        let cwd = Path::new("/proc/self/cwd");
        let (id, dir) = mount_id(cwd).unwrap_or_default();
        assert!(dir, "a working directory is a directory");
        let ids = HashMap::from([(id, PathBuf::from("/revoked"))]);
        let mut budget = 1;
        assert_eq!(on(cwd, &ids, &mut budget, true).ok().flatten(), Some(PathBuf::from("/revoked")));
        assert!(matches!(on(cwd, &ids, &mut budget, true), Err(HeldError::TooMany)));
        // A descriptor on a file counts only where files do.
        let file = Path::new("/proc/self/exe");
        let mut budget = 2;
        let (file_id, _) = mount_id(file).unwrap_or_default();
        let ids = HashMap::from([(file_id, PathBuf::from("/revoked"))]);
        assert_eq!(on(file, &ids, &mut budget, true).ok().flatten(), None);
        assert_eq!(on(file, &ids, &mut budget, false).ok().flatten(), Some(PathBuf::from("/revoked")));
    }

    #[test]
    fn the_hosts_own_namespace_is_never_stopped() {
        let me = std::process::id() as i32;
        assert!(matches!(Frozen::stop(me, Duration::from_millis(10)), Err(HeldError::List(_))));
    }
}
