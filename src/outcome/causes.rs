//! The causes of an ended call or sandbox, in words: how a sandbox or a
//! process ended, why the interpreter was last discarded, why a start
//! failed, why an execution was interrupted (with what the memory cap
//! did), and what a failed call whose sandbox was kept recovered.

use super::*;
use crate::protected::HostKill;

/// How a sandbox ended, in words.
pub fn exit_text(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "did not exit within the cleanup deadline".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) if code > 128 => {
                let sig = nix::sys::signal::Signal::try_from(code - 128).map(|s| s.as_str()).unwrap_or("?");
                format!("was killed by signal {} ({sig})", code - 128)
            }
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => {
                let name = nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str()).unwrap_or("?");
                format!("was killed by signal {sig} ({name})")
            }
            (None, None) => "ended".into(),
        },
    }
}

/// How a process ended, from its own wait status (no shell's 128 + n).
pub fn death_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str()).unwrap_or("?");
            let core = if status.core_dumped() { ", core dumped" } else { "" };
            format!("was killed by signal {sig} ({name}{core})")
        }
        (None, None) => "ended".into(),
    }
}

/// Why the interpreter's state was discarded between two calls: the next
/// call that runs says so (its `lost_before`), in these words only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discarded {
    /// A host secret appeared in a read root (it is not masked in the running sandbox).
    HostSecret(std::path::PathBuf),
    /// The host killed the idle sandbox itself (a limit, a watch), and why.
    Killed(HostKill),
    /// The interpreter died while idle (its sandbox stays); the memory cap's note.
    DiedIdle { oom: Option<String> },
    /// The whole sandbox ended while idle, how; the memory cap's note.
    SandboxDied { exit: Option<std::process::ExitStatus>, oom: Option<String> },
    /// A project secret appeared: the sandbox was restarted to mask it (what appeared).
    NewSecret(String),
    /// The mode or the read roots changed (the default wording, or the caller's).
    Remounted(String),
    /// A grant could not reach the running sandbox: the restart's reason, and why not.
    NotLive { reason: String, why: String },
    /// The call run again after a grant could not return to its state before the call.
    NoReturn(String),
}

impl std::fmt::Display for Discarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let oom = |oom: &Option<String>| oom.as_ref().map(|n| format!(" ({n})")).unwrap_or_default();
        match self {
            Discarded::HostSecret(path) => write!(
                f,
                "the sandbox was restarted because a host secret appeared in a read root ({})",
                crate::display::one_line(path)
            ),
            Discarded::Killed(why) => write!(f, "the sandbox was killed between executions: {why}"),
            Discarded::DiedIdle { oom: note } => write!(f, "the interpreter died while idle{}", oom(note)),
            Discarded::SandboxDied { exit, oom: note } => {
                write!(f, "the interpreter died while idle: the sandbox {}{}", exit_text(*exit), oom(note))
            }
            Discarded::NewSecret(why) => write!(f, "the sandbox was restarted to mask a new secret: {why}"),
            Discarded::Remounted(reason) => f.write_str(reason),
            Discarded::NotLive { reason, why } => write!(f, "{reason}: the grant could not reach it ({why})"),
            Discarded::NoReturn(why) => write!(
                f,
                "the sandbox was restarted because the call could not run again on its state before the call ({why})"
            ),
        }
    }
}

/// What the host killed a call's sandbox (or interpreter) for. The
/// addon hands it to JavaScript as the string union `KilledFor`; the
/// result's text says the same in words.
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KilledFor {
    /// The call's deadline passed.
    Timeout,
    /// The call was aborted (pi's abort signal).
    Abort,
    /// The session was disposed.
    Dispose,
    /// The permission mode or the read roots changed.
    Remount,
    /// The output passed its per-call bound.
    OutputLimit,
    /// The sandbox's memory cap was reached: the kernel's OOM killer ended the interpreter.
    Memory,
    /// The sandbox broke the protocol (a bad frame, or one while no execution ran).
    Violation,
    /// The project's protections could not be kept (the guard).
    Breach,
    /// The host's budget for the sandbox's changes was spent.
    Budget,
    /// A host secret appeared in a read root.
    HostSecret,
    /// A project secret appeared.
    NewSecret,
}

impl From<&HostKill> for KilledFor {
    fn from(k: &HostKill) -> Self {
        match k {
            HostKill::Breach(_) => KilledFor::Breach,
            HostKill::Budget(_) => KilledFor::Budget,
            HostKill::HostSecret(_) => KilledFor::HostSecret,
            HostKill::NewSecret(_) => KilledFor::NewSecret,
            HostKill::StrayFrame => KilledFor::Violation,
        }
    }
}

impl From<Halt> for KilledFor {
    fn from(h: Halt) -> Self {
        match h {
            Halt::Cancelled => KilledFor::Abort,
            Halt::Disposed => KilledFor::Dispose,
            Halt::Remounted => KilledFor::Remount,
        }
    }
}

/// What an interrupted call's kill was for: the memory cap that ended the
/// interpreter, else what the host stopped the sandbox for itself, else
/// the interruption. None where nothing killed it (the interpreter died
/// on its own).
pub fn killed_for(i: &Interrupt, host: Option<&HostKill>, oom: Option<&OomKill>) -> Option<KilledFor> {
    if let Some(OomKill::Interpreter(_)) = oom {
        return Some(KilledFor::Memory);
    }
    if let Some(k) = host {
        return Some(k.into());
    }
    match i {
        Interrupt::Timeout => Some(KilledFor::Timeout),
        Interrupt::Halted(h) => Some((*h).into()),
        Interrupt::OutputLimit => Some(KilledFor::OutputLimit),
        Interrupt::Violation(_) => Some(KilledFor::Violation),
        Interrupt::Died => None,
    }
}

/// Why a sandbox did not start. The addon hands it to JavaScript as the
/// string union `StartFailure`; the result's text says it in words, with
/// what to do.
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// bubblewrap (bwrap) is not installed where the sandbox looks for it.
    BwrapMissing,
    /// bubblewrap could not make the sandbox's user namespace (the kernel or a container refused it).
    UserNamespaces,
    /// Anything else (a setting, a missing interpreter, a mount bubblewrap refused, ...).
    Other,
}

/// Why the start `e` failed; None for a start that was stopped (cancel,
/// dispose, mode change), which is not a failure.
pub fn start_failure_of(e: &StartError) -> Option<StartFailure> {
    match e {
        StartError::Halted(_) => None,
        StartError::Spawn(e) if e.kind() == std::io::ErrorKind::NotFound => Some(StartFailure::BwrapMissing),
        StartError::NotReady { stderr, .. } if crate::probe::namespace_hint(stderr).is_some() => {
            Some(StartFailure::UserNamespaces)
        }
        _ => Some(StartFailure::Other),
    }
}

/// Why the session's interpreter was last discarded, or the last failed
/// call rolled back (`status` shows both). The addon hands it to
/// JavaScript as the string union `ResetReason` (`lastResetReason`); the
/// `status` text words each one once.
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// The caller reset the session (`reset()`).
    ExplicitReset,
    /// A sandbox start failed.
    StartupFailure,
    /// The permission mode or the read roots changed between calls.
    MountsChanged,
    /// The interpreter died or broke the protocol during a call.
    WorkerError,
    /// The interpreter died between calls.
    WorkerDiedIdle,
    /// A call passed its deadline.
    Timeout,
    /// A call was cancelled.
    Cancelled,
    /// A call's output passed its per-call bound.
    OutputLimit,
    /// The permission mode or the read roots changed while a call ran.
    Remounted,
    /// The session was disposed.
    Disposed,
}

impl From<&Interrupt> for ResetReason {
    fn from(i: &Interrupt) -> Self {
        match i {
            Interrupt::Timeout => ResetReason::Timeout,
            Interrupt::Halted(Halt::Cancelled) => ResetReason::Cancelled,
            Interrupt::Halted(Halt::Disposed) => ResetReason::Disposed,
            Interrupt::Halted(Halt::Remounted) => ResetReason::Remounted,
            Interrupt::OutputLimit => ResetReason::OutputLimit,
            Interrupt::Died | Interrupt::Violation(_) => ResetReason::WorkerError,
        }
    }
}

/// A failed sandbox start, as a status and the text the model reads.
pub fn start_failure(e: &StartError) -> (Status, String) {
    match e {
        StartError::Halted(_) => {
            (Status::Cancelled, "Cancelled while the sandbox was starting; it was killed before any code ran.".into())
        }
        StartError::Settings(why) => (Status::Unavailable, why.to_string()),
        StartError::Prepare(why) => (Status::WorkerError, why.clone()),
        StartError::Spawn(e) => (Status::WorkerError, format!("bubblewrap could not be started: {e}")),
        StartError::NotReady { why, stderr } => {
            let why = match why {
                NotReady::Exited(status) => format!("the sandbox {}", exit_text(*status)),
                other => other.to_string(),
            };
            let mut msg = format!("The sandbox did not start: {why}.");
            if !stderr.is_empty() {
                let _ = write!(msg, "\nIts error output: {stderr}");
            }
            // bubblewrap could not make the namespaces: the host cannot run the tool (as `status`
            // says), whatever the worker would have done.
            let namespaces = start_failure_of(e) == Some(StartFailure::UserNamespaces);
            if let Some(hint) = crate::probe::namespace_hint(stderr) {
                msg.push('\n');
                msg.push_str(hint);
            }
            msg.push_str(" The python tool never runs Python outside the sandbox.");
            (if namespaces { Status::Unavailable } else { Status::WorkerError }, msg)
        }
    }
}

/// Why an execution was interrupted: its status, the short reason that
/// `status` keeps as the last reset, and the diagnostic the model reads.
/// `killed_for` is why the host killed the sandbox itself (a breach, a
/// stray frame), `exit` how it ended.
pub fn interruption(
    i: &Interrupt,
    timeout_seconds: u32,
    killed_for: Option<&HostKill>,
    exit: Option<std::process::ExitStatus>,
) -> (Status, String, String) {
    let never = "Code is never replayed automatically.";
    match i {
        Interrupt::Timeout => (
            Status::Timeout,
            "timeout".into(),
            format!("Execution exceeded the {timeout_seconds}s deadline; the sandbox was killed."),
        ),
        Interrupt::Halted(Halt::Cancelled) => {
            (Status::Cancelled, "cancelled".into(), "Execution was cancelled; the sandbox was killed.".into())
        }
        Interrupt::Halted(Halt::Disposed) => (
            Status::Cancelled,
            "session disposed".into(),
            "The session was disposed while the code ran; the sandbox was killed.".into(),
        ),
        Interrupt::Halted(Halt::Remounted) => (
            Status::WorkerError,
            "permission mode or read roots changed".into(),
            "The permission mode or read roots changed while the code ran; the sandbox was killed and the next \
             execution starts with the new mounts."
                .into(),
        ),
        Interrupt::OutputLimit => (
            Status::OutputLimit,
            "output_limit".into(),
            format!(
                "Output exceeded the {} KiB per-execution capture budget; the sandbox was killed. The saved log is partial.",
                OUTPUT_BUDGET_BYTES / 1024
            ),
        ),
        Interrupt::Died => match killed_for {
            Some(why) => (Status::WorkerError, why.to_string(), format!("The sandbox was killed: {why}. {never}")),
            None => (
                Status::WorkerError,
                "worker_error".into(),
                format!("The worker died: the sandbox {}. {never}", exit_text(exit)),
            ),
        },
        Interrupt::Violation(m) => {
            (Status::WorkerError, "worker_error".into(), format!("Protocol violation: {m}. The sandbox was killed."))
        }
    }
}

/// What the sandbox's memory cap did during a failed call (the text is
/// `contain::Contained::oom_note`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OomKill {
    /// The OOM killer ended the interpreter: the call's cause, also when
    /// it was noticed only at the deadline (processes the interpreter
    /// started hold its pipe).
    Interpreter(String),
    /// It ended processes the code started, not the interpreter.
    Others(String),
}

/// [`interruption`]'s reason and diagnostic with what the memory cap did:
/// an OOM kill of the interpreter is the reason, another is a sentence.
pub fn with_oom(reason: String, diagnostic: String, oom: Option<&OomKill>) -> (String, String) {
    match oom {
        Some(OomKill::Interpreter(oom)) => (oom.clone(), format!("{oom}. {diagnostic}")),
        Some(OomKill::Others(oom)) => (reason, format!("{diagnostic}\n{oom}.")),
        None => (reason, diagnostic),
    }
}

/// A failed call whose sandbox was kept (see [`Recovery`]).
pub struct Recovered {
    pub status: Status,
    /// What happened (the state is [`Recovered::state`]'s to say).
    pub diagnostic: String,
    pub state: StateFate,
    /// What ended the interpreter, where the state was lost.
    pub ended_by: Option<String>,
}

/// The words for a failed call whose interpreter was rolled back or
/// replaced in the same sandbox: the one table of the rollback cases.
/// `oom` is what the sandbox's memory cap did during the call.
/// `death` is how the interpreter ended, where PID 1 recorded it.
pub fn recovered_text(
    i: &Interrupt,
    timeout_seconds: u32,
    recovery: &Recovery,
    oom: Option<&OomKill>,
    death: Option<std::process::ExitStatus>,
) -> Recovered {
    let (status, reason, _) = interruption(i, timeout_seconds, None, None);
    let (reason, died_of, also) = match oom {
        Some(OomKill::Interpreter(oom)) => (oom.clone(), format!(" ({oom})"), String::new()),
        Some(OomKill::Others(oom)) => (reason, String::new(), format!(" Also, {oom}.")),
        None => (reason, String::new(), String::new()),
    };
    let what = match i {
        Interrupt::Timeout => format!("Execution exceeded the {timeout_seconds}s deadline{died_of}"),
        Interrupt::Halted(_) => format!("Execution was cancelled{died_of}"),
        Interrupt::OutputLimit => format!(
            "Output exceeded the {} KiB per-execution capture budget (the saved log is partial){died_of}",
            OUTPUT_BUDGET_BYTES / 1024
        ),
        Interrupt::Died => match death.filter(|_| died_of.is_empty()) {
            Some(status) => format!("The interpreter {}", death_text(status)),
            None => format!("The interpreter died{died_of}"),
        },
        Interrupt::Violation(m) => format!("Protocol violation: {m}{died_of}"),
    };
    let diagnostic = format!("{what}; every process of the sandbox was killed.{also}");
    let (state, ended_by) = match recovery {
        Recovery::Restored => (StateFate::RolledBack { fresh: false }, None),
        Recovery::Fresh => (StateFate::RolledBack { fresh: true }, None),
        Recovery::Lost(why) => (StateFate::Lost(Loss::NoPoint(why.clone())), Some(reason)),
        Recovery::Reset => (StateFate::Lost(Loss::Stopped), Some(reason)),
    };
    Recovered { status, diagnostic, state, ended_by }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interruption_has_its_status_and_says_the_sandbox_was_killed() {
        let cases = [
            (Interrupt::Timeout, Status::Timeout),
            (Interrupt::Halted(Halt::Cancelled), Status::Cancelled),
            (Interrupt::Halted(Halt::Disposed), Status::Cancelled),
            (Interrupt::Halted(Halt::Remounted), Status::WorkerError),
            (Interrupt::OutputLimit, Status::OutputLimit),
            (Interrupt::Violation("x".into()), Status::WorkerError),
        ];
        for (i, want) in cases {
            let (status, reason, text) = interruption(&i, 7, None, None);
            assert_eq!(status, want, "{i:?}");
            assert!(!reason.is_empty());
            assert!(text.contains("killed"), "{i:?}: {text}");
        }
        let (_, reason, text) = interruption(&Interrupt::Died, 7, Some(&HostKill::StrayFrame), None);
        assert_eq!(reason, "it sent a protocol frame while no execution ran");
        assert!(text.starts_with("The sandbox was killed: it sent a protocol frame while no execution ran."));
        let (_, reason, text) = interruption(&Interrupt::Died, 7, None, None);
        assert_eq!(reason, "worker_error");
        assert!(text.contains("did not exit within the cleanup deadline"));
    }

    #[test]
    fn a_kill_is_for_the_memory_cap_then_the_host_then_the_interruption() {
        let oom = OomKill::Interpreter("out of memory".into());
        let others = OomKill::Others("out of memory".into());
        let breach = HostKill::Breach("x".into());
        let cases = [
            (Interrupt::Timeout, None, None, Some(KilledFor::Timeout)),
            (Interrupt::Halted(Halt::Cancelled), None, None, Some(KilledFor::Abort)),
            (Interrupt::Halted(Halt::Disposed), None, None, Some(KilledFor::Dispose)),
            (Interrupt::Halted(Halt::Remounted), None, None, Some(KilledFor::Remount)),
            (Interrupt::OutputLimit, None, None, Some(KilledFor::OutputLimit)),
            (Interrupt::Violation("bad".into()), None, None, Some(KilledFor::Violation)),
            (Interrupt::Died, None, None, None),
            (Interrupt::Died, Some(&oom), None, Some(KilledFor::Memory)),
            (Interrupt::Timeout, Some(&oom), None, Some(KilledFor::Memory)),
            (Interrupt::Timeout, Some(&others), None, Some(KilledFor::Timeout)),
            (Interrupt::Died, None, Some(&breach), Some(KilledFor::Breach)),
            (Interrupt::Died, None, Some(&HostKill::Budget("b".into())), Some(KilledFor::Budget)),
            (Interrupt::Died, None, Some(&HostKill::HostSecret("/h/.ssh".into())), Some(KilledFor::HostSecret)),
            (Interrupt::Died, None, Some(&HostKill::NewSecret("s".into())), Some(KilledFor::NewSecret)),
            (Interrupt::Died, None, Some(&HostKill::StrayFrame), Some(KilledFor::Violation)),
        ];
        for (i, oom, host, want) in cases {
            assert_eq!(killed_for(&i, host, oom), want, "{i:?} {oom:?} {host:?}");
        }
    }

    #[test]
    fn a_start_failure_is_bubblewrap_missing_user_namespaces_or_other() {
        let missing = StartError::Spawn(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(start_failure_of(&missing), Some(StartFailure::BwrapMissing));
        let refused = StartError::NotReady {
            why: NotReady::Exited(None),
            stderr: "bwrap: No permissions to create new namespace".into(),
        };
        assert_eq!(start_failure_of(&refused), Some(StartFailure::UserNamespaces));
        let mount = StartError::NotReady { why: NotReady::Exited(None), stderr: "bwrap: Can't mount tmpfs".into() };
        assert_eq!(start_failure_of(&mount), Some(StartFailure::Other));
        assert_eq!(start_failure_of(&StartError::Halted(Halt::Cancelled)), None);
    }

    #[test]
    fn a_start_failure_for_user_namespaces_is_unavailable_with_the_cause() {
        let e = StartError::NotReady {
            why: NotReady::Exited(None),
            stderr: "bwrap: setting up uid map: Operation not permitted".into(),
        };
        let (status, text) = start_failure(&e);
        assert_eq!(status, Status::Unavailable);
        assert!(text.starts_with("The sandbox did not start: the sandbox did not exit"));
        assert!(text.contains("unprivileged user namespaces"));
        assert!(text.ends_with("never runs Python outside the sandbox."));
        assert_eq!(start_failure(&StartError::Halted(Halt::Disposed)).0, Status::Cancelled);
        // Any other refusal of bubblewrap's is the worker's error.
        let other = StartError::NotReady {
            why: NotReady::Exited(None),
            stderr: "bwrap: Can't mount tmpfs on /newroot/workspace: No such file or directory".into(),
        };
        assert_eq!(start_failure(&other).0, Status::WorkerError);
    }

    #[test]
    fn a_death_under_rollback_names_its_exit_code_or_signal() {
        use std::os::unix::process::ExitStatusExt;
        let exited = std::process::ExitStatus::from_raw(3 << 8);
        let r = recovered_text(&Interrupt::Died, 3, &Recovery::Restored, None, Some(exited));
        assert!(r.diagnostic.starts_with("The interpreter exited with code 3; every process"), "{}", r.diagnostic);
        let segv = std::process::ExitStatus::from_raw(11);
        let r = recovered_text(&Interrupt::Died, 3, &Recovery::Restored, None, Some(segv));
        assert!(r.diagnostic.starts_with("The interpreter was killed by signal 11 (SIGSEGV);"), "{}", r.diagnostic);
        assert_eq!(
            death_text(std::process::ExitStatus::from_raw(0x80 | 6)),
            "was killed by signal 6 (SIGABRT, core dumped)"
        );
        // An exit code above 128 is a code, not a signal: the status is the process's own.
        assert_eq!(death_text(std::process::ExitStatus::from_raw(139 << 8)), "exited with code 139");
        // Unrecorded: the words of old.
        let r = recovered_text(&Interrupt::Died, 3, &Recovery::Restored, None, None);
        assert!(r.diagnostic.starts_with("The interpreter died; every process"), "{}", r.diagnostic);
    }

    #[test]
    fn an_oom_kill_is_the_cause_of_a_death_and_a_sentence_otherwise() {
        let oom = "out of memory: the kernel's OOM killer ended the interpreter: the sandbox's memory cap of 64 MiB \
                   (cgroup-v1 memory) was reached";
        let ended = OomKill::Interpreter(oom.into());
        let died = recovered_text(&Interrupt::Died, 3, &Recovery::Restored, Some(&ended), None);
        assert_eq!(died.state, StateFate::RolledBack { fresh: false });
        let every = format!("The interpreter died ({oom}); every process");
        assert!(died.diagnostic.starts_with(&every), "{}", died.diagnostic);
        let gone = Recovery::Lost("no rollback point had been taken".into());
        let lost = recovered_text(&Interrupt::Died, 3, &gone, Some(&ended), None);
        let o = Outcome {
            state: lost.state,
            ended_by: lost.ended_by,
            ..Outcome::static_result(lost.status, 1, String::new())
        };
        assert_eq!(o.state_lost_reason(), Some(format!("{oom}; no rollback point had been taken")));
        let child = "out of memory: the cap was reached; the kernel's OOM killer ended 1 process(es) the code started";
        let others = OomKill::Others(child.into());
        let timeout = recovered_text(&Interrupt::Timeout, 3, &Recovery::Fresh, Some(&others), None);
        assert!(timeout.diagnostic.starts_with("Execution exceeded the 3s deadline;"), "{}", timeout.diagnostic);
        assert!(timeout.diagnostic.ends_with(&format!(" Also, {child}.")), "{}", timeout.diagnostic);
        // Processes it started held the pipe: the death shows at the deadline.
        let late = recovered_text(&Interrupt::Timeout, 3, &Recovery::Restored, Some(&ended), None);
        let deadline = format!("Execution exceeded the 3s deadline ({oom}); ");
        assert!(late.diagnostic.starts_with(&deadline), "{}", late.diagnostic);
        let (reason, diagnostic) = with_oom("worker_error".into(), "The worker died.".into(), Some(&ended));
        assert_eq!((reason.as_str(), diagnostic), (oom, format!("{oom}. The worker died.")));
        let (reason, diagnostic) = with_oom("timeout".into(), "Execution exceeded.".into(), Some(&others));
        assert_eq!((reason.as_str(), diagnostic), ("timeout", format!("Execution exceeded.\n{child}.")));
    }
}
