//! Every fixed limit of the sandbox, in one place.
//!
//! The per-execution timeout is the only limit a caller may vary; everything
//! here is a constant so that `status` can report it and tests can pin it.

use std::time::Duration;

/// Largest accepted source, in UTF-8 bytes.
pub const MAX_CODE_BYTES: usize = 64 * 1024;
/// Timeout used when the caller gives none, in seconds.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 30;
/// Smallest and largest timeout a caller may ask for, in seconds.
pub const MIN_TIMEOUT_SECONDS: u32 = 1;
pub const MAX_TIMEOUT_SECONDS: u32 = 120;
/// How long a new sandbox has to report ready.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(10);
/// How long a killed sandbox has to exit before we stop waiting for it.
pub const CLEANUP_DEADLINE: Duration = Duration::from_secs(5);
/// Captured stdout + stderr of one execution; one byte more kills the sandbox.
pub const OUTPUT_BUDGET_BYTES: usize = 1024 * 1024;
/// Bound on the final expression's repr, in UTF-8 bytes.
pub const MAX_REPR_BYTES: usize = 8 * 1024;
/// Bound on an exception message, in UTF-8 bytes.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;
/// Bound on a traceback, in UTF-8 bytes.
pub const MAX_TRACEBACK_BYTES: usize = 16 * 1024;
/// Largest protocol frame body in either direction.
pub const MAX_FRAME_BYTES: usize = 128 * 1024;
/// RLIMIT_AS for every process in the sandbox.
pub const RLIMIT_AS_BYTES: u64 = 512 * 1024 * 1024;
/// RLIMIT_FSIZE for every process in the sandbox.
pub const RLIMIT_FSIZE_BYTES: u64 = 16 * 1024 * 1024;
/// RLIMIT_NOFILE for every process in the sandbox.
pub const RLIMIT_NOFILE: u64 = 128;
/// How long the worker waits, after a result, for processes the code left
/// running, so that their output stays with the execution that started them.
pub const DRAIN_CAP: Duration = Duration::from_millis(1000);
/// Extra time the host allows past `DRAIN_CAP` for the worker's end-of-output
/// marks before it stops waiting for them.
pub const DRAIN_SLACK: Duration = Duration::from_millis(1000);
/// Stream bytes kept from the head and tail of each stream for the result
/// (the whole stream is in the log file).
pub const EXCERPT_HEAD_BYTES: usize = 16 * 1024;
pub const EXCERPT_TAIL_BYTES: usize = 8 * 1024;
/// Output a worker writes while no execution runs, kept for diagnostics.
pub const IDLE_STDERR_BYTES: usize = 4096;
/// Images sent back per execution (more are saved under /scratch only).
pub const MAX_IMAGES: usize = 4;
pub const MAX_IMAGE_BYTES: usize = 4 * 1024 * 1024;
pub const MAX_IMAGES_TOTAL_BYTES: usize = 6 * 1024 * 1024;
/// How long after an execution the spare sandbox is started.
pub const SPARE_DELAY: Duration = Duration::from_millis(20);
/// How often a running execution reports progress.
pub const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// Bytes of each stream's latest output in a progress report.
pub const PROGRESS_TAIL_BYTES: usize = 2048;
/// pi's ceiling for model-facing tool output.
pub const RESULT_MAX_BYTES: usize = 50 * 1024;
pub const RESULT_MAX_LINES: usize = 2000;
/// After the worker's channel closes, how long the sandbox may take to
/// exit by itself (so its real exit status is reported) before it is killed.
pub const DEATH_GRACE: Duration = Duration::from_millis(250);
