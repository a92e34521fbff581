//! What `execute` resolves with ([`ExecResult`]) and the progress it
//! reports while the code runs, converted from the engine's outcome.

use napi_derive::napi;

use super::path_str;
use crate::display::{displayed, displayed_line};
use crate::grants::orchestrator::Finished;
use crate::outcome::{closing, render_parts, Discarded, KilledFor, Loss, PartKind, StartFailure, StateFate, Status};

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

/// What became of the interpreter's state in the call (the engine's
/// `StateFate`; the text says it in one sentence).
#[napi(string_enum = "snake_case")]
#[derive(Debug, PartialEq, Eq)]
pub enum CallState {
    /// No interpreter was reached (refused, cancelled or failed before the code ran).
    Untouched,
    /// The code ran to its end: what it did stays (an error keeps what ran before it).
    Kept,
    /// The call failed and was undone: the interpreter is as before the call.
    RolledBack,
    /// The state is gone; a fresh interpreter takes the next call (`lossCause` says why).
    Lost,
}

/// Why a call lost the interpreter's state (the engine's `Loss`).
#[napi(string_enum = "snake_case")]
#[derive(Debug, PartialEq, Eq)]
pub enum LossCause {
    /// Rollback is off: the failure killed the sandbox.
    RollbackOff,
    /// The sandbox was kept but had no rollback point to return to.
    NoRollbackPoint,
    /// The rollback itself failed: the sandbox was killed instead.
    RollbackFailed,
    /// The host stopped the sandbox for a cause of its own (a mode change, a dispose, a limit).
    Stopped,
    /// The call's result came, then the worker failed or was stopped.
    AfterResult,
}

/// Why the state was discarded before a call ran (the engine's `Discarded`;
/// `lostBefore` says it in words).
#[napi(string_enum = "snake_case")]
#[derive(Debug, PartialEq, Eq)]
pub enum LostBeforeCause {
    /// A host secret appeared in a read root: the sandbox was restarted.
    HostSecret,
    /// The host killed the idle sandbox itself (a limit, a watch).
    Killed,
    /// The interpreter, or its whole sandbox, died while idle.
    DiedIdle,
    /// A project secret appeared: the sandbox was restarted to mask it.
    NewSecret,
    /// The permission mode or the read roots changed.
    Remounted,
    /// A grant could not reach the running sandbox: it was restarted.
    GrantNotLive,
    /// The call run again after a grant could not return to its state before the call.
    NoReturn,
}

fn lost_before_cause(d: &Discarded) -> LostBeforeCause {
    match d {
        Discarded::HostSecret(_) => LostBeforeCause::HostSecret,
        Discarded::Killed(_) => LostBeforeCause::Killed,
        Discarded::DiedIdle { .. } | Discarded::SandboxDied { .. } => LostBeforeCause::DiedIdle,
        Discarded::NewSecret(_) => LostBeforeCause::NewSecret,
        Discarded::Remounted(_) => LostBeforeCause::Remounted,
        Discarded::NotLive { .. } => LostBeforeCause::GrantNotLive,
        Discarded::NoReturn(_) => LostBeforeCause::NoReturn,
    }
}

/// The typed state of a call and why it was lost.
fn state_of(state: &StateFate) -> (CallState, Option<LossCause>) {
    match state {
        StateFate::Untouched => (CallState::Untouched, None),
        StateFate::Kept => (CallState::Kept, None),
        StateFate::RolledBack { .. } => (CallState::RolledBack, None),
        StateFate::Lost(loss) => (
            CallState::Lost,
            Some(match loss {
                Loss::RollbackOff => LossCause::RollbackOff,
                Loss::NoPoint(_) => LossCause::NoRollbackPoint,
                Loss::RollbackFailed(_) => LossCause::RollbackFailed,
                Loss::Stopped => LossCause::Stopped,
                Loss::AfterResult(_) => LossCause::AfterResult,
            }),
        ),
    }
}

/// A part of `text` that a reader shows its own way, as UTF-16 offsets
/// (`text.slice(start, end)`).
#[napi(object)]
pub struct TextPart {
    pub kind: PartKind,
    pub start: u32,
    pub end: u32,
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
    pub status: Status,
    /// True for every status but `ok`.
    pub is_error: bool,
    /// The model-facing text, within 50 KiB and 2,000 lines.
    pub text: String,
    /// Its status line, image lines, notes, log line and closing
    /// paragraph, where it has them, in order.
    pub parts: Vec<TextPart>,
    /// Lines and bytes of output `text` leaves out (0 when none).
    pub omitted_lines: f64,
    pub omitted_bytes: f64,
    /// The call's time; after a read prompt, its runs and the wait.
    pub duration_ms: f64,
    /// Of `durationMs`, the time spent waiting for the user's answer to
    /// read prompts (0 without one).
    pub waited_ms: f64,
    /// Worker generation: 1 for the session's first interpreter, +1 per start.
    pub generation: f64,
    /// What the call did to the interpreter's state, and why it was lost.
    pub state: CallState,
    pub loss_cause: Option<LossCause>,
    /// Interpreter state from before this call is gone (lost by the call,
    /// or discarded before it ran: `lostBefore`).
    pub state_lost: bool,
    pub state_lost_reason: Option<String>,
    /// The call failed and the interpreter was rolled back to its state
    /// from right before it (see the README's Rollback).
    pub rolled_back: bool,
    /// The earlier state was discarded before this call ran (a mode
    /// change, a death while idle), and why; this call's state is kept.
    pub lost_before: Option<String>,
    /// Why, as a value (present with `lostBefore`).
    pub lost_before_cause: Option<LostBeforeCause>,
    /// What the host killed the call's sandbox or interpreter for (none
    /// where nothing killed it; `diagnostic` says it in words).
    pub killed_for: Option<KilledFor>,
    /// Why the call's sandbox did not start (`diagnostic` says it in
    /// words, with what to do).
    pub start_failure: Option<StartFailure>,
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
    /// The latest output of both streams in the order written, each run of
    /// one stream's lines under its header (none while stderr is empty).
    pub output_tail: String,
}

pub(super) fn to_js(finished: Finished) -> ExecResult {
    use base64::Engine;
    let mut o = finished.outcome;
    let mut extra = finished.diagnostic;
    // Why the grant loop stopped at a denial is the result's closing
    // paragraph, and then its one word on the refused read.
    if o.diagnostic.is_none() {
        o.diagnostic = extra.take();
    }
    let mut rendered = render_parts(&o);
    let mut diagnostic = closing(&o);
    // Else it is told after the result's own text.
    if let Some(why) = extra.map(displayed) {
        if diagnostic.as_deref().map(|d| displayed(d.to_string())).as_deref() != Some(why.as_str()) {
            rendered.close_with(&why);
        }
        diagnostic = Some(why);
    }
    let (state, loss_cause) = state_of(&o.state);
    let parts =
        rendered.utf16().into_iter().map(|(kind, start, end)| TextPart { kind, start: start as u32, end: end as u32 });
    let join = |s: &crate::outcome::StreamText| {
        if s.omitted == 0 {
            format!("{}{}", s.head, s.tail)
        } else {
            format!("{}\n...[{} bytes omitted]...\n{}", s.head, s.omitted, s.tail)
        }
    };
    ExecResult {
        status: o.status,
        is_error: o.status.is_failure(),
        parts: parts.collect(),
        omitted_lines: rendered.omitted_lines as f64,
        omitted_bytes: rendered.omitted_bytes as f64,
        text: rendered.text,
        duration_ms: o.duration_ms as f64,
        waited_ms: o.waited_ms as f64,
        generation: o.generation as f64,
        state,
        loss_cause,
        state_lost: o.state_lost(),
        state_lost_reason: o.state_lost_reason().map(displayed),
        rolled_back: o.rolled_back(),
        lost_before: o.lost_before.as_ref().map(|d| displayed(d.to_string())),
        lost_before_cause: o.lost_before.as_ref().map(lost_before_cause),
        killed_for: o.killed_for,
        start_failure: o.start_failure,
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
