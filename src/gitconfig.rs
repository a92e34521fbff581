//! What git on the host would execute from a project, found by reading
//! git's configuration files directly (git itself is never run on the host
//! in the project: its fsmonitor would run).
//!
//! Given the repositories a project scan found (`.git` directories and
//! files), this module returns the paths inside the project that git
//! treats as code or configuration: a worktree's gitdir inside the
//! project, `core.hooksPath` targets (from the repository's configuration,
//! the files it includes, and the user's and the system's configuration),
//! and included configuration files inside the project. Files inside the
//! project are read through [`Tree`]; the user's own are read by path
//! without blocking.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

use crate::beneath::{self, Kind, Tree};

/// Host facts the plan reads.
#[derive(Debug, Clone, Default)]
pub struct HostGit {
    /// The user's home (for `~/` in git configuration).
    pub home: Option<PathBuf>,
    /// The system's and the user's git configuration files, in the order
    /// git reads them.
    pub configs: Vec<PathBuf>,
    /// Host directories the sandbox can write: the runtime root, which
    /// holds every session's scratch directory. Nothing git would read
    /// from there is trusted (see [`refusals`]).
    pub untrusted: Vec<PathBuf>,
}

impl HostGit {
    /// [`HostGit::from_vars`] with this process's environment and working
    /// directory, and the default runtime root (`<tmp>/pi-python-sandbox-<uid>`)
    /// as untrusted; a session with another runtime root adds its own.
    pub fn from_env() -> HostGit {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let mut git = HostGit::from_vars(|name| std::env::var_os(name), &cwd);
        git.untrusted.push(crate::rundir::default_runtime_root());
        git
    }

    /// The configuration files git reads, given its environment `var` and
    /// working directory `cwd`, as git 2.47 chooses them: the system's
    /// (`$GIT_CONFIG_SYSTEM`, else `/etc/gitconfig`; none when
    /// `GIT_CONFIG_NOSYSTEM` is true), then the user's (`$GIT_CONFIG_GLOBAL`
    /// alone when set, else `$XDG_CONFIG_HOME/git/config` or
    /// `~/.config/git/config`, and `~/.gitconfig`). An empty variable names
    /// no file, as for git; a relative one is taken from `cwd` (git's own
    /// working directory varies with the command: pi's is the best guess).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>, cwd: &Path) -> HostGit {
        let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(|v| cwd.join(v));
        let home = var("HOME").map(PathBuf::from).filter(|h| h.is_absolute());
        let mut configs = Vec::new();
        if !var("GIT_CONFIG_NOSYSTEM").is_some_and(|v| git_true(&v)) {
            match var("GIT_CONFIG_SYSTEM") {
                Some(_) => configs.extend(set("GIT_CONFIG_SYSTEM")),
                None => configs.push(PathBuf::from("/etc/gitconfig")),
            }
        }
        match var("GIT_CONFIG_GLOBAL") {
            Some(_) => configs.extend(set("GIT_CONFIG_GLOBAL")),
            None => {
                match set("XDG_CONFIG_HOME") {
                    Some(xdg) => configs.push(xdg.join("git/config")),
                    None => configs.extend(home.iter().map(|h| h.join(".config/git/config"))),
                }
                configs.extend(home.iter().map(|h| h.join(".gitconfig")));
            }
        }
        HostGit { home, configs, untrusted: Vec::new() }
    }
}

/// git's `git_env_bool` for a set variable: true, yes, on (any case) or a
/// non-zero number. What git rejects (and dies on) is taken as false here,
/// which reads the system configuration: the safe side.
fn git_true(value: &OsStr) -> bool {
    let v = value.to_string_lossy().to_ascii_lowercase();
    matches!(v.as_str(), "true" | "yes" | "on") || v.parse::<i64>().is_ok_and(|n| n != 0)
}

/// Lexically resolve `target` (of a link or a config value) against `base`
/// and return it relative to the project root `project`, if inside.
pub fn inside(project: &Path, base: &Path, target: &Path) -> Option<PathBuf> {
    let joined = if target.is_absolute() { target.to_path_buf() } else { project.join(base).join(target) };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let rel = out.strip_prefix(project).ok()?.to_path_buf();
    (!rel.as_os_str().is_empty()).then_some(rel)
}

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
    let mut src = Source { text: text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text), pos: 0, eof: false };
    let mut section = Vec::new();
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
                Some(name) if !name.is_empty() => section = name,
                _ => break,
            }
            continue;
        }
        if !c.is_ascii_alphabetic() {
            break;
        }
        let Some((key, value)) = src.entry(c) else { break };
        // A key without `=` is a boolean, never a path.
        let Some(value) = value else { continue };
        let base = section.split(|&b| b == b'.').next().unwrap_or(&[]);
        let value = PathBuf::from(OsString::from_vec(value));
        match (base, key.as_slice()) {
            (b"core", b"hookspath") => out.hooks.push(value),
            (b"include" | b"includeif", b"path") => out.includes.push(value),
            _ => {}
        }
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

    /// After `[`: the section name, lower-cased (`get_base_var`); the
    /// subsection of `[name "sub"]` is read and dropped.
    fn section(&mut self) -> Option<Vec<u8>> {
        let mut name = Vec::new();
        loop {
            let c = self.next();
            if self.eof {
                return None;
            }
            if c == b']' {
                return Some(name);
            }
            if is_space(c) {
                return self.subsection(c).then_some(name);
            }
            if !is_key_char(c) && c != b'.' {
                return None;
            }
            name.push(c.to_ascii_lowercase());
        }
    }

    /// `get_extended_base_var`: spaces, a quoted name with `\` escaping
    /// the next character, then `]`.
    fn subsection(&mut self, mut c: u8) -> bool {
        while is_space(c) {
            if c == b'\n' {
                return false;
            }
            c = self.next();
        }
        if c != b'"' {
            return false;
        }
        loop {
            let mut c = self.next();
            if c == b'\n' {
                return false;
            }
            if c == b'"' {
                break;
            }
            if c == b'\\' {
                c = self.next();
                if c == b'\n' {
                    return false;
                }
            }
        }
        self.next() == b']'
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

const CONFIG_MAX: u64 = 1 << 20;

fn read_host(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    beneath::read_bounded(OwnedFd::from(file), CONFIG_MAX)
}

/// Paths inside the project (relative) that git on the host would run or
/// read as configuration, for the repositories in `found` (entries named
/// `.git`).
pub fn protected_paths(project: &Path, tree: &Tree, found: &[(PathBuf, Kind)], git: &HostGit) -> Vec<PathBuf> {
    let mut wanted = Vec::new();
    let mut configs: Vec<(Option<PathBuf>, Vec<u8>, PathBuf)> = Vec::new(); // (rel in project, text, worktree)
    let mut worktrees: Vec<PathBuf> = Vec::new();
    for (rel, kind) in found {
        if rel.file_name() != Some(OsStr::new(".git")) {
            continue;
        }
        let worktree = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        worktrees.push(worktree.clone());
        match kind {
            Kind::Dir => {
                let config = rel.join("config");
                if let Ok(text) = tree.read_regular(&config, CONFIG_MAX) {
                    configs.push((Some(config), text, worktree));
                }
            }
            Kind::File => {
                let Ok(text) = tree.read_regular(rel, 4096) else { continue };
                let text = String::from_utf8_lossy(&text);
                let Some(dir) = text.lines().find_map(|l| l.strip_prefix("gitdir:")).map(str::trim) else { continue };
                match inside(project, &worktree, Path::new(dir)) {
                    Some(gitdir) => {
                        if let Ok(text) = tree.read_regular(&gitdir.join("config"), CONFIG_MAX) {
                            configs.push((Some(gitdir.join("config")), text, worktree));
                        }
                        wanted.push(gitdir);
                    }
                    None => {
                        // Outside the project: not mounted, and not
                        // writable from the sandbox; only its hooks path counts.
                        let host = if Path::new(dir).is_absolute() {
                            PathBuf::from(dir)
                        } else {
                            project.join(&worktree).join(dir)
                        };
                        if let Ok(text) = read_host(&host.join("config")) {
                            configs.push((None, text, worktree));
                        }
                    }
                }
            }
            Kind::Link | Kind::Other => {}
        }
    }
    for path in &git.configs {
        if let Some(rel) = inside(project, Path::new(""), path) {
            wanted.push(rel); // a user config inside the project (pi run in $HOME)
        } else if let Ok(text) = read_host(path) {
            for w in &worktrees {
                configs.push((None, text.clone(), w.clone()));
            }
        }
    }
    let mut seen_includes = 0;
    while let Some((rel, text, worktree)) = configs.pop() {
        let ConfigPaths { hooks, includes } = git_config_paths(&text);
        let home_join = |v: &Path| -> Option<PathBuf> {
            match v.strip_prefix("~") {
                Ok(rest) => git.home.as_ref().map(|h| h.join(rest)),
                Err(_) => Some(v.to_path_buf()),
            }
        };
        for hp in hooks.iter().filter_map(|h| home_join(h)) {
            if let Some(rel) = inside(project, &worktree, &hp) {
                wanted.push(rel);
            }
        }
        for inc in includes.iter().filter_map(|i| home_join(i)) {
            // Relative to the file that names it.
            let base = rel.as_ref().and_then(|r| r.parent()).unwrap_or(Path::new("")).to_path_buf();
            if let Some(inc_rel) = inside(project, &base, &inc) {
                if seen_includes < 16 {
                    seen_includes += 1;
                    if let Ok(text) = tree.read_regular(&inc_rel, CONFIG_MAX) {
                        configs.push((Some(inc_rel.clone()), text, worktree.clone()));
                    }
                }
                wanted.push(inc_rel);
            }
        }
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| set.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn the_configuration_files_follow_gits_environment() {
        let configs = |set: &[(&str, &str)]| -> Vec<String> {
            let git = HostGit::from_vars(vars(set), Path::new("/cwd"));
            git.configs.iter().map(|p| p.to_string_lossy().into_owned()).collect()
        };
        let h = ("HOME", "/h");
        assert_eq!(configs(&[h]), ["/etc/gitconfig", "/h/.config/git/config", "/h/.gitconfig"]);
        assert_eq!(configs(&[h, ("XDG_CONFIG_HOME", "/x")]), ["/etc/gitconfig", "/x/git/config", "/h/.gitconfig"]);
        assert_eq!(
            configs(&[h, ("XDG_CONFIG_HOME", "")]),
            ["/etc/gitconfig", "/h/.config/git/config", "/h/.gitconfig"]
        );
        assert_eq!(configs(&[]), ["/etc/gitconfig"]);
        // GIT_CONFIG_GLOBAL replaces both of the user's files.
        assert_eq!(configs(&[h, ("XDG_CONFIG_HOME", "/x"), ("GIT_CONFIG_GLOBAL", "/g")]), ["/etc/gitconfig", "/g"]);
        assert_eq!(configs(&[h, ("GIT_CONFIG_GLOBAL", "rel/g")]), ["/etc/gitconfig", "/cwd/rel/g"]);
        assert_eq!(configs(&[h, ("GIT_CONFIG_GLOBAL", "")]), ["/etc/gitconfig"]);
        // GIT_CONFIG_SYSTEM replaces /etc/gitconfig; GIT_CONFIG_NOSYSTEM skips it.
        assert_eq!(configs(&[("GIT_CONFIG_SYSTEM", "/s"), ("GIT_CONFIG_GLOBAL", "/g")]), ["/s", "/g"]);
        assert_eq!(configs(&[("GIT_CONFIG_SYSTEM", ""), ("GIT_CONFIG_GLOBAL", "/g")]), ["/g"]);
        for yes in ["1", "true", "YES", "on", "2"] {
            let set = [("GIT_CONFIG_NOSYSTEM", yes), ("GIT_CONFIG_SYSTEM", "/s"), ("GIT_CONFIG_GLOBAL", "/g")];
            assert_eq!(configs(&set), ["/g"], "{yes}");
        }
        for no in ["0", "false", "off", "", "maybe"] {
            assert_eq!(
                configs(&[("GIT_CONFIG_NOSYSTEM", no), ("GIT_CONFIG_GLOBAL", "/g")]),
                ["/etc/gitconfig", "/g"],
                "{no}"
            );
        }
    }

    struct Tmp(PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A temp directory holding `project/` (canonical, as the plan gets it).
    fn tmp(tag: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!(
            "pps-git-{tag}-{}-{:x}",
            std::process::id(),
            crate::rundir::random_u64()
        ));
        std::fs::create_dir_all(p.join("project")).expect("mkdir");
        Tmp(p.canonicalize().expect("canonical"))
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// `protected_paths` of `base/project` with these host facts, sorted.
    fn wanted(base: &Path, git: &HostGit) -> Vec<String> {
        let project = base.join("project");
        let tree = Tree::open(&project).expect("open");
        let found: Vec<(PathBuf, Kind)> = ["", "sub/"]
            .iter()
            .map(|d| PathBuf::from(format!("{d}.git")))
            .filter_map(|rel| {
                let m = std::fs::symlink_metadata(project.join(&rel)).ok()?;
                let kind = match m.file_type() {
                    f if f.is_dir() => Kind::Dir,
                    f if f.is_file() => Kind::File,
                    f if f.is_symlink() => Kind::Link,
                    _ => Kind::Other,
                };
                Some((rel, kind))
            })
            .collect();
        let mut out: Vec<String> =
            protected_paths(&project, &tree, &found, git).iter().map(|p| p.to_string_lossy().into_owned()).collect();
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn git_config_global_replaces_the_users_files() {
        let t = tmp("env");
        let home = t.0.join("home");
        write(&t.0.join("project/.git/config"), "[core]\n\tbare = false\n");
        write(&home.join(".gitconfig"), "[core]\n\thooksPath = from-home\n");
        write(&t.0.join("elsewhere/g"), "[core]\n\thooksPath = from-env\n");
        let home_s = home.to_string_lossy().into_owned();
        let global = t.0.join("elsewhere/g").to_string_lossy().into_owned();
        let git = HostGit::from_vars(vars(&[("HOME", &home_s), ("GIT_CONFIG_NOSYSTEM", "1")]), Path::new("/"));
        assert_eq!(wanted(&t.0, &git), ["from-home"]);
        let set = [("HOME", home_s.as_str()), ("GIT_CONFIG_NOSYSTEM", "1"), ("GIT_CONFIG_GLOBAL", global.as_str())];
        assert_eq!(wanted(&t.0, &HostGit::from_vars(vars(&set), Path::new("/"))), ["from-env"]);
    }

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
