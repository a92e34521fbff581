//! The debug log a user can switch on: `PI_SANDBOX_LOG=debug` (or
//! `info`, `warn`, `error`, `trace`) writes the engine's `tracing` events
//! to `debug.log` in each session's directory: sandbox starts, kills,
//! rollbacks, protocol decisions. Off by default, and then nothing is
//! installed (the `tracing` macros cost a load and a compare).
//!
//! A small subscriber of our own, so that no formatting crate is needed:
//! a session's work runs inside a `session` span carrying its id, the
//! span's id is kept per thread while it is entered, and an event goes to
//! that session's file (events outside any session go to `debug.log` in
//! the runtime root). The file is opened for each event by path, in a
//! directory only this user can use: the session's directory is not mounted
//! in the sandbox (its `logs` directory, the calls' output, is, read-only at
//! `/logs`; the debug log is beside it, not in it).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// `error`, `warn`, `info`, `debug` or `trace` (case-insensitive).
pub const LOG_ENV: &str = "PI_SANDBOX_LOG";

/// The level a value asks for; anything else is off.
pub fn level(value: Option<&str>) -> Option<Level> {
    match value?.trim().to_ascii_lowercase().as_str() {
        "error" => Some(Level::ERROR),
        "warn" => Some(Level::WARN),
        "info" => Some(Level::INFO),
        "debug" | "1" | "on" => Some(Level::DEBUG),
        "trace" => Some(Level::TRACE),
        _ => None,
    }
}

/// The name of the span a session's work runs in (field `session`).
pub const SESSION_SPAN: &str = "session";

/// The longest line written (a field could hold what the sandbox sent).
const MAX_LINE: usize = 4096;

struct Log {
    max: Level,
    next: AtomicU64,
    /// Span id -> session id, for `session` spans.
    spans: Mutex<HashMap<u64, u64>>,
    fallback: PathBuf,
}

thread_local! {
    static ENTERED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[derive(Default)]
struct Fields {
    text: String,
    session: Option<u64>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "session" {
            self.session = Some(value);
        }
        self.record_debug(field, &value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, " {value:?}");
        } else {
            let _ = write!(self.text, " {}={value:?}", field.name());
        }
    }
}

impl Log {
    fn session_of_current(&self) -> Option<u64> {
        let spans = self.spans.lock();
        ENTERED.with(|e| e.borrow().iter().rev().find_map(|id| spans.get(id).copied()))
    }

    fn write(&self, session: Option<u64>, line: &str) {
        let path = session
            .and_then(crate::rundir::live_dir)
            .map(|d| d.join("debug.log"))
            .unwrap_or_else(|| self.fallback.clone());
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        if let Ok(mut f) = file {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

impl Subscriber for Log {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= &self.max && metadata.target().starts_with("pi_python_sandbox")
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if span.metadata().name() == SESSION_SPAN {
            let mut fields = Fields::default();
            span.record(&mut fields);
            if let Some(session) = fields.session {
                self.spans.lock().insert(id, session);
            }
        }
        Id::from_u64(id)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut line =
            format!("{}.{:03} {} {}:{}", now.as_secs(), now.subsec_millis(), meta.level(), meta.target(), fields.text);
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str(" [cut]");
        }
        // A field can hold what the sandbox sent: no control character
        // reaches the file as it is.
        let mut line = crate::display::display_line(&line).into_owned();
        line.push('\n');
        self.write(self.session_of_current(), &line);
    }

    fn enter(&self, span: &Id) {
        ENTERED.with(|e| e.borrow_mut().push(span.into_u64()));
    }

    fn exit(&self, span: &Id) {
        ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            if let Some(i) = e.iter().rposition(|id| *id == span.into_u64()) {
                e.remove(i);
            }
        });
    }

    fn try_close(&self, id: Id) -> bool {
        self.spans.lock().remove(&id.into_u64());
        true
    }
}

/// Install the log once per process when `max` is set. `fallback`: where
/// events outside a session go.
pub fn install(max: Option<Level>, fallback: PathBuf) {
    static DONE: std::sync::Once = std::sync::Once::new();
    let Some(max) = max else { return };
    DONE.call_once(|| {
        let log = Log { max, next: AtomicU64::new(1), spans: Mutex::default(), fallback };
        let _ = tracing::subscriber::set_global_default(log);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_named_and_anything_else_is_off() {
        assert_eq!(level(Some(" Debug ")), Some(Level::DEBUG));
        assert_eq!(level(Some("warn")), Some(Level::WARN));
        assert_eq!(level(Some("1")), Some(Level::DEBUG));
        assert_eq!(level(Some("verbose")), None);
        assert_eq!(level(Some("")), None);
        assert_eq!(level(None), None);
    }

    #[test]
    fn events_go_to_the_file_of_the_session_whose_span_is_entered() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log {
            max: Level::DEBUG,
            next: AtomicU64::new(1),
            spans: Mutex::default(),
            fallback: dir.path().join("fallback.log"),
        };
        tracing::subscriber::with_default(log, || {
            tracing::debug!(x = 1, "outside \x1b[2J");
            let span = tracing::info_span!("session", session = 4242u64);
            span.in_scope(|| tracing::debug!("inside"));
            tracing::trace!("too detailed");
        });
        // Session 4242 is not live: its events fall back too, tagged by nothing.
        let text = std::fs::read_to_string(dir.path().join("fallback.log")).unwrap();
        assert!(text.contains("DEBUG pi_python_sandbox::debuglog::tests: outside \u{241b}[2J x=1"), "{text}");
        assert!(text.contains(" inside\n"), "{text}");
        assert!(!text.contains("too detailed"));
        assert!(!text.contains('\x1b'));
    }
}
