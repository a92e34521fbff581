//! The seam between a session and its sandboxes: what the session asks of
//! the host (probe it, start a sandbox, kill a process group, register
//! what runs for the exit cleanup) and of one sandbox (run a call with a
//! deadline and a stop, recover or reset its interpreter, kill it).
//!
//! [`RealHost`] and [`Worker`] are the real ones: bubblewrap, seccomp and
//! the python runtime. A test host (`session::fake`) answers with scripted
//! outcomes and no process, so that `cargo test` drives the session's
//! orchestration. Nothing here decides anything: the session does.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use crate::capture::Capture;
use crate::launch::{Facts, ProbeError, Start};
use crate::live_grants::LiveError;
use crate::options::SessionOptions;
use crate::outcome::StatusReport;
use crate::permissions::MountConfig;
use crate::protected::{Guard, SecretWatch};
use crate::rundir::AfterKill;
use crate::secrets::MaskReport;
use crate::worker::{
    Call, CodeForm, Dead, ExecDone, Interrupt, NoReturn, Ready, RecoverError, Recovery, StartError, Stop, Worker,
};

pub use crate::live_grants::LiveEnv;

/// One started sandbox, as the session uses it.
pub trait Sandbox: Send + 'static {
    /// The mounts it was started with.
    fn mounts(&self) -> &MountConfig;
    /// Its process group (bubblewrap's pid).
    fn pid(&self) -> i32;
    /// The protection of the project it was started with, if it can write it.
    fn guard(&self) -> Option<Arc<Guard>>;
    /// Its PID 1 inside, where known.
    fn init_pid(&self) -> Option<i32>;
    /// What its plan found, for the next result (once).
    fn take_plan_notes(&mut self) -> Vec<String>;
    fn masks(&self) -> &MaskReport;
    fn code(&self) -> CodeForm;
    /// A keeper layout (rollback and fast reset).
    fn keeper(&self) -> bool;
    /// Whether the last call took a rollback point.
    fn took_point(&self) -> bool;
    /// Whether the last call's request reached the interpreter (a call
    /// halted before that left it untouched).
    fn request_sent(&self) -> bool;
    /// Whether a watch stopped it because a secret appeared.
    fn secret_appeared(&self) -> bool;
    /// The flag behind [`Sandbox::secret_appeared`], read without it.
    fn secret_flag(&self) -> Arc<std::sync::atomic::AtomicBool>;
    /// Why the host killed it on its own (a limit, a watch), once.
    fn take_killed_for(&self) -> Option<crate::protected::HostKill>;
    fn masks_watch(&self) -> Option<Arc<SecretWatch>>;
    /// Memory-cap kills since the last look, worded.
    fn oom_note(&mut self, died: bool) -> Option<String>;
    /// What its network's proxy allowed and refused since the last look.
    fn take_network_notes(&self) -> Vec<String>;
    /// A call starts (`Some`: who reviews during it) or ended (`None`).
    fn network_review(&self, during: Option<crate::network::review::Reviewing>);
    /// Its exit status, if it has ended.
    fn exited(&mut self) -> Option<ExitStatus>;
    /// Whether its interpreter is gone while its PID 1 stays.
    fn interpreter_gone(&mut self) -> bool;
    /// A host secret under its read roots that its masks miss (`outside`:
    /// trees no mask is needed for).
    fn unmasked_secret(&self, outside: &[&Path]) -> Option<PathBuf>;
    /// Run one call to its end or its interrupt.
    fn exec(
        &mut self,
        call: Call<'_>,
        capture: &mut Capture,
        stop: &mut Stop<'_>,
    ) -> impl Future<Output = Result<ExecDone, Interrupt>> + Send;
    /// Roll back (or replace) its interpreter after a failed call; with
    /// `reset`, a fresh interpreter.
    fn recover(
        &mut self,
        capture: Option<&mut Capture>,
        reset: bool,
    ) -> impl Future<Output = Result<Recovery, RecoverError>> + Send;
    /// What [`Sandbox::prepare_read_only`] makes.
    type Prepared: Send;
    /// The plan (with its walk of the project) of a change of its writable
    /// project to `want`'s read-only one, made before the change and
    /// without changing anything; `None` when `want` makes no such change.
    fn prepare_read_only(&self, want: &MountConfig, env: &LiveEnv<'_>) -> Option<Self::Prepared>;
    /// Add `want`'s grants to it while it runs (see `live_grants`), and
    /// change its project's mount to `want`'s mode (see `worker::mode`),
    /// with `prepared` when it was made for this change: its mounts become
    /// `want`. `Ok`: the guard a change to read-only ended, whose last look
    /// at the project the caller makes. `Err`: it must be restarted.
    fn apply_live(
        &mut self,
        want: &MountConfig,
        env: &LiveEnv<'_>,
        prepared: Option<Self::Prepared>,
    ) -> Result<Option<Arc<Guard>>, LiveError>;
    /// Return its interpreter to its state before the last call, which a
    /// refused read ended; `Err` says why it cannot be.
    fn restore_point(&mut self) -> impl Future<Output = Result<Recovery, NoReturn>> + Send;
    /// How its interpreter ended, as its PID 1 recorded it.
    fn interpreter_death(&mut self) -> impl Future<Output = Option<ExitStatus>> + Send;
    /// Wait (bounded) for it to end by itself.
    fn wait_exit(&mut self, within: Duration) -> impl Future<Output = Option<ExitStatus>> + Send;
    /// Kill it, keeping the output already written, and wait (bounded).
    fn kill(self, capture: Option<&mut Capture>) -> impl Future<Output = (Option<ExitStatus>, Dead)> + Send;
    /// Kill it without waiting (a spare nobody will use).
    fn reap(self);
}

/// What a session asks of the host.
pub trait Host: Send + Sync + 'static {
    /// What the session learns about the host once.
    type Facts: Send + Sync + 'static;
    type Sandbox: Sandbox;
    fn probe(&self, opts: &SessionOptions) -> impl Future<Output = Result<Self::Facts, ProbeError>> + Send;
    /// What `status` says about the facts.
    fn describe(&self, facts: &Self::Facts, report: &mut StatusReport);
    /// No sandbox is begun ahead of the first call: begin in the
    /// background what a process's first start does once (nothing of it
    /// starts a sandbox).
    fn warm(&self, _opts: &SessionOptions) {}
    /// Start one sandbox and wait for it to be ready (`spawned` is told
    /// its pid as soon as there is one).
    fn start(
        &self,
        start: &Start<'_, Self::Facts>,
        stop: &mut Stop<'_>,
        spawned: &(dyn Fn(i32, bool) + Send + Sync),
    ) -> impl Future<Output = Result<(Self::Sandbox, Ready), StartError>> + Send;
    /// Kill a sandbox's process group without holding it.
    fn kill_group(&self, pid: i32) {
        crate::spawn::kill_group(pid);
    }
    /// Tell the exit cleanup what session `id` runs.
    fn live_update(&self, id: u64, pids: Vec<i32>, dir: Option<PathBuf>, after: Vec<AfterKill>) {
        crate::rundir::live_update(id, pids, dir, after);
    }
}

/// Bubblewrap and the python runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealHost;

impl Host for RealHost {
    type Facts = Facts;
    type Sandbox = Worker;

    async fn probe(&self, opts: &SessionOptions) -> Result<Facts, ProbeError> {
        Facts::probe(opts).await
    }

    fn warm(&self, opts: &SessionOptions) {
        crate::launch::warm(opts);
    }

    fn describe(&self, facts: &Facts, report: &mut StatusReport) {
        report.bwrap = Some(facts.host.bwrap.clone());
        report.site_dirs = facts.python.site_dirs.clone();
        report.python_notes = facts.python.notes.clone();
    }

    async fn start(
        &self,
        start: &Start<'_, Facts>,
        stop: &mut Stop<'_>,
        spawned: &(dyn Fn(i32, bool) + Send + Sync),
    ) -> Result<(Worker, Ready), StartError> {
        crate::launch::start(start, stop, spawned).await
    }
}

impl Sandbox for Worker {
    fn mounts(&self) -> &MountConfig {
        &self.mounts
    }
    fn pid(&self) -> i32 {
        Worker::pid(self)
    }
    fn guard(&self) -> Option<Arc<Guard>> {
        self.guard.clone()
    }
    fn init_pid(&self) -> Option<i32> {
        self.init_pid
    }
    fn take_plan_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.plan_notes)
    }
    fn masks(&self) -> &MaskReport {
        &self.masks
    }
    fn code(&self) -> CodeForm {
        self.code
    }
    fn keeper(&self) -> bool {
        Worker::keeper(self)
    }
    fn took_point(&self) -> bool {
        Worker::took_point(self)
    }
    fn request_sent(&self) -> bool {
        Worker::request_sent(self)
    }
    fn secret_appeared(&self) -> bool {
        Worker::secret_appeared(self)
    }
    fn secret_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.secret_appeared.clone()
    }
    fn take_killed_for(&self) -> Option<crate::protected::HostKill> {
        Worker::take_killed_for(self)
    }
    fn masks_watch(&self) -> Option<Arc<SecretWatch>> {
        Worker::masks_watch(self)
    }
    fn oom_note(&mut self, died: bool) -> Option<String> {
        Worker::oom_note(self, died)
    }
    fn take_network_notes(&self) -> Vec<String> {
        Worker::take_network_notes(self)
    }
    fn network_review(&self, during: Option<crate::network::review::Reviewing>) {
        match during {
            Some(reviewing) => Worker::network_call_starts(self, reviewing),
            None => Worker::network_call_ended(self),
        }
    }
    fn exited(&mut self) -> Option<ExitStatus> {
        Worker::exited(self)
    }
    fn interpreter_gone(&mut self) -> bool {
        Worker::interpreter_gone(self)
    }
    fn unmasked_secret(&self, outside: &[&Path]) -> Option<PathBuf> {
        if self.mounts.read_roots.is_empty() && !self.mounts.once.iter().any(|m| m.is_dir) {
            return None;
        }
        let now = crate::launch::host_masks(&self.host_secrets, &self.mounts, outside);
        now.into_iter().find(|m| !self.host_masks.contains(m)).map(|m| m.path)
    }
    async fn exec(
        &mut self,
        call: Call<'_>,
        capture: &mut Capture,
        stop: &mut Stop<'_>,
    ) -> Result<ExecDone, Interrupt> {
        Worker::exec(self, call, capture, stop).await
    }
    async fn recover(&mut self, capture: Option<&mut Capture>, reset: bool) -> Result<Recovery, RecoverError> {
        Worker::recover(self, capture, reset).await
    }
    type Prepared = Result<crate::worker::SwapPlan, LiveError>;
    fn prepare_read_only(&self, want: &MountConfig, env: &LiveEnv<'_>) -> Option<Self::Prepared> {
        (self.mounts.workspace_writable && !want.workspace_writable).then(|| self.plan_swap(false, env))
    }
    fn apply_live(
        &mut self,
        want: &MountConfig,
        env: &LiveEnv<'_>,
        prepared: Option<Self::Prepared>,
    ) -> Result<Option<Arc<Guard>>, LiveError> {
        let plan = crate::live_grants::plan(&self.mounts, want)?;
        // A mode change first: the project's mount replaced whole, as
        // planned before (the worker has not changed since: the session's
        // operation lock is held from the plan to here) or planned now.
        let mut ended = None;
        if self.mounts.workspace_writable != want.workspace_writable {
            let swap = match prepared {
                Some(prepared) => prepared?,
                None => self.plan_swap(want.workspace_writable, env)?,
            };
            ended = self.swap_planned(swap, env)?;
        }
        // The ended guard's last look is made even when what follows fails.
        let last_look = |e: LiveError| {
            if let Some(old) = &ended {
                env.notes.lock().extend(old.check_all());
            }
            e
        };
        let live = crate::live_grants::Env {
            pid: self.init_pid.unwrap_or(0),
            secrets: &self.host_secrets,
            trees: env.trees,
            dirs_root: env.dirs_root,
            project: env.project,
            masks: &self.masks,
            quarantine: env.quarantine,
        };
        let added = crate::live_grants::apply(&plan, &live).map_err(last_look)?;
        // The masks of a revoked root went with it.
        self.host_masks.retain(|m| !plan.detach.iter().any(|r| m.path.starts_with(r)));
        for m in added {
            if !self.host_masks.contains(&m) {
                self.host_masks.push(m);
            }
        }
        // A host secret that appears in a tree granted live stops the
        // sandbox at once, as in one granted at the start.
        let granted: Vec<&Path> = plan.attach.iter().filter(|t| t.is_dir).map(|t| t.source.as_path()).collect();
        let points = self.host_secrets.watch_points(&granted, env.trees);
        self.watch_granted(points);
        self.mounts = want.clone();
        Ok(ended)
    }
    async fn restore_point(&mut self) -> Result<Recovery, NoReturn> {
        Worker::restore_point(self).await
    }
    async fn interpreter_death(&mut self) -> Option<ExitStatus> {
        Worker::interpreter_death(self).await
    }
    async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        Worker::wait_exit(self, within).await
    }
    async fn kill(self, capture: Option<&mut Capture>) -> (Option<ExitStatus>, Dead) {
        Worker::kill(self, capture).await
    }
    fn reap(self) {
        Worker::reap(self)
    }
}
