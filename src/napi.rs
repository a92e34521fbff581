//! The Node-facing layer: a `PythonSandbox` class over `session::Session`.
//!
//! Thin by design: it converts arguments and results and maps errors, in
//! this one place, to JS errors with a stable `code` (`InvalidArg` for bad
//! input). All behaviour lives in the plain Rust modules. Every string that
//! came from the sandbox leaves through `display`, here, so that no caller
//! of the addon gets a raw control character from it.
//!
//! One file per part of the JS interface: [`sandbox`] (the `PythonSandbox`
//! class and its options), [`result`] (what `execute` resolves with and
//! its progress), [`status`] (`status()`, the limits and the tool's
//! settings), [`permissions`] (`ToolPermissions` and what the read-prompt
//! and mode entry points return); the few free functions and the argument
//! checks are here.

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::display::{displayed, displayed_line};

mod permissions;
mod result;
pub(crate) mod review;
pub(crate) mod sandbox;
mod status;

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
/// Why no sandbox can start on this host (bubblewrap missing or unable to
/// make namespaces, the interpreter missing), with the fix; null when one
/// can. The bubblewrap probe runs once per process; for a warning at
/// session start.
#[napi]
#[allow(dead_code)] // called from JS only
pub async fn sandbox_probe() -> Option<String> {
    let _ = crate::probe::sandbox_works().await;
    crate::probe::known_unavailable(crate::options::Settings::from_env().interpreter.as_deref())
}

#[napi]
#[allow(dead_code)] // called from JS only
pub fn cleanup_all() {
    crate::session::cleanup_all();
}
