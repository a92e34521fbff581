//! A permission-mode change applied to the running sandbox: the project's
//! mount is replaced whole (`nshelper::swap`) by the tree a fresh start in
//! the target mode would mount (the project writable with its protected
//! entries bound read-only over it, or read-only; the secret masks in
//! both), planned the way a start plans it (`protected::plan_start`). The
//! guard that keeps protected names inert starts with a writable project
//! and ends with a read-only one; its last look at the project is the
//! caller's, made once the change is in place. The plan (with its walk of
//! the project) and the swap are two steps, so that the session makes the
//! plan of a change to read-only before it takes its lock.
//!
//! What held the old tree (the interpreter's working directory, a
//! background process's directory or open file) keeps it: read-only in
//! either direction (a read-only project's tree is read-only; a writable
//! one is made read-only before it is detached, which the kernel refuses
//! while a file is open for writing on it: then nothing changed and the
//! session restarts the sandbox). The interpreter learns of each move
//! with its next request and goes to /workspace, the new tree.
//!
//! A change to a writable mode whose project cannot be protected changes
//! no mount: a fresh start would hold the project read-only, as the
//! running sandbox has it, so the sandbox and its interpreter are kept.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Worker;
use crate::bwrap::WORKSPACE;
use crate::live_grants::{LiveEnv, LiveError};
use crate::nshelper::swap::{self, From, Over, Replace};
use crate::protected::{self, Bind, StartRequest};
use crate::secrets::{MaskReport, MaskSources};

fn ident(fd: &impl AsRawFd) -> std::io::Result<(u64, u64, bool)> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes within `st`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT == libc::S_IFDIR))
}

fn path_ident(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// The binds of a plan as the swap makes them: a mask is bound from the
/// session's empty file or directory, anything else from the project's
/// own entry, checked against the (device, inode) planned with.
fn overs(binds: &[Bind], sources: &MaskSources) -> std::io::Result<Vec<Over>> {
    let (file, dir) = (path_ident(&sources.file)?, path_ident(&sources.dir)?);
    let mut over = Vec::with_capacity(binds.len());
    for b in binds {
        let (dev, ino, is_dir) = ident(&b.fd)?;
        let from = if (dev, ino) == file || (dev, ino) == dir {
            From::Mask { is_dir }
        } else {
            From::Project { ident: (dev, ino) }
        };
        over.push(Over { rel: b.rel.clone(), from, read_only: b.read_only });
    }
    Ok(over)
}

fn same_masks(a: &MaskReport, b: &MaskReport) -> bool {
    let key = |r: &MaskReport| {
        let mut v: Vec<(PathBuf, bool)> = r.masked.iter().map(|m| (m.rel.clone(), m.dir)).collect();
        v.sort();
        v
    };
    key(a) == key(b)
}

fn refused(why: impl std::fmt::Display) -> LiveError {
    LiveError::Mode(why.to_string())
}

/// A mode change's plan, made with its walk of the project before the
/// swap (see `Worker::plan_swap`): the binds the new tree gets, the guard
/// it starts (writable), and the entries planned with, held open so that
/// their (device, inode) cannot name another file when the swap checks it.
pub struct SwapPlan {
    writable: bool,
    guard: Option<(Arc<protected::Guard>, protected::Watcher)>,
    over: Vec<Over>,
    _binds: Vec<Bind>,
    sources: MaskSources,
    /// To a writable mode whose project cannot be protected: why. No mount
    /// changes; the sandbox keeps the project read-only, as a fresh start
    /// would hold it.
    held: Option<String>,
}

impl Worker {
    /// Plan a change of the project's mount to `writable` or read-only, as a
    /// fresh start in that mode plans it (the project's walk). Reads the
    /// sandbox and changes nothing: the session makes it before it takes
    /// its lock (see `Session::set_mounts_because`). `Err`: the change
    /// cannot be made live; the caller restarts the sandbox.
    pub fn plan_swap(&self, writable: bool, env: &LiveEnv<'_>) -> Result<SwapPlan, LiveError> {
        self.init_pid.filter(|p| *p > 0).ok_or(LiveError::NoProcess)?;
        // A kernel interface mounted inside the project is masked at the
        // start, under /workspace: the swapped tree would not have it.
        if self.host_masks.iter().any(|m| m.path.starts_with(WORKSPACE)) {
            return Err(refused("the project holds a mount of its own"));
        }
        let mut settings = crate::options::Settings::from_env();
        // As a start: git never trusts a file under the runtime root.
        settings.git.untrusted.push(env.runtime_root.to_path_buf());
        let sources = MaskSources::in_dir(env.dirs_root).map_err(LiveError::MaskSources)?;
        let unmasked: Vec<PathBuf> = self.mounts.unmasked.iter().chain(&self.mounts.unmasked_once).cloned().collect();
        let known = env.known.lock().clone();
        let plan = protected::plan_start(StartRequest {
            project: env.project,
            protected: &settings.protected,
            secrets: &settings.secrets,
            limits: settings.scan,
            git: &settings.git,
            sink: env.notes.clone(),
            tainted: env.tainted.clone(),
            writable,
            unmasked: &unmasked,
            sources: Some(&sources),
            known: &known.masks,
            known_idents: &known.idents,
            host: &self.host_secrets,
            // None: a project with a mount masked at the start was refused
            // above (a walk that meets one made since goes into it).
            masked_mounts: &Default::default(),
        })
        .map_err(|e| refused(format!("the project's protection could not be planned: {e}")))?;
        if let Some(e) = &plan.refused {
            // To a writable mode: a fresh start would mount the project
            // read-only (held), as it is mounted now; the sandbox keeps it
            // and says so, as that start does. Its guard stays off.
            if writable && !self.mounts.workspace_writable && self.guard.is_none() {
                let held = Some(e.to_string());
                return Ok(SwapPlan { writable, guard: None, over: Vec::new(), _binds: Vec::new(), sources, held });
            }
            return Err(refused(format!("the project cannot be protected: {e}")));
        }
        if !same_masks(&plan.report, &self.masks) {
            return Err(refused("the project's secrets changed since the sandbox started"));
        }
        let guard = match (writable, plan.guard) {
            (false, _) => None,
            (true, None) => return Err(refused("no protection was planned")),
            (true, Some(guard)) => {
                let mut watcher = protected::Watcher::new(env.guard_inotify)
                    .map_err(|e| refused(format!("the guard could not get inotify ({e})")))?;
                watcher.watch_holders(&guard).map_err(|e| refused(format!("the guard could not get inotify ({e})")))?;
                Some((Arc::new(guard), watcher))
            }
        };
        let binds: Vec<Bind> = plan.binds.into_iter().chain(plan.masks).collect();
        let over = overs(&binds, &sources).map_err(|e| refused(format!("a bind could not be looked at ({e})")))?;
        Ok(SwapPlan { writable, guard, over, _binds: binds, sources, held: None })
    }

    /// Replace the project's mount as `plan` says (see the module's
    /// comment). `Ok`: the guard the change ended (going read-only), whose
    /// last look at the project (`Guard::check_all`) the caller makes.
    /// `Err`: nothing changed that the caller must undo; it restarts the
    /// sandbox.
    pub fn swap_planned(
        &mut self,
        plan: SwapPlan,
        env: &LiveEnv<'_>,
    ) -> Result<Option<Arc<protected::Guard>>, LiveError> {
        let pid = self.init_pid.filter(|p| *p > 0).ok_or(LiveError::NoProcess)?;
        let SwapPlan { writable, guard, over, _binds: binds, sources, held } = plan;
        if let Some(e) = held {
            env.notes.lock().push(format!("{}: {e}.", crate::permissions::HELD_NOTE));
            self.mounts.workspace_writable = true;
            tracing::debug!("project kept read-only live: it cannot be protected");
            return Ok(None);
        }
        let project = std::fs::File::open(env.project).map_err(LiveError::Project)?;
        let (dev, ino, _) = ident(&project).map_err(LiveError::Project)?;
        let replace = Replace {
            project: env.project,
            ident: (dev, ino),
            at: Path::new(WORKSPACE),
            writable,
            over: &over,
            mask_file: &sources.file,
            mask_dir: &sources.dir,
        };
        let began = std::time::Instant::now();
        swap::replace(pid, &replace)?;
        tracing::debug!(writable, ms = began.elapsed().as_secs_f64() * 1e3, "project mount swapped live");
        drop(binds);
        let ended = match guard {
            Some((guard, watcher)) => {
                guard.arm(self.pid, self.killed_for.clone());
                if let Some(budget) = &self.budget {
                    guard.set_budget(budget.clone());
                }
                self._watches.guard(guard.clone(), watcher, self.masks_watch.as_ref());
                self.guard = Some(guard);
                None
            }
            None => {
                self._watches.end_guard();
                // What the writable project was given since the last look
                // is the caller's to check, now that nothing writes it.
                self.guard.take()
            }
        };
        self.mounts.workspace_writable = writable;
        self.moved += 1;
        Ok(ended)
    }
}
