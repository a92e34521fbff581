//! The rollback point a call's begin frame names, checked: the copy must
//! be a child the interpreter made after the request, found through the
//! kernel's view of the process tree (`/proc`), never taken on the
//! frame's word.

/// What the begin frame of a call that asked for a rollback point is
/// checked against: the copy must be a child the interpreter made after
/// the request (a process of an earlier call that names itself in a
/// forged begin frame is not one).
pub(super) struct BeginCheck {
    pub(super) seq: u64,
    pub(super) interp: Option<i32>,
    pub(super) keeper: Option<i32>,
    pub(super) children_before: Vec<i32>,
    pub(super) asked_at: Option<u64>,
}

/// The frame that asks an idle interpreter for the next call's copy.
const POINT_FRAME: &[u8] = b"\0\0\0\x10{\"type\":\"point\"}";

impl super::Worker {
    /// Ask the idle interpreter, in a keeper layout, to make the next
    /// call's rollback point now, while the model thinks, so that the call
    /// finds it waiting. Its children are listed first: the copy the next
    /// begin frame names must be one it made after this (a process of an
    /// earlier call that names itself in a forged frame is not one). The
    /// frame is smaller than a pipe's atomic write; when the pipe has no
    /// room, nothing is asked and the call takes its point as before.
    /// Whether the frame was sent.
    pub(super) fn point_ahead(&mut self) -> bool {
        self.ahead = None;
        if !self.keeper || self.execs == 0 {
            return false;
        }
        let Some(interp) = self.interpreter() else { return false };
        let check = BeginCheck {
            seq: 0,
            interp: Some(interp),
            keeper: self.init_pid,
            children_before: children(interp),
            asked_at: boot_ticks(),
        };
        if self.requests.try_write(POINT_FRAME).is_ok_and(|n| n == POINT_FRAME.len()) {
            self.ahead = Some(check);
            return true;
        }
        false
    }
}

/// Why a call has no rollback point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoPoint {
    #[error("the begin frame named a process that is not this call's copy")]
    NotTheCopy,
    #[error("the interpreter's pid is not known")]
    NoInterpreter,
    /// The worker's own reason (threads running, a failed fork), as sent,
    /// on one bounded line (code can make the worker send anything).
    #[error("{0}")]
    Worker(String),
    #[error("none was taken")]
    NoneTaken,
    /// The call's result had come: its copy was released.
    #[error("it was released when the call's result came")]
    Released,
}

impl BeginCheck {
    /// The rollback point a begin frame names: the copy's host pid, or why
    /// there is none.
    pub(super) fn copy(&self, copy: Option<u32>, why: Option<String>) -> Result<i32, NoPoint> {
        match (copy, self.interp) {
            (Some(ns), Some(interp)) => this_calls_copy(interp, self.keeper, ns, &self.children_before, self.asked_at)
                .ok_or(NoPoint::NotTheCopy),
            (Some(_), None) => Err(NoPoint::NoInterpreter),
            (None, _) => Err(why.map_or(NoPoint::NoneTaken, |why| NoPoint::Worker(crate::frame::quoted(&why)))),
        }
    }
}

/// The host pid of the process that is `ns_pid` in the sandbox, if it is
/// a child `interp` made since `before` was listed. An interpreter that
/// ended at once (its code's first act) has left its copy to PID 1
/// (`keeper`): then a child of PID 1 started since `asked_at` (clock ticks
/// since boot, the kernel's start-time unit) counts.
pub(super) fn this_calls_copy(
    interp: i32,
    keeper: Option<i32>,
    ns_pid: u32,
    before: &[i32],
    asked_at: Option<u64>,
) -> Option<i32> {
    let named = |c: &i32| !before.contains(c) && ns_pid_of(*c) == Some(ns_pid);
    if let Some(copy) = children(interp).into_iter().find(named) {
        return Some(copy);
    }
    let (keeper, asked_at) = (keeper?, asked_at?);
    if !crate::spawn::exited(interp) {
        return None;
    }
    children(keeper).into_iter().find(|c| named(c) && start_ticks(*c).is_some_and(|t| t >= asked_at))
}

/// Now, in clock ticks since boot (the unit of a process's start time).
pub(super) fn boot_ticks() -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into memory we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    Some(ts.tv_sec as u64 * hz + ts.tv_nsec as u64 * hz / 1_000_000_000)
}

/// When host process `pid` started, in clock ticks since boot.
pub(super) fn start_ticks(pid: i32) -> Option<u64> {
    let stat = String::from_utf8(crate::spawn::read_proc(&format!("/proc/{pid}/stat")).ok()?).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The pid of host process `pid` in its own (innermost) pid namespace.
pub(super) fn ns_pid_of(pid: i32) -> Option<u32> {
    let status = String::from_utf8(crate::spawn::read_proc(&format!("/proc/{pid}/status")).ok()?).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The children of `pid` (host pids).
pub(super) fn children(pid: i32) -> Vec<i32> {
    crate::spawn::read_proc(&format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .map(|text| text.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}
