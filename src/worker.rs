//! One sandboxed interpreter: its process tree, its channels, its start,
//! its executions and its end.
//!
//! A [`Worker`] owns the bubblewrap child, the protocol pipes, the output
//! streams and the task that reads reply frames. It knows nothing of
//! sessions: what may stop an operation comes in as a [`Stop`] (the
//! session's wake channel and a check that says why), and every failure is
//! a typed value ([`StartError`], [`Interrupt`]) that `outcome` words.
//! A [`KillHandle`] kills the tree without the worker itself, so that a
//! mode change or a dispose need not wait for the running operation.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, timeout, Instant};

use crate::capture::{Capture, Stream};
use crate::contain::Contained;
use crate::frame::{self, ExecReport, FrameError, Reply, PROTOCOL_VERSION};
use crate::limits::{
    BWRAP_GONE, CLEANUP_DEADLINE, DRAIN_CAP, DRAIN_SLACK, IDLE_STDERR_BYTES, PROGRESS_EVERY, PROGRESS_TAIL_BYTES,
    STARTUP_DEADLINE,
};
use crate::permissions::MountConfig;
use crate::protected::{self, Guard};
use crate::runtime::python::PythonRuntime;
use crate::runtime::{CallRequest, Runtime};
use crate::secrets::MaskReport;
use crate::spawn::{kill_group, prepare_inside, spawn_sandbox, take_fds};

mod rollback;
pub use rollback::{RecoverError, Recovery};

/// Why the session wants the operation in progress to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    Disposed,
    Cancelled,
    Remounted,
}

/// What can end a worker operation early: the session's wake channel, and
/// a check that says whether (and why) to stop when it fires.
pub struct Stop<'a> {
    pub wake: &'a mut watch::Receiver<u64>,
    pub check: &'a (dyn Fn() -> Option<Halt> + Send + Sync),
}

/// A running execution's progress, reported every `PROGRESS_EVERY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub elapsed_ms: u64,
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
    /// The latest output of each stream (a few KiB).
    pub stdout_tail: String,
    pub stderr_tail: String,
}

/// Receives progress reports; must not block.
pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// How a start failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The session stopped the start (cancel, dispose, mode change).
    #[error("the start was stopped ({0:?})")]
    Halted(Halt),
    /// A setting cannot be applied (the text says which and why).
    #[error(transparent)]
    Settings(#[from] crate::limits::SettingError),
    /// The start could not be prepared (the seccomp program, the plan).
    #[error("{0}")]
    Prepare(String),
    /// bubblewrap could not be executed at all.
    #[error("bubblewrap could not be started: {0}")]
    Spawn(std::io::Error),
    /// The sandbox ran but never reported ready; `stderr` is what it wrote
    /// there (bounded).
    #[error("{why}")]
    NotReady { why: NotReady, stderr: String },
}

/// Why a started sandbox never reported ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("the worker did not report ready within {}s", STARTUP_DEADLINE.as_secs())]
    Deadline,
    /// The sandbox ended (its exit status, if it was reaped in time).
    #[error("the sandbox ended")]
    Exited(Option<std::process::ExitStatus>),
    #[error("the worker speaks protocol {0}, not {PROTOCOL_VERSION}")]
    Protocol(u32),
    /// The worker said why it cannot serve (an error frame).
    #[error("{0}")]
    Refused(String),
    #[error("unexpected {0} frame before ready")]
    Unexpected(&'static str),
    #[error("bad frame: {0}")]
    BadFrame(String),
    #[error(transparent)]
    BadImage(crate::runtime::python::bytecode::CodeError),
}

impl StartError {
    /// The start failed because of what ran, not because it was stopped
    /// or could not be attempted (the bytecode fallback's test).
    pub fn is_worker_failure(&self) -> bool {
        matches!(self, StartError::NotReady { why, .. } if !matches!(why, NotReady::Deadline))
    }
}

/// How a running execution ended before producing a complete result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interrupt {
    Halted(Halt),
    Timeout,
    OutputLimit,
    Died,
    Violation(String),
}

/// One execution: its id, its code, the end mark of its output, its
/// deadline, and who hears its progress.
pub struct Call<'a> {
    pub seq: u64,
    pub code: &'a str,
    pub mark: &'a [u8],
    pub deadline: Instant,
    pub progress: Option<ProgressFn>,
}

/// What a finished execution gave: the worker's report, and whether the
/// phase after it (draining, the end marks) went cleanly.
pub struct ExecDone {
    pub report: ExecReport,
    pub after: Result<(), String>,
}

/// What the ready frame said.
pub struct Ready {
    pub runtime_version: String,
    pub site_notes: Vec<String>,
    /// The worker's compiled form, when it was asked for (checked).
    pub image: Option<Vec<u8>>,
}

/// How the worker's code reached the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeForm {
    Source,
    Bytecode,
}

impl CodeForm {
    pub fn as_str(self) -> &'static str {
        match self {
            CodeForm::Source => "source",
            CodeForm::Bytecode => "bytecode",
        }
    }
}

/// Everything one start needs, decided by the caller.
pub struct Launch {
    pub bwrap: PathBuf,
    pub argv: Vec<OsString>,
    pub seccomp: OwnedFd,
    pub mount_fds: Vec<OwnedFd>,
    pub mounts: MountConfig,
    /// The host secrets masked in its read roots (see `hostsecrets`).
    pub host_masks: Vec<crate::hostsecrets::Mask>,
    /// The host secrets in force at the start (what `host_masks` came from).
    pub host_secrets: crate::hostsecrets::HostSecrets,
    /// Where a host secret could appear in its read roots while it runs.
    pub secret_watch: Vec<crate::hostsecrets::WatchPoint>,
    /// The watch that tells when the project's masks are stale.
    pub masks_watch: Option<Arc<protected::SecretWatch>>,
    pub guard: Option<Arc<Guard>>,
    pub plan_notes: Vec<String>,
    /// What the start masked (see `secrets`).
    pub masks: MaskReport,
    pub code: CodeForm,
    /// Ask the worker for its compiled form before it reports ready.
    pub emit_code: bool,
    /// The worker runs as the sandbox's PID 1 that keeps it across
    /// interpreters: failed calls roll back, a reset is fast.
    pub keeper: bool,
    /// The caps on the sandbox's tasks and memory (see `contain`).
    pub contained: Contained,
    /// The rlimits the host sets on the held sandbox before the payload
    /// runs (see `Policy::held_rlimits`).
    pub limits: Vec<(nix::sys::resource::Resource, u64)>,
    /// What the namespace helper does in the sandbox's user namespace
    /// before the payload runs (its own inotify limits).
    pub inside: Vec<crate::nshelper::Step>,
    /// The guard's inotify instance, made before the sandbox (see
    /// `protected::Watcher`).
    pub watcher: Option<protected::Watcher>,
    /// What the host may spend on the sandbox's changes to the project
    /// (see `protected::budget`).
    pub budget: protected::BudgetLimits,
}

/// Kills a worker's whole process tree, without the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillHandle(i32);

impl KillHandle {
    pub fn kill(self) {
        kill_group(self.0);
    }

    pub fn pid(self) -> i32 {
        self.0
    }
}

pub struct Worker {
    child: tokio::process::Child,
    pid: i32,
    requests: pipe::Sender,
    /// Bounded: a sandbox that floods frames waits on its pipe, never on
    /// host memory.
    replies: mpsc::Receiver<Result<Reply, FrameError>>,
    /// Frames are expected (a start or a request in flight); one that
    /// arrives otherwise makes the reply task kill the sandbox at once.
    expecting: Arc<AtomicBool>,
    /// The task that reads `replies` (replaced with the channels).
    reader: tokio::task::JoinHandle<()>,
    /// Why the reply task or the guard killed the sandbox, when one did.
    killed_for: protected::KilledFor,
    /// A watch stopped the sandbox because a secret appeared (a host
    /// secret in a read root, or one in the project): what its processes
    /// wrote since may hold it (see `scratch::set_aside`).
    secret_appeared: Arc<AtomicBool>,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    out_buf: Vec<u8>,
    err_buf: Vec<u8>,
    /// The mounts this sandbox was started with.
    pub mounts: MountConfig,
    /// The host secrets masked in its read roots when it started.
    pub host_masks: Vec<crate::hostsecrets::Mask>,
    /// The list they came from, to look again before each execution.
    pub host_secrets: crate::hostsecrets::HostSecrets,
    /// The protected paths of a writable workspace (see `protected`).
    pub guard: Option<Arc<Guard>>,
    /// The project's secrets as the start planned them (see `protected`).
    masks_watch: Option<Arc<protected::SecretWatch>>,
    /// The guard's and the secrets' watches; they end with the worker.
    _watches: crate::watches::Watches,
    /// The pid namespace's init (host pid), once known: when it is gone,
    /// every process of the sandbox is.
    pub init_pid: Option<i32>,
    /// What the protection plan said, for the first result it serves.
    pub plan_notes: Vec<String>,
    /// What this sandbox masks.
    pub masks: MaskReport,
    pub code: CodeForm,
    /// A keeper layout (see [`Launch::keeper`]).
    keeper: bool,
    /// The interpreter's host pid (in a keeper layout), once looked up.
    interp: Option<i32>,
    /// Its pid in the sandbox, as PID 1's record of deaths names it.
    interp_ns: Option<u32>,
    /// Executions the current interpreter started: the first needs no
    /// rollback point (a fresh interpreter is where it was).
    execs: u64,
    /// The rollback point of the execution in flight: the copy's host
    /// pid (checked: a child the interpreter made after the request), or
    /// why there is none.
    point: Option<Result<i32, NoPoint>>,
    point_taken: bool,
    /// The last execution's request reached the interpreter (the pipe
    /// took its first bytes): one halted before that never touched it.
    sent: bool,
    /// The idle interpreter said that the next call's output pipes wait
    /// at fds 14 and 15 (only then are those numbers ours to take).
    streams_ready: bool,
    /// What the begin frame of the call in flight is checked against.
    begin_check: Option<BeginCheck>,
    /// The tasks reading streams of earlier calls until their last writer
    /// exits (at most MAX_RETIRED; past it the oldest is closed).
    retired: std::collections::VecDeque<tokio::task::JoinHandle<()>>,
    /// The caps on the sandbox's tasks and memory. Its cgroups live as
    /// long as the sandbox, across interpreters, and go when the worker
    /// does: the last field, so that they are removed after the child is
    /// dropped (killed).
    contained: Contained,
}

impl Worker {
    /// Start one sandbox and wait (bounded) for it to report ready.
    /// `spawned` is told the pid as soon as there is one (`true`), and
    /// again (`false`) when a start that failed has been cleaned up.
    pub async fn start(
        launch: Launch,
        stop: &mut Stop<'_>,
        spawned: &(dyn Fn(i32, bool) + Send + Sync),
    ) -> Result<(Worker, Ready), StartError> {
        let Launch {
            bwrap,
            argv,
            seccomp,
            mount_fds,
            mounts,
            host_masks,
            host_secrets,
            secret_watch,
            masks_watch,
            guard,
            plan_notes,
            masks,
            code,
            emit_code,
            keeper,
            mut contained,
            limits,
            inside,
            watcher,
            budget,
        } = launch;
        let mut child =
            spawn_sandbox(&bwrap, &argv, seccomp, mount_fds, contained.take_join()).map_err(StartError::Spawn)?;
        // Nothing of the payload runs before its limits are set and its
        // namespaces prepared. The payload is released only by the byte
        // written after both: on a failure it is killed before its pipe
        // closes.
        if let Err(why) = prepare_inside(child.info, &child.release, &limits, inside).await {
            // A bubblewrap that failed on its own (a mount source gone, say)
            // has ended or ends at once, and its own words on stderr are
            // what the start reports, as for any bubblewrap failure. One
            // that is still there waits for the release: it is killed.
            let ended = matches!(timeout(BWRAP_GONE, child.child.wait()).await, Ok(Ok(_)));
            if !ended {
                kill_group(child.pid);
                let _ = timeout(CLEANUP_DEADLINE, child.child.wait()).await;
                return Err(StartError::Prepare(match why {
                    crate::spawn::Unprepared::Limit { .. } => format!(
                        "No sandbox was started: its own task and open-file limits could not be set ({why}); without \
                         them code in it could start more tasks or hold more files than its caps allow"
                    ),
                    _ => format!(
                        "No sandbox was started: its own inotify limits could not be set ({why}); without them code \
                         in it could take every inotify instance of your user, the guard's among them"
                    ),
                }));
            }
        }
        // Two frames in flight at most: a flood waits on the pipe. A frame
        // that no start or request asked for kills the sandbox at once.
        let (tx, rx) = mpsc::channel(2);
        let expecting = Arc::new(AtomicBool::new(true));
        let killed_for: protected::KilledFor = Arc::default();
        // One budget for every watch on this sandbox: past it, it is stopped.
        let budget = Arc::new(protected::Budget::new(budget, child.pid, killed_for.clone()));
        if let Some(g) = &guard {
            g.arm(child.pid, killed_for.clone());
            g.set_budget(budget.clone());
        }
        let reader = tokio::spawn(read_replies(child.replies, tx, expecting.clone(), killed_for.clone(), child.pid));
        let stdout = child.stdout.into_owned_fd().and_then(pipe::Receiver::from_owned_fd).map_err(StartError::Spawn)?;
        let stderr = child.stderr.into_owned_fd().and_then(pipe::Receiver::from_owned_fd).map_err(StartError::Spawn)?;
        let mut worker = Worker {
            child: child.child,
            pid: child.pid,
            requests: child.requests,
            replies: rx,
            expecting,
            reader,
            killed_for,
            secret_appeared: Arc::default(),
            stdout: Some(stdout),
            stderr: Some(stderr),
            out_buf: vec![0; 64 * 1024],
            err_buf: vec![0; 64 * 1024],
            mounts,
            host_masks,
            host_secrets,
            guard,
            _watches: Default::default(),
            masks_watch,
            init_pid: None,
            plan_notes,
            masks,
            code,
            keeper,
            interp: None,
            interp_ns: None,
            execs: 0,
            point: None,
            point_taken: false,
            sent: false,
            streams_ready: false,
            begin_check: None,
            retired: Default::default(),
            contained,
        };
        spawned(worker.pid, true);
        match worker.await_ready(stop, emit_code).await {
            Ok(ready) => {
                worker.init_pid = children(worker.pid).first().copied();
                worker._watches = crate::watches::start(crate::watches::Armed {
                    pid: worker.pid,
                    guard: worker.guard.clone(),
                    watcher,
                    secret_watch,
                    masks_watch: worker.masks_watch.clone(),
                    budget: budget.clone(),
                    killed_for: worker.killed_for.clone(),
                    secret_appeared: worker.secret_appeared.clone(),
                });
                tracing::debug!(pid = worker.pid, code = code.as_str(), "sandbox ready");
                Ok((worker, ready))
            }
            Err(failure) => {
                tracing::debug!(pid = worker.pid, "sandbox start failed: {failure}");
                kill_group(worker.pid);
                let _ = timeout(CLEANUP_DEADLINE, worker.child.wait()).await;
                spawned(worker.pid, false);
                Err(failure)
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn kill_handle(&self) -> KillHandle {
        KillHandle(self.pid)
    }

    /// OOM kills in the sandbox since the last look, worded; `died` tells
    /// whether the interpreter was among them (see `Contained::oom_note`).
    pub fn oom_note(&mut self, died: bool) -> Option<String> {
        self.contained.oom_note(died)
    }

    /// Blocking: why the start's secret masks no longer fit the project
    /// (a secret appeared since), if they do not.
    pub fn masks_stale(&self) -> Option<String> {
        self.masks_watch.as_ref().and_then(|w| w.stale())
    }

    /// The watch behind [`Worker::masks_stale`] (to ask off the runtime).
    pub fn masks_watch(&self) -> Option<Arc<protected::SecretWatch>> {
        self.masks_watch.clone()
    }

    /// Why the reply task or the guard killed this sandbox, once.
    pub fn take_killed_for(&self) -> Option<String> {
        self.killed_for.lock().take()
    }

    /// Whether a watch stopped this sandbox because a secret appeared.
    pub fn secret_appeared(&self) -> bool {
        self.secret_appeared.load(Ordering::Acquire)
    }

    /// The sandbox's exit status, if it has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Wait (bounded) for the sandbox to end by itself.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        timeout(within, self.child.wait()).await.ok().and_then(|r| r.ok())
    }

    /// Wait for the ready frame, collecting stderr for the diagnostic.
    /// With `emit`, the worker's compiled form may come first.
    async fn await_ready(&mut self, stop: &mut Stop<'_>, emit: bool) -> Result<Ready, StartError> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let mut diag: Vec<u8> = Vec::new();
        let mut image: Option<Vec<u8>> = None;
        loop {
            let Worker { replies, stdout, stderr, err_buf, out_buf, .. } = self;
            tokio::select! {
                biased;
                changed = stop.wake.changed() => {
                    if changed.is_err() { return Err(StartError::Halted(Halt::Disposed)); }
                    if let Some(halt) = (stop.check)() { return Err(StartError::Halted(halt)); }
                }
                _ = sleep_until(deadline) => {
                    return Err(not_ready(NotReady::Deadline, &diag));
                }
                msg = replies.recv() => match msg {
                    Some(Ok(Reply::Ready { protocol, runtime_version, site_notes, streams })) if protocol == PROTOCOL_VERSION => {
                        self.expecting.store(false, Ordering::Release);
                        self.streams_ready = streams;
                        return Ok(Ready { runtime_version, site_notes, image });
                    }
                    Some(Ok(Reply::Code { pyc })) if emit && image.is_none() => match crate::runtime::python::bytecode::decode(&pyc) {
                        Ok(bytes) => image = Some(bytes),
                        Err(why) => return Err(not_ready(NotReady::BadImage(why), &diag)),
                    },
                    Some(Ok(Reply::Ready { protocol, .. })) => {
                        return Err(not_ready(NotReady::Protocol(protocol), &diag));
                    }
                    Some(Ok(Reply::Error { message, .. })) => return Err(not_ready(NotReady::Refused(message), &diag)),
                    Some(Ok(other)) => return Err(not_ready(NotReady::Unexpected(reply_kind(&other)), &diag)),
                    Some(Err(FrameError::Eof)) | None => {
                        // Killed by a dispose or a cancel whose wake is still on its way.
                        if let Some(halt) = (stop.check)() { return Err(StartError::Halted(halt)); }
                        // Collect what bwrap or Python said on the way out.
                        let _ = timeout(Duration::from_millis(500), async {
                            while let Some(n) = read_opt(stderr, err_buf).await {
                                if n == 0 { break; }
                                diag.extend_from_slice(&err_buf[..n.min(IDLE_STDERR_BYTES.saturating_sub(diag.len()))]);
                            }
                        }).await;
                        let exit = self.wait_exit(CLEANUP_DEADLINE).await;
                        return Err(not_ready(NotReady::Exited(exit), &diag));
                    }
                    Some(Err(e)) => return Err(not_ready(NotReady::BadFrame(e.to_string()), &diag)),
                },
                n = read_opt(stderr, err_buf) => match n {
                    Some(n) if n > 0 => diag.extend_from_slice(&err_buf[..n.min(IDLE_STDERR_BYTES.saturating_sub(diag.len()))]),
                    _ => *stderr = None,
                },
                n = read_opt(stdout, out_buf) => if !matches!(n, Some(n) if n > 0) { *stdout = None },
            }
        }
    }

    /// Run `code` as execution `seq` (its output ends with `mark`) and
    /// follow it to its end: the result, then the drained frame and both
    /// end marks. In a keeper layout every execution but an interpreter's
    /// first takes a rollback point first.
    pub async fn exec(
        &mut self,
        call: Call<'_>,
        capture: &mut Capture,
        stop: &mut Stop<'_>,
    ) -> Result<ExecDone, Interrupt> {
        self.sent = false;
        let execs = self.execs;
        let done = self.run(call, capture, stop).await;
        if !self.sent {
            // Halted before the request went out: the interpreter ran
            // nothing, its next call is still the one it counts, and a
            // frame from it now is one while no execution runs.
            self.execs = execs;
            self.expecting.store(false, Ordering::Release);
        }
        self.point_taken = matches!(self.point, Some(Ok(_)));
        if done.is_ok() {
            // The worker discards the copy once the call succeeded.
            self.point = None;
        }
        done
    }

    /// Whether the last execution's request reached the interpreter: a
    /// call halted before that left it untouched (no code ran, nothing
    /// needs to be rolled back or killed).
    pub fn request_sent(&self) -> bool {
        self.sent
    }

    /// Whether the last execution took a rollback point.
    pub fn took_point(&self) -> bool {
        self.point_taken
    }

    /// A keeper layout (rollback and fast reset).
    pub fn keeper(&self) -> bool {
        self.keeper
    }

    async fn run(&mut self, call: Call<'_>, capture: &mut Capture, stop: &mut Stop<'_>) -> Result<ExecDone, Interrupt> {
        let Call { seq, code, mark, deadline, progress } = call;
        let checkpoint = self.keeper && self.execs > 0;
        let request = PythonRuntime.request(CallRequest { id: seq, code, mark, checkpoint });
        let request =
            frame::encode(&request).map_err(|e| Interrupt::Violation(format!("request could not be framed: {e}")))?;
        // The interpreter, idle, made this call's pipes: take their read
        // ends; the streams of earlier calls are drained and dropped by
        // themselves (what their processes write is never this call's).
        // Where there are none (no free descriptor in the sandbox), the
        // call keeps the streams it has.
        let prepared = std::mem::take(&mut self.streams_ready);
        if let Some(Ok((out, err))) = self.interpreter().filter(|_| prepared).map(call_streams) {
            let old = [self.stdout.replace(out), self.stderr.replace(err)];
            for stream in old {
                self.retire(stream);
            }
        } else {
            // The same pipes as the last call (no process of the sandbox
            // but the interpreter held them): what was written since is
            // not this call's.
            for stream in [&self.stdout, &self.stderr].into_iter().flatten() {
                let mut dropped = 0;
                while dropped < SAME_PIPES_DRAIN_BYTES {
                    match stream.try_read(&mut self.out_buf) {
                        Ok(n) if n > 0 => dropped += n,
                        _ => break,
                    }
                }
            }
        }
        self.execs += 1;
        self.point = None;
        // The copy must be a child the interpreter makes after this
        // request: a process of an earlier call that names itself in a
        // forged begin frame is not one.
        self.begin_check = if checkpoint {
            let interp = self.interpreter();
            let children_before = interp.map(children).unwrap_or_default();
            Some(BeginCheck { seq, interp, keeper: self.init_pid, children_before, asked_at: boot_ticks() })
        } else {
            None
        };
        let Worker {
            requests,
            replies,
            stdout,
            stderr,
            out_buf,
            err_buf,
            expecting,
            point,
            streams_ready,
            begin_check,
            sent,
            ..
        } = self;
        expecting.store(true, Ordering::Release);
        let mut report: Option<ExecReport> = None;
        let mut drained: Option<(bool, bool)> = None;
        let mut drain_until = deadline;
        let mut written = false;
        let mut begun = false;
        let started = Instant::now();
        let mut tick = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let done = |report: ExecReport, after| Ok(ExecDone { report, after });
        loop {
            if let (Some(_), Some((want_out, want_err))) = (&report, drained) {
                let out_done = !want_out || stdout.is_none() || capture.mark_seen(Stream::Stdout);
                let err_done = !want_err || stderr.is_none() || capture.mark_seen(Stream::Stderr);
                if out_done && err_done {
                    break;
                }
            }
            let running = report.is_none();
            tokio::select! {
                biased;
                // Before the request goes out: a change that is already
                // signalled must not let the code start.
                changed = stop.wake.changed(), if running => {
                    if changed.is_err() { return Err(Interrupt::Halted(Halt::Disposed)); }
                    if let Some(halt) = (stop.check)() { return Err(Interrupt::Halted(halt)); }
                }
                // From its first poll on, the request may be partly in the pipe.
                r = async { *sent = true; requests.write_all(&request).await }, if !written => {
                    if r.is_err() { return Err(Interrupt::Died); }
                    written = true;
                }
                _ = sleep_until(deadline), if running => return Err(Interrupt::Timeout),
                _ = sleep_until(drain_until), if !running => break,
                _ = tick.tick(), if running && progress.is_some() => {
                    if let Some(report) = &progress {
                        report(Progress {
                            elapsed_ms: started.elapsed().as_millis() as u64,
                            stdout_bytes: capture.stdout.total,
                            stderr_bytes: capture.stderr.total,
                            stdout_tail: capture.stdout.latest(PROGRESS_TAIL_BYTES),
                            stderr_tail: capture.stderr.latest(PROGRESS_TAIL_BYTES),
                        });
                    }
                }
                msg = replies.recv() => match msg {
                    Some(Ok(Reply::Result(r))) if running && r.id == seq => {
                        report = Some(r);
                        drain_until = Instant::now() + DRAIN_CAP + DRAIN_SLACK;
                    }
                    Some(Ok(Reply::Begin { id, copy, why })) if running && !begun && id == seq => {
                        begun = true;
                        if let Some(check) = begin_check.as_ref() {
                            *point = Some(check.copy(copy, why));
                        }
                    }
                    Some(Ok(Reply::Drained { id, stdout: o, stderr: e, streams })) if !running && id == seq => {
                        *streams_ready = streams;
                        // Nothing more is due until the next request.
                        expecting.store(false, Ordering::Release);
                        drained = Some((o, e));
                    }
                    Some(Ok(other)) => {
                        let why = format!("unexpected {} frame", reply_kind(&other));
                        return match report { Some(r) => done(r, Err(why)), None => Err(Interrupt::Violation(why)) };
                    }
                    Some(Err(FrameError::Eof)) | None => {
                        if let Some(r) = report {
                            return done(r, Err("the worker exited".into()));
                        }
                        // The kill may come before its wake: a sandbox the
                        // session killed reports why, not a death.
                        if let Some(halt) = (stop.check)() { return Err(Interrupt::Halted(halt)); }
                        return Err(Interrupt::Died);
                    }
                    Some(Err(e)) => {
                        let why = e.to_string();
                        return match report { Some(r) => done(r, Err(why)), None => Err(Interrupt::Violation(why)) };
                    }
                },
                n = read_opt(stdout, out_buf) => take_read(capture, Stream::Stdout, stdout, out_buf, n),
                n = read_opt(stderr, err_buf) => take_read(capture, Stream::Stderr, stderr, err_buf, n),
            }
            if capture.overflowed {
                return Err(Interrupt::OutputLimit);
            }
        }
        // The loop ends only with a report; say so if that ever changes.
        match report {
            Some(r) => done(r, Ok(())),
            None => Err(Interrupt::Violation("no result before the drain ended".into())),
        }
    }

    /// Kill the whole tree, keep the output that was already written (into
    /// `capture`, when given), and wait (bounded) for everything to exit.
    pub async fn kill(mut self, capture: Option<&mut Capture>) -> (Option<std::process::ExitStatus>, Dead) {
        kill_group(self.pid);
        if let Some(capture) = capture {
            let Worker { stdout, stderr, out_buf, err_buf, .. } = &mut self;
            let _ = timeout(CLEANUP_DEADLINE, async {
                while stdout.is_some() || stderr.is_some() {
                    tokio::select! {
                        n = read_opt(stdout, out_buf) => take_read(capture, Stream::Stdout, stdout, out_buf, n),
                        n = read_opt(stderr, err_buf) => take_read(capture, Stream::Stderr, stderr, err_buf, n),
                    }
                }
            })
            .await;
        }
        let exit = self.wait_exit(CLEANUP_DEADLINE).await;
        tracing::debug!(pid = self.pid, ?exit, "sandbox killed");
        (exit, Dead { guard: self.guard.clone(), init_pid: self.init_pid })
    }

    /// Kill a sandbox nobody waits for and collect its exit on a plain
    /// thread (this may run on the JS thread, outside any async runtime),
    /// so that no zombie is left behind.
    pub fn reap(self) {
        kill_group(self.pid);
        let pid = nix::unistd::Pid::from_raw(self.pid);
        drop(self);
        let _ = std::thread::Builder::new().name("pps-reap".into()).spawn(move || {
            let _ = nix::sys::wait::waitpid(pid, None);
        });
    }
}

/// Where the idle interpreter leaves the read ends of the next call's
/// stdout and stderr (see the worker's `prepare_streams`).
const STREAM_FDS: [i32; 2] = [14, 15];

/// What the begin frame of a call that asked for a rollback point is
/// checked against: the copy must be a child the interpreter made after
/// the request (a process of an earlier call that names itself in a
/// forged begin frame is not one).
struct BeginCheck {
    seq: u64,
    interp: Option<i32>,
    keeper: Option<i32>,
    children_before: Vec<i32>,
    asked_at: Option<u64>,
}

/// Why a call has no rollback point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoPoint {
    #[error("the begin frame named a process that is not this call's copy")]
    NotTheCopy,
    #[error("the interpreter's pid is not known")]
    NoInterpreter,
    /// The worker's own reason (threads running, a failed fork), as sent.
    #[error("{0}")]
    Worker(String),
    #[error("none was taken")]
    NoneTaken,
}

impl BeginCheck {
    /// The rollback point a begin frame names: the copy's host pid, or why
    /// there is none.
    fn copy(&self, copy: Option<u32>, why: Option<String>) -> Result<i32, NoPoint> {
        match (copy, self.interp) {
            (Some(ns), Some(interp)) => this_calls_copy(interp, self.keeper, ns, &self.children_before, self.asked_at)
                .ok_or(NoPoint::NotTheCopy),
            (Some(_), None) => Err(NoPoint::NoInterpreter),
            (None, _) => Err(why.map_or(NoPoint::NoneTaken, NoPoint::Worker)),
        }
    }
}

/// The host pid of the process that is `ns_pid` in the sandbox, if it is
/// a child `interp` made since `before` was listed. An interpreter that
/// ended at once (its code's first act) has left its copy to PID 1
/// (`keeper`): then a child of PID 1 started since `asked_at` (clock ticks
/// since boot, the kernel's start-time unit) counts.
fn this_calls_copy(
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
fn boot_ticks() -> Option<u64> {
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
fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The pid of host process `pid` in its own (innermost) pid namespace.
fn ns_pid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The children of `pid` (host pids).
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|text| text.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// Take the read ends of the call's fresh output pipes from `pid`.
fn call_streams(pid: i32) -> std::io::Result<(pipe::Receiver, pipe::Receiver)> {
    let [out, err] = take_fds(pid, STREAM_FDS)?;
    let (out, err) = (pipe::Receiver::from_owned_fd(out)?, pipe::Receiver::from_owned_fd(err)?);
    Ok((out, err))
}

/// Most streams of earlier calls read at once per sandbox.
const MAX_RETIRED: usize = 16;

/// Most bytes a stream of an earlier call is read (and dropped) per
/// second: past it the task sleeps for the rest of the second and the
/// stream's writers block on the full pipe. MAX_RETIRED of them make at
/// most 1 MiB a second, a few dozen reads: what a sandbox's background
/// flood costs the host's process while no call runs.
const RETIRED_BYTES_PER_SECOND: usize = 64 * 1024;

/// Most bytes dropped from a call's own pipes before the next call on the
/// same pipes (a pipe holds at most 1 MiB unless its owner is privileged):
/// a writer that never stops cannot keep the host draining.
const SAME_PIPES_DRAIN_BYTES: usize = 1024 * 1024;

impl Worker {
    /// Read a stream of an earlier call until its last writer is gone, and
    /// drop what it says (closing it under a writer would hand a background
    /// process SIGPIPE), at most RETIRED_BYTES_PER_SECOND: a flood waits on
    /// the full pipe instead of keeping the host busy. One task and one fd
    /// per stream that a process of the sandbox still holds, at most
    /// MAX_RETIRED: past it the oldest is closed (its writers then get
    /// EPIPE), so that the sandbox cannot make the host hold descriptors
    /// without bound.
    fn retire(&mut self, stream: Option<pipe::Receiver>) {
        let Some(stream) = stream else { return };
        self.retired.retain(|task| !task.is_finished());
        if self.retired.len() >= MAX_RETIRED {
            if let Some(oldest) = self.retired.pop_front() {
                oldest.abort();
            }
        }
        self.retired.push_back(tokio::spawn(drop_slowly(stream, RETIRED_BYTES_PER_SECOND)));
    }
}

/// Read `stream` until EOF and drop it, at most `per_second` bytes in any
/// second.
async fn drop_slowly(mut stream: pipe::Receiver, per_second: usize) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut window = Instant::now();
    let mut used = 0;
    loop {
        let room = per_second.saturating_sub(used).min(buf.len());
        if room == 0 {
            sleep_until(window + Duration::from_secs(1)).await;
            (window, used) = (Instant::now(), 0);
            continue;
        }
        match stream.read(&mut buf[..room]).await {
            Ok(n) if n > 0 => used += n,
            _ => return,
        }
        if window.elapsed() >= Duration::from_secs(1) {
            (window, used) = (Instant::now(), 0);
        }
    }
}

/// What is left of a killed worker for the checks after it: its project
/// guard and its namespace's init.
pub struct Dead {
    pub guard: Option<Arc<Guard>>,
    pub init_pid: Option<i32>,
}

/// Read reply frames into `tx` until the stream ends; a frame that arrives
/// while none is expected kills the sandbox.
async fn read_replies(
    mut reader: pipe::Receiver,
    tx: mpsc::Sender<Result<Reply, FrameError>>,
    expecting: Arc<AtomicBool>,
    killed: protected::KilledFor,
    group: i32,
) {
    loop {
        let item = frame::read_frame(&mut reader).await.and_then(|body| frame::decode_reply(&body));
        let end = matches!(
            item,
            Err(FrameError::Eof | FrameError::Truncated { .. } | FrameError::Io { .. } | FrameError::Oversize { .. })
        );
        if !end && !expecting.load(Ordering::Acquire) {
            tracing::warn!("sandbox {group} sent a frame while no execution ran; killed");
            *killed.lock() = Some("it sent a protocol frame while no execution ran".into());
            kill_group(group);
            break;
        }
        if tx.send(item).await.is_err() || end {
            break;
        }
    }
}

fn not_ready(why: NotReady, diag: &[u8]) -> StartError {
    StartError::NotReady { why, stderr: String::from_utf8_lossy(diag).trim().to_string() }
}

fn reply_kind(r: &Reply) -> &'static str {
    match r {
        Reply::Ready { .. } => "ready",
        Reply::Result(_) => "result",
        Reply::Drained { .. } => "drained",
        Reply::Code { .. } => "code",
        Reply::Begin { .. } => "begin",
        Reply::Restored { .. } => "restored",
        Reply::Error { .. } => "error",
    }
}

/// Read what `stream` holds now, without waiting, into `capture`.
fn drain_now(stream: &pipe::Receiver, capture: &mut Capture, which: Stream, buf: &mut [u8]) {
    while let Ok(n) = stream.try_read(buf) {
        if n == 0 {
            break;
        }
        capture.feed(which, &buf[..n]);
        if capture.overflowed {
            break;
        }
    }
}

/// Hand a read result to the capture; a closed or failed stream is finished.
fn take_read<R>(capture: &mut Capture, which: Stream, slot: &mut Option<R>, buf: &[u8], n: Option<usize>) {
    match n {
        Some(n) if n > 0 => capture.feed(which, &buf[..n]),
        _ => {
            capture.finish(which);
            *slot = None;
        }
    }
}

/// Read from an optional stream; `None` when it is closed or failed.
async fn read_opt<R: AsyncRead + Unpin>(stream: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match stream {
        Some(s) => s.read(buf).await.ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_ran_counts_as_a_worker_failure() {
        let failed = not_ready(NotReady::Exited(None), b"oops");
        assert!(failed.is_worker_failure());
        assert!(!not_ready(NotReady::Deadline, b"").is_worker_failure());
        assert!(!StartError::Halted(Halt::Cancelled).is_worker_failure());
        let StartError::NotReady { stderr, .. } = failed else { panic!("wrong variant") };
        assert_eq!(stderr, "oops");
    }

    #[test]
    fn take_read_finishes_a_closed_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut capture = Capture::new(b"END".to_vec(), dir.join("o"), dir.join("e"));
        let mut slot = Some(());
        take_read(&mut capture, Stream::Stdout, &mut slot, b"hello", Some(5));
        assert!(slot.is_some());
        assert_eq!(capture.stdout.total, 5);
        take_read(&mut capture, Stream::Stdout, &mut slot, b"", Some(0));
        assert!(slot.is_none());
    }
}
