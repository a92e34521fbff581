//! Every limit of the sandbox, in one place.
//!
//! The per-execution timeout is the only limit a caller may vary, and the
//! sizes of the sandbox's memory-backed file systems the only ones the user
//! may (through the environment, read by `options`);
//! everything else here is a constant so that `status` can report it and
//! tests can pin it.

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
/// How long a bubblewrap whose sandbox could not be prepared has to end by
/// itself (it failed on its own) before it is killed (it waits for us).
pub const BWRAP_GONE: Duration = Duration::from_millis(500);
/// Captured stdout + stderr of one execution; one byte more kills the sandbox.
pub const OUTPUT_BUDGET_BYTES: usize = 1024 * 1024;
/// What one command of the bash tool may write (pi keeps every byte in a
/// file on the host); past it the command is stopped.
pub const SHELL_OUTPUT_CAP_BYTES: usize = 64 * 1024 * 1024;
/// Bound on the final expression's repr, in UTF-8 bytes.
pub const MAX_REPR_BYTES: usize = 8 * 1024;
/// Bound on an exception message, in UTF-8 bytes.
pub const MAX_MESSAGE_BYTES: usize = 8 * 1024;
/// Bound on a traceback, in UTF-8 bytes.
pub const MAX_TRACEBACK_BYTES: usize = 16 * 1024;
/// Largest protocol frame body in either direction.
pub const MAX_FRAME_BYTES: usize = 128 * 1024;
/// The most base64 text of the worker's compiled image the host collects
/// at a start, over all its code frames (the image is about 100 KiB).
pub const MAX_CODE_IMAGE_TEXT: usize = 1024 * 1024;
/// RLIMIT_AS for every process in the sandbox.
pub const RLIMIT_AS_BYTES: u64 = 512 * 1024 * 1024;
/// RLIMIT_FSIZE for every process in the sandbox.
pub const RLIMIT_FSIZE_BYTES: u64 = 16 * 1024 * 1024;
/// RLIMIT_NOFILE for every process in the sandbox.
pub const RLIMIT_NOFILE: u64 = 128;
/// RLIMIT_SIGPENDING for every process in the sandbox: the signals queued
/// and POSIX timers made by all of one sandbox's processes together (the
/// kernel counts them per user in each user namespace, and every count up
/// to the host's is charged). Without it the sandbox inherits pi's limit,
/// 96,367 on a 23.5 GiB host, and one process queueing that many to
/// itself leaves every other program of pi's user unable to make a timer
/// or queue a signal (`EAGAIN`) until it ends.
pub const RLIMIT_SIGPENDING: u64 = 1024;
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
/// The worker's bounds as it takes them on its command line: the host's
/// constants are their only source.
pub fn worker_limits() -> String {
    format!(
        "frame={MAX_FRAME_BYTES},repr={MAX_REPR_BYTES},message={MAX_MESSAGE_BYTES},traceback={MAX_TRACEBACK_BYTES},\
         drain_ms={},images={MAX_IMAGES},image_bytes={MAX_IMAGE_BYTES},images_total={MAX_IMAGES_TOTAL_BYTES}",
        DRAIN_CAP.as_millis()
    )
}

/// pi's ceiling for model-facing tool output.
pub const RESULT_MAX_BYTES: usize = 50 * 1024;
pub const RESULT_MAX_LINES: usize = 2000;
/// After the worker's channel closes, how long the sandbox may take to
/// exit by itself (so its real exit status is reported) before it is killed.
pub const DEATH_GRACE: Duration = Duration::from_millis(250);

/// Size of the sandbox's `/tmp` (a tmpfs, so RAM): what code leaves there
/// outlives its processes, so it is capped. Half the address space one
/// process may have: room for the temporary files of ordinary data work,
/// while larger outputs belong in `/scratch`, on disk.
pub const DEFAULT_TMP_BYTES: u64 = 256 * 1024 * 1024;
/// Size of the sandbox's `/dev/shm` (POSIX shared memory and semaphores,
/// `multiprocessing`'s among them): the size Docker gives a container's.
pub const DEFAULT_SHM_BYTES: u64 = 64 * 1024 * 1024;
/// Environment variables that change those sizes (bytes, or a whole number
/// with a K, M or G suffix).
pub const TMP_SIZE_ENV: &str = "PI_SANDBOX_TMP_SIZE";
pub const SHM_SIZE_ENV: &str = "PI_SANDBOX_SHM_SIZE";

/// The sizes of the sandbox's memory-backed file systems, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmpfsSizes {
    pub tmp: u64,
    pub shm: u64,
}

/// `4096`, `512K`, `256M`, `1g`: bytes, or a whole number of KiB, MiB or
/// GiB. Zero is no size (to a tmpfs it would mean "unlimited").
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_uppercase()),
        _ => (text, 'B'),
    };
    let shift = match unit {
        'B' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        _ => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let bytes = n.checked_mul(1 << shift)?;
    (bytes > 0).then_some(bytes)
}

/// A setting whose value cannot be used; no sandbox starts until it is
/// fixed (the text says which setting and what to set).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error(
        "{name}={value:?} is not a size: set it to a number of bytes, or a whole number with K, M or G (such as \
         256M), or unset it for the default of {}",
        describe_size(*default)
    )]
    Size { name: &'static str, value: String, default: u64 },
    #[error("{name}={value:?} is not a whole number of at least {min}")]
    TooFew { name: &'static str, value: String, min: u64 },
    #[error("{name}={value:?} is not a size of at least {} (bytes, or a number with K, M or G)", describe_size(*min))]
    TooSmall { name: &'static str, value: String, min: u64 },
}

impl SettingError {
    /// The same error, naming its variable as `f` says.
    pub fn renamed(self, f: impl Fn(&'static str) -> &'static str) -> SettingError {
        match self {
            SettingError::Size { name, value, default } => SettingError::Size { name: f(name), value, default },
            SettingError::TooFew { name, value, min } => SettingError::TooFew { name: f(name), value, min },
            SettingError::TooSmall { name, value, min } => SettingError::TooSmall { name: f(name), value, min },
        }
    }
}

/// The sizes set by the two environment values (`None` or blank: the
/// default), or what is wrong with one of them.
pub fn tmpfs_sizes(tmp: Option<&str>, shm: Option<&str>) -> Result<TmpfsSizes, SettingError> {
    let size = |name: &'static str, value: Option<&str>, default: u64| match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) => parse_size(v).ok_or_else(|| SettingError::Size { name, value: v.to_string(), default }),
    };
    Ok(TmpfsSizes {
        tmp: size(TMP_SIZE_ENV, tmp, DEFAULT_TMP_BYTES)?,
        shm: size(SHM_SIZE_ENV, shm, DEFAULT_SHM_BYTES)?,
    })
}

/// `256 MiB`, `1536 KiB`, `1000 bytes`.
pub fn describe_size(bytes: u64) -> String {
    match bytes {
        b if b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_gets_every_bound_it_enforces() {
        let l = worker_limits();
        for (name, value) in [
            ("frame", MAX_FRAME_BYTES),
            ("repr", MAX_REPR_BYTES),
            ("message", MAX_MESSAGE_BYTES),
            ("traceback", MAX_TRACEBACK_BYTES),
            ("drain_ms", DRAIN_CAP.as_millis() as usize),
            ("images", MAX_IMAGES),
            ("image_bytes", MAX_IMAGE_BYTES),
            ("images_total", MAX_IMAGES_TOTAL_BYTES),
        ] {
            assert!(l.split(',').any(|kv| kv == format!("{name}={value}")), "{name} missing in {l}");
        }
        assert_eq!(l.split(',').count(), 8, "the worker refuses names it does not know: {l}");
    }

    #[test]
    fn sizes_are_bytes_or_whole_numbers_of_k_m_g() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size(" 512k "), Some(512 << 10));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        for bad in
            ["", "0", "0M", "M", "1.5G", "-1", "12T", "1MiB", "1 M", "ten", "99999999999999999999", "17179869184G"]
        {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unset_or_blank_means_the_default_and_a_bad_value_is_an_error_naming_it() {
        let defaults = TmpfsSizes { tmp: DEFAULT_TMP_BYTES, shm: DEFAULT_SHM_BYTES };
        assert_eq!(tmpfs_sizes(None, None), Ok(defaults));
        assert_eq!(tmpfs_sizes(Some(" "), Some("")), Ok(defaults));
        assert_eq!(tmpfs_sizes(Some("8M"), Some("2m")), Ok(TmpfsSizes { tmp: 8 << 20, shm: 2 << 20 }));
        let err = tmpfs_sizes(Some("lots"), None).unwrap_err().to_string();
        assert_eq!(
            err,
            "PI_SANDBOX_TMP_SIZE=\"lots\" is not a size: set it to a number of bytes, or a whole number with \
             K, M or G (such as 256M), or unset it for the default of 256 MiB"
        );
        assert!(tmpfs_sizes(None, Some("0"))
            .unwrap_err()
            .to_string()
            .starts_with("PI_SANDBOX_SHM_SIZE=\"0\" is not a size"));
    }

    #[test]
    fn sizes_are_described_in_the_largest_whole_unit() {
        assert_eq!(describe_size(DEFAULT_TMP_BYTES), "256 MiB");
        assert_eq!(describe_size(1 << 30), "1 GiB");
        assert_eq!(describe_size(1536 << 10), "1536 KiB");
        assert_eq!(describe_size(1000), "1000 bytes");
    }
}
