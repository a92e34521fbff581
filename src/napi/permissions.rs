//! `ToolPermissions` (what one pi session remembers across its sandboxes)
//! and what the mode and read-prompt entry points of `PythonSandbox`
//! return.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::ThreadsafeFunction;
use napi_derive::napi;

use crate::grants::Grants;
use crate::permissions;

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
pub(super) type AskFn =
    ThreadsafeFunction<FnArgs<(String, bool)>, Promise<String>, FnArgs<(String, bool)>, Status, false>;

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
    pub(super) grants: Arc<Grants>,
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

    /// The directories whose reads were denied in this session (a later
    /// read under one is refused without asking), as one-line text.
    #[napi]
    pub fn denials(&self) -> Vec<String> {
        self.grants.denied().iter().map(|p| crate::display::one_line(p).to_string()).collect()
    }

    /// Forget the session's denials: the next read under one asks again.
    /// Returns how many were forgotten.
    #[napi]
    pub fn clear_denials(&self) -> u32 {
        self.grants.clear_denials() as u32
    }

    /// An "Allow once" that came after the tool stopped waiting for the
    /// prompt about `path` (the raw path it asked about): the denial that
    /// made is lifted and the next refused read of it is allowed without
    /// asking. Returns the path as one line when it was such a prompt.
    #[napi]
    pub fn allow_late(&self, path: String) -> Option<String> {
        self.grants.allow_late(&path).map(|p| crate::display::one_line(&p).to_string())
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
