//! A child process that shares the host's memory until it execs or ends:
//! `clone(CLONE_VM | CLONE_VFORK)` on a stack of its own, as glibc's
//! `posix_spawn` does. A fork copies the page tables of the whole host
//! process (for Node, hundreds of MiB mapped: most of what a fork costs);
//! this copies none. The calling thread is suspended until the child execs
//! or exits; the host's other threads run on.
//!
//! The child runs in the host's memory and on the calling thread's TLS: it
//! may only make async-signal-safe system calls on memory prepared before
//! the clone (no allocation, no locks, no panic, nothing that unwinds), and
//! reports a failure by writing into that prepared memory, which the caller
//! reads once the clone has returned. Every signal is blocked around the
//! clone, so that no handler of the host runs in the child (it has its own
//! copy of the handler table: no `CLONE_SIGHAND`); a child that execs
//! restores the defaults first ([`child_reset_signals`]). Without
//! `CLONE_FS` and `CLONE_FILES` the child has its own root, working
//! directory and descriptor table, so it may `setns` (the user and mount
//! namespaces refuse a process that shares its `fs`).
//!
//! What the child does is the callers' business (`spawn`, `nshelper`).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The child's stack: its frames are a few system calls deep.
const STACK_BYTES: usize = 256 * 1024;

/// An anonymous mapping for the child's stack, with a guard page below it.
struct Stack {
    base: *mut libc::c_void,
}

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: an anonymous private mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base };
        // SAFETY: the lowest page of the mapping made above.
        if unsafe { libc::mprotect(base, page_size(), libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, which is page-aligned.
        unsafe { self.base.cast::<u8>().add(STACK_BYTES).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the child that used it has
        // exec'd or exited (the clone returns only then).
        unsafe { libc::munmap(self.base, STACK_BYTES) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

/// Every signal, as the kernel's 64-bit set.
const ALL_SIGNALS: u64 = !0;

/// Set the calling thread's signal mask to `set` (the kernel's set, raw:
/// glibc's wrapper would leave out the signals it reserves); the old one.
fn set_signal_mask(set: u64) -> io::Result<u64> {
    let mut old = 0u64;
    // SAFETY: rt_sigprocmask reads and writes one 8-byte set each.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &set as *const u64,
            &mut old as *mut u64,
            std::mem::size_of::<u64>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// A child started by [`run`]: its pid, and a pidfd that names it (never
/// a reused pid) and becomes readable when it has exited.
pub struct Cloned {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

extern "C" fn trampoline<F: FnMut() -> libc::c_int>(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&mut F` that `run` passed; it outlives the
    // child's run, since `run` returns only once the child has exec'd or
    // exited.
    let child = unsafe { &mut *arg.cast::<F>() };
    child()
}

/// Start a child that shares this process's memory and runs `child` on a
/// stack of its own, with every signal blocked; the calling thread waits
/// until the child execs or exits (what `child` returns is its exit code).
///
/// # Safety
/// `child` runs in another process on this process's memory and on the
/// calling thread's TLS: it must make only async-signal-safe system calls
/// on memory prepared before this call, never allocate, lock, panic or
/// unwind, and write nothing but its own stack and memory the caller set
/// aside for its report.
pub unsafe fn run<F: FnMut() -> libc::c_int>(child: &mut F) -> io::Result<Cloned> {
    let stack = Stack::new()?;
    let old = set_signal_mask(ALL_SIGNALS)?;
    let mut pidfd: libc::c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: the stack is a fresh mapping the child alone uses; `child`
    // lives across the call; with CLONE_PIDFD the kernel writes the pidfd
    // at the parent-tid pointer.
    let pid = unsafe {
        libc::clone(trampoline::<F>, stack.top(), flags, (child as *mut F).cast(), &mut pidfd as *mut libc::c_int)
    };
    let cloned = if pid < 0 { Err(io::Error::last_os_error()) } else { Ok(pid) };
    set_signal_mask(old)?;
    drop(stack);
    let pid = cloned?;
    // SAFETY: a fresh pidfd the kernel made for this child.
    Ok(Cloned { pid, pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) } })
}

// Below: for the child. Raw system calls, no allocation.

/// The calling thread's errno (in the child: the suspended caller's slot,
/// which is why the child reports through prepared memory at once).
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Before an exec: every signal the host handles back to its default
/// action, `SIGPIPE` (which Node ignores) too, then no signal blocked, the
/// state a spawned program starts in (as Rust's `Command` leaves it). A
/// signal ignored by the host other than `SIGPIPE` stays ignored, as it
/// would across a fork and exec.
pub fn child_reset_signals() -> Result<(), i32> {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: an all-zero sigaction is valid; sigaction fills it.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sigaction only reads the handler (glibc refuses the
        // signals it reserves with EINVAL: they stay blocked until exec).
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.sa_sigaction == libc::SIG_DFL || (old.sa_sigaction == libc::SIG_IGN && sig != libc::SIGPIPE) {
            continue;
        }
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
        let default: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sets this child's own handler table (no CLONE_SIGHAND).
        if unsafe { libc::sigaction(sig, &default, std::ptr::null_mut()) } != 0 {
            return Err(errno());
        }
    }
    set_signal_mask(0).map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn wait(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    #[test]
    fn the_child_shares_memory_and_its_exit_code_comes_back() {
        let mut seen = 0;
        let parent = std::process::id() as i32;
        let mut child = || {
            // SAFETY: getpid/getppid have no memory effects.
            seen = unsafe { libc::syscall(libc::SYS_getppid) } as i32;
            7
        };
        // SAFETY: the child writes only `seen`.
        let cloned = unsafe { run(&mut child) }.unwrap();
        assert_ne!(cloned.pid, parent);
        assert_eq!(seen, parent, "the child's write is in our memory");
        let status = wait(cloned.pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7, "{status:#x}");
    }

    #[test]
    fn an_exec_d_child_starts_with_default_signals_and_an_empty_mask() {
        // A handler of ours, and SIGPIPE ignored as Node does.
        extern "C" fn handler(_: libc::c_int) {}
        // SAFETY: installing a handler that does nothing; SIGUSR1 and
        // SIGPIPE belong to this test binary.
        unsafe {
            libc::signal(libc::SIGUSR1, handler as *const () as libc::sighandler_t);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let sh = CString::new("/bin/sh").unwrap();
        let script = CString::new("grep -E '^Sig(Blk|Ign)' /proc/self/status > \"$0\"").unwrap();
        let out = std::env::temp_dir().join(format!("pps-vfork-{}", std::process::id()));
        let out_c = CString::new(out.to_str().unwrap()).unwrap();
        let dash_c = CString::new("-c").unwrap();
        let argv = [sh.as_ptr(), dash_c.as_ptr(), script.as_ptr(), out_c.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        let mut failed = 0;
        let mut child = || {
            if let Err(e) = child_reset_signals() {
                failed = e;
                return 127;
            }
            // SAFETY: execve of prepared, NUL-terminated arrays.
            unsafe { libc::execve(sh.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            failed = errno();
            127
        };
        // SAFETY: the child writes only `failed`.
        let cloned = unsafe { run(&mut child) }.unwrap();
        let status = wait(cloned.pid);
        assert_eq!(failed, 0);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{status:#x}");
        let text = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        assert!(text.contains("SigBlk:\t0000000000000000"), "{text}");
        let ignored = text.lines().find(|l| l.starts_with("SigIgn:")).unwrap();
        let mask = u64::from_str_radix(ignored.trim_start_matches("SigIgn:").trim(), 16).unwrap();
        assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE is back to its default: {text}");
    }

    #[test]
    fn a_failed_exec_is_reported_through_prepared_memory() {
        let missing = CString::new("/nonexistent/bwrap").unwrap();
        let argv = [missing.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        let mut failed = 0;
        let mut child = || {
            // SAFETY: execve of prepared, NUL-terminated arrays.
            unsafe { libc::execve(missing.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            failed = errno();
            127
        };
        // SAFETY: the child writes only `failed`.
        let cloned = unsafe { run(&mut child) }.unwrap();
        assert_eq!(failed, libc::ENOENT);
        let status = wait(cloned.pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 127, "{status:#x}");
    }
}
