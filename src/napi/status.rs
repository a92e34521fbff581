//! What `status()` reports, the limits and containment in it, and the
//! settings the tool's description is built from.

use napi_derive::napi;

use super::path_str;
use super::permissions::SkippedRoot;
use crate::display::{displayed, displayed_line};
use crate::limits::*;
use crate::options::Settings;
use crate::outcome::{AvailableState, ResetReason, WorkspaceMode};
use crate::session::{Availability, SpareState, StatusReport};
use crate::worker::CodeForm;

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
    /// `unverified` (nothing started yet), `available` or `unavailable`
    /// (the diagnostic says why).
    pub available: AvailableState,
    pub diagnostic: Option<String>,
    pub worker_running: bool,
    /// An execution is in progress.
    pub busy: bool,
    pub generation: f64,
    pub executions: f64,
    pub runtime_version: Option<String>,
    /// Why the interpreter was last discarded.
    pub last_reset_reason: Option<ResetReason>,
    pub disposed: bool,
    /// `read-only` or `read-write`: how the running sandbox has the
    /// project (read-only where the mode allows writes but the project
    /// could not be protected, as the text says).
    pub workspace_mode: WorkspaceMode,
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
    pub spare: SpareState,
    /// How the running worker was loaded: `source` (compiled at start) or
    /// `bytecode` (compiled by an earlier sandbox); absent when none runs.
    pub worker_code: Option<CodeForm>,
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
    /// How many lines of `text` are its short part (those before the
    /// `details:` line): what the TUI shows collapsed and `/sandbox` shows.
    pub summary_lines: u32,
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

pub(super) fn status_to_js(r: StatusReport) -> StatusResult {
    // What the next sandbox start would get.
    let settings = Settings::from_env();
    let (available, workspace_mode) = (r.availability.state(), r.workspace_mode());
    let diagnostic = match &r.availability {
        Availability::Unverified | Availability::Available => None,
        Availability::Unavailable(d) => Some(displayed(d.clone())),
    };
    let scratch = r.dirs.as_ref().map(|d| path_str(&d.scratch));
    let logs = r.dirs.as_ref().map(|d| path_str(&d.logs));
    let roots: Vec<String> = r.mounts.read_roots.iter().map(|p| path_str(p)).collect();
    let protected = crate::protected::describe(&settings.protected);
    let seccomp_rules = crate::seccomp::rules().len();
    // The worker's ready frame, the host's probes and the paths: any can hold anything.
    let (text, summary_lines) = crate::outcome::status_text_and_summary(&r, &settings);
    let text = displayed(text);
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
        available,
        diagnostic,
        worker_running: r.worker_running,
        busy: r.busy,
        generation: r.history.generation as f64,
        executions: r.history.executions as f64,
        runtime_version: r.runtime_version.map(displayed_line),
        last_reset_reason: r.history.last_reset_reason,
        disposed: r.disposed,
        workspace_mode,
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
            .history
            .last_rollback_point
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as f64),
        spare: r.spare,
        worker_code: r.worker_code,
        bwrap: r.bwrap.map(|b| BwrapInfo {
            path: path_str(&b.path),
            version: format!("{}.{}.{}", b.version.0, b.version.1, b.version.2),
            setuid: b.setuid,
        }),
        text,
        summary_lines: summary_lines as u32,
    }
}
