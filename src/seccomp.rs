//! The seccomp policy: which system calls the sandbox refuses, and why.
//!
//! The policy is data ([`rules`]) so that it can be reviewed and tested as a
//! list; [`export_bpf`] compiles it with libseccomp into a sealed memfd that
//! bubblewrap loads with `--seccomp FD` as the last step before it executes
//! the worker, so the filter is in force before any worker or user code
//! runs and is inherited by every process in the sandbox. Calls of foreign
//! architectures (i386, x32 on x86_64) are killed by libseccomp's
//! architecture check, since the filter only admits the native one.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::OwnedFd;

use libseccomp::{ScmpAction, ScmpFilterContext, ScmpSyscall};

/// What the filter does with a matching call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fail with EPERM, as if a policy refused it.
    Eperm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub syscall: &'static str,
    pub action: Action,
    /// Must libseccomp know this call on the build architecture? An
    /// optional one that it does not know does not exist there.
    pub required: bool,
    pub reason: &'static str,
}

const fn eperm(syscall: &'static str, required: bool, reason: &'static str) -> Rule {
    Rule { syscall, action: Action::Eperm, required, reason }
}

/// The refused calls. Everything else is allowed: the namespaces, the mounts
/// and the rlimits do the rest of the confinement.
pub fn rules() -> Vec<Rule> {
    const NET: &str = "no sockets: no network, and no connection to a host Unix socket bound into a mount";
    const PEEK: &str = "no reading or writing of another process's memory";
    const KEXEC: &str = "no loading of a new kernel";
    const HANDLE: &str = "file handles can reach files outside the mounts";
    vec![
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
    ]
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
        ctx.add_rule(scmp_action(rule.action), syscall)
            .map_err(|source| SeccompError::Rule { syscall: rule.syscall, source })?;
    }
    Ok(ctx)
}

/// The compiled policy as BPF in a memfd positioned at offset 0, ready to
/// hand to `bwrap --seccomp FD`. (bwrap reads from the current offset: an fd
/// left at the end after writing gives it an empty program.)
pub fn export_bpf(rules: &[Rule]) -> Result<OwnedFd, SeccompError> {
    let ctx = build_filter(rules)?;
    let fd = nix::sys::memfd::memfd_create(
        c"pi-python-seccomp",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut file = File::from(fd);
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

/// A fresh memfd holding the policy, at offset 0, for one sandbox start.
pub fn bpf_memfd() -> Result<OwnedFd, String> {
    use std::io::Write;
    let bytes = program()?;
    let fd = nix::sys::memfd::memfd_create(c"pi-python-seccomp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| e.to_string())?;
    let mut file = File::from(fd);
    file.write_all(bytes).map_err(|e| e.to_string())?;
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_policy_is_exactly_the_documented_list() {
        let names: Vec<_> = rules().iter().map(|r| r.syscall).collect();
        assert_eq!(
            names,
            [
                "socket", "socketpair", "ptrace", "process_vm_readv", "process_vm_writev", "bpf",
                "userfaultfd", "perf_event_open", "kexec_load", "kexec_file_load",
                "open_by_handle_at", "name_to_handle_at",
            ]
        );
        assert!(rules().iter().all(|r| r.action == Action::Eperm && !r.reason.is_empty()));
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
