//! The grant loop's [`Target`] for a [`Session`]: one call of the python
//! runtime, and the session's masks and mounts.

use std::future::Future;
use std::path::{Path, PathBuf};

use super::orchestrator::{AfterGrant, Mask, Target};
use crate::options::Settings;
use crate::outcome::{Outcome, ProgressFn};
use crate::permissions::{self, Context, OnceMount};
use crate::session::Session;

/// What deciding about grants needs, read once per decision.
pub struct GrantInputs {
    settings: Settings,
    secrets: crate::hostsecrets::HostSecrets,
    project: Option<PathBuf>,
    writable: Vec<PathBuf>,
    /// The project's secrets as the last start found them.
    project_secrets: Option<Vec<PathBuf>>,
}

impl GrantInputs {
    pub fn of(session: &Session) -> Self {
        let root = session.runtime_root();
        let settings = Settings::from_env();
        let project = std::fs::canonicalize(session.project_dir()).ok();
        let writable = vec![std::fs::canonicalize(&root).unwrap_or(root)];
        let trees: Vec<&Path> = project.iter().chain(&writable).map(PathBuf::as_path).collect();
        GrantInputs {
            secrets: settings.host_secrets(&trees),
            settings,
            project_secrets: project.as_deref().and_then(|p| current_secrets(session, p)),
            project,
            writable,
        }
    }

    pub fn ctx(&self) -> Context<'_> {
        Context {
            project: self.project.as_deref(),
            home: self.settings.home.as_deref(),
            secrets: &self.secrets,
            writable: &self.writable,
            project_secrets: self.project_secrets.as_deref(),
        }
    }
}

/// The project's secrets as the last start found them (host paths), or
/// `None` before any start.
fn current_secrets(session: &Session, project: &Path) -> Option<Vec<PathBuf>> {
    session.status().masks.map(|m| m.host_paths(project))
}

/// One `execute` call on a session.
pub struct SessionCall<'a> {
    pub session: &'a Session,
    pub code: String,
    pub timeout_seconds: u32,
    pub call_id: Option<u32>,
    pub progress: Option<ProgressFn>,
}

impl SessionCall<'_> {
    /// Set the session's mounts to `edit` of the current ones.
    fn remount(&self, edit: impl FnOnce(&mut permissions::MountConfig), reason: &str) -> bool {
        let mut mounts = self.session.status().mounts;
        edit(&mut mounts);
        self.session.set_mounts_because(mounts, Some(reason.to_string())).is_some()
    }
}

impl Target for SessionCall<'_> {
    fn run(&self) -> impl Future<Output = Outcome> + Send {
        self.session.execute_with_progress(self.code.clone(), self.timeout_seconds, self.call_id, self.progress.clone())
    }

    fn after_grant(&self) -> AfterGrant {
        crate::runtime::python::AFTER_GRANT
    }

    /// By the session's own list of masks, never the sandbox's word.
    /// Exactly the path read: a file inside a masked directory is unmasked
    /// alone, never the directory. A host secret never is, in the project
    /// or masked in a granted tree (one outside every grant is refused as
    /// never granted).
    fn mask_of(&self, path: &str) -> Mask {
        let report = self.session.status();
        let Some(path) = permissions::normalize(path) else { return Mask::None };
        // The project's secrets are masked under each of its names.
        let at = self.session.workspace_path(&path);
        let Some(mask) = report.masks.as_ref().and_then(|m| m.covering(at.as_deref().unwrap_or(&path))) else {
            let m = &report.mounts;
            let granted = m.read_roots.iter().any(|r| path.starts_with(r))
                || m.once.iter().any(|o| o.is_dir && path.starts_with(&o.path));
            return match GrantInputs::of(self.session).secrets.covering(&path) {
                Some(e) if granted && !self.session.in_project(&path) => Mask::HostSecret(e.shown()),
                _ => Mask::None,
            };
        };
        let at_mount = Path::new(crate::bwrap::WORKSPACE).join(&mask.rel).display().to_string();
        if mask.host {
            return Mask::HostSecret(at_mount);
        }
        if !path.starts_with(crate::bwrap::WORKSPACE) {
            return Mask::SecretElsewhere(at.as_deref().unwrap_or(&path).display().to_string());
        }
        let Some(rel) = at.as_deref().and_then(|p| p.strip_prefix(crate::bwrap::WORKSPACE).ok()) else {
            return Mask::None;
        };
        match std::fs::canonicalize(self.session.project_dir()) {
            Ok(p) => Mask::Secret(p.join(rel)),
            Err(_) => Mask::None,
        }
    }

    fn in_project(&self, path: &str) -> bool {
        permissions::normalize(path).is_some_and(|p| self.session.in_project(&p))
    }

    fn permissions_seen(&self) -> bool {
        self.session.status().permissions_seen
    }

    fn mount_epoch(&self) -> u64 {
        self.session.status().mount_epoch
    }

    fn with_context<R>(&self, f: impl FnOnce(&Context<'_>) -> R) -> R {
        f(&GrantInputs::of(self.session).ctx())
    }

    /// The running sandbox is replaced; the path goes when the next one ends.
    fn mount_once(&self, once: OnceMount, kept: &[OnceMount]) -> bool {
        if self.session.status().mounts.once.contains(&once) {
            return false;
        }
        self.session.keep_once(kept.to_vec(), Vec::new());
        self.remount(
            |m| {
                for k in kept.iter().chain([&once]) {
                    if !m.once.contains(k) {
                        m.once.push(k.clone())
                    }
                }
            },
            "the sandbox was restarted to mount a path allowed once",
        )
    }

    fn rerun_after_grant(&self) {
        self.session.rerun_after_grant();
    }

    fn take_rerun(&self) -> Option<Result<(), crate::live_grants::Restarted>> {
        self.session.take_rerun()
    }

    fn unmask_once(&self, host: PathBuf, kept: &[PathBuf]) -> bool {
        if self.session.status().mounts.unmasked_once.contains(&host) {
            return false;
        }
        self.session.keep_once(Vec::new(), kept.to_vec());
        self.remount(
            |m| {
                for k in kept.iter().chain([&host]) {
                    if !m.unmasked_once.contains(k) {
                        m.unmasked_once.push(k.clone())
                    }
                }
            },
            "the sandbox was restarted to unmask a secret allowed once",
        )
    }
}
