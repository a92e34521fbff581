//! Where the runtimes put their own files inside a sandbox: data below
//! both the runtimes and the permission planning (a read root may not
//! land on one of them).

/// Where the Python worker appears inside the sandbox.
pub const WORKER: &str = "/worker.py";
/// The worker compiled by a previous sandbox (see `runtime::python::bytecode`).
pub const WORKER_PYC: &str = "/worker.pyc";
/// The session's log directory (each execution's full output), read-only:
/// a result that leaves output out names its log here.
pub const LOGS: &str = "/logs";
/// Where the code reads log `host`, a file of the session's log directory
/// (the TUI names the host's path, the model's text this one).
pub fn sandbox_log(host: &std::path::Path) -> String {
    match host.file_name() {
        Some(name) => std::path::Path::new(LOGS).join(name).to_string_lossy().into_owned(),
        None => host.to_string_lossy().into_owned(),
    }
}

/// The paths the Python runtime mounts itself.
pub const PYTHON_RESERVED: &[&str] = &[WORKER, WORKER_PYC, LOGS];

/// Every runtime's own paths.
pub const RESERVED: &[&[&str]] = &[PYTHON_RESERVED];
