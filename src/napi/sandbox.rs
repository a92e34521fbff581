//! The `PythonSandbox` class: its options, and each entry point converting
//! its arguments for the session and the grant loop and its results back.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use super::permissions::{AskFn, ModeChange, ReadAnswer, ReadVerdict, SkippedRoot, ToolPermissions};
use super::result::{to_js, ExecProgress, ExecResult};
use super::status::{status_to_js, StatusResult};
use super::{call_id_of, invalid, path_str};
use crate::display::{displayed, displayed_line};
use crate::grants::orchestrator::{Applied, Decision, Denial, Finished, GrantLoop};
use crate::grants::target::{GrantInputs, SessionCall};
use crate::grants::{Answer, Grants};
use crate::limits::*;
use crate::permissions::{self, MountConfig};
use crate::session::{Session, SessionOptions};

/// Options for a new sandbox session.
#[napi(object)]
pub struct SandboxOptions {
    /// Host project directory, mounted at `/workspace`. Resolved with realpath
    /// when the sandbox starts.
    pub project_dir: String,
    /// Other absolute host names of the project directory (the working
    /// directory as pi gave it, before links were resolved). In the python
    /// sandbox each of them, like `projectDir` and its resolved path, is a
    /// link to `/workspace` where one can be made (see docs/permissions.md).
    pub project_names: Option<Vec<String>>,
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
    /// After the first execution (or from `prestart()`) keep a started spare
    /// sandbox, so that a reset, timeout or crash hands over to a ready
    /// interpreter. Default:
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
pub struct ResetResult {
    /// Host scratch directory (kept), if one was made.
    pub scratch_dir: Option<String>,
    pub text: String,
}

static EXIT_HOOK: AtomicBool = AtomicBool::new(false);

/// A persistent Python interpreter in a bubblewrap + seccomp sandbox.
/// Nothing starts until the first `execute`.
#[napi]
pub struct PythonSandbox {
    session: Arc<Session>,
    grants: Arc<Grants>,
    grant_loop: GrantLoop,
    /// What the last mode change did, told by the next result that ran.
    mode_note: parking_lot::Mutex<Option<String>>,
}

impl PythonSandbox {
    /// `finished` with the last mode change's note, when its code ran.
    fn with_mode_note(&self, mut finished: Finished) -> Finished {
        if finished.outcome.started {
            finished.outcome.mode_note = self.mode_note.lock().take();
        }
        // One sentence per fact: a line that says the project stays
        // read-only, and why, is not followed by the start's note of it
        // (a note with another cause stays).
        if let Some(line) = finished.outcome.mode_note.clone().filter(|n| n.contains(permissions::HELD)) {
            finished.outcome.notes.retain(|n| {
                let why = n.strip_prefix(permissions::HELD_NOTE).and_then(|r| r.strip_prefix(": "));
                !why.is_some_and(|w| line.contains(w.trim_end_matches('.')))
            });
        }
        finished
    }

    /// The session (for the bash tool's entry points, `napi_shell`).
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The permission mode's name the last mode event gave, if any.
    pub(crate) fn mode_name(&self) -> Option<String> {
        self.grants.mode().and_then(|m| m.mode)
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
        if options.project_names.iter().flatten().any(|n| !n.starts_with('/')) {
            return Err(invalid("projectNames must be absolute paths"));
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
            project_names: options.project_names.unwrap_or_default().into_iter().map(PathBuf::from).collect(),
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
        let sandbox = PythonSandbox {
            grant_loop: GrantLoop::new(grants.clone()),
            session,
            grants,
            mode_note: parking_lot::Mutex::new(None),
        };
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
                        output_tail: crate::outcome::laid_out(&p.output_tail, None, p.stderr_bytes == 0),
                    },
                    ThreadsafeFunctionCallMode::NonBlocking,
                );
            }) as crate::outcome::ProgressFn
        });
        let call_id = call_id.map(call_id_of).transpose()?;
        let call = SessionCall { session: &self.session, code, timeout_seconds: timeout, call_id, progress };
        let Some(ask) = ask else {
            let finished = Finished { outcome: self.grant_loop.run_once(&call).await, diagnostic: None };
            return Ok(to_js(self.with_mode_note(finished)));
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
        let finished = self.grant_loop.run(&call, has_ui.unwrap_or(true), asking).await;
        Ok(to_js(self.with_mode_note(finished)))
    }

    /// Cancel the call named `callId` (queued or running), or the running
    /// call when omitted: its sandbox is killed. Returns whether anything
    /// was targeted.
    /// With `network.python`: who reviews a destination no entry matches
    /// during the calls that start from now (resolves `once`, `command`,
    /// `session` or `deny`; anything else, or a rejection, denies); none
    /// (the default): refused at once. A call's open dialogs are cancelled
    /// when it ends, and "for this command" grants last for the call. In
    /// yolo mode (the mode now) an unmatched destination is allowed
    /// unreviewed, unless `network.review.yolo` is `"review"`. The
    /// function kept does not keep the process alive.
    #[napi(ts_args_type = "onReview?: ((request: NetworkReviewRequest) => Promise<string>) | undefined | null")]
    pub fn set_network_review(&self, on_review: Option<crate::napi::review::ReviewFn<true>>) {
        let yolo = self.mode_name().as_deref() == Some("yolo");
        self.session.set_network_review(crate::network::review::Reviewing {
            ask: on_review.map(crate::napi::review::asker),
            yolo,
        });
    }

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
        // The roots skipped already were told: a change names only new ones.
        let before = self.session.status();
        let (skipped_before, running) = (before.skipped_roots, before.worker_running);
        self.grants.set_mode(event.clone());
        let (plan, wanted, result, late) = self.apply(event, Some(&current));
        let told = permissions::MountPlan {
            skipped: plan.skipped.iter().filter(|s| !skipped_before.contains(s)).cloned().collect(),
            ..plan.clone()
        };
        let mut notification = permissions::change_notification(&current, &wanted, &told, result == Some(true));
        // A change that reached the running sandbox kept its interpreter.
        if let (Some(note), Some(false), true) = (notification.as_mut(), result, running) {
            *note = note.replacen(permissions::CHANGE_LATER, permissions::change_live(&current, &wanted), 1);
        }
        // A project made writable that the sandbox will hold read-only
        // (it cannot be protected) is not called read-write.
        let held = (!current.workspace_writable && wanted.workspace_writable)
            .then(|| self.session.writable_refusal())
            .flatten();
        if let (Some(note), Some(why)) = (notification.as_mut(), &held) {
            *note = permissions::held_read_only(note, why);
        }
        // A restart says why the change could not reach the running sandbox.
        if let (Some(note), Some(true), Some(why)) = (notification.as_mut(), result, self.session.restart_pending()) {
            note.push_str(&displayed_line(format!(" — not applied to the running sandbox: {why}")));
        }
        if let (Some(note), Some(late)) = (notification.as_mut(), late) {
            note.push_str(&displayed_line(format!(
                " — this came from a late answer to the prompt about {}, which the call had stopped waiting for",
                crate::display::one_line(&late)
            )));
        }
        // The next result that runs says it too (a notification can be
        // replaced on screen by another extension's).
        if let Some(note) = &notification {
            let mut what =
                note.replacen(permissions::CHANGE_DISCARDED, "", 1).replacen(permissions::CHANGE_LATER, "", 1);
            for live in permissions::CHANGE_LIVE {
                what = what.replacen(live, "", 1);
            }
            *self.mode_note.lock() = Some(what);
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

    /// What allowing a read costs here, for the prompt: `None` when a
    /// grant reaches the running sandbox and the call runs again with its
    /// state kept; otherwise why the sandbox restarts (state lost).
    #[napi]
    pub fn grant_cost(&self) -> Option<String> {
        self.session.live_off_reason()
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
        let mut note = permissions::change_notification(&MountConfig::default(), &report.mounts, &plan, false)?;
        // As a change does: a project the sandbox will hold read-only is not called read-write.
        if let Some(why) = report.mounts.workspace_writable.then(|| self.session.writable_refusal()).flatten() {
            note = permissions::held_read_only(&note, &why);
        }
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

    /// Begin the first sandbox now, off the first call's path: the host
    /// probe, the session directory and the spare sandbox, which the first
    /// `execute` takes (or waits for while it starts). Resolves once the
    /// start is under way, not when it is ready. Does nothing when an
    /// interpreter runs already, the spare is off (`prewarm`), the project
    /// is writable or the sandbox was disposed; a failure here is met again,
    /// and reported, by the first `execute`.
    #[napi]
    pub async fn prestart(&self) -> Result<()> {
        self.session.prestart().await;
        Ok(())
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
        // Before the first start: what is already known to stand in the way.
        if report.availability == crate::outcome::Availability::Unverified {
            let configured =
                self.session.options().interpreter.clone().or(crate::options::Settings::from_env().interpreter);
            if let Some(why) = crate::probe::known_unavailable(configured.as_deref()) {
                report.availability = crate::outcome::Availability::Unavailable(why);
            }
        }
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
