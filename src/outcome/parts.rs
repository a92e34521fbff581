//! The parts of a result's text that a reader shows its own way (the
//! status line, the image lines, the log line, the notes, the closing
//! diagnostic) and how much output it left out: typed facts next to the
//! text, so that the TUI reads fields and never parses the text back
//! (a sandbox can print any line, a fake omission or image line too).
//! Also the cuts that fit a text into the result's ceiling.

/// What a part of the text is. JavaScript gets the string union `PartKind`.
#[cfg_attr(feature = "addon", napi_derive::napi(string_enum = "snake_case"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// The first line: `status: ok (0.1s, worker generation 1)`.
    Status,
    /// `image 1: /scratch/... (640x480 PNG, 2.1KB), attached`.
    Image,
    /// `note: ...` (a note may name a file under `/scratch`).
    Note,
    /// `Full output saved to: ...` or `Partial output saved to: ...`.
    Logs,
    /// The closing paragraph, the result's `diagnostic`.
    Closing,
}

/// One part: `kind` over `start..end` of the text, in bytes here (the
/// addon gives JavaScript UTF-16 offsets, see [`Rendered::utf16`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPart {
    pub kind: PartKind,
    pub start: usize,
    pub end: usize,
}

/// A result's text with its parts and what it left out of the output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub parts: Vec<TextPart>,
    /// Lines and bytes of output the text leaves out (in its one
    /// omission line); 0 and 0 when it shows all of it.
    pub omitted_lines: usize,
    pub omitted_bytes: usize,
}

impl Rendered {
    /// The parts with UTF-16 offsets, as JavaScript indexes the text.
    pub fn utf16(&self) -> Vec<(PartKind, usize, usize)> {
        let at = |b: usize| self.text[..b].encode_utf16().count();
        self.parts.iter().map(|p| (p.kind, at(p.start), at(p.end))).collect()
    }

    /// `text` appended as a closing paragraph of its own, which replaces
    /// any closing part before it (that one is now ordinary text).
    pub fn close_with(&mut self, text: &str) {
        self.parts.retain(|p| p.kind != PartKind::Closing);
        self.text.push_str("\n\n");
        let start = self.text.len();
        self.text.push_str(text);
        self.parts.push(TextPart { kind: PartKind::Closing, start, end: self.text.len() });
    }
}

/// Parts recorded in one buffer of the text while it is written, moved by
/// the length of what goes before that buffer when the buffers are joined.
#[derive(Debug, Default)]
pub(super) struct Parts(pub Vec<TextPart>);

impl Parts {
    /// `kind` over what `buf` gained since it was `from` bytes long.
    pub fn mark(&mut self, kind: PartKind, from: usize, buf: &str) {
        let start = from + buf[from..].len() - buf[from..].trim_start_matches('\n').len();
        self.0.push(TextPart { kind, start, end: buf.len() });
    }

    /// These parts, their buffer now starting at `base` of the text.
    pub fn shifted(self, base: usize) -> Vec<TextPart> {
        self.0.into_iter().map(|p| TextPart { start: p.start + base, end: p.end + base, ..p }).collect()
    }
}

/// Cut `text` to at most `max_bytes` and `max_lines`, keeping the start (on
/// a character boundary). Returns the kept prefix.
pub(super) fn cut_head(text: &str, max_bytes: usize, max_lines: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if let Some((i, _)) = text[..end].match_indices('\n').nth(max_lines.saturating_sub(1)) {
        end = i;
    }
    &text[..end]
}

/// Cut `text` keeping its end.
pub(super) fn cut_tail(text: &str, max_bytes: usize, max_lines: usize) -> &str {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    if let Some((i, _)) = text[start..].rmatch_indices('\n').nth(max_lines.saturating_sub(1)) {
        start += i + 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn outcome() -> Outcome {
        Outcome {
            duration_ms: 100,
            diagnostic: None,
            state: StateFate::Kept,
            ..Outcome::static_result(Status::Ok, 1, String::new())
        }
    }

    /// The text of each part, by kind.
    fn texts(r: &Rendered) -> Vec<(PartKind, &str)> {
        r.parts.iter().map(|p| (p.kind, &r.text[p.start..p.end])).collect()
    }

    #[test]
    fn each_part_is_where_it_was_written_and_output_that_imitates_one_is_none() {
        // The code prints what the parts say; only the tool's own lines are parts.
        let fake = "image 1: /scratch/x.png (1x1 PNG, 1 B), attached\nnote: fake\n\
                    Full output saved to: /etc (stdout)\n...[9 lines, 99 bytes omitted; the full output is in the log files]...\n";
        let o = Outcome {
            repr: Some("'é'".into()),
            stdout: StreamText {
                head: format!("{fake}é\n"),
                omitted: 5000,
                omitted_lines: 50,
                tail: "z\n".repeat(10),
                total: 6000,
                ..Default::default()
            },
            images: vec![ImageData {
                sandbox_path: "/scratch/.pi-images/1.png".into(),
                mime: "image/png".into(),
                width: Some(1),
                height: Some(1),
                data: vec![0; 3],
            }],
            notes: vec!["saved /scratch/.pi-images/1.png".into()],
            log_paths: LogFiles { stdout: Some("/l/0001-out.log".into()), stderr: None },
            ..outcome()
        };
        let r = render_parts(&o);
        assert_eq!(
            texts(&r),
            [
                (PartKind::Status, "status: ok (0.1s, worker generation 1)"),
                (PartKind::Image, "image 1: /scratch/.pi-images/1.png (1x1 PNG, 3B), attached"),
                (PartKind::Note, "note: saved /scratch/.pi-images/1.png"),
                (PartKind::Logs, "Full output saved to: /logs/0001-out.log (stdout)"),
            ]
        );
        assert!(r.text.contains(fake), "{}", r.text);
        assert_eq!((r.omitted_lines, r.omitted_bytes), (50, 5000));
        // UTF-16 offsets: after the é of the output, one unit less than in bytes.
        let logs = r.parts.iter().find(|p| p.kind == PartKind::Logs).unwrap();
        let utf16 = r.utf16();
        assert_eq!(utf16[3], (PartKind::Logs, logs.start - 1, logs.end - 1));
        assert_eq!(utf16[0], (PartKind::Status, 0, 38));
    }

    #[test]
    fn the_closing_paragraph_is_a_part_and_a_later_one_replaces_it() {
        let o = Outcome {
            status: Status::Timeout,
            diagnostic: Some("Execution exceeded the 3s deadline.".into()),
            stdout: StreamText { head: "out\n".into(), total: 4, ..Default::default() },
            ..outcome()
        };
        let mut r = render_parts(&o);
        assert_eq!(texts(&r).last(), Some(&(PartKind::Closing, "Execution exceeded the 3s deadline.")));
        assert!(r.text.ends_with("\n\nExecution exceeded the 3s deadline."));
        assert_eq!((r.omitted_lines, r.omitted_bytes), (0, 0), "nothing left out");
        r.close_with("Allow it, then run again.");
        let closing: Vec<_> = texts(&r).into_iter().filter(|(k, _)| *k == PartKind::Closing).collect();
        assert_eq!(closing, [(PartKind::Closing, "Allow it, then run again.")]);
        assert!(r.text.ends_with("deadline.\n\nAllow it, then run again."));
    }
}
