//! The session's orchestration on a fake host (see `fake`): which sandbox
//! runs a call, what a failure does to it, and what the session's status
//! and the result's state statement say.

use super::fake::{Exec, FakeHost};
use super::*;
use crate::frame::WorkerStatus;
use crate::outcome::state_statement;
use crate::worker::{CodeForm, NotReady, RecoverError, StartError};

struct Fixture {
    session: Arc<Session<FakeHost>>,
    host: FakeHost,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn fixture(rollback: bool, prewarm: bool) -> Fixture {
    let project = tempfile::tempdir().expect("project dir");
    let root = tempfile::tempdir().expect("runtime root");
    let host = FakeHost::default();
    let opts = SessionOptions {
        project_dir: project.path().to_path_buf(),
        runtime_root: Some(root.path().join("runtime")),
        prewarm: Some(prewarm),
        rollback: Some(rollback),
        ..Default::default()
    };
    let session = Session::with_host(opts, host.clone());
    Fixture { session, host, _dirs: (project, root) }
}

/// What a result says was discarded before its call, in its words.
fn said(o: &Outcome) -> Option<String> {
    o.lost_before.as_ref().map(ToString::to_string)
}

impl Fixture {
    async fn run(&self) -> Outcome {
        self.session.execute("x = 1".into(), 30, None).await
    }
    fn script(&self, exec: Exec) {
        self.host.script.lock().execs.push_back(exec);
    }
    fn log(&self) -> Vec<String> {
        self.host.script.lock().log.clone()
    }
}

#[tokio::test]
async fn the_first_execution_starts_a_sandbox_and_keeps_its_state() {
    let f = fixture(true, false);
    let before = f.session.status();
    assert!(!before.worker_running);
    assert_eq!(before.history.executions, 0);
    assert!(f.log().is_empty(), "nothing starts before the first execution");

    let o = f.run().await;
    assert_eq!(o.status, Status::Ok, "{:?}", o.diagnostic);
    assert_eq!(o.state, StateFate::Kept);
    assert!(o.started);
    assert_eq!(o.repr.as_deref(), Some("1"));
    assert_eq!(state_statement(&o), None);
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2"]);
    let after = f.session.status();
    assert!(after.worker_running);
    assert_eq!(after.history.executions, 2);
    assert_eq!(after.history.generation, 1);
    assert!(after.dirs.is_some());
}

#[tokio::test]
async fn a_runtime_error_keeps_the_state_and_says_so() {
    let f = fixture(true, false);
    f.script(Exec::Done(WorkerStatus::RuntimeError));
    let o = f.run().await;
    assert_eq!(o.status, Status::RuntimeError);
    assert_eq!(o.state, StateFate::Kept);
    let said = state_statement(&o).expect("a failed call says what became of the state");
    assert!(said.starts_with("Interpreter state kept"), "{said}");
}

#[tokio::test]
async fn a_timeout_with_rollback_rolls_back_and_keeps_the_sandbox() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.script(Exec::Interrupted(Interrupt::Timeout));
    let o = f.run().await;
    assert_eq!(o.status, Status::Timeout);
    assert_eq!(o.state, StateFate::RolledBack { fresh: false });
    assert!(!o.state_lost());
    let said = state_statement(&o).expect("a rollback is told");
    assert!(said.contains("rolled back to its state before this call"), "{said}");
    let status = f.session.status();
    assert!(status.worker_running);
    assert_eq!(status.history.generation, 1, "a rollback is not a new interpreter");
    assert_eq!(status.history.last_rollback, Some(ResetReason::Timeout));
    assert!(status.history.last_rollback_point.is_some());
    // The same sandbox takes the next call.
    assert_eq!(f.run().await.state, StateFate::Kept);
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2", "recover 1", "exec 1 #3"]);
}

#[tokio::test]
async fn a_timeout_without_rollback_loses_the_state_and_the_next_call_starts_anew() {
    let f = fixture(false, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.script(Exec::Interrupted(Interrupt::Timeout));
    let o = f.run().await;
    assert_eq!(o.status, Status::Timeout);
    assert_eq!(o.state, StateFate::Lost(Loss::RollbackOff));
    let said = state_statement(&o).expect("a loss is told");
    assert!(said.starts_with("Interpreter state was LOST"), "{said}");
    assert!(said.contains("rollback is off"), "{said}");
    let status = f.session.status();
    assert!(!status.worker_running);
    assert_eq!(status.history.last_reset_reason, Some(ResetReason::Timeout));

    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(o.state, StateFate::Kept);
    assert_eq!(o.lost_before, None, "the loss was told by the call that lost it");
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2", "kill 1", "start 2", "exec 2 #3"]);
    assert_eq!(f.session.status().history.generation, 2);
}

#[tokio::test]
async fn a_failed_rollback_kills_the_sandbox_and_says_why() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.script(Exec::Interrupted(Interrupt::Timeout));
    f.host.script.lock().recovers.push_back(Err(RecoverError::Survivors(2)));
    let o = f.run().await;
    assert_eq!(o.status, Status::Timeout);
    assert_eq!(o.state, StateFate::Lost(Loss::RollbackFailed(RecoverError::Survivors(2).to_string())));
    let said = state_statement(&o).expect("a loss is told");
    assert!(said.contains("the rollback failed (2 other processes were still running after the kill)"), "{said}");
    assert!(!f.session.status().worker_running);
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2", "recover 1", "kill 1"]);
}

#[tokio::test]
async fn a_death_between_calls_is_told_by_the_next_result() {
    let f = fixture(false, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.host.script.lock().dead.insert(1);
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(o.state, StateFate::Kept);
    assert!(matches!(o.lost_before, Some(Discarded::SandboxDied { .. })), "{o:?}");
    let before = said(&o).expect("the death is told");
    assert!(before.starts_with("the interpreter died while idle: the sandbox"), "{before}");
    let said = state_statement(&o).expect("the loss before the call is told");
    assert!(said.starts_with("Earlier interpreter state was discarded before this call"), "{said}");
    assert_eq!(f.session.status().history.last_reset_reason, Some(ResetReason::WorkerDiedIdle));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "kill 1", "start 2", "exec 2 #2"]);
}

#[tokio::test]
async fn a_reset_replaces_the_interpreter_in_place_with_rollback_and_kills_without() {
    let f = fixture(true, false);
    assert_eq!(f.session.reset().await.1, ResetDone::Idle);
    assert_eq!(f.run().await.status, Status::Ok);
    let (_, done, _) = f.session.reset().await;
    assert_eq!(done, ResetDone::Fresh);
    let status = f.session.status();
    assert!(status.worker_running);
    assert_eq!(status.history.generation, 2);
    assert_eq!(status.history.last_reset_reason, Some(ResetReason::ExplicitReset));
    assert_eq!(f.run().await.state, StateFate::Kept);
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "reset 1", "exec 1 #2"]);

    let f = fixture(false, false);
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.session.reset().await.1, ResetDone::Killed);
    assert!(!f.session.status().worker_running);
    let o = f.run().await;
    assert_eq!(o.lost_before, None, "a reset asked for is not a loss to tell");
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "kill 1", "start 2", "exec 2 #2"]);
}

#[tokio::test]
async fn with_rollback_off_a_mode_change_kills_the_sandbox_and_the_next_call_starts_with_the_new_mounts() {
    let f = fixture(false, false);
    assert_eq!(f.run().await.status, Status::Ok);
    let writable = MountConfig { workspace_writable: true, ..Default::default() };
    assert_eq!(f.session.set_mounts(writable.clone()), Some(true));
    assert_eq!(f.session.set_mounts(writable.clone()), None, "the same mounts change nothing");
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(o.lost_before, Some(Discarded::Remounted(REMOUNT_REASON.into())));
    assert_eq!(said(&o).as_deref(), Some(REMOUNT_REASON));
    let said = state_statement(&o).expect("the restart is told");
    assert!(said.contains(REMOUNT_REASON), "{said}");
    let status = f.session.status();
    assert_eq!(status.mounts, writable);
    assert_eq!(status.history.last_reset_reason, Some(ResetReason::MountsChanged));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "kill_group 1", "kill 1", "start 2", "exec 2 #2"]);
}

#[tokio::test]
async fn a_restart_takes_the_ready_spare() {
    let f = fixture(false, true);
    assert_eq!(f.run().await.status, Status::Ok);
    // The spare starts a little after the result.
    let waited = Instant::now();
    while f.session.status().spare != SpareState::Ready {
        assert!(waited.elapsed() < Duration::from_secs(5), "no spare: {:?}", f.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f.script(Exec::Interrupted(Interrupt::Timeout));
    assert_eq!(f.run().await.state, StateFate::Lost(Loss::RollbackOff));
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(f.session.status().history.generation, 2);
    // The spare (sandbox 2) ran the call: no start on its path.
    assert_eq!(f.log()[..6], ["start 1", "exec 1 #1", "start 2", "exec 1 #2", "kill 1", "exec 2 #3"]);
    f.session.dispose("disposed").await;
}

#[tokio::test]
async fn dispose_kills_the_sandbox_removes_the_directories_and_refuses_later_calls() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    let dirs = f.session.status().dirs.expect("session directories");
    assert!(dirs.root.exists());
    f.session.dispose("disposed").await;
    let status = f.session.status();
    assert!(status.disposed);
    assert!(!status.worker_running);
    assert_eq!(status.history.last_reset_reason, Some(ResetReason::Disposed));
    assert!(!dirs.root.exists(), "the session directory is removed");
    let o = f.run().await;
    assert_eq!(o.status, Status::Unavailable);
    assert_eq!(o.state, StateFate::Untouched);
    assert_eq!(o.diagnostic.as_deref(), Some(DISPOSED));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "kill_group 1", "kill 1"]);
}

#[tokio::test]
async fn a_failed_start_is_told_and_the_next_call_starts_again_without_a_spare() {
    let f = fixture(true, true);
    let why = NotReady::Exited(None);
    f.host.script.lock().start_fails.push_back(StartError::NotReady { why, stderr: "no uid map".into() });
    let o = f.run().await;
    // Its error output names a namespace cause: no sandbox can start here, so it is unavailable.
    assert_eq!(o.status, Status::Unavailable);
    assert_eq!(o.start_failure, Some(StartFailure::UserNamespaces));
    assert_eq!(o.state, StateFate::Untouched);
    assert!(!o.started);
    let diagnostic = o.diagnostic.clone().expect("the failure is told");
    assert!(diagnostic.starts_with("The sandbox did not start: the sandbox did not exit"), "{diagnostic}");
    assert!(diagnostic.contains("Its error output: no uid map\nCommon causes: unprivileged user"), "{diagnostic}");
    let status = f.session.status();
    assert!(!status.worker_running);
    assert_eq!(status.history.last_reset_reason, Some(ResetReason::StartupFailure));
    // No spare is started with a setup that just failed.
    tokio::time::sleep(SPARE_DELAY * 3).await;
    assert_eq!(f.session.status().spare, SpareState::None);
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.log()[..3], ["start 1", "start 2", "exec 2 #1"]);
    f.session.dispose("disposed").await;
}

#[tokio::test]
async fn without_a_keeper_an_interpreter_on_its_way_out_is_a_death_between_calls() {
    // Its exit has begun; bubblewrap, which exits after it, has not yet.
    let f = fixture(false, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.host.script.lock().gone.insert(1);
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert!(matches!(o.lost_before, Some(Discarded::SandboxDied { .. })), "{o:?}");
    let before = said(&o).expect("the death is told");
    assert!(before.starts_with("the interpreter died while idle: the sandbox"), "{before}");
    assert_eq!(f.session.status().history.last_reset_reason, Some(ResetReason::WorkerDiedIdle));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "kill 1", "start 2", "exec 2 #2"]);
}

#[tokio::test]
async fn an_interpreter_that_died_idle_is_replaced_in_its_sandbox_and_told() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.host.script.lock().gone.insert(1);
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(o.lost_before, Some(Discarded::DiedIdle { oom: None }));
    assert_eq!(said(&o).as_deref(), Some("the interpreter died while idle"));
    let status = f.session.status();
    assert!(status.worker_running);
    assert_eq!(status.history.generation, 2);
    assert_eq!(status.history.last_reset_reason, Some(ResetReason::WorkerDiedIdle));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "reset 1", "exec 1 #2"]);
}

#[tokio::test]
async fn a_call_cancelled_before_it_runs_touches_nothing() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    assert!(f.session.cancel(Some(7)));
    let o = f.session.execute("x = 2".into(), 30, Some(7)).await;
    assert_eq!(o.status, Status::Cancelled);
    assert_eq!(o.state, StateFate::Untouched);
    assert_eq!(state_statement(&o), None);
    assert!(!f.session.cancel(None), "nothing runs");
    assert_eq!(f.log(), ["start 1", "exec 1 #1"]);
}

#[tokio::test]
async fn a_cancel_that_lands_before_the_request_was_sent_leaves_the_interpreter_alone() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.script(Exec::CancelledUnsent);
    let o = f.session.execute("x = 2".into(), 30, None).await;
    assert_eq!(o.status, Status::Cancelled);
    let text = crate::outcome::render(&o);
    assert!(text.contains("the interpreter was not touched"), "{text}");
    assert_eq!(f.session.status().history.executions, 1, "not counted as an execution");
    // Nothing was recovered or killed: the next call runs on the same interpreter.
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2", "exec 1 #2"]);
}

fn with_root(root: &str) -> MountConfig {
    MountConfig { read_roots: vec![root.into()], ..Default::default() }
}

#[tokio::test]
async fn an_added_grant_reaches_the_running_sandbox_and_a_rerun_returns_to_its_rollback_point() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.session.set_mounts(with_root("/data")), Some(false), "not killed");
    f.session.rerun_after_grant();
    let o = f.run().await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(o.lost_before, None);
    assert_eq!(f.session.take_rerun(), Some(Ok(())));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "restore 1", "exec 1 #2"]);
    assert_eq!(f.session.status().history.last_reset_reason, None);
}

#[tokio::test]
async fn a_grant_that_cannot_be_applied_live_restarts_and_says_why() {
    // Rollback off: no copy to return to, so no live path.
    let f = fixture(false, false);
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.session.set_mounts(with_root("/data")), Some(true), "killed as before");
    f.session.rerun_after_grant();
    let o = f.run().await;
    assert!(said(&o).is_some_and(|l| l.contains("PI_PYTHON_TOOL_ROLLBACK=0")), "{o:?}");
    assert!(f.session.take_rerun().is_some_and(|r| r.is_err()));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "kill_group 1", "kill 1", "start 2", "exec 2 #2"]);

    // A step that fails restarts the sandbox, with the step's words.
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.host.script.lock().live_fails.push_back(crate::live_grants::LiveError::NoProcess);
    assert_eq!(f.session.set_mounts(with_root("/data")), Some(false));
    f.session.rerun_after_grant();
    let o = f.run().await;
    assert!(matches!(o.lost_before, Some(Discarded::NotLive { .. })), "{o:?}");
    assert!(said(&o).is_some_and(|l| l.contains("the sandbox's process is not known")), "{o:?}");
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "kill 1", "start 2", "exec 2 #2"]);

    // No rollback point to return to: restarted, never run twice on changed state.
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.host.script.lock().recovers.push_back(Err(RecoverError::KeeperGone));
    f.session.set_mounts(with_root("/data"));
    f.session.rerun_after_grant();
    let o = f.run().await;
    assert!(matches!(o.lost_before, Some(Discarded::NoReturn(_))), "{o:?}");
    assert!(said(&o).is_some_and(|l| l.contains("could not run again on its state")), "{o:?}");
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "restore 1", "kill 1", "start 2", "exec 2 #2"]);
}

#[tokio::test]
async fn a_mode_change_reaches_the_running_sandbox_to_writable_at_the_next_call_and_to_read_only_at_once() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    let writable = MountConfig { workspace_writable: true, ..with_root("/data") };
    assert_eq!(f.session.set_mounts(writable.clone()), Some(false), "nothing is killed");
    assert_eq!(f.log(), ["start 1", "exec 1 #1"], "read-only a little longer is safe");
    let o = f.run().await;
    assert_eq!((&o.lost_before, o.state), (&None, StateFate::Kept));
    assert_eq!(f.session.status().mounts, writable);
    // Back to read-only: made in the running sandbox before set_mounts returns.
    assert_eq!(f.session.set_mounts(with_root("/data")), Some(false));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "exec 1 #2", "prepare 1", "live 1 prepared"]);
    let o = f.run().await;
    assert_eq!((&o.lost_before, o.state), (&None, StateFate::Kept));
    assert_eq!(f.log().len(), 7, "{:?}", f.log());
}

#[tokio::test]
async fn a_mode_change_the_running_sandbox_cannot_take_restarts_it_with_the_usual_words() {
    let f = fixture(true, false);
    f.session.set_mounts(MountConfig { workspace_writable: true, ..Default::default() });
    assert_eq!(f.run().await.status, Status::Ok);
    f.host.script.lock().live_fails.push_back(crate::live_grants::LiveError::Mode("busy".into()));
    assert_eq!(f.session.set_mounts(MountConfig::default()), Some(true));
    let o = f.run().await;
    assert_eq!(o.lost_before, Some(Discarded::Remounted(REMOUNT_REASON.into())));
    assert_eq!(said(&o).as_deref(), Some(REMOUNT_REASON));
    let log =
        ["start 1", "exec 1 #1", "prepare 1", "live 1 prepared", "kill_group 1", "kill 1", "start 2", "exec 2 #2"];
    assert_eq!(f.log(), log);
    // A call running: no swap under it; the sandbox is killed as before.
    let f = fixture(true, false);
    f.session.set_mounts(MountConfig { workspace_writable: true, ..Default::default() });
    assert_eq!(f.run().await.status, Status::Ok);
    let held = f.session.ops.try_lock().expect("no call runs");
    assert_eq!(f.session.set_mounts(MountConfig::default()), Some(true));
    drop(held);
    assert_eq!(f.run().await.lost_before, Some(Discarded::Remounted(REMOUNT_REASON.into())));
}

#[tokio::test]
async fn a_dispose_during_a_rollback_loses_the_state_as_stopped_not_as_a_failed_rollback() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    let gate = Arc::new(tokio::sync::Notify::new());
    {
        let mut s = f.host.script.lock();
        s.execs.push_back(Exec::Interrupted(Interrupt::Timeout));
        // The dispose's kill is what makes the rollback fail.
        s.recovers.push_back(Err(RecoverError::KeeperGone));
        s.recover_gate = Some(gate.clone());
    }
    let session = f.session.clone();
    let call = tokio::spawn(async move { session.execute("x = 1".into(), 30, None).await });
    for _ in 0..400 {
        if f.log().iter().any(|l| l == "recover 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2", "recover 1"]);
    let session = f.session.clone();
    let dispose = tokio::spawn(async move { session.dispose("disposed").await });
    for _ in 0..400 {
        if f.session.status().disposed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(f.session.status().disposed);
    gate.notify_one();
    let o = call.await.expect("the call");
    assert_eq!(o.status, Status::Timeout);
    assert_eq!(o.state, StateFate::Lost(Loss::Stopped));
    dispose.await.expect("the dispose");
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "exec 1 #2", "recover 1", "kill_group 1", "kill 1"]);
}

#[tokio::test]
async fn status_follows_the_slot_empty_starting_ready_and_empty_again() {
    let f = fixture(false, false);
    let running = |f: &Fixture| {
        let s = f.session.status();
        (s.worker_running, s.worker_code)
    };
    assert_eq!(running(&f), (false, None), "empty");
    // A start held once its sandbox is spawned: starting, with a process and no worker yet.
    let gate = Arc::new(tokio::sync::Notify::new());
    f.host.script.lock().start_gate = Some(gate.clone());
    let session = f.session.clone();
    let call = tokio::spawn(async move { session.execute("x = 1".into(), 30, None).await });
    for _ in 0..200 {
        if running(&f).0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(running(&f), (true, None), "starting");
    assert!(f.session.status().busy, "the call that starts it runs");
    gate.notify_one();
    assert_eq!(call.await.expect("the call").status, Status::Ok);
    assert_eq!(running(&f), (true, Some(CodeForm::Source)), "ready");
    assert!(!f.session.status().busy, "no call runs");
    // A failure without rollback kills it; a failed start leaves the slot empty.
    f.script(Exec::Interrupted(Interrupt::Timeout));
    assert_eq!(f.run().await.status, Status::Timeout);
    assert_eq!(running(&f), (false, None), "empty after the kill");
    let why = NotReady::Exited(None);
    f.host.script.lock().start_fails.push_back(StartError::NotReady { why, stderr: String::new() });
    assert_eq!(f.run().await.status, Status::WorkerError);
    assert_eq!(running(&f), (false, None), "empty after a failed start");
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(running(&f), (true, Some(CodeForm::Source)), "ready again");
    f.session.dispose("disposed").await;
    assert_eq!(running(&f), (false, None), "empty after dispose");
}

/// The project's names under `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn going_read_only_the_project_walk_runs_before_the_session_lock_and_its_plan_is_the_one_applied() {
    let f = fixture(true, false);
    assert_eq!(f.run().await.status, Status::Ok);
    f.session.set_mounts(MountConfig { workspace_writable: true, ..Default::default() });
    let o = f.run().await;
    assert_eq!((&o.lost_before, o.state), (&None, StateFate::Kept));
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "exec 1 #2"]);
    // The plan (the fake's stand-in for the walk) waits until the test lets it go.
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    f.host.script.lock().prepare_gate = Some((started_tx, go_rx));
    let session = f.session.clone();
    let change = std::thread::spawn(move || session.set_mounts(MountConfig::default()));
    started.recv_timeout(Duration::from_secs(10)).expect("the change's plan started");
    // While it walks, the session's lock is free: status answers (it takes that lock).
    let (said_tx, said_rx) = std::sync::mpsc::channel();
    let session = f.session.clone();
    let status = std::thread::spawn(move || {
        let _ = said_tx.send(session.status().mounts.workspace_writable);
    });
    let during = said_rx.recv_timeout(Duration::from_secs(10));
    go.send(()).expect("let the plan go");
    assert_eq!(change.join().expect("the change"), Some(false), "nothing is killed");
    status.join().expect("status");
    assert_eq!(during, Ok(true), "status answered during the walk, with the mounts before the change");
    // One walk: the plan made before the lock is the one the change applied.
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "exec 1 #2", "prepare 1", "live 1 prepared"]);
    assert_eq!(f.session.status().mounts, MountConfig::default());
    let o = f.run().await;
    assert_eq!((&o.lost_before, o.state), (&None, StateFate::Kept));
    assert_eq!(f.session.status().history.generation, 1);
}

#[tokio::test]
async fn a_guard_started_by_a_live_change_to_writable_is_the_one_checked_after_a_later_kill_and_at_exit() {
    let f = fixture(true, false);
    let project = f.session.project_dir().to_path_buf();
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.host.script.lock().exit_checks, 0, "baseline: a read-only sandbox has nothing to check at exit");
    // Read-only to writable: made at the next call, which starts the guard.
    f.session.set_mounts(MountConfig { workspace_writable: true, ..Default::default() });
    assert_eq!(f.run().await.status, Status::Ok);
    assert_eq!(f.log(), ["start 1", "exec 1 #1", "live 1", "exec 1 #2"]);
    assert_eq!(f.host.script.lock().exit_checks, 1, "the exit cleanup checks the project with the new guard");
    // A protected name deep in a new tree (no holder's watch sees it; the
    // checks after a kill do), made after the change.
    std::fs::create_dir_all(project.join("src/n/m")).expect("mkdir");
    std::fs::write(project.join("src/n/m/.envrc"), "echo pwned").expect("write");
    // A change back that the running sandbox cannot take: it is killed at
    // once, and its project checked then, not at the next execution.
    f.host.script.lock().live_fails.push_back(crate::live_grants::LiveError::Mode("busy".into()));
    assert_eq!(f.session.set_mounts(MountConfig::default()), Some(true));
    let dir = project.join("src/n/m");
    for _ in 0..1000 {
        if !names_in(&dir).contains(&".envrc".to_string()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let names = names_in(&dir);
    assert!(!names.contains(&".envrc".to_string()), "the name was made inert before any other execution: {names:?}");
    assert!(names.iter().any(|n| n.starts_with(".envrc.pi-inert")), "{names:?}");
    assert!(f.log().iter().all(|l| !l.starts_with("exec 1 #3") && !l.starts_with("kill 1")), "{:?}", f.log());
}

#[tokio::test]
async fn a_prestart_begins_the_spare_and_the_first_call_takes_it_waiting_while_it_starts() {
    let f = fixture(true, true);
    // The spare's start is held once spawned: the call comes while it starts.
    let gate = Arc::new(tokio::sync::Notify::new());
    f.host.script.lock().start_gate = Some(gate.clone());
    f.session.prestart().await;
    assert_eq!(f.session.status().spare, SpareState::Starting);
    assert!(!f.session.status().worker_running, "the spare is not the session's interpreter yet");
    let session = f.session.clone();
    let call = tokio::spawn(async move { session.execute("x = 1".into(), 30, None).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(f.log(), ["start 1"], "the call waits for the spare under way, it starts no other");
    gate.notify_one();
    let o = call.await.expect("the call");
    assert_eq!(o.status, Status::Ok, "{:?}", o.diagnostic);
    assert_eq!(said(&o), None, "no state was lost: none existed");
    assert_eq!(f.session.status().history.generation, 1);
    assert_eq!(f.log()[..2], ["start 1", "exec 1 #1"]);
    f.session.dispose("disposed").await;
}

#[tokio::test]
async fn with_a_sandbox_running_the_spare_starts_only_once_no_call_runs() {
    let f = fixture(true, true);
    assert_eq!(f.run().await.status, Status::Ok);
    // The next call fails and its rollback is held: it runs on past the spare's delay.
    let gate = Arc::new(tokio::sync::Notify::new());
    f.host.script.lock().recover_gate = Some(gate.clone());
    f.script(Exec::Interrupted(Interrupt::Timeout));
    let session = f.session.clone();
    let call = tokio::spawn(async move { session.execute("x = 1".into(), 30, None).await });
    tokio::time::sleep(SPARE_DELAY * 5).await;
    assert!(f.log().contains(&"recover 1".to_string()), "{:?}", f.log());
    assert_eq!(f.session.status().spare, SpareState::None, "no spare starts beside a call: {:?}", f.log());
    assert_eq!(f.log().iter().filter(|l| l.starts_with("start")).count(), 1, "{:?}", f.log());
    gate.notify_one();
    let o = call.await.expect("the call");
    assert!(matches!(o.state, StateFate::RolledBack { .. }), "{:?}", o.state);
    // Once no call runs, it does.
    let waited = Instant::now();
    while f.session.status().spare != SpareState::Ready {
        assert!(waited.elapsed() < Duration::from_secs(5), "no spare: {:?}", f.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f.session.dispose("disposed").await;
}

#[tokio::test]
async fn a_prestart_starts_nothing_with_prewarm_off_or_once_an_interpreter_runs() {
    let f = fixture(true, false);
    f.session.prestart().await;
    assert_eq!(f.session.status().spare, SpareState::None);
    assert_eq!(
        f.log(),
        ["warm"],
        "prewarm off: nothing starts before the first call, the process's once-only work is begun"
    );
    assert!(f.session.status().dirs.is_none(), "prewarm off: no session directory either");
    let f = fixture(true, true);
    assert_eq!(f.run().await.status, Status::Ok);
    let waited = Instant::now();
    while f.session.status().spare != SpareState::Ready {
        assert!(waited.elapsed() < Duration::from_secs(5), "no spare: {:?}", f.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f.session.prestart().await;
    assert_eq!(f.log().iter().filter(|l| l.starts_with("start")).count(), 2, "{:?}", f.log());
    f.session.dispose("disposed").await;
}
