//! How much disk a session's `/scratch` holds: nothing caps it (it is a
//! directory of the host's file system), so `status` and a note on a later
//! result say when it grows past a threshold.
//!
//! The size is the file system's own accounting of each entry (allocated
//! blocks, so a sparse file counts what it really uses), summed by the
//! bounded walk of `scan`, which never follows a link the sandbox planted.
//! A walk runs on a blocking thread, after an execution's result is out, at
//! most every [`CHECK_EVERY`]: never on the warm path. What the note says
//! reaches the result after the one that triggered the walk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::beneath::{Kind, Tree};
use crate::limits::{describe_size, parse_size};
use crate::protected::Notes;
use crate::scan::{walk, Limits, Visit};

/// The size of /scratch past which results and `status` say so.
pub const SCRATCH_NOTE_ENV: &str = "PI_SANDBOX_SCRATCH_NOTE";
pub const DEFAULT_SCRATCH_NOTE: u64 = 1 << 30;
/// Walks of /scratch start at most this often.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The walk's bounds: a scratch with more entries is reported as "at least".
pub const WALK_LIMITS: Limits = Limits { max_entries: 50_000, max_depth: 32 };

/// The threshold set by the environment value (bytes, or a number with K,
/// M or G); anything else keeps the default.
pub fn note_threshold(value: Option<&str>) -> u64 {
    value.and_then(parse_size).unwrap_or(DEFAULT_SCRATCH_NOTE)
}

/// One measurement of /scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measure {
    pub bytes: u64,
    /// Every entry was seen (else `bytes` is a lower bound).
    pub complete: bool,
}

/// The disk that `root`'s entries use, by a bounded walk that never follows
/// a link (a link counts its own blocks only).
pub fn measure(root: &Path, limits: Limits) -> std::io::Result<Measure> {
    let tree = Tree::open(root)?;
    let mut bytes = 0u64;
    let summary = walk(&tree, limits, |rel, kind| {
        if let Ok(Some(st)) = tree.lstat(rel) {
            bytes = bytes.saturating_add((st.st_blocks as u64).saturating_mul(512));
        }
        if kind == Kind::Dir {
            Visit::Descend
        } else {
            Visit::Skip
        }
    });
    Ok(Measure { bytes, complete: summary.complete })
}

#[derive(Debug, Default)]
struct State {
    last_start: Option<Instant>,
    running: bool,
    measured: Option<Measure>,
    /// Past the threshold at the last walk (so the note comes once per
    /// crossing, not after every execution).
    over: bool,
}

/// A session's view of its /scratch.
#[derive(Debug, Default)]
pub struct ScratchWatch {
    state: parking_lot::Mutex<State>,
    /// The size past which results say so (`PI_SANDBOX_SCRATCH_NOTE`,
    /// read when the session was made).
    threshold: u64,
}

impl ScratchWatch {
    pub fn new(threshold: u64) -> Self {
        ScratchWatch { state: parking_lot::Mutex::default(), threshold }
    }
}

/// The note a measurement gives, when it crossed `threshold`.
pub fn crossing_note(m: Measure, threshold: u64, was_over: bool) -> Option<String> {
    (m.bytes > threshold && !was_over).then(|| {
        format!(
            "/scratch now holds {}{} on the host's disk, past the {} this tool notes ({SCRATCH_NOTE_ENV}); \
             nothing caps it: delete what is no longer needed",
            if m.complete { "" } else { "at least " },
            describe_size_approx(m.bytes),
            describe_size(threshold)
        )
    })
}

/// `1.3 GiB`, `12 MiB`, `4 KiB`.
pub fn describe_size_approx(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b.div_ceil(1024)),
    }
}

impl ScratchWatch {
    /// After an execution: measure `scratch` on a blocking thread if the
    /// last walk began [`CHECK_EVERY`] ago or more (or never) and none runs;
    /// a crossing of the threshold becomes a note in `notes`.
    pub fn poke(self: &Arc<Self>, scratch: &Path, notes: &Notes) {
        {
            let mut st = self.state.lock();
            if st.running || st.last_start.is_some_and(|t| t.elapsed() < CHECK_EVERY) {
                return;
            }
            st.running = true;
            st.last_start = Some(Instant::now());
        }
        let (me, scratch, notes): (Arc<Self>, PathBuf, Notes) = (self.clone(), scratch.into(), notes.clone());
        let run = move || {
            let threshold = me.threshold;
            let measured = measure(&scratch, WALK_LIMITS).ok();
            let mut st = me.state.lock();
            st.running = false;
            if let Some(m) = measured {
                if let Some(note) = crossing_note(m, threshold, st.over) {
                    notes.lock().push(note);
                }
                st.over = m.bytes > threshold;
                st.measured = Some(m);
            }
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::task::spawn_blocking(run);
        } else {
            let _ = std::thread::Builder::new().name("pps-scratch".into()).spawn(run);
        }
    }

    /// The last measurement, if any.
    pub fn last(&self) -> Option<Measure> {
        self.state.lock().measured
    }
}

/// The `status` line for a measurement.
pub fn describe(m: Option<Measure>, threshold: u64) -> String {
    let noted = format!("a note past {} ({SCRATCH_NOTE_ENV}); not capped", describe_size(threshold));
    match m {
        None => format!("scratch disk use: not measured yet; {noted}"),
        Some(m) => format!(
            "scratch disk use: {}{} at the last check{}; {noted}",
            if m.complete { "" } else { "at least " },
            describe_size_approx(m.bytes),
            if m.bytes > threshold { " (PAST THE THRESHOLD)" } else { "" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_allocated_blocks_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/one"), vec![1u8; 256 * 1024]).unwrap();
        // A sparse file: its length is not what it uses.
        let sparse = std::fs::File::create(root.join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        // A link to a big tree is a link, not the tree.
        std::os::unix::fs::symlink("/usr", root.join("usr-link")).unwrap();
        let m = measure(root, WALK_LIMITS).unwrap();
        assert!(m.complete);
        assert!((256 * 1024..1 << 20).contains(&m.bytes), "{m:?}");
        let bounded = measure(root, Limits { max_entries: 2, max_depth: 32 }).unwrap();
        assert!(!bounded.complete);
    }

    #[test]
    fn the_note_comes_once_per_crossing() {
        let big = Measure { bytes: 3 << 29, complete: true };
        let note = crossing_note(big, 1 << 30, false).unwrap();
        assert!(note.contains("1.5 GiB") && note.contains("past the 1 GiB"), "{note}");
        assert_eq!(crossing_note(big, 1 << 30, true), None);
        assert_eq!(crossing_note(Measure { bytes: 1 << 20, complete: true }, 1 << 30, false), None);
        assert_eq!(note_threshold(Some("10M")), 10 << 20);
        assert_eq!(note_threshold(Some("x")), DEFAULT_SCRATCH_NOTE);
        assert!(describe(Some(big), 1 << 30).contains("PAST THE THRESHOLD"));
    }
}
