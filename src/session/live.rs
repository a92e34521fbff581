//! Grants that reach the running sandbox (see `live_grants`): the
//! session's side. A mount change that only adds grants does not kill the
//! sandbox; the next execution attaches them, and a call run again after
//! a grant first returns its interpreter to the state before the call's
//! first run. Anything else, or a step that fails, restarts the sandbox,
//! and the result says why state was lost.

use super::*;
use crate::held;
use crate::live_grants;
use crate::session::host::LiveEnv;

/// How long the sandbox's processes may take to stop for a revoke.
const HOLD_WAIT: Duration = Duration::from_secs(2);

/// What the session remembers of live grants.
#[derive(Debug, Default)]
pub(super) struct LiveState {
    /// Why the last mount change kills the sandbox instead (until the
    /// next execution replaces it).
    pub(super) restarted_for: Option<String>,
    /// The next execution is a call run again after a grant.
    restore_next: bool,
    /// How the last such run went: with its state kept, or why not.
    rerun: Option<Result<(), live_grants::Restarted>>,
}

impl<H: Host> Session<H> {
    fn rollback_on(&self) -> bool {
        self.opts.rollback.unwrap_or_else(|| Settings::from_env().rollback)
    }

    /// Why grants restart the sandbox in this session, or `None` when
    /// they reach the running one.
    pub fn live_off_reason(&self) -> Option<String> {
        live_grants::restart_reason(self.rollback_on())
    }

    /// What `status` says of how grants are applied here.
    pub fn grants_line(&self) -> String {
        live_grants::status_line(self.rollback_on())
    }

    /// Why going from `had` to `want` restarts the sandbox, or `None`
    /// when the change can be made live.
    pub(super) fn restart_why(&self, had: &MountConfig, want: &MountConfig) -> Option<String> {
        if had == want {
            return None;
        }
        if let Some(why) = self.live_off_reason() {
            return Some(why);
        }
        live_grants::plan(had, want).err().map(|e| e.to_string())
    }

    /// Detach the read roots revoked from `had` to `want` from the running
    /// sandbox (its bubblewrap process is `bwrap`), at once; or why it
    /// restarts instead. Nothing to do without a sandbox.
    pub(super) fn revoke_now(
        &self,
        had: &MountConfig,
        want: &MountConfig,
        bwrap: Option<i32>,
    ) -> Result<(), live_grants::Restarted> {
        let Some(bwrap) = bwrap else { return Ok(()) };
        let plan = live_grants::plan(had, want).map_err(|e| live_grants::Restarted(e.to_string()))?;
        if plan.detach.is_empty() {
            return Ok(());
        }
        // bubblewrap's child, the sandbox's PID 1, is in its namespaces.
        let children = std::fs::read_to_string(format!("/proc/{bwrap}/task/{bwrap}/children")).unwrap_or_default();
        let inside = children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let restarted = |e: &dyn std::fmt::Display| {
            live_grants::Restarted(format!("a revoked read root could not be detached from the running sandbox ({e})"))
        };
        // A working directory, root or descriptor on the detached tree
        // would keep it readable: the sandbox's processes are stopped while
        // the roots go and what they hold is looked at (see `held`).
        if inside <= 0 {
            return Err(restarted(&live_grants::LiveError::NoProcess));
        }
        let ids = held::mount_ids(inside, &plan.detach).map_err(|e| restarted(&e))?;
        let frozen = held::Frozen::stop(inside, HOLD_WAIT).map_err(|e| restarted(&e))?;
        live_grants::revoke(inside, &plan).map_err(|e| restarted(&e))?;
        match frozen.holding(&ids) {
            Ok(None) => Ok(()),
            Ok(Some(held)) => {
                frozen.leave_stopped();
                Err(live_grants::Restarted(held.to_string()))
            }
            Err(e) => {
                frozen.leave_stopped();
                Err(restarted(&e))
            }
        }
    }

    /// A change to a read-only project made now, not at the next
    /// execution (a writable mount must not outlive the mode that granted
    /// it): the running sandbox's project mount is replaced (see
    /// `worker::mode`) with the rest of the change. `Err`: why it restarts
    /// instead (a call runs, a step failed). Nothing to do without a
    /// sandbox or when the project stays writable.
    pub(super) fn read_only_now(
        &self,
        had: &MountConfig,
        want: &MountConfig,
        slot: &mut Slot,
    ) -> Result<(), live_grants::Restarted> {
        if !had.workspace_writable || want.workspace_writable {
            return Ok(());
        }
        let Ok(mut inner) = self.ops.try_lock() else {
            return Err(live_grants::Restarted("a call was running".into()));
        };
        if inner.worker.is_none() {
            return Ok(());
        }
        let began = Instant::now();
        let guard = self.apply_live(&mut inner, want).map_err(|e| live_grants::Restarted(e.to_string()))?;
        if let Some(guard) = guard {
            slot.set_guard(guard);
        }
        tracing::debug!(ms = began.elapsed().as_secs_f64() * 1e3, "project made read-only in the running sandbox");
        Ok(())
    }

    /// Why the next sandbox would hold the project read-only in a writable
    /// mode (it cannot be protected now), for what a change to such a mode
    /// tells the user; `None` when it can be protected. A walk of the
    /// project, bounded as a start's (see `protected::writable_refusal`).
    pub fn writable_refusal(&self) -> Option<String> {
        let project = std::fs::canonicalize(&self.opts.project_dir).ok()?;
        let mut settings = Settings::from_env();
        // As a start: git never trusts a file under the runtime root.
        let root = self.runtime_root();
        settings.git.untrusted.push(std::fs::canonicalize(&root).unwrap_or(root));
        crate::protected::writable_refusal(&project, &settings.protected, settings.scan, &settings.git, &self.tainted)
            .map(|e| e.to_string())
    }

    /// Why the last mount change restarts the sandbox instead of reaching
    /// the running one, until the next execution replaces it.
    pub fn restart_pending(&self) -> Option<String> {
        self.shared.lock().live.restarted_for.clone()
    }

    /// The next execution is the call run again after a grant: it starts
    /// from the state before the call's first run.
    pub fn rerun_after_grant(&self) {
        let mut sh = self.shared.lock();
        sh.live.restore_next = true;
        sh.live.rerun = None;
    }

    /// How the last run after a grant went: `Ok` with the interpreter's
    /// state kept, or why the sandbox restarted.
    pub fn take_rerun(&self) -> Option<Result<(), live_grants::Restarted>> {
        self.shared.lock().live.rerun.take()
    }

    /// Bring the running sandbox to the session's mounts: attach the
    /// grants added since it started, or replace it and say why; then,
    /// for a call run again after a grant, return to its rollback point.
    pub(super) async fn follow_mounts(&self, inner: &mut Inner<H>) {
        let wanted = self.shared.lock().report.mounts.clone();
        let (restore, killed_for) = {
            let mut sh = self.shared.lock();
            (std::mem::take(&mut sh.live.restore_next), sh.live.restarted_for.take())
        };
        let granted = self.shared.lock().remount_reason.is_some() || restore;
        let changed = inner.worker.as_ref().is_some_and(|w| w.mounts() != &wanted);
        let mut failed = None;
        if changed {
            let result = match killed_for {
                Some(why) => Err(why),
                None => self.apply_live(inner, &wanted).map_err(|e| e.to_string()),
            };
            match result {
                Ok(guard) => {
                    if let Some(guard) = guard {
                        self.shared.lock().slot.set_guard(guard);
                    }
                    // Nothing is lost: the allow-once paths stay with this
                    // sandbox (its mounts now name them).
                    let mut sh = self.shared.lock();
                    sh.remount_reason = None;
                    sh.kept_once = Default::default();
                }
                Err(why) => {
                    let reason = self.remount_reason();
                    // A grant says why it was not applied live; a mode change
                    // is a restart anyway.
                    inner.pending_loss = Some(if granted {
                        Discarded::NotLive { reason, why: why.clone() }
                    } else {
                        Discarded::Remounted(reason)
                    });
                    self.drop_worker(inner, ResetReason::MountsChanged).await;
                    failed = Some(why);
                }
            }
        } else if restore && inner.worker.is_none() {
            failed = Some(self.live_off_reason().unwrap_or_else(|| "the sandbox was no longer running".into()));
        }
        if !restore {
            return;
        }
        if failed.is_none() {
            if let Some(w) = inner.worker.as_mut() {
                if let Err(why) = w.restore_point().await.map_err(|e| e.to_string()) {
                    inner.pending_loss = Some(Discarded::NoReturn(why.clone()));
                    self.drop_worker(inner, ResetReason::MountsChanged).await;
                    failed = Some(why);
                }
            }
        }
        self.shared.lock().live.rerun = Some(failed.map_or(Ok(()), |why| Err(live_grants::Restarted(why))));
    }

    /// Apply `wanted` to the running sandbox; after a mode change, its
    /// guard, for the session's slot (the change starts or ends it).
    fn apply_live(
        &self,
        inner: &mut Inner<H>,
        wanted: &MountConfig,
    ) -> Result<Option<SlotGuard>, live_grants::LiveError> {
        let Some(dirs) = inner.dirs.clone() else { return Err(live_grants::LiveError::NoDirectory) };
        let project = std::fs::canonicalize(&self.opts.project_dir).map_err(live_grants::LiveError::Project)?;
        let root = self.runtime_root();
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        let trees = [project.as_path(), root.as_path()];
        // Hidden where a grant shows it, as a start does (see `confine`): the
        // runtime root, every session's directory and the scratches set aside.
        let quarantine = Some(root.clone()).filter(|q| std::fs::symlink_metadata(q).is_ok_and(|m| m.is_dir()));
        let env = LiveEnv {
            dirs_root: &dirs.root,
            project: &project,
            trees: &trees,
            quarantine: quarantine.as_deref(),
            runtime_root: &root,
            notes: &self.notes,
            tainted: &self.tainted,
            known: &self.known_secrets,
            guard_inotify: self.opts.guard_inotify.unwrap_or(crate::protected::inotify_init),
        };
        let Some(w) = inner.worker.as_mut() else { return Err(live_grants::LiveError::NoSandbox) };
        let began = Instant::now();
        let mode = w.mounts().workspace_writable != wanted.workspace_writable;
        w.apply_live(wanted, &env)?;
        tracing::debug!(ms = began.elapsed().as_secs_f64() * 1e3, "grants applied to the running sandbox");
        Ok(mode.then(|| {
            let held = w.mounts().workspace_writable && w.guard().is_none();
            (w.guard().map(|g| (g, w.init_pid())), held)
        }))
    }
}
