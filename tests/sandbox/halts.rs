//! A sandbox the session stopped (a dispose, a mode change) ends its call
//! as why it was stopped, never as a death: the session says why before it
//! kills and wakes the call after, so the call may find the sandbox gone
//! first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pi_python_sandbox::capture::Capture;
use pi_python_sandbox::frame::end_mark;
use pi_python_sandbox::launch::{self, Facts, Start};
use pi_python_sandbox::rundir::make_dirs;
use pi_python_sandbox::worker::{Call, Halt, Interrupt, Stop};

/// Whether process `pid` is gone (or a zombie: it holds no descriptor).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_sandbox_a_dispose_killed_before_its_request_went_out_ends_as_the_dispose() {
    let Some(f) = super::fixture_with("halt-before-write", Some(true)) else { return };
    let opts = f.session.options().clone();
    let facts = Facts::probe(&opts).await.expect("probe");
    let dirs = make_dirs(Some(&f.dir.join("runtime"))).expect("session directory");
    let start = Start {
        facts: &facts,
        dirs: &dirs,
        project: std::fs::canonicalize(&opts.project_dir).expect("project"),
        project_names: vec![],
        mounts: Default::default(),
        notes: Default::default(),
        tainted: Default::default(),
        known: Default::default(),
        rollback: Some(true),
        network: None,
    };
    let disposed = AtomicBool::new(false);
    let check = || disposed.load(Ordering::Acquire).then_some(Halt::Disposed);
    let (_wake_tx, mut wake) = tokio::sync::watch::channel(0u64);
    let mut stop = Stop { wake: &mut wake, check: &check };
    let (mut worker, _) = launch::start(&start, &mut stop, &|_, _| {}).await.expect("start");
    let init = worker.init_pid.expect("the sandbox's PID 1");

    // The dispose: why first, then the kill; its wake has not come yet.
    disposed.store(true, Ordering::Release);
    worker.kill_handle().kill();
    let until = Instant::now() + Duration::from_secs(10);
    while !gone(init) {
        assert!(Instant::now() < until, "the killed sandbox's PID 1 did not end");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = worker.wait_exit(Duration::from_secs(5)).await;

    let mark = end_mark("0123456789abcdef");
    let logs = dirs.logs.clone();
    let mut capture = Capture::new(mark.clone(), logs.join("out.log"), logs.join("err.log"));
    let call = Call {
        seq: 1,
        code: "x = 1",
        mark: &mark,
        deadline: tokio::time::Instant::now() + Duration::from_secs(10),
        progress: None,
    };
    let ended = worker.exec(call, &mut capture, &mut stop).await.err();
    assert_eq!(ended, Some(Interrupt::Halted(Halt::Disposed)));
    let _ = worker.kill(None).await;
    let _ = std::fs::remove_dir_all(&dirs.root);
}
