//! One execution on the session's sandbox: making sure a sandbox with the
//! wanted mounts is there, running the call, and turning how it ended
//! (a result, or an interrupt that is rolled back or kills the sandbox)
//! into the call's [`Outcome`].

use super::*;

/// What one call asks for: its code, its timeout in seconds (clamped to
/// the bounds here), and where its progress goes.
pub(super) struct CallRequest {
    pub(super) code: String,
    pub(super) timeout_seconds: u32,
    pub(super) progress: Option<ProgressFn>,
}

impl<H: Host> Session<H> {
    pub(super) async fn execute_locked(
        &self,
        inner: &mut Inner<H>,
        request: CallRequest,
        call: u32,
        wake: &mut watch::Receiver<u64>,
    ) -> Outcome {
        let CallRequest { code, timeout_seconds, progress } = request;
        let generation = || self.shared.lock().report.history.generation;
        if code.len() > MAX_CODE_BYTES {
            return Outcome::static_result(
                Status::Unavailable,
                generation(),
                format!("Code exceeds the {MAX_CODE_BYTES} byte limit."),
            );
        }
        let timeout_seconds = timeout_seconds.clamp(MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS);

        // A sandbox started with other mounts than the session's gets the
        // grants added since, or is replaced; a call run again after a
        // grant starts from the state before its first run.
        self.follow_mounts(inner).await;
        // A host secret that appeared in a read root since the sandbox
        // started is not masked in it (the watch stops it at once where
        // inotify works; this is the check that always runs).
        if let Some(path) = inner.worker.as_ref().and_then(|w| self.unmasked_secret(w)) {
            // It could read the secret, and write it to /scratch.
            self.doubt_scratch(inner);
            inner.pending_loss = Some(Discarded::HostSecret(path));
            self.drop_worker(inner, ResetReason::MountsChanged).await;
        }
        // A worker that died while idle is reported, not silently replaced.
        if let Some(w) = inner.worker.as_mut() {
            if let Some(why) = w.take_killed_for() {
                inner.pending_loss = Some(Discarded::Killed(why));
                self.drop_worker(inner, ResetReason::WorkerError).await;
            } else if w.keeper() && w.interpreter_gone() {
                // The sandbox is still there: a fresh interpreter in it.
                inner.pending_loss = Some(Discarded::DiedIdle { oom: w.oom_note(true) });
                if w.recover(None, true).await.is_ok() {
                    self.shared.lock().report.history.replaced(ResetReason::WorkerDiedIdle);
                } else {
                    self.drop_worker(inner, ResetReason::WorkerDiedIdle).await;
                }
            } else if let Some(status) = w.exited() {
                inner.pending_loss = Some(Discarded::SandboxDied { exit: Some(status), oom: w.oom_note(true) });
                self.drop_worker(inner, ResetReason::WorkerDiedIdle).await;
            } else if !w.keeper() && w.interpreter_gone() {
                // The interpreter is the sandbox's PID 1 and its exit has
                // begun, but bubblewrap has not yet exited after it (a
                // while on a loaded machine): the call would be sent to no
                // one and be reported as a death during it.
                let exit = w.wait_exit(DEATH_GRACE).await;
                inner.pending_loss = Some(Discarded::SandboxDied { exit, oom: w.oom_note(true) });
                self.drop_worker(inner, ResetReason::WorkerDiedIdle).await;
            }
        }
        // A project secret that appeared since the sandbox started is not
        // masked in it: a new sandbox, planned now, masks it (the watch
        // stops it at once; this reads the watch's queue, or walks).
        if let Some(why) = self.masks_stale(inner.worker.as_ref()).await {
            self.doubt_scratch(inner);
            inner.pending_loss = Some(Discarded::NewSecret(why));
            self.drop_worker(inner, ResetReason::MountsChanged).await;
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
                    inner.pending_loss = Some(Discarded::Remounted(self.remount_reason()));
                    continue;
                }
                return *outcome;
            }
            // A change that came while it started found no process to kill
            // (only the wake, which the start consumed): start again.
            let wanted = self.shared.lock().report.mounts.clone();
            if inner.worker.as_ref().is_some_and(|w| w.mounts() != &wanted) {
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
        let seq = self.shared.lock().report.history.call();
        let (out_path, err_path) = log_paths(&dirs, seq);
        let nonce = format!("{:016x}{:08x}", self.nonce_base, seq);
        let mut capture = Capture::new(frame::end_mark(&nonce), out_path.clone(), err_path.clone());
        let mut o = Outcome::static_result(Status::Ok, generation(), String::new());
        o.diagnostic = None;
        o.started = true;

        let Some(worker) = inner.worker.as_mut() else {
            return Outcome::static_result(Status::WorkerError, generation(), "internal error: no sandbox".into());
        };
        let guard = worker.guard();
        let deadline = tokio::time::Instant::from_std(Instant::now() + Duration::from_secs(timeout_seconds as u64));
        let mounts = worker.mounts().clone();
        let check = self.halt_check(Some(call), mounts);
        let mut stop = Stop { wake, check: &check };
        let mark = frame::end_mark(&nonce);
        let call = Call { seq, code: &code, mark: &mark, deadline, progress };
        worker.network_review(Some(self.network_review.lock().clone()));
        let result = worker.exec(call, &mut capture, &mut stop).await;
        worker.network_review(None);
        // What its network's proxy decided during the call, read before a
        // recovery may stop the sandbox (and its proxy).
        o.notes.extend(worker.take_network_notes());
        if worker.took_point() {
            self.shared.lock().report.history.point_taken();
        }
        match result {
            Ok(done) => {
                PythonRuntime.report(done.report, &dirs.scratch, &mut o);
                o.state = StateFate::Kept;
                // Processes the code started that the memory cap ended.
                o.notes.extend(inner.worker.as_mut().and_then(|w| w.oom_note(false)));
                if let Err(why) = done.after {
                    // The worker misbehaved after its result (or the host
                    // stopped the sandbox then, and says why): keep the
                    // result, but its interpreter is gone.
                    let killed_for = inner.worker.as_ref().and_then(|w| w.take_killed_for());
                    self.kill_worker(inner, Some(&mut capture), ResetReason::WorkerError).await;
                    o.killed_for = killed_for.as_ref().map(KilledFor::from);
                    o.state = StateFate::Lost(Loss::AfterResult(match killed_for {
                        Some(k) => AfterResult::Killed(k),
                        None => AfterResult::Failed(why.to_string()),
                    }));
                }
            }
            Err(Interrupt::Halted(Halt::Cancelled)) if inner.worker.as_ref().is_some_and(|w| !w.request_sent()) => {
                // Cancelled before its request reached the interpreter: no
                // code ran, so nothing is rolled back, lost or killed.
                tracing::debug!("cancelled before the request was sent");
                self.shared.lock().report.history.call_not_sent();
                return Outcome::static_result(Status::Cancelled, generation(), NOT_TOUCHED.into());
            }
            Err(interrupt) => {
                tracing::debug!(?interrupt, "execution interrupted");
                // In a keeper layout the sandbox stays: the interpreter is
                // rolled back (or replaced) and every other process killed.
                let kept = !matches!(interrupt, Interrupt::Halted(Halt::Disposed | Halt::Remounted));
                let host_kill = inner.worker.as_ref().and_then(|w| w.take_killed_for());
                // A memory cap the kernel enforced says so (and whom it
                // killed), read before the recovery kills the rest. The
                // interpreter it ended may be noticed only at the deadline,
                // when processes it started hold its pipe.
                let oom = inner.worker.as_mut().and_then(|w| {
                    let died = interrupt == Interrupt::Died || w.interpreter_gone();
                    let note = w.oom_note(died)?;
                    Some(if died { OomKill::Interpreter(note) } else { OomKill::Others(note) })
                });
                // How the interpreter ended, recorded by the sandbox's PID 1
                // (the host cannot wait for a process it did not start).
                let death = match inner.worker.as_mut() {
                    Some(w) if interrupt == Interrupt::Died => w.interpreter_death().await,
                    _ => None,
                };
                o.killed_for = killed_for(&interrupt, host_kill.as_ref(), oom.as_ref());
                let mut rollback_failed = None;
                let keeper = inner.worker.as_ref().is_some_and(|w| w.keeper());
                let recovered = match inner.worker.as_mut() {
                    Some(w) if kept && host_kill.is_none() && w.keeper() => {
                        Some(w.recover(Some(&mut capture), false).await)
                    }
                    _ => None,
                };
                match recovered {
                    Some(Ok(recovery)) => {
                        let r = recovered_text(&interrupt, timeout_seconds, &recovery, oom.as_ref(), death);
                        // Only a loss resets anything; a rollback is the last failure.
                        if matches!(r.state, StateFate::Lost(_)) {
                            self.shared.lock().report.history.replaced(ResetReason::from(&interrupt));
                            o.generation = generation();
                        } else {
                            self.shared.lock().report.history.rolled_back(ResetReason::from(&interrupt));
                        }
                        o.status = r.status;
                        o.state = r.state;
                        o.ended_by = r.ended_by;
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
                    // A dispose or a mode change killed the sandbox while
                    // it rolled back: that is why the state is lost.
                    Some(Err(e)) if matches!(check(), Some(Halt::Disposed | Halt::Remounted)) => {
                        tracing::debug!("the sandbox was stopped during the rollback: {e}");
                    }
                    Some(Err(e)) => {
                        tracing::warn!("rollback failed: {e}");
                        rollback_failed = Some(e.to_string());
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
                let loss = match rollback_failed {
                    Some(e) => Loss::RollbackFailed(e),
                    None if kept && host_kill.is_none() && !keeper => Loss::RollbackOff,
                    None => Loss::Stopped,
                };
                let reason = ResetReason::from(&interrupt);
                let killed = self.kill_worker(inner, Some(&mut capture), reason).await;
                let (status, reason, diagnostic) =
                    interruption(&interrupt, timeout_seconds, host_kill.as_ref(), exit.or(killed));
                let (reason, diagnostic) = with_oom(reason, diagnostic, oom.as_ref());
                o.status = status;
                o.state = StateFate::Lost(loss);
                o.ended_by = Some(reason);
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
    pub(super) fn finish_exec(
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
            // project off the result's path (its notes reach the next
            // result): the names the project's watch saw appear while it
            // covers the project, else the walk.
            o.notes.extend(guard.check_holders());
            if alive {
                tokio::task::spawn_blocking(move || guard.check_periodic());
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
        o.output = StreamText::output_of(capture);
        o.log_paths = LogFiles {
            stdout: (capture.stdout.total > 0).then_some(out_path),
            stderr: (capture.stderr.total > 0).then_some(err_path),
        };
        o
    }

    /// What stops an operation of a sandbox made for `mounts`: a dispose,
    /// a cancel of `call` (none for a spare), a change of the mounts.
    pub(super) fn halt_check(
        &self,
        call: Option<u32>,
        mounts: MountConfig,
    ) -> impl Fn() -> Option<Halt> + Send + Sync + '_ {
        move || {
            if self.is_disposed() {
                Some(Halt::Disposed)
            } else if call.is_some_and(|c| self.is_cancelled(c)) {
                Some(Halt::Cancelled)
            } else if self.shared.lock().live.restarted_for.is_some() && self.shared.lock().report.mounts != mounts {
                Some(Halt::Remounted)
            } else {
                None
            }
        }
    }
}
