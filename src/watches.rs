//! The watches on a running sandbox, whatever runs in it: the guard of a
//! writable project (protected names made inert), the host secrets that
//! appear in a granted tree, the project secrets that appear. A secret
//! that appears stops the sandbox at once (nothing in it may read or keep
//! it) and says so through its `killed_for`. Each watch ends when its
//! [`Watches`] is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::protected::{self, Budget, Guard, KilledFor, SecretWatch, Watcher};
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
    pub killed_for: KilledFor,
    /// Set when a watch stopped it because a secret appeared.
    pub secret_appeared: Arc<AtomicBool>,
}

/// The running watches; dropping this ends them.
#[derive(Default)]
pub struct Watches {
    _stops: Vec<oneshot::Sender<()>>,
}

/// Start the watches of `armed`.
pub fn start(armed: Armed) -> Watches {
    let Armed { pid, guard, watcher, secret_watch, masks_watch, budget, killed_for, secret_appeared } = armed;
    let mut stops = Vec::new();
    if let Some(guard) = guard {
        if let Some(watch) = &masks_watch {
            guard.follow(watch.clone());
        }
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(protected::watch(guard, watcher, stopped));
        stops.push(stop);
    }
    if !secret_watch.is_empty() {
        // A secret that appears in a read root stops the sandbox at once:
        // nothing in it may read (or keep) it.
        let (stop, stopped) = oneshot::channel();
        let (killed_for, secret) = (killed_for.clone(), secret_appeared.clone());
        let appeared = move |path: std::path::PathBuf| {
            secret.store(true, Ordering::Release);
            *killed_for.lock() = Some(format!(
                "a host secret appeared in a read root ({}); the sandbox was stopped so that nothing in it could \
                 read it, and the next one masks it",
                crate::display::one_line(&path)
            ));
            tracing::debug!(pid, path = %path.display(), "host secret appeared; sandbox killed");
            kill_group(pid);
        };
        tokio::spawn(crate::hostsecrets::watch(secret_watch, appeared, stopped));
        stops.push(stop);
    }
    if let Some(watch) = masks_watch {
        // A project secret that appears stops the sandbox at once; the
        // next one masks it.
        let (stop, stopped) = oneshot::channel();
        let stale = move |why: String| {
            secret_appeared.store(true, Ordering::Release);
            killed_for.lock().get_or_insert_with(|| {
                format!("{why}; the sandbox was stopped so that nothing in it could read it, and the next one masks it")
            });
            tracing::debug!(pid, why, "project secret appeared; sandbox killed");
            kill_group(pid);
        };
        tokio::spawn(watch.run(stale, budget, stopped));
        stops.push(stop);
    }
    Watches { _stops: stops }
}
