//! An inotify instance registered with tokio, for the watches that stop or
//! repair a sandbox the moment a name appears (see `protected` and
//! `hostsecrets`).

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

    /// The next batch of events; `None` once the instance fails.
    pub(crate) async fn events(&self) -> Option<Vec<nix::sys::inotify::InotifyEvent>> {
        loop {
            let mut ready = self.0.readable().await.ok()?;
            match self.0.get_ref().0.read_events() {
                Ok(events) => return Some(events),
                Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                Err(_) => return None,
            }
        }
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
