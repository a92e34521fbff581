//! Why the host stopped a sandbox of its own accord: the guard, the
//! budget, the secret watches and the reply task each say so in one
//! shared slot, worded here only.

use std::path::PathBuf;

/// Why the host stopped a sandbox itself (not a call's deadline, abort or
/// output bound, which the call knows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKill {
    /// The guard could not keep the project's protections (what it found).
    Breach(String),
    /// The host's budget for the sandbox's changes was spent (which one).
    Budget(String),
    /// A host secret appeared in a read root.
    HostSecret(PathBuf),
    /// A project secret appeared (what the watch saw).
    NewSecret(String),
    /// The sandbox sent a protocol frame while no execution ran.
    StrayFrame,
}

impl std::fmt::Display for HostKill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MASKED_NEXT: &str =
            "the sandbox was stopped so that nothing in it could read it, and the next one masks it";
        match self {
            HostKill::Breach(why) => write!(f, "{why}, so the sandbox that could write the project was stopped"),
            HostKill::Budget(why) => f.write_str(why),
            HostKill::HostSecret(path) => {
                write!(f, "a host secret appeared in a read root ({}); {MASKED_NEXT}", crate::display::one_line(path))
            }
            HostKill::NewSecret(why) => write!(f, "{why}; {MASKED_NEXT}"),
            HostKill::StrayFrame => f.write_str("it sent a protocol frame while no execution ran"),
        }
    }
}

/// Where a sandbox's watches, guard and reply task say why they stopped it.
pub type KillSlot = std::sync::Arc<parking_lot::Mutex<Option<HostKill>>>;
