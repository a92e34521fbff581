//! The refusals, as data: every call the sandbox may not make (always or
//! for some arguments), each with its answer and why, and the constants
//! the conditions compare with.

use super::*;

/// Namespace flags of clone(2) and unshare(2).
pub const NAMESPACE_FLAGS: [(&str, u64); 8] = [
    ("CLONE_NEWTIME", 0x80),
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
];
pub const TIOCSTI: u64 = 0x5412;
/// fcntl(2) commands.
pub const F_SETLEASE: u64 = 1024;
pub const F_NOTIFY: u64 = 1026;
pub const TIOCLINUX: u64 = 0x541C;

/// The refused calls, each with its answer. The namespaces, the mounts and
/// the rlimits do the rest of the confinement.
pub fn rules() -> Vec<Rule> {
    const NET: &str = "no sockets: no network, and no connection to a host Unix socket bound into a mount";
    const PEEK: &str = "no reading or writing of another process's memory";
    const KEXEC: &str = "no loading of a new kernel";
    const HANDLE: &str = "file handles can reach files outside the mounts";
    const URING: &str =
        "io_uring bypasses the filter (IORING_OP_SOCKET reaches sockets) and is a large kernel attack surface";
    const KEYS: &str = "the kernel keyring is shared with the host user and a common exploit target";
    const NS: &str = "no new namespaces: they unlock kernel surface meant for privileged users";
    const MOUNT: &str = "no changes to the mount table";
    const TTY: &str = "no typing into or controlling a terminal";
    const OBSOLETE: &str = "obsolete or host-wide calls that sandboxed code never needs";
    const NUMA: &str = "NUMA memory policy calls have a history of kernel bugs and no use here";
    const SYSV: &str = "SysV message queues, shared memory and semaphore sets outlive the process that made them and \
        hold kernel memory until the sandbox ends, beyond any process's limits (about 500 MiB of queues, unbounded \
        shared memory on a default kernel); POSIX shared memory and semaphores live in the sized /dev/shm";
    const MQUEUE: &str = "POSIX message queues outlive the processes that made them, and a reset in the same sandbox \
        could not find them to remove them (listing needs a mounted mqueue file system)";
    const LEASE: &str =
        "a lease on a project file makes every host program that opens it for writing (an editor, git, \
        a build) wait until the sandbox lets go or the kernel's lease-break time (45 s) passes";
    const DNOTIFY: &str =
        "directory notifications are kernel marks outside the inotify limits the sandbox is held to; \
        nothing sandboxed needs them";
    const SECRETMEM: &str = "while any secret memory area exists the kernel refuses to hibernate the host";
    let mut r = vec![
        eperm("socket", true, NET),
        eperm("socketpair", true, NET),
        eperm("ptrace", false, PEEK),
        eperm("process_vm_readv", false, PEEK),
        eperm("process_vm_writev", false, PEEK),
        eperm("bpf", false, "no eBPF programs or maps"),
        eperm("userfaultfd", false, "userfaultfd is a common kernel-exploit primitive"),
        eperm("perf_event_open", false, "perf events leak kernel and host information"),
        eperm("kexec_load", false, KEXEC),
        eperm("kexec_file_load", false, KEXEC),
        eperm("open_by_handle_at", false, HANDLE),
        eperm("name_to_handle_at", false, HANDLE),
        eperm("io_uring_setup", false, URING),
        eperm("io_uring_enter", false, URING),
        eperm("io_uring_register", false, URING),
        eperm("keyctl", false, KEYS),
        eperm("add_key", false, KEYS),
        eperm("request_key", false, KEYS),
        eperm("setns", false, NS),
        Rule {
            syscall: "clone3",
            action: Action::Enosys,
            when: When::Always,
            required: false,
            reason: "its flags are in memory the filter cannot read; ENOSYS makes libc fall back to clone",
        },
        Rule {
            syscall: "openat2",
            action: Action::Enosys,
            when: When::Always,
            required: false,
            reason: "its flags and mode are in memory the filter cannot read (a setuid mode would pass); ENOSYS makes \
                callers fall back to openat",
        },
        eperm("mount", false, MOUNT),
        eperm("umount2", false, MOUNT),
        eperm("pivot_root", false, MOUNT),
        eperm("chroot", false, MOUNT),
        eperm("open_tree", false, MOUNT),
        eperm("move_mount", false, MOUNT),
        eperm("fsopen", false, MOUNT),
        eperm("fsconfig", false, MOUNT),
        eperm("fsmount", false, MOUNT),
        eperm("fspick", false, MOUNT),
        eperm("mount_setattr", false, MOUNT),
        eperm_when("fcntl", When::ArgMasked { arg: 1, mask: 0xffff_ffff, value: F_SETLEASE }, LEASE),
        eperm_when("fcntl", When::ArgMasked { arg: 1, mask: 0xffff_ffff, value: F_NOTIFY }, DNOTIFY),
        eperm("memfd_secret", false, SECRETMEM),
        eperm_when("ioctl", When::ArgMasked { arg: 1, mask: 0xffff_ffff, value: TIOCSTI }, TTY),
        eperm_when("ioctl", When::ArgMasked { arg: 1, mask: 0xffff_ffff, value: TIOCLINUX }, TTY),
        eperm_when(
            "personality",
            When::ArgNot { arg: 0, value: 0 },
            "other personalities disable ASLR or change the ABI",
        ),
        eperm("syslog", false, OBSOLETE),
        eperm("uselib", false, OBSOLETE),
        eperm("acct", false, OBSOLETE),
        eperm("modify_ldt", false, OBSOLETE),
        eperm("quotactl", false, OBSOLETE),
        eperm("mbind", false, NUMA),
        eperm("migrate_pages", false, NUMA),
        eperm("move_pages", false, NUMA),
        eperm("set_mempolicy", false, NUMA),
        eperm("mq_open", false, MQUEUE),
        eperm("mq_unlink", false, MQUEUE),
        eperm("mq_timedsend", false, MQUEUE),
        eperm("mq_timedreceive", false, MQUEUE),
        eperm("mq_notify", false, MQUEUE),
        eperm("mq_getsetattr", false, MQUEUE),
        eperm("msgget", false, SYSV),
        eperm("msgsnd", false, SYSV),
        eperm("msgrcv", false, SYSV),
        eperm("msgctl", false, SYSV),
        eperm("shmget", false, SYSV),
        eperm("shmat", false, SYSV),
        eperm("shmdt", false, SYSV),
        eperm("shmctl", false, SYSV),
        eperm("semget", false, SYSV),
        eperm("semop", false, SYSV),
        eperm("semtimedop", false, SYSV),
        eperm("semctl", false, SYSV),
    ];
    for (_, flag) in NAMESPACE_FLAGS {
        let when = When::ArgMasked { arg: 0, mask: flag, value: flag };
        r.push(eperm_when("unshare", when, NS));
        r.push(eperm_when("clone", when, NS));
    }
    r.extend(setuid_rules());
    r.push(eperm_when(
        "prctl",
        When::Both(Cmp::Masked { arg: 0, mask: 0xffff_ffff, value: PR_SET_DUMPABLE }, Cmp::Not { arg: 1, value: 0 }),
        "no process of the sandbox becomes dumpable: a dumpable interpreter or rollback copy would let any other \
         process open its descriptors and memory through /proc (the worker makes them non-dumpable before any code runs)",
    ));
    r.extend(AIO.iter().map(|&name| eperm(name, false, AIO_REASON)));
    r
}

pub const PR_SET_DUMPABLE: u64 = 4;
pub const S_ISUID: u64 = 0o4000;
pub const S_ISGID: u64 = 0o2000;
pub const O_CREAT: u64 = 0o100;
/// `__O_TMPFILE`, the bit the kernel tests before it applies a mode
/// (`O_TMPFILE` adds `O_DIRECTORY`).
pub const O_TMPFILE_BIT: u64 = 0o2000_0000;

/// Linux native asynchronous I/O.
pub const AIO: [&str; 6] = ["io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents"];
const AIO_REASON: &str = "Linux native asynchronous I/O contexts come from one host-wide budget (fs.aio-max-nr, 65536 \
    events by default), which one sandbox could take whole; Python and its libraries use threads for I/O instead";

const SETUID: &str = "no setuid or setgid file or directory: the sandbox owns what it writes on the host file \
    system, which is not nosuid, so such a bit would run a planted program as pi's user (as root when pi runs as root)";

/// The calls that give a file its mode, each with the argument that holds
/// the mode and, for the calls that apply it only when they create a file,
/// the argument that holds the flags.
pub const MODE_CALLS: [(&str, u32, Option<u32>); 9] = [
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
    ("creat", 1, None),
    ("open", 2, Some(1)),
    ("openat", 3, Some(2)),
];

/// Every call of [`MODE_CALLS`] refused when its mode has `S_ISUID` or
/// `S_ISGID` (each its own comparison): always for the calls that set a
/// mode, with `O_CREAT` or `O_TMPFILE` for `open` and `openat`. `openat2`
/// holds its mode in a struct the filter cannot read: the default answers
/// it `ENOSYS`, and the C library and Python fall back to `openat`.
pub fn setuid_rules() -> Vec<Rule> {
    let mut r = Vec::new();
    for (call, mode, flags) in MODE_CALLS {
        for bit in [S_ISUID, S_ISGID] {
            let has_bit = Cmp::Masked { arg: mode, mask: bit, value: bit };
            match flags {
                None => {
                    r.push(eperm_when(call, When::ArgMasked { arg: mode, mask: bit, value: bit }, SETUID));
                }
                Some(flags) => {
                    for create in [O_CREAT, O_TMPFILE_BIT] {
                        let creates = Cmp::Masked { arg: flags, mask: create, value: create };
                        r.push(eperm_when(call, When::Both(creates, has_bit), SETUID));
                    }
                }
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_calls_are_refused_unconditionally_with_eperm() {
        let rules = rules();
        for name in [
            "socket",
            "socketpair",
            "ptrace",
            "bpf",
            "userfaultfd",
            "perf_event_open",
            "process_vm_readv",
            "process_vm_writev",
            "kexec_load",
            "kexec_file_load",
            "open_by_handle_at",
            "name_to_handle_at",
        ] {
            let rule = rules.iter().find(|r| r.syscall == name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!((rule.action, rule.when), (Action::Eperm, When::Always), "{name}");
        }
        assert!(rules.iter().all(|r| !r.reason.is_empty()));
    }

    #[test]
    fn hardening_rules_are_as_documented() {
        let rules = rules();
        let always: Vec<_> =
            rules.iter().filter(|r| r.when == When::Always && r.action == Action::Eperm).map(|r| r.syscall).collect();
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "keyctl",
            "add_key",
            "request_key",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "open_tree",
            "move_mount",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "syslog",
            "uselib",
            "acct",
            "modify_ldt",
            "quotactl",
            "mbind",
            "migrate_pages",
            "move_pages",
            "set_mempolicy",
        ] {
            assert!(always.contains(&name), "{name}");
        }
        let clone3 = rules.iter().find(|r| r.syscall == "clone3").expect("clone3");
        assert_eq!(clone3.action, Action::Enosys);
        for call in ["clone", "unshare"] {
            let masks: Vec<_> = rules.iter().filter(|r| r.syscall == call).map(|r| r.when).collect();
            let expected: Vec<_> =
                NAMESPACE_FLAGS.iter().map(|&(_, f)| When::ArgMasked { arg: 0, mask: f, value: f }).collect();
            assert_eq!(masks, expected, "{call}: one rule per namespace flag, nothing else");
        }
        let ioctls: Vec<_> = rules.iter().filter(|r| r.syscall == "ioctl").map(|r| r.when).collect();
        assert_eq!(
            ioctls,
            [
                When::ArgMasked { arg: 1, mask: 0xffff_ffff, value: TIOCSTI },
                When::ArgMasked { arg: 1, mask: 0xffff_ffff, value: TIOCLINUX },
            ]
        );
        let personality = rules.iter().find(|r| r.syscall == "personality").expect("personality");
        assert_eq!(personality.when, When::ArgNot { arg: 0, value: 0 });
    }

    #[test]
    fn sysv_ipc_is_refused_with_eperm() {
        let rules = rules();
        for name in [
            "msgget",
            "msgsnd",
            "msgrcv",
            "msgctl",
            "shmget",
            "shmat",
            "shmdt",
            "shmctl",
            "semget",
            "semop",
            "semtimedop",
            "semctl",
            "mq_open",
            "mq_unlink",
            "mq_timedsend",
            "mq_timedreceive",
            "mq_notify",
            "mq_getsetattr",
        ] {
            let rule = rules.iter().find(|r| r.syscall == name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!((rule.action, rule.when), (Action::Eperm, When::Always), "{name}");
        }
    }
}
