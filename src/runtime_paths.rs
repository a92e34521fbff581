//! Where the runtimes put their own files inside a sandbox: data below
//! both the runtimes and the permission planning (a read root may not
//! land on one of them).

/// Where the Python worker appears inside the sandbox.
pub const WORKER: &str = "/worker.py";
/// The worker compiled by a previous sandbox (see `runtime::python::bytecode`).
pub const WORKER_PYC: &str = "/worker.pyc";
/// The paths the Python runtime mounts itself.
pub const PYTHON_RESERVED: &[&str] = &[WORKER, WORKER_PYC];

/// Every runtime's own paths.
pub const RESERVED: &[&[&str]] = &[PYTHON_RESERVED];
