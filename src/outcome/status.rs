//! What `status` and `reset` say: the session's report (a snapshot any
//! caller can take without waiting) and its text for the model.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Nothing was probed yet (no execution so far).
    Unverified,
    Available,
    Unavailable(String),
}

impl Availability {
    /// Which of the three it is, without the diagnostic.
    pub fn state(&self) -> AvailableState {
        match self {
            Availability::Unverified => AvailableState::Unverified,
            Availability::Available => AvailableState::Available,
            Availability::Unavailable(_) => AvailableState::Unavailable,
        }
    }
}

/// Whether a sandbox can start, as `status().available` names it. The
/// addon hands it to JavaScript as the string union `AvailableState`.
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvailableState {
    /// Nothing was started yet (no call so far).
    Unverified,
    Available,
    /// The diagnostic says why.
    Unavailable,
}

/// How the running sandbox has the project, as `status().workspaceMode`
/// names it (the string union `WorkspaceMode`).
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "kebab-case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceMode {
    ReadOnly,
    ReadWrite,
}

impl WorkspaceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceMode::ReadOnly => "read-only",
            WorkspaceMode::ReadWrite => "read-write",
        }
    }
}

/// The session's history, kept here only: which interpreter this is, how
/// many calls reached one, and what was last discarded or rolled back.
/// `status` and the results read it; the session changes it through its
/// methods, each a thing that happened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// 1 for the session's first interpreter, +1 per fresh one (0 before any start).
    pub generation: u64,
    /// Calls handed to an interpreter.
    pub executions: u64,
    /// Why the interpreter's state was last discarded (a reset, a failure
    /// that was not rolled back, a restart).
    pub last_reset_reason: Option<ResetReason>,
    /// The last failed call that was rolled back, and why it failed (the
    /// state was kept: nothing was reset).
    pub last_rollback: Option<ResetReason>,
    /// When the running interpreter last took a rollback point.
    pub last_rollback_point: Option<std::time::SystemTime>,
}

impl History {
    /// An interpreter starts (a cold start, a spare adopted): its generation.
    pub fn started(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// A fresh interpreter replaced the last one in its sandbox, for `why`.
    pub fn replaced(&mut self, why: ResetReason) {
        self.generation += 1;
        self.last_reset_reason = Some(why);
    }

    /// The interpreter (or its sandbox) was discarded, for `why`; the next
    /// start is a new generation.
    pub fn discarded(&mut self, why: ResetReason) {
        self.last_reset_reason = Some(why);
    }

    /// A failed call was rolled back (nothing was reset).
    pub fn rolled_back(&mut self, why: ResetReason) {
        self.last_rollback = Some(why);
    }

    /// The running interpreter took a rollback point.
    pub fn point_taken(&mut self) {
        self.last_rollback_point = Some(std::time::SystemTime::now());
    }

    /// A call is handed to the interpreter: its number.
    pub fn call(&mut self) -> u64 {
        self.executions += 1;
        self.executions
    }

    /// The call numbered last never reached the interpreter after all.
    pub fn call_not_sent(&mut self) {
        self.executions -= 1;
    }
}

/// What `status` reports; readable at any time without the lock.
#[derive(Debug, Clone)]
pub struct StatusReport {
    pub availability: Availability,
    pub worker_running: bool,
    /// The mode allows writes, but the running sandbox has the project
    /// read-only: it could not be protected (see `confine`'s note).
    pub workspace_held_read_only: bool,
    pub busy: bool,
    /// Generation, calls, the last reset and rollback.
    pub history: History,
    pub runtime_version: Option<String>,
    /// The permission mode the last mode event named, if any.
    pub permission_mode: Option<String>,
    pub disposed: bool,
    pub project_dir: PathBuf,
    pub mounts: MountConfig,
    /// Counts effective mount changes.
    pub mount_epoch: u64,
    /// A `tool-permissions:mode` event was applied at least once.
    pub permissions_seen: bool,
    /// Directories whose reads the user denied in this session.
    pub denied_reads: Vec<PathBuf>,
    /// Read roots of the last mode event that were not mounted, and why.
    pub skipped_roots: Vec<crate::permissions::Skipped>,
    /// Host secrets masked inside the mounted read roots.
    pub masked: Vec<crate::hostsecrets::Mask>,
    pub dirs: Option<Dirs>,
    pub bwrap: Option<Bwrap>,
    /// Site directories added for the user's Python packages.
    pub site_dirs: Vec<PathBuf>,
    /// Settings of the Python environment that were skipped, and why.
    pub python_notes: Vec<String>,
    /// Keep a started spare sandbox ready after the first execution.
    pub prewarm: bool,
    pub spare: SpareState,
    /// How the running worker was loaded: compiled from source, or from the
    /// bytecode an earlier sandbox produced.
    pub worker_code: Option<crate::worker::CodeForm>,
    /// Whether the next sandbox start gets rollback.
    pub rollback: bool,
    /// How much /scratch held at the last check (see `scratch`).
    pub scratch: Option<crate::scratch::Measure>,
    /// Where the scratches set aside because a secret appeared are.
    pub set_aside: Vec<PathBuf>,
    /// What the running (or last) sandbox masks; none before a start.
    pub masks: Option<crate::secrets::MaskReport>,
    /// How grants are applied in this session (to the running sandbox,
    /// or by a restart and why), when the session says.
    pub grants: Option<String>,
    /// The settings the session's caller gave as options (see
    /// `SessionOptions::set_by_caller`).
    pub by_caller: Vec<&'static str>,
}

impl StatusReport {
    /// A session's report before it has started anything.
    pub fn new(project_dir: PathBuf, mounts: MountConfig, prewarm: bool) -> Self {
        StatusReport {
            availability: Availability::Unverified,
            worker_running: false,
            workspace_held_read_only: false,
            busy: false,
            history: History::default(),
            runtime_version: None,
            permission_mode: None,
            disposed: false,
            project_dir,
            mounts,
            mount_epoch: 0,
            permissions_seen: false,
            denied_reads: Vec::new(),
            skipped_roots: Vec::new(),
            masked: Vec::new(),
            dirs: None,
            bwrap: None,
            site_dirs: Vec::new(),
            python_notes: Vec::new(),
            prewarm,
            spare: SpareState::None,
            worker_code: None,
            rollback: true,
            scratch: None,
            set_aside: Vec::new(),
            masks: None,
            grants: None,
            by_caller: Vec::new(),
        }
    }

    /// How the sandbox has the project: read-only where the mode allows
    /// writes but the running sandbox holds it read-only (it could not be
    /// protected). `status()`'s field and its text both say this one.
    pub fn workspace_mode(&self) -> WorkspaceMode {
        if self.mounts.workspace_writable && !self.workspace_held_read_only {
            WorkspaceMode::ReadWrite
        } else {
            WorkspaceMode::ReadOnly
        }
    }
}

/// The spare sandbox, as `status().spare` names it (the string union
/// `SpareState`).
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpareState {
    None,
    Starting,
    Ready,
}

/// The `status` line about rollback: whether it is on, and how long ago
/// the running interpreter last saved the state a failed call goes back to.
pub(super) fn rollback_line(on: bool, last: Option<std::time::SystemTime>, now: std::time::SystemTime) -> String {
    // An exception is a failed call too, and keeps what ran before it:
    // the line names the failures it is about.
    const AFTER: &str = "after a timeout, a cancel, too much output or a crash";
    if !on {
        return format!("{AFTER}: the sandbox is killed and interpreter state is lost (PI_PYTHON_TOOL_ROLLBACK=0)\n");
    }
    match last.and_then(|t| now.duration_since(t).ok()) {
        Some(ago) => format!(
            "{AFTER}: the interpreter goes back to its state before that call (state last saved {:.1} s ago)\n",
            ago.as_secs_f64()
        ),
        None => format!(
            "{AFTER}: the interpreter goes back to its state before that call (nothing saved yet: a first call's \
             failure gives a fresh interpreter)\n"
        ),
    }
}

/// What a [`ResetReason`] was, in words.
fn reason_words(r: &ResetReason) -> &'static str {
    match r {
        ResetReason::ExplicitReset => "a reset",
        ResetReason::StartupFailure => "a failed start",
        ResetReason::MountsChanged => "a change of the mounts",
        ResetReason::WorkerError => "the interpreter's death",
        ResetReason::WorkerDiedIdle => "the interpreter's death between calls",
        ResetReason::Timeout => "a timeout",
        ResetReason::Cancelled => "a cancel",
        ResetReason::OutputLimit => "too much output",
        ResetReason::Remounted => "a change of the permission mode or read roots while a call ran",
        ResetReason::Disposed => "the session's dispose",
    }
}

/// The project's masks as the running sandbox has them: a secret allowed
/// once (its mask detached, `once` holding its canonical host path) is
/// listed as unmasked by a grant, not as shown empty.
fn allowed_once(
    m: &crate::secrets::MaskReport,
    project: &std::path::Path,
    once: &[PathBuf],
) -> crate::secrets::MaskReport {
    let mut m = m.clone();
    if once.is_empty() {
        return m;
    }
    let project = std::fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let (gone, kept): (Vec<_>, Vec<_>) =
        std::mem::take(&mut m.masked).into_iter().partition(|k| !k.host && once.contains(&project.join(&k.rel)));
    m.masked = kept;
    m.unmasked.extend(gone);
    m
}

/// The `status` text: first the few lines a user needs (available, the
/// interpreter, mode and mounts, the last failure and its recovery,
/// containment in one line), then under `details:` what the session has,
/// what the next sandbox start would get (`settings`), and what is and is
/// not hardened.
pub fn status_text(r: &StatusReport, settings: &Settings) -> String {
    status_text_and_summary(r, settings).0
}

/// [`status_text`] and how many of its lines are the few a user needs:
/// the lines before `details:`.
pub fn status_text_and_summary(r: &StatusReport, settings: &Settings) -> (String, usize) {
    let available = match &r.availability {
        Availability::Unverified => "not started yet (no call so far)",
        Availability::Available => "available",
        Availability::Unavailable(_) => "unavailable",
    };
    let diagnostic = match &r.availability {
        Availability::Unavailable(d) => Some(d.as_str()),
        _ => None,
    };
    let held = r.mounts.workspace_writable && r.workspace_held_read_only;
    let mode = r.workspace_mode().as_str();
    let held_why =
        if held { " in this sandbox although the mode allows writes (the project could not be protected)" } else { "" };
    let path_str = |p: &std::path::Path| crate::display::one_line(&p).to_string();
    let scratch = r.dirs.as_ref().map(|d| path_str(&d.scratch));
    let logs = r.dirs.as_ref().map(|d| path_str(&d.logs));
    let roots: Vec<String> = r.mounts.read_roots.iter().map(|p| path_str(p)).collect();
    let mut text = format!("python tool: {available}\n");
    if let Some(d) = &diagnostic {
        text.push_str(&format!("cause: {}\n", crate::display::one_line(d)));
    }
    let calls = match r.history.executions {
        1 => "1 call so far".to_string(),
        n => format!("{n} calls so far"),
    };
    text.push_str(&match (&r.runtime_version, r.worker_running) {
        (Some(v), true) => format!("interpreter: Python {v}, running ({calls})\n"),
        (Some(v), false) if r.prewarm && r.spare == SpareState::Ready => {
            format!("interpreter: Python {v}, none in use ({calls}; the next call takes the one started ahead)\n")
        }
        (Some(v), false) => format!("interpreter: Python {v}, not running ({calls}; one starts on the next call)\n"),
        (None, _) => "interpreter: not running (one starts on the first call)\n".to_string(),
    });
    text.push_str(&format!(
        "mode: {}; /workspace {mode}{held_why}; read roots: {}\n",
        match &r.permission_mode {
            Some(m) => crate::display::one_line(m).to_string(),
            None => "none announced (no permission extension)".to_string(),
        },
        if roots.is_empty() { "none".to_string() } else { roots.join(", ") }
    ));
    if let Some(reason) = &r.history.last_rollback {
        text.push_str(&format!(
            "last failed call: {}, rolled back (the interpreter kept its state from before that call)\n",
            reason_words(reason)
        ));
    }
    if let Some(reason) = &r.history.last_reset_reason {
        text.push_str(&format!("interpreter state last discarded by: {}\n", reason_words(reason)));
    }
    text.push_str(&rollback_line(r.rollback, r.history.last_rollback_point, std::time::SystemTime::now()));
    text.push_str(&format!("containment: {}\n", crate::contain::summary(crate::contain::host_plan(), &settings.caps)));
    let summary_lines = text.lines().count();
    text.push_str("details:\n");
    if !r.site_dirs.is_empty() {
        let dirs: Vec<String> = r.site_dirs.iter().map(|p| path_str(p)).collect();
        text.push_str(&format!("python packages (read-only): {}\n", dirs.join(", ")));
    }
    for note in &r.python_notes {
        text.push_str(&format!("python packages: {}\n", crate::display::one_line(note)));
    }
    text.push_str(&format!(
        "next sandbox started ahead (so that a restart is quick): {}\n",
        match (r.prewarm, r.spare) {
            (false, _) => "off (PI_SANDBOX_PREWARM)",
            // None is prepared while a sandbox can write the project.
            (true, SpareState::None) if r.mounts.workspace_writable => {
                "none while /workspace is writable (one is prepared in the read-only modes only)"
            }
            (true, SpareState::None) => "none yet",
            (true, SpareState::Starting) => "starting",
            (true, SpareState::Ready) => "ready",
        }
    ));
    if let Some(grants) = &r.grants {
        text.push_str(&format!("{grants}\n"));
    }
    if !settings.shadowed.is_empty() {
        let list: Vec<String> = settings
            .shadowed
            .iter()
            .map(|name| format!("{} ({name} is set)", crate::options::earlier_name(name).unwrap_or(name)))
            .collect();
        text.push_str(&format!("settings ignored: {}\n", list.join(", ")));
    }
    text.push_str(&settings_line(settings, &r.by_caller));
    text.push_str(&format!(
        "paths: project {} -> /workspace ({mode}); scratch {} -> /scratch (writable); logs {}\n",
        crate::display::one_line(&r.project_dir),
        scratch.as_deref().unwrap_or("(not allocated yet)"),
        logs.as_deref().unwrap_or("(not allocated yet)"),
    ));
    if !r.masked.is_empty() {
        let list: Vec<String> = r.masked.iter().map(|m| path_str(&m.path)).collect();
        text.push_str(&format!("host secrets masked in read roots: {}\n", list.join(", ")));
    }
    if !r.skipped_roots.is_empty() {
        let list: Vec<String> =
            r.skipped_roots.iter().map(|s| format!("{} ({})", display_line(&s.root), s.reason)).collect();
        text.push_str(&format!("read roots skipped: {}\n", list.join(", ")));
    }
    if r.mounts.has_once() {
        let once = r.mounts.once.iter().map(|m| path_str(&m.path));
        let list: Vec<String> = once.chain(r.mounts.unmasked_once.iter().map(|p| path_str(p))).collect();
        text.push_str(&format!(
            "allowed once (readable until the sandbox restarts, not mounted again): {}\n",
            list.join(", ")
        ));
    }
    text.push_str(&format!(
        "limits: code {} KiB; timeout default {}s, max {}s; output {} KiB per execution; repr {} KiB; \
     address space {} MiB, file size {} MiB, {} open files per process; no core dumps. \
     These are per-process limits; the sandbox's totals are under containment.",
        MAX_CODE_BYTES / 1024,
        DEFAULT_TIMEOUT_SECONDS,
        MAX_TIMEOUT_SECONDS,
        OUTPUT_BUDGET_BYTES / 1024,
        MAX_REPR_BYTES / 1024,
        RLIMIT_AS_BYTES >> 20,
        RLIMIT_FSIZE_BYTES >> 20,
        RLIMIT_NOFILE
    ));
    text.push_str(&match &settings.tmpfs {
        Ok(sizes) => format!(
            "\nmemory file systems: /tmp {}, /dev/shm {} in all ({TMP_SIZE_ENV}, {SHM_SIZE_ENV}); writes past them \
             fail with ENOSPC; /dev is otherwise read-only; SysV IPC is refused.",
            describe_size(sizes.tmp),
            describe_size(sizes.shm)
        ),
        Err(e) => format!("\nmemory file systems: {e}. No sandbox starts until then."),
    });
    text.push('\n');
    text.push_str(&crate::contain::describe(crate::contain::host_plan(), &settings.caps));
    text.push('\n');
    text.push_str(&crate::scratch::describe(r.scratch, settings.scratch_note));
    if let Some(line) = crate::scratch::set_aside_line(&r.set_aside) {
        text.push('\n');
        text.push_str(&line);
    }
    if let Some(b) = &r.bwrap {
        let (x, y, z) = b.version;
        text.push_str(&format!(
            "\nbubblewrap: {} {x}.{y}.{z}{}",
            crate::display::one_line(&b.path),
            if b.setuid { " (setuid: a wider attack surface than an unprivileged bwrap)" } else { "" }
        ));
    }
    text.push('\n');
    text.push_str(&match &r.masks {
        Some(m) => allowed_once(m, &r.project_dir, &r.mounts.unmasked_once).describe(),
        None if settings.secrets.is_empty() => {
            crate::secrets::MaskReport { off: true, ..Default::default() }.describe()
        }
        None => "secret masks: the project is scanned when the first sandbox starts".to_string(),
    });
    if !settings.secrets.is_empty() {
        text.push_str(&format!(
            " (patterns: {}; {})",
            settings.secrets.describe().join(" "),
            crate::secrets::SECRETS_ENV
        ));
    }
    let protected = crate::protected::describe(&settings.protected);
    let seccomp_rules = crate::seccomp::rules().len();
    text.push_str(&format!(
        "\nhardening: default-deny seccomp filter (allowlist of {} calls, {} refusals; other calls answer ENOSYS; \
         native architecture only); no nested user namespaces; \
         all capabilities dropped; new session; protected paths when /workspace is writable: {}.",
        crate::seccomp::allowed_here(),
        seccomp_rules,
        if protected.is_empty() { "none (PI_SANDBOX_PROTECTED is empty)".to_string() } else { protected.join(", ") }
    ));
    (text, summary_lines)
}

/// Where each setting in force comes from: the caller's options, the
/// environment (under which name), else the default.
fn settings_line(settings: &Settings, by_caller: &[&str]) -> String {
    use crate::options::Source;
    let from_env: Vec<String> = settings
        .set
        .iter()
        .filter(|(name, _)| !by_caller.contains(name))
        .map(|&(name, source)| {
            let read = match source {
                Source::Environment => name.to_string(),
                Source::EarlierName(earlier) => format!("{earlier} (for {name})"),
            };
            if name == crate::config::BASH_ENV {
                format!("{read} (over the trusted configuration file's bash)")
            } else {
                read
            }
        })
        .collect();
    let mut parts = Vec::new();
    if !by_caller.is_empty() {
        parts.push(format!("from the caller's options (over the environment): {}", by_caller.join(", ")));
    }
    if !from_env.is_empty() {
        parts.push(format!("from the environment: {}", from_env.join(", ")));
    }
    if parts.is_empty() {
        return "settings: every one at its default (none is set in the environment)\n".to_string();
    }
    parts.push("every other at its default".to_string());
    format!("settings: {}\n", parts.join("; "))
}

/// What a reset did to the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetDone {
    /// A fresh interpreter replaced the old one in the same sandbox.
    Fresh,
    /// The sandbox was killed; the next execution starts another.
    Killed,
    /// No sandbox was running.
    Idle,
}

/// The text of a reset: what was kept, and notes of what the last checks
/// of the project did.
pub fn reset_text(dirs: Option<&Dirs>, done: ResetDone, notes: &[String]) -> String {
    let scratch = dirs.map(|d| d.scratch.display().to_string());
    let what = match done {
        ResetDone::Fresh => {
            "Interpreter reset: interpreter state discarded; a fresh interpreter is ready in the same sandbox."
        }
        ResetDone::Killed => {
            "Interpreter reset: sandbox killed, interpreter state discarded. A fresh interpreter starts on the next \
             execution."
        }
        ResetDone::Idle => {
            "Interpreter reset: no interpreter was running; a fresh interpreter starts on the next execution."
        }
    };
    let mut text = format!(
        "{what} Scratch files are preserved ({}).",
        scratch.as_deref().unwrap_or("no scratch directory was allocated yet")
    );
    for note in notes {
        text.push_str(&format!("\n\nnote: {}", crate::display::one_line(note)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_mode_whose_project_is_held_read_only_is_read_only_in_the_field_and_in_the_text() {
        let settings = Settings::from_lookup(|_| None, crate::gitconfig::HostGit::default());
        let mut r = StatusReport::new("/p".into(), MountConfig::default(), false);
        assert_eq!(r.workspace_mode(), WorkspaceMode::ReadOnly, "a read-only mode");
        r.mounts.workspace_writable = true;
        assert_eq!(r.workspace_mode(), WorkspaceMode::ReadWrite, "baseline: a writable mode");
        assert!(status_text(&r, &settings).contains("/p -> /workspace (read-write)"));
        r.workspace_held_read_only = true;
        assert_eq!(r.workspace_mode(), WorkspaceMode::ReadOnly, "the project could not be protected");
        let text = status_text(&r, &settings);
        assert!(text.contains("; /workspace read-only in this sandbox although the mode allows writes"), "{text}");
        assert!(text.contains("/p -> /workspace (read-only)"), "{text}");
    }

    #[test]
    fn status_names_where_each_setting_in_force_comes_from() {
        let vars = [
            ("PI_PYTHON_TOOL_MAX_TASKS", "64"),
            ("PI_SANDBOX_TMP_SIZE", "16M"),
            ("PI_PYTHON_TOOL_ROLLBACK", "0"),
            ("PI_SANDBOX_BASH", "0"),
        ];
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let settings = Settings::from_lookup(get, crate::gitconfig::HostGit::default());
        let mut r = StatusReport::new("/p".into(), MountConfig::default(), false);
        let text = status_text(&r, &settings);
        assert!(
            text.contains(
                "\nsettings: from the environment: PI_PYTHON_TOOL_ROLLBACK, PI_SANDBOX_BASH (over the trusted \
                 configuration file's bash), PI_SANDBOX_TMP_SIZE, PI_PYTHON_TOOL_MAX_TASKS (for PI_SANDBOX_MAX_TASKS); \
                 every other at its default\n"
            ),
            "{text}"
        );
        r.by_caller = vec!["PI_PYTHON_TOOL_ROLLBACK"];
        let text = status_text(&r, &settings);
        assert!(
            text.contains(
                "\nsettings: from the caller's options (over the environment): PI_PYTHON_TOOL_ROLLBACK; from the \
                 environment: PI_SANDBOX_BASH (over"
            ),
            "{text}"
        );
        let none = Settings::from_lookup(|_| None, crate::gitconfig::HostGit::default());
        let text = status_text(&StatusReport::new("/p".into(), MountConfig::default(), false), &none);
        assert!(text.contains("\nsettings: every one at its default (none is set in the environment)\n"), "{text}");
    }

    #[test]
    fn the_summary_is_the_lines_before_details() {
        let settings = Settings::from_lookup(|_| None, crate::gitconfig::HostGit::default());
        let mut r = StatusReport::new("/p".into(), MountConfig::default(), false);
        for unavailable in [false, true] {
            if unavailable {
                r.availability = Availability::Unavailable("no bwrap\ndetails:".into());
            }
            let (text, summary) = status_text_and_summary(&r, &settings);
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines[summary], "details:", "{text}");
            assert!(!lines[..summary].contains(&"details:"), "{text}");
        }
    }

    #[test]
    fn the_availability_s_state_drops_only_the_diagnostic() {
        assert_eq!(Availability::Unverified.state(), AvailableState::Unverified);
        assert_eq!(Availability::Available.state(), AvailableState::Available);
        assert_eq!(Availability::Unavailable("why".into()).state(), AvailableState::Unavailable);
    }

    #[test]
    fn the_history_moves_by_what_happened() {
        let mut h = History::default();
        assert_eq!((h.started(), h.call(), h.call()), (1, 1, 2));
        h.call_not_sent();
        assert_eq!(h.executions, 1, "a call that never reached the interpreter is not counted");
        h.rolled_back(ResetReason::Timeout);
        h.point_taken();
        assert_eq!((h.generation, h.last_reset_reason), (1, None), "a rollback resets nothing");
        assert!(h.last_rollback_point.is_some());
        h.replaced(ResetReason::ExplicitReset);
        assert_eq!((h.generation, h.last_reset_reason), (2, Some(ResetReason::ExplicitReset)));
        h.discarded(ResetReason::Disposed);
        assert_eq!((h.generation, h.last_reset_reason), (2, Some(ResetReason::Disposed)));
        assert_eq!(h.started(), 3, "the next start is a new generation");
        assert_eq!(h.last_rollback, Some(ResetReason::Timeout));
    }
}
