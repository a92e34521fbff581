//! Runtimes: what runs inside a sandbox. A runtime supplies the
//! [`Payload`](crate::bwrap::Payload) (its own mounts and its command);
//! the [`Policy`](crate::bwrap::Policy) it runs under is the engine's.

pub mod python;
