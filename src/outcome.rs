//! What one call returns: the status classes, the structured outcome, and
//! the model-facing text, which is kept under pi's 50 KiB / 2,000-line
//! ceiling here so that every caller of the addon gets the same bounded text.
//! The outcome holds text as the sandbox produced it; [`render`] shows every
//! piece of it through `display`, before fitting it into the ceiling.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::display::{display_line, display_text, format_size};
use crate::frame::{ExecReport, WorkerStatus};
use crate::limits::*;
use crate::options::{Settings, ROLLBACK_ENV};
use crate::permissions::MountConfig;
use crate::probe::Bwrap;
use crate::worker::{Halt, Interrupt, NotReady, StartError};
use crate::{rundir::Dirs, runtime_paths::sandbox_log};

/// How a call ended: `ok`, or the kind of failure. The addon hands it to
/// JavaScript as the string union `Status` (the names of `as_str`).
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    RuntimeError,
    PermissionNeeded,
    Timeout,
    Cancelled,
    OutputLimit,
    WorkerError,
    Unavailable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::RuntimeError => "runtime_error",
            Status::PermissionNeeded => "permission_needed",
            Status::Timeout => "timeout",
            Status::Cancelled => "cancelled",
            Status::OutputLimit => "output_limit",
            Status::WorkerError => "worker_error",
            Status::Unavailable => "unavailable",
        }
    }

    /// Everything but `ok` is reported to pi as a failed tool call.
    pub fn is_failure(self) -> bool {
        self != Status::Ok
    }
}

use crate::worker::Recovery;
pub use crate::worker::{Progress, ProgressFn};

mod status;
pub use status::{
    reset_text, status_text, status_text_and_summary, Availability, AvailableState, History, ResetDone, SpareState,
    StatusReport, WorkspaceMode,
};
mod causes;
mod output;
mod parts;
pub use causes::{
    death_text, exit_text, interruption, killed_for, recovered_text, start_failure, start_failure_of, with_oom,
    Discarded, KilledFor, OomKill, Recovered, ResetReason, StartFailure,
};
use output::{displayed_output, fit_output};
pub use output::{laid_out, omission, StreamText};
use parts::{cut_head, Parts};
pub use parts::{PartKind, Rendered, TextPart};

/// An image for the model, with where it is saved inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageData {
    pub sandbox_path: String,
    pub mime: String,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub data: Vec<u8>,
}

impl ImageData {
    /// `640x480 PNG, 23.1KB`
    pub fn describe(&self) -> String {
        let kind = self.mime.strip_prefix("image/").unwrap_or(&self.mime).to_ascii_uppercase();
        match (self.width, self.height) {
            (Some(w), Some(h)) => format!("{w}x{h} {kind}, {}", crate::display::format_size(self.data.len())),
            _ => format!("{kind}, {}", crate::display::format_size(self.data.len())),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogFiles {
    pub stdout: Option<PathBuf>,
    pub stderr: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionText {
    pub type_name: String,
    pub message: String,
    pub traceback: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub duration_ms: u64,
    /// Of `duration_ms`, the time spent waiting for the user's answer to a
    /// read prompt (see `grants::orchestrator`); 0 without a prompt.
    pub waited_ms: u64,
    /// Worker generation that ran (or would have run) the code.
    pub generation: u64,
    /// What became of the interpreter's state (the one statement about it).
    pub state: StateFate,
    /// What ended this call's interpreter, in words (the interruption, or
    /// the memory cap's note), where the call lost the state; the reason
    /// the result gives is [`Outcome::state_lost_reason`]'s.
    pub ended_by: Option<String>,
    /// The earlier state was discarded before this call ran (a mode
    /// change, a death while idle): this call's own state is kept.
    pub lost_before: Option<Discarded>,
    /// This call ran again after a read was allowed; what to tell.
    pub replay: Option<String>,
    /// What a mode change since the last call did (one line, under the
    /// status line).
    pub mode_note: Option<String>,
    pub repr: Option<String>,
    pub repr_truncated: bool,
    pub stdout: StreamText,
    pub stderr: StreamText,
    /// Both streams in the order written (see [`crate::capture::Merged`]):
    /// what the text shows.
    pub output: StreamText,
    pub exception: Option<ExceptionText>,
    pub permission_path: Option<String>,
    pub permission_is_dir: bool,
    /// The refused read was of a masked secret.
    pub permission_secret: bool,
    pub output_limit_exceeded: bool,
    /// Log files of the streams that had output (a quiet stream has none).
    pub log_paths: LogFiles,
    /// Images produced by the code (matplotlib figures, display(), ...).
    pub images: Vec<ImageData>,
    /// Notes about rich output (images not sent, ...).
    pub notes: Vec<String>,
    /// The code was handed to an interpreter.
    pub started: bool,
    pub log_complete: bool,
    pub diagnostic: Option<String>,
    /// What the host killed the call's sandbox or interpreter for.
    pub killed_for: Option<KilledFor>,
    /// Why the call's sandbox did not start.
    pub start_failure: Option<StartFailure>,
}

/// What became of the interpreter's state in one call. A result states
/// this once, worded by [`state_statement`] from this value alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateFate {
    /// No interpreter was reached (refused, cancelled or failed before
    /// the code ran).
    Untouched,
    /// The code ran to its end: what it did stays, and an error keeps
    /// what ran before it (execution is not transactional).
    Kept,
    /// The call failed and was undone: the interpreter is as before the
    /// call. `fresh`: it was a fresh interpreter (the call was its first).
    RolledBack { fresh: bool },
    /// The state is gone; a fresh interpreter takes the next call.
    Lost(Loss),
}

/// Why a call lost the interpreter's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// Rollback is off: the failure killed the sandbox.
    RollbackOff,
    /// The sandbox was kept but had no rollback point to return to (why).
    NoPoint(String),
    /// The rollback itself failed (why): the sandbox was killed instead.
    RollbackFailed(String),
    /// The host stopped the sandbox for a cause of its own (a mode change,
    /// a dispose, a breach of a limit), whether or not rollback is on.
    Stopped,
    /// The call's result came, then the worker failed or was stopped.
    AfterResult(AfterResult),
}

/// What ended the interpreter after a call's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterResult {
    /// The host stopped the sandbox itself, and why.
    Killed(crate::protected::HostKill),
    /// The worker failed (why).
    Failed(String),
}

impl Outcome {
    /// Interpreter state from before this call is gone (lost by the call,
    /// or discarded before it ran).
    pub fn state_lost(&self) -> bool {
        matches!(self.state, StateFate::Lost(_)) || self.lost_before.is_some()
    }

    /// Why the state is gone, in words, from the typed causes: what was
    /// discarded before the call ran, then what this call lost it to (the
    /// one place that words the two together). None where no state was lost.
    pub fn state_lost_reason(&self) -> Option<String> {
        let now = match &self.state {
            StateFate::Lost(loss) => {
                let ended = self.ended_by.as_deref().unwrap_or("the sandbox was stopped");
                Some(match loss {
                    Loss::AfterResult(AfterResult::Killed(k)) => {
                        format!("the sandbox was killed right after the execution: {k}")
                    }
                    Loss::AfterResult(AfterResult::Failed(why)) => {
                        format!("the worker failed right after the execution: {why}")
                    }
                    Loss::NoPoint(why) => format!("{ended}; {why}"),
                    Loss::RollbackOff | Loss::RollbackFailed(_) | Loss::Stopped => ended.to_string(),
                })
            }
            _ => None,
        };
        match (self.lost_before.as_ref().map(ToString::to_string), now) {
            (Some(before), Some(now)) => Some(format!("{before}; then {now}")),
            (before, now) => before.or(now),
        }
    }

    /// The call failed and the interpreter is back where it was before it.
    pub fn rolled_back(&self) -> bool {
        matches!(self.state, StateFate::RolledBack { .. })
    }

    /// A result for a call that never reached an interpreter.
    pub fn static_result(status: Status, generation: u64, diagnostic: String) -> Self {
        Outcome {
            status,
            duration_ms: 0,
            waited_ms: 0,
            generation,
            state: StateFate::Untouched,
            ended_by: None,
            lost_before: None,
            replay: None,
            mode_note: None,
            repr: None,
            repr_truncated: false,
            stdout: StreamText::default(),
            stderr: StreamText::default(),
            output: StreamText::default(),
            exception: None,
            permission_path: None,
            permission_is_dir: false,
            permission_secret: false,
            output_limit_exceeded: false,
            log_paths: LogFiles::default(),
            images: Vec::new(),
            notes: Vec::new(),
            started: false,
            log_complete: true,
            diagnostic: Some(diagnostic),
            killed_for: None,
            start_failure: None,
        }
    }
}

/// What the interpreter's files keep after a rollback.
const FILES_KEPT: &str = "files in /workspace and /scratch keep what the call wrote";

/// The one sentence a result says about interpreter state, from its
/// [`StateFate`] and what was discarded before the call ran. None where
/// there is nothing to say (a clean result, a call that never ran).
pub fn state_statement(o: &Outcome) -> Option<String> {
    let before = o.lost_before.as_ref().map(|d| display_text(&d.to_string()).into_owned());
    let failed = o.status.is_failure();
    match (&o.state, before) {
        (StateFate::Lost(loss), _) => {
            let reason = o.state_lost_reason().unwrap_or_default();
            let reason = display_text(&reason);
            let why = match loss {
                Loss::RollbackOff => format!("; rollback is off ({ROLLBACK_ENV}=0)"),
                Loss::RollbackFailed(e) => {
                    format!("; the rollback failed ({}), so the sandbox was killed", display_text(e))
                }
                Loss::NoPoint(_) | Loss::Stopped | Loss::AfterResult(_) => String::new(),
            };
            Some(format!(
                "Interpreter state was LOST ({reason}{why}). A fresh interpreter starts on the next execution."
            ))
        }
        (StateFate::RolledBack { fresh }, None) => Some(if *fresh {
            format!(
                "The interpreter was rolled back to its state before this call (a fresh interpreter: this was its \
                 first call; {FILES_KEPT})."
            )
        } else {
            format!(
                "The interpreter was rolled back to its state before this call (variables, imports and definitions \
                 are as they were; {FILES_KEPT})."
            )
        }),
        (StateFate::RolledBack { .. }, Some(before)) => Some(format!(
            "Earlier interpreter state was discarded before this call ({before}); the call was rolled back to the \
             fresh interpreter it ran on ({FILES_KEPT})."
        )),
        (StateFate::Kept | StateFate::Untouched, Some(before)) => Some(format!(
            "Earlier interpreter state was discarded before this call ({before}); this call ran on a fresh \
             interpreter{}.",
            if failed { ", and what ran before the error remains" } else { "" }
        )),
        // One line at 80 columns (what remains is what "not transactional" means).
        (StateFate::Kept, None) if failed => Some("Interpreter state kept: what ran before the error remains.".into()),
        (StateFate::Kept | StateFate::Untouched, None) => None,
    }
}

/// The closing paragraph of a failed call: what happened and, when the
/// failure decided it, what became of the state. The addon's `diagnostic`
/// field is this paragraph.
pub fn closing(o: &Outcome) -> Option<String> {
    let d = display_text(o.diagnostic.as_deref()?);
    Some(match state_statement(o).filter(|_| state_closes(o)) {
        Some(state) if d.is_empty() => state,
        Some(state) => format!("{d} {state}"),
        None => d.into_owned(),
    })
}

/// The failure that has a diagnostic decided the state: the statement
/// closes the diagnostic rather than standing apart.
fn state_closes(o: &Outcome) -> bool {
    o.diagnostic.is_some() && matches!(o.state, StateFate::RolledBack { .. } | StateFate::Lost(_))
}

/// Fill `o` from the worker's report. The worker bounds every field; they
/// are bounded again here, so that an oversized field is truncated, never
/// turned into a failure.
/// `collected`: the report's images as read back from scratch, and the
/// notes on those that were not (the runtime's, see `images::collect`).
pub fn apply_report(o: &mut Outcome, r: ExecReport, collected: (Vec<ImageData>, Vec<String>)) {
    let (images, notes) = collected;
    o.images = images;
    o.notes.extend(notes);
    o.notes.extend(r.notes.into_iter().take(8).map(|n| bound_bytes(n, 1024).0));
    o.status = match r.status {
        WorkerStatus::Ok => Status::Ok,
        WorkerStatus::RuntimeError => Status::RuntimeError,
        WorkerStatus::PermissionNeeded => Status::PermissionNeeded,
    };
    o.repr_truncated = r.repr_truncated;
    o.repr = r.repr.map(|s| {
        let (s, cut) = bound_bytes(s, MAX_REPR_BYTES + 64);
        o.repr_truncated |= cut;
        s
    });
    o.exception = r.exception.map(|e| ExceptionText {
        type_name: bound_bytes(e.type_name, 256).0,
        message: bound_bytes(e.message, MAX_MESSAGE_BYTES + 64).0,
        traceback: bound_bytes(e.traceback, MAX_TRACEBACK_BYTES + 64).0,
    });
    o.permission_path = r.path.filter(|_| o.status == Status::PermissionNeeded);
    o.permission_is_dir = r.path_is_dir;
    o.permission_secret = r.path_secret && o.permission_path.is_some();
}

/// `s` cut to at most `max` bytes (on a character boundary) plus a marker;
/// the flag says whether it was cut.
fn bound_bytes(mut s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("...[truncated]");
    (s, true)
}

/// An exception as Python prints it: the traceback, whose last line names
/// the type and the message; `Type: message` alone when there is no
/// traceback, or after one that does not end with the message (cut, or a
/// custom `__str__`). For a refused read (`refused`), the traceback without
/// that last line: the refusal is told by its own sentence.
fn exception_text(e: &ExceptionText, refused: bool) -> String {
    let traceback = e.traceback.trim_end();
    let message = e.message.trim_end();
    let own = if message.is_empty() {
        display_line(&e.type_name).into_owned()
    } else {
        format!("{}: {}", display_line(&e.type_name), display_text(message))
    };
    if traceback.trim().is_empty() {
        return own;
    }
    let short = e.type_name.rsplit('.').next().unwrap_or(&e.type_name);
    let ends_with_it = if message.is_empty() { traceback.ends_with(short) } else { traceback.ends_with(message) };
    if !ends_with_it {
        return format!("{}\n{own}", display_text(traceback));
    }
    if refused {
        // Every line of the traceback but the exception's own (which may span lines).
        let at = traceback.len() - message.len();
        if let Some(start) = traceback[..at].rfind('\n') {
            return display_text(&traceback[..start]).into_owned();
        }
    }
    display_text(traceback).into_owned()
}

/// The text the model sees.
pub fn render(o: &Outcome) -> String {
    render_parts(o).text
}

/// [`render`]'s text with its parts (see [`Rendered`]).
pub fn render_parts(o: &Outcome) -> Rendered {
    let (mut t, mut parts, mut tail_parts) = (String::new(), Parts::default(), Parts::default());
    let _ = write!(t, "status: {} ({:.1}s, ", o.status.as_str(), o.duration_ms as f64 / 1000.0);
    if o.waited_ms > 0 {
        let _ = write!(t, "{:.1}s of it waiting for the user, ", o.waited_ms as f64 / 1000.0);
    }
    let _ = write!(t, "worker generation {})", o.generation);
    parts.mark(PartKind::Status, 0, &t);
    if let Some(note) = &o.mode_note {
        let _ = write!(t, "\n{}", display_line(note));
    }
    // A refused read is told once: by the diagnostic where there is one (the
    // grant loop's advice names the path), else by this sentence.
    if let Some(path) = o.permission_path.as_ref().filter(|_| o.diagnostic.is_none()) {
        if o.permission_secret {
            let _ = write!(
                t,
                "\n\nThe code tried to read {}, which looks like a secret ({}): the sandbox shows it empty.",
                display_line(path),
                crate::secrets::env_of(path)
            );
        } else {
            let _ =
                write!(t, "\n\nThe code tried to read {}, which is outside the sandbox mounts.", display_line(path));
        }
    }
    // The final value comes after the streams, as a notebook shows Out[]
    // last (and the collapsed view, which keeps the tail, shows it).
    let mut value = String::new();
    if let Some(repr) = &o.repr {
        let label = if o.repr_truncated { "result (truncated)" } else { "result" };
        let _ = write!(value, "\n\n{label}: {}", display_text(repr));
    }
    for (i, image) in o.images.iter().enumerate() {
        let from = t.len();
        let _ = write!(
            t,
            "\n\nimage {}: {} ({}), attached",
            i + 1,
            display_line(&image.sandbox_path),
            display_line(&image.describe())
        );
        parts.mark(PartKind::Image, from, &t);
    }
    for note in &o.notes {
        let from = t.len();
        let _ = write!(t, "\n\nnote: {}", display_line(note));
        parts.mark(PartKind::Note, from, &t);
    }
    // The streams share what the rest leaves of the ceiling.
    let mut tail = String::new();
    if let Some(e) = &o.exception {
        let _ = write!(tail, "\n\n{}", exception_text(e, o.permission_path.is_some()));
    }
    if let Some(replay) = &o.replay {
        let _ = write!(tail, "\n\n{}", display_text(replay));
    }
    // One statement of state: in the closing paragraph when the failure
    // decided it, else here.
    let closing = closing(o);
    if let Some(state) = state_statement(o).filter(|_| !state_closes(o)) {
        let _ = write!(tail, "\n\n{state}");
    }
    if o.output_limit_exceeded {
        let _ = write!(tail, "\nOutput budget of {} was exceeded.", format_size(OUTPUT_BUDGET_BYTES));
    }
    // Named only when the text leaves output out, by the path the code opens.
    let logs: Vec<String> = [(&o.log_paths.stdout, "stdout"), (&o.log_paths.stderr, "stderr")]
        .into_iter()
        .filter_map(|(p, name)| p.as_ref().map(|p| format!("{} ({name})", display_line(&sandbox_log(p)))))
        .collect();
    let log_line = match (logs.is_empty(), o.log_complete) {
        (true, _) => String::new(),
        (false, true) => format!("\nFull output saved to: {}", logs.join(", ")),
        (false, false) => {
            format!("\nPartial output saved to: {}; the log was cut off by the output limit.", logs.join(", "))
        }
    };
    let mut after_logs = String::new();
    if let Some(d) = &closing {
        let _ = write!(after_logs, "\n\n{d}");
    }
    let lines = |s: &str| s.matches('\n').count() + 1;
    let reserve = 200; // section headers
    let used_bytes = t.len() + value.len() + tail.len() + log_line.len() + after_logs.len() + reserve;
    let used_lines = lines(&t) + lines(&value) + lines(&tail) + lines(&after_logs) + 9;
    let mut cut = o.output_limit_exceeded;
    let mut omitted = (0, 0);
    // stdout alone under the status line needs no header (a traceback, the
    // state and the diagnostic after it say what they are).
    let bare = o.stderr.is_blank() && o.repr.is_none() && o.images.is_empty();
    let output = if o.output == StreamText::default() {
        Cow::Owned(StreamText::sequential(&o.stdout, &o.stderr))
    } else {
        Cow::Borrowed(&o.output)
    };
    if !output.is_blank() {
        let budget_bytes = RESULT_MAX_BYTES.saturating_sub(used_bytes);
        let budget_lines = RESULT_MAX_LINES.saturating_sub(used_lines);
        let (text, left_out) = fit_output(&displayed_output(&output), budget_bytes, budget_lines, bare);
        cut |= left_out.is_some();
        omitted = left_out.unwrap_or_default();
        let _ = write!(t, "\n\n{text}");
    }
    // The value closes the output: a log line for the streams goes above it.
    let (logs_in, from) = if value.is_empty() { (&mut tail, &mut tail_parts) } else { (&mut t, &mut parts) };
    if cut && !log_line.is_empty() {
        let at = logs_in.len();
        logs_in.push_str(&log_line);
        from.mark(PartKind::Logs, at, logs_in);
    }
    t.push_str(&value);
    if closing.is_some() {
        let at = tail.len();
        tail.push_str(&after_logs);
        tail_parts.mark(PartKind::Closing, at, &tail);
    }
    let mut parts = parts.0;
    parts.extend(tail_parts.shifted(t.len()));
    t.push_str(&tail);
    // Exception, repr and diagnostics are already bounded; this is the last
    // guard for pathological combinations.
    if t.len() > RESULT_MAX_BYTES || lines(&t) > RESULT_MAX_LINES {
        let total = t.len();
        let kept = cut_head(&t, RESULT_MAX_BYTES - 200, RESULT_MAX_LINES - 2).to_string();
        parts.retain(|p| p.end <= kept.len());
        t = format!("{kept}\n\n[Result truncated to {} of {}]", format_size(kept.len()), format_size(total));
    }
    Rendered { text: t, parts, omitted_lines: omitted.0, omitted_bytes: omitted.1 }
}

#[cfg(test)]
mod tests {
    use super::parts::cut_tail;
    use super::status::rollback_line;
    use super::*;
    use crate::capture::Stream;

    fn ok() -> Outcome {
        Outcome {
            duration_ms: 123,
            diagnostic: None,
            state: StateFate::Kept,
            ..Outcome::static_result(Status::Ok, 1, String::new())
        }
    }

    #[test]
    fn ok_result_with_repr_and_stdout() {
        let o = Outcome {
            repr: Some("42".into()),
            stdout: StreamText { head: "hi\n".into(), total: 3, ..Default::default() },
            diagnostic: None,
            log_paths: LogFiles { stdout: Some("/l/0001-out.log".into()), stderr: None },
            ..ok()
        };
        // Lean: no sentence about kept state, no log path for output shown in full.
        assert_eq!(render(&o), "status: ok (0.1s, worker generation 1)\n\n--- stdout ---\nhi\n\nresult: 42");
    }

    #[test]
    fn the_final_value_comes_after_stdout_and_stderr_as_a_notebook_shows_it() {
        let o = Outcome {
            repr: Some("'finished'".into()),
            stdout: StreamText { head: "line\n".repeat(20), total: 100, ..Default::default() },
            stderr: StreamText { head: "warned\n".into(), total: 7, ..Default::default() },
            notes: vec!["a note".into()],
            ..ok()
        };
        let text = render(&o);
        assert!(text.ends_with("--- stderr ---\nwarned\n\nresult: 'finished'"), "{text}");
        assert!(text.find("note: a note").unwrap() < text.find("--- stdout ---").unwrap(), "{text}");
        // Output cut to its log: the log line, then the value.
        let cut = Outcome {
            repr: Some("'end'".into()),
            stdout: StreamText {
                head: "a\n".repeat(100),
                omitted: 5000,
                tail: "z\n".repeat(100),
                total: 5400,
                ..Default::default()
            },
            log_paths: LogFiles { stdout: Some("/l/0002-out.log".into()), stderr: None },
            ..ok()
        };
        let text = render(&cut);
        assert!(text.ends_with("z\nFull output saved to: /logs/0002-out.log (stdout)\n\nresult: 'end'"), "{text}");
    }

    #[test]
    fn interleaved_output_reads_in_the_order_written_under_one_header_per_run() {
        let o = Outcome {
            repr: Some("7".into()),
            stdout: StreamText { head: "a\nc\n".into(), total: 4, ..Default::default() },
            stderr: StreamText { head: "b\n".into(), total: 2, ..Default::default() },
            output: StreamText { head: "\x1fa\n\x1eb\n\x1e \n\x1fc\n".into(), total: 6, ..Default::default() },
            ..ok()
        };
        assert_eq!(
            render(&o),
            "status: ok (0.1s, worker generation 1)\n\n--- stdout ---\na\n--- stderr ---\nb\n--- stdout ---\nc\n\nresult: 7"
        );
        // stdout alone: no header.
        let bare = Outcome {
            stdout: StreamText { head: "a\n".into(), total: 2, ..Default::default() },
            output: StreamText { head: "\x1fa\n".into(), total: 2, ..Default::default() },
            ..ok()
        };
        assert_eq!(render(&bare), "status: ok (0.1s, worker generation 1)\n\na");
    }

    #[test]
    fn a_cut_output_counts_lines_and_bytes_and_names_the_stream_after_the_gap() {
        let o = Outcome {
            stdout: StreamText { head: "x\n".into(), total: 3000, ..Default::default() },
            stderr: StreamText { head: "y\n".into(), total: 3000, ..Default::default() },
            output: StreamText {
                head: "\x1fout\n".into(),
                omitted: 131,
                omitted_lines: 13,
                tail: "err\n".into(),
                total: 6000,
                lead: Some(Stream::Stderr),
            },
            log_paths: LogFiles { stdout: Some("/l/out".into()), stderr: Some("/l/err".into()) },
            ..ok()
        };
        let text = render(&o);
        assert!(
            text.contains(
                "--- stdout ---\nout\n...[13 lines, 131 bytes omitted; the full output is in the log files]...\n--- stderr ---\nerr"
            ),
            "{text}"
        );
    }

    #[test]
    fn print_hi_is_at_most_four_lines() {
        let o = Outcome {
            stdout: StreamText { head: "hi\n".into(), total: 3, ..Default::default() },
            log_paths: LogFiles { stdout: Some("/l/0001-out.log".into()), stderr: None },
            ..ok()
        };
        let text = render(&o);
        assert!(text.lines().filter(|l| !l.trim().is_empty()).count() <= 4, "{text}");
    }

    #[test]
    fn an_error_says_what_stayed_and_a_cut_stream_names_its_log() {
        let o = Outcome {
            status: Status::RuntimeError,
            exception: Some(ExceptionText {
                type_name: "ValueError".into(),
                message: "boom".into(),
                traceback: "Traceback (most recent call last):\nValueError: boom".into(),
            }),
            ..ok()
        };
        assert!(render(&o).ends_with("\n\nInterpreter state kept: what ran before the error remains."));
        let cut = Outcome {
            stdout: StreamText {
                head: "a\n".repeat(100),
                omitted: 5000,
                tail: "z\n".repeat(100),
                total: 5400,
                ..Default::default()
            },
            log_paths: LogFiles { stdout: Some("/l/0002-out.log".into()), stderr: Some("/l/0002-err.log".into()) },
            ..ok()
        };
        let text = render(&cut);
        assert!(
            text.ends_with("\nFull output saved to: /logs/0002-out.log (stdout), /logs/0002-err.log (stderr)"),
            "{text}"
        );
        assert!(!text.contains("Interpreter state"), "{text}");
    }

    #[test]
    fn lost_state_names_its_reason() {
        let o = Outcome {
            status: Status::Timeout,
            state: StateFate::Lost(Loss::RollbackOff),
            ended_by: Some("timeout".into()),
            ..ok()
        };
        assert!(
            render(&o).contains("Interpreter state was LOST (timeout; rollback is off (PI_PYTHON_TOOL_ROLLBACK=0)).")
        );
    }

    #[test]
    fn huge_streams_fit_the_ceiling_with_head_and_tail() {
        let line = "0123456789abcdef0123456789abcdef0123456789\n";
        let big = StreamText {
            head: line.repeat(400),
            omitted: 900_000,
            tail: line.repeat(200),
            total: 1_000_000,
            ..Default::default()
        };
        let many_lines = StreamText {
            head: "x\n".repeat(8000),
            omitted: 0,
            tail: "y\n".repeat(4000),
            total: 24000,
            ..Default::default()
        };
        let log_paths = LogFiles { stdout: Some("/l/out".into()), stderr: None };
        let o = Outcome { stdout: big, stderr: many_lines, log_paths, ..ok() };
        let text = render(&o);
        assert!(text.len() <= RESULT_MAX_BYTES, "{} bytes", text.len());
        assert!(text.lines().count() <= RESULT_MAX_LINES, "{} lines", text.lines().count());
        assert!(text.contains("bytes omitted; the full output is in the log files"));
        assert!(text.contains("\ny\n"), "the tail of a stream is kept");
        assert!(text.ends_with("\nFull output saved to: /logs/out (stdout)"), "the log line is never cut");
    }

    /// Every piece of text an outcome can hold, each carrying the sequences.
    const HOSTILE: &str = "\x1b]52;c;aGk=\x07\x1b]0;title\x07\x1b[2J\u{9b}2J\u{202E}\x7f\r\0\x08";

    fn hostile() -> Outcome {
        let h = |what: &str| format!("{what}{HOSTILE}");
        Outcome {
            status: Status::PermissionNeeded,
            state: StateFate::Lost(Loss::Stopped),
            ended_by: Some(h("reason")),
            repr: Some(h("repr")),
            stdout: StreamText {
                head: h("out-head"),
                omitted: 10,
                tail: h("out-tail"),
                total: 100,
                ..Default::default()
            },
            stderr: StreamText {
                head: format!("{}err\r", h("err")),
                omitted: 0,
                tail: "\nmore".into(),
                total: 20,
                ..Default::default()
            },
            exception: Some(ExceptionText { type_name: h("Type"), message: h("message"), traceback: h("traceback") }),
            permission_path: Some(h("/etc/path")),
            log_paths: LogFiles { stdout: Some(h("/logs/out").into()), stderr: None },
            images: vec![ImageData {
                sandbox_path: h("/scratch/img"),
                mime: h("image/"),
                width: None,
                height: None,
                data: vec![],
            }],
            notes: vec![h("note")],
            diagnostic: Some(h("diagnostic")),
            ..ok()
        }
    }

    fn inert(text: &str) -> bool {
        text.chars().all(|c| c == '\t' || c == '\n' || !(c.is_control() || crate::display::is_bidi_control(c)))
    }

    /// How many sentences of `text` speak of the interpreter's state.
    fn statements(text: &str) -> usize {
        let t = text.to_lowercase();
        ["interpreter state", "interpreter was rolled back"].iter().map(|m| t.matches(m).count()).sum()
    }

    #[test]
    fn every_result_states_its_state_once_and_truly() {
        let timeout = |state: StateFate, reason: Option<&str>| Outcome {
            status: Status::Timeout,
            state,
            ended_by: reason.map(String::from),
            diagnostic: Some("Execution exceeded the 3s deadline; every process of the sandbox was killed.".into()),
            ..ok()
        };
        let error = Outcome { status: Status::RuntimeError, ..ok() };
        let mode = "the sandbox was restarted because the permission mode or read roots changed";
        let cases: Vec<(&str, Outcome, Option<&str>)> = vec![
            ("ok", ok(), None),
            ("never ran", Outcome::static_result(Status::Cancelled, 1, "Cancelled before execution; the interpreter was not touched.".into()), None),
            ("error", error.clone(), Some("Interpreter state kept: what ran before the error remains")),
            ("rolled back", timeout(StateFate::RolledBack { fresh: false }, None), Some("every process of the sandbox was killed. The interpreter was rolled back to its state before this call (variables")),
            ("rolled back, first call", timeout(StateFate::RolledBack { fresh: true }, None), Some("The interpreter was rolled back to its state before this call (a fresh interpreter")),
            ("rollback off", timeout(StateFate::Lost(Loss::RollbackOff), Some("timeout")), Some("Interpreter state was LOST (timeout; rollback is off (PI_PYTHON_TOOL_ROLLBACK=0))")),
            ("no point", timeout(StateFate::Lost(Loss::NoPoint("no rollback point had been taken".into())), Some("timeout")), Some("Interpreter state was LOST (timeout; no rollback point had been taken)")),
            ("rollback failed", timeout(StateFate::Lost(Loss::RollbackFailed("the sandbox's PID 1 is gone".into())), Some("timeout")), Some("LOST (timeout; the rollback failed (the sandbox's PID 1 is gone), so the sandbox was killed)")),
            ("mode change, ok", Outcome { lost_before: Some(Discarded::Remounted(mode.into())), ..ok() }, Some("Earlier interpreter state was discarded before this call (the sandbox was restarted because the permission mode or read roots changed); this call ran on a fresh interpreter.")),
            ("mode change, error", Outcome { lost_before: Some(Discarded::Remounted(mode.into())), ..error }, Some("this call ran on a fresh interpreter, and what ran before the error remains.")),
            ("mode change, rolled back", Outcome { lost_before: Some(Discarded::Remounted(mode.into())), ..timeout(StateFate::RolledBack { fresh: true }, None) }, Some("the call was rolled back to the fresh interpreter it ran on")),
            ("after the result", Outcome { state: StateFate::Lost(Loss::AfterResult(AfterResult::Failed("x".into()))), ..ok() }, Some("Interpreter state was LOST (the worker failed right after the execution: x)")),
            ("killed after the result", Outcome { state: StateFate::Lost(Loss::AfterResult(AfterResult::Killed(crate::protected::HostKill::StrayFrame))), ..ok() }, Some("Interpreter state was LOST (the sandbox was killed right after the execution: it sent a protocol frame while no execution ran)")),
        ];
        for (what, o, want) in cases {
            let text = render(&o);
            match want {
                None => assert_eq!(statements(&text), 0, "{what}: {text}"),
                Some(want) => {
                    assert_eq!(statements(&text), 1, "{what}: {text}");
                    assert!(text.contains(want), "{what}: {text}");
                }
            }
            // The addon's diagnostic is the closing paragraph of the text.
            if let Some(c) = closing(&o) {
                assert!(text.ends_with(&c), "{what}: {text}");
            }
        }
    }

    #[test]
    fn an_exception_is_told_once() {
        let tb = "Traceback (most recent call last):\n  File \"<python-1>\", line 1, in <module>\nValueError: bad\nsecond line";
        let e = |message: &str, traceback: &str| ExceptionText {
            type_name: "ValueError".into(),
            message: message.into(),
            traceback: traceback.into(),
        };
        // The traceback's last line carries the type and the (multi-line) message.
        assert_eq!(exception_text(&e("bad\nsecond line", tb), false), tb);
        // No traceback: the type and the message.
        assert_eq!(exception_text(&e("bad", ""), false), "ValueError: bad");
        // A traceback that does not end with the message (cut): the message follows it.
        assert_eq!(exception_text(&e("other", tb), false), format!("{tb}\nValueError: other"));
        // A refused read: the traceback without the exception's line.
        let read = "Traceback (most recent call last):\n  File \"<python-1>\", line 1\nSandboxReadDenied: /etc/x";
        let denied =
            ExceptionText { type_name: "SandboxReadDenied".into(), message: "/etc/x".into(), traceback: read.into() };
        assert_eq!(exception_text(&denied, true), "Traceback (most recent call last):\n  File \"<python-1>\", line 1");
        let text = render(&Outcome {
            status: Status::RuntimeError,
            exception: Some(e("bad\nsecond line", tb)),
            stdout: StreamText { head: "out".into(), ..Default::default() },
            ..ok()
        });
        assert_eq!(text.matches("bad").count(), 1, "{text}");
        assert!(!text.contains("---"), "no header over the one stdout block: {text}");
    }

    #[test]
    fn every_field_is_shown_through_display() {
        let text = render(&hostile());
        assert!(inert(&text), "{text:?}");
        for what in [
            "reason",
            "repr",
            "out-head",
            "out-tail",
            "err",
            "Type",
            "message",
            "traceback",
            "/logs/out",
            "/scratch/img",
            "note",
            "diagnostic",
        ] {
            assert!(text.contains(&format!("{what}\u{241B}]52;c;aGk=\u{2407}")), "{what} is shown escaped: {text}");
        }
        assert!(text.contains("<U+009B>2J<U+202E>\u{2421}"), "{text}");
        assert!(text.contains("err\nmore"), "a CRLF split between head and tail is a line end: {text}");
        // Without a diagnostic, the refused path is told by the result's own sentence.
        let text = render(&Outcome { diagnostic: None, ..hostile() });
        assert!(text.contains("/etc/path\u{241B}]52;c;aGk=\u{2407}"), "the path is shown escaped: {text}");
    }

    #[test]
    fn escaped_streams_still_fit_the_ceiling() {
        // Each control grows to three bytes when shown.
        let esc = "\x1b".repeat(40_000);
        let o = Outcome {
            stdout: StreamText {
                head: esc.clone(),
                omitted: 0,
                tail: esc.clone(),
                total: 80_000,
                ..Default::default()
            },
            stderr: StreamText {
                head: "\r\n".repeat(30_000),
                omitted: 0,
                tail: String::new(),
                total: 60_000,
                ..Default::default()
            },
            status: Status::RuntimeError,
            ..ok()
        };
        let text = render(&o);
        assert!(text.len() <= RESULT_MAX_BYTES, "{} bytes", text.len());
        assert!(text.lines().count() <= RESULT_MAX_LINES, "{} lines", text.lines().count());
        assert!(inert(&text));
        assert!(text.ends_with("what ran before the error remains."), "the state line is kept");
    }

    #[test]
    fn cuts_respect_character_boundaries() {
        let s = "é".repeat(10);
        assert_eq!(cut_head(&s, 5, 100), "éé");
        assert_eq!(cut_tail(&s, 5, 100), "éé");
        assert_eq!(cut_head("a\nb\nc", 100, 2), "a\nb");
        assert_eq!(cut_tail("a\nb\nc", 100, 2), "b\nc");
    }

    #[test]
    fn status_and_reset_texts() {
        let report = StatusReport::new("/p".into(), MountConfig::default(), false);
        let settings = Settings::from_lookup(|_| None, crate::gitconfig::HostGit::default());
        let text = status_text(&report, &settings);
        assert!(text.starts_with("python tool: not started yet (no call so far)\n"), "{text}");
        // Short first (a few lines), the rest under details.
        let (short, details) = text.split_once("\ndetails:\n").expect("a details section");
        assert!(short.lines().count() <= 7, "{short}");
        assert!(short.contains("\ninterpreter: not running (one starts on the first call)\n"), "{short}");
        assert!(
            short.contains(
                "\nafter a timeout, a cancel, too much output or a crash: the interpreter goes back to its state \
                 before that call"
            ),
            "{short}"
        );
        assert!(short.contains("\ncontainment: at most 256 tasks"), "{short}");
        for word in ["generation", "rollback point", "spare", "entries", "last reset reason"] {
            assert!(!text.contains(word), "{word}: {text}");
        }
        assert!(
            details.contains("next sandbox started ahead (so that a restart is quick): off (PI_SANDBOX_PREWARM)"),
            "{text}"
        );
        assert!(text.contains("/p -> /workspace (read-only)"), "{text}");
        // In a writable mode no spare is prepared: status does not promise one.
        let mut writable =
            StatusReport::new("/p".into(), MountConfig { workspace_writable: true, ..Default::default() }, true);
        writable.spare = SpareState::None;
        let yolo = status_text(&writable, &settings);
        assert!(
            yolo.contains("started ahead (so that a restart is quick): none while /workspace is writable"),
            "{yolo}"
        );
        assert!(text.contains("protected paths when /workspace is writable: .git, "), "{text}");
        assert!(text.contains("\ncontainment: ") && text.contains("PI_SANDBOX_MAX_TASKS"), "{text}");
        assert!(text.contains("\nscratch disk use: not measured yet; a note past 1 GiB"), "{text}");
        assert!(
            text.contains("\nmode: none announced (no permission extension); /workspace read-only; read roots: none\n")
        );
        assert!(!text.contains("discarded") && !text.contains("last failed call"), "{text}");
        let rolled = StatusReport {
            history: History { last_rollback: Some(ResetReason::Timeout), ..History::default() },
            permission_mode: Some("edits".into()),
            mounts: MountConfig { workspace_writable: true, ..MountConfig::default() },
            ..report
        };
        let text = status_text(&rolled, &settings);
        assert!(text.contains("\nlast failed call: a timeout, rolled back (the interpreter kept its state"), "{text}");
        assert!(!text.contains("discarded"), "a rollback resets nothing: {text}");
        assert!(text.contains("\nmode: edits; /workspace read-write; read roots: none\n"), "{text}");
        let lost = StatusReport {
            history: History { last_reset_reason: Some(ResetReason::Timeout), executions: 1, ..History::default() },
            ..StatusReport::new("/p".into(), MountConfig::default(), false)
        };
        let text = status_text(&lost, &settings);
        assert!(text.contains("\ninterpreter state last discarded by: a timeout\n"), "{text}");
        let reset = reset_text(None, ResetDone::Killed, &["x was renamed".into()]);
        assert!(reset.contains("no scratch directory was allocated yet") && reset.ends_with("\n\nnote: x was renamed"));
        assert!(reset.starts_with("Interpreter reset: sandbox killed, interpreter state discarded."), "{reset}");
        for done in [ResetDone::Fresh, ResetDone::Idle] {
            let reset = reset_text(None, done, &[]);
            assert!(!reset.contains("sandbox killed"), "{done:?}: {reset}");
        }
        assert!(reset_text(None, ResetDone::Fresh, &[]).contains("a fresh interpreter is ready in the same sandbox"));
    }

    #[test]
    fn failure_statuses() {
        assert!(!Status::Ok.is_failure());
        for s in [
            Status::RuntimeError,
            Status::PermissionNeeded,
            Status::Timeout,
            Status::Cancelled,
            Status::OutputLimit,
            Status::WorkerError,
            Status::Unavailable,
        ] {
            assert!(s.is_failure(), "{}", s.as_str());
        }
    }

    #[test]
    fn bound_bytes_cuts_on_a_character_boundary() {
        let (cut, was) = bound_bytes("héllo".into(), 2);
        assert!(was);
        assert_eq!(cut, "h...[truncated]");
        assert_eq!(bound_bytes("abc".into(), 3), ("abc".into(), false));
    }

    #[test]
    fn the_rollback_line_says_whether_it_is_on_and_when_the_last_point_was_taken() {
        let now = std::time::SystemTime::now();
        let ago = now - std::time::Duration::from_millis(2500);
        assert_eq!(
            rollback_line(true, Some(ago), now),
            "after a timeout, a cancel, too much output or a crash: the interpreter goes back to its state before \
             that call (state last saved 2.5 s ago)\n"
        );
        assert!(rollback_line(true, None, now).contains("nothing saved yet"));
        assert!(rollback_line(false, Some(ago), now).ends_with("state is lost (PI_PYTHON_TOOL_ROLLBACK=0)\n"));
    }

    #[test]
    fn a_rollback_keeps_state_and_says_files_are_not_rolled_back() {
        let r = recovered_text(&Interrupt::Timeout, 3, &Recovery::Restored, None, None);
        assert_eq!(r.status, Status::Timeout);
        assert_eq!(r.state, StateFate::RolledBack { fresh: false });
        let o = Outcome { status: r.status, state: r.state, diagnostic: Some(r.diagnostic), ..ok() };
        let closing = closing(&o).expect("a diagnostic");
        assert!(closing.contains("rolled back to its state before this call"), "{closing}");
        assert!(closing.contains("files in /workspace and /scratch keep what the call wrote"), "{closing}");
        let lost =
            recovered_text(&Interrupt::Died, 3, &Recovery::Lost("no rollback point had been taken".into()), None, None);
        assert_eq!(lost.state, StateFate::Lost(Loss::NoPoint("no rollback point had been taken".into())));
        assert_eq!(lost.ended_by.as_deref(), Some("worker_error"));
        let o = Outcome { state: lost.state, ended_by: lost.ended_by, ..ok() };
        assert_eq!(o.state_lost_reason().as_deref(), Some("worker_error; no rollback point had been taken"));
        let fresh = recovered_text(&Interrupt::OutputLimit, 3, &Recovery::Fresh, None, None);
        assert_eq!(fresh.status, Status::OutputLimit);
        assert_eq!(fresh.state, StateFate::RolledBack { fresh: true });
    }

    #[test]
    fn state_discarded_before_a_call_is_not_a_loss_by_the_call() {
        let before = "the sandbox was restarted because the permission mode or read roots changed";
        let o = Outcome {
            state: StateFate::Kept,
            lost_before: Some(Discarded::Remounted(before.into())),
            ..Outcome::static_result(Status::Ok, 2, String::new())
        };
        let text = render(&o);
        assert!(
            text.contains(&format!("Earlier interpreter state was discarded before this call ({before})")),
            "{text}"
        );
        assert!(!text.contains("was LOST"), "{text}");
        let both = Outcome {
            status: Status::Timeout,
            state: StateFate::Lost(Loss::RollbackOff),
            ended_by: Some("timeout".into()),
            ..o
        };
        let text = render(&both);
        assert!(
            text.contains(&format!("Interpreter state was LOST ({before}; then timeout; rollback is off")),
            "{text}"
        );
        assert_eq!(statements(&text), 1, "{text}");
    }
}
