//! Runtimes: what runs inside a sandbox. A runtime supplies the
//! [`Payload`](crate::bwrap::Payload) (its own mounts and its command);
//! the [`Policy`](crate::bwrap::Policy) it runs under is the engine's.
//!
//! A [`Runtime`] says what the engine needs from one: the host facts it
//! probes for once per session, the payload of a start, the request that
//! asks for a call, and how its report turns into the call's result. The
//! engine frames, sends, waits and kills; it never looks inside a request
//! or a report. [`python::PythonRuntime`] is the first runtime.

use std::path::Path;

use crate::bwrap::Payload;
use crate::outcome::Outcome;

pub mod python;
pub mod shell;

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

pub use crate::frame::CallRequest;

/// What a runtime supplies to the engine.
pub trait Runtime {
    /// The host facts the runtime needs, probed once per session.
    type Facts;
    /// Why the host cannot run it.
    type ProbeError: std::error::Error;
    /// What varies between its starts, beyond the policy.
    type Start;
    /// The message that asks the sandbox for one call.
    type Request;
    /// The runtime's part of a call's reply.
    type Report;

    /// Learn what the host offers (an interpreter, its packages, ...).
    fn probe(&self, opts: &crate::options::SessionOptions) -> Result<Self::Facts, Self::ProbeError>;
    /// The mounts and the command of one start.
    fn payload(&self, start: &Self::Start) -> Payload;
    /// The request for `call`.
    fn request(&self, call: CallRequest<'_>) -> Self::Request;
    /// Turn the report of a call into its result (`scratch` is the host
    /// path of the sandbox's `/scratch`, where files it names live).
    fn report(&self, report: Self::Report, scratch: &Path, into: &mut Outcome);
}
