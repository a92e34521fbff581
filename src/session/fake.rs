//! A scripted [`Host`] for the session's tests: its sandboxes are no
//! processes, and each call, recovery and start answers what the test put
//! in the [`Script`]. Everything the session asks of them is logged, so a
//! test can say which sandbox ran what and which were killed.

use std::collections::{HashSet, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::host::{Host, Sandbox};
use crate::capture::Capture;
use crate::frame::{ExecReport, WorkerStatus};
use crate::launch::{ProbeError, Start};
use crate::live_grants::LiveError;
use crate::options::SessionOptions;
use crate::outcome::StatusReport;
use crate::permissions::MountConfig;
use crate::protected::{Guard, SecretWatch};
use crate::rundir::AfterKill;
use crate::secrets::MaskReport;
use crate::worker::{Call, CodeForm, Dead, ExecDone, Interrupt, Ready, RecoverError, Recovery, StartError, Stop};

/// What the next call does.
#[derive(Debug)]
pub enum Exec {
    /// The code ran to its end with this status.
    Done(WorkerStatus),
    /// The call ended early this way (a timeout, a death, ...).
    Interrupted(Interrupt),
    /// It was cancelled before its request reached the interpreter.
    CancelledUnsent,
}

/// What the fake sandboxes do, and what the session asked of them.
#[derive(Debug, Default)]
pub struct Script {
    /// What the next calls do, in order (a call with none left succeeds).
    pub execs: VecDeque<Exec>,
    /// What the next recoveries give (none left: the call is rolled back).
    pub recovers: VecDeque<Result<Recovery, RecoverError>>,
    /// How the next starts fail (none left: they succeed).
    pub start_fails: VecDeque<StartError>,
    /// How the next live changes fail (none left: they succeed).
    pub live_fails: VecDeque<LiveError>,
    /// Sandboxes that ended by themselves (their pids).
    pub dead: HashSet<i32>,
    /// Sandboxes whose interpreter ended while their PID 1 stays.
    pub gone: HashSet<i32>,
    /// Every request, in order: `start 1`, `exec 1 #2`, `recover 1`,
    /// `reset 1`, `kill 1`, `reap 2`, `kill_group 1`, `prepare 1`, `live 1`
    /// (`live 1 prepared`: with what `prepare` made).
    pub log: Vec<String>,
    /// Where set, the next recovery (not a reset) waits here once logged.
    pub recover_gate: Option<Arc<tokio::sync::Notify>>,
    /// Where set, the next preparation of a change to read-only says it
    /// started on the first channel and waits for the second.
    pub prepare_gate: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
    /// How many checks the exit cleanup would make once it stopped the
    /// session's processes, as last registered.
    pub exit_checks: usize,
    /// Where set, the next start waits here once its sandbox is spawned.
    pub start_gate: Option<std::sync::Arc<tokio::sync::Notify>>,
    next_pid: i32,
}

impl Script {
    fn note(&mut self, what: String) {
        self.log.push(what);
    }
}

#[derive(Clone, Default)]
pub struct FakeHost {
    pub script: Arc<Mutex<Script>>,
}

pub struct FakeSandbox {
    pid: i32,
    project: PathBuf,
    /// A real guard of the project while a live change made it writable.
    guard: Option<Arc<Guard>>,
    mounts: MountConfig,
    keeper: bool,
    masks: MaskReport,
    took_point: bool,
    sent: bool,
    execs: u64,
    script: Arc<Mutex<Script>>,
}

impl Host for FakeHost {
    type Facts = ();
    type Sandbox = FakeSandbox;

    async fn probe(&self, _opts: &SessionOptions) -> Result<(), ProbeError> {
        Ok(())
    }

    fn describe(&self, _facts: &(), _report: &mut StatusReport) {}

    fn warm(&self, _opts: &SessionOptions) {
        self.script.lock().note("warm".into());
    }

    async fn start(
        &self,
        start: &Start<'_, ()>,
        _stop: &mut Stop<'_>,
        spawned: &(dyn Fn(i32, bool) + Send + Sync),
    ) -> Result<(FakeSandbox, Ready), StartError> {
        let pid = {
            let mut s = self.script.lock();
            s.next_pid += 1;
            let pid = s.next_pid;
            s.note(format!("start {pid}"));
            if let Some(e) = s.start_fails.pop_front() {
                return Err(e);
            }
            pid
        };
        spawned(pid, true);
        let gate = self.script.lock().start_gate.take();
        if let Some(gate) = gate {
            gate.notified().await;
        }
        let sandbox = FakeSandbox {
            pid,
            project: start.project.clone(),
            guard: None,
            mounts: start.mounts.clone(),
            keeper: start.rollback.unwrap_or(true),
            masks: MaskReport::default(),
            took_point: false,
            sent: false,
            execs: 0,
            script: self.script.clone(),
        };
        Ok((sandbox, Ready { runtime_version: "fake 1".into(), site_notes: vec![], image: None }))
    }

    fn kill_group(&self, pid: i32) {
        self.script.lock().note(format!("kill_group {pid}"));
    }

    fn live_update(&self, _id: u64, _pids: Vec<i32>, _dir: Option<PathBuf>, after: Vec<AfterKill>) {
        self.script.lock().exit_checks = after.len();
    }
}

impl Sandbox for FakeSandbox {
    fn mounts(&self) -> &MountConfig {
        &self.mounts
    }
    fn pid(&self) -> i32 {
        self.pid
    }
    fn guard(&self) -> Option<Arc<Guard>> {
        self.guard.clone()
    }
    fn init_pid(&self) -> Option<i32> {
        None
    }
    fn take_plan_notes(&mut self) -> Vec<String> {
        vec![]
    }
    fn masks(&self) -> &MaskReport {
        &self.masks
    }
    fn code(&self) -> CodeForm {
        CodeForm::Source
    }
    fn keeper(&self) -> bool {
        self.keeper
    }
    fn took_point(&self) -> bool {
        self.took_point
    }
    fn request_sent(&self) -> bool {
        self.sent
    }
    fn secret_appeared(&self) -> bool {
        false
    }
    fn secret_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::default()
    }
    fn take_killed_for(&self) -> Option<crate::protected::HostKill> {
        None
    }
    fn masks_watch(&self) -> Option<Arc<SecretWatch>> {
        None
    }
    fn oom_note(&mut self, _died: bool) -> Option<String> {
        None
    }
    fn take_network_notes(&self) -> Vec<String> {
        Vec::new()
    }
    fn network_review(&self, _during: Option<crate::network::review::Reviewing>) {}
    fn exited(&mut self) -> Option<ExitStatus> {
        // Killed by SIGKILL, as a sandbox that ended while idle.
        self.script.lock().dead.contains(&self.pid).then(|| ExitStatus::from_raw(9))
    }
    fn interpreter_gone(&mut self) -> bool {
        self.script.lock().gone.contains(&self.pid)
    }
    fn unmasked_secret(&self, _outside: &[&Path]) -> Option<PathBuf> {
        None
    }
    async fn exec(
        &mut self,
        call: Call<'_>,
        _capture: &mut Capture,
        _stop: &mut Stop<'_>,
    ) -> Result<ExecDone, Interrupt> {
        // As the worker does: every call but an interpreter's first takes a point.
        self.took_point = self.keeper && self.execs > 0;
        self.execs += 1;
        let next = {
            let mut s = self.script.lock();
            s.note(format!("exec {} #{}", self.pid, call.seq));
            s.execs.pop_front()
        };
        let next = next.unwrap_or(Exec::Done(WorkerStatus::Ok));
        self.sent = !matches!(next, Exec::CancelledUnsent);
        match next {
            Exec::Done(status) => Ok(ExecDone {
                report: ExecReport {
                    id: call.seq,
                    status,
                    repr: Some(format!("{}", call.seq)),
                    repr_truncated: false,
                    exception: None,
                    path: None,
                    path_is_dir: false,
                    path_secret: false,
                    background: 0,
                    images: vec![],
                    notes: vec![],
                    drained: None,
                },
                after: Ok(()),
            }),
            Exec::Interrupted(why) => Err(why),
            Exec::CancelledUnsent => Err(Interrupt::Halted(crate::worker::Halt::Cancelled)),
        }
    }
    async fn recover(&mut self, _capture: Option<&mut Capture>, reset: bool) -> Result<Recovery, RecoverError> {
        let gate = {
            let mut s = self.script.lock();
            s.note(format!("{} {}", if reset { "reset" } else { "recover" }, self.pid));
            if reset {
                None
            } else {
                s.recover_gate.take()
            }
        };
        if let Some(gate) = gate {
            gate.notified().await;
        }
        let mut s = self.script.lock();
        if !self.keeper {
            return Err(RecoverError::NoKeeper);
        }
        if reset {
            s.gone.remove(&self.pid);
            self.execs = 0;
            return Ok(Recovery::Reset);
        }
        s.recovers.pop_front().unwrap_or(Ok(Recovery::Restored))
    }
    type Prepared = ();
    fn prepare_read_only(&self, want: &MountConfig, _env: &super::host::LiveEnv<'_>) -> Option<()> {
        if !self.mounts.workspace_writable || want.workspace_writable {
            return None;
        }
        let gate = {
            let mut s = self.script.lock();
            s.note(format!("prepare {}", self.pid));
            s.prepare_gate.take()
        };
        if let Some((started, go)) = gate {
            let _ = started.send(());
            let _ = go.recv();
        }
        Some(())
    }
    fn apply_live(
        &mut self,
        want: &MountConfig,
        _env: &super::host::LiveEnv<'_>,
        prepared: Option<()>,
    ) -> Result<Option<Arc<Guard>>, LiveError> {
        let mut s = self.script.lock();
        s.note(format!("live {}{}", self.pid, if prepared.is_some() { " prepared" } else { "" }));
        crate::live_grants::plan(&self.mounts, want)?;
        if let Some(e) = s.live_fails.pop_front() {
            return Err(e);
        }
        drop(s);
        // A mode change starts or ends the guard, as the real swap does.
        let mut ended = None;
        if want.workspace_writable && !self.mounts.workspace_writable {
            self.guard = Some(Arc::new(guard_of(&self.project)));
        } else if !want.workspace_writable {
            ended = self.guard.take();
        }
        self.mounts = want.clone();
        Ok(ended)
    }
    async fn restore_point(&mut self) -> Result<Recovery, crate::worker::NoReturn> {
        let mut s = self.script.lock();
        s.note(format!("restore {}", self.pid));
        if !self.keeper {
            return Err(crate::worker::NoReturn::RollbackOff);
        }
        s.recovers.pop_front().unwrap_or(Ok(Recovery::Restored)).map_err(crate::worker::NoReturn::Failed)
    }
    async fn interpreter_death(&mut self) -> Option<ExitStatus> {
        None
    }
    async fn wait_exit(&mut self, _within: Duration) -> Option<ExitStatus> {
        self.exited()
    }
    async fn kill(self, _capture: Option<&mut Capture>) -> (Option<ExitStatus>, Dead) {
        self.script.lock().note(format!("kill {}", self.pid));
        (Some(ExitStatus::from_raw(9)), Dead { guard: self.guard, init_pid: None })
    }
    fn reap(self) {
        self.script.lock().note(format!("reap {}", self.pid));
    }
}

/// The guard a writable start of `project` would have (default rules).
fn guard_of(project: &Path) -> Guard {
    let settings = crate::options::Settings::from_env();
    let plan = crate::protected::plan_start(crate::protected::StartRequest {
        project,
        protected: &settings.protected,
        secrets: &crate::secrets::SecretRules::new(Some("")),
        limits: settings.scan,
        git: &settings.git,
        sink: Default::default(),
        tainted: Default::default(),
        writable: true,
        unmasked: &[],
        sources: None,
        known: &[],
        known_idents: &Default::default(),
        host: &Default::default(),
        masked_mounts: &Default::default(),
    })
    .expect("the project's plan");
    plan.guard.expect("a writable plan has a guard")
}
