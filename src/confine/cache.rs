//! A project's walk, kept between the starts of a session's commands
//! while it stays right (see [`PlanCache`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::protected;
use crate::secrets::MaskReport;

/// A read-only project's walk (its secret masks), kept between starts
/// while it stays right. Right means: the same project, settings, grants
/// and known secrets (the key), the walk's own watch saying that no name
/// it would mask appeared since (`SecretWatch::stale`, the check the
/// python tool makes before each call), and every masked entry still
/// there with the same link count. A read-only project is written by no
/// sandbox, so only the host's own programs change it, and those changes
/// are what the watch sees. A writable project is written by the
/// sandboxes: its walk is kept while the watch says its protection is the
/// walk's (`SecretWatch::protection_kept`: every directory watched, no
/// protected entry or directory above one removed, every protected name
/// that appeared made inert), and each start gets a guard of its own made
/// from the kept one.
#[derive(Default, Clone)]
pub struct PlanCache(Arc<parking_lot::Mutex<Option<Cached>>>);

struct Cached {
    key: String,
    masks: Vec<protected::Bind>,
    report: MaskReport,
    watch: Option<Arc<protected::SecretWatch>>,
    /// A writable project's protection: its binds and the guard its next
    /// guards are made from.
    writable: Option<(Vec<protected::Bind>, Arc<protected::Guard>)>,
    /// The link count of each masked file: a new name of one anywhere
    /// (even where the watch does not look) drops the kept walk.
    links: Vec<(PathBuf, u64)>,
    /// Which walk this is (each one kept gets a new number).
    made: u64,
}

/// The number of the next walk kept.
static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a kept walk gives a start.
pub(super) struct Kept {
    pub(super) masks: Vec<protected::Bind>,
    pub(super) report: MaskReport,
    pub(super) watch: Option<Arc<protected::SecretWatch>>,
    pub(super) writable: Option<(Vec<protected::Bind>, Arc<protected::Guard>)>,
}

fn link_counts(tree: &crate::beneath::Tree, report: &MaskReport) -> Option<Vec<(PathBuf, u64)>> {
    report
        .masked
        .iter()
        .filter(|m| !m.dir)
        .map(|m| Some((m.rel.clone(), tree.lstat(&m.rel).ok().flatten()?.st_nlink)))
        .collect()
}

pub(super) fn clone_binds(binds: &[protected::Bind]) -> std::io::Result<Vec<protected::Bind>> {
    binds
        .iter()
        .map(|b| Ok(protected::Bind { fd: b.fd.try_clone()?, rel: b.rel.clone(), read_only: b.read_only }))
        .collect()
}

impl PlanCache {
    /// Which walk is kept, if one is.
    pub fn kept(&self) -> Option<u64> {
        self.0.lock().as_ref().map(|c| c.made)
    }

    /// Whether the kept walk is `made` (see [`PlanCache::kept`]), kept for
    /// `key`, and still right by the rule [`PlanCache::fresh`] applies
    /// (blocking, as it is): a sandbox started ahead of need with that
    /// walk may still be used.
    pub fn keeps(&self, key: &str, made: u64, project: &Path) -> bool {
        let guard = self.0.lock();
        guard.as_ref().filter(|c| c.key == key && c.made == made).is_some_and(|kept| right(kept, project))
    }

    /// The kept walk for `key`, when it is still right (blocking: the
    /// watch may walk where it does not cover the project).
    pub(super) fn fresh(&self, key: &str, project: &Path) -> Option<Kept> {
        let guard = self.0.lock();
        let kept = guard.as_ref().filter(|c| c.key == key)?;
        if !right(kept, project) {
            return None;
        }
        let writable = match &kept.writable {
            Some((binds, g)) => Some((clone_binds(binds).ok()?, g.clone())),
            None => None,
        };
        Some(Kept {
            masks: clone_binds(&kept.masks).ok()?,
            report: kept.report.clone(),
            watch: kept.watch.clone(),
            writable,
        })
    }

    pub(super) fn forget(&self) {
        *self.0.lock() = None;
    }

    pub(super) fn keep(&self, key: String, project: &Path, walk: Kept) {
        let links = crate::beneath::Tree::open(project).ok().and_then(|t| link_counts(&t, &walk.report));
        let writable = match walk.writable {
            Some((binds, g)) => clone_binds(&binds).ok().map(|b| Some((b, g))),
            None => Some(None),
        };
        *self.0.lock() = match (clone_binds(&walk.masks), links, writable) {
            (Ok(masks), Some(links), Some(writable)) => {
                let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(Cached { key, masks, report: walk.report, watch: walk.watch, writable, links, made })
            }
            _ => None,
        };
    }
}

/// Whether `kept` is still right for `project` (see [`PlanCache`]).
fn right(kept: &Cached, project: &Path) -> bool {
    if kept.watch.as_ref().is_some_and(|w| w.stale().is_some()) {
        return false;
    }
    // A writable project's walk: only while its protection is the
    // walk's (the sandboxes write it: a name made or removed elsewhere
    // keeps it; a protected name the host made since drops it, so that
    // the next walk binds it).
    if let Some((_, seed)) = &kept.writable {
        let planned = |rels: &[PathBuf]| rels.iter().all(|r| seed.as_planned(r));
        if !kept.watch.as_ref().is_some_and(|w| w.protection_kept(planned)) {
            return false;
        }
    }
    let Ok(tree) = crate::beneath::Tree::open(project) else { return false };
    let all_there = kept.report.masked.iter().all(|m| tree.lstat(&m.rel).is_ok_and(|st| st.is_some()));
    all_there && link_counts(&tree, &kept.report).as_ref() == Some(&kept.links)
}
