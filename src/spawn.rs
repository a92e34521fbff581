//! Starting and killing one sandbox process tree.
//!
//! [`spawn_sandbox`] applies a bwrap argv: it creates the protocol pipes,
//! the pipe where bubblewrap says the sandbox's pid and the one that holds
//! its payload until the host releases it (see `nshelper`), and in the
//! child (before exec; a clone that shares the host's memory, see `vfork`,
//! so that no fork copies the page tables of pi's process) places the pipe
//! ends and the seccomp program at their fixed fd numbers, marks every
//! other inherited fd close-on-exec, applies the rlimits (inherited by
//! everything in the sandbox) and makes bwrap the leader of a new session,
//! so that the host's controlling terminal stays out of reach. [`prepare_inside`] then sets
//! the policy's own rlimits (the task cap where no cgroup is writable, the
//! open-file limit bubblewrap needed raised) on the held sandbox's first
//! process, from the host, before it releases the payload: every process
//! of every payload inherits them, whatever runs there. Before anything else it joins
//! the sandbox's cgroups (see `contain`), so that everything bubblewrap
//! starts is counted from its first fork. The child runs with an empty
//! environment. Nothing here decides what the sandbox contains.
//!
//! Every sandbox process stays in that session's process group: bwrap's own
//! `--new-session` is not used, because it moves the namespace's init out of
//! the group while it still has no parent-death signal (bwrap sets that only
//! after its last fork), and a kill in that window would leave the init and
//! its child running.
//!
//! Spawn from a long-lived thread (a tokio worker, not a blocking-pool
//! thread): bwrap's parent-death signal fires when the *thread* that forked
//! it exits.

use nix::sys::resource::Resource;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::unix::pipe;

use crate::vfork;

mod prepare;
pub use prepare::{prepare_inside, prepare_inside_with, prepare_then_mask, set_limits_of, Masking, Unprepared};

use crate::bwrap::{BLOCK_FD, INFO_FD, MOUNT_FD_BASE, REPLY_FD, REQUEST_FD, SECCOMP_FD};
use crate::limits::{RLIMIT_AS_BYTES, RLIMIT_FSIZE_BYTES, RLIMIT_NOFILE, RLIMIT_SIGPENDING};

/// A running sandbox and the host ends of its channels.
pub struct Spawned {
    pub child: SandboxChild,
    pub pid: i32,
    pub requests: pipe::Sender,
    pub replies: pipe::Receiver,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    /// Where bubblewrap says the sandbox's pid (read end of `INFO_FD`).
    pub info: OwnedFd,
    /// Releases the payload when written to or closed (write end of
    /// `BLOCK_FD`): kill the sandbox before dropping it unreleased.
    pub release: OwnedFd,
}

/// The rlimits every sandboxed process starts with (soft = hard).
/// `RLIMIT_SIGPENDING` is set before bubblewrap makes the sandbox's user
/// namespace, which takes it as the most the sandbox may charge to pi's
/// user in the host's count, whatever its processes do later.
/// `RLIMIT_RTPRIO` and `RLIMIT_NICE` are 0 whatever pi has: with more, a
/// process without any capability may take a real-time policy
/// (`SCHED_FIFO` spinning on a CPU starves the host's own tasks there) or
/// a nice value below the host's default.
pub const RLIMITS: [(Resource, u64); 7] = [
    (Resource::RLIMIT_AS, RLIMIT_AS_BYTES),
    (Resource::RLIMIT_FSIZE, RLIMIT_FSIZE_BYTES),
    (Resource::RLIMIT_NOFILE, RLIMIT_NOFILE),
    (Resource::RLIMIT_CORE, 0),
    (Resource::RLIMIT_SIGPENDING, RLIMIT_SIGPENDING),
    (Resource::RLIMIT_RTPRIO, 0),
    (Resource::RLIMIT_NICE, 0),
];

/// A close-on-exec pipe: (read end, write end).
fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// Duplicate `fd` to a number >= `min`, above every number the child's fds
/// are placed at, so that placing one can never overwrite another.
fn dup_high(fd: &OwnedFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd we own.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` is a fresh fd returned by fcntl.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

// The functions below run in the child (see `vfork`): raw system calls on
// memory prepared before, no allocation, no locks; a failure is its errno.

fn child_new_session() -> Result<(), i32> {
    // SAFETY: setsid has no memory effects. A fresh child is never a group
    // leader: no EPERM.
    if unsafe { libc::setsid() } < 0 {
        return Err(vfork::errno());
    }
    Ok(())
}

fn child_join_cgroup(procs: RawFd) -> Result<(), i32> {
    // SAFETY: write(2) of a static buffer to an fd the child holds: `0`
    // moves the writer (a fresh child: its only thread) into the cgroup of
    // that `tasks` or `cgroup.procs` file.
    if unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) } != 1 {
        return Err(vfork::errno());
    }
    Ok(())
}

fn child_dup2(from: RawFd, to: RawFd) -> Result<(), i32> {
    // SAFETY: plain dup2 on fds valid in the child; clears FD_CLOEXEC on `to`.
    if unsafe { libc::dup2(from, to) } < 0 {
        return Err(vfork::errno());
    }
    Ok(())
}

fn child_cloexec_from(first: RawFd) {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags.
    let r = unsafe {
        libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC)
    };
    if r == 0 {
        return;
    }
    // Kernels before 5.11: walk the descriptor table.
    // SAFETY: sysconf and fcntl are async-signal-safe.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(1024, 65536) as RawFd;
    for fd in first..max {
        // SAFETY: F_SETFD on any number only sets a flag (EBADF for a closed one).
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// The kernel's `struct rlimit64`.
#[repr(C)]
struct Rlimit64 {
    cur: u64,
    max: u64,
}

/// prlimit64(2) on process `pid` (0: the caller): set `new` if given, and
/// the limit before.
fn prlimit(pid: i32, resource: Resource, new: Option<u64>) -> Result<Rlimit64, i32> {
    let new = new.map(|v| Rlimit64 { cur: v, max: v });
    let mut old = Rlimit64 { cur: 0, max: 0 };
    let new_ptr = new.as_ref().map_or(std::ptr::null(), |n| n as *const Rlimit64);
    // SAFETY: prlimit64 reads at most one struct rlimit64 and writes one.
    let r =
        unsafe { libc::syscall(libc::SYS_prlimit64, pid, resource as libc::c_int, new_ptr, &mut old as *mut Rlimit64) };
    if r != 0 {
        return Err(vfork::errno());
    }
    Ok(old)
}

fn child_rlimits(nofile: u64) -> Result<(), i32> {
    for (resource, value) in RLIMITS {
        let value = if resource == Resource::RLIMIT_NOFILE { nofile } else { value };
        // Never above pi's own hard limit, which only a privileged
        // process could raise.
        let value =
            if resource == Resource::RLIMIT_SIGPENDING { value.min(prlimit(0, resource, None)?.max) } else { value };
        prlimit(0, resource, Some(value))?;
    }
    Ok(())
}

fn child_parent_death_signal() -> Result<(), i32> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        return Err(vfork::errno());
    }
    Ok(())
}

/// The open-file limit bubblewrap starts with: room for the mount-source
/// fds it holds during setup and the files it opens itself. Above
/// `RLIMIT_NOFILE`, the host lowers it again on the held sandbox, before
/// the payload runs (see `Policy::nofile`).
pub fn nofile_for(mount_fds: usize) -> u64 {
    RLIMIT_NOFILE.max(MOUNT_FD_BASE as u64 + mount_fds as u64 + 64)
}

/// Most mount-source fds one sandbox gets.
pub const MAX_MOUNT_FDS: usize = 2048;

/// Start `bwrap argv` with the protocol pipes, the seccomp program and
/// `mounts`, the mount sources that argv names as fds: `mounts[i]` is
/// placed at `MOUNT_FD_BASE + i` (bubblewrap closes each after its mount).
/// `cgroups` are the files that join the sandbox's cgroups (see
/// `contain::join_file`), which bubblewrap's process writes to before it
/// execs (they never cross exec). What the payload gets above 0-2 is
/// `channel`'s (see [`Channel`]). Every descriptor the child holds that is
/// not placed here closes at exec.
pub fn spawn_sandbox(
    bwrap: &Path,
    argv: &[OsString],
    seccomp: OwnedFd,
    mounts: Vec<OwnedFd>,
    cgroups: Vec<OwnedFd>,
    channel: Channel,
) -> io::Result<Spawned> {
    if mounts.len() > MAX_MOUNT_FDS {
        return Err(io::Error::other(format!("{} mount sources, at most {MAX_MOUNT_FDS}", mounts.len())));
    }
    let first_free = MOUNT_FD_BASE + mounts.len() as RawFd;
    let nofile = nofile_for(mounts.len());
    let (req_read, req_write) = cloexec_pipe()?;
    let (rep_read, rep_write) = cloexec_pipe()?;
    let (info_read, info_write) = cloexec_pipe()?;
    let (block_read, release) = cloexec_pipe()?;
    let high = first_free + 10;
    let (child_req, child_rep) = match &channel {
        Channel::Given([a, b]) => (dup_high(a, high)?, dup_high(b, high)?),
        Channel::Frames | Channel::None => (dup_high(&req_read, high)?, dup_high(&rep_write, high)?),
    };
    let placed_channel = !matches!(channel, Channel::None);
    drop(channel);
    let child_bpf = dup_high(&seccomp, high)?;
    let child_info = dup_high(&info_write, high)?;
    let child_block = dup_high(&block_read, high)?;
    let child_mounts = mounts.iter().map(|fd| dup_high(fd, high)).collect::<io::Result<Vec<_>>>()?;
    let child_cgroups = cgroups.iter().map(|fd| dup_high(fd, high)).collect::<io::Result<Vec<_>>>()?;
    drop((req_read, rep_write, info_write, block_read, seccomp, mounts, cgroups));
    let (req_fd, rep_fd, bpf_fd) = (child_req.as_raw_fd(), child_rep.as_raw_fd(), child_bpf.as_raw_fd());
    let (info_fd, block_fd) = (child_info.as_raw_fd(), child_block.as_raw_fd());
    // Raw numbers for the child (which must not allocate).
    let mount_fds: Vec<RawFd> = child_mounts.iter().map(|f| f.as_raw_fd()).collect();
    let cgroup_fds: Vec<RawFd> = child_cgroups.iter().map(|f| f.as_raw_fd()).collect();

    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    let (out_read, out_write) = cloexec_pipe()?;
    let (err_read, err_write) = cloexec_pipe()?;
    let child_stdio = [dup_high(&OwnedFd::from(null), high)?, dup_high(&out_write, high)?, dup_high(&err_write, high)?];
    drop((out_write, err_write));
    let stdio_fds = [child_stdio[0].as_raw_fd(), child_stdio[1].as_raw_fd(), child_stdio[2].as_raw_fd()];
    // The exec's arguments, as the child needs them (it must not allocate).
    let path = CString::new(bwrap.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let args = std::iter::once(bwrap.as_os_str())
        .chain(argv.iter().map(|a| a.as_os_str()))
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let arg_ptrs: Vec<*const libc::c_char> =
        args.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let env_ptrs: [*const libc::c_char; 1] = [std::ptr::null()];

    // What failed in the child before exec (its errno), read once it has
    // exec'd or exited.
    let mut failed = 0;
    let mut child = || {
        let placed = (|| {
            for (fd, to) in stdio_fds.iter().zip(0..) {
                child_dup2(*fd, to)?;
            }
            for fd in &cgroup_fds {
                child_join_cgroup(*fd)?;
            }
            child_new_session()?;
            // First everything above stdio closes at exec; then the placed
            // descriptors (dup2 clears the flag on its copy) stay open.
            child_cloexec_from(3);
            if placed_channel {
                child_dup2(req_fd, REQUEST_FD)?;
                child_dup2(rep_fd, REPLY_FD)?;
            }
            child_dup2(bpf_fd, SECCOMP_FD)?;
            child_dup2(info_fd, INFO_FD)?;
            child_dup2(block_fd, BLOCK_FD)?;
            for (fd, to) in mount_fds.iter().zip(MOUNT_FD_BASE..) {
                child_dup2(*fd, to)?;
            }
            child_rlimits(nofile)?;
            child_parent_death_signal()?;
            vfork::child_reset_signals()
        })();
        if let Err(e) = placed {
            failed = e;
            return 127;
        }
        // SAFETY: execve of NUL-terminated arrays prepared before the clone.
        unsafe { libc::execve(path.as_ptr(), arg_ptrs.as_ptr(), env_ptrs.as_ptr()) };
        failed = vfork::errno();
        127
    };
    // SAFETY: the child makes async-signal-safe system calls only, on the
    // fds and arrays above, and writes nothing but `failed`.
    let cloned = unsafe { vfork::run(&mut child) }?;
    // The child has its copies; ours close here.
    drop((child_req, child_rep, child_bpf, child_info, child_block, child_mounts, child_cgroups, child_stdio));
    if failed != 0 {
        // It has exited: reap it.
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        while unsafe { libc::waitpid(cloned.pid, &mut status, 0) } < 0 && vfork::errno() == libc::EINTR {}
        return Err(io::Error::from_raw_os_error(failed));
    }
    let child = SandboxChild::new(cloned.pid, cloned.pidfd)?;
    Ok(Spawned {
        pid: child.pid,
        child,
        requests: pipe::Sender::from_owned_fd(req_write)?,
        replies: pipe::Receiver::from_owned_fd(rep_read)?,
        stdout: pipe::Receiver::from_owned_fd(out_read)?,
        stderr: pipe::Receiver::from_owned_fd(err_read)?,
        info: info_read,
        release,
    })
}

/// What the payload of [`spawn_sandbox`] gets at `REQUEST_FD` and
/// `REPLY_FD`.
pub enum Channel {
    /// The protocol pipes (the python worker's frames).
    Frames,
    /// Nothing: the payload and everything it starts get 0-2 and nothing
    /// else (a shell command).
    None,
    /// These two descriptors (a spare shell's command and its go pipe,
    /// see `shell`), which the payload closes before it runs anything.
    Given([OwnedFd; 2]),
}

/// Bubblewrap's process, started by [`spawn_sandbox`]: waited for through
/// its pidfd, and killed (through the pidfd: never a reused pid) and reaped
/// in the background if dropped before it has exited.
pub struct SandboxChild {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

/// waitpid(2) without blocking: the status once `pid` has exited.
fn reap_nohang(pid: i32) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl SandboxChild {
    /// Watch a started child through its pidfd; if that fails, it is
    /// killed and reaped.
    fn new(pid: i32, pidfd: OwnedFd) -> io::Result<SandboxChild> {
        let raw = pidfd.as_raw_fd();
        // SAFETY: the pidfd is owned by the AsyncFd for its whole life.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }.map_err(|e| {
            // SAFETY: pidfd_send_signal and waitpid on our own child.
            unsafe {
                libc::syscall(libc::SYS_pidfd_send_signal, raw, libc::SIGKILL, 0, 0);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            e.into_parts().1
        })?;
        Ok(SandboxChild { pid, pidfd: Some(pidfd), status: None })
    }

    /// The exit status, if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = reap_nohang(self.pid)?;
        }
        Ok(self.status)
    }

    /// Wait until it has exited (cancel-safe).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            let Some(pidfd) = &self.pidfd else { return Err(io::Error::other("no pidfd")) };
            let mut ready = pidfd.readable().await?;
            match reap_nohang(self.pid)? {
                Some(status) => {
                    self.status = Some(status);
                    return Ok(status);
                }
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for SandboxChild {
    fn drop(&mut self) {
        if !matches!(self.try_wait(), Ok(None)) {
            return;
        }
        let Some(pidfd) = self.pidfd.take() else { return };
        // SAFETY: pidfd_send_signal through our pidfd, no memory effects.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.get_ref().as_raw_fd(), libc::SIGKILL, 0, 0) };
        let pid = self.pid;
        // The zombie is reaped once the pidfd says it has exited.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = pidfd.readable().await;
                    let _ = reap_nohang(pid);
                });
            }
            Err(_) => {
                let _ = std::thread::Builder::new().name("pps-reap".into()).spawn(move || {
                    let mut status = 0;
                    // SAFETY: waitpid on our own child.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                    drop(pidfd);
                });
            }
        }
    }
}

/// SIGKILL the sandbox's process group: bwrap, the namespace's init and
/// the worker. Killing the init tears down the pid namespace, and with it
/// every process inside, including those that called setsid().
pub fn kill_group(pid: i32) {
    if pid > 0 {
        // Errors (already gone) are irrelevant.
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}
/// Send `sig` to the process `pid`; whether it was delivered.
pub fn signal_pid(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) has no memory effects.
    pid > 0 && unsafe { libc::kill(pid, sig) } == 0
}

/// Duplicates of file descriptors `fds` of process `pid` (pidfd_getfd):
/// the same open files, never a reopening by path, so that a process of the
/// sandbox cannot make the host open something through it.
pub fn take_fds<const N: usize>(pid: i32, fds: [RawFd; N]) -> io::Result<[OwnedFd; N]> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `pidfd` is a fresh fd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    let mut taken = Vec::with_capacity(N);
    for fd in fds {
        // SAFETY: pidfd_getfd takes a pidfd, a target fd number and flags
        // and returns a new fd (close-on-exec) or -1.
        let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `got` is a fresh fd that nothing else owns.
        taken.push(unsafe { OwnedFd::from_raw_fd(got as RawFd) });
    }
    taken.try_into().map_err(|_| io::Error::other("descriptor count"))
}

/// A small file of `/proc` whole, read into one buffer that holds it:
/// four system calls (open, read, the read that finds its end, close).
/// `std::fs::read` asks for the size first, which `/proc` gives as 0, and
/// then reads in pieces of 32, 32, 64, ... bytes (eleven calls for a
/// process's `status`); these reads are on a call's path.
pub fn read_proc(path: &str) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// The kernel's flag of a task whose exit has begun (`PF_EXITING`).
const PF_EXITING: u64 = 0x4;

/// Whether `pid` has exited (gone, or a zombie). A sandbox's PID 1 is a
/// zombie only once every other process of its namespace is gone: what
/// waits for that uses this, not [`exiting`].
pub fn exited(pid: i32) -> bool {
    proc_state(pid).is_none_or(|(state, _)| matches!(state, b'Z' | b'X'))
}

/// Whether `pid` has exited or is on its way out: its exit begins
/// (`PF_EXITING`) before its descriptors close, and it becomes a zombie
/// only after (long on a loaded machine), so a host that saw its pipes end
/// may see it "running" for a while yet. For "may a call still be sent to
/// it", never for "can it still act" (its children may still run).
pub fn exiting(pid: i32) -> bool {
    proc_state(pid).is_none_or(|(state, flags)| matches!(state, b'Z' | b'X') || flags & PF_EXITING != 0)
}

/// The state letter and the flags of `pid`, from `/proc/PID/stat`; `None`
/// when it is gone.
fn proc_state(pid: i32) -> Option<(u8, u64)> {
    let stat = read_proc(&format!("/proc/{pid}/stat")).ok()?;
    // After the name (which may hold anything): state, ppid, pgrp,
    // session, tty_nr, tpgid, flags.
    let Some(close) = stat.iter().rposition(|&b| b == b')') else { return Some((b'?', 0)) };
    let mut fields = stat[close + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = fields.next().and_then(|f| f.first().copied()).unwrap_or(b'?');
    let flags = fields.nth(5).and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok()).unwrap_or(0);
    Some((state, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn why_a_held_sandbox_was_not_released_is_worded_for_the_start_failure() {
        assert_eq!(Unprepared::PidLate.to_string(), "bubblewrap did not say the sandbox's pid in time");
        assert_eq!(Unprepared::NoPid.to_string(), "bubblewrap did not say the sandbox's pid");
        assert_eq!(Unprepared::NotReleased.to_string(), "the payload could not be released");
        let broken = Unprepared::Release(nix::errno::Errno::EPIPE).to_string();
        assert_eq!(broken, format!("the payload could not be released: {}", nix::errno::Errno::EPIPE));
        let pipe = Unprepared::InfoPipe(io::Error::from(io::ErrorKind::UnexpectedEof)).to_string();
        assert!(pipe.starts_with("bubblewrap's info pipe: "), "{pipe}");
    }

    #[test]
    fn read_proc_reads_a_file_larger_than_its_first_buffer_whole() {
        let status = read_proc(&format!("/proc/{}/status", std::process::id())).unwrap();
        assert!(String::from_utf8_lossy(&status).contains("\nNSpid:"));
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("big"), &big).unwrap();
        assert_eq!(read_proc(dir.path().join("big").to_str().unwrap()).unwrap(), big);
        assert!(read_proc("/proc/self/nonexistent").is_err());
    }

    #[test]
    fn exited_tells_a_live_process_from_a_gone_one() {
        assert!(!exited(std::process::id() as i32));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(exited(pid));
    }

    #[test]
    fn exiting_counts_a_process_whose_exit_has_begun_and_exited_does_not() {
        // A process that exits with 384 MiB of memory it wrote to frees it inside its exit,
        // after the exit began and before it becomes a zombie: a while in which its state is
        // not yet Z (polled as fast as /proc answers; a few attempts, each its own process).
        use std::io::BufRead;
        let script = "import os\nheld = b'x' * (384 << 20)\nprint('full', flush=True)\nos._exit(0)\n";
        let mut seen = None;
        for _ in 0..5 {
            let mut child = std::process::Command::new("python3")
                .args(["-c", script])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
            assert_eq!(line, "full\n");
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while seen.is_none() && std::time::Instant::now() < until {
                let Ok(stat) = read_proc(&format!("/proc/{pid}/stat")) else { break };
                let stat = String::from_utf8(stat).unwrap();
                let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
                let flags: u64 = fields[6].parse().unwrap();
                if matches!(fields[0], "Z" | "X") {
                    break;
                }
                if flags & PF_EXITING != 0 {
                    seen = Some((fields[0].to_string(), exiting(pid), exited(pid)));
                }
            }
            child.wait().unwrap();
            assert!(exited(pid));
            if seen.is_some() {
                break;
            }
        }
        let (state, exiting, exited) = seen.expect("no exit was seen under way in 5 attempts");
        assert!(exiting, "a process in its exit (state {state}) was taken for alive");
        assert!(!exited || state == "Z", "a process in its exit (state {state}) was taken for gone");
    }

    #[test]
    fn the_host_sets_a_process_s_task_and_file_limits() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let set = set_limits_of(pid, &[(Resource::RLIMIT_NPROC, 40), (Resource::RLIMIT_NOFILE, 50)]);
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        set.unwrap();
        let line = |name: &str| {
            let l = limits.lines().find(|l| l.starts_with(name)).unwrap_or_default();
            l.split_whitespace().rev().skip(1).take(2).collect::<Vec<_>>()
        };
        assert_eq!(line("Max processes"), ["40", "40"], "{limits}");
        assert_eq!(line("Max open files"), ["50", "50"], "{limits}");
        // No pid is that high (pid_max is at most 2^22).
        let gone = set_limits_of(i32::MAX, &[(Resource::RLIMIT_NPROC, 40)]).unwrap_err();
        assert!(matches!(gone, Unprepared::Limit { resource: "RLIMIT_NPROC", .. }), "{gone}");
    }
}
