//! The protected names, as data: each with why a host tool makes it
//! dangerous to leave writable, and the patterns (names at any depth, or
//! paths relative to the project) the user's list turns into. What the
//! walk does with them is the parent module's.

use super::*;

/// A protected name and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub reason: &'static str,
}

const fn rule(name: &'static str, reason: &'static str) -> Rule {
    Rule { name, reason }
}

const GIT: &str = "git runs hooks, fsmonitor, filters and aliases named by a repository";
const HOOKS: &str = "commit hooks that git runs on the host";
const EDITOR: &str = "editor tasks and settings that run commands when the folder is opened";
const AGENT: &str = "coding-agent settings, commands and extensions that run on the host";
const SHELL: &str = "shell start-up files that a host shell may source";
const INSTRUCTIONS: &str = "instructions that steer every later coding-agent session in the project";
const PACKAGES: &str = "package-manager configuration and plugins that run on install or build";

/// The default protected names, matched at any depth of the project (the
/// whole directory when the name is one). Compared with sandbox-runtime's
/// mandatory-deny list and Codex's, plus agent and package-manager configs.
pub const DEFAULT_PROTECTED: &[Rule] = &[
    rule(".git", GIT),
    rule(".gitconfig", GIT),
    rule(".gitmodules", GIT),
    rule(".hg", "Mercurial runs hooks from .hg/hgrc"),
    rule(".husky", HOOKS),
    rule(".pre-commit-config.yaml", HOOKS),
    rule(".pi", AGENT),
    rule(".claude", AGENT),
    rule(".codex", AGENT),
    rule(".cursor", AGENT),
    rule(".gemini", AGENT),
    rule(".mcp.json", "MCP servers that agents start on the host"),
    rule(".agents", AGENT),
    rule("AGENTS.md", INSTRUCTIONS),
    rule("CLAUDE.md", INSTRUCTIONS),
    rule(
        SKILLS,
        "pi skills: instructions and scripts a later agent session loads (only a directory holding */SKILL.md)",
    ),
    rule(".vscode", EDITOR),
    rule(".idea", EDITOR),
    rule(".devcontainer", EDITOR),
    rule(".envrc", "direnv runs it when a shell enters the directory"),
    rule(".bashrc", SHELL),
    rule(".bash_profile", SHELL),
    rule(".bash_login", SHELL),
    rule(".bash_logout", SHELL),
    rule(".profile", SHELL),
    rule(".zshrc", SHELL),
    rule(".zprofile", SHELL),
    rule(".zshenv", SHELL),
    rule(".zlogin", SHELL),
    rule(".ripgreprc", "ripgrep reads options (a preprocessor command) from it"),
    rule(".npmrc", PACKAGES),
    rule(".yarnrc", PACKAGES),
    rule(".yarnrc.yml", PACKAGES),
    rule(".yarn", "yarn runs the release and plugins kept in .yarn"),
    rule(".pnpmfile.cjs", PACKAGES),
    rule(".cargo", "cargo reads runners, linkers and aliases from .cargo/config.toml"),
];

/// The one conditional name: a `skills` directory is protected only where
/// it holds pi skills (a subdirectory with a `SKILL.md`).
pub const SKILLS: &str = "skills";

/// Replaces [`DEFAULT_PROTECTED`]: a colon-separated list; an entry with a
/// `/` is a path relative to the project, any other a name matched at any
/// depth (empty: protect nothing).
pub const PROTECTED_ENV: &str = "PI_SANDBOX_PROTECTED";

/// What is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// A name, at any depth.
    Name(String),
    /// A path relative to the project.
    Path(PathBuf),
}

/// The patterns in force: `override_list` (from the environment) or the
/// default. Entries that are not plain relative paths are dropped.
pub fn patterns(override_list: Option<&str>) -> Vec<Pattern> {
    let Some(list) = override_list else {
        return DEFAULT_PROTECTED.iter().map(|r| Pattern::Name(r.name.into())).collect();
    };
    let mut out = Vec::new();
    for entry in list.split(':').map(str::trim).filter(|s| !s.is_empty()) {
        let rel = Path::new(entry.trim_matches('/'));
        if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            continue;
        }
        let p = if rel.components().count() == 1 {
            Pattern::Name(rel.to_string_lossy().into_owned())
        } else {
            Pattern::Path(rel.to_path_buf())
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The patterns as the user wrote them (for `status`).
pub fn describe(patterns: &[Pattern]) -> Vec<String> {
    patterns
        .iter()
        .map(|p| match p {
            Pattern::Name(n) => n.clone(),
            Pattern::Path(p) => p.display().to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_from_a_list() {
        assert_eq!(
            patterns(Some(".a: b/c ::/d/: ../x")),
            [Pattern::Name(".a".into()), Pattern::Path("b/c".into()), Pattern::Name("d".into())]
        );
        assert!(patterns(Some("")).is_empty());
        assert_eq!(patterns(None).len(), DEFAULT_PROTECTED.len());
        assert!(DEFAULT_PROTECTED.iter().all(|r| !r.reason.is_empty() && !r.name.contains('/')));
    }
}
