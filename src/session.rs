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
use tracing::Instrument;

use crate::bwrap::{SCRATCH, WORKSPACE};
use crate::capture::Capture;
use crate::frame;
use crate::launch::Start;
use crate::limits::*;
use crate::options::Settings;
use crate::outcome::{
    interruption, killed_for, recovered_text, start_failure, start_failure_of, with_oom, AfterResult, Discarded,
    KilledFor, LogFiles, Loss, OomKill, Outcome, ResetDone, ResetReason, StartFailure, StateFate, Status, StreamText,
};
pub use crate::outcome::{Progress, ProgressFn};
pub use crate::permissions::MountConfig;
use crate::protected::{self, Guard};
pub use crate::rundir::{default_runtime_root, Dirs};

/// Kill every sandbox of this process, delete every session directory,
/// then remove the sandboxes' cgroups once their processes are gone.
/// Synchronous: for exit hooks.
pub fn cleanup_all() {
    crate::rundir::cleanup_all();
    crate::contain::cleanup_all();
}
use crate::random::random_u64;
use crate::runtime::python::PythonRuntime;
use crate::runtime::Runtime;
use crate::spare::Spare;
use crate::worker::{Call, Halt, Interrupt, Stop};

pub use crate::launch::WORKER_SOURCE;
pub use crate::options::{SessionOptions, PREWARM_ENV};

pub use crate::outcome::{Availability, SpareState, StatusReport};

mod call;
#[cfg(test)]
mod fake;
mod host;
mod live;
mod shell;
pub use shell::ShellSpare;
mod start;
#[cfg(test)]
mod tests;

pub use host::{Host, LiveEnv, RealHost, Sandbox};

/// A sandbox's guard and init pid, and whether its project is held
/// read-only in a writable mode (see `Slot::set_guard`).
type SlotGuard = (Option<(Arc<Guard>, Option<i32>)>, bool);

/// The session's sandbox: none, one starting, or one ready for calls.
/// Written only where it changes; `status` derives whether an interpreter
/// runs and how its worker was loaded from it.
#[derive(Default)]
enum Slot {
    #[default]
    Empty,
    /// A sandbox is starting: its process once spawned and alive.
    Starting { pid: Option<i32> },
    /// The sandbox runs the session's interpreter.
    Ready {
        pid: i32,
        /// How its worker was loaded (see `StatusReport::worker_code`).
        code: crate::worker::CodeForm,
        /// Its guard and init pid, for checks after a kill that does not
        /// hold the operation lock.
        guard: Option<(Arc<Guard>, Option<i32>)>,
        /// Started in a writable mode, but with the project read-only (it
        /// could not be protected).
        held_read_only: bool,
    },
}

impl Slot {
    /// The sandbox's process, while there is one.
    fn pid(&self) -> Option<i32> {
        match self {
            Slot::Empty => None,
            Slot::Starting { pid } => *pid,
            Slot::Ready { pid, .. } => Some(*pid),
        }
    }

    fn guard(&self) -> Option<(Arc<Guard>, Option<i32>)> {
        match self {
            Slot::Ready { guard, .. } => guard.clone(),
            _ => None,
        }
    }

    /// A mode change made in the running sandbox started or ended its
    /// guard (the checks after a kill use the new one); `held`: the mode
    /// allows writes but the project stays read-only (it could not be
    /// protected), as a fresh start would hold it.
    fn set_guard(&mut self, (new, held): SlotGuard) {
        if let Slot::Ready { guard, held_read_only, .. } = self {
            *guard = new;
            *held_read_only = held;
        }
    }

    fn code(&self) -> Option<crate::worker::CodeForm> {
        match self {
            Slot::Ready { code, .. } => Some(*code),
            _ => None,
        }
    }
}

struct Shared {
    report: StatusReport,
    slot: Slot,
    spare_pid: Option<i32>,
    /// Which directory (device and inode) the ready spare has mounted as
    /// the project: another one put at its path since is not it.
    spare_project: Option<(u64, u64)>,
    /// The call that holds the operation lock; `status` says busy while there is one.
    running_call: Option<u32>,
    /// When the last call or reset ended (a spare made for a running
    /// sandbox waits until neither has for a moment, see `refill_spare`).
    last_active: Option<std::time::Instant>,
    /// A spare waits for that moment (see `refill_spare`).
    spare_waiting: bool,
    cancelled: HashSet<u32>,
    /// Why the next mount change restarts the sandbox, when it is not the
    /// plain "the mode changed" (see [`Session::set_mounts_because`]).
    remount_reason: Option<String>,
    /// Allow-once paths that the sandbox being replaced had and the next
    /// one keeps: the same call's reruns need them (see [`Session::keep_once`]).
    kept_once: (Vec<crate::permissions::OnceMount>, Vec<PathBuf>),
    /// Grants reach the running sandbox (see `live`).
    live: live::LiveState,
    /// /scratch is in doubt on the python side (`Inner::scratch_suspect`,
    /// or the flag its sandbox's watches set when they stop it for a
    /// secret): read by the bash tool's commands, which do not wait for
    /// the operation lock unless it is set.
    scratch_doubt: bool,
    python_secret: Option<Arc<std::sync::atomic::AtomicBool>>,
}

struct Inner<H: Host> {
    worker: Option<H::Sandbox>,
    facts: Option<Arc<H::Facts>>,
    dirs: Option<Dirs>,
    /// State loss that happened between calls, told by the next result.
    pending_loss: Option<Discarded>,
    /// The last sandbox start failed: no spare with the same setup.
    start_failed: bool,
    /// A sandbox was stopped because a secret appeared while it could
    /// write /scratch: the next start sets that scratch aside first.
    scratch_suspect: bool,
}

/// A session on the real host; a test names another [`Host`].
pub struct Session<H: Host = RealHost> {
    id: u64,
    weak: std::sync::Weak<Session<H>>,
    host: H,
    spare: Spare<H::Sandbox>,
    /// Told when a spare's start ends (filled or abandoned) or the spare is
    /// discarded: a first call waits on it for a start already under way.
    spare_settled: tokio::sync::Notify,
    opts: SessionOptions,
    nonce_base: u64,
    ops: tokio::sync::Mutex<Inner<H>>,
    shared: parking_lot::Mutex<Shared>,
    wake: watch::Sender<u64>,
    auto_call: AtomicU64,
    /// Who reviews the python tool's unmatched network destinations during
    /// the next calls (none: refused at once), and whether yolo allows them.
    network_review: parking_lot::Mutex<crate::network::review::Reviewing>,
    /// Notes for the next result, found between executions (protected
    /// names made inert, ...).
    notes: protected::Notes,
    /// Protected names that could not be made inert (see `protected`).
    tainted: protected::Tainted,
    /// The secrets the session's starts found (see `protected`).
    known_secrets: protected::KnownSecrets,
    /// How much /scratch holds (see `scratch`).
    scratch: Arc<crate::scratch::ScratchWatch>,
    /// The bash tool's commands (see `shell`).
    shells: shell::Shells,
}

/// Where execution `seq` logs its streams.
fn log_paths(dirs: &Dirs, seq: u64) -> (PathBuf, PathBuf) {
    (dirs.logs.join(format!("{seq:04}-out.log")), dirs.logs.join(format!("{seq:04}-err.log")))
}

const DISPOSED: &str = "The python session was disposed; no interpreter is available.";
/// A call cancelled before its code reached the interpreter.
const NOT_TOUCHED: &str = "Cancelled before execution; the interpreter was not touched.";
const REMOUNT_REASON: &str = "the sandbox was restarted because the permission mode or read roots changed";

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl Session {
    pub fn new(opts: SessionOptions) -> Arc<Self> {
        Self::with_host(opts, RealHost)
    }
}

impl<H: Host> Session<H> {
    /// A session whose sandboxes `host` makes.
    pub fn with_host(opts: SessionOptions, host: H) -> Arc<Self> {
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let settings = Settings::from_env();
        let runtime_root = opts.runtime_root.clone().unwrap_or_else(default_runtime_root);
        crate::debuglog::install(settings.log, runtime_root.join("debug.log"));
        let prewarm = opts.prewarm.unwrap_or(settings.prewarm);
        let report = StatusReport::new(opts.project_dir.clone(), opts.mounts.clone(), prewarm);
        Arc::new_cyclic(|weak| Session {
            id,
            weak: weak.clone(),
            host,
            spare: Spare::default(),
            spare_settled: tokio::sync::Notify::new(),
            nonce_base: random_u64(),
            opts,
            ops: tokio::sync::Mutex::new(Inner {
                worker: None,
                facts: None,
                dirs: None,
                pending_loss: None,
                start_failed: false,
                scratch_suspect: false,
            }),
            shared: parking_lot::Mutex::new(Shared {
                report,
                slot: Slot::Empty,
                spare_pid: None,
                spare_project: None,
                running_call: None,
                last_active: None,
                spare_waiting: false,
                cancelled: HashSet::new(),
                remount_reason: None,
                kept_once: Default::default(),
                live: Default::default(),
                scratch_doubt: false,
                python_secret: None,
            }),
            wake: watch::channel(0).0,
            auto_call: AtomicU64::new(0),
            network_review: Default::default(),
            notes: protected::Notes::default(),
            tainted: protected::Tainted::default(),
            known_secrets: protected::KnownSecrets::default(),
            scratch: Arc::new(crate::scratch::ScratchWatch::new(settings.scratch_note)),
            shells: shell::Shells::default(),
        })
    }

    /// A snapshot for `status`; starts nothing and never waits.
    /// The options the session was made with.
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    pub fn status(&self) -> StatusReport {
        let spare = self.spare.state();
        let sh = self.shared.lock();
        let mut report = sh.report.clone();
        report.by_caller = self.opts.set_by_caller();
        report.worker_running = sh.slot.pid().is_some();
        report.workspace_held_read_only =
            report.mounts.workspace_writable && matches!(sh.slot, Slot::Ready { held_read_only: true, .. });
        report.worker_code = sh.slot.code();
        report.busy = sh.running_call.is_some();
        drop(sh);
        report.spare = spare;
        report.rollback = self.opts.rollback.unwrap_or_else(|| Settings::from_env().rollback);
        report.scratch = self.scratch.last();
        report.grants = Some(crate::live_grants::status_line(report.rollback));
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

    /// Who reviews a network destination no entry matches during the calls
    /// that start from now (with `network.python`; no `ask`: refused at
    /// once), and whether the session is in yolo mode (then it is allowed
    /// unreviewed, unless `network.review.yolo` is `"review"`).
    pub fn set_network_review(&self, reviewing: crate::network::review::Reviewing) {
        *self.network_review.lock() = reviewing;
    }

    /// Run `code`. `call_id` names the call for `cancel`.
    pub async fn execute(&self, code: String, timeout_seconds: u32, call_id: Option<u32>) -> Outcome {
        self.execute_with_progress(code, timeout_seconds, call_id, None).await
    }

    /// The span this session's work runs in (see `debuglog`).
    fn span(&self) -> tracing::Span {
        tracing::info_span!("session", session = self.id)
    }

    /// [`Session::execute`], reporting progress while the code runs.
    pub async fn execute_with_progress(
        &self,
        code: String,
        timeout_seconds: u32,
        call_id: Option<u32>,
        progress: Option<ProgressFn>,
    ) -> Outcome {
        let outcome = self.run_call(code, timeout_seconds, call_id, progress).instrument(self.span()).await;
        let _span = self.span().entered();
        tracing::debug!(
            status = ?outcome.status,
            state_lost = outcome.state_lost(),
            rolled_back = outcome.rolled_back(),
            ms = outcome.duration_ms,
            "execution ended"
        );
        outcome
    }

    async fn run_call(
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
                return self.finish_static(call, Status::Cancelled, NOT_TOUCHED.into());
            }
        };
        if self.is_disposed() {
            return self.finish_static(call, Status::Unavailable, DISPOSED.into());
        }
        if self.is_cancelled(call) {
            return self.finish_static(call, Status::Cancelled, NOT_TOUCHED.into());
        }
        {
            let mut sh = self.shared.lock();
            sh.running_call = Some(call);
        }
        let request = call::CallRequest { code, timeout_seconds, progress };
        let mut outcome = self.execute_locked(&mut inner, request, call, &mut wake).await;
        self.refill_spare(&inner, SPARE_DELAY);
        if let Some(loss) = inner.pending_loss.take() {
            if outcome.status == Status::Unavailable || !outcome.started {
                inner.pending_loss = Some(loss); // nothing ran; tell the next call
            } else {
                outcome.lost_before = Some(loss);
            }
        }
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        let mut sh = self.shared.lock();
        sh.running_call = None;
        sh.last_active = Some(std::time::Instant::now());
        sh.cancelled.remove(&call);
        outcome
    }

    fn finish_static(&self, call: u32, status: Status, diagnostic: String) -> Outcome {
        let mut sh = self.shared.lock();
        sh.cancelled.remove(&call);
        Outcome::static_result(status, sh.report.history.generation, diagnostic)
    }

    /// Kill the sandbox after an interrupted execution, keep the output that
    /// was already written, and wait (bounded) for everything to exit.
    async fn kill_worker(
        &self,
        inner: &mut Inner<H>,
        capture: Option<&mut Capture>,
        reason: ResetReason,
    ) -> Option<std::process::ExitStatus> {
        let w = inner.worker.take()?;
        tracing::debug!(pid = w.pid(), ?reason, "killing the sandbox");
        self.shared.lock().python_secret = None;
        if w.secret_appeared() {
            self.doubt_scratch(inner);
        }
        self.forget_once(w.mounts());
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
    async fn drop_worker(&self, inner: &mut Inner<H>, reason: ResetReason) {
        if inner.worker.is_some() {
            self.kill_worker(inner, None, reason).await;
        } else {
            self.after_worker_gone(reason);
        }
    }

    fn after_worker_gone(&self, reason: ResetReason) {
        let mut sh = self.shared.lock();
        sh.slot = Slot::Empty;
        sh.report.history.discarded(reason);
        drop(sh);
        self.sync_live();
    }

    /// Change the mounts. An effective change kills the running sandbox at
    /// once (a writable mount must not outlive the mode that granted it);
    /// the next execution starts with the new mounts and reports the loss.
    /// Returns `Some(killed)` when something changed, `killed` telling
    /// whether an interpreter was discarded.
    pub fn set_mounts(&self, mounts: MountConfig) -> Option<bool> {
        self.set_mounts_because(mounts, None)
    }

    /// [`Session::set_mounts`], with the reason the next result gives for
    /// the restart (default: the mode or the read roots changed).
    pub fn set_mounts_because(&self, mounts: MountConfig, reason: Option<String>) -> Option<bool> {
        let _span = self.span().entered();
        // Going read-only, the change's plan walks the project: made first,
        // under the operation lock alone (see `live::Held`). That lock is
        // kept until the change is made below, so the sandbox the plan was
        // made for is the one changed, and no call runs between; what the
        // sandbox's own processes write meanwhile is as after any walk (the
        // swap checks each entry it binds against the plan). Whether the
        // change is made at all is still decided under the session's lock,
        // against the mounts current then.
        let mut held = self.hold_for_read_only(&mounts);
        let mut sh = self.shared.lock();
        sh.report.permissions_seen = true;
        if sh.report.mounts == mounts {
            return None;
        }
        tracing::debug!(
            writable = mounts.workspace_writable,
            roots = ?mounts.read_roots,
            once = ?mounts.once,
            ?reason,
            "mounts changed"
        );
        // A change that only adds grants reaches the running sandbox at
        // its next execution (see `live`): it is not killed.
        let mut restart = self.restart_why(&sh.report.mounts, &mounts);
        if restart.is_none() {
            // A revoked read root goes at once, not at the next execution.
            restart = self.revoke_now(&sh.report.mounts, &mounts, sh.slot.pid()).err().map(|e| e.0);
        }
        if restart.is_none() {
            // So does a writable project (with the rest of the change).
            let had = sh.report.mounts.clone();
            restart = self.read_only_now(&had, &mounts, &mut sh.slot, held.as_mut()).err().map(|e| e.0);
        }
        if shell::takes_away(&sh.report.mounts, &mounts) {
            self.shells.stop_running(
                "the permission mode or the read roots changed while it ran, taking away what its sandbox could reach",
            );
        }
        sh.report.mounts = mounts;
        sh.remount_reason = reason;
        sh.report.mount_epoch += 1;
        let Some(why) = restart else {
            drop(sh);
            self.last_look(held);
            self.discard_spare();
            self.wake.send_modify(|n| *n += 1);
            return Some(false);
        };
        sh.live.restarted_for = Some(why);
        let pid = sh.slot.pid();
        let guard = sh.slot.guard();
        drop(sh);
        self.discard_spare();
        if let Some(pid) = pid {
            self.host.kill_group(pid);
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

    /// A host secret inside `w`'s read roots that its masks miss (it
    /// appeared after the start). Only looked for where there are roots.
    fn unmasked_secret(&self, w: &H::Sandbox) -> Option<PathBuf> {
        if w.mounts().read_roots.is_empty() && !w.mounts().once.iter().any(|m| m.is_dir) {
            return None;
        }
        let project = std::fs::canonicalize(&self.opts.project_dir).ok()?;
        let root = self.runtime_root();
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        w.unmasked_secret(&[&project, &root])
    }

    /// Why `w`'s secret masks no longer fit the project, if they do not
    /// (asked off the runtime: it may walk the project).
    async fn masks_stale(&self, w: Option<&H::Sandbox>) -> Option<String> {
        let watch = w?.masks_watch()?;
        tokio::task::spawn_blocking(move || watch.stale()).await.ok().flatten()
    }

    /// A sandbox with allow-once paths ends: they are not mounted again,
    /// except those the call that is being run again keeps.
    fn forget_once(&self, had: &MountConfig) {
        let mut sh = self.shared.lock();
        let (keep, keep_unmasked) = std::mem::take(&mut sh.kept_once);
        if !had.has_once() {
            return;
        }
        sh.report.mounts.once.retain(|m| !had.once.contains(m) || keep.contains(m));
        sh.report.mounts.unmasked_once.retain(|p| !had.unmasked_once.contains(p) || keep_unmasked.contains(p));
    }

    /// The next sandbox keeps these allow-once paths of the one it
    /// replaces: they were allowed during the call that runs again.
    pub fn keep_once(&self, once: Vec<crate::permissions::OnceMount>, unmasked: Vec<PathBuf>) {
        self.shared.lock().kept_once = (once, unmasked);
    }

    fn remount_reason(&self) -> String {
        self.shared.lock().remount_reason.take().unwrap_or_else(|| REMOUNT_REASON.into())
    }

    /// What the last mode event's roots came to, for `status`.
    pub fn record_plan(&self, skipped: Vec<crate::permissions::Skipped>, masked: Vec<crate::hostsecrets::Mask>) {
        let mut sh = self.shared.lock();
        sh.report.skipped_roots = skipped;
        sh.report.masked = masked;
    }

    pub fn project_dir(&self) -> &Path {
        &self.opts.project_dir
    }

    /// The project's host names besides its canonical path: the directory
    /// as given and the caller's other names for it.
    pub fn project_names(&self) -> Vec<PathBuf> {
        std::iter::once(&self.opts.project_dir).chain(&self.opts.project_names).cloned().collect()
    }

    /// Whether the sandbox path `path` (absolute, normalised) is the
    /// project's: under /workspace, or under one of its host names (which
    /// are links to /workspace there).
    pub fn in_project(&self, path: &Path) -> bool {
        self.workspace_path(path).is_some()
    }

    /// The sandbox path under the project's mount point of `path`, a path
    /// under that mount point or under one of the project's host names
    /// (which a grant of a tree around the project also shows).
    pub fn workspace_path(&self, path: &Path) -> Option<PathBuf> {
        if path.starts_with(crate::bwrap::WORKSPACE) {
            return Some(path.to_path_buf());
        }
        let canonical = std::fs::canonicalize(&self.opts.project_dir).ok();
        let names = self.project_names().into_iter().filter_map(|n| crate::paths::normalize_path(&n));
        let rel = canonical.into_iter().chain(names).find_map(|n| path.strip_prefix(n).ok().map(Path::to_path_buf))?;
        Some(Path::new(crate::bwrap::WORKSPACE).join(rel))
    }

    /// Where this session's directories are (scratch among them).
    pub fn runtime_root(&self) -> PathBuf {
        self.opts.runtime_root.clone().unwrap_or_else(default_runtime_root)
    }

    /// Kill the sandbox and discard interpreter state; scratch is kept.
    /// Returns the session directories and notes for the user.
    pub async fn reset(&self) -> (Option<Dirs>, ResetDone, Vec<String>) {
        self.reset_now().instrument(self.span()).await
    }

    async fn reset_now(&self) -> (Option<Dirs>, ResetDone, Vec<String>) {
        let mut inner = self.ops.lock().await;
        // In a keeper layout: a fresh interpreter in the same sandbox.
        // A sandbox with an allow-once path is replaced: the path goes with it.
        // A sandbox whose secret masks are stale is replaced too.
        let stale = self.masks_stale(inner.worker.as_ref()).await;
        let fast = match inner.worker.as_mut() {
            Some(w) if w.keeper() && !w.mounts().has_once() && stale.is_none() => {
                !w.interpreter_gone() && w.recover(None, true).await.is_ok()
            }
            _ => false,
        };
        // A sandbox that ran while a project secret appeared could write it
        // to /scratch.
        if stale.is_some() && inner.worker.is_some() {
            self.doubt_scratch(&mut inner);
        }
        let done = if fast {
            self.shared.lock().report.history.replaced(ResetReason::ExplicitReset);
            ResetDone::Fresh
        } else {
            let running = inner.worker.is_some();
            self.drop_worker(&mut inner, ResetReason::ExplicitReset).await;
            if running {
                ResetDone::Killed
            } else {
                ResetDone::Idle
            }
        };
        inner.pending_loss = None;
        self.shared.lock().last_active = Some(std::time::Instant::now());
        // An allow-once path whose sandbox never started goes too.
        let mounts = self.shared.lock().report.mounts.clone();
        self.forget_once(&mounts);
        self.refill_spare(&inner, SPARE_DELAY);
        (inner.dirs.clone(), done, self.notes.lock().take())
    }

    /// Begin the session's first sandbox ahead of its first call: probe the
    /// host, make the session directory and start the spare (at once, no
    /// delay), which the first call then takes, or waits for while it
    /// starts. Nothing when an interpreter already runs or the session is
    /// disposed; when prewarming is off or the project is writable (no spare
    /// then), only what the process's first start does once (the host's
    /// `warm`); what fails here is tried again, and told, by the first call.
    pub async fn prestart(&self) {
        async {
            let ahead = {
                let sh = self.shared.lock();
                sh.report.prewarm && !sh.report.mounts.workspace_writable
            };
            if !ahead {
                // No sandbox ahead: only what the process does once.
                self.host.warm(&self.opts);
                return;
            }
            let mut inner = self.ops.lock().await;
            if inner.worker.is_some() || self.is_disposed() {
                return;
            }
            if let Err(e) = self.prepare(&mut inner).await {
                tracing::debug!("no sandbox ahead of the first call: {e}");
                return;
            }
            self.refill_spare(&inner, Duration::ZERO);
        }
        .instrument(self.span())
        .await
    }

    /// Kill the sandbox and delete the session's directories. Idempotent;
    /// later calls answer `unavailable`. Returns notes for the user (what
    /// the last checks of the project found).
    pub async fn dispose(&self, reason: &str) -> Vec<String> {
        self.dispose_now(reason).instrument(self.span()).await
    }

    async fn dispose_now(&self, reason: &str) -> Vec<String> {
        tracing::debug!(reason, "dispose");
        let pid = {
            let mut sh = self.shared.lock();
            sh.report.disposed = true;
            sh.slot.pid()
        };
        // Kill first so that a running execution ends at once.
        if let Some(pid) = pid {
            self.host.kill_group(pid);
        }
        self.discard_spare();
        self.wake.send_modify(|n| *n += 1);
        // Every command of the bash tool ends before the directories go.
        let _no_shells = self.shells.stop_all().await;
        let mut inner = self.ops.lock().await;
        // The caller's reason is the log's (above): the status says `disposed`.
        self.drop_worker(&mut inner, ResetReason::Disposed).await;
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
