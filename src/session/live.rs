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

/// What [`Session::set_mounts_because`] takes before the session's lock
/// when the change makes a writable project read-only: the operation lock
/// (no call starts and the sandbox stays the one planned for until it is
/// released), the plan made with the project's walk, and, once the change
/// is made, the guard it ended, whose last look is made after the session's
/// lock is released.
pub(super) struct Held<'a, H: Host> {
    inner: tokio::sync::MutexGuard<'a, Inner<H>>,
    prepared: Option<<H::Sandbox as Sandbox>::Prepared>,
    ended: Option<Arc<crate::protected::Guard>>,
}

/// What a change made in the running sandbox leaves to the session: the
/// guard its slot keeps from now (after a mode change), and the guard a
/// change to read-only ended, whose last look is still to make.
pub(super) struct Applied {
    slot_guard: Option<SlotGuard>,
    ended: Option<Arc<crate::protected::Guard>>,
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

    /// For a change of the running sandbox's writable project to `want`'s
    /// read-only one: the operation lock and the change's plan, made here,
    /// before [`Session::set_mounts_because`] takes the session's lock, so
    /// that the project's walk does not hold it. `None` for any other
    /// change, or while a call runs (then the change restarts the sandbox,
    /// see [`Session::read_only_now`]).
    pub(super) fn hold_for_read_only(&self, want: &MountConfig) -> Option<Held<'_, H>> {
        {
            let sh = self.shared.lock();
            let had = &sh.report.mounts;
            if had == want || !had.workspace_writable || want.workspace_writable {
                return None;
            }
        }
        if self.live_off_reason().is_some() {
            return None;
        }
        let inner = self.ops.try_lock().ok()?;
        let root = inner.dirs.as_ref().map(|d| d.root.clone());
        let prepared = match (inner.worker.as_ref(), root) {
            (Some(w), Some(root)) => self.with_live_env(&root, |env| w.prepare_read_only(want, env)).ok().flatten(),
            _ => None,
        };
        Some(Held { inner, prepared, ended: None })
    }

    /// The last look of the guard a change to read-only ended (what the
    /// writable project was given since the guard's last check), made once
    /// the session's lock is released and before the operation lock is:
    /// the project is read-only to the sandbox by then, and no call starts
    /// before the notes are in.
    pub(super) fn last_look(&self, held: Option<Held<'_, H>>) {
        if let Some(old) = held.and_then(|mut h| h.ended.take()) {
            self.notes.lock().extend(old.check_all());
        }
    }

    /// A change to a read-only project made now, not at the next
    /// execution (a writable mount must not outlive the mode that granted
    /// it): the running sandbox's project mount is replaced (see
    /// `worker::mode`) with the rest of the change, with `held`'s plan where
    /// [`Session::hold_for_read_only`] made one. `Err`: why it restarts
    /// instead (a call runs, a step failed). Nothing to do without a
    /// sandbox or when the project stays writable.
    pub(super) fn read_only_now(
        &self,
        had: &MountConfig,
        want: &MountConfig,
        slot: &mut Slot,
        held: Option<&mut Held<'_, H>>,
    ) -> Result<(), live_grants::Restarted> {
        if !had.workspace_writable || want.workspace_writable {
            return Ok(());
        }
        let mut own;
        let (inner, prepared, ended) = match held {
            Some(h) => (&mut *h.inner, h.prepared.take(), Some(&mut h.ended)),
            None => {
                // The change was not foreseen before the session's lock
                // (another change came between): planned here.
                let Ok(inner) = self.ops.try_lock() else {
                    return Err(live_grants::Restarted("a call was running".into()));
                };
                own = inner;
                (&mut *own, None, None)
            }
        };
        if inner.worker.is_none() {
            return Ok(());
        }
        let began = Instant::now();
        let applied = self.apply_live(inner, want, prepared).map_err(|e| live_grants::Restarted(e.to_string()))?;
        if let Some(guard) = applied.slot_guard {
            slot.set_guard(guard);
        }
        match ended {
            Some(ended) => *ended = applied.ended,
            None => {
                if let Some(old) = applied.ended {
                    self.notes.lock().extend(old.check_all());
                }
            }
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
                None => self.apply_live(inner, &wanted, None).map_err(|e| e.to_string()),
            };
            match result {
                Ok(applied) => {
                    if let Some(guard) = applied.slot_guard {
                        self.shared.lock().slot.set_guard(guard);
                        // The exit cleanup checks the project with it too.
                        self.sync_live();
                    }
                    if let Some(old) = applied.ended {
                        self.notes.lock().extend(old.check_all());
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

    /// Call `f` with what a change in the running sandbox needs of the
    /// session (`dirs_root`: the session's directory).
    fn with_live_env<R>(
        &self,
        dirs_root: &Path,
        f: impl FnOnce(&LiveEnv<'_>) -> R,
    ) -> Result<R, live_grants::LiveError> {
        let project = std::fs::canonicalize(&self.opts.project_dir).map_err(live_grants::LiveError::Project)?;
        let root = self.runtime_root();
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        let trees = [project.as_path(), root.as_path()];
        // Hidden where a grant shows it, as a start does (see `confine`): the
        // runtime root, every session's directory and the scratches set aside.
        let quarantine = Some(root.clone()).filter(|q| std::fs::symlink_metadata(q).is_ok_and(|m| m.is_dir()));
        let env = LiveEnv {
            dirs_root,
            project: &project,
            trees: &trees,
            quarantine: quarantine.as_deref(),
            runtime_root: &root,
            notes: &self.notes,
            tainted: &self.tainted,
            known: &self.known_secrets,
            guard_inotify: self.opts.guard_inotify.unwrap_or(crate::protected::inotify_init),
        };
        Ok(f(&env))
    }

    /// Apply `wanted` to the running sandbox (with `prepared`, made for
    /// this change by [`Session::hold_for_read_only`]); after a mode
    /// change, its guard, for the session's slot (the change starts or ends
    /// it).
    fn apply_live(
        &self,
        inner: &mut Inner<H>,
        wanted: &MountConfig,
        prepared: Option<<H::Sandbox as Sandbox>::Prepared>,
    ) -> Result<Applied, live_grants::LiveError> {
        let Some(dirs) = inner.dirs.clone() else { return Err(live_grants::LiveError::NoDirectory) };
        let Some(w) = inner.worker.as_mut() else { return Err(live_grants::LiveError::NoSandbox) };
        let began = Instant::now();
        let mode = w.mounts().workspace_writable != wanted.workspace_writable;
        let ended = self.with_live_env(&dirs.root, |env| w.apply_live(wanted, env, prepared))??;
        tracing::debug!(ms = began.elapsed().as_secs_f64() * 1e3, "grants applied to the running sandbox");
        Ok(Applied {
            slot_guard: mode.then(|| {
                let held = w.mounts().workspace_writable && w.guard().is_none();
                (w.guard().map(|g| (g, w.init_pid())), held)
            }),
            ended,
        })
    }
}
