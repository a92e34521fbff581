//! Making sandboxes for a session: the host probe and the session
//! directories (once each), cold starts, and the spare sandbox kept ready
//! in the background.

use super::*;

/// Why no sandbox could be made for the session (before any start).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unprepared {
    /// The host probe failed (no bubblewrap, no interpreter, ...).
    #[error("{0}")]
    Probe(#[from] crate::launch::ProbeError),
    /// The working directory cannot be resolved.
    #[error("Working directory {} is not accessible: {source}", crate::display::one_line(.path))]
    Project { path: PathBuf, source: std::io::Error },
    /// The session directory could not be made.
    #[error("{0}")]
    Dirs(#[from] crate::rundir::DirError),
    /// A scratch a sandbox stopped for a secret could write was not set aside.
    #[error(
        "No sandbox was started: a secret appeared while the last sandbox could write /scratch, and /scratch \
         could not be set aside ({source}); it is not mounted again until it is. Move {} out of the way and run \
         again.",
        crate::display::one_line(.scratch)
    )]
    ScratchStuck { scratch: PathBuf, source: std::io::Error },
}

impl Unprepared {
    /// Why no sandbox could start, as a value.
    fn start_failure(&self) -> StartFailure {
        use crate::launch::ProbeError;
        match self {
            Unprepared::Probe(ProbeError::Bwrap(crate::probe::BwrapError::NotFound)) => StartFailure::BwrapMissing,
            _ => StartFailure::Other,
        }
    }
}

impl<H: Host> Session<H> {
    /// Probe the host and make the session directory (once each).
    pub(super) async fn prepare(&self, inner: &mut Inner<H>) -> Result<(Arc<H::Facts>, Dirs, PathBuf), Unprepared> {
        let facts = match &inner.facts {
            Some(f) => f.clone(),
            None => {
                let facts = Arc::new(self.host.probe(&self.opts).await?);
                inner.facts = Some(facts.clone());
                self.host.describe(&facts, &mut self.shared.lock().report);
                facts
            }
        };
        let project = std::fs::canonicalize(&self.opts.project_dir)
            .map_err(|source| Unprepared::Project { path: self.opts.project_dir.clone(), source })?;
        let dirs = self.ensure_dirs(inner)?;
        Ok((facts, dirs, project))
    }

    /// The session directory, made on first use.
    pub(super) fn ensure_dirs(&self, inner: &mut Inner<H>) -> Result<Dirs, Unprepared> {
        if let Some(d) = &inner.dirs {
            return Ok(d.clone());
        }
        let root = self.opts.runtime_root.clone().unwrap_or_else(crate::rundir::default_runtime_root);
        crate::rundir::outside_project(&root, &self.opts.project_dir)?;
        let d = crate::rundir::make_dirs(Some(&root))?;
        inner.dirs = Some(d.clone());
        self.shared.lock().report.dirs = Some(d.clone());
        self.sync_live();
        Ok(d)
    }

    /// Set aside a scratch that a sandbox stopped for a secret could have
    /// written (see `scratch::set_aside`); the text says why when it
    /// cannot be, and nothing mounts it until it is.
    pub(super) async fn set_aside_scratch(&self, inner: &mut Inner<H>, dirs: &Dirs) -> Result<(), Unprepared> {
        self.discard_spare();
        let first = self.shared.lock().report.set_aside.len() + 1;
        let name = dirs.scratch.file_name().unwrap_or(std::ffi::OsStr::new("scratch")).to_owned();
        let root = dirs.root.clone();
        let moved = tokio::task::spawn_blocking(move || crate::scratch::set_aside(&root, &name, first))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match moved {
            Ok(moved) => {
                inner.scratch_suspect = false;
                self.shared.lock().scratch_doubt = false;
                self.scratch.forget();
                if let Some(moved) = moved {
                    tracing::debug!(to = %moved.display(), "scratch set aside");
                    self.notes.lock().push(crate::scratch::set_aside_note(&moved));
                    self.shared.lock().report.set_aside.push(moved);
                }
                Ok(())
            }
            Err(source) => Err(Unprepared::ScratchStuck { scratch: dirs.scratch.clone(), source }),
        }
    }

    /// Make the session's interpreter: the spare when one is ready for the
    /// current mounts, else a cold start that waits for the ready frame.
    pub(super) async fn start_worker(
        &self,
        inner: &mut Inner<H>,
        call: u32,
        wake: &mut watch::Receiver<u64>,
    ) -> Result<(), Box<Outcome>> {
        let generation = self.shared.lock().report.history.generation;
        let (facts, dirs, project) = self.prepare(inner).await.map_err(|e| {
            let msg = e.to_string();
            self.shared.lock().report.availability = Availability::Unavailable(msg.clone());
            let mut o = Outcome::static_result(Status::Unavailable, generation, msg);
            o.start_failure = Some(e.start_failure());
            Box::new(o)
        })?;
        // A sandbox stopped because a secret appeared could have written it
        // to /scratch: that scratch is set aside before any sandbox mounts
        // scratch again (a spare has the old one mounted).
        if self.shells.take_suspect() {
            inner.scratch_suspect = true;
        }
        if inner.scratch_suspect {
            if let Err(e) = self.set_aside_scratch(inner, &dirs).await {
                let mut o = Outcome::static_result(Status::Unavailable, generation, e.to_string());
                o.start_failure = Some(StartFailure::Other);
                return Err(Box::new(o));
            }
        }
        // A spare under way (the one begun before the first call) is
        // waited for rather than started beside.
        self.await_spare_start(call, wake).await;
        let mounts = self.shared.lock().report.mounts.clone();
        let bump = || self.shared.lock().report.history.started();
        let mut spare = self.take_spare(&mounts);
        // A writable spare was planned while the last sandbox could still
        // write the project: it is used only if the project still holds
        // exactly what it protected.
        if let Some(guard) = spare.as_ref().and_then(|s| s.guard()) {
            let fits = tokio::task::spawn_blocking(move || guard.still_matches()).await.unwrap_or(false);
            if !fits {
                if let Some(stale) = spare.take() {
                    (*stale).reap();
                }
            }
        }
        // A spare planned before a secret appeared does not mask it: one
        // of the project's, or a host secret in a read root (the masks
        // made again, which its watch may have missed).
        if self.masks_stale(spare.as_deref()).await.is_some()
            || spare.as_deref().is_some_and(|s| self.unmasked_secret(s).is_some())
        {
            if let Some(stale) = spare.take() {
                (*stale).reap();
            }
        }
        if let Some(spare) = spare {
            bump();
            self.adopt(inner, *spare);
            return Ok(());
        }
        let generation = bump();
        let start = self.start_of(&facts, &dirs, project, mounts.clone());
        let check = self.halt_check(Some(call), mounts.clone());
        let mut stop = Stop { wake, check: &check };
        self.set_slot(Slot::Starting { pid: None });
        let spawned = |pid: i32, alive: bool| self.set_slot(Slot::Starting { pid: alive.then_some(pid) });
        match self.host.start(&start, &mut stop, &spawned).await {
            Ok((worker, ready)) => {
                self.ready(ready);
                self.adopt(inner, worker);
                inner.start_failed = false;
                Ok(())
            }
            Err(e) => {
                // An allow-once path goes with the start it was for.
                self.forget_once(&mounts);
                inner.start_failed = true;
                self.set_slot(Slot::Empty);
                self.shared.lock().report.history.discarded(ResetReason::StartupFailure);
                let (status, msg) = start_failure(&e);
                let mut o = Outcome::static_result(status, generation, msg);
                o.start_failure = start_failure_of(&e);
                if let crate::worker::StartError::Halted(halt) = e {
                    o.killed_for = Some(halt.into());
                }
                Err(Box::new(o))
            }
        }
    }

    pub(super) fn start_of<'a>(
        &self,
        facts: &'a H::Facts,
        dirs: &'a Dirs,
        project: PathBuf,
        mounts: MountConfig,
    ) -> Start<'a, H::Facts> {
        Start {
            facts,
            dirs,
            project,
            project_names: self.project_names(),
            mounts,
            notes: self.notes.clone(),
            tainted: self.tainted.clone(),
            known: self.known_secrets.clone(),
            rollback: self.opts.rollback,
            network: self.python_network(),
        }
    }

    /// What a ready frame tells the session.
    pub(super) fn ready(&self, ready: crate::worker::Ready) {
        let mut sh = self.shared.lock();
        sh.report.availability = Availability::Available;
        sh.report.runtime_version = Some(ready.runtime_version);
        for note in ready.site_notes {
            if !sh.report.python_notes.contains(&note) {
                sh.report.python_notes.push(note);
            }
        }
    }

    /// /scratch may hold a secret: it is set aside before any sandbox (a
    /// bash command's too) mounts it again.
    pub(super) fn doubt_scratch(&self, inner: &mut Inner<H>) {
        inner.scratch_suspect = true;
        self.shared.lock().scratch_doubt = true;
    }

    /// Make `worker` the session's interpreter.
    pub(super) fn adopt(&self, inner: &mut Inner<H>, mut worker: H::Sandbox) {
        self.notes.lock().extend(worker.take_plan_notes());
        {
            let mut sh = self.shared.lock();
            sh.python_secret = Some(worker.secret_flag());
            sh.report.masks = Some(worker.masks().clone());
            let mut known = self.known_secrets.lock();
            let masks = worker.masks();
            for m in masks.masked.iter().chain(&masks.unmasked) {
                if !known.masks.contains(m) {
                    known.masks.push(m.clone());
                }
            }
            known.idents.extend(masks.idents.iter().copied());
        }
        let guard = worker.guard().map(|g| (g, worker.init_pid()));
        // A writable mode's sandbox without a guard has the project
        // read-only: it failed closed.
        let held_read_only = worker.mounts().workspace_writable && guard.is_none();
        self.set_slot(Slot::Ready { pid: worker.pid(), code: worker.code(), guard, held_read_only });
        inner.worker = Some(worker);
    }

    /// The session's sandbox is now `slot`.
    pub(super) fn set_slot(&self, slot: Slot) {
        self.shared.lock().slot = slot;
        self.sync_live();
    }

    /// Tell the exit-cleanup registry what this session has running.
    pub(super) fn sync_live(&self) {
        let sh = self.shared.lock();
        let pids = sh.slot.pid().into_iter().chain(sh.spare_pid).collect();
        let dir = sh.report.dirs.as_ref().map(|d| d.root.clone());
        // At process exit the active sandbox's project is checked once its
        // processes are gone, as after any kill.
        let after: Vec<crate::rundir::AfterKill> = sh
            .slot
            .guard()
            .map(|(guard, init)| {
                let notes = self.notes.clone();
                std::sync::Arc::new(move || protected::settle_and_check(&guard, init, &notes))
                    as crate::rundir::AfterKill
            })
            .into_iter()
            .collect();
        drop(sh);
        self.host.live_update(self.id, pids, dir, after);
    }

    /// Take the ready spare if it was made for `mounts` and is still alive.
    pub(super) fn take_spare(&self, mounts: &MountConfig) -> Option<Box<H::Sandbox>> {
        // A spare never has allow-once mounts: keep it for the sandbox after.
        if mounts.has_once() {
            return None;
        }
        let mut w = self.spare.take()?;
        let made_on = std::mem::take(&mut self.shared.lock().spare_project);
        self.shared.lock().spare_pid = None;
        let project = std::fs::canonicalize(&self.opts.project_dir).ok().and_then(|p| crate::paths::dir_id(&p));
        if w.mounts() != mounts || w.exited().is_some() || made_on.is_none() || made_on != project {
            (*w).reap();
            self.sync_live();
            return None;
        }
        Some(w)
    }

    /// Kill the spare (mounts changed, or the session ends).
    pub(super) fn discard_spare(&self) {
        self.shells.discard_spare();
        if let Some(w) = self.spare.clear() {
            (*w).reap();
        }
        self.spare_settled.notify_waiters();
        let pid = self.shared.lock().spare_pid.take();
        if let Some(pid) = pid {
            self.host.kill_group(pid); // a spare still starting
        }
        self.sync_live();
    }

    /// Wait while a spare is starting, until it is ready or abandoned, the
    /// mounts change (which discards it), or `call` is cancelled or the
    /// session disposed. A spare's start is bounded by the start deadline.
    pub(super) async fn await_spare_start(&self, call: u32, wake: &mut watch::Receiver<u64>) {
        loop {
            let settled = self.spare_settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if !matches!(self.spare.state(), crate::outcome::SpareState::Starting)
                || self.is_cancelled(call)
                || self.is_disposed()
            {
                return;
            }
            tokio::select! {
                _ = &mut settled => {}
                changed = wake.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // A change of mounts discards the spare; whatever else
                    // woke us is looked at by the loop.
                }
            }
        }
    }

    /// Start a spare in the background, after `delay`, if prewarming is on
    /// and none exists.
    pub(super) fn refill_spare(&self, inner: &Inner<H>, delay: Duration) {
        let (Some(facts), Some(dirs)) = (inner.facts.clone(), inner.dirs.clone()) else { return };
        if inner.start_failed || inner.scratch_suspect {
            return;
        }
        {
            let sh = self.shared.lock();
            if !sh.report.prewarm || sh.report.disposed {
                return;
            }
            // No sandbox is set up while one that can write the project
            // runs: bubblewrap resolves the mount points over /workspace by
            // path, and the running code could swap a link in on the way.
            if sh.report.mounts.workspace_writable {
                return;
            }
        }
        // With a sandbox running, the spare is only for its replacement:
        // its slot is claimed and its start begun once no call has run for
        // `delay`, so that the start (both cores for a while) does not land
        // on the calls of a model that answers at once (the call after a
        // reset or a rollback). Unclaimed meanwhile, the slot makes a call
        // that needs a sandbox start its own instead of waiting for it.
        let kept = inner.worker.is_some() && !delay.is_zero();
        let ticket = if kept {
            // One waits at a time (calls back to back would each add one).
            let mut sh = self.shared.lock();
            if self.spare.state() != crate::outcome::SpareState::None || sh.spare_waiting {
                return;
            }
            sh.spare_waiting = true;
            None
        } else {
            let Some(ticket) = self.spare.begin() else { return };
            Some(ticket)
        };
        let Some(me) = self.weak.upgrade() else {
            match ticket {
                Some(ticket) => self.spare.abandon(ticket),
                None => self.shared.lock().spare_waiting = false,
            }
            return;
        };
        let span = self.span();
        tokio::spawn(
            async move {
                // Forking the host process costs a few milliseconds of both
                // cores: let the result that triggered this reach JS first.
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                    while let Some(left) = kept.then(|| me.busy_within(delay)).flatten() {
                        tokio::time::sleep(left).await;
                    }
                }
                if kept {
                    me.shared.lock().spare_waiting = false;
                }
                let ticket = match ticket {
                    Some(ticket) => ticket,
                    None if me.is_disposed() => return,
                    None => match me.spare.begin() {
                        Some(ticket) => ticket,
                        None => return,
                    },
                };
                let Ok(project) = std::fs::canonicalize(&me.opts.project_dir) else {
                    me.spare.abandon(ticket);
                    me.spare_settled.notify_waiters();
                    return;
                };
                let mounts = me.shared.lock().report.mounts.lasting();
                let (project_id, project_at) = (crate::paths::dir_id(&project), project.clone());
                let made = if me.spare.is_current(ticket) {
                    let mut wake = me.wake.subscribe();
                    let start = me.start_of(&facts, &dirs, project, mounts.clone());
                    let check = me.halt_check(None, mounts.clone());
                    let mut stop = Stop { wake: &mut wake, check: &check };
                    let spawned = |pid: i32, alive: bool| me.spare_spawned(ticket, pid, alive);
                    me.host.start(&start, &mut stop, &spawned).await.ok()
                } else {
                    None
                };
                // Another directory put at the project's path while it
                // started: which one it has is not known.
                let current = {
                    let sh = me.shared.lock();
                    !sh.report.disposed && sh.report.mounts.lasting() == mounts
                } && project_id.is_some()
                    && crate::paths::dir_id(&project_at) == project_id;
                let unused = match made {
                    Some((w, ready)) if current => {
                        me.ready(ready);
                        // Told once it is the spare (taken before, it is not used).
                        let filled = me.spare.fill(ticket, w);
                        if filled.is_ok() {
                            me.shared.lock().spare_project = project_id;
                        }
                        filled.err()
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
                me.spare_settled.notify_waiters();
                me.sync_live();
            }
            .instrument(span),
        );
    }

    /// How long to wait until no call or reset has run for `quiet`: None
    /// when no call runs and the last call or reset ended `quiet` ago.
    fn busy_within(&self, quiet: Duration) -> Option<Duration> {
        let sh = self.shared.lock();
        if sh.running_call.is_some() {
            return Some(quiet);
        }
        let left = quiet.saturating_sub(sh.last_active?.elapsed());
        (!left.is_zero()).then_some(left)
    }

    /// Record the pid of the spare being started under `ticket` (so that a
    /// dispose can kill it), or forget it once its start failed.
    pub(super) fn spare_spawned(&self, ticket: u64, pid: i32, alive: bool) {
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
}
