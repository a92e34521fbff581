//! Runtimes: what runs inside a sandbox. A runtime supplies the
//! [`Payload`](crate::bwrap::Payload) (its own mounts and its command);
//! the [`Policy`](crate::bwrap::Policy) it runs under is the engine's.

pub mod python;

/// What a runtime does with a call once a grant is in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterGrant {
    /// Run the call again, on the sandbox that has the grant (the python
    /// runtime: the refused call left the state as before it).
    RunAgain,
    /// Never run it again (its side effects would repeat): the result
    /// names what was missing and how it was granted.
    NameWhatWasMissing,
}
