//! A held sandbox's release: bubblewrap waits at `--block-fd` while the
//! host sets the sandbox's limits and the namespace helper runs its steps
//! and makes the `/proc` masks; then the payload is released (for the
//! python worker as soon as its limits are set, the masks made while it
//! starts: [`prepare_then_mask`]).
use std::io;
use std::os::fd::OwnedFd;

use nix::sys::resource::Resource;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

use super::prlimit;

/// Why a held sandbox was not released.
#[derive(Debug, thiserror::Error)]
pub enum Unprepared {
    /// Bubblewrap's info pipe (where it says the sandbox's pid) failed.
    #[error("bubblewrap's info pipe: {0}")]
    InfoPipe(io::Error),
    /// Bubblewrap said nothing within the helper's deadline.
    #[error("bubblewrap did not say the sandbox's pid in time")]
    PidLate,
    /// What bubblewrap said names no pid.
    #[error("bubblewrap did not say the sandbox's pid")]
    NoPid,
    /// The namespace helper's thread ended without an answer.
    #[error("{0}")]
    HelperThread(tokio::task::JoinError),
    /// The byte that releases the payload was not written.
    #[error("the payload could not be released")]
    NotReleased,
    #[error("the payload could not be released: {0}")]
    Release(nix::errno::Errno),
    /// An rlimit of the policy's could not be set on the held process.
    #[error("{resource} of the sandbox's first process (pid {pid}) could not be set: {source}")]
    Limit { resource: &'static str, pid: i32, source: io::Error },
    #[error("{0}")]
    Helper(#[from] crate::nshelper::HelperError),
    /// A kernel interface could not be made read-only or a kernel
    /// information file hidden (see `nshelper::masks`).
    #[error("{0}")]
    Masks(#[from] crate::nshelper::mount::MountError),
}

/// The name of an rlimit the host sets on a held sandbox.
fn limit_name(resource: Resource) -> &'static str {
    match resource {
        Resource::RLIMIT_NPROC => "RLIMIT_NPROC",
        Resource::RLIMIT_NOFILE => "RLIMIT_NOFILE",
        _ => "an rlimit",
    }
}

/// Set each of `limits` (soft = hard) on process `pid` with prlimit(2).
/// The kernel lets a process of the same user (real, effective and saved
/// ids) do it, in a child user namespace too, and root any process; a
/// limit can only be lowered this way (raising a hard one takes
/// CAP_SYS_RESOURCE, which nothing in a sandbox has).
pub fn set_limits_of(pid: i32, limits: &[(Resource, u64)]) -> Result<(), Unprepared> {
    for &(resource, value) in limits {
        prlimit(pid, resource, Some(value)).map_err(|errno| Unprepared::Limit {
            resource: limit_name(resource),
            pid,
            source: io::Error::from_raw_os_error(errno),
        })?;
    }
    Ok(())
}

/// Read the sandbox's pid from bubblewrap's info pipe, set `limits` on
/// that process (held at `--block-fd`: bubblewrap has made the mounts and
/// dropped its capabilities, and has not yet forked the payload, so
/// everything in the sandbox inherits them), run the namespace helper's
/// `steps` in its user namespace, make the `held` mounts once bubblewrap
/// has made its own (`nshelper::masks`: the policy's `/proc` hardening),
/// then release the payload
/// through `release`. The caller kills the sandbox on an error before it
/// drops `release`.
pub async fn prepare_inside(
    info: OwnedFd,
    release: &OwnedFd,
    limits: &[(Resource, u64)],
    held: crate::nshelper::masks::Held,
    steps: Vec<crate::nshelper::Step>,
) -> Result<(), Unprepared> {
    prepare_inside_with(info, release, limits, held, steps, None).await.map(|_| ())
}

/// [`prepare_inside`], and with `listen` a listener on `127.0.0.1:PORT`
/// in the sandbox's network namespace (`nshelper::listen`), made before
/// the payload is released. The listener's failure does not stop the
/// start: the sandbox then has no network, and the error says why.
pub async fn prepare_inside_with(
    info: OwnedFd,
    release: &OwnedFd,
    limits: &[(Resource, u64)],
    held: crate::nshelper::masks::Held,
    steps: Vec<crate::nshelper::Step>,
    listen: Option<u16>,
) -> Result<Option<Result<OwnedFd, crate::nshelper::HelperError>>, Unprepared> {
    let began = std::time::Instant::now();
    let held = crate::nshelper::masks::prepare(&held)?;
    let pid = held_pid(info).await?;
    set_limits_of(pid, limits)?;
    // The steps need only the user namespace: they run while bubblewrap
    // is still mounting; the masks wait for its mounts.
    tokio::task::spawn_blocking(move || -> Result<(), Unprepared> {
        if !steps.is_empty() {
            crate::nshelper::run(pid, &[crate::nshelper::Namespace::User], &steps)?;
        }
        crate::nshelper::masks::apply(pid, &held)?;
        Ok(())
    })
    .await
    .map_err(Unprepared::HelperThread)??;
    let listener = match listen {
        Some(port) => Some(
            tokio::task::spawn_blocking(move || crate::nshelper::listen::listen(pid, port))
                .await
                .map_err(Unprepared::HelperThread)?,
        ),
        None => None,
    };
    release_payload(release)?;
    tracing::debug!(pid, us = began.elapsed().as_micros() as u64, "sandbox namespaces prepared");
    Ok(listener)
}

/// The sandbox's pid, from bubblewrap's info pipe (within the helper's
/// deadline).
async fn held_pid(info: OwnedFd) -> Result<i32, Unprepared> {
    let info = pipe::Receiver::from_owned_fd(info).map_err(Unprepared::InfoPipe)?;
    let mut text = Vec::new();
    let mut bounded = info.take(4096);
    match tokio::time::timeout(crate::nshelper::HELPER_DEADLINE, bounded.read_to_end(&mut text)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(Unprepared::InfoPipe(e)),
        Err(_) => return Err(Unprepared::PidLate),
    }
    serde_json::from_slice::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("child-pid").and_then(|p| p.as_i64()))
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or(Unprepared::NoPid)
}

/// Write the byte bubblewrap waits for at `--block-fd`.
fn release_payload(release: &OwnedFd) -> Result<(), Unprepared> {
    match nix::unistd::write(release, b"1") {
        Ok(1) => Ok(()),
        Ok(_) => Err(Unprepared::NotReleased),
        Err(e) => Err(Unprepared::Release(e)),
    }
}

/// The `held` mounts being made while the payload starts (see
/// [`prepare_then_mask`]).
pub type Masking = tokio::task::JoinHandle<Result<(), Unprepared>>;

/// [`prepare_inside`] for a payload that runs nothing it is sent before
/// it is sent something: the python worker, which only starts the
/// interpreter and reports ready until its first request. Its limits are
/// set and the helper's `steps` run as there; then it is released at once,
/// and the `held` mounts are made while it starts (they still wait for
/// bubblewrap's own, which bubblewrap makes before it reads the release).
/// The caller sends the payload nothing until the returned task has ended
/// well, and kills the sandbox when it has not. A payload that runs what
/// it was given from its start (a shell command) waits for the mounts:
/// [`prepare_inside_with`].
pub async fn prepare_then_mask(
    info: OwnedFd,
    release: &OwnedFd,
    limits: &[(Resource, u64)],
    held: crate::nshelper::masks::Held,
    steps: Vec<crate::nshelper::Step>,
) -> Result<Masking, Unprepared> {
    let held = crate::nshelper::masks::prepare(&held)?;
    let pid = held_pid(info).await?;
    set_limits_of(pid, limits)?;
    if !steps.is_empty() {
        tokio::task::spawn_blocking(move || crate::nshelper::run(pid, &[crate::nshelper::Namespace::User], &steps))
            .await
            .map_err(Unprepared::HelperThread)??;
    }
    release_payload(release)?;
    Ok(tokio::task::spawn_blocking(move || -> Result<(), Unprepared> {
        crate::nshelper::masks::apply(pid, &held)?;
        Ok(())
    }))
}
