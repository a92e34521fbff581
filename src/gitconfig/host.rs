//! The host's git facts: which system and user configuration files git
//! would read, chosen from git's environment as git chooses them, and the
//! user database lookups (`~name/`) that paths in them need.

use super::*;

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
    /// The home of another user, for `~user/` in git configuration.
    pub user_home: Option<fn(&OsStr) -> Option<PathBuf>>,
}

impl HostGit {
    /// [`HostGit::from_vars`] with this process's environment and working
    /// directory, the user database for `~user/`, and the default runtime
    /// root (`<tmp>/pi-python-sandbox-<uid>`) as untrusted; a session with
    /// another runtime root adds its own.
    pub fn from_env() -> HostGit {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let mut git = HostGit::from_vars(|name| std::env::var_os(name), &cwd);
        git.untrusted.push(crate::rundir::default_runtime_root());
        git.user_home = Some(user_home);
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
        HostGit { home, configs, untrusted: Vec::new(), user_home: None }
    }
}

/// The home directory of the user `name`, from the user database (git's
/// `getpwnam` for `~name/`).
fn user_home(name: &OsStr) -> Option<PathBuf> {
    nix::unistd::User::from_name(name.to_str()?).ok().flatten().map(|u| u.dir)
}

/// git's `git_env_bool` for a set variable: true, yes, on (any case) or a
/// non-zero number. What git rejects (and dies on) is taken as false here,
/// which reads the system configuration: the safe side.
fn git_true(value: &OsStr) -> bool {
    let v = value.to_string_lossy().to_ascii_lowercase();
    matches!(v.as_str(), "true" | "yes" | "on") || v.parse::<i64>().is_ok_and(|n| n != 0)
}

#[cfg(test)]
mod tests {
    use super::super::tests::vars;
    use super::*;

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
}
