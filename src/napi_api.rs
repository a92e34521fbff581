//! The Node-facing layer: a `PythonSandbox` class over `session::Session`.
//!
//! Thin by design: it converts arguments and results and maps errors, in
//! this one place, to JS errors with a stable `code` (`InvalidArg` for bad
//! input). All behaviour lives in the plain Rust modules. Every string that
//! came from the sandbox leaves through `display`, here, so that no caller
//! of the addon gets a raw control character from it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use crate::display::{displayed, displayed_line};
use crate::grants::orchestrator::{Applied, Decision, Denial, Finished, GrantLoop};
use crate::grants::target::{GrantInputs, SessionCall};
use crate::grants::{Answer, Grants};
use crate::limits::*;
use crate::options::Settings;
use crate::outcome::{closing, render};
use crate::permissions::{self, MountConfig};
use crate::session::{Availability, Session, SessionOptions, SpareState, StatusReport};

/// Options for a new sandbox session.
#[napi(object)]
pub struct SandboxOptions {
    /// Host project directory, mounted at `/workspace`. Resolved with realpath
    /// when the sandbox starts.
    pub project_dir: String,
    /// Parent of the session's private directory (default
    /// `<os tmpdir>/pi-python-sandbox-<uid>`, created with mode 0700).
    pub runtime_root: Option<String>,
    /// Absolute path of the Python 3.10+ interpreter. Default:
    /// `$PI_PYTHON_TOOL_INTERPRETER`, else `/usr/bin/python3`. Never looked up
    /// on PATH.
    pub interpreter: Option<String>,
    /// Mount `/workspace` read-write (default false: read-only).
    pub workspace_writable: Option<bool>,
    /// Canonical host directories to mount read-only at their own paths.
    pub read_roots: Option<Vec<String>>,
    /// After the first execution keep a started spare sandbox, so that a
    /// reset, timeout or crash hands over to a ready interpreter. Default:
    /// on, unless `PI_SANDBOX_PREWARM` is `0`, `false`, `off` or `no`.
    pub prewarm: Option<bool>,
    /// Roll a failed call (timeout, cancel, output flood, the interpreter's
    /// death, a protocol violation) back to the interpreter's state from
    /// before it, and reset in the same sandbox. Default: on, unless
    /// `PI_PYTHON_TOOL_ROLLBACK` is `0`, `false`, `off` or `no`.
    pub rollback: Option<bool>,
    /// The user's Python packages: a virtualenv, or site directories,
    /// colon-separated; mounted read-only. Default `$PI_PYTHON_TOOL_VENV`.
    /// A user setting: never let the model choose it.
    pub python_packages: Option<String>,
    /// Also use the system's dist-packages. Default
    /// `$PI_PYTHON_TOOL_SYSTEM_SITE` = `1`.
    pub system_site_packages: Option<bool>,
}

#[napi(object)]
pub struct ExceptionResult {
    /// The exception class name, e.g. `ValueError`.
    #[napi(js_name = "type")]
    pub type_name: String,
    pub message: String,
    /// Formatted traceback without the worker's own frames (bounded).
    pub traceback: String,
}

/// An image the code produced (a matplotlib figure, `display(img)`, ...).
#[napi(object)]
pub struct ImageResult {
    /// `image/png` or `image/jpeg`.
    pub mime_type: String,
    /// Base64 of the image bytes.
    pub data: String,
    /// Where the image is saved inside the sandbox (under /scratch).
    pub sandbox_path: String,
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// e.g. `640x480 PNG, 23.1KB`.
    pub description: String,
}

#[napi(object)]
pub struct LogPaths {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

/// The result of one `execute` call. Its strings from the sandbox (output,
/// repr, exception, paths, notes, diagnostics) have every control character
/// shown as a visible stand-in, as `displayText` does; the log files keep
/// the raw bytes.
#[napi(object)]
pub struct ExecResult {
    /// `ok`, `runtime_error`, `permission_needed`, `timeout`, `cancelled`,
    /// `output_limit`, `worker_error` or `unavailable`.
    pub status: String,
    /// True for every status but `ok`.
    pub is_error: bool,
    /// The model-facing text, within 50 KiB and 2,000 lines.
    pub text: String,
    /// The call's time; after a read prompt, its runs and the wait.
    pub duration_ms: f64,
    /// Of `durationMs`, the time spent waiting for the user's answer to
    /// read prompts (0 without one).
    pub waited_ms: f64,
    /// Worker generation: 1 for the session's first interpreter, +1 per start.
    pub generation: f64,
    /// Interpreter state from before this call is gone.
    pub state_lost: bool,
    pub state_lost_reason: Option<String>,
    /// The call failed and the interpreter was rolled back to its state
    /// from right before it (see the README's Rollback).
    pub rolled_back: bool,
    /// The earlier state was discarded before this call ran (a mode
    /// change, a death while idle), and why; this call's state is kept.
    pub lost_before: Option<String>,
    /// repr() of the final expression, when it is not None (bounded to 8 KiB).
    pub repr: Option<String>,
    pub repr_truncated: bool,
    /// Captured stdout (head and tail when long; the log has all of it).
    pub stdout: String,
    pub stderr: String,
    /// Bytes written on each stream by this execution.
    pub stdout_bytes: f64,
    pub stderr_bytes: f64,
    /// `stdout`/`stderr` omit the middle of a long stream.
    pub excerpt_truncated: bool,
    pub exception: Option<ExceptionResult>,
    /// The path a read was refused for (`permission_needed`).
    pub permission_path: Option<String>,
    /// The refused read was a directory listing (its covering directory is
    /// the path itself).
    pub permission_is_dir: bool,
    /// The refused read was of a project file hidden as a secret (see the
    /// README's secret masks); `permissionPath` is its sandbox path.
    pub permission_secret: bool,
    pub output_limit_exceeded: bool,
    /// Host paths of this execution's stdout/stderr logs; a stream without
    /// output has no log file.
    pub log_paths: LogPaths,
    /// False when the output limit cut the logs short.
    pub log_complete: bool,
    pub diagnostic: Option<String>,
    /// Images for the model (at most 4 per execution).
    pub images: Vec<ImageResult>,
    /// Notes about rich output (images not sent, ...).
    pub notes: Vec<String>,
}

#[napi(object)]
pub struct Limits {
    pub max_code_bytes: u32,
    pub default_timeout_seconds: u32,
    pub max_timeout_seconds: u32,
    pub startup_deadline_seconds: u32,
    pub cleanup_deadline_seconds: u32,
    pub output_budget_bytes: u32,
    pub max_repr_bytes: u32,
    pub max_frame_bytes: u32,
    pub rlimit_as_bytes: f64,
    pub rlimit_fsize_bytes: f64,
    pub rlimit_nofile: u32,
    /// Sizes of `/tmp` and `/dev/shm` (RAM the sandbox can hold beyond one
    /// process's life); absent when `PI_SANDBOX_TMP_SIZE` or
    /// `PI_SANDBOX_SHM_SIZE` is not a size.
    pub tmp_size_bytes: Option<f64>,
    pub shm_size_bytes: Option<f64>,
    pub core_dumps: String,
    pub note: String,
}

/// What caps one sandbox's totals (see `contain` and `scratch`).
#[napi(object)]
pub struct Containment {
    /// What caps its tasks: `cgroup-v2`, `cgroup-v1`, `rlimit-nproc` or
    /// `none` (not contained).
    pub tasks: String,
    /// What caps its memory: `cgroup-v2`, `cgroup-v1` or `none`.
    pub memory: String,
    /// The caps (`PI_SANDBOX_MAX_TASKS`, `PI_SANDBOX_MAX_MEMORY`);
    /// absent when the setting is not one.
    pub max_tasks: Option<f64>,
    pub max_memory_bytes: Option<f64>,
    /// Why each better mechanism is not used on this host.
    pub not_used: Vec<String>,
    /// /scratch at the last check (absent before the first), a lower bound
    /// when `scratchComplete` is false; the note threshold.
    pub scratch_bytes: Option<f64>,
    pub scratch_complete: bool,
    pub scratch_note_bytes: f64,
    /// The containment line of `text`.
    pub text: String,
}

#[napi(object)]
pub struct SandboxPaths {
    pub project_dir: String,
    pub sandbox_project: String,
    pub scratch_dir: Option<String>,
    pub sandbox_scratch: String,
    pub log_dir: Option<String>,
}

#[napi(object)]
pub struct BwrapInfo {
    pub path: String,
    pub version: String,
    pub setuid: bool,
}

/// What `status()` reports. Starts nothing.
#[napi(object)]
pub struct StatusResult {
    /// `unverified` (nothing started yet), `available` or `unavailable`.
    pub available: String,
    pub diagnostic: Option<String>,
    pub worker_running: bool,
    /// An execution is in progress.
    pub busy: bool,
    pub generation: f64,
    pub executions: f64,
    pub runtime_version: Option<String>,
    pub last_reset_reason: Option<String>,
    pub disposed: bool,
    /// `read-only` or `read-write`.
    pub workspace_mode: String,
    pub read_roots: Vec<String>,
    /// Counts effective changes of mode or read roots.
    pub mount_epoch: f64,
    /// A permission-mode event has been applied.
    pub permissions_seen: bool,
    /// Directories whose reads the user denied in this session.
    pub denied_reads: Vec<String>,
    pub limits: Limits,
    pub paths: SandboxPaths,
    pub bwrap: Option<BwrapInfo>,
    /// Site directories of the user's Python packages.
    pub site_dirs: Vec<String>,
    /// Python package settings that were skipped, and why.
    pub python_notes: Vec<String>,
    /// Read roots of the last mode event that were not mounted, and why.
    pub skipped_roots: Vec<SkippedRoot>,
    /// Host secrets masked inside the mounted read roots.
    pub masked_host_secrets: Vec<String>,
    /// Paths allowed once, readable until the sandbox restarts.
    pub allowed_once: Vec<String>,
    /// Whether a spare sandbox is kept ready.
    pub prewarm: bool,
    /// Whether failed calls roll back (`PI_PYTHON_TOOL_ROLLBACK`, read at
    /// each sandbox start).
    pub rollback: bool,
    /// When the running interpreter last took a rollback point (ms since
    /// the epoch).
    pub last_rollback_point: Option<f64>,
    /// The spare sandbox: `none`, `starting` or `ready`.
    pub spare: String,
    /// How the running worker was loaded: `source` (compiled at start) or
    /// `bytecode` (compiled by an earlier sandbox); absent when none runs.
    pub worker_code: Option<String>,
    pub containment: Containment,
    /// Number of refusal rules in the seccomp filter (besides its allowlist).
    pub seccomp_rules: u32,
    /// Project paths kept read-only when /workspace is writable.
    pub protected_paths: Vec<String>,
    /// Sandbox paths the running (or last) sandbox hides as secrets.
    pub masked_paths: Vec<String>,
    /// The secret patterns the next start uses (empty: masking is off).
    pub secret_patterns: Vec<String>,
    /// The last start's project scan read every entry within its bounds
    /// (absent before a start).
    pub secret_scan_complete: Option<bool>,
    /// The report as text for the model.
    pub text: String,
}

#[napi(object)]
pub struct ResetResult {
    /// Host scratch directory (kept), if one was made.
    pub scratch_dir: Option<String>,
    pub text: String,
}

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Status::InvalidArg, msg.into())
}

/// A call id is an integer below 2^31 - 1 (the ids above are the addon's own).
pub(crate) fn call_id_of(id: f64) -> Result<u32> {
    if id.fract() == 0.0 && (0.0..(u32::MAX / 2) as f64).contains(&id) {
        Ok(id as u32)
    } else {
        Err(invalid(format!("callId must be an integer from 0 to {}; got {id}", u32::MAX / 2 - 1)))
    }
}

fn path_str(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

fn to_js(finished: Finished) -> ExecResult {
    use base64::Engine;
    let o = finished.outcome;
    let mut text = render(&o);
    let mut diagnostic = closing(&o);
    // Why the grant loop stopped at a denial: told after the result's own text.
    if let Some(why) = finished.diagnostic.map(displayed) {
        if diagnostic.as_deref().map(|d| displayed(d.to_string())).as_deref() != Some(why.as_str()) {
            text = format!("{text}\n\n{why}");
        }
        diagnostic = Some(why);
    }
    let join = |s: &crate::outcome::StreamText| {
        if s.omitted == 0 {
            format!("{}{}", s.head, s.tail)
        } else {
            format!("{}\n...[{} bytes omitted]...\n{}", s.head, s.omitted, s.tail)
        }
    };
    ExecResult {
        status: o.status.as_str().into(),
        is_error: o.status.is_failure(),
        text,
        duration_ms: o.duration_ms as f64,
        waited_ms: o.waited_ms as f64,
        generation: o.generation as f64,
        state_lost: o.state_lost(),
        state_lost_reason: o.state_lost_reason.clone().map(displayed),
        rolled_back: o.rolled_back(),
        lost_before: o.lost_before.clone().map(displayed),
        repr: o.repr.clone().map(displayed),
        repr_truncated: o.repr_truncated,
        stdout: displayed(join(&o.stdout)),
        stderr: displayed(join(&o.stderr)),
        stdout_bytes: o.stdout.total as f64,
        stderr_bytes: o.stderr.total as f64,
        excerpt_truncated: o.stdout.omitted > 0 || o.stderr.omitted > 0,
        exception: o.exception.map(|e| ExceptionResult {
            type_name: displayed_line(e.type_name),
            message: displayed(e.message),
            traceback: displayed(e.traceback),
        }),
        permission_path: o.permission_path.map(displayed_line),
        permission_is_dir: o.permission_is_dir,
        permission_secret: o.permission_secret,
        output_limit_exceeded: o.output_limit_exceeded,
        log_paths: LogPaths {
            stdout: o.log_paths.stdout.as_deref().map(path_str),
            stderr: o.log_paths.stderr.as_deref().map(path_str),
        },
        log_complete: o.log_complete,
        diagnostic: diagnostic.map(displayed),
        images: o
            .images
            .iter()
            .map(|i| ImageResult {
                mime_type: displayed_line(i.mime.clone()),
                data: base64::engine::general_purpose::STANDARD.encode(&i.data),
                sandbox_path: displayed_line(i.sandbox_path.clone()),
                width: i.width,
                height: i.height,
                description: displayed_line(i.describe()),
            })
            .collect(),
        notes: o.notes.into_iter().map(displayed_line).collect(),
    }
}

/// The sandbox's limits (the same as `status().limits`), without a
/// session: the one source the TypeScript wrapper reads its bounds from.
#[napi]
#[allow(dead_code)] // called from JS only
pub fn sandbox_limits() -> Limits {
    limits(&Settings::from_env())
}

/// What the tool's description tells the model about the settings a new
/// sandbox starts with (read from the environment now).
#[napi(object)]
pub struct ToolSettings {
    /// Failed calls roll back (`PI_PYTHON_TOOL_ROLLBACK`).
    pub rollback: bool,
    /// Packages beyond the standard library are mounted
    /// (`PI_PYTHON_TOOL_VENV`, `PI_PYTHON_TOOL_SYSTEM_SITE`).
    pub python_packages: bool,
}

/// The settings the tool's description is built from.
#[napi]
#[allow(dead_code)] // called from JS only
pub fn tool_settings() -> ToolSettings {
    let s = Settings::from_env();
    ToolSettings {
        rollback: s.rollback,
        python_packages: s.venv.is_some_and(|v| !v.trim().is_empty()) || s.system_site,
    }
}

fn limits(settings: &Settings) -> Limits {
    Limits {
        max_code_bytes: MAX_CODE_BYTES as u32,
        default_timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
        max_timeout_seconds: MAX_TIMEOUT_SECONDS,
        startup_deadline_seconds: STARTUP_DEADLINE.as_secs() as u32,
        cleanup_deadline_seconds: CLEANUP_DEADLINE.as_secs() as u32,
        output_budget_bytes: OUTPUT_BUDGET_BYTES as u32,
        max_repr_bytes: MAX_REPR_BYTES as u32,
        max_frame_bytes: MAX_FRAME_BYTES as u32,
        rlimit_as_bytes: RLIMIT_AS_BYTES as f64,
        rlimit_fsize_bytes: RLIMIT_FSIZE_BYTES as f64,
        rlimit_nofile: RLIMIT_NOFILE as u32,
        tmp_size_bytes: settings.tmpfs.as_ref().ok().map(|s| s.tmp as f64),
        shm_size_bytes: settings.tmpfs.as_ref().ok().map(|s| s.shm as f64),
        core_dumps: "disabled".into(),
        note: "Per-process and per-file limits, per-execution budgets, and sizes for /tmp and /dev/shm; the sandbox's \
      total tasks and memory are capped where status().containment says so; /scratch is not capped."
            .into(),
    }
}

fn containment(settings: &Settings, scratch: Option<crate::scratch::Measure>) -> Containment {
    let plan = crate::contain::host_plan();
    Containment {
        tasks: plan.tasks.name().into(),
        memory: plan.memory.name().into(),
        max_tasks: settings.caps.as_ref().ok().map(|c| c.tasks as f64),
        max_memory_bytes: settings.caps.as_ref().ok().map(|c| c.memory as f64),
        not_used: plan.why.iter().cloned().map(displayed).collect(),
        scratch_bytes: scratch.map(|m| m.bytes as f64),
        scratch_complete: scratch.is_some_and(|m| m.complete),
        scratch_note_bytes: settings.scratch_note as f64,
        text: displayed(crate::contain::describe(plan, &settings.caps)),
    }
}

fn status_to_js(r: StatusReport) -> StatusResult {
    // What the next sandbox start would get.
    let settings = Settings::from_env();
    let (available, diagnostic) = match &r.availability {
        Availability::Unverified => ("unverified", None),
        Availability::Available => ("available", None),
        Availability::Unavailable(d) => ("unavailable", Some(displayed(d.clone()))),
    };
    let mode = if r.mounts.workspace_writable { "read-write" } else { "read-only" };
    let scratch = r.dirs.as_ref().map(|d| path_str(&d.scratch));
    let logs = r.dirs.as_ref().map(|d| path_str(&d.logs));
    let roots: Vec<String> = r.mounts.read_roots.iter().map(|p| path_str(p)).collect();
    let protected = crate::protected::describe(&settings.protected);
    let seccomp_rules = crate::seccomp::rules().len();
    // The worker's ready frame, the host's probes and the paths: any can hold anything.
    let text = displayed(crate::outcome::status_text(&r, &settings));
    StatusResult {
        seccomp_rules: seccomp_rules as u32,
        protected_paths: protected,
        masked_paths: r
            .masks
            .as_ref()
            .map(|m| m.sandbox_paths().into_iter().map(displayed_line).collect())
            .unwrap_or_default(),
        secret_patterns: if settings.secrets.is_empty() { Vec::new() } else { settings.secrets.describe() },
        secret_scan_complete: r.masks.as_ref().filter(|m| !m.off).map(|m| m.complete),
        available: available.into(),
        diagnostic,
        worker_running: r.worker_running,
        busy: r.busy,
        generation: r.generation as f64,
        executions: r.executions as f64,
        runtime_version: r.runtime_version.map(displayed_line),
        last_reset_reason: r.last_reset_reason.map(|r| displayed(r.to_string())),
        disposed: r.disposed,
        workspace_mode: mode.into(),
        read_roots: roots,
        mount_epoch: r.mount_epoch as f64,
        permissions_seen: r.permissions_seen,
        denied_reads: r.denied_reads.iter().map(|p| path_str(p)).collect(),
        limits: limits(&settings),
        containment: containment(&settings, r.scratch),
        paths: SandboxPaths {
            project_dir: path_str(&r.project_dir),
            sandbox_project: "/workspace".into(),
            scratch_dir: scratch,
            sandbox_scratch: "/scratch".into(),
            log_dir: logs,
        },
        site_dirs: r.site_dirs.iter().map(|p| path_str(p)).collect(),
        python_notes: r.python_notes.iter().cloned().map(displayed_line).collect(),
        skipped_roots: r
            .skipped_roots
            .iter()
            .map(|s| SkippedRoot { root: displayed_line(s.root.clone()), reason: displayed_line(s.reason.to_string()) })
            .collect(),
        masked_host_secrets: r.masked.iter().map(|m| path_str(&m.path)).collect(),
        allowed_once: r
            .mounts
            .once
            .iter()
            .map(|m| path_str(&m.path))
            .chain(r.mounts.unmasked_once.iter().map(|p| path_str(p)))
            .collect(),
        prewarm: r.prewarm,
        rollback: r.rollback,
        last_rollback_point: r
            .last_rollback_point
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as f64),
        spare: match r.spare {
            SpareState::None => "none",
            SpareState::Starting => "starting",
            SpareState::Ready => "ready",
        }
        .into(),
        worker_code: r.worker_code.map(String::from),
        bwrap: r.bwrap.map(|b| BwrapInfo {
            path: path_str(&b.path),
            version: format!("{}.{}.{}", b.version.0, b.version.1, b.version.2),
            setuid: b.setuid,
        }),
        text,
    }
}

#[napi(object)]
pub struct SkippedRoot {
    pub root: String,
    pub reason: String,
}

/// What applying a `tool-permissions:mode` payload did.
#[napi(object)]
pub struct ModeChange {
    /// The payload was an object and was applied.
    pub applied: bool,
    /// The mounts changed.
    pub changed: bool,
    /// A running interpreter was killed for it.
    pub discarded: bool,
    /// What to tell the user, when something changed.
    pub notification: Option<String>,
    pub workspace_mode: String,
    pub read_roots: Vec<String>,
    pub skipped: Vec<SkippedRoot>,
}

/// The user's answer to a read prompt about `path` (`isDirectory`: the
/// code listed a directory): `allow`, `deny`, `timeout`, `aborted` or
/// `shutdown`; anything else, or a rejection, counts as `aborted`.
type AskFn = ThreadsafeFunction<FnArgs<(String, bool)>, Promise<String>, FnArgs<(String, bool)>, Status, false>;

/// What an answer to a read prompt does.
#[napi(object)]
pub struct ReadAnswer {
    /// Run the code again (the sandbox now has the path).
    pub replay: bool,
    /// Why not, or what the replay will say (when `replay` is false).
    pub diagnostic: Option<String>,
}

/// What one pi session remembers across its sandboxes: the last
/// `tool-permissions:mode` event, the denied reads, the prompts nobody
/// waits for any more. Give the same one to every `PythonSandbox` of a pi
/// session; each sandbox without one has its own.
#[napi]
pub struct ToolPermissions {
    grants: Arc<Grants>,
}

#[napi]
impl ToolPermissions {
    #[napi(constructor)]
    pub fn new() -> Self {
        ToolPermissions { grants: Arc::default() }
    }

    /// Store a mode payload that arrived while no sandbox exists (it is
    /// applied when one is made). Returns whether it was an object.
    #[napi]
    pub fn set_mode(&self, payload: serde_json::Value) -> bool {
        match permissions::parse_mode_event(&payload) {
            Some(event) => {
                self.grants.set_mode(event);
                true
            }
            None => false,
        }
    }

    /// A mode event has been seen.
    #[napi(getter)]
    pub fn has_mode(&self) -> bool {
        self.grants.mode().is_some()
    }

    /// Forget everything (the pi session ended).
    #[napi]
    pub fn clear(&self) {
        self.grants.clear();
    }
}

impl Default for ToolPermissions {
    fn default() -> Self {
        Self::new()
    }
}

/// What to do about a read outside the mounts.
#[napi(object)]
pub struct ReadVerdict {
    /// Ask the user (through pi-tool-permissions).
    pub prompt: bool,
    /// Why the read is refused without asking (when `prompt` is false).
    pub diagnostic: Option<String>,
}

/// `text` made safe to show in a terminal: C0 controls but tab and newline
/// as control pictures (U+2400 + code), DEL as U+2421, C1 and bidi controls
/// as `<U+202E>`, CRLF as LF. The rule the addon applies to everything from
/// the sandbox, for JS to apply to what it shows.
#[napi]
#[allow(dead_code)] // called from JS only
pub fn display_text(text: String) -> String {
    displayed(text)
}

/// `text` as one line: as `displayText`, and tab, newline and CR shown as
/// `␉`, `␊` and `␍` too. For a name, a path or a note from the sandbox in a
/// notification, a prompt or a status line.
#[napi]
#[allow(dead_code)] // called from JS only
pub fn display_line(text: String) -> String {
    displayed_line(text)
}

/// Kill every sandbox and delete every session directory of this process,
/// synchronously. For `process.on("exit")`: a `process.exit()` skips the
/// addon's own environment cleanup.
#[napi]
#[allow(dead_code)] // called from JS only
pub fn cleanup_all() {
    crate::session::cleanup_all();
}

/// Progress of a running execution (about twice a second); the tails are
/// shown as `displayText` does.
#[napi(object)]
pub struct ExecProgress {
    pub elapsed_ms: f64,
    pub stdout_bytes: f64,
    pub stderr_bytes: f64,
    /// The latest stdout (up to 2 KiB).
    pub stdout_tail: String,
    pub stderr_tail: String,
}

static EXIT_HOOK: AtomicBool = AtomicBool::new(false);

/// A persistent Python interpreter in a bubblewrap + seccomp sandbox.
/// Nothing starts until the first `execute`.
#[napi]
pub struct PythonSandbox {
    session: Arc<Session>,
    grants: Arc<Grants>,
    grant_loop: GrantLoop,
}

impl PythonSandbox {
    /// The session (for the bash tool's entry points, `napi_shell`).
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The grant loop's view of the session (for a decision, no call).
    fn target(&self) -> SessionCall<'_> {
        SessionCall { session: &self.session, code: String::new(), timeout_seconds: 0, call_id: None, progress: None }
    }

    /// Mount what `event` asks for. `current`: the mounts before (for the
    /// late-answer check). Returns the plan, the mounts wanted, what
    /// `set_mounts` did, and the abandoned prompt a late grant answered.
    fn apply(
        &self,
        event: permissions::ModeEvent,
        current: Option<&MountConfig>,
    ) -> (permissions::MountPlan, MountConfig, Option<bool>, Option<PathBuf>) {
        let inputs = GrantInputs::of(&self.session);
        let ctx = inputs.ctx();
        let plan = permissions::plan_mounts(&event.read_roots, &ctx, |p| ctx.resolve(p));
        let wanted = MountConfig {
            workspace_writable: event.writable,
            read_roots: plan.roots(),
            unmasked: plan.unmasked.clone(),
            ..MountConfig::default()
        };
        let added: Vec<PathBuf> = match current {
            Some(c) => wanted.read_roots.iter().filter(|r| !c.read_roots.contains(r)).cloned().collect(),
            None => Vec::new(),
        };
        let late = if added.is_empty() { None } else { self.grants.take_late(&added) };
        let reason = late.as_ref().map(|p| {
            format!(
                "the sandbox was restarted for a late answer to the read prompt about {}: a grant that came after the \
                 call had stopped waiting",
                crate::display::one_line(&p)
            )
        });
        let masked = plan.mounted.iter().flat_map(|m| m.masked.clone()).collect();
        self.session.record_plan(plan.skipped.clone(), masked);
        let result = self.session.set_mounts_because(wanted.clone(), reason);
        (plan, wanted, result, late)
    }
}

#[napi]
impl PythonSandbox {
    /// `permissions`: the pi session's [`ToolPermissions`]; its last mode
    /// event, if any, sets the mounts (over `workspaceWritable` and
    /// `readRoots`).
    #[napi(constructor)]
    pub fn new(env: Env, options: SandboxOptions, permissions: Option<&ToolPermissions>) -> Result<Self> {
        if !options.project_dir.starts_with('/') {
            return Err(invalid("projectDir must be an absolute path"));
        }
        if options.runtime_root.as_deref().is_some_and(|r| !r.starts_with('/')) {
            return Err(invalid("runtimeRoot must be an absolute path"));
        }
        if !EXIT_HOOK.swap(true, Ordering::SeqCst) {
            // Best effort: kill sandboxes and delete session directories when
            // the Node environment shuts down.
            env.add_env_cleanup_hook((), |_| crate::session::cleanup_all())?;
        }
        let session = Session::new(SessionOptions {
            project_dir: PathBuf::from(options.project_dir),
            runtime_root: options.runtime_root.map(PathBuf::from),
            interpreter: options.interpreter,
            mounts: MountConfig {
                workspace_writable: options.workspace_writable.unwrap_or(false),
                read_roots: options.read_roots.unwrap_or_default().into_iter().map(PathBuf::from).collect(),
                ..MountConfig::default()
            },
            prewarm: options.prewarm,
            rollback: options.rollback,
            python_packages: options.python_packages,
            system_site_packages: options.system_site_packages,
            guard_inotify: None,
        });
        let grants = permissions.map(|p| p.grants.clone()).unwrap_or_default();
        let sandbox = PythonSandbox { grant_loop: GrantLoop::new(grants.clone()), session, grants };
        if let Some(event) = sandbox.grants.mode() {
            sandbox.apply(event, None);
        }
        Ok(sandbox)
    }

    /// Run `code` in the session's interpreter. `timeoutSeconds` is an
    /// integer 1-120 (default 30). `callId` names the call for `cancel()`.
    /// `onProgress` is called about twice a second while the code runs.
    /// With `ask`, a read the sandbox refuses goes through the grant loop:
    /// it is refused at once or asked about with `ask(path, isDirectory)`
    /// (`hasUi` false: there is nobody to ask; default true), the answer
    /// is applied, and the call runs again when a grant came; without it,
    /// the result is `permission_needed` (see `readDecision`).
    /// Rejects (code `InvalidArg`) on bad input without touching the
    /// interpreter; every other failure is a result with a failure status.
    #[napi(
        ts_args_type = "code: string, timeoutSeconds?: number | undefined | null, callId?: number | undefined | null, \
                        onProgress?: ((arg: ExecProgress) => void) | undefined | null, ask?: ((path: string, \
                        isDirectory: boolean) => Promise<string>) | undefined | null, hasUi?: boolean | undefined | null"
    )]
    pub async fn execute(
        &self,
        code: String,
        timeout_seconds: Option<f64>,
        call_id: Option<f64>,
        on_progress: Option<ThreadsafeFunction<ExecProgress, (), ExecProgress, Status, false, true>>,
        ask: Option<AskFn>,
        has_ui: Option<bool>,
    ) -> Result<ExecResult> {
        if code.len() > MAX_CODE_BYTES {
            return Err(invalid(format!(
                "Code exceeds the {} KiB UTF-8 limit ({} bytes).",
                MAX_CODE_BYTES / 1024,
                code.len()
            )));
        }
        let timeout = match timeout_seconds {
            None => DEFAULT_TIMEOUT_SECONDS,
            Some(t) if t.fract() == 0.0 && (MIN_TIMEOUT_SECONDS as f64..=MAX_TIMEOUT_SECONDS as f64).contains(&t) => {
                t as u32
            }
            Some(_) => return Err(invalid("timeoutSeconds must be an integer between 1 and 120.")),
        };
        let progress: Option<crate::outcome::ProgressFn> = on_progress.map(|f| {
            let f = Arc::new(f);
            Arc::new(move |p: crate::outcome::Progress| {
                f.call(
                    ExecProgress {
                        elapsed_ms: p.elapsed_ms as f64,
                        stdout_bytes: p.stdout_bytes as f64,
                        stderr_bytes: p.stderr_bytes as f64,
                        stdout_tail: displayed(p.stdout_tail),
                        stderr_tail: displayed(p.stderr_tail),
                    },
                    ThreadsafeFunctionCallMode::NonBlocking,
                );
            }) as crate::outcome::ProgressFn
        });
        let call_id = call_id.map(call_id_of).transpose()?;
        let call = SessionCall { session: &self.session, code, timeout_seconds: timeout, call_id, progress };
        let Some(ask) = ask else {
            return Ok(to_js(Finished { outcome: self.grant_loop.run_once(&call).await, diagnostic: None }));
        };
        let ask = Arc::new(ask);
        let asking = |d: &Denial| {
            let (ask, path, is_dir) = (ask.clone(), displayed_line(d.path.clone()), d.is_directory);
            async move {
                let answer = match ask.call_async_catch(FnArgs::from((path, is_dir))).await {
                    Ok(promise) => promise.await.ok(),
                    Err(_) => None,
                };
                answer.as_deref().and_then(Answer::parse).unwrap_or(Answer::Aborted)
            }
        };
        Ok(to_js(self.grant_loop.run(&call, has_ui.unwrap_or(true), asking).await))
    }

    /// Cancel the call named `callId` (queued or running), or the running
    /// call when omitted: its sandbox is killed. Returns whether anything
    /// was targeted.
    #[napi]
    pub fn cancel(&self, call_id: Option<f64>) -> Result<bool> {
        let call_id = call_id.map(call_id_of).transpose()?;
        Ok(self.session.cancel(call_id))
    }

    /// Apply a `tool-permissions:mode` payload `{ mode, readRoots }`:
    /// edits/auto/yolo mount /workspace read-write, anything else read-only;
    /// read roots are resolved and filtered. An effective change kills the
    /// running sandbox; the next execution starts with the new mounts.
    #[napi]
    pub fn apply_mode_event(&self, payload: serde_json::Value) -> ModeChange {
        let current = self.session.status().mounts;
        let Some(event) = permissions::parse_mode_event(&payload) else {
            return ModeChange {
                applied: false,
                changed: false,
                discarded: false,
                notification: None,
                workspace_mode: if current.workspace_writable { "read-write" } else { "read-only" }.into(),
                read_roots: current.read_roots.iter().map(|p| path_str(p)).collect(),
                skipped: vec![],
            };
        };
        self.grants.set_mode(event.clone());
        let (plan, wanted, result, late) = self.apply(event, Some(&current));
        let mut notification =
            result.and_then(|discarded| permissions::change_notification(&current, &wanted, &plan, discarded));
        if let (Some(note), Some(late)) = (notification.as_mut(), late) {
            note.push_str(&displayed_line(format!(
                " — this came from a late answer to the prompt about {}, which the call had stopped waiting for",
                crate::display::one_line(&late)
            )));
        }
        ModeChange {
            applied: true,
            changed: result.is_some(),
            discarded: result == Some(true),
            notification,
            workspace_mode: if wanted.workspace_writable { "read-write" } else { "read-only" }.into(),
            read_roots: wanted.read_roots.iter().map(|p| path_str(p)).collect(),
            skipped: plan
                .skipped
                .into_iter()
                .map(|s| SkippedRoot { root: displayed_line(s.root), reason: displayed_line(s.reason.to_string()) })
                .collect(),
        }
    }

    /// What the mode event in force did to this sandbox, for the user at
    /// the start of a pi session (the event may have come before it).
    /// `None` when it leaves the defaults.
    #[napi]
    pub fn mode_report(&self) -> Option<String> {
        let report = self.session.status();
        let event = self.grants.mode()?;
        let inputs = GrantInputs::of(&self.session);
        let ctx = inputs.ctx();
        let plan = permissions::plan_mounts(&event.read_roots, &ctx, |p| ctx.resolve(p));
        let note = permissions::change_notification(&MountConfig::default(), &report.mounts, &plan, false)?;
        Some(note.replacen("python sandbox: ", "python sandbox (from pi-tool-permissions at start): ", 1))
    }

    /// Decide about a read of `path` that the sandbox refused: prompt the
    /// user, or refuse at once (earlier denial, no permission extension, no
    /// UI). The grant loop of `execute` with `ask` does this itself.
    #[napi]
    pub fn read_decision(&self, path: String, has_ui: bool) -> ReadVerdict {
        let denial = Denial { path, is_directory: false, secret: false };
        match self.grant_loop.decide(&self.target(), &denial, has_ui) {
            Decision::Ask => ReadVerdict { prompt: true, diagnostic: None },
            Decision::Refuse(why) => ReadVerdict { prompt: false, diagnostic: Some(displayed(why)) },
        }
    }

    /// Hand over the answer to the prompt `readDecision` opened for `path`
    /// (`isDir`: the code listed a directory): `allow`, `deny`, `timeout`,
    /// `aborted` or `shutdown`. An allow that came with a mode event
    /// mounting the path replays the call; an allow without one mounts
    /// exactly `path` for the next sandbox only ("allow once"); anything
    /// else is remembered as a denial of its directory. After a replay the
    /// next `execute` says why it ran on a new sandbox.
    #[napi]
    pub fn answer_read(&self, path: String, is_dir: bool, outcome: String) -> Result<ReadAnswer> {
        let answer = Answer::parse(&outcome)
            .ok_or_else(|| invalid("outcome must be allow, deny, timeout, aborted or shutdown"))?;
        let denial = Denial { path, is_directory: is_dir, secret: false };
        Ok(match self.grant_loop.apply(&self.target(), &denial, answer) {
            Applied::Granted(grant) => {
                self.grant_loop.note_for_next_run(grant.rerun_note(&denial.path));
                ReadAnswer { replay: true, diagnostic: None }
            }
            Applied::Stop(why) => ReadAnswer { replay: false, diagnostic: Some(displayed(why)) },
        })
    }

    /// Remember a denied read for the session; returns the diagnostic for
    /// the result. `why` is e.g. "denied by the user" or "no answer in 30 s".
    #[napi]
    pub fn record_denied(&self, path: String, is_dir: bool, why: String) -> String {
        if let Some(p) = permissions::normalize(&path) {
            self.grants.deny(permissions::covering_dir(&p, is_dir));
        }
        permissions::denied_diagnostic(&path, &why)
    }

    /// Kill the sandbox and discard interpreter state; scratch files stay.
    /// The next `execute` starts a fresh interpreter.
    #[napi]
    pub async fn reset(&self) -> Result<ResetResult> {
        let (dirs, done, notes) = self.session.reset().await;
        let text = displayed(crate::outcome::reset_text(dirs.as_ref(), done, &notes));
        Ok(ResetResult { scratch_dir: dirs.map(|d| path_str(&d.scratch)), text })
    }

    /// Readiness, generation, limits and paths. Starts nothing, never waits.
    #[napi]
    pub fn status(&self) -> StatusResult {
        let mut report = self.session.status();
        report.denied_reads = self.grants.denied();
        report.permission_mode = self.grants.mode().and_then(|m| m.mode);
        status_to_js(report)
    }

    /// Kill the sandbox and delete the session's scratch and log
    /// directories. Idempotent; later calls answer `unavailable`. Resolves
    /// with notes for the user: protected names that the last check of a
    /// writable project made inert, and how to restore them.
    #[napi]
    pub async fn dispose(&self, reason: Option<String>) -> Result<Vec<String>> {
        Ok(self
            .session
            .dispose(reason.as_deref().unwrap_or("disposed"))
            .await
            .into_iter()
            .map(displayed_line)
            .collect())
    }
}
