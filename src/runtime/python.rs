//! The python tool's payload: the interpreter, its packages and the worker
//! (see `worker.py`), run under the engine's
//! [`Policy`](crate::bwrap::Policy). Everything the sandbox's command line
//! says about Python is made here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::bwrap::{FdBind, Payload};
use crate::frame::{ExecReport, Request};
use crate::options::{SessionOptions, Settings};
use crate::outcome::Outcome;
use crate::probe::{self, Interpreter, InterpreterError, PythonEnv};
use crate::runtime::{CallRequest, Runtime};

pub mod bytecode;
pub mod images;

/// The script the sandbox runs, embedded in the addon: the generic init
/// (`init.py`: PID 1, frame I/O, reserved descriptors, end marks) and then
/// the python worker (`worker.py`), one file so that the rollback copy
/// checks both as one module (see `pristine()`).
pub const WORKER_SOURCE: &str = concat!(include_str!("../worker/init.py"), include_str!("../worker/worker.py"));

pub use crate::runtime_paths::{LOGS, PYTHON_RESERVED as RESERVED_MOUNTS, WORKER, WORKER_PYC};

/// After a read grant the python runtime runs the call again: the refused
/// call raised at the read, before the code could go on (see the grant
/// loop, `grants::orchestrator`).
pub const AFTER_GRANT: crate::runtime::AfterGrant = crate::runtime::AfterGrant::RunAgain;

/// Which form of the worker a sandbox runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerCode {
    /// The source (host path), compiled by the interpreter at start; with
    /// `emit`, the worker sends its compiled form back.
    Source { path: PathBuf, emit: bool },
    /// A `.pyc` image (host path) an earlier sandbox compiled.
    Bytecode(PathBuf),
}

/// What varies between the python tool's sandboxes, beyond the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Python {
    /// The interpreter, as a resolved host path.
    pub interpreter: PathBuf,
    /// Host directories an interpreter outside `/usr` needs (its prefix),
    /// mounted read-only at the same path.
    pub interpreter_mounts: Vec<PathBuf>,
    /// The worker to run.
    pub worker: WorkerCode,
    /// The session's log directory, mounted read-only at [`LOGS`] (the
    /// engine's own debug log is not in it).
    pub logs: Option<PathBuf>,
    /// The user's Python packages: directories mounted read-only at their
    /// own paths.
    pub package_mounts: Vec<PathBuf>,
    /// Package directories inside a tree the sandbox can write, mounted
    /// read-only from fds at their own paths.
    pub package_fd_mounts: Vec<FdBind>,
    /// The site directories the worker adds.
    pub site_dirs: Vec<PathBuf>,
    /// The secret masks' sandbox paths, told to the worker (its read hook
    /// names a read of one as a secret).
    pub mask_paths: Vec<String>,
    /// The worker's bounds, `name=value,...` (see `limits::worker_limits`):
    /// the host's constants are the only source.
    pub worker_limits: String,
    /// Run the worker as PID 1 that keeps the sandbox across interpreters
    /// (rollback and fast reset); off, the worker is the interpreter.
    pub keeper: bool,
    /// The policy's open-file limit, which the worker sets first thing
    /// (see `Policy::nofile`).
    pub nofile: Option<u64>,
}

/// The payload that runs `py`. The policy's task cap is not the worker's
/// to set: the host sets it before the worker exists (see
/// `Policy::held_rlimits`); its open-file limit is (see `Policy::nofile`).
pub fn payload(py: &Python) -> Payload {
    let (host, worker) = match &py.worker {
        WorkerCode::Source { path, .. } => (path, WORKER),
        WorkerCode::Bytecode(path) => (path, WORKER_PYC),
    };
    let mut argv: Vec<OsString> = vec![py.interpreter.clone().into()];
    argv.extend(["-I", "-S", "-B", "-u", "-X", "utf8", worker].map(OsString::from));
    if matches!(py.worker, WorkerCode::Source { emit: true, .. }) {
        argv.push("--emit-code".into());
    }
    for dir in &py.site_dirs {
        argv.extend(["--site".into(), dir.into()]);
    }
    if !py.mask_paths.is_empty() {
        let paths = serde_json::to_string(&py.mask_paths).unwrap_or_else(|_| "[]".into());
        argv.extend(["--masks".into(), paths.into()]);
    }
    argv.extend(["--limits".into(), py.worker_limits.clone().into()]);
    if py.keeper {
        argv.push("--keeper".into());
    }
    if let Some(n) = py.nofile {
        argv.extend(["--nofile".into(), n.to_string().into()]);
    }
    Payload {
        runtime_mounts: py.interpreter_mounts.clone(),
        code: std::iter::once((host.clone(), worker.into()))
            .chain(py.logs.iter().map(|l| (l.clone(), LOGS.into())))
            .collect(),
        links: vec![],
        read_mounts: py.package_mounts.clone(),
        fd_mounts: py.package_fd_mounts.clone(),
        env: vec![],
        as_pid_1: py.keeper,
        chdir: None,
        argv,
    }
}

/// The python tool's runtime. Its bytecode cache ([`bytecode`]) and the
/// images a call shows ([`images`]) live here; the interpreter probe's
/// parts (`probe`, shared with the bubblewrap probe) and the report's
/// wording (`outcome`) are still modules of their own, which this one calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct PythonRuntime;

/// What the python runtime learns about the host once per session.
pub struct PythonFacts {
    pub interpreter: Interpreter,
    pub python: PythonEnv,
    /// Key of the worker's compiled form for this interpreter.
    pub code_key: Option<u64>,
}

impl Runtime for PythonRuntime {
    type Facts = PythonFacts;
    type ProbeError = InterpreterError;
    type Start = Python;
    type Request = Request;
    type Report = ExecReport;

    /// Find the interpreter and the Python packages.
    fn probe(&self, opts: &SessionOptions) -> Result<PythonFacts, InterpreterError> {
        let settings = Settings::from_env();
        let configured = opts.interpreter.clone().or(settings.interpreter);
        let interpreter = probe::resolve_interpreter(configured.as_deref())?;
        let venv = opts.python_packages.clone().or(settings.venv);
        let system_site = opts.system_site_packages.unwrap_or(settings.system_site);
        // The project and the runtime root: trees the sandbox can write.
        let runtime = opts.runtime_root.clone().unwrap_or_else(crate::rundir::default_runtime_root);
        let writable: Vec<(PathBuf, PathBuf)> = [opts.project_dir.clone(), runtime]
            .into_iter()
            .filter_map(|given| std::fs::canonicalize(&given).ok().map(|c| (given, c)))
            .collect();
        let python = probe::python_env_from_host(venv.as_deref(), system_site, &writable);
        let code_key = crate::runtime::python::bytecode::key(&interpreter.path, WORKER_SOURCE);
        Ok(PythonFacts { interpreter, python, code_key })
    }

    fn payload(&self, start: &Python) -> Payload {
        payload(start)
    }

    /// The code and the mark go as base64, so that JSON escaping can never
    /// push a source within the code limit past the frame limit.
    fn request(&self, call: CallRequest<'_>) -> Request {
        let b64 = &base64::engine::general_purpose::STANDARD;
        Request::Exec {
            id: call.id,
            code: b64.encode(call.code.as_bytes()),
            mark: b64.encode(call.mark),
            checkpoint: call.checkpoint,
            moved: call.moved,
        }
    }

    fn report(&self, mut report: ExecReport, scratch: &Path, into: &mut Outcome) {
        let collected = images::collect(scratch, std::mem::take(&mut report.images));
        crate::outcome::apply_report(into, report, collected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bwrap::{bwrap_argv, test_policy, Policy};
    use crate::hostsecrets::Mask;

    fn python() -> Python {
        Python {
            interpreter: "/usr/bin/python3.11".into(),
            interpreter_mounts: vec![],
            worker: WorkerCode::Source { path: "/tmp/s/worker.py".into(), emit: false },
            logs: None,
            package_mounts: vec![],
            package_fd_mounts: vec![],
            site_dirs: vec![],
            mask_paths: vec![],
            worker_limits: "frame=1".into(),
            keeper: false,
            nofile: None,
        }
    }

    fn argv(policy: &Policy, py: &Python) -> Vec<String> {
        bwrap_argv(policy, &payload(py)).iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    fn has_triple(argv: &[String], triple: [&str; 3]) -> bool {
        argv.windows(3).any(|w| w == triple)
    }

    /// A sandbox with every part of the policy and of the payload in use.
    fn full() -> (Policy, Python) {
        let policy = Policy {
            project_dir: "/home/u/proj".into(),
            workspace_writable: true,
            scratch_dir: "/rt/s/scratch".into(),
            read_roots: vec!["/etc".into(), "/data/a".into()],
            once: vec![("/srv/real.csv".into(), "/srv/link.csv".into())],
            host_masks: vec![
                Mask { path: "/etc/shadow".into(), is_dir: false },
                Mask { path: "/etc/sudoers.d".into(), is_dir: true },
            ],
            mask_sources: ("/rt/s/mask-file".into(), "/rt/s/mask-dir".into()),
            protected: vec![
                FdBind { fd: 8, dest: "/workspace/sub".into(), read_only: false },
                FdBind { fd: 9, dest: "/workspace/sub/.git".into(), read_only: true },
            ],
            masks: vec![
                FdBind { fd: 10, dest: "/workspace/deploy".into(), read_only: true },
                FdBind { fd: 11, dest: "/workspace/deploy/key.pem".into(), read_only: true },
            ],
            // The project's canonical path and the name the caller gave it.
            project_links: vec!["/home/u/proj".into(), "/srv/proj-link".into()],
            nofile: Some(4096),
            nproc: Some(512),
            ..test_policy()
        };
        let py = Python {
            interpreter: "/opt/py/bin/python3.12".into(),
            interpreter_mounts: vec!["/opt/py".into()],
            worker: WorkerCode::Source { path: "/rt/s/worker.py".into(), emit: true },
            logs: Some("/rt/s/logs".into()),
            package_mounts: vec!["/home/u/venv".into()],
            package_fd_mounts: vec![FdBind { fd: 13, dest: "/home/u/proj/.venv".into(), read_only: true }],
            site_dirs: vec![
                "/home/u/venv/lib/python3.12/site-packages".into(),
                "/home/u/proj/.venv/lib/python3.12/site-packages".into(),
            ],
            mask_paths: vec!["/workspace/deploy/key.pem".into()],
            worker_limits: "frame=1,stream=2".into(),
            keeper: true,
            nofile: Some(4096),
        };
        (policy, py)
    }

    fn recorded(json: &str) -> Vec<String> {
        serde_json::from_str(json).expect("a recorded argv")
    }

    /// The argv of every part in use, argument for argument as the python
    /// tool has always built it (recorded from the builder before the
    /// policy and the payload were apart), less the task cap the worker was
    /// once told (the host sets it now) and less `/proc`'s read-only views
    /// and masks (the namespace helper makes them now), and with the project's host names
    /// made links to /workspace last (a venv inside the project is then
    /// mounted inside /workspace, where the links lead).
    #[test]
    fn the_full_python_sandbox_argv_is_the_recorded_one() {
        let (policy, py) = full();
        assert_eq!(argv(&policy, &py), recorded(include_str!("python-argv-full.json")));
        let bytecode = Python {
            worker: WorkerCode::Bytecode("/rt/.worker-code/worker-00ff.pyc".into()),
            keeper: false,
            nofile: None,
            ..py
        };
        let read_only = Policy { merged_usr: false, workspace_writable: false, nofile: None, ..policy };
        assert_eq!(argv(&read_only, &bytecode), recorded(include_str!("python-argv-bytecode.json")));
    }

    #[test]
    fn default_argv_is_exactly_the_documented_confinement() {
        let argv = argv(&test_policy(), &python());
        let expected = "--unshare-user --disable-userns --unshare-pid --unshare-ipc \
            --unshare-uts --hostname pi-sandbox --unshare-net --unshare-cgroup-try \
            --die-with-parent --cap-drop ALL --info-fd 6 --block-fd 7 \
            --proc /proc --dev /dev --size 67108864 --tmpfs /dev/shm --remount-ro /dev \
            --size 268435456 --tmpfs /tmp --ro-bind /usr /usr \
            --symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib \
            --symlink usr/lib32 /lib32 --symlink usr/lib64 /lib64 --symlink usr/libx32 /libx32 \
            --ro-bind-try /etc/ld.so.cache /etc/ld.so.cache --ro-bind-try /etc/localtime /etc/localtime \
            --ro-bind-try /etc/fonts /etc/fonts \
            --ro-bind /home/u/proj /workspace --bind /tmp/s/scratch /scratch \
            --ro-bind /tmp/s/worker.py /worker.py --remount-ro / --chdir /workspace \
            --clearenv --setenv PATH /usr/bin:/bin --setenv HOME /scratch \
            --setenv TMPDIR /tmp --setenv LANG C.UTF-8 --seccomp 5 \
            -- /usr/bin/python3.11 -I -S -B -u -X utf8 /worker.py --limits frame=1";
        assert_eq!(argv.join(" "), expected);
    }

    #[test]
    fn the_worker_runs_as_source_asked_to_emit_its_code_or_as_bytecode() {
        let tail = |worker| {
            let argv = argv(&test_policy(), &Python { worker, site_dirs: vec!["/v/site".into()], ..python() });
            let bind = argv.iter().position(|a| a.starts_with("/worker")).expect("worker bind");
            let command = argv.iter().position(|a| a == "--").expect("--");
            (argv[bind - 2..=bind].join(" "), argv[command + 1..].join(" "))
        };
        let emit = WorkerCode::Source { path: "/tmp/s/worker.py".into(), emit: true };
        assert_eq!(
            tail(emit),
            (
                "--ro-bind /tmp/s/worker.py /worker.py".into(),
                "/usr/bin/python3.11 -I -S -B -u -X utf8 /worker.py --emit-code --site /v/site --limits frame=1".into()
            )
        );
        let pyc = WorkerCode::Bytecode("/rt/.worker-code/worker-00ff.pyc".into());
        assert_eq!(
            tail(pyc),
            (
                "--ro-bind /rt/.worker-code/worker-00ff.pyc /worker.pyc".into(),
                "/usr/bin/python3.11 -I -S -B -u -X utf8 /worker.pyc --site /v/site --limits frame=1".into()
            )
        );
    }

    #[test]
    fn the_worker_is_told_its_open_file_limit_last_and_never_its_task_cap() {
        let limited = Policy { nofile: Some(128), nproc: Some(256), ..test_policy() };
        for keeper in [false, true] {
            let py = Python { keeper, ..python() };
            assert_eq!(
                argv(&limited, &py),
                argv(&test_policy(), &py),
                "keeper {keeper}: the policy alone adds nothing"
            );
        }
        let told = argv(&limited, &Python { nofile: Some(128), ..python() });
        assert_eq!(told[told.len() - 4..], ["--limits", "frame=1", "--nofile", "128"]);
        assert!(!told.iter().any(|a| a == "--nproc"), "the host sets the task cap");
        // As PID 1 (rollback), the worker is the process bubblewrap holds,
        // on which the host sets the task cap before it execs.
        let keeper = argv(&limited, &Python { keeper: true, ..python() });
        let command = keeper.iter().position(|a| a == "--").expect("--");
        assert_eq!(keeper[command - 1], "--as-pid-1");
    }

    #[test]
    fn secret_masks_cover_the_workspace_in_every_mode_and_are_named_to_the_worker() {
        let masks = vec![
            FdBind { fd: 8, dest: "/workspace/deploy".into(), read_only: true },
            FdBind { fd: 9, dest: "/workspace/deploy/key.pem".into(), read_only: true },
        ];
        let paths = vec!["/workspace/deploy/key.pem".to_string()];
        for writable in [false, true] {
            let argv = argv(
                &Policy { workspace_writable: writable, masks: masks.clone(), ..test_policy() },
                &Python { mask_paths: paths.clone(), ..python() },
            );
            let at = argv.iter().position(|a| a == "/workspace/deploy/key.pem").expect("mask");
            let scratch = argv.iter().position(|a| a == "/scratch").expect("scratch");
            assert!(at < scratch);
            assert_eq!(
                argv[at - 5..=at],
                ["--ro-bind-fd", "8", "/workspace/deploy", "--ro-bind-fd", "9", "/workspace/deploy/key.pem"]
            );
            let protected = argv.iter().position(|a| a == "/workspace/sub/.git");
            assert_eq!(protected.is_some(), writable);
            assert!(protected.is_none_or(|p| p < at), "masks come after protected binds");
            assert_eq!(argv[argv.len() - 4..], ["--masks", r#"["/workspace/deploy/key.pem"]"#, "--limits", "frame=1"]);
        }
    }

    #[test]
    fn read_roots_and_interpreter_prefix_are_mounted_read_only_at_their_paths() {
        let argv = argv(
            &Policy { read_roots: vec!["/data/a".into(), "/etc".into()], ..test_policy() },
            &Python {
                interpreter: "/opt/py/bin/python3".into(),
                interpreter_mounts: vec!["/opt/py".into()],
                ..python()
            },
        );
        assert!(has_triple(&argv, ["--ro-bind-try", "/data/a", "/data/a"]));
        assert!(has_triple(&argv, ["--ro-bind-try", "/etc", "/etc"]));
        assert!(has_triple(&argv, ["--ro-bind", "/opt/py", "/opt/py"]));
        assert_eq!(argv[argv.len() - 10], "/opt/py/bin/python3");
    }

    #[test]
    fn a_user_venv_is_mounted_read_only_and_named_to_the_worker() {
        let argv = argv(
            &test_policy(),
            &Python {
                package_mounts: vec!["/home/u/venv".into()],
                site_dirs: vec!["/home/u/venv/lib/python3.11/site-packages".into()],
                ..python()
            },
        );
        assert!(has_triple(&argv, ["--ro-bind-try", "/home/u/venv", "/home/u/venv"]));
        assert_eq!(
            argv[argv.len() - 5..argv.len() - 2],
            ["/worker.py", "--site", "/home/u/venv/lib/python3.11/site-packages"]
        );
    }

    #[test]
    fn a_venv_inside_the_project_is_mounted_from_an_fd() {
        let argv = argv(
            &test_policy(),
            &Python {
                package_fd_mounts: vec![FdBind { fd: 8, dest: "/home/u/proj/.venv".into(), read_only: true }],
                ..python()
            },
        );
        assert!(has_triple(&argv, ["--ro-bind-fd", "8", "/home/u/proj/.venv"]));
        assert!(!argv.iter().any(|a| a == "/workspace/sub"), "protected binds only in a writable workspace");
    }

    #[test]
    fn a_read_root_may_not_land_on_the_worker() {
        for path in ["/worker.py", "/worker.pyc"] {
            assert!(RESERVED_MOUNTS.contains(&path), "{path}");
        }
    }

    #[test]
    fn request_carries_the_code_and_the_mark_as_base64() {
        let call = CallRequest { id: 7, code: "print(\"é\")\n", mark: b"\x00end\n", checkpoint: true, moved: 2 };
        let b64 = &base64::engine::general_purpose::STANDARD;
        assert_eq!(
            PythonRuntime.request(call),
            Request::Exec {
                id: 7,
                code: b64.encode("print(\"é\")\n"),
                mark: b64.encode(b"\x00end\n"),
                checkpoint: true,
                moved: 2
            }
        );
    }
}
