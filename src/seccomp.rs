//! The seccomp policy: which system calls the sandbox may make, which it
//! refuses, and why.
//!
//! The policy is default-deny and is data, so that it can be reviewed and
//! tested as lists: [`allowlist`] names the calls the sandbox needs, each
//! group with its reason; [`rules`] names every refusal with its reason and
//! its answer; every other call answers [`DEFAULT`] (ENOSYS), as a kernel
//! without that call would, so that a call newer than the list (such as
//! `open_tree_attr`, Linux 6.15) is refused and the C library falls back to
//! an older call the filter knows. A refusal is kept as a rule even where
//! the default would refuse the call too, so that its answer (EPERM) and its
//! reason stay what they are.
//!
//! The allowlist is anchored on Docker's default profile (moby
//! `profiles/seccomp/default.json`, the calls it allows every unprivileged
//! container). Left out of it: the 32-bit forms and multiplexers (`*32`,
//! `*_time64`, `mmap2`, `socketcall`, `ipc`, ...), which a native-only filter
//! never sees; `set_thread_area`, `get_thread_area` and `epoll_*_old`, which
//! only 32-bit code or nothing uses; `fanotify_mark`, useless without the
//! `fanotify_init` the profile does not allow; and every call [`rules`]
//! refuses always.
//!
//! [`export_bpf`] compiles the policy with libseccomp into a memfd that
//! bubblewrap loads with `--seccomp FD` as the last step before it executes
//! the worker, so the filter is in force before any worker or user code
//! runs and is inherited by every process in the sandbox. Calls of foreign
//! architectures (i386, x32 on x86_64) are killed by libseccomp's
//! architecture check, since the filter only admits the native one.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::OwnedFd;

use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

mod allowlist;
pub use allowlist::allowlist;
mod markdown;
pub use markdown::markdown_table;
mod refusals;
pub use refusals::{
    rules, setuid_rules, AIO, F_NOTIFY, F_SETLEASE, MODE_CALLS, NAMESPACE_FLAGS, O_CREAT, O_TMPFILE_BIT,
    PR_SET_DUMPABLE, S_ISGID, S_ISUID, TIOCLINUX, TIOCSTI,
};

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
    /// Both comparisons hold (a call refused only for a combination of its
    /// arguments, such as `O_CREAT` with a setuid mode).
    Both(Cmp, Cmp),
}

/// One comparison of a [`When::Both`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `(arg & mask) == value`.
    Masked { arg: u32, mask: u64, value: u64 },
    /// `arg != value`.
    Not { arg: u32, value: u64 },
}

impl Cmp {
    /// The argument it tests.
    pub fn arg(self) -> u32 {
        match self {
            Cmp::Masked { arg, .. } | Cmp::Not { arg, .. } => arg,
        }
    }
}

impl When {
    /// The argument the first comparison tests (`None` for [`When::Always`]).
    pub fn first_arg(self) -> Option<u32> {
        match self {
            When::Always => None,
            When::ArgMasked { arg, .. } | When::ArgNot { arg, .. } => Some(arg),
            When::Both(first, _) => Some(first.arg()),
        }
    }
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

/// What the filter answers a call that neither list names.
pub const DEFAULT: Action = Action::Enosys;

/// Calls the filter allows, and why the sandbox needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub names: &'static [&'static str],
    /// Must libseccomp know every name on the build architecture? Optional
    /// groups hold calls that one supported architecture lacks, or that are
    /// newer than some libseccomp releases; a name libseccomp does not know
    /// there is left out of the filter and gets the default.
    pub required: bool,
    pub reason: &'static str,
}

const fn allow(names: &'static [&'static str], reason: &'static str) -> Allowed {
    Allowed { names, required: true, reason }
}

const fn allow_optional(names: &'static [&'static str], reason: &'static str) -> Allowed {
    Allowed { names, required: false, reason }
}

const fn eperm(syscall: &'static str, required: bool, reason: &'static str) -> Rule {
    Rule { syscall, action: Action::Eperm, when: When::Always, required, reason }
}

const fn eperm_when(syscall: &'static str, when: When, reason: &'static str) -> Rule {
    Rule { syscall, action: Action::Eperm, when, required: false, reason }
}

/// The system calls a payload may make, by what it runs. [`allowlist`] and
/// [`rules`] are the python profile; every other profile is named by how
/// it differs from them ([`allowlist_for`], [`rules_for`]). Only
/// [`Profile::ShellNet`] and [`Profile::PythonNet`] have network sockets:
/// TCP ones, for a policy whose network is a host proxy
/// (`socket(AF_INET)` in the sandbox's empty network namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// The python tool: no sockets of any kind.
    #[default]
    Python,
    /// A shell: also a connected pair of Unix sockets.
    Shell,
    /// A shell whose network is the host's proxy: also TCP sockets
    /// (`AF_INET`/`AF_INET6`, `SOCK_STREAM`) in its own network namespace,
    /// where the proxy's listener is the one way out.
    ShellNet,
    /// The python tool when the configuration gives it the proxy
    /// (`network.python`): the python profile with [`Profile::ShellNet`]'s
    /// TCP sockets.
    PythonNet,
}

impl Profile {
    pub const ALL: [Profile; 4] = [Profile::Python, Profile::Shell, Profile::ShellNet, Profile::PythonNet];

    fn index(self) -> usize {
        match self {
            Profile::Python => 0,
            Profile::Shell => 1,
            Profile::ShellNet => 2,
            Profile::PythonNet => 3,
        }
    }

    /// Whether it has TCP sockets (a network through the host's proxy).
    pub fn has_tcp(self) -> bool {
        matches!(self, Profile::ShellNet | Profile::PythonNet)
    }

    fn is_shell(self) -> bool {
        matches!(self, Profile::Shell | Profile::ShellNet)
    }
}

/// Socket domains and types of [`Profile::ShellNet`]'s TCP sockets.
pub const AF_INET: u64 = 2;
pub const AF_INET6: u64 = 10;
pub const SOCK_STREAM: u64 = 1;
/// The socket types other than `SOCK_STREAM` (the low four bits of
/// `socket`'s type; the others are flags): datagram, raw, RDM, seqpacket,
/// DCCP, packet.
const OTHER_SOCKET_TYPES: [u64; 6] = [2, 3, 4, 5, 6, 10];

const SOCKET_TCP: &str = "TCP sockets, in the sandbox's own network namespace: its loopback, where the host's \
    proxy listens, is the only place they reach";

/// `socket`'s refusals in [`Profile::ShellNet`], every one testing the
/// domain first: every domain but `AF_INET`/`AF_INET6` (each of 0-63 by
/// value, every larger one by a bit it sets), and those two with a type
/// other than `SOCK_STREAM` or a protocol other than 0 or `IPPROTO_TCP`.
fn tcp_only_socket_rules() -> Vec<Rule> {
    const WHY: &str = "no socket but a TCP one (AF_INET/AF_INET6, SOCK_STREAM): no netlink, packet, raw or datagram \
        socket, no Unix socket to a host service bound into a mount";
    let refuse = |when| Rule { syscall: "socket", action: Action::Eperm, when, required: true, reason: WHY };
    let low = u64::from(u32::MAX);
    let mut rules: Vec<Rule> = (0..64u64)
        .filter(|f| *f != AF_INET && *f != AF_INET6)
        .map(|f| refuse(When::ArgMasked { arg: 0, mask: low, value: f }))
        .collect();
    rules.extend((6..32).map(|bit| refuse(When::ArgMasked { arg: 0, mask: 1 << bit, value: 1 << bit })));
    for family in [AF_INET, AF_INET6] {
        let domain = Cmp::Masked { arg: 0, mask: low, value: family };
        for ty in OTHER_SOCKET_TYPES {
            rules.push(refuse(When::Both(domain, Cmp::Masked { arg: 1, mask: 0xf, value: ty })));
        }
        // A protocol other than 0 or IPPROTO_TCP (6): SOCK_STREAM is also
        // MPTCP (262) and SCTP (132), each more kernel to reach. Every
        // value with bit 0 or any of bits 3-31 set, and 2 and 4.
        let protocol = |mask, value| refuse(When::Both(domain, Cmp::Masked { arg: 2, mask, value }));
        rules.extend((0..32u32).filter(|bit| !(1..=2).contains(bit)).map(|bit| protocol(1u64 << bit, 1u64 << bit)));
        rules.extend([2u64, 4].map(|value| protocol(low, value)));
    }
    rules.push(Rule {
        syscall: "setsockopt",
        action: Action::Eperm,
        when: When::Both(
            Cmp::Masked { arg: 1, mask: low, value: IPPROTO_TCP },
            Cmp::Masked { arg: 2, mask: low, value: TCP_ULP },
        ),
        required: true,
        reason: "no upper-layer protocol on a TCP socket (TCP_ULP: kernel TLS, espintcp): a client's TLS runs in \
            the process, and the proxy needs none of that kernel code",
    });
    rules
}

/// `setsockopt`'s level for TCP, and its option that attaches an upper
/// layer protocol (kernel TLS) to a socket.
pub const IPPROTO_TCP: u64 = 6;
pub const TCP_ULP: u64 = 31;

/// `socketpair`'s domain for a pair of Unix sockets.
pub const AF_UNIX: u64 = 1;

const SOCKETPAIR_UNIX: &str = "a shell's pipelines and tools it runs (sort, coprocesses, some C libraries' helpers) \
    make a connected pair of Unix sockets: a channel between two of the sandbox's own processes, which reaches \
    nothing outside it";

/// The calls `profile` allows: the python profile's, and for a shell
/// `socketpair` (refused below for every domain but `AF_UNIX`).
pub fn allowlist_for(profile: Profile) -> Vec<Allowed> {
    let mut allowed = allowlist();
    if profile.is_shell() {
        allowed.push(allow(&["socketpair"], SOCKETPAIR_UNIX));
    }
    if profile.has_tcp() {
        allowed.push(allow(&["socket"], SOCKET_TCP));
    }
    allowed
}

/// The refusals of `profile`: the python profile's, and for a shell the
/// refusal of `socketpair` narrowed to every domain but `AF_UNIX`.
pub fn rules_for(profile: Profile) -> Vec<Rule> {
    let mut rules = rules();
    if profile.has_tcp() {
        rules.retain(|r| r.syscall != "socket");
        rules.extend(tcp_only_socket_rules());
    }
    if profile.is_shell() {
        for rule in rules.iter_mut().filter(|r| r.syscall == "socketpair") {
            *rule = Rule {
                syscall: "socketpair",
                action: Action::Eperm,
                when: When::ArgNot { arg: 0, value: AF_UNIX },
                required: true,
                reason: "no socket pair but a Unix one: the other domains are network protocols",
            };
        }
    }
    rules
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

fn compare(cmp: Cmp) -> ScmpArgCompare {
    match cmp {
        Cmp::Masked { arg, mask, value } => ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(mask), value),
        Cmp::Not { arg, value } => ScmpArgCompare::new(arg, ScmpCompareOp::NotEqual, value),
    }
}

/// libseccomp's conditions of a rule; several in one rule must all hold.
fn conditions(when: When) -> Vec<ScmpArgCompare> {
    match when {
        When::Always => vec![],
        When::ArgMasked { arg, mask, value } => vec![compare(Cmp::Masked { arg, mask, value })],
        When::ArgNot { arg, value } => vec![compare(Cmp::Not { arg, value })],
        When::Both(first, second) => vec![compare(first), compare(second)],
    }
}

/// The native number of `name`, or `None` for an optional call that
/// libseccomp does not know on this architecture.
fn resolve(name: &'static str, required: bool) -> Result<Option<ScmpSyscall>, SeccompError> {
    match ScmpSyscall::from_name(name) {
        // Negative numbers are libseccomp's stand-ins for calls of other architectures.
        Ok(s) if s.as_raw_syscall() >= 0 => Ok(Some(s)),
        _ if !required => Ok(None),
        _ => Err(SeccompError::UnknownSyscall { syscall: name }),
    }
}

/// The condition under which an allowed call is allowed: always, or, for a
/// call a rule refuses for some arguments, "any value" of the argument that
/// rule tests first (`arg >= 0`). An unconditional rule would not do: libseccomp
/// lets it replace every conditional rule of the same call. It checks
/// equality tests (the refusals) before range tests on the same argument
/// (`__db_chain_op_priority` in its `db.c`), so the refusals come first.
fn allowed_when(name: &str, rules: &[Rule]) -> Vec<ScmpArgCompare> {
    let arg = rules.iter().filter(|r| r.syscall == name).find_map(|r| r.when.first_arg());
    arg.map(|arg| vec![ScmpArgCompare::new(arg, ScmpCompareOp::GreaterEqual, 0)]).unwrap_or_default()
}

/// Compile the policy into a filter context (default: [`DEFAULT`]).
pub fn build_filter(allowed: &[Allowed], rules: &[Rule]) -> Result<ScmpFilterContext, SeccompError> {
    let mut ctx = ScmpFilterContext::new(scmp_action(DEFAULT))?;
    for group in allowed {
        for &name in group.names {
            let Some(syscall) = resolve(name, group.required)? else { continue };
            ctx.add_rule_conditional(ScmpAction::Allow, syscall, &allowed_when(name, rules))
                .map_err(|source| SeccompError::Rule { syscall: name, source })?;
        }
    }
    for rule in rules {
        // The default answers this already (and libseccomp refuses a rule
        // whose action is the default's).
        if rule.action == DEFAULT && rule.when == When::Always {
            continue;
        }
        let Some(syscall) = resolve(rule.syscall, rule.required)? else { continue };
        ctx.add_rule_conditional(scmp_action(rule.action), syscall, &conditions(rule.when))
            .map_err(|source| SeccompError::Rule { syscall: rule.syscall, source })?;
    }
    Ok(ctx)
}

/// How many calls the filter allows on this architecture.
pub fn allowed_here() -> usize {
    allowlist().iter().flat_map(|g| g.names).filter(|&&n| matches!(resolve(n, false), Ok(Some(_)))).count()
}

/// The compiled policy as BPF in a memfd positioned at offset 0, ready to
/// hand to `bwrap --seccomp FD`. (bwrap reads from the current offset: an fd
/// left at the end after writing gives it an empty program.)
pub fn export_bpf(allowed: &[Allowed], rules: &[Rule]) -> Result<OwnedFd, SeccompError> {
    let ctx = build_filter(allowed, rules)?;
    let mut file = memfd()?;
    ctx.export_bpf(&mut file)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}

/// Why a sandbox start got no filter.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// Building the program failed (once per process; every start says so).
    #[error(transparent)]
    Build(std::sync::Arc<SeccompError>),
    #[error("could not hold the filter in memory: {0}")]
    Memfd(#[from] std::io::Error),
}

/// The compiled program of `profile`, built once per process.
fn program(profile: Profile) -> Result<&'static [u8], FilterError> {
    type Built = std::sync::OnceLock<Result<Vec<u8>, std::sync::Arc<SeccompError>>>;
    static PROGRAMS: [Built; Profile::ALL.len()] = [const { std::sync::OnceLock::new() }; Profile::ALL.len()];
    PROGRAMS[profile.index()]
        .get_or_init(|| {
            use std::io::Read;
            let mut bytes = Vec::new();
            let fd = export_bpf(&allowlist_for(profile), &rules_for(profile))?;
            File::from(fd).read_to_end(&mut bytes).map_err(SeccompError::Memfd)?;
            Ok(bytes)
        })
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| FilterError::Build(e.clone()))
}

/// Build `profile`'s program now (once per process), so that a start
/// finds it built; a failure is the start's to report.
pub fn warm(profile: Profile) {
    let _ = program(profile);
}

/// An empty close-on-exec memfd for a BPF program.
fn memfd() -> std::io::Result<File> {
    let fd = nix::sys::memfd::memfd_create(c"pi-python-seccomp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
    Ok(File::from(fd))
}

/// A fresh memfd holding `profile`'s program, at offset 0, for one sandbox
/// start.
pub fn bpf_memfd(profile: Profile) -> Result<OwnedFd, FilterError> {
    use std::io::Write;
    let bytes = program(profile)?;
    let mut file = memfd()?;
    file.write_all(bytes)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn every_rule_names_a_call_known_on_this_architecture() {
        for rule in rules() {
            assert!(ScmpSyscall::from_name(rule.syscall).is_ok(), "{} unknown", rule.syscall);
        }
    }

    #[test]
    fn a_required_unknown_call_fails_the_build() {
        let bad = [eperm("no_such_syscall_xyz", true, "test")];
        assert!(matches!(build_filter(&[], &bad), Err(SeccompError::UnknownSyscall { .. })));
        let optional = [eperm("no_such_syscall_xyz", false, "test")];
        assert!(build_filter(&[], &optional).is_ok());
        let allowed = [allow(&["read", "no_such_syscall_xyz"], "test")];
        assert!(matches!(build_filter(&allowed, &[]), Err(SeccompError::UnknownSyscall { .. })));
        assert!(build_filter(&[allow_optional(&["read", "no_such_syscall_xyz"], "test")], &[]).is_ok());
    }

    #[test]
    fn exported_bpf_is_readable_from_offset_zero() {
        let fd = export_bpf(&allowlist(), &rules()).expect("export");
        let mut program = Vec::new();
        File::from(fd).read_to_end(&mut program).expect("read");
        // A BPF program is a whole number of 8-byte instructions; the
        // architecture check plus one jump per rule makes it non-trivial.
        assert_eq!(program.len() % 8, 0);
        assert!(program.len() / 8 > rules().len() + allowed_here(), "{} instructions", program.len() / 8);
    }

    #[test]
    fn no_call_is_both_allowed_and_refused_always() {
        // libseccomp would keep whichever unconditional rule came first.
        let allowed: Vec<_> = allowlist().iter().flat_map(|g| g.names).copied().collect();
        for rule in rules() {
            if rule.when == When::Always {
                assert!(!allowed.contains(&rule.syscall), "{} is allowed and refused", rule.syscall);
            }
        }
    }

    #[test]
    fn a_call_refused_for_some_arguments_is_allowed_and_its_refusals_test_one_argument_first() {
        let allowed: Vec<_> = allowlist().iter().flat_map(|g| g.names).copied().collect();
        let rules = rules();
        let conditional: std::collections::BTreeSet<_> =
            rules.iter().filter(|r| r.when != When::Always).map(|r| r.syscall).collect();
        assert_eq!(conditional.len(), 15, "{conditional:?}");
        for call in conditional {
            assert!(allowed.contains(&call), "{call} must be allowed for its other arguments");
            let args: std::collections::HashSet<_> = rules
                .iter()
                .filter(|r| r.syscall == call)
                .map(|r| r.when.first_arg().unwrap_or_else(|| panic!("{call} is refused always")))
                .collect();
            // The "any value" allow is ordered after the refusals only on the same argument.
            assert_eq!(args.len(), 1, "{call}: {args:?}");
        }
    }

    // ---------------------------------------------------------------------
    // The compiled program, run as the kernel runs it.

    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;

    /// A classic-BPF interpreter for the instructions libseccomp emits, run
    /// on a `struct seccomp_data` (nr, arch, instruction pointer, six args).
    fn run(program: &[u8], arch: u32, nr: i32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let word = |k: u32| {
            let k = k as usize;
            u32::from_ne_bytes(data[k..k + 4].try_into().expect("aligned load inside seccomp_data"))
        };
        let insns: Vec<(u16, u8, u8, u32)> = program
            .chunks_exact(8)
            .map(|c| {
                let code = u16::from_ne_bytes([c[0], c[1]]);
                (code, c[2], c[3], u32::from_ne_bytes([c[4], c[5], c[6], c[7]]))
            })
            .collect();
        let (mut a, mut x, mut mem, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
        loop {
            let (code, jt, jf, k) = insns[pc];
            pc += 1;
            let jump = |cond: bool| if cond { jt as usize } else { jf as usize };
            match code {
                0x20 => a = word(k),            // ld [k]
                0x00 => a = k,                  // ld #k
                0x60 => a = mem[k as usize],    // ld M[k]
                0x61 => x = mem[k as usize],    // ldx M[k]
                0x02 => mem[k as usize] = a,    // st M[k]
                0x03 => mem[k as usize] = x,    // stx M[k]
                0x07 => x = a,                  // tax
                0x87 => a = x,                  // txa
                0x54 => a &= k,                 // and #k
                0x44 => a |= k,                 // or #k
                0x05 => pc += k as usize,       // ja
                0x15 => pc += jump(a == k),     // jeq #k
                0x25 => pc += jump(a > k),      // jgt #k
                0x35 => pc += jump(a >= k),     // jge #k
                0x45 => pc += jump(a & k != 0), // jset #k
                0x06 => return k,               // ret #k
                0x16 => return a,               // ret a
                other => panic!("instruction {other:#06x} at {} is not interpreted", pc - 1),
            }
        }
    }

    fn program() -> Vec<u8> {
        let mut bytes = Vec::new();
        File::from(export_bpf(&allowlist(), &rules()).expect("export")).read_to_end(&mut bytes).expect("read");
        bytes
    }

    fn nr(name: &str) -> i32 {
        ScmpSyscall::from_name(name).expect(name).as_raw_syscall()
    }

    #[test]
    fn the_compiled_filter_allows_the_list_and_answers_each_refusal() {
        let program = program();
        let answer = |nr: i32, args: [u64; 6]| run(&program, AUDIT_ARCH, nr, args);
        for group in allowlist() {
            for &name in group.names {
                if let Ok(Some(s)) = resolve(name, false) {
                    assert_eq!(answer(s.as_raw_syscall(), [0; 6]), RET_ALLOW, "{name}");
                }
            }
        }
        for rule in rules().iter().filter(|r| r.when == When::Always) {
            if let Ok(Some(s)) = resolve(rule.syscall, false) {
                let want = if rule.action == Action::Eperm { EPERM } else { ENOSYS };
                assert_eq!(answer(s.as_raw_syscall(), [1, 2, 3, 4, 5, 6]), want, "{}", rule.syscall);
            }
        }
        // Another architecture's call is killed (SECCOMP_RET_KILL_THREAD), not answered.
        assert_eq!(run(&program, 0x4000_0003, 20, [0; 6]), 0, "i386 getpid");
    }

    #[test]
    fn the_compiled_filter_refuses_the_conditional_cases_and_allows_the_rest() {
        let program = program();
        let answer = |name: &str, args: [u64; 6]| run(&program, AUDIT_ARCH, nr(name), args);
        const TCGETS: u64 = 0x5401;
        assert_eq!(answer("ioctl", [0, TCGETS, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer("ioctl", [0, TIOCSTI, 0, 0, 0, 0]), EPERM);
        assert_eq!(answer("ioctl", [0, TIOCLINUX, 0, 0, 0, 0]), EPERM);
        // The kernel reads the request as 32 bits: the upper half does not matter.
        assert_eq!(answer("ioctl", [0, 0xdead_0000_0000 | TIOCSTI, 0, 0, 0, 0]), EPERM);
        assert_eq!(answer("ioctl", [0, u64::MAX, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer("personality", [0; 6]), RET_ALLOW);
        for persona in [0x0040000, 0xffff_ffff, 8, 1 << 32] {
            assert_eq!(answer("personality", [persona, 0, 0, 0, 0, 0]), EPERM, "{persona:#x}");
        }
        const SIGCHLD: u64 = 17;
        const THREAD: u64 = 0x003d_0f00; // CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | SETTLS | *_TID
        for call in ["clone", "unshare"] {
            for (flag_name, flag) in NAMESPACE_FLAGS {
                assert_eq!(answer(call, [flag | SIGCHLD, 0, 0, 0, 0, 0]), EPERM, "{call} {flag_name}");
            }
        }
        assert_eq!(answer("clone", [SIGCHLD, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer("clone", [THREAD, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer("unshare", [0x400, 0, 0, 0, 0, 0]), RET_ALLOW, "CLONE_FILES");
    }

    #[test]
    fn setuid_and_setgid_modes_are_refused_for_every_call_that_gives_a_mode() {
        let program = program();
        let answer = |name: &str, args: [u64; 6]| run(&program, AUDIT_ARCH, nr(name), args);
        const AT_FDCWD: u64 = -100i64 as u64;
        const O_WRONLY: u64 = 0o1;
        const O_TMPFILE: u64 = O_TMPFILE_BIT | 0o200_000; // with O_DIRECTORY
        const S_IFREG: u64 = 0o100_000;
        type Args = fn(u64) -> [u64; 6];
        let calls: &[(&str, Args)] = &[
            ("fchmod", |m| [3, m, 0, 0, 0, 0]),
            ("fchmodat", |m| [AT_FDCWD, 0x1000, m, 0, 0, 0]),
            ("mknodat", |m| [AT_FDCWD, 0x1000, S_IFREG | m, 0, 0, 0]),
            ("openat", |m| [AT_FDCWD, 0x1000, O_CREAT | O_WRONLY, m, 0, 0]),
            ("openat", |m| [AT_FDCWD, 0x1000, O_TMPFILE | O_WRONLY, m, 0, 0]),
            #[cfg(target_arch = "x86_64")]
            ("chmod", |m| [0x1000, m, 0, 0, 0, 0]),
            #[cfg(target_arch = "x86_64")]
            ("mknod", |m| [0x1000, S_IFREG | m, 0, 0, 0, 0]),
            #[cfg(target_arch = "x86_64")]
            ("creat", |m| [0x1000, m, 0, 0, 0, 0]),
            #[cfg(target_arch = "x86_64")]
            ("open", |m| [0x1000, O_CREAT | O_WRONLY, m, 0, 0, 0]),
            #[cfg(target_arch = "x86_64")]
            ("open", |m| [0x1000, O_TMPFILE | O_WRONLY, m, 0, 0, 0]),
        ];
        for (call, args) in calls {
            for mode in [0o4755, 0o2755, 0o6755, 0o4000, 0o2000, 0xffff_0000_0000_0000 | 0o4000] {
                assert_eq!(answer(call, args(mode)), EPERM, "{call} {mode:#o}");
            }
            for mode in [0o755, 0o1777, 0o644, 0] {
                assert_eq!(answer(call, args(mode)), RET_ALLOW, "{call} {mode:#o}");
            }
        }
        if let Ok(Some(s)) = resolve("fchmodat2", false) {
            assert_eq!(run(&program, AUDIT_ARCH, s.as_raw_syscall(), [AT_FDCWD, 0x1000, 0o4755, 0, 0, 0]), EPERM);
            assert_eq!(run(&program, AUDIT_ARCH, s.as_raw_syscall(), [AT_FDCWD, 0x1000, 0o755, 0, 0, 0]), RET_ALLOW);
        }
        // Without O_CREAT or O_TMPFILE the mode is ignored by the kernel, and allowed.
        assert_eq!(answer("openat", [AT_FDCWD, 0x1000, O_WRONLY, 0o4755, 0, 0]), RET_ALLOW);
        assert_eq!(answer("openat", [AT_FDCWD, 0x1000, 0o200_000, 0o6755, 0, 0]), RET_ALLOW, "O_DIRECTORY alone");
        assert_eq!(answer("openat2", [AT_FDCWD, 0x1000, 0x2000, 24, 0, 0]), ENOSYS);
        // Directories get setgid by inheritance only: mkdir strips both bits itself.
        assert_eq!(answer("mkdirat", [AT_FDCWD, 0x1000, 0o6755, 0, 0, 0]), RET_ALLOW);
    }

    #[test]
    fn becoming_dumpable_is_refused_and_other_prctls_are_allowed() {
        let program = program();
        let answer = |args: [u64; 6]| run(&program, AUDIT_ARCH, nr("prctl"), args);
        const PR_GET_DUMPABLE: u64 = 3;
        const PR_SET_NAME: u64 = 15;
        const PR_SET_PDEATHSIG: u64 = 1;
        for value in [1, 2, 1 << 32, u64::MAX] {
            assert_eq!(answer([PR_SET_DUMPABLE, value, 0, 0, 0, 0]), EPERM, "{value:#x}");
            // The kernel reads the option as an int.
            assert_eq!(answer([0xdead_0000_0000 | PR_SET_DUMPABLE, value, 0, 0, 0, 0]), EPERM, "{value:#x}");
        }
        assert_eq!(answer([PR_SET_DUMPABLE, 0, 0, 0, 0, 0]), RET_ALLOW);
        for option in [PR_GET_DUMPABLE, PR_SET_NAME, PR_SET_PDEATHSIG] {
            assert_eq!(answer([option, 1, 0, 0, 0, 0]), RET_ALLOW, "{option}");
            assert_eq!(answer([option, 0, 0, 0, 0, 0]), RET_ALLOW, "{option}");
        }
    }

    #[test]
    fn native_aio_is_refused_with_eperm() {
        let rules = rules();
        for name in AIO {
            let rule = rules.iter().find(|r| r.syscall == name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!((rule.action, rule.when), (Action::Eperm, When::Always), "{name}");
        }
    }

    #[test]
    fn calls_the_lists_do_not_name_answer_enosys() {
        let program = program();
        // Numbers from 424 on are the same on every architecture.
        for (name, nr) in [
            ("pidfd_getfd", 438),
            ("process_madvise", 440),
            ("quotactl_fd", 443),
            ("set_mempolicy_home_node", 450),
            ("statmount", 457),
            ("listmount", 458),
            ("mseal", 462),
            ("open_tree_attr", 467),
            ("a number no kernel has", 4000),
        ] {
            assert_eq!(run(&program, AUDIT_ARCH, nr, [0; 6]), ENOSYS, "{name}");
        }
        for name in ["kcmp", "vhangup", "reboot", "swapon", "init_module", "settimeofday", "get_mempolicy"] {
            assert_eq!(run(&program, AUDIT_ARCH, nr(name), [0; 6]), ENOSYS, "{name}");
        }
    }
    // ---------------------------------------------------------------------
    // The profiles.

    fn profile_program(profile: Profile) -> Vec<u8> {
        let mut bytes = Vec::new();
        let fd = export_bpf(&allowlist_for(profile), &rules_for(profile)).expect("export");
        File::from(fd).read_to_end(&mut bytes).expect("read");
        bytes
    }

    #[test]
    fn the_python_profile_is_the_recorded_one() {
        let mut listed = String::new();
        for group in allowlist_for(Profile::Python) {
            listed.push_str(&format!("{group:?}\n"));
        }
        for rule in rules_for(Profile::Python) {
            listed.push_str(&format!("{rule:?}\n"));
        }
        assert_eq!(listed, include_str!("seccomp/python-profile.txt"));
    }

    #[test]
    fn the_shell_profile_differs_from_python_s_by_socketpair_of_unix_sockets_alone() {
        let (python, shell) = (allowlist_for(Profile::Python), allowlist_for(Profile::Shell));
        assert_eq!(shell[..python.len()], python[..]);
        assert_eq!(shell.len(), python.len() + 1);
        let added = shell[python.len()];
        assert_eq!((added.names, added.required), (&["socketpair"][..], true));
        assert!(!added.reason.is_empty());
        let (python, shell) = (rules_for(Profile::Python), rules_for(Profile::Shell));
        assert_eq!(python.len(), shell.len());
        let differ: Vec<_> = python.iter().zip(&shell).filter(|(p, s)| p != s).collect();
        assert_eq!(differ.len(), 1, "{differ:?}");
        let (was, is) = differ[0];
        assert_eq!((was.syscall, was.when), ("socketpair", When::Always));
        assert_eq!(
            (is.syscall, is.action, is.when),
            ("socketpair", Action::Eperm, When::ArgNot { arg: 0, value: AF_UNIX })
        );
        assert!(is.required && !is.reason.is_empty());
    }

    #[test]
    fn the_network_shell_profile_allows_tcp_sockets_and_refuses_every_other_socket() {
        let net = profile_program(Profile::ShellNet);
        let shell = profile_program(Profile::Shell);
        let socket = nr("socket");
        const CLOEXEC_NONBLOCK: u64 = 0o2000000 | 0o4000;
        for (domain, ty) in [(AF_INET, SOCK_STREAM), (AF_INET6, SOCK_STREAM), (AF_INET, SOCK_STREAM | CLOEXEC_NONBLOCK)]
        {
            let args = [domain, ty, 0, 0, 0, 0];
            assert_eq!(run(&net, AUDIT_ARCH, socket, args), RET_ALLOW, "{domain} {ty:#x}");
            // Baseline: the shell without a network refuses the same call.
            assert_eq!(run(&shell, AUDIT_ARCH, socket, args), EPERM, "{domain} {ty:#x} without a network");
        }
        const AF_UNIX_: u64 = 1;
        const AF_NETLINK: u64 = 16;
        const AF_PACKET: u64 = 17;
        const SOCK_DGRAM: u64 = 2;
        const SOCK_RAW: u64 = 3;
        for (domain, ty) in [
            (AF_NETLINK, SOCK_RAW),
            (AF_NETLINK, SOCK_DGRAM),
            (AF_PACKET, SOCK_RAW),
            (AF_UNIX_, SOCK_STREAM),
            (0, SOCK_STREAM),
            (AF_INET, SOCK_RAW),
            (AF_INET, SOCK_DGRAM),
            (AF_INET6, SOCK_DGRAM | CLOEXEC_NONBLOCK),
            (AF_INET6, SOCK_RAW),
            (45, SOCK_STREAM),
            (64, SOCK_STREAM),
            (0x8000_0002, SOCK_STREAM),
        ] {
            assert_eq!(run(&net, AUDIT_ARCH, socket, [domain, ty, 0, 0, 0, 0]), EPERM, "{domain} {ty:#x}");
        }
        assert_other_stream_protocols_refused(&net);
        assert_tcp_ulp_refused(&net);
        // The Unix pair stays as in the shell profile.
        assert_eq!(run(&net, AUDIT_ARCH, nr("socketpair"), [AF_UNIX_, 1, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&net, AUDIT_ARCH, nr("socketpair"), [AF_INET, 1, 0, 0, 0, 0]), EPERM);
    }

    /// setsockopt(IPPROTO_TCP, TCP_ULP) is refused (in any upper bits of the
    /// arguments' registers); TCP's other options and other levels pass.
    fn assert_tcp_ulp_refused(net: &[u8]) {
        let setsockopt = nr("setsockopt");
        for (level, opt) in [(IPPROTO_TCP, TCP_ULP), (0xffff_ffff_0000_0006, 0x1_0000_001f)] {
            assert_eq!(run(net, AUDIT_ARCH, setsockopt, [3, level, opt, 0, 0, 0]), EPERM, "{level:#x} {opt:#x}");
        }
        const TCP_NODELAY: u64 = 1;
        const SOL_SOCKET: u64 = 1;
        for (level, opt) in [(IPPROTO_TCP, TCP_NODELAY), (SOL_SOCKET, TCP_ULP), (IPPROTO_TCP, 30), (IPPROTO_TCP, 32)] {
            assert_eq!(run(net, AUDIT_ARCH, setsockopt, [3, level, opt, 0, 0, 0]), RET_ALLOW, "{level} {opt}");
        }
    }

    /// TCP's protocol numbers pass (0, IPPROTO_TCP); every other one of a
    /// stream socket is refused (MPTCP, SCTP, and each value up to 300).
    fn assert_other_stream_protocols_refused(net: &[u8]) {
        let socket = nr("socket");
        for domain in [AF_INET, AF_INET6] {
            for proto in [0, 6, 0xffff_ffff_0000_0006] {
                assert_eq!(run(net, AUDIT_ARCH, socket, [domain, SOCK_STREAM, proto, 0, 0, 0]), RET_ALLOW, "{proto}");
            }
            for proto in (1..300).filter(|p| *p != 6).chain([0x8000_0006, 0x1_0000_0106]) {
                assert_eq!(run(net, AUDIT_ARCH, socket, [domain, SOCK_STREAM, proto, 0, 0, 0]), EPERM, "{proto:#x}");
            }
        }
    }

    #[test]
    fn the_network_python_profile_allows_tcp_sockets_only_and_no_socket_pair() {
        let net = profile_program(Profile::PythonNet);
        let python = profile_program(Profile::Python);
        let socket = nr("socket");
        for domain in [AF_INET, AF_INET6] {
            let args = [domain, SOCK_STREAM, 0, 0, 0, 0];
            assert_eq!(run(&net, AUDIT_ARCH, socket, args), RET_ALLOW, "{domain}");
            // Baseline: the python tool without a network refuses it.
            assert_eq!(run(&python, AUDIT_ARCH, socket, args), EPERM, "{domain} without a network");
        }
        const AF_NETLINK: u64 = 16;
        const AF_PACKET: u64 = 17;
        for (domain, ty) in [(1, SOCK_STREAM), (AF_NETLINK, 3), (AF_PACKET, 3), (AF_INET, 2), (AF_INET6, 3), (64, 1)] {
            assert_eq!(run(&net, AUDIT_ARCH, socket, [domain, ty, 0, 0, 0, 0]), EPERM, "{domain} {ty}");
        }
        assert_other_stream_protocols_refused(&net);
        assert_tcp_ulp_refused(&net);
        // No socket pair at all, as in the python profile.
        assert_eq!(run(&net, AUDIT_ARCH, nr("socketpair"), [1, 1, 0, 0, 0, 0]), EPERM);
    }

    #[test]
    fn every_profile_keeps_the_lists_consistent() {
        for profile in Profile::ALL {
            let allowed: Vec<_> = allowlist_for(profile).iter().flat_map(|g| g.names).copied().collect();
            let unique: std::collections::HashSet<_> = allowed.iter().collect();
            assert_eq!(unique.len(), allowed.len(), "{profile:?}: a call listed twice");
            let rules = rules_for(profile);
            for rule in &rules {
                assert!(!rule.reason.is_empty());
                let allowed_too = allowed.contains(&rule.syscall);
                assert_eq!(allowed_too, rule.when != When::Always, "{profile:?}: {}", rule.syscall);
            }
        }
    }

    #[test]
    fn the_shell_filter_allows_unix_socket_pairs_and_no_other_socket() {
        const AF_INET: u64 = 2;
        const AF_INET6: u64 = 10;
        const AF_NETLINK: u64 = 16;
        const SOCK_STREAM: u64 = 1;
        let shell = profile_program(Profile::Shell);
        let python = profile_program(Profile::Python);
        let answer = |program: &[u8], name: &str, args: [u64; 6]| run(program, AUDIT_ARCH, nr(name), args);
        assert_eq!(answer(&shell, "socketpair", [AF_UNIX, SOCK_STREAM, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer(&python, "socketpair", [AF_UNIX, SOCK_STREAM, 0, 0, 0, 0]), EPERM);
        for program in [&shell, &python] {
            for domain in [AF_INET, AF_INET6, AF_NETLINK, 1 << 32 | AF_UNIX] {
                assert_eq!(answer(program, "socketpair", [domain, SOCK_STREAM, 0, 0, 0, 0]), EPERM, "{domain:#x}");
            }
            // No network without a proxy in the policy, and no Unix socket
            // to connect to a host one bound into a mount.
            for domain in [AF_UNIX, AF_INET, AF_INET6, AF_NETLINK] {
                assert_eq!(answer(program, "socket", [domain, SOCK_STREAM, 0, 0, 0, 0]), EPERM, "{domain}");
            }
        }
    }
}
