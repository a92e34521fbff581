//! The seccomp policy: which system calls the sandbox refuses, and why.
//!
//! The policy is data ([`rules`]) so that it can be reviewed and tested as a
//! list; [`export_bpf`] compiles it with libseccomp into a memfd that
//! bubblewrap loads with `--seccomp FD` as the last step before it executes
//! the worker, so the filter is in force before any worker or user code
//! runs and is inherited by every process in the sandbox. Calls of foreign
//! architectures (i386, x32 on x86_64) are killed by libseccomp's
//! architecture check, since the filter only admits the native one.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::OwnedFd;

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

/// What the filter does with a matching call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fail with EPERM, as if a policy refused it.
    Eperm,
    /// Fail with ENOSYS, as if the kernel lacked the call (so that libc
    /// falls back to an older call the filter can inspect).
    Enosys,
}

/// When a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// `(arg & mask) == value`.
    ArgMasked {
        arg: u32,
        mask: u64,
        value: u64,
    },
    /// `arg != value`.
    ArgNot {
        arg: u32,
        value: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub syscall: &'static str,
    pub action: Action,
    pub when: When,
    /// Must libseccomp know this call on the build architecture? An
    /// optional one that it does not know does not exist there.
    pub required: bool,
    pub reason: &'static str,
}

const fn eperm(syscall: &'static str, required: bool, reason: &'static str) -> Rule {
    Rule { syscall, action: Action::Eperm, when: When::Always, required, reason }
}

const fn eperm_when(syscall: &'static str, when: When, reason: &'static str) -> Rule {
    Rule { syscall, action: Action::Eperm, when, required: false, reason }
}

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
pub const TIOCLINUX: u64 = 0x541C;

/// The refused calls. Everything else is allowed: the namespaces, the mounts
/// and the rlimits do the rest of the confinement.
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
    ];
    for (_, flag) in NAMESPACE_FLAGS {
        let when = When::ArgMasked { arg: 0, mask: flag, value: flag };
        r.push(eperm_when("unshare", when, NS));
        r.push(eperm_when("clone", when, NS));
    }
    r
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("libseccomp does not know the required system call {syscall}")]
    UnknownSyscall { syscall: &'static str },
    #[error("libseccomp refused the rule for {syscall}: {source}")]
    Rule { syscall: &'static str, source: libseccomp::error::SeccompError },
    #[error("libseccomp could not build the filter: {0}")]
    Filter(#[from] libseccomp::error::SeccompError),
    #[error("could not hold the filter in memory: {0}")]
    Memfd(#[from] std::io::Error),
}

fn scmp_action(action: Action) -> ScmpAction {
    match action {
        Action::Eperm => ScmpAction::Errno(libc::EPERM),
        Action::Enosys => ScmpAction::Errno(libc::ENOSYS),
    }
}

fn conditions(when: When) -> Vec<ScmpArgCompare> {
    match when {
        When::Always => vec![],
        When::ArgMasked { arg, mask, value } => vec![ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(mask), value)],
        When::ArgNot { arg, value } => vec![ScmpArgCompare::new(arg, ScmpCompareOp::NotEqual, value)],
    }
}

/// Compile `rules` into a filter context (default: allow).
pub fn build_filter(rules: &[Rule]) -> Result<ScmpFilterContext, SeccompError> {
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow)?;
    for rule in rules {
        let syscall = match ScmpSyscall::from_name(rule.syscall) {
            Ok(s) => s,
            Err(_) if !rule.required => continue,
            Err(_) => return Err(SeccompError::UnknownSyscall { syscall: rule.syscall }),
        };
        ctx.add_rule_conditional(scmp_action(rule.action), syscall, &conditions(rule.when))
            .map_err(|source| SeccompError::Rule { syscall: rule.syscall, source })?;
    }
    Ok(ctx)
}

/// The compiled policy as BPF in a memfd positioned at offset 0, ready to
/// hand to `bwrap --seccomp FD`. (bwrap reads from the current offset: an fd
/// left at the end after writing gives it an empty program.)
pub fn export_bpf(rules: &[Rule]) -> Result<OwnedFd, SeccompError> {
    let ctx = build_filter(rules)?;
    let mut file = memfd()?;
    ctx.export_bpf(&mut file)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}

/// The compiled program of [`rules`], built once per process.
fn program() -> Result<&'static [u8], String> {
    static PROGRAM: std::sync::OnceLock<Result<Vec<u8>, String>> = std::sync::OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            use std::io::Read;
            let mut bytes = Vec::new();
            File::from(export_bpf(&rules()).map_err(|e| e.to_string())?)
                .read_to_end(&mut bytes)
                .map_err(|e| e.to_string())?;
            Ok(bytes)
        })
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| e.clone())
}

/// An empty close-on-exec memfd for a BPF program.
fn memfd() -> std::io::Result<File> {
    let fd = nix::sys::memfd::memfd_create(c"pi-python-seccomp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
    Ok(File::from(fd))
}

/// A fresh memfd holding the policy, at offset 0, for one sandbox start.
pub fn bpf_memfd() -> Result<OwnedFd, String> {
    use std::io::Write;
    let bytes = program()?;
    let mut file = memfd().map_err(|e| e.to_string())?;
    file.write_all(bytes).map_err(|e| e.to_string())?;
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

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
    fn every_rule_names_a_call_known_on_this_architecture() {
        for rule in rules() {
            assert!(ScmpSyscall::from_name(rule.syscall).is_ok(), "{} unknown", rule.syscall);
        }
    }

    #[test]
    fn a_required_unknown_call_fails_the_build() {
        let bad = [eperm("no_such_syscall_xyz", true, "test")];
        assert!(matches!(build_filter(&bad), Err(SeccompError::UnknownSyscall { .. })));
        let optional = [eperm("no_such_syscall_xyz", false, "test")];
        assert!(build_filter(&optional).is_ok());
    }

    #[test]
    fn exported_bpf_is_readable_from_offset_zero() {
        let fd = export_bpf(&rules()).expect("export");
        let mut program = Vec::new();
        File::from(fd).read_to_end(&mut program).expect("read");
        // A BPF program is a whole number of 8-byte instructions; the
        // architecture check plus one jump per rule makes it non-trivial.
        assert_eq!(program.len() % 8, 0);
        assert!(program.len() / 8 > rules().len(), "{} instructions", program.len() / 8);
    }
}
