//! Session directories on the host and the process-wide cleanup registry.
//!
//! Each session gets a private directory (mode 0700) under the runtime
//! root: `scratch/` (mounted at /scratch), `logs/` (the executions' full
//! output, never mounted) and, once a start compiles the worker from it,
//! the worker's source. The registry remembers
//! which sandbox process groups and directories this process has, so that
//! an exit hook can kill and delete them synchronously. What runs in a
//! sandbox is not this module's business.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::random::random_u64;
use crate::spawn::kill_group;

/// Paths of a session's private directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    pub root: PathBuf,
    pub scratch: PathBuf,
    pub logs: PathBuf,
    pub worker_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("refusing to use {path}: it must be a directory owned by uid {uid} with mode 0700")]
    NotPrivate { path: PathBuf, uid: u32 },
    #[error("cannot create {path}: {source}")]
    Create { path: PathBuf, source: std::io::Error },
    #[error("cannot prepare the session directory {path}: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error(
        "No sandbox was started: the runtime root {} is inside the project directory {}, where a sandbox could \
         reach every session's directory (its /scratch, its logs, the stored worker). Start pi in a project \
         directory, or set TMPDIR to a directory outside the project.",
        crate::display::one_line(.root),
        crate::display::one_line(.project)
    )]
    InProject { root: PathBuf, project: PathBuf },
}

/// The default parent of session directories: private to this user.
pub fn default_runtime_root() -> PathBuf {
    std::env::temp_dir().join(format!("pi-python-sandbox-{}", nix::unistd::getuid()))
}

/// Refuse a runtime root inside the project: the project is mounted in
/// every sandbox (writable in the edit modes), and the host uses the session
/// directories by path (it binds `scratch`, writes the logs, runs the stored
/// worker), so a sandbox that could reach them could point them anywhere.
/// Both are compared resolved (the runtime root's missing tail as given).
pub fn outside_project(runtime_root: &Path, project: &Path) -> Result<(), DirError> {
    let Ok(project) = std::fs::canonicalize(project) else {
        return Ok(()); // the start says the project is not accessible
    };
    let mut existing = runtime_root;
    let mut tail = Vec::new();
    let root = loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            break tail.iter().rev().fold(real, |p: PathBuf, c| p.join(c));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_owned());
                existing = parent;
            }
            _ => return Ok(()),
        }
    };
    if root.starts_with(&project) {
        return Err(DirError::InProject { root, project });
    }
    Ok(())
}

/// Create (or verify) a directory that only we can use.
pub fn private_dir(path: &Path) -> Result<(), DirError> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta =
                std::fs::symlink_metadata(path).map_err(|source| DirError::Create { path: path.into(), source })?;
            let uid = nix::unistd::getuid().as_raw();
            if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
                return Err(DirError::NotPrivate { path: path.into(), uid });
            }
            Ok(())
        }
        Err(source) => Err(DirError::Create { path: path.into(), source }),
    }
}

/// Make a new session directory under `runtime_root` (default
/// [`default_runtime_root`]).
pub fn make_dirs(runtime_root: Option<&Path>) -> Result<Dirs, DirError> {
    let parent = runtime_root.map(Path::to_path_buf).unwrap_or_else(default_runtime_root);
    private_dir(&parent)?;
    let root = parent.join(format!("{:016x}", random_u64()));
    DirBuilder::new().mode(0o700).create(&root).map_err(|source| DirError::Create { path: root.clone(), source })?;
    let dirs =
        Dirs { scratch: root.join("scratch"), logs: root.join("logs"), worker_file: root.join("worker.py"), root };
    let made = (|| -> std::io::Result<()> {
        DirBuilder::new().mode(0o700).create(&dirs.scratch)?;
        DirBuilder::new().mode(0o700).create(&dirs.logs)
    })();
    made.map_err(|source| {
        let _ = crate::beneath::remove_tree(&dirs.root);
        DirError::Prepare { path: dirs.root.clone(), source }
    })?;
    Ok(dirs)
}

/// The worker's source in the session's directory, for a start that
/// compiles it (the first of an interpreter, or one whose stored bytecode
/// failed): written once (read-only) and kept for the session's later
/// such starts. Only this process writes the directory (it is mounted in
/// no sandbox).
pub fn write_worker(dirs: &Dirs, worker_source: &str) -> std::io::Result<()> {
    match OpenOptions::new().write(true).create_new(true).mode(0o400).open(&dirs.worker_file) {
        Ok(mut f) => std::io::Write::write_all(&mut f, worker_source.as_bytes()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Work to do once a session's sandboxes are killed (a check of what they
/// left in the project).
pub type AfterKill = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A live session: its id, the sandbox process groups it runs, its
/// directory, what to do after the kill.
type LiveEntry = (u64, Vec<i32>, Option<PathBuf>, Vec<AfterKill>);

/// Sessions alive in this process, for best-effort cleanup at exit.
static LIVE: parking_lot::Mutex<Vec<LiveEntry>> = parking_lot::Mutex::new(Vec::new());

/// Record what session `id` has now (replacing what it had).
pub fn live_update(id: u64, pids: Vec<i32>, dir: Option<PathBuf>, after: Vec<AfterKill>) {
    let mut live = LIVE.lock();
    live.retain(|(i, _, _, _)| *i != id);
    if !pids.is_empty() || dir.is_some() {
        live.push((id, pids, dir, after));
    }
}

/// The directory of live session `id`, if it has one.
pub fn live_dir(id: u64) -> Option<PathBuf> {
    LIVE.lock().iter().find(|(i, _, _, _)| *i == id).and_then(|(_, _, dir, _)| dir.clone())
}

/// Kill every sandbox and delete every session directory of this process
/// (the cgroups are `contain`'s; `session::cleanup_all` does both).
/// Synchronous: for exit hooks.
pub fn cleanup_all() {
    let live = std::mem::take(&mut *LIVE.lock());
    for (_, pids, _, _) in &live {
        for pid in pids {
            kill_group(*pid);
        }
    }
    for (_, _, dir, after) in live {
        for f in after {
            f();
        }
        if let Some(dir) = dir {
            let _ = crate::beneath::remove_tree(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn session_directories_are_private_and_a_shared_parent_is_refused() {
        let base = std::env::temp_dir().join(format!("pps-rundir-{:016x}", random_u64()));
        let dirs = make_dirs(Some(&base)).expect("dirs");
        for d in [&base, &dirs.root, &dirs.scratch, &dirs.logs] {
            assert_eq!(std::fs::metadata(d).expect("meta").permissions().mode() & 0o777, 0o700, "{}", d.display());
        }
        // The worker's source only once a start compiles it; written once.
        assert!(!dirs.worker_file.exists());
        write_worker(&dirs, "print('w')").expect("worker");
        write_worker(&dirs, "print('again')").expect("worker kept");
        assert_eq!(std::fs::read_to_string(&dirs.worker_file).expect("worker"), "print('w')");
        let mode = std::fs::metadata(&dirs.worker_file).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        assert!(!dirs.logs.starts_with(&dirs.scratch));
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(matches!(make_dirs(Some(&base)), Err(DirError::NotPrivate { .. })));
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    #[test]
    fn a_runtime_root_inside_the_project_is_refused_resolved() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (project, elsewhere) = (tmp.path().join("project"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(project.join("sub")).expect("project");
        std::fs::create_dir(&elsewhere).expect("elsewhere");
        std::os::unix::fs::symlink(&project, tmp.path().join("link")).expect("link");
        let inside = |root: &Path| matches!(outside_project(root, &project), Err(DirError::InProject { .. }));
        assert!(inside(&project), "the project itself");
        assert!(inside(&project.join("pi-python-sandbox-0")), "a missing root in it (pi started in /tmp)");
        assert!(inside(&project.join("sub/deeper/root")), "deeper, missing");
        assert!(inside(&tmp.path().join("link/root")), "through a link to the project");
        assert!(outside_project(&elsewhere.join("root"), &project).is_ok());
        assert!(outside_project(tmp.path(), &project).is_ok(), "a root above the project");
        assert!(outside_project(&tmp.path().join("project-2/root"), &project).is_ok(), "a name that shares a prefix");
        let why = outside_project(&project.join("r"), &project).unwrap_err().to_string();
        assert!(why.contains("inside the project directory") && why.contains("TMPDIR"), "{why}");
    }

    #[test]
    fn cleanup_deletes_what_the_registry_holds() {
        let base = std::env::temp_dir().join(format!("pps-live-{:016x}", random_u64()));
        let dirs = make_dirs(Some(&base)).expect("dirs");
        let id = u64::MAX - random_u64() % 1000;
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let after: AfterKill = std::sync::Arc::new(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
        live_update(id, vec![], Some(dirs.root.clone()), vec![after]);
        cleanup_all();
        assert!(!dirs.root.exists());
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst), "the after-kill work did not run");
        std::fs::remove_dir_all(&base).expect("cleanup");
    }
}
