//! Output of one execution: the end-mark scanner, the shared byte budget,
//! the head/tail excerpts kept for the result, and the log files.
//!
//! Every byte accepted into the budget goes to the stream's log file; the
//! result keeps only the head and tail of each stream, as the text to show
//! (through [`crate::display::StreamText`]: colour dropped, carriage-return
//! progress at its last state, every other control a stand-in). Bytes after
//! a stream's end mark belong to no execution and are dropped.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::display::StreamText;
use crate::limits::{EXCERPT_HEAD_BYTES, EXCERPT_TAIL_BYTES, OUTPUT_BUDGET_BYTES};

/// Finds an end mark in a byte stream delivered in arbitrary chunks.
#[derive(Debug)]
pub struct MarkScanner {
    mark: Vec<u8>,
    /// A suffix of the stream so far that may be the start of the mark.
    held: Vec<u8>,
    pub found: bool,
}

impl MarkScanner {
    pub fn new(mark: Vec<u8>) -> Self {
        Self { mark, held: Vec::new(), found: false }
    }

    /// Feed a chunk; returns the bytes that are certainly output (before the
    /// mark). After the mark is found everything is dropped.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.found {
            return Vec::new();
        }
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(chunk);
        if let Some(at) = memchr::memmem::find(&data, &self.mark) {
            self.found = true;
            data.truncate(at);
            return data;
        }
        // Hold back the longest suffix that is a proper prefix of the mark.
        let keep = (1..self.mark.len().min(data.len() + 1))
            .rev()
            .find(|&n| data[data.len() - n..] == self.mark[..n])
            .unwrap_or(0);
        self.held = data.split_off(data.len() - keep);
        data
    }

    /// The stream ended without a mark: what was held back is output.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

/// In the merged view ([`Capture::output`]), where the lines of stdout
/// begin. Never in shown text: every control but tab and newline is a
/// stand-in there.
pub const TO_STDOUT: char = '\x1f';
/// In the merged view, where the lines of stderr begin.
pub const TO_STDERR: char = '\x1e';

/// The stream a switch mark names.
pub fn mark_stream(byte: u8) -> Option<Stream> {
    match byte {
        0x1f => Some(Stream::Stdout),
        0x1e => Some(Stream::Stderr),
        _ => None,
    }
}

/// Head and tail of a stream's shown text, with the stream's total size.
#[derive(Debug, Clone, Default)]
pub struct Excerpt {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    /// Bytes of shown text so far (head, tail and what fell between).
    shown: usize,
    /// Lines of shown text so far (newlines).
    lines: usize,
    /// The last switch mark that fell out between head and tail.
    dropped_mark: Option<u8>,
    /// What the stream still holds back: an unfinished line or sequence.
    text: StreamText,
    /// Bytes the stream wrote (raw, as the budget counts them).
    pub total: usize,
}

impl Excerpt {
    /// Take raw bytes of the stream; returns the text it made final.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.total += bytes.len();
        let shown = self.text.push(bytes);
        self.keep(shown.as_bytes());
        shown
    }

    /// What the stream holds back (an unfinished line), as it stands.
    fn held(&self) -> String {
        self.text.clone().finish()
    }

    /// Keep shown text in the head, else the tail.
    fn keep(&mut self, mut bytes: &[u8]) {
        self.shown += bytes.len();
        self.lines += memchr::memchr_iter(b'\n', bytes).count();
        let room = EXCERPT_HEAD_BYTES - self.head.len();
        if room > 0 {
            let n = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= EXCERPT_TAIL_BYTES {
            let (a, b) = self.tail.as_slices();
            let mark = last_mark_in(&[a, b, &bytes[..bytes.len() - EXCERPT_TAIL_BYTES]]);
            self.dropped_mark = mark.or(self.dropped_mark);
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - EXCERPT_TAIL_BYTES..]);
        } else {
            let overflow = (self.tail.len() + bytes.len()).saturating_sub(EXCERPT_TAIL_BYTES);
            if overflow > 0 {
                let (a, b) = self.tail.as_slices();
                let (a, b) =
                    if overflow <= a.len() { (&a[..overflow], &b[..0]) } else { (a, &b[..overflow - a.len()]) };
                let mark = last_mark_in(&[a, b]);
                self.dropped_mark = mark.or(self.dropped_mark);
            }
            self.tail.drain(..overflow);
            self.tail.extend(bytes);
        }
    }

    /// Lines of shown text so far, an unfinished last line counted.
    fn line_count(&self) -> usize {
        let ends_open = match self.tail.back().or(self.head.last()) {
            Some(b) => *b != b'\n',
            None => false,
        };
        self.lines + usize::from(ends_open)
    }

    /// This excerpt with what the stream holds back shown as it stands
    /// (the current state of an unfinished line): what a reader sees now.
    fn settled(&self) -> std::borrow::Cow<'_, Excerpt> {
        let rest = self.text.clone().finish();
        if rest.is_empty() {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut now = self.clone();
        now.keep(rest.as_bytes());
        std::borrow::Cow::Owned(now)
    }

    /// The last `max` bytes of text shown so far.
    pub fn latest(&self, max: usize) -> String {
        let e = self.settled();
        let tail: Vec<u8> = e.tail.iter().copied().collect();
        let mut all: Vec<u8> = if e.head.len() + tail.len() == e.shown {
            let mut v = e.head.clone();
            v.extend_from_slice(&tail);
            v
        } else {
            tail
        };
        if all.len() > max {
            all.drain(..all.len() - max);
        }
        String::from_utf8_lossy(trim_incomplete_start(&all)).into_owned()
    }

    /// (head, bytes of shown text omitted, tail), cut on character
    /// boundaries; what the stream holds back is shown as it stands.
    pub fn parts(&self) -> (String, usize, String) {
        Self::cut(&self.settled())
    }

    /// [`Self::parts`] with the lines omitted (whole or partial lines
    /// between head and tail) and, for the merged view, the stream in
    /// force where the tail begins.
    pub fn cut_parts(&self) -> Cut {
        Self::counted(&self.settled())
    }

    fn counted(e: &Excerpt) -> Cut {
        let (head, omitted, tail) = Self::cut(e);
        let omitted_lines = if omitted == 0 {
            0
        } else {
            let open = |s: &str| usize::from(!s.is_empty() && !s.ends_with('\n'));
            let kept = head.matches('\n').count() + tail.matches('\n').count() + open(&tail);
            // A line cut by the head's end and the tail's start counts as omitted once.
            e.line_count().saturating_sub(kept).max(1)
        };
        let lead = if omitted == 0 {
            None
        } else {
            e.dropped_mark.or_else(|| memchr::memrchr2(0x1e, 0x1f, head.as_bytes()).map(|i| head.as_bytes()[i]))
        };
        Cut { head, omitted, omitted_lines, tail, lead: lead.and_then(mark_stream) }
    }

    fn cut(e: &Excerpt) -> (String, usize, String) {
        let kept = e.head.len() + e.tail.len();
        let omitted = e.shown - kept;
        let tail: Vec<u8> = e.tail.iter().copied().collect();
        if omitted == 0 {
            let mut all = e.head.clone();
            all.extend_from_slice(&tail);
            return (String::from_utf8_lossy(&all).into_owned(), 0, String::new());
        }
        let head = trim_incomplete_end(&e.head);
        let tail = trim_incomplete_start(&tail);
        let omitted = e.shown - head.len() - tail.len();
        (String::from_utf8_lossy(head).into_owned(), omitted, String::from_utf8_lossy(tail).into_owned())
    }
}

/// An excerpt as a result shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    pub head: String,
    /// Bytes of shown text between head and tail.
    pub omitted: usize,
    /// Lines between head and tail (a line cut by either counted).
    pub omitted_lines: usize,
    pub tail: String,
    /// In the merged view with an omission: the stream whose lines the tail
    /// begins with (its mark fell out with the omitted text).
    pub lead: Option<Stream>,
}

/// The last switch mark in `parts` (in order).
fn last_mark_in(parts: &[&[u8]]) -> Option<u8> {
    parts.iter().rev().find_map(|p| memchr::memrchr2(0x1e, 0x1f, p).map(|i| p[i]))
}

/// Drop a UTF-8 sequence cut off at the end of `b`.
fn trim_incomplete_end(b: &[u8]) -> &[u8] {
    for back in 1..=3.min(b.len()) {
        let byte = b[b.len() - back];
        if byte & 0xC0 != 0x80 {
            // A lead byte: is its sequence complete?
            let need = match byte {
                0x00..=0x7F => 1,
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            return if need > back { &b[..b.len() - back] } else { b };
        }
    }
    b
}

/// Drop continuation bytes at the start of `b` (the rest of a cut character).
fn trim_incomplete_start(b: &[u8]) -> &[u8] {
    let skip = b.iter().take(3).take_while(|&&x| x & 0xC0 == 0x80).count();
    &b[skip..]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A log file created on its first byte, so that a quiet execution costs
/// no file system work.
/// A log file that could not be written (the result says so; output
/// capture goes on).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct LogError {
    pub path: PathBuf,
    pub source: std::sync::Arc<std::io::Error>,
}

#[derive(Debug)]
pub struct LazyLog {
    path: PathBuf,
    file: Option<File>,
    failed: bool,
}

impl LazyLog {
    pub fn new(path: PathBuf) -> Self {
        Self { path, file: None, failed: false }
    }

    fn write(&mut self, data: &[u8]) -> Result<(), LogError> {
        if self.failed {
            return Ok(());
        }
        let file = match &mut self.file {
            Some(file) => file,
            None => {
                let opened = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&self.path);
                self.file.insert(opened.map_err(|source| {
                    self.failed = true;
                    LogError { path: self.path.clone(), source: std::sync::Arc::new(source) }
                })?)
            }
        };
        file.write_all(data).map_err(|source| {
            self.failed = true;
            LogError { path: self.path.clone(), source: std::sync::Arc::new(source) }
        })
    }
}

/// Both streams' shown text in the order it was made final (a line where
/// it ends), each run of one stream's lines after its switch mark
/// ([`TO_STDOUT`], [`TO_STDERR`]).
#[derive(Debug, Clone, Default)]
pub struct Merged {
    excerpt: Excerpt,
    current: Option<Stream>,
}

impl Merged {
    fn add(&mut self, stream: Stream, shown: &str) {
        if shown.is_empty() {
            return;
        }
        if self.current != Some(stream) {
            self.current = Some(stream);
            let mark = match stream {
                Stream::Stdout => TO_STDOUT,
                Stream::Stderr => TO_STDERR,
            };
            self.excerpt.keep(mark.encode_utf8(&mut [0; 1]).as_bytes());
        }
        self.excerpt.keep(shown.as_bytes());
    }

    /// Total raw bytes of both streams.
    pub fn total(&self) -> usize {
        self.excerpt.total
    }
}

/// Capture state of one execution.
pub struct Capture {
    pub stdout: Excerpt,
    pub stderr: Excerpt,
    merged: Merged,
    out_mark: MarkScanner,
    err_mark: MarkScanner,
    out_log: LazyLog,
    err_log: LazyLog,
    /// Set once the shared budget is exceeded; nothing more is accepted.
    pub overflowed: bool,
    pub log_error: Option<LogError>,
}

impl Capture {
    pub fn new(mark: Vec<u8>, out_log: PathBuf, err_log: PathBuf) -> Self {
        Self {
            stdout: Excerpt::default(),
            stderr: Excerpt::default(),
            merged: Merged::default(),
            out_mark: MarkScanner::new(mark.clone()),
            err_mark: MarkScanner::new(mark),
            out_log: LazyLog::new(out_log),
            err_log: LazyLog::new(err_log),
            overflowed: false,
            log_error: None,
        }
    }

    pub fn accepted(&self) -> usize {
        self.stdout.total + self.stderr.total
    }

    /// Both streams in one excerpt, in the order written, with what each
    /// holds back (an unfinished line) at the end: stdout's, then stderr's.
    pub fn output(&self) -> Cut {
        let mut m = self.merged.clone();
        m.add(Stream::Stdout, &self.stdout.held());
        m.add(Stream::Stderr, &self.stderr.held());
        Excerpt::counted(&m.excerpt)
    }

    /// The latest `max` bytes of the merged view (switch marks included).
    pub fn latest_output(&self, max: usize) -> String {
        let mut m = self.merged.clone();
        m.add(Stream::Stdout, &self.stdout.held());
        m.add(Stream::Stderr, &self.stderr.held());
        let latest = m.excerpt.latest(max);
        if latest.as_bytes().first().copied().and_then(mark_stream).is_some() {
            return latest;
        }
        // The stream in force where the latest text begins.
        let all = m.excerpt.latest(usize::MAX);
        let before = &all.as_bytes()[..all.len() - latest.len()];
        let lead = memchr::memrchr2(0x1e, 0x1f, before).map(|i| before[i]).or_else(|| {
            let e = &m.excerpt;
            e.dropped_mark.or_else(|| memchr::memrchr2(0x1e, 0x1f, &e.head).map(|i| e.head[i]))
        });
        match lead {
            Some(mark) => format!("{}{latest}", mark as char),
            None => latest,
        }
    }

    pub fn mark_seen(&self, stream: Stream) -> bool {
        match stream {
            Stream::Stdout => self.out_mark.found,
            Stream::Stderr => self.err_mark.found,
        }
    }

    /// Take a chunk read from `stream`.
    pub fn feed(&mut self, stream: Stream, chunk: &[u8]) {
        let data = match stream {
            Stream::Stdout => self.out_mark.feed(chunk),
            Stream::Stderr => self.err_mark.feed(chunk),
        };
        self.accept(stream, &data);
    }

    /// The stream reached EOF: release what the scanner held back.
    pub fn finish(&mut self, stream: Stream) {
        let data = match stream {
            Stream::Stdout => self.out_mark.finish(),
            Stream::Stderr => self.err_mark.finish(),
        };
        self.accept(stream, &data);
    }

    fn accept(&mut self, stream: Stream, data: &[u8]) {
        if self.overflowed || data.is_empty() {
            return;
        }
        let room = OUTPUT_BUDGET_BYTES - self.accepted();
        let take = &data[..room.min(data.len())];
        if take.len() < data.len() {
            self.overflowed = true;
        }
        let (excerpt, log) = match stream {
            Stream::Stdout => (&mut self.stdout, &mut self.out_log),
            Stream::Stderr => (&mut self.stderr, &mut self.err_log),
        };
        let shown = excerpt.push(take);
        self.merged.excerpt.total += take.len();
        self.merged.add(stream, &shown);
        if let Err(e) = log.write(take) {
            self.log_error.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_split_across_chunks_is_found_and_removed() {
        let mark = b"\0END\0".to_vec();
        let mut s = MarkScanner::new(mark);
        let mut out = s.feed(b"hello\0E");
        out.extend(s.feed(b"N"));
        out.extend(s.feed(b"D\0late"));
        assert_eq!(out, b"hello");
        assert!(s.found);
        assert!(s.feed(b"more").is_empty());
    }

    #[test]
    fn a_false_start_of_the_mark_is_released_as_output() {
        let mut s = MarkScanner::new(b"\0END\0".to_vec());
        let mut out = s.feed(b"a\0EN");
        assert_eq!(out, b"a");
        out.extend(s.feed(b"x"));
        assert_eq!(out, b"a\0ENx");
        out.extend(s.feed(b"\0"));
        assert_eq!(s.finish(), b"\0");
    }

    #[test]
    fn excerpt_keeps_whole_stream_when_small() {
        let mut e = Excerpt::default();
        e.push(b"abc");
        e.push(b"def");
        assert_eq!(e.parts(), ("abcdef".into(), 0, String::new()));
    }

    #[test]
    fn excerpt_keeps_head_and_tail_of_a_long_stream() {
        let mut e = Excerpt::default();
        let total = EXCERPT_HEAD_BYTES + EXCERPT_TAIL_BYTES + 1000;
        for i in 0..total {
            e.push(&[b'a' + (i % 26) as u8]);
        }
        let (head, omitted, tail) = e.parts();
        assert_eq!(head.len(), EXCERPT_HEAD_BYTES);
        assert_eq!(tail.len(), EXCERPT_TAIL_BYTES);
        assert_eq!(omitted, 1000);
        assert!(head.starts_with("abc"));
        let last = (b'a' + ((total - 1) % 26) as u8) as char;
        assert!(tail.ends_with(last));
    }

    #[test]
    fn excerpt_cuts_never_split_a_character() {
        let mut e = Excerpt::default();
        let text = "é".repeat(EXCERPT_HEAD_BYTES); // 2 bytes each: head cuts mid-way? no, even
        e.push(b"x");
        e.push(text.as_bytes());
        let (head, omitted, tail) = e.parts();
        assert!(!head.contains('\u{FFFD}') && !tail.contains('\u{FFFD}'));
        assert_eq!(head.len() + omitted + tail.len(), 1 + text.len());
    }

    #[test]
    fn excerpt_shows_readable_text() {
        let mut e = Excerpt::default();
        e.push(b"\x1b[32mok\x1b[0m\ndownload  0%\rdownload 5");
        assert_eq!(e.latest(100), "ok\ndownload 5", "an unfinished line is shown as it stands");
        e.push(b"0%\r");
        e.push(b"\ndone \x1b]0;title\x07\r");
        assert_eq!(e.parts(), ("ok\ndownload 50%\ndone \u{241B}]0;title\u{2407}".into(), 0, String::new()));
        assert_eq!(e.total, 55, "the raw bytes are counted");
    }

    #[test]
    fn progress_flood_collapses_without_omission() {
        let mut e = Excerpt::default();
        for i in 0..100_000 {
            e.push(format!("\rprogress {:3}%", i % 101).as_bytes());
        }
        e.push(b"\nfinished\n");
        assert!(e.total > 1_000_000);
        assert_eq!(e.parts(), ("progress   9%\nfinished\n".into(), 0, String::new()));
    }

    #[test]
    fn omitted_counts_shown_bytes() {
        let mut e = Excerpt::default();
        let line = "\x1b[1mbold\x1b[0m line\n"; // 10 shown bytes of 18
        for _ in 0..10_000 {
            e.push(line.as_bytes());
        }
        let (head, omitted, tail) = e.parts();
        assert!(head.starts_with("bold line\n") && tail.ends_with("bold line\n"));
        assert_eq!(head.len() + omitted + tail.len(), 100_000);
        assert_eq!(e.total, 180_000);
    }

    fn capture() -> (tempfile::TempDir, Capture) {
        let tmp = tempfile::tempdir().expect("dir");
        let c = Capture::new(b"\0M\0".to_vec(), tmp.path().join("out"), tmp.path().join("err"));
        (tmp, c)
    }

    #[test]
    fn merged_output_keeps_the_order_of_arrival_with_switch_marks() {
        let (_tmp, mut c) = capture();
        c.feed(Stream::Stdout, b"a\nb");
        c.feed(Stream::Stderr, b"\x1b[31mwarn\x1b[0m\n");
        c.feed(Stream::Stdout, b"\nc\n");
        c.feed(Stream::Stderr, b"late");
        let out = c.output();
        // A line is placed where it ends; an unfinished one at the end.
        assert_eq!(out.head, "\x1fa\n\x1ewarn\n\x1fb\nc\n\x1elate");
        assert_eq!((out.omitted, out.omitted_lines, out.lead), (0, 0, None));
        assert_eq!(c.latest_output(7), "\x1fc\n\x1elate", "the latest text names its stream");
        assert_eq!(c.latest_output(4), "\x1elate");
        assert_eq!(c.stdout.parts().0, "a\nb\nc\n", "each stream's own excerpt is unchanged");
    }

    #[test]
    fn merged_output_cut_says_lines_and_the_stream_after_the_gap() {
        let (_tmp, mut c) = capture();
        let line = "0123456789\n";
        let lines = (EXCERPT_HEAD_BYTES + EXCERPT_TAIL_BYTES) / line.len() + 100;
        c.feed(Stream::Stdout, line.repeat(lines / 2).as_bytes());
        c.feed(Stream::Stderr, line.repeat(lines - lines / 2).as_bytes());
        let out = c.output();
        assert!(out.omitted > 0);
        assert_eq!(out.lead, Some(Stream::Stderr), "the tail is stderr's, its mark fell in the gap");
        let kept = out.head.matches('\n').count() + out.tail.matches('\n').count();
        // One line may be cut by the head's end and another by the tail's start.
        assert!((lines - kept..=lines - kept + 2).contains(&out.omitted_lines), "{} of {lines}", out.omitted_lines);
        assert_eq!(out.head.len() + out.omitted + out.tail.len(), lines * line.len() + 2, "two marks");
    }

    #[test]
    fn budget_is_shared_and_exact() {
        let tmp = tempfile::tempdir().expect("dir");
        let dir = tmp.path();
        let mut c = Capture::new(b"\0M\0".to_vec(), dir.join("no/out"), dir.join("no/err"));
        c.feed(Stream::Stdout, &vec![b'a'; OUTPUT_BUDGET_BYTES - 10]);
        c.feed(Stream::Stderr, &[b'b'; 10]);
        assert!(!c.overflowed, "exactly the budget is fine");
        c.feed(Stream::Stdout, b"c");
        assert!(c.overflowed);
        assert_eq!(c.accepted(), OUTPUT_BUDGET_BYTES);
    }

    #[test]
    fn accepted_bytes_reach_the_log_and_marks_do_not() {
        let tmp = tempfile::tempdir().expect("dir");
        let dir = tmp.path();
        let path = dir.join("out.log");
        let err_path = dir.join("err.log");
        let mut c = Capture::new(b"\0M\0".to_vec(), path.clone(), err_path.clone());
        c.feed(Stream::Stdout, b"one\ntwo\0M\0after");
        drop(c);
        assert_eq!(std::fs::read(&path).expect("read"), b"one\ntwo");
        assert!(!err_path.exists(), "a quiet stream makes no file");
    }
}
