//! Host secrets: paths that no read grant mounts.
//!
//! A read root or an allow-once grant mounts a host directory or file into
//! the sandbox. Some host paths hold credentials that a grant of their
//! directory should never carry along: the shadow and sudoers files, SSH
//! host keys, the user's `~/.ssh`, cloud and registry credentials, pi's own
//! `auth.json`. This module keeps that list and answers two questions: is
//! a grant itself such a path (then it is refused), and which of them lie
//! inside a granted directory (then each is masked: an empty read-only
//! directory or an empty file over it).
//!
//! Entries are absolute paths; `~` stands for the home directory of the
//! process, and the last component may hold `*` (any run of characters
//! but `/`). `PI_PYTHON_TOOL_HOST_SECRETS` adds entries (colon separated).
//! The list is about host paths outside the project; secrets inside the
//! project are the project scan's business.

use std::path::{Path, PathBuf};

/// Extra entries, colon separated, added to [`DEFAULT_HOST_SECRETS`].
pub const HOST_SECRETS_ENV: &str = "PI_PYTHON_TOOL_HOST_SECRETS";

/// What no grant mounts, on any host.
pub const DEFAULT_HOST_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/NetworkManager/system-connections",
    "/etc/wireguard",
    "/root/.ssh",
    "~/.ssh",
    "~/.aws",
    "~/.azure",
    "~/.gnupg",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.npmrc",
    "~/.pypirc",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.config/gh",
    "~/.config/gcloud",
    "~/.config/op",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.vault-token",
    "~/.terraform.d/credentials.tfrc.json",
    "~/.pi/agent/auth.json",
];

/// One entry: a directory and a last component (literal or with `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub dir: PathBuf,
    pub leaf: String,
}

impl Entry {
    fn matches_leaf(&self, name: &str) -> bool {
        glob_match(&self.leaf, name)
    }

    /// The entry as the user would write it.
    pub fn shown(&self) -> String {
        self.dir.join(&self.leaf).display().to_string()
    }
}

/// The list in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSecrets {
    pub entries: Vec<Entry>,
}

/// A path inside a granted directory to hide.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mask {
    pub path: PathBuf,
    pub is_dir: bool,
}

/// `*` matches any run of characters; everything else matches itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

impl HostSecrets {
    /// The defaults plus `extra` (the variable's value). `home` expands `~`;
    /// without one, `~` entries are dropped. Entries are canonicalised
    /// where their directory exists, so that a grant that reaches them
    /// through a link still sees them.
    pub fn new(extra: Option<&str>, home: Option<&Path>) -> HostSecrets {
        let extra = extra.unwrap_or("").split(':').map(str::trim).filter(|s| !s.is_empty());
        let mut entries: Vec<Entry> = Vec::new();
        for raw in DEFAULT_HOST_SECRETS.iter().copied().chain(extra) {
            let Some(path) = expand(raw, home) else { continue };
            let Some(leaf) = path.file_name().map(|l| l.to_string_lossy().into_owned()) else { continue };
            let Some(dir) = path.parent().and_then(crate::permissions::normalize_path) else { continue };
            let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
            let entry = Entry { dir, leaf };
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        }
        HostSecrets { entries }
    }

    /// The entry that `path` (canonical) is or lies under, if any.
    pub fn covering(&self, path: &Path) -> Option<&Entry> {
        self.entries.iter().find(|e| {
            path.strip_prefix(&e.dir).ok().and_then(|rest| rest.components().next()).is_some_and(
                |first| matches!(first, std::path::Component::Normal(n) if e.matches_leaf(&n.to_string_lossy())),
            )
        })
    }

    /// The secrets that exist inside `root` (canonical), as canonical paths,
    /// each once, in order. A secret that is a link is masked where it
    /// points when that is inside `root` (the link itself then leads to the
    /// mask). Nothing at or under `skip` is looked at: trees the sandbox
    /// can write (the project, the session directories), where a path could
    /// be a link it planted; what is secret there is the project scan's.
    pub fn masks_under(&self, root: &Path, skip: &[&Path]) -> Vec<Mask> {
        let mut out: Vec<Mask> = Vec::new();
        let skipped = |p: &Path| skip.iter().any(|s| p.starts_with(s));
        let mut add = |p: PathBuf| {
            if skipped(&p) {
                return;
            }
            let Ok(real) = std::fs::canonicalize(&p) else { return };
            if !real.starts_with(root) || real == root || skipped(&real) {
                return;
            }
            let Ok(meta) = std::fs::metadata(&real) else { return };
            let mask = Mask { path: real, is_dir: meta.is_dir() };
            if !out.contains(&mask) {
                out.push(mask);
            }
        };
        for e in &self.entries {
            if !e.dir.starts_with(root) && !root.starts_with(&e.dir) {
                continue;
            }
            if e.leaf.contains('*') {
                if skipped(&e.dir) {
                    continue;
                }
                let Ok(list) = std::fs::read_dir(&e.dir) else { continue };
                let mut names: Vec<PathBuf> = list
                    .flatten()
                    .filter(|d| e.matches_leaf(&d.file_name().to_string_lossy()))
                    .map(|d| d.path())
                    .collect();
                names.sort();
                names.into_iter().for_each(&mut add);
            } else {
                add(e.dir.join(&e.leaf));
            }
        }
        out.sort();
        out
    }
}

/// `~` and `~/x` with `home`; other paths must be absolute.
fn expand(raw: &str, home: Option<&Path>) -> Option<PathBuf> {
    if raw == "~" {
        return home.map(Path::to_path_buf);
    }
    if let Some(rest) = raw.strip_prefix("~/") {
        return home.map(|h| h.join(rest));
    }
    raw.starts_with('/').then(|| PathBuf::from(raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn globs_match_within_one_component() {
        assert!(glob_match("ssh_host_*_key", "ssh_host_ed25519_key"));
        assert!(!glob_match("ssh_host_*_key", "ssh_host_ed25519_key.pub"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "aXbYc"));
        assert!(!glob_match("a*b*c", "acb"));
        assert!(glob_match("shadow", "shadow"));
        assert!(!glob_match("shadow", "shadow-"));
    }

    #[test]
    fn home_entries_expand_and_extras_are_added() {
        let s = HostSecrets::new(Some("/srv/vault: ~/.config/extra ::relative"), Some(Path::new("/nonexistent-home")));
        let shown: Vec<String> = s.entries.iter().map(Entry::shown).collect();
        assert!(shown.contains(&"/nonexistent-home/.ssh".to_string()), "{shown:?}");
        assert!(shown.contains(&"/srv/vault".to_string()));
        assert!(shown.contains(&"/nonexistent-home/.config/extra".to_string()));
        assert!(!shown.iter().any(|s| s.contains("relative")));
        let no_home = HostSecrets::new(None, None);
        assert!(!no_home.entries.iter().any(|e| e.shown().contains(".aws")));
        assert!(no_home.entries.iter().any(|e| e.shown() == "/etc/shadow"));
    }

    #[test]
    fn a_grant_at_or_under_a_secret_is_covered() {
        let s = HostSecrets::new(None, Some(Path::new("/nonexistent-home")));
        assert!(s.covering(Path::new("/etc/shadow")).is_some());
        assert!(s.covering(Path::new("/etc/sudoers.d/90-users")).is_some());
        assert!(s.covering(Path::new("/etc/ssh/ssh_host_rsa_key")).is_some());
        assert!(s.covering(Path::new("/nonexistent-home/.ssh/id_ed25519")).is_some());
        assert!(s.covering(Path::new("/etc/ssh/ssh_host_rsa_key.pub")).is_none());
        assert!(s.covering(Path::new("/etc")).is_none());
        assert!(s.covering(Path::new("/etc/shadowy")).is_none());
        assert!(s.covering(Path::new("/nonexistent-home")).is_none());
    }

    #[test]
    fn masks_are_the_secrets_that_exist_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join(".ssh")).unwrap();
        fs::write(home.join(".ssh/id_ed25519"), "k").unwrap();
        fs::write(home.join(".netrc"), "n").unwrap();
        fs::create_dir_all(home.join("keys")).unwrap();
        fs::write(home.join("keys/a.key"), "a").unwrap();
        fs::write(home.join("keys/b.txt"), "b").unwrap();
        // A secret that is a link to a file inside the root is masked where it points.
        fs::write(home.join("real-credentials"), "c").unwrap();
        std::os::unix::fs::symlink(home.join("real-credentials"), home.join(".git-credentials")).unwrap();
        let extra = format!("{}/keys/*.key", home.display());
        let s = HostSecrets::new(Some(&extra), Some(&home));
        let masks = s.masks_under(&home, &[]);
        assert_eq!(
            masks,
            [
                Mask { path: home.join(".netrc"), is_dir: false },
                Mask { path: home.join(".ssh"), is_dir: true },
                Mask { path: home.join("keys/a.key"), is_dir: false },
                Mask { path: home.join("real-credentials"), is_dir: false },
            ]
        );
        // A root inside a secret's directory sees only what is under it.
        assert_eq!(s.masks_under(&home.join("keys"), &[]), [Mask { path: home.join("keys/a.key"), is_dir: false }]);
        assert!(s.masks_under(&home.join(".ssh"), &[]).is_empty(), "the root itself is refused, not masked");
        // Inside a tree the sandbox writes (here: the whole home is a project), nothing is looked at.
        assert!(s.masks_under(&home, &[&home]).is_empty());
        assert_eq!(s.masks_under(&home, &[&home.join(".ssh"), &home.join("keys")]).len(), 2);
    }
}
