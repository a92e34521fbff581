//! The namespace helper: a short-lived process of the host that joins
//! namespaces of a sandbox being started and runs a few prepared steps
//! there (write a value to a file, open a file to hand back), before
//! bubblewrap releases the payload (see `spawn`: `--info-fd` gives the
//! sandbox's pid, `--block-fd` holds the payload until the host says go).
//!
//! The helper is a clone that shares the host's memory (see `vfork`: no
//! copy of pi's page tables), with its own descriptor table, root and
//! working directory; the calling thread waits until it has ended. It makes
//! raw system calls only, on paths, buffers and namespace fds prepared
//! before it (no allocation, no locks), and ends itself at
//! `HELPER_DEADLINE`. It reports one fixed-size record over a socket pair,
//! with at most one fd (SCM_RIGHTS) for a step that opens one. What the steps mean (the sandbox's inotify
//! limits, the proxy's listener in its network namespace) is the callers'
//! business, not this module's. [`mount`] is the one job with more steps:
//! a read-only tree attached to (or detached from) a running sandbox;
//! [`listen`] makes the listener of the sandbox's proxy; [`masks`] makes
//! the held sandbox's `/proc` read-only views and masks.

pub mod listen;
pub mod masks;
pub mod mount;
pub mod remount;
pub mod swap;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A namespace of the sandbox to join. The user namespace is joined first
/// (it gives the capabilities the others need).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    User,
    Net,
    Mount,
}

impl Namespace {
    fn proc_name(self) -> &'static str {
        match self {
            Namespace::User => "user",
            Namespace::Net => "net",
            Namespace::Mount => "mnt",
        }
    }

    fn clone_flag(self) -> libc::c_int {
        match self {
            Namespace::User => libc::CLONE_NEWUSER,
            Namespace::Net => libc::CLONE_NEWNET,
            Namespace::Mount => libc::CLONE_NEWNS,
        }
    }

    fn order(self) -> u8 {
        match self {
            Namespace::User => 0,
            Namespace::Net => 1,
            Namespace::Mount => 2,
        }
    }
}

/// One thing the helper does inside the namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Open `path` for writing and write `bytes` in one call.
    Write { path: CString, bytes: Vec<u8> },
    /// Open `path` with `flags` (close-on-exec added) and hand the fd back;
    /// at most one per action.
    Open { path: CString, flags: libc::c_int },
}

impl Step {
    /// A write of `value` to a file such as a sysctl.
    pub fn write(path: &str, value: &str) -> Step {
        Step::Write { path: cstring(path), bytes: value.as_bytes().to_vec() }
    }

    fn path(&self) -> &CString {
        match self {
            Step::Write { path, .. } | Step::Open { path, .. } => path,
        }
    }
}

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

/// How the helper failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("the sandbox's {ns} namespace could not be opened: {source}")]
    OpenNamespace { ns: &'static str, source: io::Error },
    #[error("the helper process could not be started: {0}")]
    Fork(io::Error),
    #[error("the helper could not join the sandbox's {ns} namespace: {source}")]
    Join { ns: &'static str, source: io::Error },
    #[error("the helper could not open {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("the helper could not write {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("the helper did not report ({0})")]
    NoReport(String),
    #[error("the helper could not {step} (port {port}) in the sandbox's network namespace: {source}")]
    Listen { step: &'static str, port: u16, source: io::Error },
    #[error("more than one step hands an fd back")]
    TwoFds,
}

/// How long the helper may take before it is killed.
pub const HELPER_DEADLINE: Duration = Duration::from_secs(2);

// The record the child sends: what failed (0: nothing), at which index,
// and the errno.
const OK: i32 = 0;
const FAILED_JOIN: i32 = 1;
const FAILED_OPEN: i32 = 2;
const FAILED_WRITE: i32 = 3;

/// Join `namespaces` of process `pid` in a helper process and run `steps`
/// there, in order; the fd of the `Step::Open`, if there is one. Blocking
/// (a clone, a few system calls, a wait: well under a millisecond).
pub fn run(pid: i32, namespaces: &[Namespace], steps: &[Step]) -> Result<Option<OwnedFd>, HelperError> {
    if steps.iter().filter(|s| matches!(s, Step::Open { .. })).count() > 1 {
        return Err(HelperError::TwoFds);
    }
    let mut namespaces = namespaces.to_vec();
    namespaces.sort_by_key(|n| n.order());
    namespaces.dedup();
    // Everything the helper touches, made before it starts.
    let mut ns_fds = Vec::with_capacity(namespaces.len());
    for ns in &namespaces {
        let path = format!("/proc/{pid}/ns/{}", ns.proc_name());
        let fd =
            std::fs::File::open(&path).map_err(|source| HelperError::OpenNamespace { ns: ns.proc_name(), source })?;
        ns_fds.push((OwnedFd::from(fd), ns.clone_flag()));
    }
    let joins: Vec<(RawFd, libc::c_int)> = ns_fds.iter().map(|(fd, flag)| (fd.as_raw_fd(), *flag)).collect();
    let report = in_helper(|| child_steps(&joins, steps)).map_err(HelperError::Fork)?;
    drop(ns_fds);
    let (record, fd) = report.map_err(|e| HelperError::NoReport(e.to_string()))?;
    let [what, index, errno] = record;
    let source = io::Error::from_raw_os_error(errno);
    let ns_name = |i: i32| namespaces.get(i as usize).map(|n| n.proc_name()).unwrap_or("?");
    let path = |i: i32| steps.get(i as usize).map(|s| s.path().to_string_lossy().into_owned()).unwrap_or_default();
    match what {
        OK => Ok(fd),
        FAILED_JOIN => Err(HelperError::Join { ns: ns_name(index), source }),
        FAILED_OPEN => Err(HelperError::Open { path: path(index), source }),
        FAILED_WRITE => Err(HelperError::Write { path: path(index), source }),
        other => Err(HelperError::NoReport(format!("record {other}"))),
    }
}

/// Run `job` in a helper process and take its record and the fd it hands
/// back. The helper is a clone that shares the host's memory (see `vfork`:
/// no copy of pi's page tables) with its own descriptor table, root and
/// working directory, so that it may join namespaces; this thread waits
/// until it has ended. It ends itself at `HELPER_DEADLINE` (a step that
/// blocks, such as an open of a FIFO, cannot hold the host) and never dumps
/// core (a core file would hold the host's memory). `Err`: no helper could
/// be started; `Ok(Err)`: it did not report.
pub(super) fn in_helper<F>(mut job: F) -> io::Result<io::Result<([i32; 3], Option<OwnedFd>)>>
where
    F: FnMut() -> ([i32; 3], RawFd),
{
    let (ours, theirs) = socket_pair()?;
    set_receive_timeout(&ours, HELPER_DEADLINE)?;
    let report_fd = theirs.as_raw_fd();
    let deadline = HELPER_DEADLINE.as_secs().max(1) as libc::c_uint;
    let mut child = || {
        if child_deadline(deadline).is_err() {
            return 1;
        }
        let (record, fd) = job();
        child_report(report_fd, &record, fd);
        0
    };
    // SAFETY: the helper runs `child_deadline`, the job (raw system calls
    // on memory its caller prepared) and `child_report`, which write only
    // their own stack frames.
    let helper = unsafe { crate::vfork::run(&mut child) }?;
    drop(theirs);
    let report = receive(&ours);
    if report.is_err() {
        // SAFETY: pidfd_send_signal through our own child's pidfd.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, helper.pidfd.as_raw_fd(), libc::SIGKILL, 0, 0) };
    }
    reap(helper.pid);
    Ok(report)
}

pub(super) fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two fresh fds into `fds`.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(super) fn set_receive_timeout(fd: &OwnedFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: setsockopt reads a timeval of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Room for one fd's control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct FdControl([u8; 32]);

/// The child's one record and, when it sent one, the fd.
pub(super) fn receive(sock: &OwnedFd) -> io::Result<([i32; 3], Option<OwnedFd>)> {
    let mut record = [0i32; 3];
    let mut control = FdControl([0; 32]);
    let mut iov = libc::iovec { iov_base: record.as_mut_ptr().cast(), iov_len: std::mem::size_of_val(&record) };
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    let n = loop {
        // SAFETY: recvmsg fills the buffers `msg` points at, within their sizes.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fd = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n != std::mem::size_of_val(&record) {
        return Err(io::Error::other(if n == 0 {
            "it ended without a word".to_string()
        } else {
            format!("{n} bytes")
        }));
    }
    Ok((record, fd))
}

pub(super) fn reap(child: i32) {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

// Below: the helper. Raw system calls on prepared memory only.

pub(super) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// The helper's first step: no core dump, and `SIGALRM` (its default
/// action ends the process) unblocked and due in `secs` seconds.
fn child_deadline(secs: libc::c_uint) -> Result<(), i32> {
    let no_core = [0u64; 2];
    // SAFETY: prlimit64 on the calling process reads one struct rlimit64.
    if unsafe {
        libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_CORE, no_core.as_ptr(), std::ptr::null_mut::<u64>())
    } != 0
    {
        return Err(errno());
    }
    // SAFETY: an all-zero sigaction is SIG_DFL; the helper has its own
    // handler table.
    let default: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sets the helper's own SIGALRM handler.
    if unsafe { libc::sigaction(libc::SIGALRM, &default, std::ptr::null_mut()) } != 0 {
        return Err(errno());
    }
    let alarm = 1u64 << (libc::SIGALRM - 1);
    // SAFETY: rt_sigprocmask reads one 8-byte set.
    let r = unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_UNBLOCK, &alarm as *const u64, std::ptr::null_mut::<u64>(), 8)
    };
    if r != 0 {
        return Err(errno());
    }
    // SAFETY: alarm has no memory effects.
    unsafe { libc::alarm(secs) };
    Ok(())
}

fn child_steps(joins: &[(RawFd, libc::c_int)], steps: &[Step]) -> ([i32; 3], RawFd) {
    for (i, (fd, flag)) in joins.iter().enumerate() {
        // SAFETY: setns on an fd the child holds.
        if unsafe { libc::setns(*fd, *flag) } != 0 {
            return ([FAILED_JOIN, i as i32, errno()], -1);
        }
    }
    let mut handed = -1;
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Write { path, bytes } => {
                // SAFETY: open of a NUL-terminated path prepared before the helper started.
                let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
                if fd < 0 {
                    return ([FAILED_OPEN, i as i32, errno()], handed);
                }
                // SAFETY: write of a buffer prepared before the helper started.
                let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
                let e = errno();
                // SAFETY: close of the fd just opened.
                unsafe { libc::close(fd) };
                if n != bytes.len() as isize {
                    return ([FAILED_WRITE, i as i32, if n < 0 { e } else { libc::EIO }], handed);
                }
            }
            Step::Open { path, flags } => {
                // SAFETY: open of a NUL-terminated path prepared before the helper started.
                let fd = unsafe { libc::open(path.as_ptr(), *flags | libc::O_CLOEXEC) };
                if fd < 0 {
                    return ([FAILED_OPEN, i as i32, errno()], handed);
                }
                handed = fd;
            }
        }
    }
    ([OK, 0, 0], handed)
}

pub(super) fn child_report(sock: RawFd, record: &[i32; 3], fd: RawFd) {
    let mut control = FdControl([0; 32]);
    let mut iov =
        libc::iovec { iov_base: record.as_ptr() as *mut libc::c_void, iov_len: std::mem::size_of_val(record) };
    // SAFETY: an all-zero msghdr is valid (a stack value, no allocation).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if fd >= 0 {
        // SAFETY: the CMSG macros write within `control`, sized for one fd.
        unsafe {
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: sendmsg of the stack buffers above.
    unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_runs_in_a_namespace_of_another_process_and_an_fd_comes_back() {
        // Our own namespaces: joining them is allowed for anyone (the user
        // namespace one is refused: a process cannot re-enter its own).
        let me = std::process::id() as i32;
        let dir = std::env::temp_dir().join(format!("pps-nshelper-{me}"));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("value");
        std::fs::write(&file, "").unwrap();
        let steps = [
            Step::write(file.to_str().unwrap(), "42"),
            Step::Open { path: cstring(file.to_str().unwrap()), flags: libc::O_RDONLY },
        ];
        let fd = run(me, &[], &steps).unwrap().expect("an fd");
        let mut back = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut back).unwrap();
        assert_eq!(back, "42");
        let missing = [Step::write(dir.join("no/such").to_str().unwrap(), "1")];
        assert!(matches!(run(me, &[], &missing), Err(HelperError::Open { .. })));
        assert!(matches!(run(me, &[Namespace::User], &[]), Err(HelperError::Join { ns: "user", .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_helper_step_that_blocks_ends_at_the_deadline() {
        // An open of a FIFO for writing blocks until a reader comes: the
        // helper (which its caller waits for) must end by itself.
        let me = std::process::id() as i32;
        let dir = std::env::temp_dir().join(format!("pps-nshelper-fifo-{me}"));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let path = cstring(fifo.to_str().unwrap());
        // SAFETY: mkfifo of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let blocked = run(me, &[], &[Step::write(fifo.to_str().unwrap(), "1")]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(blocked, Err(HelperError::NoReport(_))), "{blocked:?}");
    }
}
