//! pi-python-sandbox: a persistent Python interpreter in a bubblewrap +
//! seccomp sandbox, for the pi coding agent's `python` tool.
//!
//! The sandbox logic is plain Rust, tested with `cargo test`; only
//! `napi` (behind the `addon` feature) knows about Node.

// `unwrap`/`expect` are denied in the library (Cargo.toml's [lints]), not in tests.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod beneath;
pub mod bwrap;
pub mod capture;
pub mod config;
pub mod confine;
pub mod contain;
pub mod debuglog;
pub mod display;
pub mod frame;
pub mod gitconfig;
pub mod grants;
pub mod held;
pub mod hostsecrets;
pub mod inotify;
pub mod launch;
pub mod limits;
pub mod live_grants;
pub mod network;
pub mod nshelper;
pub mod options;
pub mod outcome;
pub mod paths;
pub mod permissions;
pub mod probe;
pub mod protected;
pub mod random;
pub mod rundir;
pub mod runtime;
pub mod runtime_paths;
pub mod scan;
pub mod scratch;
pub mod seccomp;
pub mod secrets;
pub mod session;
pub mod shell;
pub mod spare;
pub mod spawn;
pub mod submounts;
pub mod vfork;
pub mod watches;
pub mod worker;

#[cfg(feature = "addon")]
mod napi;
#[cfg(feature = "addon")]
mod napi_config;
#[cfg(feature = "addon")]
mod napi_shell;
