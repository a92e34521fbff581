//! The watches on a running sandbox, whatever runs in it: the guard of a
//! writable project (protected names made inert), the host secrets that
//! appear in a granted tree, the project secrets that appear. A secret
//! that appears stops the sandbox at once (nothing in it may read or keep
//! it) and says so through its `killed_for`. Each watch ends when its
//! [`Watches`] is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::protected::{self, Budget, Guard, HostKill, KillSlot, SecretWatch, Watcher};
use crate::spawn::kill_group;

/// What one sandbox's watches are made of.
pub struct Armed {
    /// The sandbox's process group (killed when a secret appears).
    pub pid: i32,
    pub guard: Option<Arc<Guard>>,
    pub watcher: Option<Watcher>,
    pub secret_watch: Vec<crate::hostsecrets::WatchPoint>,
    pub masks_watch: Option<Arc<SecretWatch>>,
    pub budget: Arc<Budget>,
    /// Where a watch writes why it stopped the sandbox.
    pub killed_for: KillSlot,
    /// Set when a watch stopped it because a secret appeared.
    pub secret_appeared: Arc<AtomicBool>,
}

/// The running watches; dropping this ends them.
#[derive(Default)]
pub struct Watches {
    _stops: Vec<oneshot::Sender<()>>,
    /// The guard's watch, apart: a mode change starts or ends it alone.
    guard: Option<oneshot::Sender<()>>,
}

/// Watch `points` for a host secret that appears in a read root: it
/// stops the sandbox (process group `pid`) at once, nothing in it may read
/// (or keep) it. Ends when the returned sender is dropped.
fn host_secrets(
    pid: i32,
    points: Vec<crate::hostsecrets::WatchPoint>,
    killed_for: KillSlot,
    secret: Arc<AtomicBool>,
) -> oneshot::Sender<()> {
    let (stop, stopped) = oneshot::channel();
    let appeared = move |path: std::path::PathBuf| {
        secret.store(true, Ordering::Release);
        tracing::debug!(pid, path = %path.display(), "host secret appeared; sandbox killed");
        *killed_for.lock() = Some(HostKill::HostSecret(path));
        kill_group(pid);
    };
    tokio::spawn(crate::hostsecrets::watch(points, appeared, stopped));
    stop
}

/// The host-secret watch of read roots attached to a running sandbox (see
/// `live_grants`), as a start watches its own.
pub fn granted(
    pid: i32,
    points: Vec<crate::hostsecrets::WatchPoint>,
    killed_for: KillSlot,
    secret: Arc<AtomicBool>,
) -> Watches {
    Watches { _stops: vec![host_secrets(pid, points, killed_for, secret)], guard: None }
}

impl Watches {
    /// Keep `other`'s watches running as long as these.
    pub fn join(&mut self, other: Watches) {
        self._stops.extend(other._stops);
        self._stops.extend(other.guard);
    }

    /// Start the guard's watch of a project made writable while the
    /// sandbox runs (see `worker::mode`), as a start does.
    pub fn guard(&mut self, guard: Arc<Guard>, watcher: Watcher, masks_watch: Option<&Arc<SecretWatch>>) {
        self.guard = Some(guard_watch(guard, Some(watcher), masks_watch));
    }

    /// End the guard's watch (the project is read-only again).
    pub fn end_guard(&mut self) {
        self.guard = None;
    }
}

fn guard_watch(
    guard: Arc<Guard>,
    watcher: Option<Watcher>,
    masks_watch: Option<&Arc<SecretWatch>>,
) -> oneshot::Sender<()> {
    if let Some(watch) = masks_watch {
        guard.follow(watch.clone());
    }
    let (stop, stopped) = oneshot::channel();
    tokio::spawn(protected::watch(guard, watcher, stopped));
    stop
}

/// Start the watches of `armed`.
pub fn start(armed: Armed) -> Watches {
    let Armed { pid, guard, watcher, secret_watch, masks_watch, budget, killed_for, secret_appeared } = armed;
    let mut stops = Vec::new();
    let guard = guard.map(|g| guard_watch(g, watcher, masks_watch.as_ref()));
    if !secret_watch.is_empty() {
        stops.push(host_secrets(pid, secret_watch, killed_for.clone(), secret_appeared.clone()));
    }
    if let Some(watch) = masks_watch {
        // A project secret that appears stops the sandbox at once; the
        // next one masks it.
        let (stop, stopped) = oneshot::channel();
        let stale = move |why: String| {
            secret_appeared.store(true, Ordering::Release);
            tracing::debug!(pid, why, "project secret appeared; sandbox killed");
            killed_for.lock().get_or_insert(HostKill::NewSecret(why));
            kill_group(pid);
        };
        tokio::spawn(watch.run(stale, budget, stopped));
        stops.push(stop);
    }
    Watches { _stops: stops, guard }
}
