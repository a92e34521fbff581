//! An inotify instance registered with tokio, for the watches that stop or
//! repair a sandbox the moment a name appears (see `protected` and
//! `hostsecrets`); and one sandbox's share of its user's inotify budget,
//! written into the sandbox's own user namespace by `nshelper`.

/// At most one batch of a watch's events this often while they keep
/// coming (the kernel queues what comes meanwhile).
pub const PACE: std::time::Duration = std::time::Duration::from_millis(10);

/// The inotify instance, as tokio wants it.
struct InotifyFd(nix::sys::inotify::Inotify);

impl std::os::fd::AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify instance registered with tokio.
pub(crate) struct Inotified(tokio::io::unix::AsyncFd<InotifyFd>);

impl Inotified {
    pub(crate) fn new(inotify: nix::sys::inotify::Inotify) -> Option<Self> {
        // SAFETY: the inotify fd is owned by the wrapper inside the AsyncFd and
        // stays open until the AsyncFd (and its registration) is dropped.
        unsafe { tokio::io::unix::AsyncFd::register(InotifyFd(inotify)) }.ok().map(Inotified)
    }

    /// The instance itself (for watches and non-blocking reads).
    pub(crate) fn get(&self) -> &nix::sys::inotify::Inotify {
        &self.0.get_ref().0
    }

    /// Wait until events are queued (read them with [`Inotified::get`]);
    /// `false` once the instance fails.
    pub(crate) async fn wait(&self) -> bool {
        match self.0.readable().await {
            Ok(mut ready) => {
                // Cleared before the read: what comes after is a new edge.
                ready.clear_ready();
                true
            }
            Err(_) => false,
        }
    }
}

/// Inotify instances and watches: a per-user budget of the host
/// (`/proc/sys/fs/inotify/max_user_*`) or one sandbox's share of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InotifyBudget {
    pub instances: u64,
    pub watches: u64,
}

/// Sandboxes of one user that may run at once, for the sharing: a
/// session's sandbox and its spare, in each of this many sessions.
pub const SESSIONS_AT_ONCE: u64 = 4;
pub const SANDBOXES_AT_ONCE: u64 = 2 * SESSIONS_AT_ONCE;
/// What one sandbox never gets more of, whatever the host's budget.
pub const SANDBOX_MAX: InotifyBudget = InotifyBudget { instances: 8, watches: 8192 };

/// The user's budget on this host; the kernel's defaults where a file
/// cannot be read.
pub fn host_budget() -> InotifyBudget {
    let read = |name: &str, default: u64| {
        std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default)
    };
    InotifyBudget { instances: read("max_user_instances", 128), watches: read("max_user_watches", 8192) }
}

/// One sandbox's share of `host`: all the sandboxes that can run at once
/// take at most half of it together (the rest stays with the host: the
/// guards' watches and every other program of the user), and one sandbox
/// at most [`SANDBOX_MAX`]; never less than one instance and one watch.
pub fn sandbox_share(host: InotifyBudget) -> InotifyBudget {
    let share = |budget: u64, max: u64| (budget / (2 * SANDBOXES_AT_ONCE)).clamp(1, max);
    InotifyBudget {
        instances: share(host.instances, SANDBOX_MAX.instances),
        watches: share(host.watches, SANDBOX_MAX.watches),
    }
}

/// The helper's steps that cap a sandbox at `share`: the limits of its own
/// user namespace, written from inside it (the kernel charges every
/// instance and watch to each namespace up the chain, so the host's
/// budget still counts them too).
pub fn cap_steps(share: InotifyBudget) -> Vec<crate::nshelper::Step> {
    use crate::nshelper::Step;
    vec![
        Step::write("/proc/sys/user/max_inotify_instances", &share.instances.to_string()),
        Step::write("/proc/sys/user/max_inotify_watches", &share.watches.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandboxes_at_once_take_at_most_half_of_the_host_budget() {
        let host = InotifyBudget { instances: 128, watches: 192_530 };
        let share = sandbox_share(host);
        assert_eq!(share, InotifyBudget { instances: 8, watches: 8192 });
        assert!(share.instances * SANDBOXES_AT_ONCE <= host.instances / 2);
        assert!(share.watches * SANDBOXES_AT_ONCE <= host.watches / 2);
        let small = sandbox_share(InotifyBudget { instances: 128, watches: 8192 });
        assert_eq!(small, InotifyBudget { instances: 8, watches: 512 });
        assert_eq!(
            sandbox_share(InotifyBudget { instances: 3, watches: 0 }),
            InotifyBudget { instances: 1, watches: 1 }
        );
    }
}
