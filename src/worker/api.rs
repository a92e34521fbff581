//! What a worker is asked and what it answers: the stops, the progress,
//! the start's settings ([`Launch`]) and its failures, one call and how
//! it ended; and its network's proxy (served from the start, its summary
//! taken after each call). The rest of the worker's code is in its parent
//! module.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::contain::Contained;
use crate::frame::{CallRequest, ExecReport, FrameError, PROTOCOL_VERSION};
use crate::limits::STARTUP_DEADLINE;
use crate::permissions::MountConfig;
use crate::protected::{self, Guard};
use crate::secrets::MaskReport;

/// Why the session wants the operation in progress to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    Disposed,
    Cancelled,
    Remounted,
}

/// What can end a worker operation early: the session's wake channel, and
/// a check that says whether (and why) to stop when it fires.
pub struct Stop<'a> {
    pub wake: &'a mut watch::Receiver<u64>,
    pub check: &'a (dyn Fn() -> Option<Halt> + Send + Sync),
}

/// A running execution's progress, reported every `PROGRESS_EVERY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub elapsed_ms: u64,
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
    /// The latest output of each stream (a few KiB).
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// The latest output of both, in the order written, with the switch
    /// marks of [`crate::capture::Merged`].
    pub output_tail: String,
}

/// Receives progress reports; must not block.
pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// How a start failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The session stopped the start (cancel, dispose, mode change).
    #[error("the start was stopped ({0:?})")]
    Halted(Halt),
    /// A setting cannot be applied (the text says which and why).
    #[error(transparent)]
    Settings(#[from] crate::limits::SettingError),
    /// The start could not be prepared (the seccomp program, the plan).
    #[error("{0}")]
    Prepare(String),
    /// bubblewrap could not be executed at all.
    #[error("bubblewrap could not be started: {0}")]
    Spawn(std::io::Error),
    /// The sandbox ran but never reported ready; `stderr` is what it wrote
    /// there (bounded).
    #[error("{why}")]
    NotReady { why: NotReady, stderr: String },
}

/// Why a started sandbox never reported ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("the worker did not report ready within {}s", STARTUP_DEADLINE.as_secs())]
    Deadline,
    /// The sandbox ended (its exit status, if it was reaped in time).
    #[error("the sandbox ended")]
    Exited(Option<std::process::ExitStatus>),
    #[error("the worker speaks protocol {0}, not {PROTOCOL_VERSION}")]
    Protocol(u32),
    /// The worker said why it cannot serve (an error frame).
    #[error("{0}")]
    Refused(String),
    #[error("unexpected {0} frame before ready")]
    Unexpected(&'static str),
    #[error("bad frame: {0}")]
    BadFrame(String),
    #[error(transparent)]
    BadImage(BoxError),
}

impl StartError {
    /// The start failed because of what ran, not because it was stopped
    /// or could not be attempted (the bytecode fallback's test).
    pub fn is_worker_failure(&self) -> bool {
        matches!(self, StartError::NotReady { why, .. } if !matches!(why, NotReady::Deadline))
    }
}

/// How a running execution ended before producing a complete result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interrupt {
    Halted(Halt),
    Timeout,
    OutputLimit,
    Died,
    Violation(String),
}

/// One execution: its id, its code, the end mark of its output, its
/// deadline, and who hears its progress.
pub struct Call<'a> {
    pub seq: u64,
    pub code: &'a str,
    pub mark: &'a [u8],
    pub deadline: Instant,
    pub progress: Option<ProgressFn>,
}

/// What a finished execution gave: the worker's report, and whether the
/// phase after it (draining, the end marks) went cleanly.
pub struct ExecDone {
    pub report: ExecReport,
    pub after: Result<(), AfterResult>,
}

/// What went wrong after a call's result: the result is kept, the
/// interpreter is not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AfterResult {
    #[error("the worker exited")]
    Exited,
    #[error("unexpected {0} frame")]
    Unexpected(&'static str),
    #[error("{0}")]
    BadFrame(String),
}

/// What the ready frame said.
pub struct Ready {
    pub runtime_version: String,
    pub site_notes: Vec<String>,
    /// The worker's compiled form, when it was asked for (checked).
    pub image: Option<Vec<u8>>,
}

/// How the worker's code reached the sandbox, as `status().workerCode`
/// names it (the string union `CodeForm`).
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeForm {
    /// Compiled at the sandbox's start.
    Source,
    /// Compiled by an earlier sandbox.
    Bytecode,
}

impl CodeForm {
    pub fn as_str(self) -> &'static str {
        match self {
            CodeForm::Source => "source",
            CodeForm::Bytecode => "bytecode",
        }
    }
}

/// An error of the runtime's, carried through the worker unread.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The runtime's request frame for a call (framed, ready to write).
pub type RequestFn = Box<dyn Fn(CallRequest<'_>) -> Result<Vec<u8>, FrameError> + Send + Sync>;

/// The runtime's check of the compiled form the worker sends (as sent in
/// its frame): the image's bytes, or why they are not one.
pub type ImageCheck = fn(&str) -> Result<Vec<u8>, BoxError>;

/// Everything one start needs, decided by the caller.
pub struct Launch {
    pub bwrap: PathBuf,
    pub argv: Vec<OsString>,
    pub seccomp: OwnedFd,
    pub mount_fds: Vec<OwnedFd>,
    pub mounts: MountConfig,
    /// The host secrets masked in its read roots (see `hostsecrets`).
    pub host_masks: Vec<crate::hostsecrets::Mask>,
    /// The host secrets in force at the start (what `host_masks` came from).
    pub host_secrets: crate::hostsecrets::HostSecrets,
    /// Where a host secret could appear in its read roots while it runs.
    pub secret_watch: Vec<crate::hostsecrets::WatchPoint>,
    /// The watch that tells when the project's masks are stale.
    pub masks_watch: Option<Arc<protected::SecretWatch>>,
    pub guard: Option<Arc<Guard>>,
    pub plan_notes: Vec<String>,
    /// What the start masked (see `secrets`).
    pub masks: MaskReport,
    pub code: CodeForm,
    /// Ask the worker for its compiled form before it reports ready.
    pub emit_code: bool,
    /// How the runtime checks that form.
    pub check_image: ImageCheck,
    /// How the runtime phrases a call.
    pub request: RequestFn,
    /// The worker runs as the sandbox's PID 1 that keeps it across
    /// interpreters: failed calls roll back, a reset is fast.
    pub keeper: bool,
    /// The caps on the sandbox's tasks and memory (see `contain`).
    pub contained: Contained,
    /// The rlimits the host sets on the held sandbox before the payload
    /// runs (see `Policy::held_rlimits`).
    pub limits: Vec<(nix::sys::resource::Resource, u64)>,
    /// What the namespace helper mounts in the held sandbox before the
    /// payload runs (see `Policy::held_mounts`).
    pub held: crate::nshelper::masks::Held,
    /// What the namespace helper does in the sandbox's user namespace
    /// before the payload runs (its own inotify limits).
    pub inside: Vec<crate::nshelper::Step>,
    /// The guard's inotify instance, made before the sandbox (see
    /// `protected::Watcher`).
    pub watcher: Option<protected::Watcher>,
    /// What the host may spend on the sandbox's changes to the project
    /// (see `protected::budget`).
    pub budget: protected::BudgetLimits,
    /// The network through the host's proxy (`network.python`); none: no
    /// network at all.
    pub network: Option<PythonNetwork>,
}

/// The python tool's network (`network.python`): the proxy's policy and
/// the session's grants (those the user gave a bash command for the
/// session count here too).
#[derive(Clone)]
pub struct PythonNetwork {
    pub policy: crate::network::proxy::Policy,
    pub grants: crate::network::review::SessionGrants,
    /// The session's lists as the configuration now has them (read at
    /// each connection, so that `/sandbox allow` reaches a running sandbox).
    pub lists: crate::network::proxy::LiveLists,
}

/// The proxy serving a python sandbox's listener; it stops with the worker.
pub type Proxy =
    crate::network::proxy::Served<crate::network::decide::SystemResolver, Arc<crate::network::review::Desk>>;

/// Why no sandbox was started when its held start could not be prepared,
/// and what it would have let code do.
pub fn not_prepared(why: &crate::spawn::Unprepared) -> String {
    match why {
        crate::spawn::Unprepared::Limit { .. } => format!(
            "No sandbox was started: its own task and open-file limits could not be set ({why}); without them code \
             in it could start more tasks or hold more files than its caps allow"
        ),
        crate::spawn::Unprepared::Masks(_) => format!(
            "No sandbox was started: its /proc could not be hardened ({why}); without that code in it could read \
             the kernel's information files or write its host-wide settings"
        ),
        _ => format!(
            "No sandbox was started: its own inotify limits could not be set ({why}); without them code in it could \
             take every inotify instance of your user, the guard's among them"
        ),
    }
}

/// The worker's held start prepared: without a network, the worker is
/// released once its limits are set and its `/proc` masks are made while
/// it starts (`masking`: see [`crate::spawn::prepare_then_mask`]; no
/// request goes out before they are); with `network`, everything is made
/// before it is released ([`crate::spawn::prepare_inside`]), and the
/// proxy's listener too, in the sandbox's network namespace, served for as
/// long as the sandbox lives. A destination no entry (or session grant)
/// matches is reviewed by the reviewer of the call running (see
/// [`super::Worker::network_call_starts`]); between calls it is refused at
/// once. A listener that could not be made or served leaves the sandbox
/// with no network, and `notes` says why.
pub async fn prepare_with_network(
    info: OwnedFd,
    release: &OwnedFd,
    limits: &[(nix::sys::resource::Resource, u64)],
    held: crate::nshelper::masks::Held,
    steps: Vec<crate::nshelper::Step>,
    network: Option<PythonNetwork>,
    notes: &mut Vec<String>,
) -> Prepared {
    let Some(network) = network else {
        return match crate::spawn::prepare_then_mask(info, release, limits, held, steps).await {
            Ok(masking) => Prepared { prepared: Ok(()), proxy: None, masking: Some(masking) },
            Err(why) => Prepared { prepared: Err(why), proxy: None, masking: None },
        };
    };
    let listen = Some(crate::nshelper::listen::PROXY_PORT);
    let listener = match crate::spawn::prepare_inside_with(info, release, limits, held, steps, listen).await {
        Ok(listener) => listener,
        Err(why) => return Prepared { prepared: Err(why), proxy: None, masking: None },
    };
    let proxy = match (listener, network) {
        (Some(Ok(fd)), net) => match tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd)) {
            Ok(l) => {
                let desk = crate::network::review::Desk::new(None, net.grants);
                let resolver = crate::network::decide::SystemResolver;
                Some(crate::network::proxy::serve_live(l, net.policy, Some(net.lists), resolver, desk))
            }
            Err(e) => {
                notes.push(format!("The python tool has no network: its proxy could not serve its listener ({e})."));
                None
            }
        },
        (Some(Err(e)), _) => {
            notes.push(format!("The python tool has no network: {e}."));
            None
        }
        _ => None,
    };
    Prepared { prepared: Ok(()), proxy, masking: None }
}

/// Wait for the masks made while the worker started (see
/// [`crate::spawn::prepare_then_mask`]): their failure ends the start.
pub async fn masks_made(masking: crate::spawn::Masking) -> Result<(), StartError> {
    match masking.await.map_err(crate::spawn::Unprepared::HelperThread) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(why)) | Err(why) => Err(StartError::Prepare(not_prepared(&why))),
    }
}

/// What [`prepare_with_network`] made.
pub struct Prepared {
    /// Why the payload was not released, if it was not.
    pub prepared: Result<(), crate::spawn::Unprepared>,
    pub proxy: Option<Proxy>,
    /// The masks still being made (see [`crate::spawn::prepare_then_mask`]).
    pub masking: Option<crate::spawn::Masking>,
}

impl super::Worker {
    /// What its proxy allowed and refused since the last look (the end
    /// of the last call), worded as a bash command's network summary.
    pub fn take_network_notes(&self) -> Vec<String> {
        self.proxy.as_ref().map(|p| p.take_summary().lines()).unwrap_or_default()
    }

    /// A call starts: who reviews an unmatched destination during it
    /// (none: refused at once), and whether yolo allows it unreviewed.
    pub fn network_call_starts(&self, reviewing: crate::network::review::Reviewing) {
        if let Some(p) = &self.proxy {
            p.reviewer().call_starts(reviewing);
        }
    }

    /// The call ended: its open dialogs are cancelled, its grants "for
    /// this command" end.
    pub fn network_call_ended(&self) {
        if let Some(p) = &self.proxy {
            p.reviewer().between_calls();
        }
    }
}

/// What is left of a killed worker for the checks after it: its project
/// guard and its namespace's init.
pub struct Dead {
    pub guard: Option<Arc<Guard>>,
    pub init_pid: Option<i32>,
}
