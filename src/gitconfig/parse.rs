//! git's configuration syntax, as git's own parser reads it: every entry,
//! the `core.hooksPath` values and the include paths of one configuration file,
//! and the path a `.git` file names. Pure functions of bytes; which files
//! are read is the parent module's.

use super::*;

/// What a git configuration file names that this module follows: every
/// `core.hooksPath` value and every include path, in the order written,
/// exactly as git would read them (bytes, not text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigPaths {
    pub hooks: Vec<PathBuf>,
    pub includes: Vec<PathBuf>,
}

/// Read the `core.hooksPath` values and the include paths of git
/// configuration text. A transcription of git's own parser (`config.c`,
/// `git_parse_source`): a UTF-8 byte order mark, comments, a key on the
/// line of its section header, quoted values and the escapes `\t \b \n \\
/// \"`, a `\` at the end of a line continuing the value, case-insensitive
/// section and key names. Like git it stops at the first malformed line
/// (git then refuses the whole file, so nothing after it can take effect).
///
/// Conservative where git looks at more than the name: every
/// `[includeIf ...]` counts whatever its condition, and the subsection of
/// `[core ...]`, `[include ...]` and `[includeIf ...]` is not looked at.
/// All values count, not only the last one: keeping an overridden
/// hooks path read-only costs nothing.
pub fn git_config_paths(text: &[u8]) -> ConfigPaths {
    let mut out = ConfigPaths::default();
    for e in entries(text) {
        // A key without `=` is a boolean, never a path.
        let Some(value) = e.value else { continue };
        let base = e.section.split(|&b| b == b'.').next().unwrap_or(&[]);
        let value = PathBuf::from(OsString::from_vec(value));
        match (base, e.key.as_slice()) {
            (b"core", b"hookspath") => out.hooks.push(value),
            (b"include" | b"includeif", b"path") => out.includes.push(value),
            _ => {}
        }
    }
    out
}

/// One `key = value` of git configuration text, as git reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    /// The section name, lower-cased; with a `.` and the (lower-cased)
    /// subsection for the old `[section.sub]` form.
    pub section: Vec<u8>,
    /// The subsection of `[section "sub"]`, unescaped, case kept.
    pub subsection: Option<Vec<u8>>,
    /// The key, lower-cased.
    pub key: Vec<u8>,
    /// The value, unquoted and unescaped; `None` for a key without `=`.
    pub value: Option<Vec<u8>>,
}

/// Every entry of git configuration text in the order written, read as
/// [`git_config_paths`] describes; reading stops at the first malformed
/// line (git refuses the whole file there).
pub(super) fn entries(text: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut src = Source { text: text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text), pos: 0, eof: false };
    let mut section = (Vec::new(), None);
    let mut comment = false;
    loop {
        let c = src.next();
        if c == b'\n' {
            if src.eof {
                break;
            }
            comment = false;
            continue;
        }
        if comment || is_space(c) {
            continue;
        }
        if c == b'#' || c == b';' {
            comment = true;
            continue;
        }
        if c == b'[' {
            match src.section() {
                Some(name) if !name.0.is_empty() => section = name,
                _ => break,
            }
            continue;
        }
        if !c.is_ascii_alphabetic() {
            break;
        }
        let Some((key, value)) = src.entry(c) else { break };
        out.push(Entry { section: section.0.clone(), subsection: section.1.clone(), key, value });
    }
    out
}

/// git's `isspace` (`sane_ctype`): no vertical tab, no form feed.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

fn is_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

/// Configuration text read the way git's `get_next_char` reads it: `\r\n`
/// is `\n`, and the end reads as a `\n` with `eof` set.
struct Source<'a> {
    text: &'a [u8],
    pos: usize,
    eof: bool,
}

impl Source<'_> {
    fn next(&mut self) -> u8 {
        let Some(&c) = self.text.get(self.pos) else {
            self.eof = true;
            return b'\n';
        };
        self.pos += 1;
        if c == b'\r' && self.text.get(self.pos) == Some(&b'\n') {
            self.pos += 1;
            return b'\n';
        }
        c
    }

    /// After `[`: the section name, lower-cased (`get_base_var`), and the
    /// subsection of `[name "sub"]`.
    fn section(&mut self) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
        let mut name = Vec::new();
        loop {
            let c = self.next();
            if self.eof {
                return None;
            }
            if c == b']' {
                return Some((name, None));
            }
            if is_space(c) {
                return self.subsection(c).map(|sub| (name, Some(sub)));
            }
            if !is_key_char(c) && c != b'.' {
                return None;
            }
            name.push(c.to_ascii_lowercase());
        }
    }

    /// `get_extended_base_var`: spaces, a quoted name with `\` escaping
    /// the next character, then `]`.
    fn subsection(&mut self, mut c: u8) -> Option<Vec<u8>> {
        while is_space(c) {
            if c == b'\n' {
                return None;
            }
            c = self.next();
        }
        if c != b'"' {
            return None;
        }
        let mut sub = Vec::new();
        loop {
            let mut c = self.next();
            if c == b'\n' {
                return None;
            }
            if c == b'"' {
                break;
            }
            if c == b'\\' {
                c = self.next();
                if c == b'\n' {
                    return None;
                }
            }
            sub.push(c);
        }
        (self.next() == b']').then_some(sub)
    }

    /// A key starting with `first` (lower-cased) and its value, `None` for
    /// a key without `=` (`get_value`).
    fn entry(&mut self, first: u8) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
        let mut key = vec![first.to_ascii_lowercase()];
        let mut c;
        loop {
            c = self.next();
            if self.eof || !is_key_char(c) {
                break;
            }
            key.push(c.to_ascii_lowercase());
        }
        while c == b' ' || c == b'\t' {
            c = self.next();
        }
        if c == b'\n' {
            return Some((key, None));
        }
        if c != b'=' {
            return None;
        }
        Some((key, Some(self.value()?)))
    }

    /// `parse_value`: leading and trailing blanks outside quotes dropped,
    /// blanks inside kept, a comment ends the value outside quotes.
    fn value(&mut self) -> Option<Vec<u8>> {
        let (mut quote, mut comment) = (false, false);
        let mut out = Vec::new();
        // git's `trim_len`: where trailing blanks began, 0 for none.
        let mut trim = 0;
        loop {
            let c = self.next();
            if c == b'\n' {
                if quote {
                    return None;
                }
                if trim != 0 {
                    out.truncate(trim);
                }
                return Some(out);
            }
            if comment {
                continue;
            }
            if is_space(c) && !quote {
                if trim == 0 {
                    trim = out.len();
                }
                if !out.is_empty() {
                    out.push(c);
                }
                continue;
            }
            if !quote && (c == b';' || c == b'#') {
                comment = true;
                continue;
            }
            trim = 0;
            if c == b'\\' {
                let e = self.next();
                out.push(match e {
                    b'\n' => continue,
                    b't' => b'\t',
                    b'b' => 0x08,
                    b'n' => b'\n',
                    b'\\' | b'"' => e,
                    _ => return None,
                });
                continue;
            }
            if c == b'"' {
                quote = !quote;
                continue;
            }
            out.push(c);
        }
    }
}

/// The path a `.git` file names, as git reads it (`read_gitfile_gently`):
/// the text must start with `gitdir: `; trailing newlines go.
pub(super) fn gitfile_target(text: &[u8]) -> Option<PathBuf> {
    let mut rest = text.strip_prefix(b"gitdir: ")?;
    while let Some(r) = rest.strip_suffix(b"\n").or_else(|| rest.strip_suffix(b"\r")) {
        rest = r;
    }
    (!rest.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(rest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(text: &[u8]) -> (Vec<String>, Vec<String>) {
        let ConfigPaths { hooks, includes } = git_config_paths(text);
        let s = |v: Vec<PathBuf>| v.into_iter().map(|p| p.to_string_lossy().into_owned()).collect();
        (s(hooks), s(includes))
    }

    #[test]
    fn reads_hooks_paths_and_includes_from_git_configuration() {
        let text = b"[core]\n\tbare = false\n\thooksPath = \"tools/hooks\" ; comment\n[include]\n  path = ../shared.gitconfig\n\
                    [includeIf \"gitdir:~/w/\"]\n path = ~/work.gitconfig\n[alias]\n hooksPath = nope\n";
        assert_eq!(
            paths(text),
            (vec!["tools/hooks".into()], vec!["../shared.gitconfig".into(), "~/work.gitconfig".into()])
        );
    }

    #[test]
    fn values_are_read_as_git_reads_them() {
        let hooks = |text: &str| paths(text.as_bytes()).0;
        // A `#` or `;` inside quotes is part of the value; outside, a comment.
        assert_eq!(hooks("[core]\nhooksPath = \"a # b;c\" # comment\n"), ["a # b;c"]);
        assert_eq!(hooks("[core]\nhooksPath = a#b\n"), ["a"]);
        // A `\` at the end of a line continues the value, inside quotes or not.
        assert_eq!(hooks("[core]\nhooksPath = tools/\\\nhooks\n"), ["tools/hooks"]);
        assert_eq!(hooks("[core]\nhooksPath = \"to ols/\\\nhooks\"\n"), ["to ols/hooks"]);
        // Blanks around the value go, blanks inside stay; escapes; CRLF.
        assert_eq!(hooks("[core]\r\nhooksPath =  a  b\\t\\\"q\\\\  \r\n"), ["a  b\t\"q\\"]);
        // The key may follow its section header on the same line.
        assert_eq!(hooks("[core] hooksPath = inline\n"), ["inline"]);
        // Section and key names are case-insensitive; every value counts.
        assert_eq!(hooks("[CoRe]\nHOOKSPATH=.husky\n[core]\nhookspath = second\n"), [".husky", "second"]);
        // Not core.hooksPath: another section's key, a boolean key, a
        // different key that starts the same.
        assert!(hooks("[alias]\nhooksPath = x\n[core]\nhooksPath\nhooksPathx = y\n").is_empty());
        // A byte order mark, and bytes that are not UTF-8, as git keeps them.
        assert_eq!(
            git_config_paths(b"\xef\xbb\xbf[core]\nhooksPath = h\xe9\n").hooks,
            [PathBuf::from(OsString::from_vec(b"h\xe9".to_vec()))]
        );
    }

    #[test]
    fn includes_come_from_include_and_every_include_if() {
        let text =
            "[include]\npath = a\n[includeIf \"gitdir:/x/\"]\npath = b\n[INCLUDEIF \"onbranch:\\\"m]\"]\n\tPATH = c\n\
                    [includeif \"hasconfig:remote.*.url:h\"] path = d\n";
        assert_eq!(paths(text.as_bytes()).1, ["a", "b", "c", "d"]);
        // `path` in any other section is not an include, nor in a section
        // whose subsection is named include.
        let other = "[core]\npath = a\n[alias]\npath = b\n[remote \"include\"]\npath = c\n[includes]\npath = d\n[x]\ninclude = e\n";
        assert_eq!(paths(other.as_bytes()), (vec![], vec![]));
    }

    #[test]
    fn a_malformed_line_ends_the_file_as_it_does_for_git() {
        // git refuses the file there: what follows never takes effect.
        for bad in ["!x = 1", "hooksPath = \"open", "hooksPath = \\q", "[core", "[core \"x]", "[co/re]", "key # c"] {
            let text = format!("[core]\nhooksPath = before\n{bad}\n[core]\nhooksPath = after\n");
            assert_eq!(paths(text.as_bytes()).0, ["before"], "{bad}");
        }
    }
}
