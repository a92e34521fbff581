//! Rollback and fresh interpreters in the same sandbox (a keeper layout:
//! the worker runs as PID 1, see the worker's comments): replacing a
//! failed call's interpreter with its rollback point, or with a fresh one
//! from PID 1, and taking the new interpreter's channels; and the
//! host-secret watch of a read root granted live (the grant's call runs
//! again from its rollback point).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use super::begin::BeginCheck;
use super::{children, drain_now, read_replies, Worker};
use crate::capture::{Capture, Stream};
use crate::frame::{self, Reply, Request};
use crate::spawn::{signal_pid, take_fds};

/// How a failed call's interpreter was replaced in the same sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The copy taken right before the call carries on.
    Restored,
    /// The call was the interpreter's first: a fresh one is where it was.
    Fresh,
    /// No rollback point existed (or it was lost): a fresh interpreter,
    /// with empty temporary file systems, as after the spec's kill.
    Lost(String),
    /// An explicit reset.
    Reset,
}

/// Why a call cannot run again from its state before the call (the
/// caller then restarts the sandbox).
#[derive(Debug, thiserror::Error)]
pub enum NoReturn {
    #[error("rollback is off (PI_PYTHON_TOOL_ROLLBACK=0)")]
    RollbackOff,
    #[error("the rollback point was gone (killed from inside the sandbox)")]
    Gone,
    #[error("there was no rollback point: {0}")]
    NoPoint(super::begin::NoPoint),
    #[error("no rollback point had been taken")]
    NotTaken,
    #[error("the interpreter was replaced instead of returned to its state before the call")]
    Replaced,
    #[error("the interpreter could not be returned to its state before the call: {0}")]
    Failed(RecoverError),
}

/// Why the sandbox could not be kept (the caller then kills it).
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("this sandbox has no keeper (PI_PYTHON_TOOL_ROLLBACK is off)")]
    NoKeeper,
    #[error("the sandbox's PID 1 is gone")]
    KeeperGone,
    #[error("the new interpreter did not appear within {0} ms")]
    NoInterpreter(u128),
    #[error("the new interpreter's channels could not be taken: {0}")]
    Channels(std::io::Error),
    #[error("the new interpreter did not report within {0} ms")]
    Silent(u128),
    #[error("the new interpreter answered with {0}")]
    Unexpected(String),
    #[error("{0} other processes were still running after the kill")]
    Survivors(usize),
}

impl Worker {
    /// Watch read roots granted live for host secrets that appear in
    /// them, as the start watches its own (see `watches`).
    pub fn watch_granted(&mut self, points: Vec<crate::hostsecrets::WatchPoint>) {
        if !points.is_empty() {
            let (killed_for, secret) = (self.killed_for.clone(), self.secret_appeared.clone());
            self._watches.join(crate::watches::granted(self.pid, points, killed_for, secret));
        }
    }

    /// Whether the interpreter (not the sandbox) has ended: in a keeper
    /// layout the sandbox outlives it.
    pub fn interpreter_gone(&mut self) -> bool {
        if !self.keeper {
            // The interpreter is the sandbox's PID 1: gone as soon as its
            // exit begins, before bubblewrap exits after it.
            return self.exited().is_some() || self.init_pid.is_some_and(crate::spawn::exiting);
        }
        // Not found: not known to be gone (the call itself will tell).
        self.interpreter().is_some_and(crate::spawn::exiting)
    }

    /// The interpreter's host pid in a keeper layout: PID 1's only child
    /// until the first execution has run.
    pub(super) fn interpreter(&mut self) -> Option<i32> {
        if self.interp.is_none() {
            let keeper = self.init_pid?;
            self.interp = children(keeper).into_iter().next();
            self.interp_ns = self.interp.and_then(super::begin::ns_pid_of);
        }
        self.interp
    }

    /// How the interpreter that just died ended (an exit code or a
    /// signal), from PID 1's record of deaths (see the worker's
    /// DEATHS_FD); None outside a keeper layout, or when PID 1 did not
    /// record it within a moment (it reaps on SIGCHLD, right after the
    /// death the host noticed).
    pub async fn interpreter_death(&mut self) -> Option<std::process::ExitStatus> {
        let (true, Some(keeper), Some(ns)) = (self.keeper, self.init_pid, self.interp_ns) else {
            return None;
        };
        let [fd] = take_fds(keeper, [DEATHS_FD]).ok()?;
        let until = Instant::now() + DEATH_RECORD_WAIT;
        loop {
            if let Some(status) = read_deaths(&fd, ns) {
                return Some(status);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Return to the state before the last call, which a refused read
    /// ended (its copy waits): the copy carries on as the interpreter, or,
    /// after an interpreter's first call, a fresh one. `Err` says why
    /// there is no such point (the caller then restarts the sandbox).
    pub async fn restore_point(&mut self) -> Result<Recovery, NoReturn> {
        if !self.keeper {
            return Err(NoReturn::RollbackOff);
        }
        match &self.point {
            Some(Ok(pid)) if !crate::spawn::exited(*pid) => {}
            Some(Ok(_)) => return Err(NoReturn::Gone),
            Some(Err(why)) => return Err(NoReturn::NoPoint(why.clone())),
            None if self.execs <= 1 => {}
            None => return Err(NoReturn::NotTaken),
        }
        match self.recover(None, false).await {
            Ok(r @ (Recovery::Restored | Recovery::Fresh)) => Ok(r),
            Ok(_) => Err(NoReturn::Replaced),
            Err(e) => Err(NoReturn::Failed(e)),
        }
    }

    /// Replace a failed call's interpreter in the same sandbox: with its
    /// rollback point when there is one (`reset` false), else with a fresh
    /// interpreter from PID 1. Every other process of the sandbox is
    /// killed first; what was written to the old streams goes to `capture`.
    pub async fn recover(&mut self, capture: Option<&mut Capture>, reset: bool) -> Result<Recovery, RecoverError> {
        let keeper = match (self.keeper, self.init_pid) {
            (false, _) => return Err(RecoverError::NoKeeper),
            (true, None) => return Err(RecoverError::KeeperGone),
            (true, Some(k)) => k,
        };
        // The call failed before its begin frame was read (its output
        // came first): the frame may still be on its way.
        if self.point.is_none() && !reset {
            if let Some(check) = self.begin_check.take() {
                let late = timeout(Duration::from_millis(100), async {
                    loop {
                        match self.replies.recv().await {
                            Some(Ok(Reply::Begin { id, copy, why })) if id == check.seq => return Some((copy, why)),
                            Some(Ok(_)) => continue,
                            _ => return None,
                        }
                    }
                })
                .await;
                if let Ok(Some((copy, why))) = late {
                    self.point = Some(check.copy(copy, why));
                }
            }
        }
        // A copy asked for ahead is killed with the rest (not the point).
        self.ahead = None;
        let began = Instant::now();
        // The old channels: their reader must not act on what is left in
        // them, and nothing more is sent there.
        self.expecting.store(true, Ordering::Release);
        self.reader.abort();
        let point = self.point.take();
        let first = self.execs <= 1 && point.is_none();
        // The copy this call's begin frame named (checked then), while it
        // is still there.
        let copy = match (&point, reset) {
            (Some(Ok(pid)), false) => Some(*pid).filter(|&p| !crate::spawn::exited(p)),
            _ => None,
        };
        let before = children(keeper);
        let (recovery, target) = match copy {
            Some(pid) => {
                // It may have been stopped; only the host's signal counts
                // (it is born with every signal held, so none ends it).
                signal_pid(pid, libc::SIGCONT);
                signal_pid(pid, libc::SIGUSR1);
                (Recovery::Restored, Some(pid))
            }
            None => {
                let recovery = if reset {
                    Recovery::Reset
                } else if first {
                    Recovery::Fresh
                } else {
                    Recovery::Lost(match point {
                        Some(Err(why)) => format!("there was no rollback point: {why}"),
                        Some(Ok(_)) => "the rollback point was gone (killed from inside the sandbox)".into(),
                        None => "no rollback point had been taken".into(),
                    })
                };
                let clean_tmp = !matches!(recovery, Recovery::Fresh);
                if !signal_pid(keeper, if clean_tmp { libc::SIGUSR2 } else { libc::SIGUSR1 }) {
                    return Err(RecoverError::KeeperGone);
                }
                (recovery, None)
            }
        };
        // bubblewrap holds the old streams open as long as the sandbox
        // runs: what the killed processes wrote is read once they are gone.
        let old = (self.stdout.take(), self.stderr.take());
        let until = began + RESTORE_DEADLINE;
        let ms = RESTORE_DEADLINE.as_millis();
        let pid = tokio::task::spawn_blocking(move || await_channels(keeper, target, &before, until))
            .await
            .ok()
            .flatten()
            .ok_or(RecoverError::NoInterpreter(ms))?;
        let [req, rep, out, err] = take_fds(pid, CHANNEL_FDS).map_err(RecoverError::Channels)?;
        let requests = pipe::Sender::from_owned_fd(req).map_err(RecoverError::Channels)?;
        let replies = pipe::Receiver::from_owned_fd(rep).map_err(RecoverError::Channels)?;
        self.stdout = Some(pipe::Receiver::from_owned_fd(out).map_err(RecoverError::Channels)?);
        self.stderr = Some(pipe::Receiver::from_owned_fd(err).map_err(RecoverError::Channels)?);
        let (tx, rx) = mpsc::channel(2);
        self.expecting = Arc::new(AtomicBool::new(true));
        self.reader =
            tokio::spawn(read_replies(replies, tx, self.expecting.clone(), self.killed_for.clone(), self.pid));
        self.replies = rx;
        self.requests = requests;
        // A restored copy of a call that took a point makes the next
        // call's point before it answers, off that call's path (a model
        // that answers the failed call's result at once would wait for
        // the fork). Its children are listed first, as for `point_ahead`.
        let ahead = (matches!(recovery, Recovery::Restored) && self.execs > 0).then(|| BeginCheck {
            seq: 0,
            interp: Some(pid),
            keeper: Some(keeper),
            children_before: children(pid),
            asked_at: super::begin::boot_ticks(),
        });
        // Frames that something left in the new channels before the host
        // took them do not pass: the answer must echo this.
        let nonce = format!("{:016x}", crate::random::random_u64());
        let resume = frame::encode(&Request::Resume { nonce: nonce.clone(), point: ahead.is_some() })
            .map_err(|e| RecoverError::Unexpected(e.to_string()))?;
        let reply = timeout(until.saturating_duration_since(Instant::now()), async {
            self.requests.write_all(&resume).await.ok()?;
            self.replies.recv().await
        })
        .await
        .map_err(|_| RecoverError::Silent(ms))?;
        match reply {
            Some(Ok(Reply::Restored { streams, nonce: Some(echo), .. })) if echo == nonce => {
                self.streams_ready = streams
            }
            Some(Ok(other)) => return Err(RecoverError::Unexpected(format!("a {} frame", other.kind()))),
            Some(Err(e)) => return Err(RecoverError::Unexpected(e.to_string())),
            None => return Err(RecoverError::Silent(ms)),
        }
        self.expecting.store(false, Ordering::Release);
        if let Some(capture) = capture {
            for (stream, which) in [(old.0, Stream::Stdout), (old.1, Stream::Stderr)] {
                if let Some(stream) = stream {
                    drain_now(&stream, capture, which, &mut self.out_buf);
                }
                capture.finish(which);
            }
        }
        // The copy checked that it is alone with PID 1; so does the host.
        let others = children(keeper).into_iter().filter(|&c| c != pid && !crate::spawn::exited(c)).count();
        if others > 0 {
            return Err(RecoverError::Survivors(others));
        }
        self.interp = Some(pid);
        self.interp_ns = super::begin::ns_pid_of(pid);
        if !matches!(recovery, Recovery::Restored) {
            self.execs = 0;
        }
        if ahead.is_some() {
            self.ahead = ahead;
        } else {
            self.point_ahead();
        }
        tracing::debug!(sandbox = self.pid, interpreter = pid, ?recovery, "interpreter replaced");
        Ok(recovery)
    }
}

/// Where PID 1 keeps the read end of its record of deaths.
const DEATHS_FD: i32 = 18;

/// How long PID 1 may take to record a death the host noticed.
const DEATH_RECORD_WAIT: Duration = Duration::from_millis(200);

/// The last record for sandbox pid `ns` among those waiting in `fd` (a
/// non-blocking pipe of 8-byte records: pid, wait status), as a wait
/// status. Reads at most 64 KiB: PID 1 is the only writer, and it drops
/// its oldest records rather than block.
fn read_deaths(fd: &std::os::fd::OwnedFd, ns: u32) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let mut buf = vec![0u8; 64 * 1024];
    let n = nix::unistd::read(fd, &mut buf).ok()?;
    buf[..n - n % 8]
        .chunks_exact(8)
        .rfind(|r| u32::from_le_bytes([r[0], r[1], r[2], r[3]]) == ns)
        .map(|r| std::process::ExitStatus::from_raw(i32::from_le_bytes([r[4], r[5], r[6], r[7]])))
}

/// Where a new interpreter leaves the host's ends of its fresh channels
/// (requests, replies, stdout, stderr; see the worker's `fresh_channels`).
const CHANNEL_FDS: [i32; 4] = [10, 11, 12, 13];

/// How long a rollback or a fresh interpreter may take before the sandbox
/// is given up.
const RESTORE_DEADLINE: Duration = Duration::from_secs(2);

/// Blocking: wait until the new interpreter (`target`, or a child of
/// `keeper` not in `before`) has placed its channels; its host pid.
fn await_channels(keeper: i32, target: Option<i32>, before: &[i32], until: Instant) -> Option<i32> {
    let until = until.into_std();
    let last = CHANNEL_FDS[CHANNEL_FDS.len() - 1];
    // Asked through pidfd_getfd: an unprivileged host may not look into
    // /proc/PID/fd of a non-dumpable process, but it may take its fds.
    // Until then the number holds the worker's /dev/null placeholder: only
    // a pipe there says the channels are placed.
    let placed = |pid: i32| take_fds(pid, [last]).is_ok_and(|[fd]| is_fifo(fd));
    let mut sent = std::time::Instant::now();
    loop {
        match target {
            Some(pid) if placed(pid) => return Some(pid),
            Some(pid) if crate::spawn::exited(pid) => return None,
            Some(pid) => {
                // Standard signals do not queue: one that code of the
                // sandbox keeps pending would swallow the host's.
                if sent.elapsed() >= Duration::from_millis(2) {
                    signal_pid(pid, libc::SIGUSR1);
                    sent = std::time::Instant::now();
                }
            }
            // Processes the kill is ending can still be listed as children
            // of PID 1 for a moment: only a live one that placed its ends.
            None => {
                let fresh = children(keeper).into_iter().filter(|c| !before.contains(c) && !crate::spawn::exited(*c));
                if let Some(pid) = fresh.into_iter().find(|&p| placed(p)) {
                    return Some(pid);
                }
            }
        }
        if std::time::Instant::now() >= until || crate::spawn::exited(keeper) {
            return None;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether `fd` is a pipe (it is closed).
fn is_fifo(fd: std::os::fd::OwnedFd) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::File::from(fd).metadata().is_ok_and(|m| m.file_type().is_fifo())
}
