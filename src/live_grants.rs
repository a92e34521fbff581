//! Grants applied to the running sandbox instead of a restart: a read
//! root, a path allowed once and a secret unmasked once are attached to
//! (or, for a mask, detached from) the sandbox through the namespace
//! helper's mount job, and the call that needed them runs again on the
//! same interpreter returned to its state before the call (its rollback
//! copy). Where that cannot be done (live grants off, rollback off, a
//! change that is more than an added grant, a step that fails), the
//! sandbox restarts as before and the result says why state was lost.
//!
//! This module decides which change can be made live ([`plan`]) and makes
//! it ([`apply`]); the session calls both with the sandbox it runs.

use std::path::{Path, PathBuf};

use crate::hostsecrets::{HostSecrets, Mask as HostMask};
use crate::nshelper::mount::{self, Attach, Mask, MountError};
use crate::permissions::MountConfig;
use crate::secrets::{MaskReport, MaskSources};

/// `0` turns the live path off: every grant restarts the sandbox.
pub const LIVE_ENV: &str = "PI_SANDBOX_LIVE_GRANTS";

/// Whether the setting lets grants reach a running sandbox.
pub fn enabled() -> bool {
    std::env::var(LIVE_ENV).map_or(true, |v| v.trim() != "0")
}

/// Why grants restart the sandbox in this session, or `None` when they
/// are applied to the running sandbox.
pub fn restart_reason(rollback: bool) -> Option<String> {
    reason_for(enabled(), rollback)
}

fn reason_for(enabled: bool, rollback: bool) -> Option<String> {
    if !enabled {
        Some(format!("live grants are off ({LIVE_ENV}=0)"))
    } else if !rollback {
        Some("rollback is off (PI_PYTHON_TOOL_ROLLBACK=0), so no copy of the state before the call is kept".into())
    } else {
        None
    }
}

/// What `status` says of how grants are applied here.
pub fn status_line(rollback: bool) -> String {
    match restart_reason(rollback) {
        None => "grants: applied to the running sandbox; the call runs again with its state kept".into(),
        Some(why) => format!("grants: restart the sandbox (interpreter state is lost): {why}"),
    }
}

/// Why a call run again after a grant did not keep its state: the
/// sandbox restarted (the words say why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Restarted(pub String);

/// A tree to attach: `source` on the host, at `at` in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub source: PathBuf,
    pub at: PathBuf,
    pub is_dir: bool,
}

/// The live steps from one set of mounts to another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub attach: Vec<Tree>,
    /// Secrets of the project (canonical host paths) whose masks go.
    pub unmask: Vec<PathBuf>,
    /// Read roots revoked: detached (at their sandbox path, which is
    /// their host path), before anything is attached.
    pub detach: Vec<PathBuf>,
}

/// Why a change is not made live.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("the change is more than an added or revoked grant: {0}")]
    NotAnAddition(&'static str),
    #[error("{} overlaps a tree the sandbox already shows", crate::display::one_line(.0))]
    Overlap(PathBuf),
    #[error("{} is not a masked secret of the project by itself", crate::display::one_line(.0))]
    NotAMask(PathBuf),
    #[error("the sandbox's process is not known")]
    NoProcess,
    #[error("no sandbox is running")]
    NoSandbox,
    #[error("the session has no directory")]
    NoDirectory,
    #[error("the project's directory cannot be resolved: {0}")]
    Project(std::io::Error),
    #[error("the empty files that hide secrets could not be made: {0}")]
    MaskSources(std::io::Error),
    #[error("{0}")]
    Mount(#[from] MountError),
    #[error("the project's mount could not be replaced for the new mode: {0}")]
    Mode(String),
}

/// The steps that turn `had` into `want` on a running sandbox: only added
/// or removed read roots, added paths allowed once and secrets unmasked
/// once; a tree that overlaps one still shown is left to a restart (a
/// fresh start stacks them in its own order).
pub fn plan(had: &MountConfig, want: &MountConfig) -> Result<Plan, LiveError> {
    // A mode change is made apart (the project's mount replaced whole,
    // see `worker::mode`), before the plan's steps.
    if had.unmasked != want.unmasked {
        return Err(LiveError::NotAnAddition("a read root inside the project changes which of its secrets are masked"));
    }
    let kept = had.once.iter().all(|o| want.once.contains(o))
        && had.unmasked_once.iter().all(|u| want.unmasked_once.contains(u));
    if !kept {
        return Err(LiveError::NotAnAddition("a path allowed once was removed"));
    }
    let detach = had.read_roots.iter().filter(|r| !want.read_roots.contains(r)).cloned().collect();
    let mut plan = Plan { detach, ..Plan::default() };
    let kept_roots = had.read_roots.iter().filter(|r| want.read_roots.contains(r));
    let mut shown: Vec<PathBuf> = kept_roots.cloned().chain(had.once.iter().map(|o| o.path.clone())).collect();
    // A revoked root with an allow-once path under it or over it: the
    // path would go with the root, or the root would be under the path.
    for root in &plan.detach {
        if let Some(s) = shown.iter().find(|s| s.starts_with(root) || root.starts_with(s)) {
            return Err(LiveError::Overlap(s.clone()));
        }
    }
    let added_roots = want.read_roots.iter().filter(|r| !had.read_roots.contains(r));
    let roots = added_roots.map(|r| Tree { source: r.clone(), at: r.clone(), is_dir: true });
    let once = want.once.iter().filter(|o| !had.once.contains(o));
    let once = once.map(|o| Tree { source: o.source.clone(), at: o.path.clone(), is_dir: o.is_dir });
    for tree in roots.chain(once) {
        if shown.iter().any(|s| s.starts_with(&tree.at) || tree.at.starts_with(s)) {
            return Err(LiveError::Overlap(tree.at));
        }
        shown.push(tree.at.clone());
        plan.attach.push(tree);
    }
    plan.unmask = want.unmasked_once.iter().filter(|u| !had.unmasked_once.contains(u)).cloned().collect();
    Ok(plan)
}

/// What a live change needs of the session besides the sandbox.
pub struct LiveEnv<'a> {
    /// The session's directory (the empty mask sources are there).
    pub dirs_root: &'a Path,
    /// The project's canonical path.
    pub project: &'a Path,
    /// Trees no host-secret mask is needed in (the project, the runtime root).
    pub trees: &'a [&'a Path],
    /// The session's set-aside scratches, when there are any.
    pub quarantine: Option<&'a Path>,
    /// For a mode change (see `worker::mode`): the session's runtime
    /// root, where the guard's notes go, the protected names that could
    /// not be made inert, the secrets earlier starts found, and how the
    /// guard gets its inotify instance.
    pub runtime_root: &'a Path,
    pub notes: &'a crate::protected::Notes,
    pub tainted: &'a crate::protected::Tainted,
    pub known: &'a crate::protected::KnownSecrets,
    pub guard_inotify: crate::protected::InotifyInit,
}

/// What applying a plan needs of the session and its sandbox.
pub struct Env<'a> {
    /// A process inside the sandbox (its PID 1).
    pub pid: i32,
    pub secrets: &'a HostSecrets,
    /// Trees no host-secret mask is needed in (the project, the session's
    /// runtime root), as a start passes them.
    pub trees: &'a [&'a Path],
    /// The session's directory (where the empty mask sources are).
    pub dirs_root: &'a Path,
    /// The project's canonical path and the sandbox's secret masks in it.
    pub project: &'a Path,
    pub masks: &'a MaskReport,
    /// The session's set-aside scratches (a canonical host path), when
    /// there are any: hidden in a tree that holds them, as at a start.
    pub quarantine: Option<&'a Path>,
}

/// Apply `plan` to the running sandbox: each tree with its host secrets
/// and kernel submounts masked before it is reachable, then each mask of
/// an unmasked secret detached. Returns the host-secret masks now in
/// place (at their sandbox paths), for the sandbox's own list. A step
/// that fails leaves the trees attached so far: the caller restarts the
/// sandbox.
pub fn apply(plan: &Plan, env: &Env<'_>) -> Result<Vec<HostMask>, LiveError> {
    if env.pid <= 0 {
        return Err(LiveError::NoProcess);
    }
    // Every unmask is checked before anything changes.
    let mut detach = Vec::new();
    for host in &plan.unmask {
        let rel = host.strip_prefix(env.project).map_err(|_| LiveError::NotAMask(host.clone()))?;
        if !env.masks.masked.iter().any(|m| !m.host && m.rel == rel) {
            return Err(LiveError::NotAMask(host.clone()));
        }
        detach.push(Path::new(crate::bwrap::WORKSPACE).join(rel));
    }
    for root in &plan.detach {
        match mount::detach(env.pid, root) {
            // Nothing mounted there any more: revoked already (see `revoke`).
            Err(MountError::Step { stage: mount::Stage::Detach, source, .. })
                if source.raw_os_error() == Some(libc::EINVAL) => {}
            done => done?,
        }
        tracing::debug!(at = %root.display(), "read root detached live");
    }
    let sources = MaskSources::in_dir(env.dirs_root).map_err(LiveError::MaskSources)?;
    let mut added = Vec::new();
    for tree in &plan.attach {
        let mut masks: Vec<Mask> = Vec::new();
        if tree.is_dir {
            let secrets = env.secrets.masks_under(&tree.source, env.trees);
            let kernel = crate::submounts::masks(&[(tree.source.as_path(), tree.source.as_path())]);
            // The set-aside scratches may hold a secret (see `scratch::set_aside`).
            let quarantine = env
                .quarantine
                .filter(|q| q.starts_with(&tree.source))
                .map(|q| HostMask { path: q.to_path_buf(), is_dir: true });
            // A tree that contains the project shows it at its host path:
            // the project's masks go there too, as a start binds them.
            let project = env.masks.masked.iter().filter(|_| env.project.starts_with(&tree.source));
            let project = project.map(|m| HostMask { path: env.project.join(&m.rel), is_dir: m.dir });
            let project: Vec<HostMask> = project.collect();
            for m in secrets.iter().chain(&kernel).chain(&quarantine).chain(&project) {
                let mask = Mask { path: m.path.clone(), is_dir: m.is_dir };
                if m.path.starts_with(&tree.source) && m.path != tree.source && !masks.contains(&mask) {
                    masks.push(mask);
                }
            }
            for mut m in secrets {
                if let Ok(rel) = m.path.strip_prefix(&tree.source) {
                    m.path = tree.at.join(rel);
                }
                added.push(m);
            }
        }
        let attach = Attach {
            source: &tree.source,
            at: &tree.at,
            is_dir: tree.is_dir,
            masks: &masks,
            mask_file: &sources.file,
            mask_dir: &sources.dir,
        };
        let done = mount::attach(env.pid, &attach)?;
        tracing::debug!(at = %tree.at.display(), ms = done.took.as_secs_f64() * 1e3, "grant attached live");
    }
    for at in &detach {
        mount::detach(env.pid, at)?;
        tracing::debug!(at = %at.display(), "mask detached live");
    }
    Ok(added)
}

/// Detach the read roots `plan` revokes from the sandbox whose process
/// `pid` is in it, at once (a revoked root must not stay readable until
/// the next execution). A file already open under one stays readable by
/// the process that holds it; new opens fail.
pub fn revoke(pid: i32, plan: &Plan) -> Result<(), LiveError> {
    if plan.detach.is_empty() {
        return Ok(());
    }
    if pid <= 0 {
        return Err(LiveError::NoProcess);
    }
    for root in &plan.detach {
        mount::detach(pid, root)?;
        tracing::debug!(at = %root.display(), "read root revoked live");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permissions::OnceMount;

    fn roots(r: &[&str]) -> MountConfig {
        MountConfig { read_roots: r.iter().map(PathBuf::from).collect(), ..MountConfig::default() }
    }

    #[test]
    fn an_added_root_or_once_path_is_attached() {
        let p = plan(&roots(&["/srv/a"]), &roots(&["/srv/a", "/data"])).unwrap();
        assert_eq!(p.attach, [Tree { source: "/data".into(), at: "/data".into(), is_dir: true }]);
        let once = OnceMount { path: "/link/x.csv".into(), source: "/data2/x.csv".into(), is_dir: false };
        let want = MountConfig { once: vec![once], unmasked_once: vec!["/p/.env".into()], ..roots(&["/srv/a"]) };
        let p = plan(&roots(&["/srv/a"]), &want).unwrap();
        assert_eq!(p.attach, [Tree { source: "/data2/x.csv".into(), at: "/link/x.csv".into(), is_dir: false }]);
        assert_eq!(p.unmask, [PathBuf::from("/p/.env")]);
    }

    #[test]
    fn a_removed_root_is_detached_before_an_added_one_is_attached() {
        let p = plan(&roots(&["/a", "/b"]), &roots(&["/b", "/a/c"])).unwrap();
        assert_eq!(p.detach, [PathBuf::from("/a")]);
        assert_eq!(p.attach, [Tree { source: "/a/c".into(), at: "/a/c".into(), is_dir: true }]);
        // An allow-once path under a revoked root would go with it: a restart.
        let once = OnceMount { path: "/a/x.csv".into(), source: "/a/x.csv".into(), is_dir: false };
        let had = MountConfig { once: vec![once.clone()], ..roots(&["/a"]) };
        let want = MountConfig { once: vec![once], ..roots(&[]) };
        assert!(matches!(plan(&had, &want), Err(LiveError::Overlap(_))));
    }

    #[test]
    fn anything_but_an_added_or_revoked_grant_restarts() {
        // A mode change alone has no steps here (see `worker::mode`).
        let writable = MountConfig { workspace_writable: true, ..roots(&[]) };
        let why = |had: &MountConfig, want: &MountConfig| match plan(had, want) {
            Err(e @ LiveError::NotAnAddition(_)) => e.to_string(),
            other => panic!("{other:?}"),
        };
        // A mode change alone has no steps here (see `worker::mode`).
        assert_eq!(plan(&roots(&[]), &writable).unwrap(), Plan::default());
        let unmasked = MountConfig { unmasked: vec!["/p/.env".into()], ..roots(&[]) };
        assert!(why(&roots(&[]), &unmasked).contains("a read root inside the project"));
        let once = OnceMount { path: "/b/x.csv".into(), source: "/b/x.csv".into(), is_dir: false };
        let had = MountConfig { once: vec![once], ..roots(&[]) };
        assert!(why(&had, &roots(&[])).ends_with("a path allowed once was removed"));
        // Over or under a tree already shown.
        assert!(matches!(plan(&roots(&["/a/b"]), &roots(&["/a/b", "/a"])), Err(LiveError::Overlap(_))));
        assert!(matches!(plan(&roots(&["/a"]), &roots(&["/a", "/a/b"])), Err(LiveError::Overlap(_))));
    }

    #[test]
    fn the_setting_and_rollback_choose_the_way() {
        assert_eq!(reason_for(true, true), None);
        assert!(reason_for(true, false).unwrap().contains("PI_PYTHON_TOOL_ROLLBACK=0"));
        assert!(reason_for(false, true).unwrap().contains("PI_SANDBOX_LIVE_GRANTS=0"));
    }
}
