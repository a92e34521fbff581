//! One call's output as a result shows it: the merged stdout and stderr
//! (their switch marks from `capture`), made safe to show, laid out under
//! stream headers where the stream changes, and fitted into the result's
//! share of the ceiling with one line that counts what was left out.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::capture::{mark_stream, Stream, TO_STDERR, TO_STDOUT};
use crate::display::display_text;

use super::parts::{cut_head, cut_tail};

/// One stream's excerpt: head, how much was left out, tail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamText {
    /// Shown text (see [`crate::capture::Excerpt`]).
    pub head: String,
    /// Bytes of shown text left out between head and tail.
    pub omitted: usize,
    pub tail: String,
    /// Bytes the execution wrote on this stream (as accepted into the budget).
    pub total: usize,
    /// Lines left out between head and tail.
    pub omitted_lines: usize,
    /// Of the merged output with an omission: the stream the tail begins in.
    pub lead: Option<Stream>,
}

impl StreamText {
    pub fn is_blank(&self) -> bool {
        let blank = |s: &str| s.chars().all(|c| c.is_whitespace() || c == TO_STDOUT || c == TO_STDERR);
        blank(&self.head) && blank(&self.tail)
    }

    /// Both streams one after the other: the merged output of an outcome
    /// made without a capture (from its two excerpts), as if all of its
    /// stderr came after its stdout. A gap in stderr is counted in the one
    /// gap the result has.
    pub fn sequential(stdout: &StreamText, stderr: &StreamText) -> StreamText {
        let marked = |s: &str, mark: char| if s.is_empty() { String::new() } else { format!("{mark}{s}") };
        let err = marked(&format!("{}{}", stderr.head, stderr.tail), TO_STDERR);
        let (head, tail) = if stdout.omitted > 0 {
            (marked(&stdout.head, TO_STDOUT), format!("{}{err}", stdout.tail))
        } else {
            (format!("{}{err}", marked(&format!("{}{}", stdout.head, stdout.tail), TO_STDOUT)), String::new())
        };
        StreamText {
            head,
            omitted: stdout.omitted + stderr.omitted,
            tail,
            total: stdout.total + stderr.total,
            omitted_lines: stdout.omitted_lines + stderr.omitted_lines,
            lead: (stdout.omitted > 0).then_some(Stream::Stdout),
        }
    }
}

/// The last switch mark in `text`.
fn last_mark(text: &str) -> Option<Stream> {
    memchr::memrchr2(0x1e, 0x1f, text.as_bytes()).and_then(|i| mark_stream(text.as_bytes()[i]))
}

/// `text` made safe to show, its switch marks kept.
fn displayed_marked(text: &str) -> Cow<'_, str> {
    if !text.contains([TO_STDOUT, TO_STDERR]) {
        return display_text(text);
    }
    let marks = text.chars().filter(|c| *c == TO_STDOUT || *c == TO_STDERR);
    let mut rebuilt = String::with_capacity(text.len() + 16);
    let mut pieces = text.split([TO_STDOUT, TO_STDERR]);
    if let Some(first) = pieces.next() {
        rebuilt.push_str(&display_text(first));
    }
    for (mark, piece) in marks.zip(pieces) {
        rebuilt.push(mark);
        rebuilt.push_str(&display_text(piece));
    }
    Cow::Owned(rebuilt)
}

/// `s` with its text made safe to show, its marks kept. Without a gap, head
/// and tail are shown as one text, so that a CRLF split between them stays
/// a line end.
pub(super) fn displayed_output(s: &StreamText) -> Cow<'_, StreamText> {
    match (displayed_marked(&s.head), displayed_marked(&s.tail)) {
        (Cow::Borrowed(_), Cow::Borrowed(_)) => Cow::Borrowed(s),
        _ if s.omitted == 0 => Cow::Owned(StreamText {
            head: displayed_marked(&format!("{}{}", s.head, s.tail)).into_owned(),
            tail: String::new(),
            ..s.clone()
        }),
        (head, tail) => Cow::Owned(StreamText { head: head.into_owned(), tail: tail.into_owned(), ..s.clone() }),
    }
}

/// Merged output laid out for a reader: each run of one stream's lines
/// under its header (`--- stderr ---`), where the stream changes; `lead` is
/// the stream of the text before its first mark. `bare`: no headers (the
/// output is stdout alone). Blank runs are left out; the text is made safe
/// to show.
pub fn laid_out(text: &str, lead: Option<Stream>, bare: bool) -> String {
    layout(&displayed_marked(text), lead, bare)
}

/// [`laid_out`] of text already safe to show.
fn layout(text: &str, lead: Option<Stream>, bare: bool) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut shown_stream: Option<Stream> = None;
    let mut stream = lead;
    let mut rest = text;
    loop {
        let next = memchr::memchr2(0x1e, 0x1f, rest.as_bytes());
        let piece = &rest[..next.unwrap_or(rest.len())];
        if !piece.trim().is_empty() {
            if !bare && stream.is_some() && stream != shown_stream {
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                let name = if stream == Some(Stream::Stderr) { "stderr" } else { "stdout" };
                let _ = writeln!(out, "--- {name} ---");
                shown_stream = stream;
            }
            out.push_str(piece);
        }
        match next {
            Some(i) => {
                stream = mark_stream(rest.as_bytes()[i]);
                rest = &rest[i + 1..];
            }
            None => return out,
        }
    }
}

/// The merged output fitted into `max_bytes` / `max_lines` (three quarters
/// for the head, one for the tail, with one line saying how much is
/// omitted) and laid out by [`laid_out`]. Also says how many lines and
/// bytes of it were left out, if any.
pub(super) fn fit_output(
    s: &StreamText,
    max_bytes: usize,
    max_lines: usize,
    bare: bool,
) -> (String, Option<(usize, usize)>) {
    let whole_len = s.head.len() + s.tail.len();
    let whole_lines = s.head.matches('\n').count() + s.tail.matches('\n').count();
    if s.omitted == 0 && whole_len <= max_bytes && whole_lines < max_lines {
        return (layout(&format!("{}{}", s.head, s.tail), None, bare).trim_end().to_string(), None);
    }
    let head = cut_head(&s.head, max_bytes * 3 / 4, max_lines * 3 / 4);
    let joined_tail;
    let (tail_source, head_rest) = if s.omitted == 0 {
        joined_tail = format!("{}{}", &s.head[head.len()..], s.tail);
        (&joined_tail[..], "")
    } else {
        (&s.tail[..], &s.head[head.len()..])
    };
    let tail = cut_tail(tail_source, max_bytes / 4, max_lines / 4);
    let before_tail = &tail_source[..tail_source.len() - tail.len()];
    let lead = last_mark(before_tail).or(s.lead).or_else(|| last_mark(head_rest)).or_else(|| last_mark(head));
    // In shown text: colour, collapsed progress and the switch marks are not counted.
    let marks = |t: &str| memchr::memchr2_iter(0x1e, 0x1f, t.as_bytes()).count();
    let newlines = |t: &str| memchr::memchr_iter(b'\n', t.as_bytes()).count();
    let omitted = head_rest.len() - marks(head_rest) + s.omitted + before_tail.len() - marks(before_tail);
    let omitted_lines = (newlines(head_rest) + s.omitted_lines + newlines(before_tail)).max(1);
    let head = layout(head, None, bare);
    let tail = layout(tail, lead, bare);
    let text = format!("{}\n{}\n{}", head.trim_end_matches('\n'), omission(omitted_lines, omitted), tail.trim_end());
    (text, Some((omitted_lines, omitted)))
}

/// The line that stands for output left out of a result.
pub fn omission(lines: usize, bytes: usize) -> String {
    format!(
        "...[{}, {} omitted; the full output is in the log files]...",
        crate::display::count(lines, "line", "lines"),
        crate::display::count(bytes, "byte", "bytes")
    )
}

impl From<&crate::capture::Excerpt> for StreamText {
    fn from(e: &crate::capture::Excerpt) -> Self {
        let c = e.cut_parts();
        StreamText {
            head: c.head,
            omitted: c.omitted,
            tail: c.tail,
            total: e.total,
            omitted_lines: c.omitted_lines,
            lead: None,
        }
    }
}

impl StreamText {
    /// The merged output of a capture.
    pub fn output_of(capture: &crate::capture::Capture) -> Self {
        let c = capture.output();
        StreamText {
            head: c.head,
            omitted: c.omitted,
            tail: c.tail,
            total: capture.accepted(),
            omitted_lines: c.omitted_lines,
            lead: c.lead,
        }
    }
}
