//! The streaming form of the rule: terminal output made readable, not just
//! safe, one chunk at a time, for a python call's output and the live
//! output of a shell command.
//!
//! - Colour and other SGR sequences (`ESC [ params m`, params of digits,
//!   `;` and `:` only) are dropped: they only paint, and as stand-ins they
//!   bury the text they paint.
//! - Every other escape sequence (CSI, OSC, DCS, ...) is shown as
//!   [`super::display_text`] shows it (`␛]0;T␇`, `␛[2J`): it is rare in
//!   ordinary output, and one that changes the title, writes the clipboard
//!   or moves the cursor is worth seeing rather than hiding. C1 controls
//!   (an 8-bit CSI) are shown by code as ever; they are not parsed.
//! - Carriage-return progress keeps its last state: a lone CR followed by
//!   text starts the line again, and what the line held before is dropped
//!   (`a\rb\rc\n` reads `c\n`); CRLF is a line end; a CR with nothing after
//!   it on its line changes nothing.
//! - Every other character follows [`super::display_text`]: tab and newline
//!   kept, the other controls and the bidi and format controls as stand-ins,
//!   invalid UTF-8 as U+FFFD exactly as `String::from_utf8_lossy` makes it.
//!
//! State crosses chunks (a sequence, a character or a CR split between two
//! reads reads as unsplit) and is bounded: at most [`SEQUENCE_CAP`] bytes of
//! an unfinished sequence (past it, the sequence is shown as text) and
//! [`LINE_CAP`] bytes of an unfinished line (past it, the line so far is
//! emitted, and a later CR on it starts a new line instead of taking back
//! what was emitted).

use super::push_shown;

/// Bytes of an unfinished CSI sequence held before it is shown as text.
pub const SEQUENCE_CAP: usize = 64;

/// Bytes of shown text of an unfinished line held before it is emitted.
pub const LINE_CAP: usize = 4096;

/// Where the escape-sequence parser is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Seq {
    #[default]
    Ground,
    /// After an ESC.
    Escape,
    /// In `ESC [`: whether the parameters so far are an SGR's, whether an
    /// intermediate byte came.
    Csi { sgr: bool, intermediate: bool },
}

/// Terminal output made readable and safe, fed in chunks (see the module
/// documentation for the rule).
#[derive(Debug, Clone, Default)]
pub struct StreamText {
    /// The start of a UTF-8 character cut by the end of the last chunk.
    utf8: Vec<u8>,
    seq: Seq,
    /// The raw (ASCII) bytes of the sequence being parsed.
    held_seq: String,
    /// Shown text of the current line since its start or its last CR.
    line: String,
    /// A CR came on this line with no text after it yet.
    cr: bool,
    /// Part of this line was emitted for its length.
    spilled: bool,
}

impl StreamText {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed raw bytes; returns the text that is final so far (safe to show).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let mut out = String::new();
        let joined;
        let mut rest = if self.utf8.is_empty() {
            bytes
        } else {
            let mut all = std::mem::take(&mut self.utf8);
            all.extend_from_slice(bytes);
            joined = all;
            &joined[..]
        };
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    self.chars(text, &mut out);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // valid_up_to says this prefix is valid UTF-8.
                    self.chars(std::str::from_utf8(valid).unwrap_or_default(), &mut out);
                    match e.error_len() {
                        Some(n) => {
                            self.char('\u{FFFD}', &mut out);
                            rest = &after[n..];
                        }
                        None => {
                            // At most three bytes: a character cut at the end.
                            self.utf8.extend_from_slice(after);
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// End of stream: flush what is held (an unfinished escape sequence is
    /// escaped, not dropped silently).
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        if !std::mem::take(&mut self.utf8).is_empty() {
            self.char('\u{FFFD}', &mut out);
        }
        self.show_held_seq(&mut out);
        out.push_str(&self.line);
        *self = Self::default();
        out
    }

    fn chars(&mut self, text: &str, out: &mut String) {
        for c in text.chars() {
            self.char(c, out);
        }
    }

    /// One decoded character through the sequence parser.
    fn char(&mut self, c: char, out: &mut String) {
        match self.seq {
            Seq::Ground => self.ground(c, out),
            Seq::Escape if c == '[' => {
                self.held_seq.push(c);
                self.seq = Seq::Csi { sgr: true, intermediate: false };
            }
            Seq::Escape => {
                self.show_held_seq(out);
                self.ground(c, out);
            }
            Seq::Csi { sgr, intermediate } => match c {
                // Parameter bytes, before any intermediate byte.
                '0'..='?' if !intermediate => {
                    self.held_seq.push(c);
                    let sgr = sgr && matches!(c, '0'..='9' | ';' | ':');
                    self.seq = Seq::Csi { sgr, intermediate };
                    if self.held_seq.len() >= SEQUENCE_CAP {
                        self.show_held_seq(out);
                    }
                }
                // Intermediate bytes.
                ' '..='/' => {
                    self.held_seq.push(c);
                    self.seq = Seq::Csi { sgr, intermediate: true };
                    if self.held_seq.len() >= SEQUENCE_CAP {
                        self.show_held_seq(out);
                    }
                }
                // The final byte: an SGR goes, any other sequence is shown.
                '@'..='~' => {
                    if c == 'm' && sgr && !intermediate {
                        self.held_seq.clear();
                        self.seq = Seq::Ground;
                    } else {
                        self.held_seq.push(c);
                        self.show_held_seq(out);
                    }
                }
                // Not a sequence after all: what was held is text.
                _ => {
                    self.show_held_seq(out);
                    self.ground(c, out);
                }
            },
        }
    }

    fn ground(&mut self, c: char, out: &mut String) {
        if c == '\x1b' {
            self.held_seq.push(c);
            self.seq = Seq::Escape;
        } else {
            self.text(c, out);
        }
    }

    /// The held sequence as text (its ESC a stand-in), back to ground.
    fn show_held_seq(&mut self, out: &mut String) {
        self.seq = Seq::Ground;
        let held = std::mem::take(&mut self.held_seq);
        for c in held.chars() {
            self.text(c, out);
        }
        // Keep the buffer's allocation for the next sequence.
        self.held_seq = held;
        self.held_seq.clear();
    }

    /// One character of text through the line model and the escape rule.
    fn text(&mut self, c: char, out: &mut String) {
        match c {
            '\n' => {
                out.push_str(&self.line);
                out.push('\n');
                self.line.clear();
                self.cr = false;
                self.spilled = false;
            }
            '\r' => self.cr = true,
            _ => {
                if std::mem::take(&mut self.cr) {
                    self.line.clear();
                    if std::mem::take(&mut self.spilled) {
                        out.push('\n');
                    }
                }
                push_shown(&mut self.line, c, false);
                if self.line.len() >= LINE_CAP {
                    out.push_str(&self.line);
                    self.line.clear();
                    self.spilled = true;
                }
            }
        }
    }

    /// Bytes held (for the bound's test).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.utf8.len() + self.held_seq.len() + self.line.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `input` in one push.
    fn whole(input: &[u8]) -> String {
        let mut s = StreamText::new();
        let mut out = s.push(input);
        out.push_str(&s.finish());
        out
    }

    /// `input` in the chunks that `cuts` (ascending offsets) make.
    fn chunked(input: &[u8], cuts: &[usize]) -> String {
        let mut s = StreamText::new();
        let mut out = String::new();
        let mut at = 0;
        for &cut in cuts {
            out.push_str(&s.push(&input[at..cut]));
            at = cut;
        }
        out.push_str(&s.push(&input[at..]));
        out.push_str(&s.finish());
        out
    }

    /// Nothing a terminal or a bidi algorithm acts on, besides tab and newline.
    fn inert(text: &str) -> bool {
        text.chars()
            .all(|c| c == '\t' || c == '\n' || !(c.is_control() || super::super::is_bidi_control(c) || c == '\u{2028}'))
    }

    const CORPUS: &[(&[u8], &str)] = &[
        (b"\x1b[31mred\x1b[0m\n", "red\n"),
        (b"\x1b[1;38;5;208mbold\x1b[m plain\x1b[38:2::1:2:3mx", "bold plainx"),
        (b"a\rb\rc\n", "c\n"),
        (b"a\r\nb\r\n", "a\nb\n"),
        (b"progress 0%\rprogress 50%\rprogress 100%\ndone\n", "progress 100%\ndone\n"),
        (b"abc\r", "abc"),
        (b"abc\r\r\n", "abc\n"),
        (b"abc\r\x1b[0m\n", "abc\n"),
        (b"abc\r\x1b[2Kx\n", "\u{241B}[2Kx\n"),
        (b"\x1b]0;T\x07after", "\u{241B}]0;T\u{2407}after"),
        (b"\x1b]52;c;aGk=\x1b\\", "\u{241B}]52;c;aGk=\u{241B}\\"),
        (b"\x1b[2J\x1b[H\x1b[?25l", "\u{241B}[2J\u{241B}[H\u{241B}[?25l"),
        (b"\x1b[>4;2m", "\u{241B}[>4;2m"),
        (b"\x1b[1 m", "\u{241B}[1 m"),
        (b"\x1bPq\x1b\\", "\u{241B}Pq\u{241B}\\"),
        (b"\x1b[31\x1b[0mx", "\u{241B}[31x"),
        (b"\x1b[31\nx", "\u{241B}[31\nx"),
        (b"\x1b[3", "\u{241B}[3"),
        (b"tail \x1b", "tail \u{241B}"),
        (b"\x1b\x1b[0m", "\u{241B}"),
        (b"del\x7f bs\x08 nul\x00 bel\x07", "del\u{2421} bs\u{2408} nul\u{2400} bel\u{2407}"),
        ("\u{9b}31m \u{202E}x \u{2028}".as_bytes(), "<U+009B>31m <U+202E>x <U+2028>"),
        (b"ok \xff\xfe \xc3\xa9 \xe6\x97\xa5 \xc3", "ok \u{FFFD}\u{FFFD} \u{e9} \u{65e5} \u{FFFD}"),
        (b"\xe6\x97x", "\u{FFFD}x"),
        (b"tab\tkept\n", "tab\tkept\n"),
        (b"", ""),
    ];

    #[test]
    fn colour_goes_progress_collapses_the_rest_is_shown() {
        for (raw, want) in CORPUS {
            let got = whole(raw);
            assert_eq!(got, *want, "{:?}", String::from_utf8_lossy(raw));
            assert!(inert(&got), "{got:?}");
        }
    }

    #[test]
    fn only_final_text_is_returned_before_the_end() {
        let mut s = StreamText::new();
        assert_eq!(s.push(b"line one\nprogress 1"), "line one\n");
        assert_eq!(s.push(b"0%\rprogress 2"), "", "the line can still change");
        assert_eq!(s.push(b"0%\n"), "progress 20%\n");
        assert_eq!(s.push(b"\x1b]0;"), "");
        assert_eq!(s.finish(), "\u{241B}]0;", "an unfinished sequence is shown, not dropped");
        assert_eq!(s.push(b"fresh\n"), "fresh\n", "finish leaves a fresh state");
    }

    #[test]
    fn every_split_reads_as_unsplit() {
        let mut all: Vec<u8> = Vec::new();
        for (raw, _) in CORPUS {
            all.extend_from_slice(raw);
        }
        for (raw, _) in CORPUS.iter().chain([(&all[..], "")].iter()) {
            let want = whole(raw);
            for at in 0..=raw.len() {
                assert_eq!(chunked(raw, &[at]), want, "{:?} cut at {at}", String::from_utf8_lossy(raw));
            }
            let bytes: Vec<usize> = (1..raw.len()).collect();
            assert_eq!(chunked(raw, &bytes), want, "byte by byte");
        }
    }

    /// A small deterministic generator, seeded from [`crate::random`] and
    /// the seed printed, so that a failure can be replayed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Pieces that random inputs are made of: the bytes the parser and the
    /// decoder care about, and their neighbours.
    const PIECES: &[&[u8]] = &[
        b"\x1b",
        b"[",
        b"]",
        b"m",
        b"0",
        b"31",
        b";",
        b":",
        b"?",
        b">",
        b" ",
        b"K",
        b"\x07",
        b"\\",
        b"\r",
        b"\n",
        b"\r\n",
        b"\t",
        b"a",
        b"xyz",
        b"\xc3",
        b"\xa9",
        b"\xe6\x97\xa5",
        b"\xe6",
        b"\xff",
        b"\xc2\x9b",
        b"\x7f",
        b"\0",
        b"\xe2\x80\xae",
        b"\xf0\x9f\x8e\x89",
        b"\xf0\x9f",
    ];

    #[test]
    fn random_inputs_split_anywhere_read_the_same_and_come_out_inert() {
        let seed = crate::random::random_u64() | 1;
        eprintln!("seed {seed:#x}");
        let mut rng = Rng(seed);
        for _ in 0..2000 {
            let mut input = Vec::new();
            for _ in 0..rng.below(40) {
                input.extend_from_slice(PIECES[rng.below(PIECES.len())]);
            }
            let want = whole(&input);
            assert!(inert(&want), "seed {seed:#x}: {want:?}");
            assert!(!want.contains('\u{1b}') && !want.contains('\u{7}'));
            let mut cuts: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(input.len() + 1)).collect();
            cuts.sort_unstable();
            assert_eq!(chunked(&input, &cuts), want, "seed {seed:#x}: {input:?} cut at {cuts:?}");
        }
    }

    #[test]
    fn without_sequences_or_cr_it_is_the_one_text_rule() {
        let seed = crate::random::random_u64() | 1;
        eprintln!("seed {seed:#x}");
        let mut rng = Rng(seed);
        let pieces: Vec<&[u8]> =
            PIECES.iter().copied().filter(|p| !p.contains(&b'\x1b') && !p.contains(&b'\r')).collect();
        for _ in 0..2000 {
            let mut input = Vec::new();
            for _ in 0..rng.below(40) {
                input.extend_from_slice(pieces[rng.below(pieces.len())]);
            }
            let today = super::super::display_text(&String::from_utf8_lossy(&input)).into_owned();
            assert_eq!(whole(&input), today, "seed {seed:#x}: {input:?}");
        }
        let all: String = (0u32..0x11_0000).filter_map(char::from_u32).filter(|&c| c != '\x1b' && c != '\r').collect();
        assert_eq!(whole(all.as_bytes()), super::super::display_text(&all), "every code point");
    }

    #[test]
    fn an_endless_sequence_is_bounded_and_shown() {
        let mut s = StreamText::new();
        let mut out = s.push(b"\x1b[");
        for _ in 0..10_000 {
            out.push_str(&s.push(b"1;1;1;1;"));
            assert!(s.held() <= SEQUENCE_CAP + LINE_CAP, "{}", s.held());
        }
        out.push_str(&s.finish());
        assert!(out.starts_with("\u{241B}[1;1;1;"), "shown, not dropped");
        assert_eq!(out.len(), "\u{241B}".len() + 1 + 80_000);
        // An endless OSC: its ESC a stand-in, the rest text, a line at a time.
        let mut s = StreamText::new();
        let mut out = s.push(b"\x1b]0;");
        for _ in 0..10_000 {
            out.push_str(&s.push(b"title"));
            assert!(s.held() < LINE_CAP + 16);
        }
        assert!(out.starts_with("\u{241B}]0;title"));
    }

    #[test]
    fn an_endless_line_is_bounded_and_emitted() {
        // Progress that never ends its line: only the last state is held.
        let mut s = StreamText::new();
        for i in 0..100_000 {
            assert_eq!(s.push(format!("\rprogress {i}%").as_bytes()), "");
            assert!(s.held() < 64);
        }
        assert_eq!(s.finish(), "progress 99999%");
        // One line that never ends: emitted in pieces of the cap.
        let mut s = StreamText::new();
        let mut out = String::new();
        for _ in 0..10_000 {
            out.push_str(&s.push(b"0123456789"));
            assert!(s.held() < LINE_CAP + 16);
        }
        assert!(out.len() >= 100_000 - LINE_CAP);
        // A CR after a spilled line starts a new line: what was emitted stays.
        let long = "x".repeat(LINE_CAP + 10);
        assert_eq!(whole(format!("{long}\rnew\n").as_bytes()), format!("{}\nnew\n", &long[..LINE_CAP]));
        assert_eq!(whole(format!("{long}\r\n").as_bytes()), format!("{long}\n"), "CRLF is still a line end");
    }
}
