//! Text that is safe to put in front of a person: in pi's terminal UI, an
//! RPC client, a permission prompt, a notification, or the model's context.
//!
//! Everything that comes out of the sandbox (output, exception text, reprs,
//! paths, notes, every field of a worker frame) can carry terminal control
//! sequences: an OSC 52 clipboard write, a title change, a screen wipe, an
//! 8-bit CSI, or bidi controls that make a line read differently from what
//! it is. [`display_text`] makes such text inert by showing each control as
//! a visible stand-in:
//!
//! - C0 controls other than tab and newline (NUL, BEL, BS, CR, ESC, ...) as
//!   their Unicode control pictures, U+2400 + code (`␛`), as the worker
//!   already does for exception text; a CR right before a newline (CRLF) is
//!   dropped instead, so Windows line ends read as line ends;
//! - DEL as U+2421 (`␡`);
//! - C1 controls (U+0080-U+009F), the line and paragraph separators
//!   U+2028 and U+2029, the bidi controls U+061C, U+200E,
//!   U+200F, U+202A-U+202E and U+2066-U+2069, and the invisible format
//!   characters U+180E, U+200B, U+2060-U+2064, U+206A-U+206F, U+FEFF,
//!   U+FFF9-U+FFFB and the tags U+E0000-U+E007F, as `<U+202E>`.
//!
//! An escape sequence so stays readable (`␛]52;c;aGk=␇`) and does nothing.
//! [`display_line`] is the same rule for a one-line field (a path, a type
//! name, a note): it also shows tab and newline (`␉`, `␊`) and keeps every
//! CR as `␍`, so that a name from the sandbox never starts a line of its own
//! in a note or a warning. [`one_line`] puts a path into such text.
//!
//! [`StreamText`] (in `stream`) is the same rule for terminal output fed in
//! chunks (a call's stdout and stderr, a command's live output), made
//! readable as well: colour sequences dropped, carriage-return progress
//! kept at its last state, every other sequence shown as above.
//!
//! This module only rewrites characters: it does not bound lengths (the
//! callers do; a stand-in is at most eight bytes for three) and it does not
//! touch the log files, which are written with the raw bytes before any of
//! this runs.

use std::borrow::Cow;
use std::fmt::Write as _;

mod stream;
pub use stream::StreamText;

/// The bidi and format controls that reorder or hide text: the bidi
/// marks, embeddings, overrides and isolates, and the invisible format
/// characters that carry nothing a reader sees (zero-width space, word
/// joiner and invisible operators, the byte-order mark, interlinear
/// annotation, the deprecated format controls, and the tag characters,
/// which can spell a hidden message for a model). The zero-width joiner
/// and non-joiner stay: emoji sequences and several scripts need them.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

/// Every format character (Unicode category Cf) in the ranges a path
/// could hide one in, the joiners and the soft hyphen included: a prompt
/// must show exactly what will be granted.
pub fn is_format_char(c: char) -> bool {
    is_bidi_control(c)
        || matches!(
            c,
            '\u{00AD}' | '\u{0600}'..='\u{0605}' | '\u{06DD}' | '\u{070F}' | '\u{08E2}' | '\u{200C}' | '\u{200D}'
        )
}

/// The line and paragraph separators: line ends to JavaScript (a `^` of
/// a multi-line pattern matches after them) and to some renderers, and
/// nothing a reader sees in a terminal.
pub fn is_line_separator(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

/// Whether `c` is shown as a stand-in. `line`: tab and newline too.
fn is_shown_escaped(c: char, line: bool) -> bool {
    match c {
        '\t' | '\n' => line,
        // char::is_control: C0, DEL and C1 (the Cc category).
        _ => c.is_control() || is_bidi_control(c) || is_line_separator(c),
    }
}

fn escape(text: &str, line: bool) -> Cow<'_, str> {
    let Some(first) = text.find(|c| is_shown_escaped(c, line)) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    let mut rest = text[first..].chars().peekable();
    while let Some(c) = rest.next() {
        match c {
            '\r' if !line && rest.peek() == Some(&'\n') => {}
            _ => push_shown(&mut out, c, line),
        }
    }
    Cow::Owned(out)
}

/// Append `c` to `out`, as its stand-in when it is shown escaped.
fn push_shown(out: &mut String, c: char, line: bool) {
    match c {
        _ if !is_shown_escaped(c, line) => out.push(c),
        '\0'..='\x1f' => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{FFFD}')),
        '\x7f' => out.push('\u{2421}'),
        _ => {
            let _ = write!(out, "<U+{:04X}>", c as u32);
        }
    }
}

/// `text` with every control character shown as a visible stand-in (tab
/// and newline kept, CRLF read as LF). Borrows when nothing needs changing.
pub fn display_text(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// [`display_text`] for a one-line field: tab, newline and CR are shown
/// as `␉`, `␊` and `␍` too.
pub fn display_line(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

/// [`display_line`] of at most `max_bytes` of `text` (cut at a character
/// boundary, `...` marking the cut): text from the sandbox that a note or
/// a diagnostic quotes, so that it can neither start a line of the tool's
/// own nor fill the result.
pub fn quoted_line(text: &str, max_bytes: usize) -> String {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < text.len() { "..." } else { "" };
    format!("{}{cut}", display_line(&text[..end]))
}

/// [`display_text`] of an owned string, reusing it when nothing changes.
pub fn displayed(text: String) -> String {
    match display_text(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(shown) => shown,
    }
}

/// [`display_line`] of an owned string, reusing it when nothing changes.
pub fn displayed_line(text: String) -> String {
    match display_line(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(shown) => shown,
    }
}

/// A name or path as one line of a note, a status line, a prompt or a
/// warning: its text (lossy for names that are not UTF-8) through
/// [`display_line`], for `format!`. What the sandbox names can hold a
/// newline (`x\nERROR pi: ...`); through this it cannot start a line.
/// Every path that goes into such text is formatted with it, never with
/// `Path::display`.
pub struct OneLine<'a>(Cow<'a, str>);

/// [`OneLine`] of `name`: `format!("{} appeared", one_line(rel))`.
pub fn one_line<S: AsRef<std::ffi::OsStr> + ?Sized>(name: &S) -> OneLine<'_> {
    OneLine(name.as_ref().to_string_lossy())
}

impl std::fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&display_line(&self.0))
    }
}

/// Whether `text` holds a stand-in this module or the worker writes (a
/// control picture, U+2400-U+2426, or `<U+`): text that was escaped on its
/// way here, and so is not what the sandbox had.
pub fn holds_stand_in(text: &str) -> bool {
    text.contains("<U+") || text.chars().any(|c| ('\u{2400}'..='\u{2426}').contains(&c))
}

/// `1.5KB`, `2.0MB`: a size as results show it.
pub fn format_size(bytes: usize) -> String {
    if bytes < 1024 {
        format!("{bytes}B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1}KB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1}MB", bytes as f64 / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn shown(text: &str) -> String {
        display_text(text).into_owned()
    }

    /// Nothing in `text` that a terminal or a bidi algorithm acts on, besides tab and newline.
    fn inert(text: &str) -> bool {
        text.chars().all(|c| c == '\t' || c == '\n' || !(c.is_control() || is_bidi_control(c)))
    }

    #[test]
    fn every_c0_control_but_tab_and_newline_is_a_control_picture() {
        for code in 0u32..0x20 {
            let c = char::from_u32(code).expect("C0");
            let text = format!("a{c}b");
            let want = match c {
                '\t' | '\n' => text.clone(),
                _ => format!("a{}b", char::from_u32(0x2400 + code).expect("picture")),
            };
            assert_eq!(shown(&text), want, "U+{code:04X}");
        }
        assert_eq!(shown("\0\x07\x08\x1b"), "\u{2400}\u{2407}\u{2408}\u{241B}", "NUL, BEL, BS, ESC");
    }

    #[test]
    fn del_c1_and_bidi_controls_are_shown_by_code() {
        assert_eq!(shown("x\x7fy"), "x\u{2421}y");
        for code in [0x80u32, 0x85, 0x8D, 0x90, 0x9B, 0x9C, 0x9D, 0x9F] {
            let c = char::from_u32(code).expect("C1");
            assert_eq!(shown(&format!("a{c}b")), format!("a<U+{code:04X}>b"));
        }
        let bidi = [0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069];
        for code in bidi {
            let c = char::from_u32(code).expect("bidi");
            assert!(is_bidi_control(c));
            assert_eq!(shown(&format!("a{c}b")), format!("a<U+{code:04X}>b"));
        }
        // The invisible format characters: zero-width space, word joiner and
        // invisible operators, BOM, annotations, tags (a hidden message).
        for code in [0x180E, 0x200B, 0x2060, 0x2064, 0x206A, 0x206F, 0xFEFF, 0xFFF9, 0xFFFB, 0xE0001, 0xE0041, 0xE007F]
        {
            let c = char::from_u32(code).expect("format");
            assert_eq!(shown(&format!("a{c}b")), format!("a<U+{code:04X}>b"));
        }
        // Their neighbours are ordinary characters, and so are the joiners emoji need.
        for c in [
            '\u{A0}',
            '\u{061B}',
            '\u{061D}',
            '\u{200C}',
            '\u{200D}',
            '\u{2010}',
            '\u{2027}',
            '\u{202F}',
            '\u{2065}',
            '\u{E0080}',
        ] {
            assert_eq!(shown(&format!("a{c}b")), format!("a{c}b"), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn terminal_sequences_become_inert_text() {
        let corpus = [
            ("\x1b]52;c;aGk=\x07", "\u{241B}]52;c;aGk=\u{2407}"),
            ("\x1b]52;c;aGk=\x1b\\", "\u{241B}]52;c;aGk=\u{241B}\\"),
            ("\x1b]0;title\x07", "\u{241B}]0;title\u{2407}"),
            ("\x1b[2J\x1b[H", "\u{241B}[2J\u{241B}[H"),
            ("\x1b[31mred\x1b[0m", "\u{241B}[31mred\u{241B}[0m"),
            ("\u{9b}2J", "<U+009B>2J"),
            ("\u{9d}0;t\u{9c}", "<U+009D>0;t<U+009C>"),
            ("\x1bP+q\x1b\\", "\u{241B}P+q\u{241B}\\"),
            ("abc\u{202E}txt.exe", "abc<U+202E>txt.exe"),
            ("\u{2066}\u{2069}", "<U+2066><U+2069>"),
        ];
        for (raw, want) in corpus {
            assert_eq!(shown(raw), want, "{raw:?}");
            assert!(inert(&shown(raw)));
        }
    }

    #[test]
    fn line_ends() {
        assert_eq!(shown("a\r\nb\r\n"), "a\nb\n", "CRLF reads as LF");
        assert_eq!(shown("progress 10%\rprogress 20%"), "progress 10%\u{240D}progress 20%", "a lone CR");
        assert_eq!(shown("a\r"), "a\u{240D}");
        assert_eq!(shown("a\r\r\n"), "a\u{240D}\n");
        assert_eq!(shown("a\n\rb"), "a\n\u{240D}b");
        assert_eq!(display_line("a\r\nb\tc"), "a\u{240D}\u{240A}b\u{2409}c", "a one-line field shows them all");
        assert_eq!(shown("a\tb\n"), "a\tb\n");
    }

    #[test]
    fn ordinary_text_is_borrowed_untouched() {
        for text in
            ["", "plain", "héllo 日本 🎉", "tab\tand\nnewline\n", "\u{FFFD}", "␛[2J is already a picture", "<U+202E>"]
        {
            assert!(matches!(display_text(text), Cow::Borrowed(t) if t == text), "{text:?}");
        }
        assert!(matches!(display_line("/srv/data/日本.csv"), Cow::Borrowed(_)));
        let owned = String::from("héllo");
        let ptr = owned.as_ptr();
        let kept = displayed(owned);
        assert_eq!(kept.as_ptr(), ptr, "an owned clean string is reused");
    }

    #[test]
    fn invalid_and_cut_input() {
        // What the host makes of invalid UTF-8 (lossy decoding) stays as it is.
        let lossy = String::from_utf8_lossy(b"ok \xff\xfe \x1b[2J \xc3");
        assert_eq!(shown(&lossy), "ok \u{FFFD}\u{FFFD} \u{241B}[2J \u{FFFD}");
        // Sequences cut by an excerpt boundary.
        assert_eq!(shown("tail \x1b"), "tail \u{241B}");
        assert_eq!(shown("\x1b["), "\u{241B}[");
        assert_eq!(shown("]52;c;aGk=\x07"), "]52;c;aGk=\u{2407}");
        // Escaping is idempotent: what it writes is never escaped again.
        let mixed = "a\r\n\x1b]0;t\x07\u{9b}\u{202E}\x7f\0\r";
        assert_eq!(shown(&shown(mixed)), shown(mixed));
        assert!(inert(&shown(mixed)));
    }

    #[test]
    fn every_code_point_comes_out_inert() {
        let all: String = (0u32..0x11_0000).filter_map(char::from_u32).collect();
        let out = shown(&all);
        assert!(inert(&out));
        assert!(inert(&display_line(&all)));
        assert!(!display_line(&all).contains(['\t', '\n']));
        assert!(out.contains('日') && out.contains('🎉') && out.contains('\u{FFFD}'), "ordinary characters pass");
    }

    #[test]
    fn a_name_with_line_breaks_is_one_line() {
        let name = std::path::Path::new("x\nERROR pi: provider session expired\r\tcurl a | sh/.envrc");
        assert!(name.display().to_string().contains('\n'), "baseline: the raw name breaks the line");
        let shown = format!("{} appeared", one_line(name));
        assert_eq!(shown, "x\u{240A}ERROR pi: provider session expired\u{240D}\u{2409}curl a | sh/.envrc appeared");
        assert!(!shown.contains(['\n', '\r', '\t']));
        let bytes = std::ffi::OsStr::from_bytes(b"a\xff\x1b[2J\n");
        assert_eq!(one_line(bytes).to_string(), "a\u{FFFD}\u{241B}[2J\u{240A}", "not UTF-8 and escapes too");
    }

    #[test]
    fn line_and_paragraph_separators_are_no_line_ends() {
        let name = "x\u{2028}ERROR pi: provider session expired\u{2029}curl a | sh";
        // Baseline: JavaScript, and so pi, takes them for line ends.
        assert_eq!(name.split(['\u{2028}', '\u{2029}']).count(), 3);
        for shown in [display_line(name), display_text(name)] {
            assert_eq!(shown, "x<U+2028>ERROR pi: provider session expired<U+2029>curl a | sh");
        }
    }

    #[test]
    fn stand_ins_are_recognised() {
        assert!(holds_stand_in("/etc/\u{241B}]52"));
        assert!(holds_stand_in("/etc/<U+202E>x"));
        assert!(holds_stand_in(&display_line("/etc/\r\n")));
        assert!(!holds_stand_in("/etc/hostname"));
        assert!(!holds_stand_in("/srv/日本/<Ux>"));
    }
}

/// `1 entry`, `2 entries`: `n` and the noun in the number it takes.
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod count_tests {
    #[test]
    fn one_is_singular() {
        assert_eq!(super::count(1, "entry", "entries"), "1 entry");
        assert_eq!(super::count(0, "entry", "entries"), "0 entries");
        assert_eq!(super::count(2, "entry", "entries"), "2 entries");
    }
}
