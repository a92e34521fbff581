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
//!
//! When a sandbox is stopped because a secret appeared while it ran, what
//! its processes wrote to /scratch since may hold the secret, and /scratch
//! outlives the sandbox. [`set_aside`] moves that scratch, whole and
//! untouched, into the session's `quarantine/` directory (inside the
//! session directory, which no sandbox can reach) before the next sandbox
//! starts, and makes a fresh empty scratch. Nothing is deleted: the
//! quarantines are kept until the session's directory is removed.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::beneath::{make_dir_in, move_noreplace, open_child_dir, Kind, Tree};
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

/// The directory of the session directory that holds set-aside scratches.
pub const QUARANTINE: &str = "quarantine";

/// Move `scratch` (an entry of the session directory `root`) aside into
/// `root/quarantine/scratch-N` (the first free `N` from `first`) and make
/// a new empty scratch in its place; returns where the old one is now, or
/// `None` when there was none.
///
/// What the sandbox could have made scratch hold does not matter: the
/// entry moves as it is (`renameat2` acts on the entry itself, on one file
/// system, within the session directory), and nothing inside it is opened,
/// followed or changed. The session directory and `quarantine/` are the
/// host's (no sandbox mounts them); both are held by fd, and a
/// `quarantine` that is not a plain directory is refused.
pub fn set_aside(root: &Path, scratch: &OsStr, first: usize) -> std::io::Result<Option<PathBuf>> {
    let session = Tree::open(root)?;
    let dir = session.root_fd();
    match make_dir_in(dir, OsStr::new(QUARANTINE), 0o700) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    let quarantine = open_child_dir(dir, OsStr::new(QUARANTINE))?;
    let mut moved = None;
    for n in first.max(1)..first.max(1) + 1000 {
        let name = format!("scratch-{n}");
        match move_noreplace(dir, scratch, quarantine.as_fd(), OsStr::new(&name)) {
            Ok(()) => {
                moved = Some(root.join(QUARANTINE).join(name));
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e),
        }
    }
    if moved.is_none() && crate::beneath::stat_in(dir, scratch)?.is_some() {
        return Err(std::io::Error::other("no free name in the quarantine directory"));
    }
    make_dir_in(dir, scratch, 0o700)?;
    Ok(moved)
}

/// What the next result says after [`set_aside`] moved scratch to `moved`.
pub fn set_aside_note(moved: &Path) -> String {
    format!(
        "/scratch was set aside because a secret appeared while this session's sandbox could write it: its files are \
         on the host at {} (never mounted in a sandbox; removed with the session) and may contain the secret; \
         /scratch is empty now",
        crate::display::one_line(&moved)
    )
}

/// The `status` line for the scratches set aside so far.
pub fn set_aside_line(moved: &[PathBuf]) -> Option<String> {
    (!moved.is_empty()).then(|| {
        let paths: Vec<String> = moved.iter().map(|p| crate::display::one_line(&p).to_string()).collect();
        format!(
            "scratch set aside {} time{} because a secret appeared while a sandbox could write it; kept (never \
             mounted, not counted in the disk use; they may contain the secret) at: {}",
            moved.len(),
            if moved.len() == 1 { "" } else { "s" },
            paths.join(", ")
        )
    })
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

    /// Scratch was replaced by an empty one: the last measurement is gone
    /// with it (a walk still running measures whichever it opened).
    pub fn forget(&self) {
        let mut st = self.state.lock();
        st.measured = None;
        st.over = false;
        st.last_start = None;
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
    fn set_aside_moves_scratch_whole_and_follows_no_link() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, outside) = (tmp.path().join("session"), tmp.path().join("outside"));
        std::fs::create_dir_all(root.join("scratch/sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("canary"), "canary").unwrap();
        std::fs::write(root.join("scratch/stolen"), "secret").unwrap();
        // What a sandbox could plant: links out of scratch, and out of the session.
        std::os::unix::fs::symlink(&outside, root.join("scratch/out")).unwrap();
        std::os::unix::fs::symlink("../..", root.join("scratch/sub/up")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("scratch/quarantine")).unwrap();
        let moved = set_aside(&root, OsStr::new("scratch"), 1).unwrap().unwrap();
        assert_eq!(moved, root.join("quarantine/scratch-1"));
        assert_eq!(std::fs::read_to_string(moved.join("stolen")).unwrap(), "secret");
        assert_eq!(std::fs::read_link(moved.join("out")).unwrap(), outside);
        assert_eq!(std::fs::read_link(moved.join("sub/up")).unwrap(), Path::new("../.."));
        assert_eq!(std::fs::read_dir(root.join("scratch")).unwrap().count(), 0, "a fresh, empty scratch");
        let names: Vec<_> = std::fs::read_dir(&outside).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["canary"], "nothing outside the session was touched");
        // A taken name is skipped, never replaced.
        std::fs::create_dir(root.join("quarantine/scratch-2")).unwrap();
        assert_eq!(set_aside(&root, OsStr::new("scratch"), 2).unwrap().unwrap(), root.join("quarantine/scratch-3"));
        assert!(root.join("quarantine/scratch-1/stolen").exists());
        // A quarantine that is a link is refused, and scratch stays.
        let other = tmp.path().join("other");
        std::fs::create_dir_all(other.join("scratch")).unwrap();
        std::os::unix::fs::symlink(&outside, other.join("quarantine")).unwrap();
        assert!(set_aside(&other, OsStr::new("scratch"), 1).is_err());
        assert!(other.join("scratch").is_dir());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
        // No scratch: a fresh one, nothing set aside.
        std::fs::remove_dir(root.join("scratch")).unwrap();
        assert_eq!(set_aside(&root, OsStr::new("scratch"), 1).unwrap(), None);
        assert!(root.join("scratch").is_dir());
    }

    #[test]
    fn the_set_aside_note_names_the_place_on_one_line() {
        let note = set_aside_note(Path::new("/tmp/s/quarantine/scratch-1\n\u{1b}[2J"));
        assert!(!note.contains('\n') && !note.contains('\u{1b}'), "{note}");
        assert!(note.contains("/tmp/s/quarantine/scratch-1") && note.contains("may contain the secret"), "{note}");
        assert_eq!(set_aside_line(&[]), None);
        let line = set_aside_line(&["/a".into(), "/b".into()]).unwrap();
        assert!(line.starts_with("scratch set aside 2 times") && line.ends_with("at: /a, /b"), "{line}");
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
