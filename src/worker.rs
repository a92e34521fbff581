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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant};

use crate::capture::{Capture, Stream};
use crate::contain::Contained;
use crate::frame::{self, CallRequest, ExecReport, FrameError, Reply, Request, PROTOCOL_VERSION};
use crate::limits::{
    BWRAP_GONE, CLEANUP_DEADLINE, DRAIN_CAP, DRAIN_SLACK, IDLE_STDERR_BYTES, MAX_CODE_IMAGE_TEXT, PROGRESS_EVERY,
    PROGRESS_TAIL_BYTES, STARTUP_DEADLINE,
};
use crate::permissions::MountConfig;
use crate::protected::{self, Guard};
use crate::secrets::MaskReport;
use crate::spawn::{kill_group, spawn_sandbox};

mod api;
mod begin;
mod mode;
mod rollback;
mod streams;
pub use api::{
    AfterResult, BoxError, Call, CodeForm, Dead, ExecDone, Halt, ImageCheck, Interrupt, Launch, NotReady, Progress,
    ProgressFn, PythonNetwork, Ready, RequestFn, StartError, Stop,
};
pub use begin::NoPoint;
use begin::{boot_ticks, children, BeginCheck};
pub use mode::SwapPlan;
pub use rollback::{NoReturn, RecoverError, Recovery};
use streams::{call_streams, drain_now, read_opt, read_replies, take_read, SAME_PIPES_DRAIN_BYTES};

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
    child: crate::spawn::SandboxChild,
    pid: i32,
    requests: pipe::Sender,
    /// How the runtime phrases a call.
    request: RequestFn,
    /// Bounded: a sandbox that floods frames waits on its pipe, never on
    /// host memory.
    replies: mpsc::Receiver<Result<Reply, FrameError>>,
    /// Frames are expected (a start or a request in flight); one that
    /// arrives otherwise makes the reply task kill the sandbox at once.
    expecting: Arc<AtomicBool>,
    /// The task that reads `replies` (replaced with the channels).
    reader: tokio::task::JoinHandle<()>,
    /// Why the reply task or the guard killed the sandbox, when one did.
    killed_for: protected::KillSlot,
    /// A watch stopped the sandbox because a secret appeared (a host
    /// secret in a read root, or one in the project): what its processes
    /// wrote since may hold it (see `scratch::set_aside`).
    pub(crate) secret_appeared: Arc<AtomicBool>,
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
    /// The guard's and the secrets' watches (and their budget); they end with the worker.
    _watches: crate::watches::Watches,
    budget: Option<Arc<protected::Budget>>,
    /// Replacements of the project's mount (see `mode`), told to the interpreter.
    moved: u64,
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
    /// The call's result came with its end marks and released its copy,
    /// and the release is not yet asked for: the point frame that follows
    /// at once asks for it (the worker ends the last copy before it makes
    /// the next), else a release frame does.
    release_due: bool,
    /// What the begin frame of the call in flight is checked against.
    begin_check: Option<BeginCheck>,
    /// The same for the next call, when its copy was asked for ahead.
    ahead: Option<BeginCheck>,
    /// The tasks reading streams of earlier calls until their last writer
    /// exits (at most MAX_RETIRED; past it the oldest is closed).
    retired: std::collections::VecDeque<tokio::task::JoinHandle<()>>,
    /// The proxy of its network (`network.python`); it stops with it.
    proxy: Option<api::Proxy>,
    /// The caps on the sandbox's tasks and memory. Its cgroups live as long as the sandbox, across
    /// interpreters, and go when the worker does: the last field, so that they are removed after
    /// the child is dropped (killed).
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
            mut plan_notes,
            masks,
            code,
            emit_code,
            check_image,
            request,
            keeper,
            mut contained,
            limits,
            held,
            inside,
            watcher,
            budget,
            network,
        } = launch;
        let mut child =
            spawn_sandbox(&bwrap, &argv, seccomp, mount_fds, contained.take_join(), crate::spawn::Channel::Frames)
                .map_err(StartError::Spawn)?;
        // Nothing of the payload runs before its limits are set and its
        // namespaces prepared. The payload is released only by the byte
        // written after both: on a failure it is killed before its pipe
        // closes. Without a network the worker starts while its `/proc`
        // masks are made, and is sent nothing before they are (below).
        let api::Prepared { prepared, proxy, masking } =
            api::prepare_with_network(child.info, &child.release, &limits, held, inside, network, &mut plan_notes)
                .await;
        if let Err(why) = prepared {
            // A bubblewrap that failed on its own (a mount source gone, say)
            // has ended or ends at once, and its own words on stderr are
            // what the start reports, as for any bubblewrap failure. One
            // that is still there waits for the release: it is killed.
            let ended = matches!(timeout(BWRAP_GONE, child.child.wait()).await, Ok(Ok(_)));
            if !ended {
                kill_group(child.pid);
                let _ = timeout(CLEANUP_DEADLINE, child.child.wait()).await;
                return Err(StartError::Prepare(api::not_prepared(&why)));
            }
        }
        // Two frames in flight at most: a flood waits on the pipe. A frame
        // that no start or request asked for kills the sandbox at once.
        let (tx, rx) = mpsc::channel(2);
        let expecting = Arc::new(AtomicBool::new(true));
        let killed_for: protected::KillSlot = Arc::default();
        // One budget for every watch on this sandbox: past it, it is stopped.
        let budget = Arc::new(protected::Budget::new(budget, child.pid, killed_for.clone()));
        if let Some(g) = &guard {
            g.arm(child.pid, killed_for.clone());
            g.set_budget(budget.clone());
        }
        let reader = tokio::spawn(read_replies(child.replies, tx, expecting.clone(), killed_for.clone(), child.pid));
        let (stdout, stderr) = (child.stdout, child.stderr);
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
            budget: Some(budget.clone()),
            moved: 0,
            masks_watch,
            init_pid: None,
            request,
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
            release_due: false,
            begin_check: None,
            ahead: None,
            retired: Default::default(),
            proxy,
            contained,
        };
        spawned(worker.pid, true);
        let ready = worker.await_ready(stop, emit_code.then_some(check_image)).await;
        // The worker has run nothing it was sent: its first request waits
        // for the masks (a failure to make them ends the start).
        let ready = match (ready, masking) {
            (Ok(ready), Some(masking)) => api::masks_made(masking).await.map(|()| ready),
            (ready, _) => ready,
        };
        match ready {
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
    pub fn take_killed_for(&self) -> Option<protected::HostKill> {
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
    /// With `emit`, the worker's compiled form may come first (checked by it).
    async fn await_ready(&mut self, stop: &mut Stop<'_>, emit: Option<ImageCheck>) -> Result<Ready, StartError> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let mut diag: Vec<u8> = Vec::new();
        let mut image: Option<Vec<u8>> = None;
        // The image's base64 text so far (it comes in pieces).
        let mut pieces = String::new();
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
                    Some(Ok(Reply::Code { pyc, more })) if image.is_none() && emit.is_some() => {
                        if pieces.len() + pyc.len() > MAX_CODE_IMAGE_TEXT {
                            return Err(not_ready(NotReady::BadImage(format!("the worker's code is over {MAX_CODE_IMAGE_TEXT} bytes of base64").into()), &diag));
                        }
                        pieces.push_str(&pyc);
                        if more {
                            continue;
                        }
                        match emit.map(|check| check(&std::mem::take(&mut pieces))) {
                            Some(Ok(bytes)) => image = Some(bytes),
                            Some(Err(why)) => return Err(not_ready(NotReady::BadImage(why), &diag)),
                            None => return Err(not_ready(NotReady::Unexpected("code"), &diag)),
                        }
                    }
                    Some(Ok(Reply::Ready { protocol, .. })) => {
                        return Err(not_ready(NotReady::Protocol(protocol), &diag));
                    }
                    Some(Ok(Reply::Error { message, .. })) => return Err(not_ready(NotReady::Refused(message), &diag)),
                    Some(Ok(other)) => return Err(not_ready(NotReady::Unexpected(other.kind()), &diag)),
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
        // The session says why it stops a sandbox (a dispose, a mode
        // change) before it kills it, and wakes the call after: the call
        // may find the sandbox gone first (its request refused, a frame cut
        // short, the end of its replies). It ends as why it was stopped,
        // never as a death.
        let done = done.map_err(|e| match e {
            e @ (Interrupt::Died | Interrupt::Violation(_)) => (stop.check)().map_or(e, Interrupt::Halted),
            e => e,
        });
        if !self.sent {
            // Halted before the request went out: the interpreter ran
            // nothing, its next call is still the one it counts, and a
            // frame from it now is one while no execution runs.
            self.execs = execs;
            self.expecting.store(false, Ordering::Release);
        }
        self.point_taken = matches!(self.point, Some(Ok(_) | Err(NoPoint::Released)));
        let asked = match &done {
            // A refused read: the worker keeps the copy until its next
            // call, so that a grant can run the call again from there.
            Ok(d) if d.report.status == crate::frame::WorkerStatus::PermissionNeeded => false,
            // The worker discards the copy once the call succeeded, and
            // makes the next one while the model thinks.
            Ok(d) => {
                self.point = None;
                d.after.is_ok() && self.point_ahead()
            }
            Err(_) => false,
        };
        if std::mem::take(&mut self.release_due) && !asked {
            // No point asked for: a release frame ends the copy (if the
            // pipe has no room, the next request does).
            if let Ok(release) = frame::encode(&Request::Release) {
                let _ = self.requests.try_write(&release);
            }
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
        let request = (self.request)(CallRequest { id: seq, code, mark, checkpoint, moved: self.moved })
            .map_err(|e| Interrupt::Violation(format!("request could not be framed: {e}")))?;
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
        // A copy made ahead (see `point_ahead`) is checked against the
        // children listed before the interpreter was asked for it.
        let ahead = self.ahead.take();
        self.begin_check = if checkpoint {
            let interp = self.interpreter();
            match ahead.filter(|c| c.interp.is_some() && c.interp == interp) {
                Some(check) => Some(BeginCheck { seq, ..check }),
                None => {
                    let children_before = interp.map(children).unwrap_or_default();
                    Some(BeginCheck { seq, interp, keeper: self.init_pid, children_before, asked_at: boot_ticks() })
                }
            }
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
            release_due,
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
                            output_tail: capture.latest_output(PROGRESS_TAIL_BYTES),
                        });
                    }
                }
                // After the call's last frame nothing more is due: what the
                // channel does next (an interpreter that ends as it reads
                // the next request) belongs to no call, and the reader
                // kills the sandbox for a frame.
                msg = replies.recv(), if drained.is_none() => match msg {
                    Some(Ok(Reply::Result(mut r))) if running && r.id == seq => {
                        let refused = r.status == crate::frame::WorkerStatus::PermissionNeeded;
                        // The result with its end marks: the call's last frame.
                        let marks = r.drained.take();
                        if let Some(m) = marks {
                            *streams_ready = m.streams;
                            expecting.store(false, Ordering::Release);
                            drained = Some((m.stdout, m.stderr));
                        }
                        report = Some(r);
                        // Every frame the code wrote came before this one:
                        // the copy is no longer needed. A failure from
                        // here on (the drain) is one after the result.
                        // A refused read keeps it (until the next call):
                        // a grant may run the call again from there.
                        if matches!(point, Some(Ok(_))) && !refused {
                            *point = Some(Err(NoPoint::Released));
                            if marks.is_some() {
                                // Asked for with the next point (see `exec`).
                                *release_due = written;
                            } else if let (true, Ok(release)) = (written, frame::encode(&Request::Release)) {
                                // A worker that is gone shows as the end of
                                // its replies, next.
                                let _ = requests.write_all(&release).await;
                            }
                        }
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
                        let why = AfterResult::Unexpected(other.kind());
                        return match report { Some(r) => done(r, Err(why)), None => Err(Interrupt::Violation(why.to_string())) };
                    }
                    Some(Err(FrameError::Eof)) | None => {
                        if let Some(r) = report {
                            return done(r, Err(AfterResult::Exited));
                        }
                        // A sandbox the session killed reports why (see `exec`).
                        return Err(Interrupt::Died);
                    }
                    Some(Err(e)) => {
                        let why = AfterResult::BadFrame(e.to_string());
                        return match report { Some(r) => done(r, Err(why)), None => Err(Interrupt::Violation(why.to_string())) };
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

fn not_ready(why: NotReady, diag: &[u8]) -> StartError {
    StartError::NotReady { why, stderr: String::from_utf8_lossy(diag).trim().to_string() }
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
}
