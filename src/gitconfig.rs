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

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use crate::beneath::{self, Kind, Tree};

/// Host facts the plan reads.
#[derive(Debug, Clone, Default)]
pub struct HostGit {
    /// The user's home (for `~/` in git configuration).
    pub home: Option<PathBuf>,
    /// The user's and the system's git configuration files, in the order
    /// git reads them.
    pub configs: Vec<PathBuf>,
}

impl HostGit {
    /// `/etc/gitconfig`, `$XDG_CONFIG_HOME/git/config` (or
    /// `~/.config/git/config`) and `~/.gitconfig`.
    pub fn from_env() -> HostGit {
        let home = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute());
        let mut configs = vec![PathBuf::from("/etc/gitconfig")];
        match std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute()) {
            Some(xdg) => configs.push(xdg.join("git/config")),
            None => configs.extend(home.iter().map(|h| h.join(".config/git/config"))),
        }
        configs.extend(home.iter().map(|h| h.join(".gitconfig")));
        HostGit { home, configs }
    }
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

/// Values of `core.hooksPath` and of include paths in git configuration
/// text. A small reader of git's format: sections, quoted values,
/// comments; keys are case-insensitive.
pub fn git_config_paths(text: &str) -> (Option<String>, Vec<String>) {
    let mut section = String::new();
    let mut hooks = None;
    let mut includes = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix('[') {
            let head = rest.split(']').next().unwrap_or("");
            let name = head.split(|c: char| c.is_whitespace() || c == '"').next().unwrap_or("");
            section = name.to_ascii_lowercase();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let key = key.trim().to_ascii_lowercase();
        let value = unquote(value);
        match (section.as_str(), key.as_str()) {
            ("core", "hookspath") => hooks = Some(value),
            ("include" | "includeif", "path") => includes.push(value),
            _ => {}
        }
    }
    (hooks, includes)
}

fn unquote(value: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = value.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => {
                if let Some(n) = chars.next() {
                    out.push(match n {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                }
            }
            '#' | ';' if !quoted => break,
            c => out.push(c),
        }
    }
    out.trim_end().to_string()
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
        let (hooks, includes) = git_config_paths(&String::from_utf8_lossy(&text));
        let home_join = |v: &str| -> Option<PathBuf> {
            match v.strip_prefix("~/") {
                Some(rest) => git.home.as_ref().map(|h| h.join(rest)),
                None => Some(PathBuf::from(v)),
            }
        };
        if let Some(hp) = hooks.as_deref().and_then(home_join) {
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

    #[test]
    fn reads_hooks_paths_and_includes_from_git_configuration() {
        let text = "[core]\n\tbare = false\n\thooksPath = \"tools/hooks\" ; comment\n[include]\n  path = ../shared.gitconfig\n\
                    [includeIf \"gitdir:~/w/\"]\n path = ~/work.gitconfig\n[alias]\n hooksPath = nope\n";
        let (hooks, includes) = git_config_paths(text);
        assert_eq!(hooks.as_deref(), Some("tools/hooks"));
        assert_eq!(includes, ["../shared.gitconfig", "~/work.gitconfig"]);
        assert_eq!(git_config_paths("[CORE]\nHOOKSPATH=.husky\n").0.as_deref(), Some(".husky"));
    }
}
