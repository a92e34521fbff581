//! The confinement of one sandbox start, whatever runs in it: the host
//! secrets and masks of its grants, the one walk of the project (secret
//! masks in every mode, protected paths when it is writable), the mount
//! sources as fds (this is the one owner of their numbers), the
//! containment and the [`Policy`]. A runtime adds its payload (and maybe
//! fd mounts of its own, through [`Confined::fd`]) and starts it.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bwrap::{FdBind, Network, Policy, MOUNT_FD_BASE};
use crate::limits::RLIMIT_NOFILE;
use crate::options::{SessionOptions, Settings};
use crate::permissions::MountConfig;
use crate::probe::{self, Bwrap};
use crate::protected;
use crate::rundir::Dirs;
use crate::secrets::MaskReport;

/// The host facts every sandbox needs, probed once per session.
pub struct HostFacts {
    pub bwrap: Bwrap,
    pub merged_usr: bool,
    /// The kernel information files this host has (see `bwrap::PROC_MASKS`).
    pub proc_masks: Vec<crate::hostsecrets::Mask>,
    /// One sandbox's share of the user's inotify budget (read once).
    pub inotify_share: crate::inotify::InotifyBudget,
    pub guard_inotify: protected::InotifyInit,
}

impl HostFacts {
    /// Find bubblewrap and read the host's kernel facts.
    pub async fn probe(opts: &SessionOptions) -> Result<HostFacts, probe::BwrapError> {
        Ok(HostFacts {
            bwrap: probe::probe_bwrap().await?,
            merged_usr: probe::merged_usr(),
            proc_masks: probe::proc_masks_of_host(),
            inotify_share: crate::inotify::sandbox_share(crate::inotify::host_budget()),
            guard_inotify: opts.guard_inotify.unwrap_or(protected::inotify_init),
        })
    }
}

/// What one start's confinement is made from.
pub struct Request<'a> {
    pub host: &'a HostFacts,
    pub dirs: &'a Dirs,
    /// The canonical project directory.
    pub project: &'a Path,
    /// Where the sandbox sees it.
    pub project_at: &'a Path,
    /// Its other host names (the working directory as the caller named
    /// it); with the canonical path, links to `project_at` when that is
    /// elsewhere (see `bwrap::project_links`).
    pub project_names: &'a [PathBuf],
    pub mounts: &'a MountConfig,
    /// Where the protection plan's findings between executions go.
    pub notes: protected::Notes,
    pub tainted: protected::Tainted,
    /// The secrets earlier starts of the session found.
    pub known: protected::KnownSecrets,
    /// Host trees the payload reads besides the grants (a virtual
    /// environment, a trusted extra read list): shown like a read root,
    /// so the host secrets in them are masked and kernel mounts hidden.
    pub payload_reads: &'a [PathBuf],
    /// Host trees the runtime itself runs from (an interpreter's prefix),
    /// read-only at their own paths: a project inside one gets its masks
    /// there too.
    pub runtime_mounts: &'a [PathBuf],
    /// The settings of this start, read once.
    pub settings: Settings,
    /// The host secrets in force (see [`host_secrets`]), built once per start.
    pub secrets: crate::hostsecrets::HostSecrets,
    pub seccomp: crate::seccomp::Profile,
    /// Where a read-only project's walk is kept for the next start (the
    /// bash tool's commands); none: walk every time.
    pub cache: Option<&'a PlanCache>,
    /// Where the host-secret check of `payload_reads` is kept for the
    /// next start (the bash tool's commands); none: check every time.
    pub kept_reads: Option<&'a crate::hostsecrets::KeptReads>,
}

mod cache;
pub use cache::PlanCache;
use cache::{clone_binds, Kept};

/// A start's confinement, ready for a payload.
pub struct Confined {
    pub policy: Policy,
    /// The mount sources, in the order of their fd numbers.
    pub mount_fds: Vec<OwnedFd>,
    /// The host secrets in force at the start (what the host masks came from).
    pub host_secrets: crate::hostsecrets::HostSecrets,
    /// Where a host secret could appear in a granted tree while it runs.
    pub secret_watch: Vec<crate::hostsecrets::WatchPoint>,
    /// The watch that tells when the project's masks are stale (registered
    /// with the runtime).
    pub masks_watch: Option<Arc<protected::SecretWatch>>,
    /// A writable project's guard and its inotify instance.
    pub guard: Option<Arc<protected::Guard>>,
    pub watcher: Option<protected::Watcher>,
    /// What the first result says about the start (a refused write mode, ...).
    pub plan_notes: Vec<String>,
    /// What the start masked (see `secrets`).
    pub masks: MaskReport,
    /// The caps on the sandbox's tasks and memory (see `contain`).
    pub contained: crate::contain::Contained,
    /// What the host may spend on the sandbox's changes to the project.
    pub budget: protected::BudgetLimits,
    /// Whether the project is writable in the end (the mode asked for it
    /// and it could be protected).
    pub writable: bool,
    /// What the project's walk was kept under (see [`PlanCache::keeps`]).
    pub plan_key: String,
}

/// Why no confinement could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// Preparing the start failed; the text says what and what to do.
    #[error("{0}")]
    Prepare(String),
    /// A setting cannot be applied (the text says which and why).
    #[error(transparent)]
    Settings(#[from] crate::limits::SettingError),
}

impl Confined {
    /// Place `fd` among the mount sources: the number it has in the sandbox.
    pub fn fd(&mut self, fd: OwnedFd) -> i32 {
        self.mount_fds.push(fd);
        MOUNT_FD_BASE + self.mount_fds.len() as i32 - 1
    }

    /// The policy's open-file limit, once every mount source is placed:
    /// bubblewrap may need a higher one than the payload gets.
    pub fn settle_nofile(&mut self) {
        self.policy.nofile = (crate::spawn::nofile_for(self.mount_fds.len()) > RLIMIT_NOFILE).then_some(RLIMIT_NOFILE);
    }
}

/// The trees a start's sandbox can write, as the host secrets' lookups
/// must skip them: the project and the runtime root (scratch is there).
pub fn sandbox_trees(dirs: &Dirs, project: &Path) -> (PathBuf, PathBuf) {
    let runtime_root = dirs.root.parent().unwrap_or(&dirs.root).to_path_buf();
    let canonical_root = std::fs::canonicalize(&runtime_root).unwrap_or(runtime_root);
    (project.to_path_buf(), canonical_root)
}

/// The host secrets in force for a start in `dirs` over `project` (made
/// once per start: the runtime filters what it mounts with them before
/// [`confine`] masks them).
pub fn host_secrets(settings: &Settings, dirs: &Dirs, project: &Path) -> crate::hostsecrets::HostSecrets {
    let (project, root) = sandbox_trees(dirs, project);
    settings.host_secrets(&[project.as_path(), root.as_path()])
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

/// The masks over `quarantine` (a canonical host path: the runtime root,
/// which holds this session's set-aside scratches, see `scratch::set_aside`,
/// and every other session's directory) where a read root or an allow-once
/// directory holds it: such a grant shows it at its host path, and what is
/// there may hold a secret (another session's logs and scratches too).
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

fn add(masks: &mut Vec<crate::hostsecrets::Mask>, more: impl IntoIterator<Item = crate::hostsecrets::Mask>) {
    for m in more {
        if !masks.contains(&m) {
            masks.push(m);
        }
    }
}

/// Make the confinement of one start (blocking parts run off the runtime).
pub async fn confine(req: Request<'_>) -> Result<Confined, ConfineError> {
    let Request {
        host,
        dirs,
        project,
        project_at,
        project_names,
        mounts,
        payload_reads,
        runtime_mounts,
        mut settings,
        seccomp,
        secrets,
        ..
    } = req;
    // Git must never trust a file under this session's runtime root
    // (scratch is there).
    let runtime_root = dirs.root.parent().unwrap_or(&dirs.root).to_path_buf();
    settings.git.untrusted.push(runtime_root.clone());
    let sizes = settings.tmpfs.clone();
    let caps = settings.caps.clone();
    let budget = settings.budget;
    let (_, canonical_root) = sandbox_trees(dirs, project);
    let trees = [project, canonical_root.as_path()];
    let mut host_masks = host_masks(&secrets, mounts, &trees);
    // A tree the payload reads outside the project is a host directory
    // shown to the sandbox like a read root (its check kept between
    // starts where the caller keeps it).
    let outside: Vec<PathBuf> =
        payload_reads.iter().filter(|d| !d.starts_with(project) && !d.starts_with(&canonical_root)).cloned().collect();
    let reads_check = match req.kept_reads {
        Some(kept) => kept.check(&secrets, &outside, &trees),
        None => crate::hostsecrets::check_anew(&secrets, &outside, &trees),
    };
    add(&mut host_masks, reads_check.masks);
    // The runtime root, where a grant shows it: every session's directory
    // (its logs, its scratch, the scratches set aside) and the stored worker.
    let quarantine = Some(canonical_root.clone());
    if let Some(q) = quarantine.filter(|q| std::fs::symlink_metadata(q).is_ok_and(|m| m.is_dir())) {
        add(&mut host_masks, quarantine_masks(&q, mounts));
    }
    // Mounts of kernel interfaces inside the project, a read root, an
    // allow-once directory or a payload's tree are hidden.
    let shown: Vec<(&Path, &Path)> = std::iter::once((project, project_at))
        .chain(mounts.read_roots.iter().map(|r| (r.as_path(), r.as_path())))
        .chain(mounts.once.iter().filter(|m| m.is_dir).map(|m| (m.source.as_path(), m.path.as_path())))
        .chain(payload_reads.iter().map(|d| (d.as_path(), d.as_path())))
        .collect();
    let table = crate::submounts::table();
    add(&mut host_masks, crate::submounts::masks_of(&table, &shown));
    // What these masks hide of the project, the walk passes over.
    let masked_mounts = crate::submounts::masked_ids_in(&table, project);
    let granted: Vec<&Path> = mounts
        .read_roots
        .iter()
        .map(PathBuf::as_path)
        .chain(mounts.once.iter().filter(|m| m.is_dir).map(|m| m.source.as_path()))
        .collect();
    let mut secret_watch = secrets.watch_points(&granted, &trees);
    let mut seen: std::collections::HashSet<crate::hostsecrets::WatchPoint> = secret_watch.iter().cloned().collect();
    for point in reads_check.points {
        if seen.insert(point.clone()) {
            secret_watch.push(point);
        }
    }
    let mut plan_notes = Vec::new();
    // The session's empty file and directory: the source of every mask,
    // the kernel's information files, the project's secrets and the host
    // secrets' in granted directories.
    let sources = crate::secrets::MaskSources::in_dir(&dirs.root)
        .map_err(|e| ConfineError::Prepare(format!("The empty files that hide secrets could not be made: {e}")))?;
    let (root, sink, tainted) = (project.to_path_buf(), req.notes.clone(), req.tainted.clone());
    // What a grant unmasked, and the secrets allowed once for this start.
    let unmasked: Vec<PathBuf> = mounts.unmasked.iter().chain(&mounts.unmasked_once).cloned().collect();
    let writable_mode = mounts.workspace_writable;
    let known = req.known.lock().clone();
    let mask_sources = (sources.file.clone(), sources.dir.clone());
    let host_list = secrets.clone();
    // One walk of the project: the secret masks (every mode) and, when
    // the mode allows writes, the protected paths. A project that cannot
    // be protected is mounted read-only for this sandbox, and the first
    // result says why; a secret that cannot be masked stops the start.
    // A writable mode needs a guard that works: its inotify instance and
    // watches are made before the sandbox (which could otherwise take the
    // user's last ones first); without them the project is mounted
    // read-only for this sandbox.
    let guard_init = host.guard_inotify;
    let cache_key = format!(
        "{project:?}|{writable_mode}|{:?}|{unmasked:?}|{:?}|{:?}|{:?}|{:?}|{}|{host_list:?}|{masked_mounts:?}",
        req.tainted.lock(),
        settings.secrets,
        settings.scan,
        settings.protected,
        known.masks,
        known.idents.len()
    );
    let cache = req.cache;
    if let Some(cache) = cache {
        let (key, root, kept) = (cache_key.clone(), project.to_path_buf(), cache.clone());
        let hit = tokio::task::spawn_blocking(move || kept.fresh(&key, &root)).await.ok().flatten();
        // A writable project's kept walk: a guard of its own for this
        // sandbox, watching the same holders (none to be had: walk).
        let renewed = |(binds, seed): (Vec<protected::Bind>, Arc<protected::Guard>)| {
            let guard = seed.renew(req.notes.clone()).ok()?;
            let mut watcher = protected::Watcher::new(guard_init).ok()?;
            watcher.watch_holders(&guard).ok()?;
            Some((binds, Arc::new(guard), watcher))
        };
        let hit = hit.and_then(|k| match k.writable {
            None => Some((k.masks, k.report, k.watch, None)),
            Some(w) => renewed(w).map(|w| (k.masks, k.report, k.watch, Some(w))),
        });
        if let Some((masks, report, watch, writable)) = hit {
            tracing::debug!(masks = masks.len(), "the kept walk of the project is reused");
            let (binds, guard, watcher) = match writable {
                Some((b, g, w)) => (b, Some(g), Some(w)),
                None => (Vec::new(), None, None),
            };
            let writable = guard.is_some();
            return finish(Finish {
                plan_key: cache_key.clone(),
                host,
                dirs,
                project,
                project_at,
                project_names,
                payload_reads,
                runtime_mounts,
                mounts,
                caps: &caps,
                sizes,
                seccomp,
                budget,
                secrets,
                host_masks,
                mask_sources: (sources.file.clone(), sources.dir.clone()),
                secret_watch,
                plan_notes: report.incomplete_note().into_iter().collect(),
                binds,
                masks,
                report,
                masks_watch: watch,
                guard,
                watcher,
                writable,
            });
        }
    }
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
                masked_mounts: &masked_mounts,
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
        Ok(Err(e)) => return Err(ConfineError::Prepare(format!("No sandbox was started: {e}."))),
        Err(e) => return Err(ConfineError::Prepare(format!("The protected paths could not be planned: {e}"))),
    };
    let at = crate::display::one_line(project_at);
    if let Some(e) = &plan.refused {
        plan_notes.push(format!(
            "{at} is mounted READ-ONLY for this sandbox although the permission mode allows writes: {e}."
        ));
    }
    if let Some(e) = &no_guard {
        plan_notes.push(format!(
            "{at} is mounted READ-ONLY for this sandbox although the permission mode allows writes: the guard that \
             keeps protected names inert could not get inotify ({e}: the inotify instances or watches of your user \
             are used up); close programs that hold them and reset, or raise fs.inotify.max_user_instances."
        ));
    }
    plan_notes.extend(plan.report.incomplete_note());
    let writable = mounts.workspace_writable && plan.refused.is_none() && no_guard.is_none();
    let masks_watch = plan.watch.map(|mut w| {
        w.register();
        Arc::new(w)
    });
    // A writable project's walk is kept when the project is writable and
    // the watch covers it (see `SecretWatch::protection_kept`).
    let guard = plan.guard.map(Arc::new);
    let keepable = match (&guard, writable_mode) {
        (_, false) => Some(None),
        (Some(g), true)
            if writable
                && masks_watch
                    .as_ref()
                    .is_some_and(|w| w.protection_kept(|rels| rels.iter().all(|r| g.as_planned(r)))) =>
        {
            clone_binds(&plan.binds).ok().map(|b| Some((b, g.clone())))
        }
        _ => None,
    };
    let plan_key = cache_key.clone();
    match (cache, keepable) {
        (Some(cache), Some(protection)) => {
            let masks = clone_binds(&plan.masks)
                .map_err(|e| ConfineError::Prepare(format!("A mask could not be kept: {e}")))?;
            let walk = Kept { masks, report: plan.report.clone(), watch: masks_watch.clone(), writable: protection };
            let root = project.to_path_buf();
            let kept = cache.clone();
            let _ = tokio::task::spawn_blocking(move || kept.keep(cache_key, &root, walk)).await;
        }
        (Some(cache), None) => cache.forget(),
        _ => {}
    }
    finish(Finish {
        plan_key,
        host,
        dirs,
        project,
        project_at,
        project_names,
        payload_reads,
        runtime_mounts,
        mounts,
        caps: &caps,
        sizes,
        seccomp,
        budget,
        secrets,
        host_masks,
        mask_sources,
        secret_watch,
        plan_notes,
        binds: plan.binds,
        masks: plan.masks,
        report: plan.report,
        masks_watch,
        guard,
        watcher,
        writable,
    })
}

/// What a start's confinement is made of once the project's walk is
/// done (or kept from an earlier start).
struct Finish<'a> {
    host: &'a HostFacts,
    dirs: &'a Dirs,
    project: &'a Path,
    project_at: &'a Path,
    project_names: &'a [PathBuf],
    payload_reads: &'a [PathBuf],
    runtime_mounts: &'a [PathBuf],
    mounts: &'a MountConfig,
    caps: &'a Result<crate::contain::Caps, crate::limits::SettingError>,
    sizes: Result<crate::limits::TmpfsSizes, crate::limits::SettingError>,
    seccomp: crate::seccomp::Profile,
    budget: protected::BudgetLimits,
    secrets: crate::hostsecrets::HostSecrets,
    host_masks: Vec<crate::hostsecrets::Mask>,
    mask_sources: (PathBuf, PathBuf),
    secret_watch: Vec<crate::hostsecrets::WatchPoint>,
    plan_notes: Vec<String>,
    binds: Vec<protected::Bind>,
    masks: Vec<protected::Bind>,
    report: MaskReport,
    masks_watch: Option<Arc<protected::SecretWatch>>,
    guard: Option<Arc<protected::Guard>>,
    watcher: Option<protected::Watcher>,
    writable: bool,
    plan_key: String,
}

/// The mount fds, the containment and the policy of a planned start.
fn finish(f: Finish<'_>) -> Result<Confined, ConfineError> {
    let Finish {
        host,
        dirs,
        project,
        project_at,
        project_names,
        payload_reads,
        runtime_mounts,
        mounts,
        mut plan_notes,
        report: masks,
        writable,
        plan_key,
        ..
    } = f;
    let mut mount_fds: Vec<OwnedFd> = Vec::new();
    let fd_binds = |binds: Vec<protected::Bind>, mount_fds: &mut Vec<OwnedFd>| -> Vec<FdBind> {
        binds
            .into_iter()
            .map(|b| {
                mount_fds.push(b.fd);
                FdBind {
                    fd: MOUNT_FD_BASE + mount_fds.len() as i32 - 1,
                    dest: project_at.join(&b.rel),
                    read_only: b.read_only,
                }
            })
            .collect()
    };
    let protected_binds = fd_binds(f.binds, &mut mount_fds);
    // A read root, a directory allowed once, a tree of the payload or the
    // runtime, or a system directory that contains the project shows it
    // at a path of its own (its host path, where no link is made then):
    // the same masks go there (from copies of their fds).
    let mut root_masks = Vec::new();
    if project_at != project {
        for at in shown_elsewhere(project, mounts, &[payload_reads, runtime_mounts]) {
            for b in f.masks.iter().filter(|b| masks.masked.iter().any(|m| m.rel == b.rel)) {
                let fd =
                    b.fd.try_clone()
                        .map_err(|e| ConfineError::Prepare(format!("A secret mask could not be copied: {e}")))?;
                root_masks.push((fd, at.join(&b.rel)));
            }
        }
    }
    let mask_binds = fd_binds(f.masks, &mut mount_fds);
    let root_masks: Vec<FdBind> = root_masks
        .into_iter()
        .map(|(fd, dest)| {
            mount_fds.push(fd);
            FdBind { fd: MOUNT_FD_BASE + mount_fds.len() as i32 - 1, dest, read_only: true }
        })
        .collect();
    let sizes = f.sizes?;
    // The sandbox's own cgroups (or RLIMIT_NPROC), made before it starts
    // so that its first process joins them before it forks.
    let contained = crate::contain::for_sandbox(f.caps, &mut plan_notes)?;
    let policy = Policy {
        merged_usr: host.merged_usr,
        project_dir: project.to_path_buf(),
        project_at: project_at.to_path_buf(),
        project_links: if project_at == project { Vec::new() } else { link_names(project, project_names) },
        workspace_writable: writable,
        scratch_dir: dirs.scratch.clone(),
        read_roots: mounts.read_roots.clone(),
        once: mounts.once.iter().map(|m| (m.source.clone(), m.path.clone())).collect(),
        host_masks: f.host_masks,
        mask_sources: f.mask_sources,
        proc_masks: host.proc_masks.clone(),
        protected: protected_binds,
        masks: mask_binds,
        root_masks,
        nofile: None,
        nproc: contained.nproc(),
        tmp_bytes: sizes.tmp,
        shm_bytes: sizes.shm,
        network: Network::None,
        seccomp: f.seccomp,
    };
    let mut confined = Confined {
        policy,
        mount_fds,
        host_secrets: f.secrets,
        secret_watch: f.secret_watch,
        masks_watch: f.masks_watch,
        guard: f.guard,
        watcher: f.watcher,
        plan_notes,
        masks,
        contained,
        budget: f.budget,
        writable,
        plan_key,
    };
    confined.settle_nofile();
    Ok(confined)
}

/// Where the sandbox shows `project` besides its mount point: inside a
/// read root, a directory allowed once (where the code read it), one of
/// the `trees` (mounted at their own paths) or a system directory.
fn shown_elsewhere(project: &Path, mounts: &MountConfig, trees: &[&[PathBuf]]) -> Vec<PathBuf> {
    let own = mounts.read_roots.iter().chain(trees.iter().flat_map(|t| t.iter())).map(|r| (r.as_path(), r.as_path()));
    let system = crate::bwrap::SYSTEM_MOUNTS.iter().map(|s| (Path::new(*s), Path::new(*s)));
    let once = mounts.once.iter().filter(|m| m.is_dir).map(|m| (m.source.as_path(), m.path.as_path()));
    let mut out: Vec<PathBuf> = Vec::new();
    for (source, at) in own.chain(system).chain(once) {
        if let Ok(rel) = project.strip_prefix(source) {
            let shown = at.join(rel);
            if !out.contains(&shown) {
                out.push(shown);
            }
        }
    }
    out
}

/// The project's host names made links to its mount point: its
/// canonical path, then each other name, lexically normalised, once.
fn link_names(project: &Path, names: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = vec![project.to_path_buf()];
    for name in names.iter().filter_map(|n| crate::paths::normalize_path(n)) {
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permissions::OnceMount;

    #[test]
    fn the_project_s_masks_go_wherever_a_mount_shows_it_besides_its_own() {
        let project = Path::new("/srv/work/proj");
        let mut mounts = MountConfig { read_roots: vec!["/srv".into(), "/data".into()], ..MountConfig::default() };
        assert_eq!(shown_elsewhere(project, &mounts, &[]), [PathBuf::from("/srv/work/proj")]);
        // A directory allowed once, where the code read it (a link to it).
        mounts.read_roots.clear();
        mounts.once.push(OnceMount { path: "/l/w".into(), source: "/srv/work".into(), is_dir: true });
        mounts.once.push(OnceMount { path: "/srv/work/proj".into(), source: "/srv/work/proj".into(), is_dir: false });
        assert_eq!(shown_elsewhere(project, &mounts, &[]), [PathBuf::from("/l/w/proj")]);
        // A tree of the payload or the runtime, and a system directory.
        let none = MountConfig::default();
        assert_eq!(shown_elsewhere(project, &none, &[&[], &["/srv/work".into()]]), [PathBuf::from("/srv/work/proj")]);
        let in_usr = Path::new("/usr/local/src/proj");
        assert_eq!(shown_elsewhere(in_usr, &none, &[]), [in_usr.to_path_buf()]);
        assert!(shown_elsewhere(Path::new("/home/u/proj"), &none, &[&["/home/u/venv".into()]]).is_empty());
    }

    #[test]
    fn the_link_names_are_the_canonical_path_then_each_other_name_once_normalised() {
        let names =
            [PathBuf::from("/l/proj/"), "/real/proj".into(), "/l/x/../proj".into(), "rel".into(), "/m/p".into()];
        assert_eq!(
            link_names(Path::new("/real/proj"), &names),
            [PathBuf::from("/real/proj"), "/l/proj".into(), "/m/p".into()]
        );
    }

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
