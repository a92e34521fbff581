//! The bash tool's commands in a session: each in a sandbox of its own
//! (see `crate::shell`) with the session's mounts, directories and
//! protections, beside the python sandbox and never waiting for it.

use std::collections::HashMap;

use super::*;
use crate::shell::{Command, Context, Ended, ShellConfig, ShellError};

/// The session's running commands and what they share.
#[derive(Default)]
pub(super) struct Shells {
    /// Held (shared) by each running command; dispose takes it whole.
    running: tokio::sync::RwLock<()>,
    /// How to abort each running command, by its id.
    cancels: parking_lot::Mutex<HashMap<u32, watch::Sender<bool>>>,
    host: tokio::sync::OnceCell<Arc<crate::confine::HostFacts>>,
    config: parking_lot::Mutex<ShellConfig>,
    /// A read-only project's walk, kept between commands (see `confine`).
    plans: crate::confine::PlanCache,
    /// The host-secret check of the trees commands read, kept between them.
    kept_reads: crate::hostsecrets::KeptReads,
    /// Network destinations the user allowed for the session.
    net_grants: crate::network::review::SessionGrants,
    /// The configuration's lists, as the python sandbox's proxy reads them.
    python_lists: crate::network::proxy::LiveLists,
    /// A command was stopped because a secret appeared while it could
    /// write /scratch: set aside before anything mounts it again.
    suspect: std::sync::atomic::AtomicBool,
    /// Why each command aborted by a mount change was stopped, by its id.
    stopped_for: parking_lot::Mutex<HashMap<u32, String>>,
    /// The sandbox started ahead of need for the next command.
    spare: crate::spare::Spare<crate::shell::Spare>,
    /// Bubblewrap's pid of the spare in the slot (ready).
    spare_pid: parking_lot::Mutex<Option<i32>>,
    /// Commands that ran in a spare.
    spares_used: std::sync::atomic::AtomicU64,
    /// Told whenever a spare's start ends (ready or not).
    spare_settled: tokio::sync::Notify,
}

/// The bash tool's spare, for the status: its state, bubblewrap's pid
/// when it is ready, how many commands ran in one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellSpare {
    pub state: crate::outcome::SpareState,
    pub pid: Option<i32>,
    pub used: u64,
}

impl Shells {
    /// Abort every command and wait until none runs.
    pub(super) async fn stop_all(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        for tx in self.cancels.lock().values() {
            let _ = tx.send(true);
        }
        self.running.write().await
    }

    /// Stop every running command: its sandbox has the mounts of before a
    /// change that took some away (a revoked read root, a read-only
    /// mode), which it must not keep until it ends. Its result says `why`.
    pub(super) fn stop_running(&self, why: &str) {
        let cancels = self.cancels.lock();
        let mut stopped = self.stopped_for.lock();
        for (id, tx) in cancels.iter() {
            stopped.insert(*id, why.to_string());
            let _ = tx.send(true);
        }
    }

    /// Kill the spare (the mounts, the configuration changed, or the
    /// session ends); a start under way can no longer fill the slot.
    pub(super) fn discard_spare(&self) {
        let spare = self.spare.clear();
        *self.spare_pid.lock() = None;
        drop(spare);
        self.spare_settled.notify_waiters();
    }

    /// Whether a command left /scratch in doubt (and forget it).
    pub(super) fn take_suspect(&self) -> bool {
        self.suspect.swap(false, Ordering::AcqRel)
    }
}

impl<H: Host> Session<H> {
    /// What the trusted configuration adds to every command.
    pub fn set_shell_config(&self, config: ShellConfig) {
        if let Some(policy) = &config.network {
            *self.shells.python_lists.write() = policy.lists.clone();
        }
        *self.shells.config.lock() = config;
        self.shells.discard_spare();
    }

    /// The bash tool's spare.
    pub fn shell_spare(&self) -> ShellSpare {
        ShellSpare {
            state: self.shells.spare.state(),
            pid: *self.shells.spare_pid.lock(),
            used: self.shells.spares_used.load(Ordering::Relaxed),
        }
    }

    /// Wait until no spare is being started: its state then.
    pub async fn shell_spare_settled(&self) -> ShellSpare {
        loop {
            let settled = self.shells.spare_settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.shells.spare.state() != crate::outcome::SpareState::Starting {
                return self.shell_spare();
            }
            settled.await;
        }
    }

    /// Start a sandbox for the next command like `cmd` in the background,
    /// a little after this command's result, unless one is there or being
    /// started, the session is disposed, or /scratch is in doubt.
    fn refill_shell_spare(&self, cmd: &Command) {
        if self.is_disposed() || self.shells.suspect.load(Ordering::Acquire) || !self.shared.lock().report.prewarm {
            return;
        }
        let Some(ticket) = self.shells.spare.begin() else { return };
        let Some(me) = self.weak.upgrade() else {
            self.shells.spare.abandon(ticket);
            return;
        };
        let template = Command {
            command: String::new(),
            cwd: cmd.cwd.clone(),
            shell: cmd.shell.clone(),
            timeout: None,
            pi_env: cmd.pi_env.clone(),
            reviewing: crate::network::review::Reviewing { ask: None, yolo: cmd.reviewing.yolo },
        };
        let span = self.span();
        tokio::spawn(
            async move {
                // Let the result reach JS first.
                tokio::time::sleep(crate::limits::SPARE_DELAY).await;
                me.make_shell_spare(ticket, &template).await;
                me.shells.spare_settled.notify_waiters();
            }
            .instrument(span),
        );
    }

    /// Make the spare for `ticket` and fill the slot with it; a spare the
    /// slot no longer waits for is killed before a dispose can go on.
    async fn make_shell_spare(&self, ticket: u64, cmd: &Command) {
        let _running = self.shells.running.read().await;
        let made = self.try_shell_spare(ticket, cmd).await;
        let unused = match made {
            Some(spare) => {
                let pid = spare.pid();
                let mut at = self.shells.spare_pid.lock();
                match self.shells.spare.fill(ticket, spare) {
                    Ok(()) => {
                        *at = pid;
                        None
                    }
                    Err(spare) => Some(spare),
                }
            }
            None => {
                self.shells.spare.abandon(ticket);
                None
            }
        };
        drop(unused);
    }

    /// Where a command of this session runs, from the facts read for it.
    fn shell_context<'a>(
        &'a self,
        host: &'a crate::confine::HostFacts,
        dirs: &'a crate::rundir::Dirs,
        project: &'a std::path::Path,
        mounts: &'a crate::permissions::MountConfig,
        config: &'a ShellConfig,
    ) -> Context<'a> {
        Context {
            host,
            dirs,
            project,
            mounts,
            tainted: self.tainted.clone(),
            known: self.known_secrets.clone(),
            config,
            plans: &self.shells.plans,
            kept_reads: &self.shells.kept_reads,
            net_grants: &self.shells.net_grants,
        }
    }

    async fn try_shell_spare(&self, ticket: u64, cmd: &Command) -> Option<crate::shell::Spare> {
        if self.is_disposed() || !self.shells.spare.is_current(ticket) {
            return None;
        }
        let host = self.shells.host.get()?.clone();
        let dirs = self.shared.lock().report.dirs.clone()?;
        let project = std::fs::canonicalize(&self.opts.project_dir).ok()?;
        let mounts = self.shared.lock().report.mounts.clone();
        let config = self.shells.config.lock().clone();
        let ctx = self.shell_context(&host, &dirs, &project, &mounts, &config);
        match crate::shell::make_spare(ctx, cmd).await {
            Ok(spare) => spare,
            Err(e) => {
                tracing::debug!(error = %e, "no spare for the next command");
                None
            }
        }
    }

    /// The python tool's network from the trusted configuration
    /// (`network.python` with a proxy policy): the policy with the
    /// session's grants; none by default.
    pub(super) fn python_network(&self) -> Option<crate::worker::PythonNetwork> {
        let config = self.shells.config.lock();
        let policy = config.network.clone().filter(|_| config.python_network)?;
        let (grants, lists) = (self.shells.net_grants.clone(), self.shells.python_lists.clone());
        Some(crate::worker::PythonNetwork { policy, grants, lists })
    }

    /// Abort the command `id`; whether one was running.
    pub fn cancel_shell(&self, id: u32) -> bool {
        self.shells.cancels.lock().get(&id).is_some_and(|tx| tx.send(true).is_ok())
    }

    /// Run `cmd` in a sandbox of its own, handing its output to
    /// `on_data`; `id` names it for [`Session::cancel_shell`].
    pub async fn exec_shell(
        &self,
        id: u32,
        cmd: Command,
        on_data: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Ended, ShellError> {
        let not_started = |why: String| ShellError::NotStarted(format!("The command was not run: {why}"));
        let refused =
            |why: String| ShellError::NotStarted(format!("The command was not run (it never runs on the host): {why}"));
        let _running = self.shells.running.read().await;
        if self.is_disposed() {
            return Err(not_started("the session was disposed.".into()));
        }
        let (tx, rx) = watch::channel(false);
        self.shells.cancels.lock().insert(id, tx);
        let _forget = Forget(self, id);
        let host = self
            .shells
            .host
            .get_or_try_init(|| async {
                crate::confine::HostFacts::probe(&self.opts).await.map(Arc::new).map_err(|e| e.to_string())
            })
            .await
            .map_err(refused)?
            .clone();
        let dirs = self.shell_dirs().await?;
        let project = std::fs::canonicalize(&self.opts.project_dir).map_err(|e| {
            not_started(format!(
                "the project {} is not accessible: {e}.",
                crate::display::one_line(&self.opts.project_dir)
            ))
        })?;
        let mounts = self.shared.lock().report.mounts.clone();
        let config = self.shells.config.lock().clone();
        let ctx = self.shell_context(&host, &dirs, &project, &mounts, &config);
        let spare = self.shells.spare.take().map(|s| *s);
        *self.shells.spare_pid.lock() = None;
        let template = cmd.clone();
        let (mut ended, used) = crate::shell::run(ctx, cmd, on_data, rx, spare).await?;
        if used {
            self.shells.spares_used.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(why) = self.shells.stopped_for.lock().remove(&id) {
            if ended.ending == crate::shell::Ending::Aborted {
                ended.notes.push(format!("The command was stopped: {why}."));
                ended.ending = crate::shell::Ending::Stopped(why);
            }
        }
        if ended.secret_appeared {
            self.shells.suspect.store(true, Ordering::Release);
        }
        self.refill_shell_spare(&template);
        Ok(ended)
    }

    /// The session directories (made on first use), with a scratch that
    /// a stopped command left in doubt set aside first.
    async fn shell_dirs(&self) -> Result<Dirs, ShellError> {
        let not_started = |e: start::Unprepared| {
            ShellError::NotStarted(format!("The command was not run (it never runs on the host): {e}"))
        };
        let (known, python_doubt) = {
            let sh = self.shared.lock();
            let stopped = sh.python_secret.as_ref().is_some_and(|f| f.load(Ordering::Acquire));
            (sh.report.dirs.clone(), sh.scratch_doubt || stopped)
        };
        if let (Some(dirs), false, false) = (known, self.shells.suspect.load(Ordering::Acquire), python_doubt) {
            return Ok(dirs);
        }
        let mut inner = self.ops.lock().await;
        if self.shells.take_suspect() {
            inner.scratch_suspect = true;
        }
        // The python sandbox was stopped because a secret appeared: it
        // goes now, as its next call would drop it (and that call says
        // why), so that what it wrote to /scratch is set aside before this
        // command mounts it.
        if inner.worker.as_ref().is_some_and(|w| w.secret_appeared()) {
            if let Some(why) = inner.worker.as_ref().and_then(|w| w.take_killed_for()) {
                inner.pending_loss = Some(Discarded::Killed(why));
            }
            self.drop_worker(&mut inner, ResetReason::WorkerError).await;
        }
        let dirs = self.ensure_dirs(&mut inner).map_err(not_started)?;
        if inner.scratch_suspect {
            self.set_aside_scratch(&mut inner, &dirs).await.map_err(not_started)?;
        }
        Ok(dirs)
    }
}

/// Forgets a command's abort when it ends.
struct Forget<'a, H: Host>(&'a Session<H>, u32);

impl<H: Host> Drop for Forget<'_, H> {
    fn drop(&mut self) {
        self.0.shells.cancels.lock().remove(&self.1);
    }
}

/// Whether going from `had` to `want` takes away something a running
/// command's sandbox has: a read root, the writable project, an unmasked
/// secret. (An allow-once path is for one sandbox: its end drops it.)
pub(super) fn takes_away(had: &MountConfig, want: &MountConfig) -> bool {
    (had.workspace_writable && !want.workspace_writable)
        || had.read_roots.iter().any(|r| !want.read_roots.contains(r))
        || had.unmasked.iter().any(|u| !want.unmasked.contains(u))
}
