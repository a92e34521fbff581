//! The allowlist, as data: the calls the sandbox may make, in groups, each
//! with why the sandbox needs it.

use super::*;

/// The calls the sandbox may make. A call that [`rules`] refuses for some
/// arguments (`ioctl`, `personality`, `clone`, `unshare`) is listed here and
/// allowed for every other argument.
pub fn allowlist() -> Vec<Allowed> {
    const NARROW: &str = "only narrows what the calling process may do (another filter, Landlock rules)";
    vec![
        allow(
            &[
                "openat", "close", "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
                "preadv2", "pwritev2", "lseek", "dup", "dup3", "fcntl", "flock", "fsync", "fdatasync", "sync",
                "syncfs", "sync_file_range", "fallocate", "ftruncate", "truncate", "fadvise64", "readahead",
                "sendfile", "copy_file_range", "splice", "tee", "vmsplice",
            ],
            "opening, reading, writing and closing files and pipes; the mounts decide what can be opened",
        ),
        allow(
            &[
                "newfstatat", "fstat", "statx", "statfs", "fstatfs", "faccessat", "getdents64", "getcwd", "chdir",
                "fchdir", "mkdirat", "mknodat", "unlinkat", "renameat", "renameat2", "linkat", "symlinkat",
                "readlinkat", "fchmod", "fchmodat", "fchown", "fchownat", "umask", "utimensat",
            ],
            "file metadata, directories and links (mknodat makes FIFOs; device nodes need a capability the sandbox lacks); setuid and setgid modes are refused below",
        ),
        allow(
            &[
                "getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr", "listxattr",
                "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
            ],
            "extended attributes, which copying tools carry over (shutil.copystat, cp -a)",
        ),
        allow(
            &["inotify_init1", "inotify_add_watch", "inotify_rm_watch"],
            "file change notification, used by file watchers",
        ),
        allow_optional(
            &[
                "open", "creat", "stat", "lstat", "access", "pipe", "dup2", "poll", "select", "epoll_create",
                "epoll_wait", "eventfd", "signalfd", "inotify_init", "getdents", "mkdir", "rmdir", "unlink",
                "rename", "link", "symlink", "readlink", "chmod", "chown", "lchown", "utime", "utimes", "futimesat",
                "mknod", "fork", "vfork", "alarm", "pause", "time", "getpgrp",
            ],
            "the older forms of listed calls, which x86_64 keeps and its programs use (arm64 has only the newer ones)",
        ),
        allow_optional(&["arch_prctl"], "x86_64: every program sets its thread-local storage base with it at start"),
        allow(
            &[
                "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "mlock", "mlock2",
                "munlock", "mlockall", "munlockall", "membarrier", "memfd_create", "remap_file_pages", "pkey_alloc",
                "pkey_free", "pkey_mprotect",
            ],
            "memory, bounded per process by RLIMIT_AS (locked memory by RLIMIT_MEMLOCK)",
        ),
        allow(
            &[
                "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill", "tkill", "tgkill", "getpid",
                "getppid", "gettid", "getpgid", "setpgid", "getsid", "setsid", "set_tid_address", "set_robust_list",
                "get_robust_list", "futex", "rseq",
            ],
            "processes and threads (subprocess, threading, multiprocessing); signals reach only the sandbox's PID namespace",
        ),
        allow(&["clone", "unshare"], "new processes and threads, and unsharing process state; namespace flags are refused below"),
        allow(
            &[
                "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend", "rt_sigtimedwait",
                "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "signalfd4", "restart_syscall",
            ],
            "signal handling",
        ),
        allow(
            &[
                "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "getitimer",
                "setitimer", "timer_create", "timer_delete", "timer_gettime", "timer_settime", "timer_getoverrun",
                "timerfd_create", "timerfd_gettime", "timerfd_settime", "times", "adjtimex", "clock_adjtime",
            ],
            "clocks, sleeps and timers; setting a clock needs CAP_SYS_TIME, which the sandbox lacks",
        ),
        allow(
            &["pipe2", "eventfd2", "epoll_create1", "epoll_ctl", "epoll_pwait", "ppoll", "pselect6"],
            "pipes and waiting on descriptors (subprocess, selectors, asyncio)",
        ),
        allow(
            &[
                "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid", "setuid", "setgid",
                "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups", "capget",
                "capset",
            ],
            "user and group ids and capabilities: the user namespace maps one user and every capability is dropped, so changing them gains nothing",
        ),
        allow(
            &[
                "getrlimit", "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority", "sched_yield",
                "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler",
                "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval",
                "sched_getattr", "sched_setattr", "ioprio_get", "ioprio_set",
            ],
            "resource limits (the hard limits cannot be raised) and scheduling of the sandbox's own processes; thread pools ask for the CPU set",
        ),
        allow(
            &["uname", "sysinfo", "getrandom", "getcpu", "prctl"],
            "system information, random numbers and process attributes; becoming dumpable is refused below",
        ),
        allow(&["ioctl"], "control of descriptors the sandbox holds (terminals, files); TIOCSTI and TIOCLINUX are refused below"),
        allow(&["personality"], "asking for or keeping the default personality; every other is refused below"),
        allow(
            &[
                "accept", "accept4", "bind", "connect", "listen", "getsockname", "getpeername", "getsockopt",
                "setsockopt", "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "shutdown",
            ],
            "calls on socket descriptors, which the sandbox cannot make (socket and socketpair are refused); code asking whether a descriptor is a socket gets ENOTSOCK",
        ),
        allow(&["seccomp"], NARROW),
        allow_optional(&["landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"], NARROW),
        allow_optional(
            &[
                "close_range", "faccessat2", "epoll_pwait2", "pidfd_open", "pidfd_send_signal",
                "process_mrelease", "futex_waitv", "cachestat", "fchmodat2", "map_shadow_stack",
                "futex_wake", "futex_wait", "futex_requeue",
            ],
            "calls of Linux 5.1 and later that the C library and Python use when present and do without otherwise (pidfds reach only this PID namespace); older libseccomp releases do not know all of them",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allowed_group_has_a_reason_and_its_required_calls_exist_here() {
        let mut seen = std::collections::HashSet::new();
        for group in allowlist() {
            assert!(!group.reason.is_empty(), "{:?}", group.names);
            assert!(!group.names.is_empty());
            for &name in group.names {
                assert!(seen.insert(name), "{name} is listed twice");
                if group.required {
                    assert!(matches!(resolve(name, true), Ok(Some(_))), "{name} unknown on this architecture");
                }
            }
        }
        assert!(allowed_here() >= 250, "{} calls allowed", allowed_here());
    }
}
