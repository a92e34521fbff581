//! What one sandbox start is made of: the host facts probed once per
//! session, the protection plan of a writable project, the mount sources
//! as fds, the containment (see `contain`), the bubblewrap argv and the
//! seccomp program; and the start itself, from the stored bytecode of the
//! worker when there is one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::beneath::Tree;
use crate::bwrap::{bwrap_argv, FdBind, WORKSPACE};
use crate::limits::{worker_limits, STARTUP_DEADLINE};
use crate::options::{SessionOptions, Settings};
use crate::permissions::MountConfig;
use crate::probe::{self, Interpreter, PythonEnv};
use crate::protected;
use crate::rundir::Dirs;
use crate::runtime::python::{Python, PythonRuntime, WorkerCode};
use crate::runtime::Runtime;
use crate::seccomp;
use crate::worker::{CodeForm, Launch, Ready, StartError, Stop, Worker};

pub use crate::runtime::python::WORKER_SOURCE;

/// What a session learns about the host once.
pub struct Facts {
    /// What every sandbox needs (see `confine`).
    pub host: crate::confine::HostFacts,
    pub interpreter: Interpreter,
    pub python: PythonEnv,
    /// Key of the worker's compiled form for this interpreter.
    pub code_key: Option<u64>,
}

/// Why the host cannot run the tool at all.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0} {REFUSE}", REFUSE = probe::REFUSE)]
    Bwrap(#[from] probe::BwrapError),
    #[error(transparent)]
    Interpreter(#[from] probe::InterpreterError),
}

impl Facts {
    /// Find bubblewrap, the interpreter and the Python packages.
    pub async fn probe(opts: &SessionOptions) -> Result<Facts, ProbeError> {
        let host = crate::confine::HostFacts::probe(opts).await?;
        let py = PythonRuntime.probe(opts)?;
        Ok(Facts { host, interpreter: py.interpreter, python: py.python, code_key: py.code_key })
    }
}

/// One start: where, with which mounts, and where its notes go.
pub struct Start<'a, F = Facts> {
    pub facts: &'a F,
    pub dirs: &'a Dirs,
    /// The canonical project directory.
    pub project: PathBuf,
    /// Its other host names (see `confine::Request::project_names`).
    pub project_names: Vec<PathBuf>,
    pub mounts: MountConfig,
    /// Where the protection plan's findings between executions go.
    pub notes: protected::Notes,
    pub tainted: protected::Tainted,
    /// The secrets earlier starts of the session found.
    pub known: protected::KnownSecrets,
    /// The caller's rollback choice, over the environment's.
    pub rollback: Option<bool>,
    /// The network through the host's proxy (`network.python`); none: no
    /// network at all (the default).
    pub network: Option<crate::worker::PythonNetwork>,
}

/// Start one sandbox and wait for it to report ready: from the stored
/// bytecode when there is one, else from source (asking the worker for its
/// compiled form). Bytecode whose worker failed (exited, or sent something
/// wrong) is deleted and the start is made again from source; a cancel or
/// the startup deadline is not the image's doing.
pub async fn start(
    start: &Start<'_>,
    stop: &mut Stop<'_>,
    spawned: &(dyn Fn(i32, bool) + Send + Sync),
) -> Result<(Worker, Ready), StartError> {
    let runtime_root = start.dirs.root.parent().unwrap_or(&start.dirs.root);
    let stored = start.facts.code_key.and_then(|key| crate::runtime::python::bytecode::cached(runtime_root, key));
    if let Some(pyc) = stored {
        let began = Instant::now();
        match start_once(start, stop, spawned, WorkerCode::Bytecode(pyc.clone())).await {
            Err(e) if e.is_worker_failure() && began.elapsed() < STARTUP_DEADLINE => {
                tracing::warn!("stored worker bytecode {} did not start ({e}); deleted", pyc.display());
                let _ = std::fs::remove_file(&pyc);
            }
            done => return done,
        }
    }
    crate::rundir::write_worker(start.dirs, WORKER_SOURCE).map_err(|e| {
        StartError::Prepare(format!("The worker's source could not be written to {}: {e}", start.dirs.root.display()))
    })?;
    let code = WorkerCode::Source { path: start.dirs.worker_file.clone(), emit: start.facts.code_key.is_some() };
    start_once(start, stop, spawned, code).await
}

pub use crate::confine::{host_masks, quarantine_masks};

/// What a process's first start does once and later starts find kept,
/// begun in the background for a session that begins no sandbox ahead of
/// its first call: bubblewrap's version, the seccomp program, and the
/// host-secret list of the session's project and runtime root (kept while
/// nothing it consulted changed, see `hostsecrets::cache`). Starts no
/// process but `bwrap --version`; what fails here the first call does
/// again and reports.
pub fn warm(opts: &SessionOptions) {
    let project = opts.project_dir.clone();
    let root = opts.runtime_root.clone().unwrap_or_else(crate::rundir::default_runtime_root);
    tokio::spawn(async {
        let _ = probe::probe_bwrap().await;
    });
    tokio::task::spawn_blocking(move || {
        seccomp::warm(seccomp::Profile::Python);
        // The trees as a start names them (`confine::sandbox_trees`).
        let Ok(project) = std::fs::canonicalize(&project) else { return };
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        let _ = Settings::from_env().host_secrets(&[project.as_path(), root.as_path()]);
    });
}

/// Start one sandbox running `code` and wait for it to report ready.
async fn start_once(
    start: &Start<'_>,
    stop: &mut Stop<'_>,
    spawned: &(dyn Fn(i32, bool) + Send + Sync),
    code: WorkerCode,
) -> Result<(Worker, Ready), StartError> {
    let Start { facts, dirs, project, mounts, .. } = start;
    let settings = Settings::from_env();
    let keeper = start.rollback.unwrap_or(settings.rollback);
    let network = start.network.clone();
    let secrets = crate::confine::host_secrets(&settings, dirs, project);
    let mut confined = crate::confine::confine(crate::confine::Request {
        host: &facts.host,
        dirs,
        project,
        project_at: Path::new(WORKSPACE),
        project_names: &start.project_names,
        mounts,
        notes: start.notes.clone(),
        tainted: start.tainted.clone(),
        known: start.known.clone(),
        payload_reads: &facts.python.mounts,
        runtime_mounts: &facts.interpreter.mounts,
        settings,
        secrets,
        cache: None,
        kept_reads: None,
        seccomp: if network.is_some() { seccomp::Profile::PythonNet } else { seccomp::Profile::Python },
    })
    .await
    .map_err(|e| match e {
        crate::confine::ConfineError::Prepare(why) => StartError::Prepare(why),
        crate::confine::ConfineError::Settings(e) => StartError::Settings(e),
    })?;
    if let Some(halt) = (stop.check)() {
        return Err(StartError::Halted(halt));
    }
    let project = project.as_path();
    // Package directories inside the project (a venv there) or the
    // scratch directory are trees the sandbox may have written: mounted
    // from fds opened beneath them, never by path.
    let mut python_mounts = Vec::new();
    let mut python_fd_mounts = Vec::new();
    for dir in &facts.python.mounts {
        let tree_root = [project, dirs.scratch.as_path()].into_iter().find(|r| dir.starts_with(r));
        let Some(root) = tree_root else {
            python_mounts.push(dir.clone());
            continue;
        };
        let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
        match Tree::open(root).and_then(|t| t.dir(rel)) {
            Ok(fd) => {
                python_fd_mounts.push(FdBind { fd: confined.fd(fd), dest: dir.clone(), read_only: true });
            }
            Err(e) => tracing::warn!("{} not mounted: {e}", dir.display()),
        }
    }
    confined.settle_nofile();
    let crate::confine::Confined {
        policy,
        mount_fds,
        host_secrets,
        secret_watch,
        masks_watch,
        guard,
        watcher,
        plan_notes,
        masks,
        contained,
        budget,
        ..
    } = confined;
    let python = Python {
        interpreter: facts.interpreter.path.clone(),
        interpreter_mounts: facts.interpreter.mounts.clone(),
        worker: code.clone(),
        logs: Some(dirs.logs.clone()),
        package_mounts: python_mounts,
        package_fd_mounts: python_fd_mounts,
        site_dirs: facts.python.site_dirs.clone(),
        mask_paths: masks.worker_paths(),
        worker_limits: worker_limits(),
        keeper,
        nofile: policy.nofile,
    };
    let seccomp = seccomp::bpf_memfd(policy.seccomp)
        .map_err(|e| StartError::Prepare(format!("The seccomp filter could not be built: {e}")))?;
    let form = if matches!(code, WorkerCode::Bytecode(_)) { CodeForm::Bytecode } else { CodeForm::Source };
    let mut payload = PythonRuntime.payload(&python);
    if network.is_some() {
        payload.env.extend(crate::network::proxy::environment(crate::nshelper::listen::PROXY_PORT));
    }
    let launch = Launch {
        bwrap: facts.host.bwrap.path.clone(),
        argv: bwrap_argv(&policy, &payload),
        seccomp,
        mount_fds,
        mounts: mounts.clone(),
        host_masks: policy.host_masks.clone(),
        host_secrets,
        secret_watch,
        masks_watch,
        guard,
        plan_notes,
        masks,
        code: form,
        emit_code: matches!(code, WorkerCode::Source { emit: true, .. }),
        check_image: |pyc| Ok(crate::runtime::python::bytecode::decode(pyc)?),
        request: Box::new(|call| crate::frame::encode(&PythonRuntime.request(call))),
        keeper,
        contained,
        limits: policy.held_rlimits(),
        held: policy.held_mounts(),
        inside: crate::inotify::cap_steps(facts.host.inotify_share),
        watcher,
        budget,
        network,
    };
    let (worker, ready) = Worker::start(launch, stop, spawned).await?;
    if let (Some(image), Some(key)) = (&ready.image, facts.code_key) {
        let runtime_root = dirs.root.parent().unwrap_or(&dirs.root);
        if let Err(e) = crate::runtime::python::bytecode::store(runtime_root, key, image) {
            tracing::warn!("{e}");
        }
    }
    Ok((worker, ready))
}
