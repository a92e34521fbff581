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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::bwrap::{SCRATCH, WORKSPACE};
use crate::capture::Capture;
use crate::frame;
use crate::launch::{Facts, Start};
use crate::limits::*;
use crate::options::Settings;
use crate::outcome::{
    apply_report, exit_text, interruption, recovered_text, start_failure, with_oom, LogFiles, OomKill, Outcome,
    ResetReason, Status, StreamText,
};
pub use crate::outcome::{Progress, ProgressFn};
pub use crate::permissions::MountConfig;
use crate::protected::{self, Guard};
pub use crate::rundir::{cleanup_all, default_runtime_root, Dirs};
use crate::rundir::{live_update, random_u64};
use crate::spare::Spare;
use crate::spawn::kill_group;
use crate::worker::{Call, Halt, Interrupt, Stop, Worker};

pub use crate::launch::WORKER_SOURCE;
pub use crate::options::{SessionOptions, PREWARM_ENV};

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

struct Inner {
    worker: Option<Worker>,
    facts: Option<Arc<Facts>>,
    dirs: Option<Dirs>,
    exec_seq: u64,
    /// State loss that happened between calls, told by the next result.
    pending_loss: Option<String>,
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
    /// How much /scratch holds (see `scratch`).
    scratch: Arc<crate::scratch::ScratchWatch>,
}

/// Where execution `seq` logs its streams.
fn log_paths(dirs: &Dirs, seq: u64) -> (PathBuf, PathBuf) {
    (dirs.logs.join(format!("{seq:04}-out.log")), dirs.logs.join(format!("{seq:04}-err.log")))
}

const DISPOSED: &str = "The python session was disposed; no interpreter is available.";
const REMOUNT_REASON: &str = "the sandbox was restarted because the permission mode or read roots changed";

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl Session {
    pub fn new(opts: SessionOptions) -> Arc<Self> {
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let prewarm = opts.prewarm.unwrap_or_else(|| Settings::from_env().prewarm);
        let report = StatusReport::new(opts.project_dir.clone(), opts.mounts.clone(), prewarm);
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
            scratch: Arc::default(),
        })
    }

    /// A snapshot for `status`; starts nothing and never waits.
    pub fn status(&self) -> StatusReport {
        let spare = self.spare.state();
        let mut report = self.shared.lock().report.clone();
        report.spare = spare;
        report.rollback = self.opts.rollback.unwrap_or_else(|| Settings::from_env().rollback);
        report.scratch = self.scratch.last();
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
                outcome.lost_before = Some(loss.clone());
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
            self.drop_worker(inner, ResetReason::MountsChanged).await;
        }
        // A worker that died while idle is reported, not silently replaced.
        if let Some(w) = inner.worker.as_mut() {
            if let Some(why) = w.take_killed_for() {
                inner.pending_loss = Some(format!("the sandbox was killed between executions: {why}"));
                self.drop_worker(inner, ResetReason::WorkerError).await;
            } else if w.keeper() && w.interpreter_gone() {
                // The sandbox is still there: a fresh interpreter in it.
                let oom = w.oom_note(true).map(|n| format!(" ({n})")).unwrap_or_default();
                inner.pending_loss = Some(format!("the interpreter died while idle{oom}"));
                if w.recover(None, true).await.is_ok() {
                    let mut sh = self.shared.lock();
                    sh.report.generation += 1;
                    sh.report.last_reset_reason = Some(ResetReason::DiedIdle);
                } else {
                    self.drop_worker(inner, ResetReason::DiedIdle).await;
                }
            } else if let Some(status) = w.exited() {
                let what = exit_text(Some(status));
                let oom = w.oom_note(true).map(|n| format!(" ({n})")).unwrap_or_default();
                inner.pending_loss = Some(format!("the interpreter died while idle: the sandbox {what}{oom}"));
                self.drop_worker(inner, ResetReason::DiedIdle).await;
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
                self.drop_worker(inner, ResetReason::MountsChanged).await;
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
        let (out_path, err_path) = log_paths(&dirs, seq);
        let nonce = format!("{:016x}{:08x}", self.nonce_base, seq);
        let mut capture = Capture::new(frame::end_mark(&nonce), out_path.clone(), err_path.clone());
        let mut o = Outcome::static_result(Status::Ok, generation(), String::new());
        o.diagnostic = None;
        o.started = true;

        let Some(worker) = inner.worker.as_mut() else {
            return Outcome::static_result(Status::WorkerError, generation(), "internal error: no sandbox".into());
        };
        let guard = worker.guard.clone();
        let deadline = tokio::time::Instant::from_std(Instant::now() + Duration::from_secs(timeout_seconds as u64));
        let mounts = worker.mounts.clone();
        let check = self.halt_check(Some(call), mounts);
        let mut stop = Stop { wake, check: &check };
        let mark = frame::end_mark(&nonce);
        let call = Call { seq, code: &code, mark: &mark, deadline, progress };
        let result = worker.exec(call, &mut capture, &mut stop).await;
        if worker.took_point() {
            self.shared.lock().report.last_rollback_point = Some(std::time::SystemTime::now());
        }
        match result {
            Ok(done) => {
                apply_report(&mut o, done.report, &dirs.scratch);
                // Processes the code started that the memory cap ended.
                o.notes.extend(inner.worker.as_mut().and_then(|w| w.oom_note(false)));
                if let Err(why) = done.after {
                    // The worker misbehaved after its result: keep the result,
                    // but its interpreter is gone.
                    self.kill_worker(inner, Some(&mut capture), ResetReason::WorkerError).await;
                    o.state_lost = true;
                    o.state_lost_reason = Some(format!("the worker failed right after the execution: {why}"));
                }
            }
            Err(interrupt) => {
                // In a keeper layout the sandbox stays: the interpreter is
                // rolled back (or replaced) and every other process killed.
                let kept = !matches!(interrupt, Interrupt::Halted(Halt::Disposed | Halt::Remounted));
                let killed_for = inner.worker.as_ref().and_then(|w| w.take_killed_for());
                // A memory cap the kernel enforced says so (and whom it
                // killed), read before the recovery kills the rest. The
                // interpreter it ended may be noticed only at the deadline,
                // when processes it started hold its pipe.
                let oom = inner.worker.as_mut().and_then(|w| {
                    let died = interrupt == Interrupt::Died || w.interpreter_gone();
                    let note = w.oom_note(died)?;
                    Some(if died { OomKill::Interpreter(note) } else { OomKill::Others(note) })
                });
                let recovered = match inner.worker.as_mut() {
                    Some(w) if kept && killed_for.is_none() && w.keeper() => {
                        Some(w.recover(Some(&mut capture), false).await)
                    }
                    _ => None,
                };
                match recovered {
                    Some(Ok(recovery)) => {
                        let r = recovered_text(&interrupt, timeout_seconds, &recovery, oom.as_ref());
                        if r.state_lost {
                            self.shared.lock().report.generation += 1;
                            o.generation = generation();
                        }
                        self.shared.lock().report.last_reset_reason = Some(ResetReason::from(&interrupt));
                        o.status = r.status;
                        o.state_lost = r.state_lost;
                        o.state_lost_reason = r.state_lost_reason;
                        o.rolled_back = r.rolled_back;
                        o.diagnostic = Some(r.diagnostic);
                        o.output_limit_exceeded = interrupt == Interrupt::OutputLimit;
                        o.log_complete = !o.output_limit_exceeded;
                        if let Some(guard) = &guard {
                            // The killed processes are gone: check the project now.
                            let (guard, notes) = (guard.clone(), self.notes.clone());
                            let _ =
                                tokio::task::spawn_blocking(move || protected::settle_and_check(&guard, None, &notes))
                                    .await;
                        }
                        return self.finish_exec(o, guard, &capture, &dirs, seq, inner.worker.is_some());
                    }
                    Some(Err(e)) => {
                        tracing::warn!("rollback failed: {e}");
                        o.notes.push(format!(
                            "The interpreter could not be rolled back ({e}); the sandbox was killed instead."
                        ));
                    }
                    None => {}
                }
                let mut exit = None;
                if interrupt == Interrupt::Died && !inner.worker.as_ref().is_some_and(|w| w.keeper()) {
                    // Let the sandbox exit by itself first, so that its exit
                    // status is the worker's and not our SIGKILL.
                    if let Some(w) = inner.worker.as_mut() {
                        exit = w.wait_exit(DEATH_GRACE).await;
                    }
                }
                let reason = ResetReason::from(&interrupt);
                let killed = self.kill_worker(inner, Some(&mut capture), reason).await;
                let (status, reason, diagnostic) =
                    interruption(&interrupt, timeout_seconds, killed_for, exit.or(killed));
                let (reason, diagnostic) = with_oom(reason, diagnostic, oom.as_ref());
                o.status = status;
                o.state_lost = true;
                o.state_lost_reason = Some(reason);
                o.diagnostic = Some(diagnostic);
                o.output_limit_exceeded = interrupt == Interrupt::OutputLimit;
                o.log_complete = !o.output_limit_exceeded;
            }
        }
        let alive = inner.worker.is_some();
        self.finish_exec(o, guard, &capture, &dirs, seq, alive)
    }

    /// The parts of an execution's result that every ending shares: the
    /// protected-path checks, the notes, the streams and their logs.
    fn finish_exec(
        &self,
        mut o: Outcome,
        guard: Option<Arc<Guard>>,
        capture: &Capture,
        dirs: &Dirs,
        seq: u64,
        alive: bool,
    ) -> Outcome {
        if let Some(guard) = guard {
            // The names where protected entries live, now; the whole
            // project off the result's path (its notes reach the next result).
            o.notes.extend(guard.check_holders());
            if alive {
                tokio::task::spawn_blocking(move || guard.check_all_pending());
            }
        }
        o.notes.extend(self.notes.lock().take());
        // How much /scratch holds, measured off the result's path (a note
        // reaches a later result).
        self.scratch.poke(&dirs.scratch, &self.notes);
        if let Some(e) = &capture.log_error {
            let note = format!("Writing the log files failed: {e}");
            o.diagnostic = Some(match o.diagnostic.take() {
                Some(d) => format!("{d}\n{note}"),
                None => note,
            });
        }
        let (out_path, err_path) = log_paths(dirs, seq);
        o.stdout = StreamText::from(&capture.stdout);
        o.stderr = StreamText::from(&capture.stderr);
        o.log_paths = LogFiles {
            stdout: (capture.stdout.total > 0).then_some(out_path),
            stderr: (capture.stderr.total > 0).then_some(err_path),
        };
        o
    }

    /// Probe the host and make the session directory (once each).
    async fn prepare(&self, inner: &mut Inner) -> Result<(Arc<Facts>, Dirs, PathBuf), String> {
        let facts = match &inner.facts {
            Some(f) => f.clone(),
            None => {
                let facts = Arc::new(Facts::probe(&self.opts).await.map_err(|e| e.to_string())?);
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

    /// What stops an operation of a sandbox made for `mounts`: a dispose,
    /// a cancel of `call` (none for a spare), a change of the mounts.
    fn halt_check(&self, call: Option<u32>, mounts: MountConfig) -> impl Fn() -> Option<Halt> + Send + Sync + '_ {
        move || {
            if self.is_disposed() {
                Some(Halt::Disposed)
            } else if call.is_some_and(|c| self.is_cancelled(c)) {
                Some(Halt::Cancelled)
            } else if self.shared.lock().report.mounts != mounts {
                Some(Halt::Remounted)
            } else {
                None
            }
        }
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
                    stale.reap();
                }
            }
        }
        if let Some(spare) = spare {
            bump();
            self.adopt(inner, *spare);
            return Ok(());
        }
        let generation = bump();
        let start = self.start_of(&facts, &dirs, project, mounts.clone());
        let check = self.halt_check(Some(call), mounts);
        let mut stop = Stop { wake, check: &check };
        let spawned = |pid: i32, alive: bool| self.set_active(alive.then_some(pid));
        match crate::launch::start(&start, &mut stop, &spawned).await {
            Ok((worker, ready)) => {
                self.ready(ready);
                self.adopt(inner, worker);
                inner.start_failed = false;
                Ok(())
            }
            Err(e) => {
                inner.start_failed = true;
                self.shared.lock().report.last_reset_reason = Some(ResetReason::StartupFailure);
                let (status, msg) = start_failure(&e);
                Err(Box::new(Outcome::static_result(status, generation, msg)))
            }
        }
    }

    fn start_of<'a>(&self, facts: &'a Facts, dirs: &'a Dirs, project: PathBuf, mounts: MountConfig) -> Start<'a> {
        Start {
            facts,
            dirs,
            project,
            mounts,
            notes: self.notes.clone(),
            tainted: self.tainted.clone(),
            rollback: self.opts.rollback,
        }
    }

    /// What a ready frame tells the session.
    fn ready(&self, ready: crate::worker::Ready) {
        let mut sh = self.shared.lock();
        sh.report.availability = Availability::Available;
        sh.report.runtime_version = Some(ready.runtime_version);
        for note in ready.site_notes {
            if !sh.report.python_notes.contains(&note) {
                sh.report.python_notes.push(note);
            }
        }
    }

    /// Make `worker` the session's interpreter.
    fn adopt(&self, inner: &mut Inner, mut worker: Worker) {
        self.notes.lock().extend(std::mem::take(&mut worker.plan_notes));
        {
            let mut sh = self.shared.lock();
            sh.active_guard = worker.guard.clone().map(|g| (g, worker.init_pid));
            sh.report.worker_code = Some(worker.code.as_str());
            sh.report.masks = Some(worker.masks.clone());
        }
        self.set_active(Some(worker.pid()));
        inner.worker = Some(worker);
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
                std::sync::Arc::new(move || protected::settle_and_check(&guard, init, &notes))
                    as crate::rundir::AfterKill
            })
            .into_iter()
            .collect();
        drop(sh);
        live_update(self.id, pids, dir, after);
    }

    /// Take the ready spare if it was made for `mounts` and is still alive.
    fn take_spare(&self, mounts: &MountConfig) -> Option<Box<Worker>> {
        let mut w = self.spare.take()?;
        self.shared.lock().spare_pid = None;
        if w.mounts != *mounts || w.exited().is_some() {
            w.reap();
            self.sync_live();
            return None;
        }
        Some(w)
    }

    /// Kill the spare (mounts changed, or the session ends).
    fn discard_spare(&self) {
        if let Some(w) = self.spare.clear() {
            w.reap();
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
            let made = if me.spare.is_current(ticket) {
                let mut wake = me.wake.subscribe();
                let start = me.start_of(&facts, &dirs, project, mounts.clone());
                let check = me.halt_check(None, mounts.clone());
                let mut stop = Stop { wake: &mut wake, check: &check };
                let spawned = |pid: i32, alive: bool| me.spare_spawned(ticket, pid, alive);
                crate::launch::start(&start, &mut stop, &spawned).await.ok()
            } else {
                None
            };
            let current = {
                let sh = me.shared.lock();
                !sh.report.disposed && sh.report.mounts == mounts
            };
            let unused = match made {
                Some((w, ready)) if current => {
                    me.ready(ready);
                    me.spare.fill(ticket, w).err()
                }
                Some((w, _)) => {
                    me.spare.abandon(ticket);
                    Some(w)
                }
                None => {
                    me.spare.abandon(ticket);
                    None
                }
            };
            if let Some(w) = unused {
                let mut sh = me.shared.lock();
                if sh.spare_pid == Some(w.pid()) {
                    sh.spare_pid = None;
                }
                drop(sh);
                w.reap();
            }
            me.sync_live();
        });
    }

    /// Record the pid of the spare being started under `ticket` (so that a
    /// dispose can kill it), or forget it once its start failed.
    fn spare_spawned(&self, ticket: u64, pid: i32, alive: bool) {
        let ours = self.spare.is_current(ticket);
        let mut sh = self.shared.lock();
        if alive && ours {
            sh.spare_pid = Some(pid);
        } else if !alive && sh.spare_pid == Some(pid) {
            sh.spare_pid = None;
        }
        drop(sh);
        self.sync_live();
    }

    /// Kill the sandbox after an interrupted execution, keep the output that
    /// was already written, and wait (bounded) for everything to exit.
    async fn kill_worker(
        &self,
        inner: &mut Inner,
        capture: Option<&mut Capture>,
        reason: ResetReason,
    ) -> Option<std::process::ExitStatus> {
        let w = inner.worker.take()?;
        let (exit, dead) = w.kill(capture).await;
        if let Some(guard) = dead.guard {
            let notes = self.notes.clone();
            let init = dead.init_pid;
            let _ = tokio::task::spawn_blocking(move || protected::settle_and_check(&guard, init, &notes)).await;
        }
        self.after_worker_gone(reason);
        exit
    }

    /// Drop a worker that is already dead or unwanted.
    async fn drop_worker(&self, inner: &mut Inner, reason: ResetReason) {
        if inner.worker.is_some() {
            self.kill_worker(inner, None, reason).await;
        } else {
            self.after_worker_gone(reason);
        }
    }

    fn after_worker_gone(&self, reason: ResetReason) {
        let mut sh = self.shared.lock();
        sh.worker_pid = None;
        sh.active_guard = None;
        sh.report.worker_running = false;
        sh.report.worker_code = None;
        sh.report.last_reset_reason = Some(reason);
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
                .spawn(move || protected::settle_and_check(&guard, init, &notes));
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
        // In a keeper layout: a fresh interpreter in the same sandbox.
        let fast = match inner.worker.as_mut() {
            Some(w) if w.keeper() => !w.interpreter_gone() && w.recover(None, true).await.is_ok(),
            _ => false,
        };
        if fast {
            let mut sh = self.shared.lock();
            sh.report.generation += 1;
            sh.report.last_reset_reason = Some(ResetReason::Explicit);
        } else {
            self.drop_worker(&mut inner, ResetReason::Explicit).await;
        }
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
        let reason = match reason {
            "disposed" => ResetReason::Disposed,
            other => ResetReason::DisposedFor(other.to_string()),
        };
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
