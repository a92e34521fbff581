//! What one sandbox start is made of: the host facts probed once per
//! session, the protection plan of a writable project, the mount sources
//! as fds, the containment (see `contain`), the bubblewrap argv and the
//! seccomp program; and the start itself, from the stored bytecode of the
//! worker when there is one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::beneath::Tree;
use crate::bwrap::{bwrap_argv, FdBind, Network, Policy, MOUNT_FD_BASE, WORKSPACE};
use crate::limits::{worker_limits, RLIMIT_NOFILE, STARTUP_DEADLINE};
use crate::options::{SessionOptions, Settings};
use crate::permissions::MountConfig;
use crate::probe::{self, Bwrap, Interpreter, PythonEnv};
use crate::protected;
use crate::rundir::Dirs;
use crate::runtime::python::{Python, PythonRuntime, WorkerCode};
use crate::runtime::Runtime;
use crate::seccomp;
use crate::worker::{CodeForm, Launch, Ready, StartError, Stop, Worker};

pub use crate::runtime::python::WORKER_SOURCE;

/// What a session learns about the host once.
pub struct Facts {
    pub bwrap: Bwrap,
    pub interpreter: Interpreter,
    pub merged_usr: bool,
    /// The kernel information files this host has (see `bwrap::PROC_MASKS`).
    pub proc_masks: Vec<crate::hostsecrets::Mask>,
    pub python: PythonEnv,
    /// Key of the worker's compiled form for this interpreter.
    pub code_key: Option<u64>,
    /// One sandbox's share of the user's inotify budget (read once).
    pub inotify_share: crate::inotify::InotifyBudget,
    pub guard_inotify: protected::InotifyInit,
}

/// Why the host cannot run the tool at all.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Bwrap(#[from] probe::BwrapError),
    #[error(transparent)]
    Interpreter(#[from] probe::InterpreterError),
}

impl Facts {
    /// Find bubblewrap, the interpreter and the Python packages.
    pub async fn probe(opts: &SessionOptions) -> Result<Facts, ProbeError> {
        let bwrap = probe::probe_bwrap().await?;
        let py = PythonRuntime.probe(opts)?;
        Ok(Facts {
            bwrap,
            interpreter: py.interpreter,
            merged_usr: probe::merged_usr(),
            proc_masks: probe::proc_masks_of_host(),
            python: py.python,
            code_key: py.code_key,
            inotify_share: crate::inotify::sandbox_share(crate::inotify::host_budget()),
            guard_inotify: opts.guard_inotify.unwrap_or(protected::inotify_init),
        })
    }
}

/// One start: where, with which mounts, and where its notes go.
pub struct Start<'a, F = Facts> {
    pub facts: &'a F,
    pub dirs: &'a Dirs,
    /// The canonical project directory.
    pub project: PathBuf,
    pub mounts: MountConfig,
    /// Where the protection plan's findings between executions go.
    pub notes: protected::Notes,
    pub tainted: protected::Tainted,
    /// The secrets earlier starts of the session found.
    pub known: protected::KnownSecrets,
    /// The caller's rollback choice, over the environment's.
    pub rollback: Option<bool>,
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
    let code = WorkerCode::Source { path: start.dirs.worker_file.clone(), emit: start.facts.code_key.is_some() };
    start_once(start, stop, spawned, code).await
}

/// The host secrets inside the read roots and allow-once directories, as
/// they are now (each root is checked against the list when it is granted;
/// what appeared since is masked all the same).
pub fn host_masks(
    secrets: &crate::hostsecrets::HostSecrets,
    mounts: &MountConfig,
    sandbox_trees: &[&Path],
) -> Vec<crate::hostsecrets::Mask> {
    // A root is mounted at its own path; an allow-once directory where the
    // code read it, which may be a link to its source.
    let roots = mounts.read_roots.iter().map(|r| (r, r));
    let once_dirs = mounts.once.iter().filter(|m| m.is_dir).map(|m| (&m.source, &m.path));
    let mut masks: Vec<crate::hostsecrets::Mask> = Vec::new();
    for (source, at) in roots.chain(once_dirs) {
        for mut m in secrets.masks_under(source, sandbox_trees) {
            if let Ok(rel) = m.path.strip_prefix(source) {
                m.path = at.join(rel);
            }
            if !masks.contains(&m) {
                masks.push(m);
            }
        }
    }
    masks
}

/// The masks over this session's set-aside scratches (`quarantine`, a
/// canonical host path; see `scratch::set_aside`) where a read root or an
/// allow-once directory holds them: such a grant shows the session
/// directory at its host path, and they may hold a secret.
pub fn quarantine_masks(quarantine: &Path, mounts: &MountConfig) -> Vec<crate::hostsecrets::Mask> {
    let roots = mounts.read_roots.iter().map(|r| (r, r));
    let once_dirs = mounts.once.iter().filter(|m| m.is_dir).map(|m| (&m.source, &m.path));
    let mut masks: Vec<crate::hostsecrets::Mask> = Vec::new();
    for (source, at) in roots.chain(once_dirs) {
        if let Ok(rel) = quarantine.strip_prefix(source) {
            let m = crate::hostsecrets::Mask { path: at.join(rel), is_dir: true };
            if !masks.contains(&m) {
                masks.push(m);
            }
        }
    }
    masks
}

/// Start one sandbox running `code` and wait for it to report ready.
async fn start_once(
    start: &Start<'_>,
    stop: &mut Stop<'_>,
    spawned: &(dyn Fn(i32, bool) + Send + Sync),
    code: WorkerCode,
) -> Result<(Worker, Ready), StartError> {
    let Start { facts, dirs, project, mounts, .. } = start;
    // The settings of this start, read once; git must never trust a file
    // under this session's runtime root (scratch is there).
    let mut settings = Settings::from_env();
    let runtime_root = dirs.root.parent().unwrap_or(&dirs.root).to_path_buf();
    settings.git.untrusted.push(runtime_root.clone());
    let sizes = settings.tmpfs.clone();
    let caps = settings.caps.clone();
    let budget = settings.budget;
    let canonical_root = std::fs::canonicalize(&runtime_root).unwrap_or_else(|_| runtime_root.clone());
    let trees = [project.as_path(), canonical_root.as_path()];
    let secrets = settings.host_secrets(&trees);
    let mut host_masks = host_masks(&secrets, mounts, &trees);
    // A virtual environment or package directory outside the project is a
    // host directory shown to the sandbox like a read root.
    for dir in facts.python.mounts.iter().filter(|d| !d.starts_with(project) && !d.starts_with(&canonical_root)) {
        for m in secrets.masks_under(dir, &trees) {
            if !host_masks.contains(&m) {
                host_masks.push(m);
            }
        }
    }
    // The scratches set aside, where a grant shows the session directory.
    let quarantine = dirs.root.file_name().map(|n| canonical_root.join(n).join(crate::scratch::QUARANTINE));
    if let Some(q) = quarantine.filter(|q| std::fs::symlink_metadata(q).is_ok_and(|m| m.is_dir())) {
        for m in quarantine_masks(&q, mounts) {
            if !host_masks.contains(&m) {
                host_masks.push(m);
            }
        }
    }
    // Mounts of kernel interfaces inside the project, a read root, an
    // allow-once directory or a package directory are hidden.
    let project_at = Path::new(WORKSPACE);
    let shown: Vec<(&Path, &Path)> = std::iter::once((project.as_path(), project_at))
        .chain(mounts.read_roots.iter().map(|r| (r.as_path(), r.as_path())))
        .chain(mounts.once.iter().filter(|m| m.is_dir).map(|m| (m.source.as_path(), m.path.as_path())))
        .chain(facts.python.mounts.iter().map(|d| (d.as_path(), d.as_path())))
        .collect();
    for m in crate::submounts::masks(&shown) {
        if !host_masks.contains(&m) {
            host_masks.push(m);
        }
    }
    let granted: Vec<&Path> = mounts
        .read_roots
        .iter()
        .map(PathBuf::as_path)
        .chain(mounts.once.iter().filter(|m| m.is_dir).map(|m| m.source.as_path()))
        .collect();
    let secret_watch = secrets.watch_points(&granted, &trees);
    let keeper = start.rollback.unwrap_or(settings.rollback);
    let mut plan_notes = Vec::new();
    // One walk of the project: the secret masks (every mode) and, when
    // the mode allows writes, the protected paths. A project that cannot
    // be protected is mounted read-only for this sandbox, and the first
    // result says why; a secret that cannot be masked stops the start.
    // The session's empty file and directory: the source of every mask,
    // the kernel's information files, the project's secrets and the host
    // secrets' in granted directories.
    let sources = crate::secrets::MaskSources::in_dir(&dirs.root)
        .map_err(|e| StartError::Prepare(format!("The empty files that hide secrets could not be made: {e}")))?;
    let (root, sink, tainted) = (project.clone(), start.notes.clone(), start.tainted.clone());
    // What a grant unmasked, and the secrets allowed once for this start.
    let unmasked: Vec<PathBuf> = mounts.unmasked.iter().chain(&mounts.unmasked_once).cloned().collect();
    let writable_mode = mounts.workspace_writable;
    let known = start.known.lock().clone();
    let mask_sources = (sources.file.clone(), sources.dir.clone());
    let host_list = secrets.clone();
    // A writable mode needs a guard that works: its inotify instance and
    // watches are made before the sandbox (which could otherwise take the
    // user's last ones first); without them the project is mounted
    // read-only for this sandbox.
    let guard_init = facts.guard_inotify;
    let planned = tokio::task::spawn_blocking(move || {
        let s = settings;
        let plan = |writable: bool| {
            protected::plan_start(protected::StartRequest {
                project: &root,
                protected: &s.protected,
                secrets: &s.secrets,
                limits: s.scan,
                git: &s.git,
                sink: sink.clone(),
                tainted: tainted.clone(),
                writable,
                unmasked: &unmasked,
                sources: Some(&sources),
                known: &known.masks,
                known_idents: &known.idents,
                host: &host_list,
            })
        };
        if !writable_mode {
            return plan(false).map(|p| (p, None, None));
        }
        let mut watcher = match protected::Watcher::new(guard_init) {
            Ok(w) => w,
            Err(e) => return plan(false).map(|p| (p, None, Some(e))),
        };
        let planned = plan(true)?;
        match planned.guard.as_ref().map(|g| watcher.watch_holders(g)) {
            Some(Err(e)) => plan(false).map(|p| (p, None, Some(e))),
            Some(Ok(())) => Ok((planned, Some(watcher), None)),
            None => Ok((planned, None, None)),
        }
    })
    .await;
    let (plan, watcher, no_guard) = match planned {
        Ok(Ok(planned)) => planned,
        Ok(Err(e)) => return Err(StartError::Prepare(format!("No sandbox was started: {e}."))),
        Err(e) => return Err(StartError::Prepare(format!("The protected paths could not be planned: {e}"))),
    };
    if let Some(e) = &plan.refused {
        plan_notes.push(format!(
            "/workspace is mounted READ-ONLY for this sandbox although the permission mode allows writes: {e}."
        ));
    }
    if let Some(e) = &no_guard {
        plan_notes.push(format!(
            "/workspace is mounted READ-ONLY for this sandbox although the permission mode allows writes: the guard \
             that keeps protected names inert could not get inotify ({e}: the inotify instances or watches of your \
             user are used up); close programs that hold them and reset, or raise fs.inotify.max_user_instances."
        ));
    }
    plan_notes.extend(plan.report.incomplete_note());
    let project = project.as_path();
    let writable = mounts.workspace_writable && plan.refused.is_none() && no_guard.is_none();
    if let Some(halt) = (stop.check)() {
        return Err(StartError::Halted(halt));
    }
    let masks = plan.report;
    let guard = plan.guard.map(Arc::new);
    let masks_watch = plan.watch;
    let mut mount_fds = Vec::new();
    let fd_binds = |binds: Vec<protected::Bind>, mount_fds: &mut Vec<std::os::fd::OwnedFd>| -> Vec<FdBind> {
        let mut out = Vec::new();
        for b in binds {
            out.push(FdBind {
                fd: MOUNT_FD_BASE + mount_fds.len() as i32,
                dest: Path::new(WORKSPACE).join(&b.rel),
                read_only: b.read_only,
            });
            mount_fds.push(b.fd);
        }
        out
    };
    let protected_binds = fd_binds(plan.binds, &mut mount_fds);
    // A read root that contains the project shows it at its host path as
    // well: the same masks go there (from copies of their fds).
    let mut root_masks = Vec::new();
    if mounts.read_roots.iter().any(|r| project.starts_with(r)) {
        for b in plan.masks.iter().filter(|b| masks.masked.iter().any(|m| m.rel == b.rel)) {
            let fd =
                b.fd.try_clone().map_err(|e| StartError::Prepare(format!("A secret mask could not be copied: {e}")))?;
            root_masks.push((fd, project.join(&b.rel)));
        }
    }
    let mask_binds = fd_binds(plan.masks, &mut mount_fds);
    let root_masks: Vec<FdBind> = root_masks
        .into_iter()
        .map(|(fd, dest)| {
            mount_fds.push(fd);
            FdBind { fd: MOUNT_FD_BASE + mount_fds.len() as i32 - 1, dest, read_only: true }
        })
        .collect();
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
        let opened = Tree::open(root).and_then(|t| t.dir(rel));
        match opened {
            Ok(fd) => {
                python_fd_mounts.push(FdBind {
                    fd: MOUNT_FD_BASE + mount_fds.len() as i32,
                    dest: dir.clone(),
                    read_only: true,
                });
                mount_fds.push(fd);
            }
            Err(e) => tracing::warn!("{} not mounted: {e}", dir.display()),
        }
    }
    let sizes = sizes?;
    // The sandbox's own cgroups (or RLIMIT_NPROC), made before it starts
    // so that its first process joins them before it forks.
    let contained = crate::contain::for_sandbox(&caps, &mut plan_notes)?;
    let policy = Policy {
        merged_usr: facts.merged_usr,
        project_dir: project.to_path_buf(),
        project_at: WORKSPACE.into(),
        workspace_writable: writable,
        scratch_dir: dirs.scratch.clone(),
        read_roots: start.mounts.read_roots.clone(),
        once: start.mounts.once.iter().map(|m| (m.source.clone(), m.path.clone())).collect(),
        host_masks,
        mask_sources,
        proc_masks: facts.proc_masks.clone(),
        protected: protected_binds,
        masks: mask_binds,
        root_masks,
        nofile: (crate::spawn::nofile_for(mount_fds.len()) > RLIMIT_NOFILE).then_some(RLIMIT_NOFILE),
        nproc: contained.nproc(),
        tmp_bytes: sizes.tmp,
        shm_bytes: sizes.shm,
        network: Network::None,
        seccomp: seccomp::Profile::Python,
    };
    let python = Python {
        interpreter: facts.interpreter.path.clone(),
        interpreter_mounts: facts.interpreter.mounts.clone(),
        worker: code.clone(),
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
    let launch = Launch {
        bwrap: facts.bwrap.path.clone(),
        argv: bwrap_argv(&policy, &PythonRuntime.payload(&python)),
        seccomp,
        mount_fds,
        mounts: mounts.clone(),
        host_masks: policy.host_masks.clone(),
        host_secrets: secrets,
        secret_watch,
        masks_watch,
        guard,
        plan_notes,
        masks,
        code: form,
        emit_code: matches!(code, WorkerCode::Source { emit: true, .. }),
        keeper,
        contained,
        limits: policy.held_rlimits(),
        inside: crate::inotify::cap_steps(facts.inotify_share),
        watcher,
        budget,
    };
    let (worker, ready) = Worker::start(launch, stop, spawned).await?;
    if let (Some(image), Some(key)) = (&ready.image, facts.code_key) {
        if let Err(e) = crate::runtime::python::bytecode::store(&runtime_root, key, image) {
            tracing::warn!("{e}");
        }
    }
    Ok((worker, ready))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permissions::OnceMount;

    #[test]
    fn set_aside_scratches_are_masked_where_a_grant_shows_them() {
        let q = Path::new("/var/rt/0123/quarantine");
        let mut mounts = MountConfig { read_roots: vec!["/srv".into(), "/var".into()], ..MountConfig::default() };
        mounts.once.push(OnceMount { path: "/link/rt".into(), source: "/var/rt".into(), is_dir: true });
        mounts.once.push(OnceMount { path: "/f".into(), source: "/var/rt/0123/logs/x".into(), is_dir: false });
        let masks = quarantine_masks(q, &mounts);
        let paths: Vec<&Path> = masks.iter().map(|m| m.path.as_path()).collect();
        assert_eq!(paths, [Path::new("/var/rt/0123/quarantine"), Path::new("/link/rt/0123/quarantine")]);
        assert!(masks.iter().all(|m| m.is_dir));
        assert!(
            quarantine_masks(q, &MountConfig { read_roots: vec!["/srv".into()], ..MountConfig::default() }).is_empty()
        );
    }
}
