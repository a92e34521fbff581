//! One python session: its sandbox's lifecycle, its executions, its
//! scratch and log directories.
//!
//! A session starts nothing until the first execution. Operations are
//! serialised by one async lock; `status` and `cancel` never wait for it.
//! Any failure that leaves the interpreter in doubt (timeout, cancel, output
//! overflow, worker death, a protocol violation) kills the whole sandbox, and
//! the result says that state was lost and why. Code is never replayed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, timeout};

use crate::beneath::Tree;
use crate::bwrap::{bwrap_argv, FdBind, SandboxSpec, WorkerCode, MOUNT_FD_BASE, SCRATCH, WORKSPACE};
use crate::capture::{Capture, Stream};
use crate::frame::{self, ExecReport, FrameError, Reply, Request, WorkerStatus, PROTOCOL_VERSION};
use crate::limits::*;
use crate::options::Settings;
use crate::outcome::{exit_text, ExceptionText, LogFiles, Outcome, Progress, ProgressFn, Status, StreamText};
pub use crate::permissions::MountConfig;
use crate::probe::{self, Bwrap, Interpreter, PythonEnv};
use crate::protected::{self, Guard};
pub use crate::rundir::{cleanup_all, default_runtime_root, Dirs};
use crate::rundir::{live_update, random_u64};
use crate::seccomp;
use crate::spare::Spare;
use crate::spawn::{kill_group, spawn_sandbox};

/// The worker script, embedded in the addon.
pub const WORKER_SOURCE: &str = include_str!("worker/worker.py");

#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The project directory (mounted at /workspace).
    pub project_dir: PathBuf,
    /// Where session directories are made; default `<tmp>/pi-python-sandbox-<uid>`.
    pub runtime_root: Option<PathBuf>,
    /// Interpreter path; default `$PI_PYTHON_TOOL_INTERPRETER`, else /usr/bin/python3.
    pub interpreter: Option<String>,
    /// Initial mounts; change them later with [`Session::set_mounts`].
    pub mounts: MountConfig,
    /// The user's Python packages (a venv or site directories, colon
    /// separated); default `$PI_PYTHON_TOOL_VENV`.
    pub python_packages: Option<String>,
    /// Add the system's dist-packages; default `$PI_PYTHON_TOOL_SYSTEM_SITE` = 1.
    pub system_site_packages: Option<bool>,
    /// Keep a spare sandbox ready (default: `$PI_PYTHON_TOOL_PREWARM`,
    /// on unless it is `0`, `false`, `off` or `no`).
    pub prewarm: Option<bool>,
}

pub use crate::options::PREWARM_ENV;

pub use crate::outcome::{Availability, SpareState, StatusReport};

struct Shared {
    report: StatusReport,
    worker_pid: Option<i32>,
    spare_pid: Option<i32>,
    running_call: Option<u32>,
    cancelled: HashSet<u32>,
    /// The active sandbox's guard and init pid, for checks after a kill
    /// that does not hold the operation lock.
    active_guard: Option<(Arc<Guard>, Option<i32>)>,
}

struct Worker {
    child: tokio::process::Child,
    pid: i32,
    requests: tokio::net::unix::pipe::Sender,
    /// Bounded: a sandbox that floods frames waits on its pipe, never on
    /// host memory.
    replies: mpsc::Receiver<Result<Reply, FrameError>>,
    /// Frames are expected (a start or a request in flight); one that
    /// arrives otherwise makes the reply task kill the sandbox at once.
    expecting: Arc<AtomicBool>,
    /// Why the reply task or the guard killed the sandbox, when one did.
    killed_for: protected::KilledFor,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    out_buf: Vec<u8>,
    err_buf: Vec<u8>,
    /// The mounts this sandbox was started with.
    mounts: MountConfig,
    /// The protected paths of a writable workspace (see `protected`).
    guard: Option<Arc<Guard>>,
    /// Ends the guard's watch when the worker is dropped.
    _watch: Option<tokio::sync::oneshot::Sender<()>>,
    /// The pid namespace's init (host pid), once known: when it is gone,
    /// every process of the sandbox is.
    init_pid: Option<i32>,
    /// What the protection plan said, for the first result it serves.
    plan_notes: Vec<String>,
    /// "source" or "bytecode" (see `bytecode`).
    code: &'static str,
}

struct Facts {
    bwrap: Bwrap,
    interpreter: Interpreter,
    merged_usr: bool,
    python: PythonEnv,
    /// Key of the worker's compiled form for this interpreter.
    code_key: Option<u64>,
}

/// What one sandbox start is made of.
struct Start<'a> {
    facts: &'a Facts,
    dirs: &'a Dirs,
    /// The canonical project directory.
    project: PathBuf,
    mounts: MountConfig,
    role: Role,
    /// The execution waiting for this start (none for a spare).
    call: Option<u32>,
}

struct Inner {
    worker: Option<Worker>,
    facts: Option<Arc<Facts>>,
    dirs: Option<Dirs>,
    exec_seq: u64,
    /// State loss that happened between calls, told by the next result.
    pending_loss: Option<String>,
    /// Exit status of a sandbox that ended by itself, before it was reaped.
    exit_status: Option<std::process::ExitStatus>,
    /// The last sandbox start failed: no spare with the same setup.
    start_failed: bool,
}

pub struct Session {
    id: u64,
    weak: std::sync::Weak<Session>,
    spare: Spare<Worker>,
    opts: SessionOptions,
    nonce_base: u64,
    ops: tokio::sync::Mutex<Inner>,
    shared: parking_lot::Mutex<Shared>,
    wake: watch::Sender<u64>,
    auto_call: AtomicU64,
    /// Notes for the next result, found between executions (protected
    /// names made inert, ...).
    notes: protected::Notes,
    /// Protected names that could not be made inert (see `protected`).
    tainted: protected::Tainted,
}

const DISPOSED: &str = "The python session was disposed; no interpreter is available.";
const REMOUNT_REASON: &str = "the sandbox was restarted because the permission mode or read roots changed";

/// What a sandbox being started is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Active,
    /// The spare start holding this ticket (see [`Spare::Starting`]).
    Spare(u64),
}

/// How a running execution ended before producing a complete result.
enum Interrupt {
    Remounted,
    Timeout,
    Cancelled,
    Disposed,
    OutputLimit,
    Died,
    Violation(String),
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl Session {
    pub fn new(opts: SessionOptions) -> Arc<Self> {
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let report = StatusReport {
            availability: Availability::Unverified,
            worker_running: false,
            busy: false,
            generation: 0,
            executions: 0,
            runtime_version: None,
            last_reset_reason: None,
            disposed: false,
            project_dir: opts.project_dir.clone(),
            mounts: opts.mounts.clone(),
            mount_epoch: 0,
            permissions_seen: false,
            denied_reads: Vec::new(),
            dirs: None,
            bwrap: None,
            site_dirs: Vec::new(),
            python_notes: Vec::new(),
            prewarm: opts.prewarm.unwrap_or_else(|| Settings::from_env().prewarm),
            spare: SpareState::None,
            worker_code: None,
        };
        Arc::new_cyclic(|weak| Session {
            id,
            weak: weak.clone(),
            spare: Spare::default(),
            nonce_base: random_u64(),
            opts,
            ops: tokio::sync::Mutex::new(Inner {
                worker: None,
                facts: None,
                dirs: None,
                exec_seq: 0,
                pending_loss: None,
                exit_status: None,
                start_failed: false,
            }),
            shared: parking_lot::Mutex::new(Shared {
                report,
                worker_pid: None,
                spare_pid: None,
                running_call: None,
                cancelled: HashSet::new(),
                active_guard: None,
            }),
            wake: watch::channel(0).0,
            auto_call: AtomicU64::new(0),
            notes: protected::Notes::default(),
            tainted: protected::Tainted::default(),
        })
    }

    /// A snapshot for `status`; starts nothing and never waits.
    pub fn status(&self) -> StatusReport {
        let spare = self.spare.state();
        let mut report = self.shared.lock().report.clone();
        report.spare = spare;
        report
    }

    /// Cancel call `call_id`, or the running call when `None`. Returns
    /// whether there was something to cancel.
    pub fn cancel(&self, call_id: Option<u32>) -> bool {
        let mut sh = self.shared.lock();
        let target = match call_id.or(sh.running_call) {
            Some(id) => id,
            None => return false,
        };
        sh.cancelled.insert(target);
        drop(sh);
        self.wake.send_modify(|n| *n += 1);
        true
    }

    fn is_cancelled(&self, call: u32) -> bool {
        self.shared.lock().cancelled.contains(&call)
    }

    fn is_disposed(&self) -> bool {
        self.shared.lock().report.disposed
    }

    /// Run `code`. `call_id` names the call for `cancel`.
    pub async fn execute(&self, code: String, timeout_seconds: u32, call_id: Option<u32>) -> Outcome {
        self.execute_with_progress(code, timeout_seconds, call_id, None).await
    }

    /// [`Session::execute`], reporting progress while the code runs.
    pub async fn execute_with_progress(
        &self,
        code: String,
        timeout_seconds: u32,
        call_id: Option<u32>,
        progress: Option<ProgressFn>,
    ) -> Outcome {
        let started = Instant::now();
        // Internal ids live above u32::MAX / 2 so they never meet a caller's.
        let call = call_id
            .unwrap_or_else(|| (self.auto_call.fetch_add(1, Ordering::Relaxed) as u32 % (u32::MAX / 2)) + u32::MAX / 2);
        let mut wake = self.wake.subscribe();
        let mut inner = tokio::select! {
            guard = self.ops.lock() => guard,
            _ = async { loop {
                if self.is_cancelled(call) || self.is_disposed() { break; }
                if wake.changed().await.is_err() { std::future::pending::<()>().await; }
            } } => {
                if self.is_disposed() {
                    return self.finish_static(call, Status::Unavailable, DISPOSED.into());
                }
                return self.finish_static(call, Status::Cancelled, "Cancelled before execution; the interpreter was not touched.".into());
            }
        };
        if self.is_disposed() {
            return self.finish_static(call, Status::Unavailable, DISPOSED.into());
        }
        if self.is_cancelled(call) {
            return self.finish_static(
                call,
                Status::Cancelled,
                "Cancelled before execution; the interpreter was not touched.".into(),
            );
        }
        {
            let mut sh = self.shared.lock();
            sh.running_call = Some(call);
            sh.report.busy = true;
        }
        let mut outcome = self.execute_locked(&mut inner, code, timeout_seconds, call, &mut wake, progress).await;
        self.refill_spare(&inner);
        if let Some(loss) = inner.pending_loss.take() {
            if outcome.status == Status::Unavailable || !outcome.started {
                inner.pending_loss = Some(loss); // nothing ran; tell the next call
            } else {
                outcome.state_lost = true;
                outcome.state_lost_reason = Some(match outcome.state_lost_reason.take() {
                    Some(now) => format!("{loss}; then {now}"),
                    None => loss,
                });
            }
        }
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        let mut sh = self.shared.lock();
        sh.running_call = None;
        sh.cancelled.remove(&call);
        sh.report.busy = false;
        outcome
    }

    fn finish_static(&self, call: u32, status: Status, diagnostic: String) -> Outcome {
        let mut sh = self.shared.lock();
        sh.cancelled.remove(&call);
        Outcome::static_result(status, sh.report.generation, diagnostic)
    }

    #[allow(clippy::too_many_arguments)]
    async fn execute_locked(
        &self,
        inner: &mut Inner,
        code: String,
        timeout_seconds: u32,
        call: u32,
        wake: &mut watch::Receiver<u64>,
        progress: Option<ProgressFn>,
    ) -> Outcome {
        let generation = || self.shared.lock().report.generation;
        if code.len() > MAX_CODE_BYTES {
            return Outcome::static_result(
                Status::Unavailable,
                generation(),
                format!("Code exceeds the {MAX_CODE_BYTES} byte limit."),
            );
        }
        let timeout_seconds = timeout_seconds.clamp(MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS);

        // A sandbox started with other mounts than the session's is replaced.
        let wanted = self.shared.lock().report.mounts.clone();
        if inner.worker.as_ref().is_some_and(|w| w.mounts != wanted) {
            inner.pending_loss = Some(REMOUNT_REASON.into());
            self.drop_worker(inner, "mounts_changed").await;
        }
        // A worker that died while idle is reported, not silently replaced.
        if let Some(w) = inner.worker.as_mut() {
            let killed_for = w.killed_for.lock().take();
            if let Some(why) = killed_for {
                inner.pending_loss = Some(format!("the sandbox was killed between executions: {why}"));
                self.drop_worker(inner, "worker_error").await;
            } else if let Ok(Some(status)) = w.child.try_wait() {
                let what = exit_text(Some(status));
                inner.pending_loss = Some(format!("the interpreter died while idle: the sandbox {what}"));
                self.drop_worker(inner, "worker_died_idle").await;
            }
        }
        let mut restarts = 0;
        while inner.worker.is_none() {
            let epoch = self.shared.lock().report.mount_epoch;
            if let Err(outcome) = self.start_worker(inner, call, wake).await {
                // A mode change killed the sandbox while it started: start
                // again with the new mounts (no code ran), a few times at most.
                let remounted = self.shared.lock().report.mount_epoch != epoch;
                if remounted && restarts < 3 && !self.is_cancelled(call) && !self.is_disposed() {
                    restarts += 1;
                    inner.pending_loss = Some(REMOUNT_REASON.into());
                    continue;
                }
                return *outcome;
            }
            // A change that came while it started found no process to kill
            // (only the wake, which the start consumed): start again.
            let wanted = self.shared.lock().report.mounts.clone();
            if inner.worker.as_ref().is_some_and(|w| w.mounts != wanted) {
                self.drop_worker(inner, "mounts_changed").await;
            }
        }
        let Some(dirs) = inner.dirs.clone() else {
            return Outcome::static_result(
                Status::WorkerError,
                generation(),
                "internal error: no session directory".into(),
            );
        };
        inner.exec_seq += 1;
        let seq = inner.exec_seq;
        self.shared.lock().report.executions = seq;
        let out_path = dirs.logs.join(format!("{seq:04}-out.log"));
        let err_path = dirs.logs.join(format!("{seq:04}-err.log"));
        let nonce = format!("{:016x}{:08x}", self.nonce_base, seq);
        let mut capture = Capture::new(frame::end_mark(&nonce), out_path.clone(), err_path.clone());
        let mut o = Outcome::static_result(Status::Ok, generation(), String::new());
        o.diagnostic = None;
        o.started = true;

        let Some(worker) = inner.worker.as_mut() else {
            return Outcome::static_result(Status::WorkerError, generation(), "internal error: no sandbox".into());
        };
        let guard = worker.guard.clone();
        discard_idle_output(worker).await;
        let b64 = &base64::engine::general_purpose::STANDARD;
        let request =
            Request::Exec { id: seq, code: b64.encode(code.as_bytes()), mark: b64.encode(frame::end_mark(&nonce)) };
        let deadline = tokio::time::Instant::from_std(Instant::now() + Duration::from_secs(timeout_seconds as u64));
        let result = match frame::encode(&request) {
            Err(e) => Err(Interrupt::Violation(format!("request could not be framed: {e}"))),
            Ok(bytes) => self.run_exec(worker, &bytes, seq, call, deadline, &mut capture, wake, progress).await,
        };
        match result {
            Ok((report, drained_ok)) => {
                apply_report(&mut o, report, &dirs.scratch);
                if let Err(why) = drained_ok {
                    // The worker misbehaved after its result: keep the result,
                    // but its interpreter is gone.
                    self.kill_worker(inner, &mut capture, "worker_error").await;
                    o.state_lost = true;
                    o.state_lost_reason = Some(format!("the worker failed right after the execution: {why}"));
                }
            }
            Err(interrupt) => {
                let (status, reason, diagnostic) = match &interrupt {
                    Interrupt::Timeout => (
                        Status::Timeout,
                        "timeout".to_string(),
                        format!("Execution exceeded the {timeout_seconds}s deadline; the sandbox was killed."),
                    ),
                    Interrupt::Cancelled => (
                        Status::Cancelled,
                        "cancelled".into(),
                        "Execution was cancelled; the sandbox was killed.".into(),
                    ),
                    Interrupt::Disposed => (
                        Status::Cancelled,
                        "session disposed".into(),
                        "The session was disposed while the code ran; the sandbox was killed.".into(),
                    ),
                    Interrupt::OutputLimit => (
                        Status::OutputLimit,
                        "output_limit".into(),
                        format!(
                            "Output exceeded the {} KiB per-execution capture budget; the sandbox was killed. The saved log is partial.",
                            OUTPUT_BUDGET_BYTES / 1024
                        ),
                    ),
                    Interrupt::Died => (Status::WorkerError, "worker_error".into(), String::new()),
                    Interrupt::Remounted => (
                        Status::WorkerError,
                        "permission mode or read roots changed".into(),
                        "The permission mode or read roots changed while the code ran; the sandbox was killed and \
                         the next execution starts with the new mounts."
                            .into(),
                    ),
                    Interrupt::Violation(m) => (
                        Status::WorkerError,
                        "worker_error".into(),
                        format!("Protocol violation: {m}. The sandbox was killed."),
                    ),
                };
                if matches!(interrupt, Interrupt::Died) {
                    // Let the sandbox exit by itself first, so that its exit
                    // status is the worker's and not our SIGKILL.
                    if let Some(w) = inner.worker.as_mut() {
                        if let Ok(Ok(status)) = timeout(DEATH_GRACE, w.child.wait()).await {
                            inner.exit_status = Some(status);
                        }
                    }
                }
                // The reply task or the guard may have killed it, and said why.
                let killed_for = inner.worker.as_ref().and_then(|w| w.killed_for.lock().take());
                let exit = self.kill_worker(inner, &mut capture, &reason).await;
                let (reason, diagnostic) = match (&interrupt, killed_for) {
                    (Interrupt::Died, Some(why)) => {
                        (why.clone(), format!("The sandbox was killed: {why}. Code is never replayed automatically."))
                    }
                    (Interrupt::Died, None) => (
                        reason,
                        format!(
                            "The worker died: the sandbox {}. Code is never replayed automatically.",
                            exit_text(exit)
                        ),
                    ),
                    _ => (reason, diagnostic),
                };
                o.status = status;
                o.state_lost = true;
                o.state_lost_reason = Some(reason);
                o.diagnostic = Some(diagnostic);
                o.output_limit_exceeded = matches!(interrupt, Interrupt::OutputLimit);
                o.log_complete = !o.output_limit_exceeded;
            }
        }
        if let Some(guard) = guard {
            // The names where protected entries live, now; the whole
            // project off the result's path (its notes reach the next result).
            o.notes.extend(guard.check_holders());
            if inner.worker.is_some() {
                tokio::task::spawn_blocking(move || guard.check_all_pending());
            }
        }
        o.notes.extend(self.notes.lock().take());
        if let Some(e) = &capture.log_error {
            let note = format!("Writing the log files failed: {e}");
            o.diagnostic = Some(match o.diagnostic.take() {
                Some(d) => format!("{d}\n{note}"),
                None => note,
            });
        }
        o.stdout = stream_text(&capture.stdout);
        o.stderr = stream_text(&capture.stderr);
        o.log_paths = LogFiles {
            stdout: (capture.stdout.total > 0).then_some(out_path),
            stderr: (capture.stderr.total > 0).then_some(err_path),
        };
        o
    }

    /// Send one exec request and follow it to its end. On success returns
    /// the worker's report and whether the post-result phase went cleanly.
    #[allow(clippy::too_many_arguments)]
    async fn run_exec(
        &self,
        w: &mut Worker,
        request: &[u8],
        seq: u64,
        call: u32,
        deadline: tokio::time::Instant,
        capture: &mut Capture,
        wake: &mut watch::Receiver<u64>,
        progress: Option<ProgressFn>,
    ) -> Result<(ExecReport, Result<(), String>), Interrupt> {
        let Worker { requests, replies, stdout, stderr, out_buf, err_buf, mounts, expecting, .. } = w;
        expecting.store(true, Ordering::Release);
        let mut report: Option<ExecReport> = None;
        let mut drained: Option<(bool, bool)> = None;
        let mut drain_until = deadline;
        let mut written = false;
        let begun = tokio::time::Instant::now();
        let mut tick = tokio::time::interval_at(begun + PROGRESS_EVERY, PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
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
                changed = wake.changed(), if running => {
                    if changed.is_err() || self.is_disposed() { return Err(Interrupt::Disposed); }
                    if self.is_cancelled(call) { return Err(Interrupt::Cancelled); }
                    if self.shared.lock().report.mounts != *mounts { return Err(Interrupt::Remounted); }
                }
                r = requests.write_all(request), if !written => {
                    if r.is_err() { return Err(Interrupt::Died); }
                    written = true;
                }
                _ = sleep_until(deadline), if running => return Err(Interrupt::Timeout),
                _ = sleep_until(drain_until), if !running => break,
                _ = tick.tick(), if running && progress.is_some() => {
                    if let Some(report) = &progress {
                        report(Progress {
                            elapsed_ms: begun.elapsed().as_millis() as u64,
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
                        drain_until = tokio::time::Instant::now() + DRAIN_CAP + DRAIN_SLACK;
                    }
                    Some(Ok(Reply::Drained { id, stdout: o, stderr: e })) if !running && id == seq => {
                        // Nothing more is due until the next request.
                        expecting.store(false, Ordering::Release);
                        drained = Some((o, e));
                    }
                    Some(Ok(other)) => {
                        let why = format!("unexpected {} frame", reply_kind(&other));
                        return match report { Some(r) => Ok((r, Err(why))), None => Err(Interrupt::Violation(why)) };
                    }
                    Some(Err(FrameError::Eof)) | None => {
                        if let Some(r) = report {
                            return Ok((r, Err("the worker exited".into())));
                        }
                        // The kill may come before its wake: a sandbox we
                        // killed reports why we killed it, not a death.
                        if self.is_disposed() { return Err(Interrupt::Disposed); }
                        if self.is_cancelled(call) { return Err(Interrupt::Cancelled); }
                        if self.shared.lock().report.mounts != *mounts { return Err(Interrupt::Remounted); }
                        return Err(Interrupt::Died);
                    }
                    Some(Err(e)) => {
                        let why = e.to_string();
                        return match report { Some(r) => Ok((r, Err(why))), None => Err(Interrupt::Violation(why)) };
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
        let Some(report) = report else { return Err(Interrupt::Violation("no result before the drain ended".into())) };
        Ok((report, Ok(())))
    }

    /// Probe the host and make the session directory (once each).
    async fn prepare(&self, inner: &mut Inner) -> Result<(Arc<Facts>, Dirs, PathBuf), String> {
        let facts = match &inner.facts {
            Some(f) => f.clone(),
            None => {
                let bwrap = probe::probe_bwrap().await?;
                let settings = Settings::from_env();
                let configured = self.opts.interpreter.clone().or(settings.interpreter);
                let interpreter = probe::resolve_interpreter(configured.as_deref())?;
                let venv = self.opts.python_packages.clone().or(settings.venv);
                let system_site = self.opts.system_site_packages.unwrap_or(settings.system_site);
                // The project and the runtime root: trees the sandbox can write.
                let runtime = self.opts.runtime_root.clone().unwrap_or_else(crate::rundir::default_runtime_root);
                let writable: Vec<(PathBuf, PathBuf)> = [self.opts.project_dir.clone(), runtime]
                    .into_iter()
                    .filter_map(|given| std::fs::canonicalize(&given).ok().map(|c| (given, c)))
                    .collect();
                let python = probe::python_env_from_host(venv.as_deref(), system_site, &writable);
                let code_key = crate::bytecode::key(&interpreter.path, WORKER_SOURCE);
                let facts = Arc::new(Facts { bwrap, interpreter, merged_usr: probe::merged_usr(), python, code_key });
                inner.facts = Some(facts.clone());
                let mut sh = self.shared.lock();
                sh.report.bwrap = Some(facts.bwrap.clone());
                sh.report.site_dirs = facts.python.site_dirs.clone();
                sh.report.python_notes = facts.python.notes.clone();
                drop(sh);
                facts
            }
        };
        let project = std::fs::canonicalize(&self.opts.project_dir)
            .map_err(|e| format!("Working directory {} is not accessible: {e}", self.opts.project_dir.display()))?;
        let dirs = match &inner.dirs {
            Some(d) => d.clone(),
            None => {
                let d = crate::rundir::make_dirs(self.opts.runtime_root.as_deref(), WORKER_SOURCE)
                    .map_err(|e| e.to_string())?;
                inner.dirs = Some(d.clone());
                self.shared.lock().report.dirs = Some(d.clone());
                self.sync_live();
                d
            }
        };
        Ok((facts, dirs, project))
    }

    /// Make the session's interpreter: the spare when one is ready for the
    /// current mounts, else a cold start that waits for the ready frame.
    async fn start_worker(
        &self,
        inner: &mut Inner,
        call: u32,
        wake: &mut watch::Receiver<u64>,
    ) -> Result<(), Box<Outcome>> {
        let generation = self.shared.lock().report.generation;
        let (facts, dirs, project) = self.prepare(inner).await.map_err(|msg| {
            self.shared.lock().report.availability = Availability::Unavailable(msg.clone());
            Box::new(Outcome::static_result(Status::Unavailable, generation, msg))
        })?;
        let mounts = self.shared.lock().report.mounts.clone();
        let bump = || {
            let mut sh = self.shared.lock();
            sh.report.generation += 1;
            sh.report.generation
        };
        let mut spare = self.take_spare(&mounts);
        // A writable spare was planned while the last sandbox could still
        // write the project: it is used only if the project still holds
        // exactly what it protected.
        if let Some(guard) = spare.as_ref().and_then(|s| s.guard.clone()) {
            let fits = tokio::task::spawn_blocking(move || guard.still_matches()).await.unwrap_or(false);
            if !fits {
                if let Some(stale) = spare.take() {
                    reap(*stale);
                }
            }
        }
        if let Some(mut spare) = spare {
            self.notes.lock().extend(std::mem::take(&mut spare.plan_notes));
            self.shared.lock().active_guard = spare.guard.clone().map(|g| (g, spare.init_pid));
            bump();
            self.set_active(Some(spare.pid));
            self.shared.lock().report.worker_code = Some(spare.code);
            inner.worker = Some(*spare);
            return Ok(());
        }
        let generation = bump();
        let start = Start { facts: &facts, dirs: &dirs, project, mounts, role: Role::Active, call: Some(call) };
        match self.launch(start, wake).await {
            Ok(mut worker) => {
                self.notes.lock().extend(std::mem::take(&mut worker.plan_notes));
                self.shared.lock().active_guard = worker.guard.clone().map(|g| (g, worker.init_pid));
                self.sync_live();
                inner.worker = Some(worker);
                inner.start_failed = false;
                Ok(())
            }
            Err((status, msg)) => {
                inner.start_failed = true;
                self.shared.lock().report.last_reset_reason = Some("startup_failure".into());
                Err(Box::new(Outcome::static_result(status, generation, msg)))
            }
        }
    }

    fn set_active(&self, pid: Option<i32>) {
        {
            let mut sh = self.shared.lock();
            sh.worker_pid = pid;
            sh.report.worker_running = pid.is_some();
        }
        self.sync_live();
    }

    /// Tell the exit-cleanup registry what this session has running.
    fn sync_live(&self) {
        let sh = self.shared.lock();
        let pids = sh.worker_pid.into_iter().chain(sh.spare_pid).collect();
        let dir = sh.report.dirs.as_ref().map(|d| d.root.clone());
        // At process exit the active sandbox's project is checked once its
        // processes are gone, as after any kill.
        let after: Vec<crate::rundir::AfterKill> = sh
            .active_guard
            .clone()
            .map(|(guard, init)| {
                let notes = self.notes.clone();
                std::sync::Arc::new(move || settle_and_check(&guard, init, &notes)) as crate::rundir::AfterKill
            })
            .into_iter()
            .collect();
        drop(sh);
        live_update(self.id, pids, dir, after);
    }

    /// Start one sandbox and wait for it to report ready: from the stored
    /// bytecode when there is one, else from source (asking the worker for
    /// its compiled form). Bytecode whose worker failed (exited, or sent
    /// something wrong) is deleted and the start is made again from source;
    /// a cancel or the startup deadline is not the image's doing.
    async fn launch(&self, start: Start<'_>, wake: &mut watch::Receiver<u64>) -> Result<Worker, (Status, String)> {
        let runtime_root = start.dirs.root.parent().unwrap_or(&start.dirs.root);
        let stored = start.facts.code_key.and_then(|key| crate::bytecode::cached(runtime_root, key));
        if let Some(pyc) = stored {
            let began = Instant::now();
            match self.launch_once(&start, wake, WorkerCode::Bytecode(pyc.clone())).await {
                Err((status, why)) if status != Status::Cancelled && began.elapsed() < STARTUP_DEADLINE => {
                    tracing::warn!("stored worker bytecode {} did not start ({why}); deleted", pyc.display());
                    let _ = std::fs::remove_file(&pyc);
                }
                done => return done,
            }
        }
        let code = WorkerCode::Source { path: start.dirs.worker_file.clone(), emit: start.facts.code_key.is_some() };
        self.launch_once(&start, wake, code).await
    }

    /// Start one sandbox running `code` and wait for it to report ready.
    async fn launch_once(
        &self,
        start: &Start<'_>,
        wake: &mut watch::Receiver<u64>,
        code: WorkerCode,
    ) -> Result<Worker, (Status, String)> {
        let Start { facts, dirs, project, mounts, role, call } = start;
        let (role, call) = (*role, *call);
        // A project that cannot be protected is mounted read-only for this
        // sandbox, and the first result says why.
        // The settings of this start, read once; git must never trust a
        // file under this session's runtime root (scratch is there).
        let mut settings = Settings::from_env();
        let runtime_root = dirs.root.parent().unwrap_or(&dirs.root).to_path_buf();
        settings.git.untrusted.push(runtime_root);
        let sizes = settings.tmpfs.clone();
        let mut plan_notes = Vec::new();
        let plan = if mounts.workspace_writable {
            let (root, sink, tainted) = (project.clone(), self.notes.clone(), self.tainted.clone());
            let planned = tokio::task::spawn_blocking(move || {
                let s = settings;
                protected::plan(&root, &s.protected, s.scan, &s.git, sink, tainted)
            })
            .await;
            match planned {
                Ok(Ok(plan)) => Some(plan),
                Ok(Err(e)) => {
                    plan_notes.push(format!(
                        "/workspace is mounted READ-ONLY for this sandbox although the permission mode allows writes: {e}."
                    ));
                    None
                }
                Err(e) => return Err((Status::WorkerError, format!("The protected paths could not be planned: {e}"))),
            }
        } else {
            None
        };
        let writable = plan.is_some();
        if matches!(role, Role::Spare(_)) && self.is_disposed() {
            return Err((Status::Cancelled, "the session was disposed".into()));
        }
        let (binds, guard) = match plan {
            Some(p) => {
                plan_notes.extend(p.notes);
                (p.binds, Some(Arc::new(p.guard)))
            }
            None => (Vec::new(), None),
        };
        let mut mount_fds = Vec::new();
        let mut protected_binds = Vec::new();
        for b in binds {
            protected_binds.push(FdBind {
                fd: MOUNT_FD_BASE + mount_fds.len() as i32,
                dest: Path::new(WORKSPACE).join(&b.rel),
                read_only: b.read_only,
            });
            mount_fds.push(b.fd);
        }
        // Package directories inside the project (a venv there) or the
        // scratch directory are trees the sandbox may have written: mounted
        // from fds opened beneath them, never by path.
        let mut python_mounts = Vec::new();
        let mut python_fd_mounts = Vec::new();
        for dir in &facts.python.mounts {
            let tree_root = [project.as_path(), dirs.scratch.as_path()].into_iter().find(|r| dir.starts_with(r));
            let Some(root) = tree_root else {
                python_mounts.push(dir.clone());
                continue;
            };
            let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
            let opened = Tree::open(root).and_then(|t| t.dir(rel));
            match opened {
                Ok(fd) => {
                    python_fd_mounts.push(FdBind {
                        fd: MOUNT_FD_BASE + mount_fds.len() as i32,
                        dest: dir.clone(),
                        read_only: true,
                    });
                    mount_fds.push(fd);
                }
                Err(e) => tracing::warn!("{} not mounted: {e}", dir.display()),
            }
        }
        let sizes = sizes.map_err(|e| (Status::Unavailable, e))?;
        let spec = SandboxSpec {
            tmp_bytes: sizes.tmp,
            shm_bytes: sizes.shm,
            protected: protected_binds,
            project_dir: project.clone(),
            interpreter: facts.interpreter.path.clone(),
            interpreter_mounts: facts.interpreter.mounts.clone(),
            merged_usr: facts.merged_usr,
            workspace_writable: writable,
            scratch_dir: dirs.scratch.clone(),
            worker: code.clone(),
            read_roots: mounts.read_roots.clone(),
            python_mounts,
            python_fd_mounts,
            nofile: (crate::spawn::nofile_for(mount_fds.len()) > RLIMIT_NOFILE).then_some(RLIMIT_NOFILE),
            worker_limits: worker_limits(),
            site_dirs: facts.python.site_dirs.clone(),
        };
        let bpf = seccomp::bpf_memfd()
            .map_err(|e| (Status::WorkerError, format!("The seccomp filter could not be built: {e}")))?;
        let spawned = spawn_sandbox(&facts.bwrap.path, &bwrap_argv(&spec), bpf, mount_fds)
            .map_err(|e| (Status::WorkerError, format!("bubblewrap could not be started: {e}")))?;
        // Two frames in flight at most: a flood waits on the pipe. A frame
        // that no start or request asked for kills the sandbox at once.
        let (tx, rx) = mpsc::channel(2);
        let mut reader = spawned.replies;
        let expecting = Arc::new(AtomicBool::new(true));
        let killed_for: protected::KilledFor = Arc::default();
        let (expect, killed, group) = (expecting.clone(), killed_for.clone(), spawned.pid);
        if let Some(g) = &guard {
            g.arm(spawned.pid, killed_for.clone());
        }
        tokio::spawn(async move {
            loop {
                let item = frame::read_frame(&mut reader).await.and_then(|body| frame::decode_reply(&body));
                let end = matches!(
                    item,
                    Err(FrameError::Eof
                        | FrameError::Truncated { .. }
                        | FrameError::Io { .. }
                        | FrameError::Oversize { .. })
                );
                if !end && !expect.load(Ordering::Acquire) {
                    tracing::warn!("sandbox {group} sent a frame while no execution ran; killed");
                    *killed.lock() = Some("it sent a protocol frame while no execution ran".into());
                    kill_group(group);
                    break;
                }
                if tx.send(item).await.is_err() || end {
                    break;
                }
            }
        });
        let mut worker = Worker {
            child: spawned.child,
            pid: spawned.pid,
            requests: spawned.requests,
            replies: rx,
            expecting,
            killed_for,
            stdout: Some(spawned.stdout),
            stderr: Some(spawned.stderr),
            out_buf: vec![0; 64 * 1024],
            err_buf: vec![0; 64 * 1024],
            mounts: mounts.clone(),
            guard,
            _watch: None,
            init_pid: None,
            plan_notes,
            code: if matches!(code, WorkerCode::Bytecode(_)) { "bytecode" } else { "source" },
        };
        let code_kind = worker.code;
        let own_pid = worker.pid;
        let record = |pid: Option<i32>| match role {
            Role::Active => {
                self.set_active(pid);
                self.shared.lock().report.worker_code = pid.map(|_| code_kind);
            }
            Role::Spare(ticket) => {
                let ours = self.spare.is_current(ticket);
                let mut sh = self.shared.lock();
                match pid {
                    Some(pid) if ours => sh.spare_pid = Some(pid),
                    None if sh.spare_pid == Some(own_pid) => sh.spare_pid = None,
                    _ => {}
                }
                drop(sh);
                self.sync_live();
            }
        };
        record(Some(own_pid));
        let emit = matches!(code, WorkerCode::Source { emit: true, .. });
        match self.await_ready(&mut worker, call, wake, emit).await {
            Ok((version, image)) => {
                if let (Some(image), Some(key)) = (image, facts.code_key) {
                    let runtime_root = dirs.root.parent().unwrap_or(&dirs.root);
                    if let Err(e) = crate::bytecode::store(runtime_root, key, &image) {
                        tracing::warn!("{e}");
                    }
                }
                worker.init_pid = child_of(worker.pid);
                if let Some(guard) = worker.guard.clone() {
                    let (stop, stopped) = tokio::sync::oneshot::channel();
                    tokio::spawn(protected::watch(guard, stopped));
                    worker._watch = Some(stop);
                }
                let mut sh = self.shared.lock();
                sh.report.availability = Availability::Available;
                sh.report.runtime_version = Some(version);
                Ok(worker)
            }
            Err(failure) => {
                kill_group(worker.pid);
                let _ = timeout(CLEANUP_DEADLINE, worker.child.wait()).await;
                record(None);
                Err(failure)
            }
        }
    }

    /// Take the ready spare if it was made for `mounts` and is still alive.
    fn take_spare(&self, mounts: &MountConfig) -> Option<Box<Worker>> {
        let mut w = self.spare.take()?;
        self.shared.lock().spare_pid = None;
        if w.mounts != *mounts || !matches!(w.child.try_wait(), Ok(None)) {
            reap(*w);
            self.sync_live();
            return None;
        }
        Some(w)
    }

    /// Kill the spare (mounts changed, or the session ends).
    fn discard_spare(&self) {
        if let Some(w) = self.spare.clear() {
            reap(*w);
        }
        let pid = self.shared.lock().spare_pid.take();
        if let Some(pid) = pid {
            kill_group(pid); // a spare still starting
        }
        self.sync_live();
    }

    /// Start a spare in the background if prewarming is on and none exists.
    fn refill_spare(&self, inner: &Inner) {
        let (Some(facts), Some(dirs)) = (inner.facts.clone(), inner.dirs.clone()) else { return };
        if inner.start_failed {
            return;
        }
        {
            let sh = self.shared.lock();
            if !sh.report.prewarm || sh.report.disposed {
                return;
            }
        }
        let Some(ticket) = self.spare.begin() else { return };
        let Some(me) = self.weak.upgrade() else {
            self.spare.abandon(ticket);
            return;
        };
        tokio::spawn(async move {
            // Forking the host process costs a few milliseconds of both
            // cores: let the result that triggered this reach JS first.
            tokio::time::sleep(SPARE_DELAY).await;
            let Ok(project) = std::fs::canonicalize(&me.opts.project_dir) else {
                me.spare.abandon(ticket);
                return;
            };
            let mounts = me.shared.lock().report.mounts.clone();
            let mut wake = me.wake.subscribe();
            let made = if me.spare.is_current(ticket) {
                let start = Start {
                    facts: &facts,
                    dirs: &dirs,
                    project,
                    mounts: mounts.clone(),
                    role: Role::Spare(ticket),
                    call: None,
                };
                me.launch(start, &mut wake).await
            } else {
                Err((Status::Cancelled, "discarded before it started".into()))
            };
            let current = {
                let sh = me.shared.lock();
                !sh.report.disposed && sh.report.mounts == mounts
            };
            let unused = match made {
                Ok(w) if current => me.spare.fill(ticket, w).err(),
                Ok(w) => {
                    me.spare.abandon(ticket);
                    Some(w)
                }
                Err(_) => {
                    me.spare.abandon(ticket);
                    None
                }
            };
            if let Some(w) = unused {
                let mut sh = me.shared.lock();
                if sh.spare_pid == Some(w.pid) {
                    sh.spare_pid = None;
                }
                drop(sh);
                reap(w);
            }
            me.sync_live();
        });
    }

    /// Wait for the ready frame, collecting stderr for the diagnostic.
    /// With `emit`, the worker's compiled form may come first; it is
    /// returned (checked) with the interpreter version.
    async fn await_ready(
        &self,
        w: &mut Worker,
        call: Option<u32>,
        wake: &mut watch::Receiver<u64>,
        emit: bool,
    ) -> Result<(String, Option<Vec<u8>>), (Status, String)> {
        let deadline = tokio::time::Instant::now() + STARTUP_DEADLINE;
        let mut diag: Vec<u8> = Vec::new();
        let mut image: Option<Vec<u8>> = None;
        let failed = |why: String, diag: &[u8]| {
            let text = String::from_utf8_lossy(diag).trim().to_string();
            let mut msg = format!("The sandbox did not start: {why}.");
            if !text.is_empty() {
                msg.push_str(&format!("\nIts error output: {text}"));
            }
            if text.contains("namespace") || text.contains("uid map") || text.contains("Operation not permitted") {
                msg.push_str(
                    "\nCommon causes: unprivileged user namespaces are disabled by the kernel or a container \
                     runtime (sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces, or an AppArmor \
                     policy such as kernel.apparmor_restrict_unprivileged_userns).",
                );
            }
            msg.push_str(" The python tool never runs Python outside the sandbox.");
            (Status::WorkerError, msg)
        };
        loop {
            let Worker { replies, stdout, stderr, err_buf, out_buf, .. } = w;
            tokio::select! {
                biased;
                changed = wake.changed() => {
                    let obsolete = call.is_none() && self.shared.lock().report.mounts != w.mounts;
                    if changed.is_err() || self.is_disposed() || call.is_some_and(|c| self.is_cancelled(c)) || obsolete {
                        return Err((Status::Cancelled, "Cancelled while the sandbox was starting; it was killed before any code ran.".into()));
                    }
                }
                _ = sleep_until(deadline) => {
                    return Err(failed(format!("the worker did not report ready within {}s", STARTUP_DEADLINE.as_secs()), &diag));
                }
                msg = replies.recv() => match msg {
                    Some(Ok(Reply::Ready { protocol, runtime_version, site_notes })) if protocol == PROTOCOL_VERSION => {
                        w.expecting.store(false, Ordering::Release);
                        if !site_notes.is_empty() {
                            let mut sh = self.shared.lock();
                            for note in site_notes {
                                if !sh.report.python_notes.contains(&note) {
                                    sh.report.python_notes.push(note);
                                }
                            }
                        }
                        return Ok((runtime_version, image));
                    }
                    Some(Ok(Reply::Code { pyc })) if emit && image.is_none() => match crate::bytecode::decode(&pyc) {
                        Ok(bytes) => image = Some(bytes),
                        Err(why) => return Err(failed(why, &diag)),
                    },
                    Some(Ok(Reply::Ready { protocol, .. })) => {
                        return Err(failed(format!("the worker speaks protocol {protocol}, not {PROTOCOL_VERSION}"), &diag));
                    }
                    Some(Ok(Reply::Error { message, .. })) => return Err(failed(message, &diag)),
                    Some(Ok(other)) => return Err(failed(format!("unexpected {} frame before ready", reply_kind(&other)), &diag)),
                    Some(Err(FrameError::Eof)) | None => {
                        // Killed by a dispose or a cancel whose wake is still on its way.
                        if self.is_disposed() || call.is_some_and(|c| self.is_cancelled(c)) {
                            return Err((Status::Cancelled, "Cancelled while the sandbox was starting; it was killed before any code ran.".into()));
                        }
                        // Collect what bwrap or Python said on the way out.
                        let _ = timeout(Duration::from_millis(500), async {
                            while let Some(n) = read_opt(stderr, err_buf).await {
                                if n == 0 { break; }
                                diag.extend_from_slice(&err_buf[..n.min(IDLE_STDERR_BYTES.saturating_sub(diag.len()))]);
                            }
                        }).await;
                        let exit = timeout(CLEANUP_DEADLINE, w.child.wait()).await.ok().and_then(|r| r.ok());
                        return Err(failed(format!("the sandbox {}", exit_text(exit)), &diag));
                    }
                    Some(Err(e)) => return Err(failed(format!("bad frame: {e}"), &diag)),
                },
                n = read_opt(stderr, err_buf) => match n {
                    Some(n) if n > 0 => diag.extend_from_slice(&err_buf[..n.min(IDLE_STDERR_BYTES.saturating_sub(diag.len()))]),
                    _ => *stderr = None,
                },
                n = read_opt(stdout, out_buf) => if !matches!(n, Some(n) if n > 0) { *stdout = None },
            }
        }
    }

    /// Kill the sandbox after an interrupted execution, keep the output that
    /// was already written, and wait (bounded) for everything to exit.
    async fn kill_worker(
        &self,
        inner: &mut Inner,
        capture: &mut Capture,
        reason: &str,
    ) -> Option<std::process::ExitStatus> {
        let mut w = inner.worker.take()?;
        kill_group(w.pid);
        let Worker { stdout, stderr, out_buf, err_buf, .. } = &mut w;
        let _ = timeout(CLEANUP_DEADLINE, async {
            while stdout.is_some() || stderr.is_some() {
                tokio::select! {
                    n = read_opt(stdout, out_buf) => take_read(capture, Stream::Stdout, stdout, out_buf, n),
                    n = read_opt(stderr, err_buf) => take_read(capture, Stream::Stderr, stderr, err_buf, n),
                }
            }
        })
        .await;
        let exit = timeout(CLEANUP_DEADLINE, w.child.wait()).await.ok().and_then(|r| r.ok());
        check_after_kill(&w, &self.notes).await;
        self.after_worker_gone(reason);
        inner.exit_status.take().or(exit)
    }

    /// Drop a worker that is already dead or unwanted.
    async fn drop_worker(&self, inner: &mut Inner, reason: &str) {
        if let Some(mut w) = inner.worker.take() {
            kill_group(w.pid);
            let _ = timeout(CLEANUP_DEADLINE, w.child.wait()).await;
            check_after_kill(&w, &self.notes).await;
        }
        self.after_worker_gone(reason);
    }

    fn after_worker_gone(&self, reason: &str) {
        let mut sh = self.shared.lock();
        sh.worker_pid = None;
        sh.active_guard = None;
        sh.report.worker_running = false;
        sh.report.worker_code = None;
        sh.report.last_reset_reason = Some(reason.to_string());
        drop(sh);
        self.sync_live();
    }

    /// Change the mounts. An effective change kills the running sandbox at
    /// once (a writable mount must not outlive the mode that granted it);
    /// the next execution starts with the new mounts and reports the loss.
    /// Returns `Some(killed)` when something changed, `killed` telling
    /// whether an interpreter was discarded.
    pub fn set_mounts(&self, mounts: MountConfig) -> Option<bool> {
        let mut sh = self.shared.lock();
        sh.report.permissions_seen = true;
        if sh.report.mounts == mounts {
            return None;
        }
        sh.report.mounts = mounts;
        sh.report.mount_epoch += 1;
        let pid = sh.worker_pid;
        let guard = sh.active_guard.clone();
        drop(sh);
        self.discard_spare();
        if let Some(pid) = pid {
            kill_group(pid);
        }
        // The killed sandbox may have left protected names: check now, not
        // at the next execution (this may run on the JS thread).
        if let Some((guard, init)) = guard {
            let notes = self.notes.clone();
            let _ = std::thread::Builder::new()
                .name("pps-guard".into())
                .spawn(move || settle_and_check(&guard, init, &notes));
        }
        self.wake.send_modify(|n| *n += 1);
        Some(pid.is_some())
    }

    /// Remember that the user denied reads under `dir`.
    pub fn record_denied(&self, dir: PathBuf) {
        let mut sh = self.shared.lock();
        if !sh.report.denied_reads.contains(&dir) {
            sh.report.denied_reads.push(dir);
        }
    }

    pub fn project_dir(&self) -> &Path {
        &self.opts.project_dir
    }

    /// Kill the sandbox and discard interpreter state; scratch is kept.
    /// Returns the session directories and notes for the user.
    pub async fn reset(&self) -> (Option<Dirs>, Vec<String>) {
        let mut inner = self.ops.lock().await;
        self.drop_worker(&mut inner, "explicit_reset").await;
        inner.pending_loss = None;
        self.refill_spare(&inner);
        (inner.dirs.clone(), self.notes.lock().take())
    }

    /// Kill the sandbox and delete the session's directories. Idempotent;
    /// later calls answer `unavailable`. Returns notes for the user (what
    /// the last checks of the project found).
    pub async fn dispose(&self, reason: &str) -> Vec<String> {
        let pid = {
            let mut sh = self.shared.lock();
            sh.report.disposed = true;
            sh.worker_pid
        };
        // Kill first so that a running execution ends at once.
        if let Some(pid) = pid {
            kill_group(pid);
        }
        self.discard_spare();
        self.wake.send_modify(|n| *n += 1);
        let mut inner = self.ops.lock().await;
        self.drop_worker(&mut inner, reason).await;
        if let Some(dirs) = inner.dirs.take() {
            let _ = crate::beneath::remove_tree(&dirs.root);
        }
        self.shared.lock().report.dirs = None;
        self.sync_live();
        self.notes.lock().take()
    }

    pub fn sandbox_paths() -> (&'static str, &'static str) {
        (WORKSPACE, SCRATCH)
    }
}

fn reply_kind(r: &Reply) -> &'static str {
    match r {
        Reply::Ready { .. } => "ready",
        Reply::Result(_) => "result",
        Reply::Drained { .. } => "drained",
        Reply::Code { .. } => "code",
        Reply::Error { .. } => "error",
    }
}

/// Kill a sandbox nobody waits for and collect its exit on a plain thread
/// (this may run on the JS thread, outside any async runtime), so that no
/// zombie is left behind.
fn reap(w: Worker) {
    kill_group(w.pid);
    let pid = nix::unistd::Pid::from_raw(w.pid);
    drop(w);
    let _ = std::thread::Builder::new().name("pps-reap".into()).spawn(move || {
        let _ = nix::sys::wait::waitpid(pid, None);
    });
}

fn apply_report(o: &mut Outcome, r: ExecReport, scratch: &Path) {
    let (images, notes) = crate::images::collect(scratch, r.images);
    o.images = images;
    o.notes.extend(notes);
    o.notes.extend(r.notes.into_iter().take(8).map(|n| bound_bytes(n, 1024).0));
    o.status = match r.status {
        WorkerStatus::Ok => Status::Ok,
        WorkerStatus::RuntimeError => Status::RuntimeError,
        WorkerStatus::PermissionNeeded => Status::PermissionNeeded,
    };
    // The worker bounds these; re-bound defensively so that an oversized
    // field is truncated, never turned into a failure.
    o.repr_truncated = r.repr_truncated;
    o.repr = r.repr.map(|s| {
        let (s, cut) = bound_bytes(s, MAX_REPR_BYTES + 64);
        o.repr_truncated |= cut;
        s
    });
    o.exception = r.exception.map(|e| ExceptionText {
        type_name: bound_bytes(e.type_name, 256).0,
        message: bound_bytes(e.message, MAX_MESSAGE_BYTES + 64).0,
        traceback: bound_bytes(e.traceback, MAX_TRACEBACK_BYTES + 64).0,
    });
    o.permission_path = r.path.filter(|_| o.status == Status::PermissionNeeded);
    o.permission_is_dir = r.path_is_dir;
}

fn bound_bytes(mut s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("...[truncated]");
    (s, true)
}

fn stream_text(e: &crate::capture::Excerpt) -> StreamText {
    let (head, omitted, tail) = e.parts();
    StreamText { head, omitted, tail, total: e.total }
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

/// Drop whatever background processes wrote while no execution ran. Polls
/// each read once: no timer, no wait when the pipes are empty.
async fn discard_idle_output(w: &mut Worker) {
    let Worker { stdout, stderr, out_buf, .. } = w;
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for stream in [stdout.as_mut().map(|s| s as &mut (dyn AsyncRead + Unpin + Send)), stderr.as_mut().map(|s| s as _)]
        .into_iter()
        .flatten()
    {
        loop {
            let mut buf = tokio::io::ReadBuf::new(out_buf);
            match std::pin::Pin::new(&mut *stream).poll_read(&mut cx, &mut buf) {
                std::task::Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                _ => break,
            }
        }
    }
}

/// The first child of `pid` (bubblewrap's: the pid namespace's init).
fn child_of(pid: i32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Whether `pid` has exited (gone, or a zombie).
fn exited(pid: i32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2)).copied();
            matches!(state, Some(b'Z' | b'X'))
        }
    }
}

/// After a writable sandbox was killed: wait (bounded) until its pid
/// namespace is empty, so that no process of it can still create a name,
/// then check the whole project for protected names it left.
async fn check_after_kill(w: &Worker, notes: &protected::Notes) {
    let Some(guard) = w.guard.clone() else { return };
    let (init, notes) = (w.init_pid, notes.clone());
    let _ = tokio::task::spawn_blocking(move || settle_and_check(&guard, init, &notes)).await;
}

/// Blocking: wait for the killed sandbox's init to exit (the kernel ends
/// every other process of the namespace before it does), then walk the
/// project afresh.
fn settle_and_check(guard: &Guard, init: Option<i32>, notes: &protected::Notes) {
    if let Some(init) = init {
        let until = Instant::now() + CLEANUP_DEADLINE;
        while !exited(init) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let found = guard.check_all();
    notes.lock().extend(found);
}
