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
    "~/.pi/agent/sessions",
    "~/.s3cfg",
    "~/.config/rclone",
    "~/.config/containers/auth.json",
    "/run/secrets",
    "/var/run/secrets",
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
    /// through a link still sees them; a secret that is itself a link
    /// (`~/.ssh -> ~/dotfiles/ssh`) is a secret where it points as well.
    ///
    /// Nothing is resolved through `trees` (trees the sandbox can write):
    /// there an entry is taken as written.
    pub fn new(extra: Option<&str>, home: Option<&Path>, trees: &[&Path]) -> HostSecrets {
        let resolve = |p: &Path| crate::paths::resolve_avoiding(p, trees);
        let extra = extra.unwrap_or("").split(':').map(str::trim).filter(|s| !s.is_empty());
        let mut entries: Vec<Entry> = Vec::new();
        let mut add = |entry: Entry| {
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        };
        for raw in DEFAULT_HOST_SECRETS.iter().copied().chain(extra) {
            let Some(path) = expand(raw, home) else { continue };
            let Some(leaf) = path.file_name().map(|l| l.to_string_lossy().into_owned()) else { continue };
            let Some(dir) = path.parent().and_then(crate::paths::normalize_path) else { continue };
            let dir = resolve(&dir).unwrap_or(dir);
            let entry = Entry { dir, leaf };
            // Where each existing match really is, when that is elsewhere.
            let in_tree = trees.iter().any(|t| entry.dir.starts_with(t));
            let matches: Vec<PathBuf> = if in_tree {
                Vec::new()
            } else if entry.leaf.contains('*') {
                std::fs::read_dir(&entry.dir)
                    .map(|list| {
                        list.flatten()
                            .filter(|d| entry.matches_leaf(&d.file_name().to_string_lossy()))
                            .map(|d| d.path())
                            .collect()
                    })
                    .unwrap_or_default()
            } else {
                vec![entry.dir.join(&entry.leaf)]
            };
            add(entry);
            for m in matches {
                let Ok(real) = resolve(&m) else { continue };
                if real == m {
                    continue;
                }
                if let (Some(dir), Some(leaf)) = (real.parent(), real.file_name()) {
                    add(Entry { dir: dir.to_path_buf(), leaf: leaf.to_string_lossy().into_owned() });
                }
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
            let Ok(real) = crate::paths::resolve_avoiding(&p, skip) else { return };
            if !real.starts_with(root) || real == root {
                return;
            }
            let Ok(meta) = std::fs::symlink_metadata(&real) else { return };
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

/// A directory to watch while a sandbox runs, and the name pattern whose
/// appearance in it makes a host secret appear inside a mounted root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchPoint {
    pub dir: PathBuf,
    pub leaf: String,
}

impl HostSecrets {
    /// Where a secret that does not exist yet could appear inside `roots`
    /// (canonical): the secret's directory when it exists, else its nearest
    /// existing ancestor inside the root, watched for the next component.
    /// Nothing at or under `skip` (trees the sandbox writes).
    pub fn watch_points(&self, roots: &[&Path], skip: &[&Path]) -> Vec<WatchPoint> {
        let mut out: Vec<WatchPoint> = Vec::new();
        for e in &self.entries {
            let Some(root) = roots.iter().find(|r| e.dir.starts_with(r)) else { continue };
            let mut dir = e.dir.clone();
            let mut leaf = e.leaf.clone();
            while !dir.is_dir() {
                let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { break };
                leaf = name.to_string_lossy().into_owned();
                dir = parent.to_path_buf();
            }
            if !dir.starts_with(root) || skip.iter().any(|t| dir.starts_with(t)) {
                continue;
            }
            let point = WatchPoint { dir, leaf };
            if !out.contains(&point) {
                out.push(point);
            }
        }
        out
    }
}

/// Watch `points` until `stop` fires; when a matching name appears, call
/// `appeared` with its path (once: the sandbox it guards is then killed).
/// Returns at once when inotify is unavailable (each execution's check of
/// the masks remains).
pub async fn watch(
    points: Vec<WatchPoint>,
    appeared: impl FnOnce(PathBuf) + Send + 'static,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let Ok(inotify) = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) else { return };
    let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR;
    let mut wds = Vec::new();
    for p in points {
        if let Ok(wd) = inotify.add_watch(&p.dir, flags) {
            wds.push((wd, p));
        }
    }
    if wds.is_empty() {
        return;
    }
    let Some(inotify) = crate::inotify::Inotified::new(inotify) else { return };
    loop {
        tokio::select! {
            _ = &mut stop => return,
            events = inotify.events() => {
                let Some(events) = events else { return };
                for ev in events {
                    // One directory holds several points, all under one watch.
                    let mut here = wds.iter().filter(|(wd, _)| *wd == ev.wd).map(|(_, p)| p);
                    let name = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned());
                    let overflow = ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW);
                    let hit = here.find(|p| overflow || name.as_deref().is_some_and(|n| glob_match(&p.leaf, n)));
                    if let Some(point) = hit.or(if overflow { wds.first().map(|(_, p)| p) } else { None }) {
                        appeared(point.dir.join(name.unwrap_or_default()));
                        return;
                    }
                }
            }
        }
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
        let s =
            HostSecrets::new(Some("/srv/vault: ~/.config/extra ::relative"), Some(Path::new("/nonexistent-home")), &[]);
        let shown: Vec<String> = s.entries.iter().map(Entry::shown).collect();
        assert!(shown.contains(&"/nonexistent-home/.ssh".to_string()), "{shown:?}");
        assert!(shown.contains(&"/srv/vault".to_string()));
        assert!(shown.contains(&"/nonexistent-home/.config/extra".to_string()));
        assert!(!shown.iter().any(|s| s.contains("relative")));
        let no_home = HostSecrets::new(None, None, &[]);
        assert!(!no_home.entries.iter().any(|e| e.shown().contains(".aws")));
        assert!(no_home.entries.iter().any(|e| e.shown() == "/etc/shadow"));
    }

    #[test]
    fn a_secret_that_is_a_link_is_a_secret_where_it_points() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join("dotfiles/ssh")).unwrap();
        fs::write(home.join("dotfiles/ssh/id_ed25519"), "k").unwrap();
        std::os::unix::fs::symlink(home.join("dotfiles/ssh"), home.join(".ssh")).unwrap();
        let data = home.join("data");
        fs::create_dir_all(data.join("aws-creds")).unwrap();
        std::os::unix::fs::symlink(data.join("aws-creds"), home.join(".aws")).unwrap();
        let s = HostSecrets::new(None, Some(&home), &[]);
        // The target itself is refused as a grant, and anything under it.
        assert!(s.covering(&home.join("dotfiles/ssh")).is_some());
        assert!(s.covering(&home.join("dotfiles/ssh/id_ed25519")).is_some());
        assert!(s.covering(&home.join("dotfiles")).is_none());
        // A root that holds the target masks it, also when the link is outside the root.
        assert_eq!(
            s.masks_under(&home.join("dotfiles"), &[]),
            [Mask { path: home.join("dotfiles/ssh"), is_dir: true }]
        );
        assert_eq!(s.masks_under(&data, &[]), [Mask { path: data.join("aws-creds"), is_dir: true }]);
    }

    #[test]
    fn nothing_is_resolved_through_a_tree_the_sandbox_writes() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let base = fs::canonicalize(t.path()).unwrap();
        // The home directory is the project: the sandbox can plant ~/.ssh as a link.
        let home = base.join("home");
        fs::create_dir_all(home.join("real-ssh")).unwrap();
        fs::create_dir_all(base.join("elsewhere")).unwrap();
        fs::write(base.join("elsewhere/notes"), "n").unwrap();
        std::os::unix::fs::symlink(base.join("elsewhere"), home.join(".ssh")).unwrap();
        // Baseline: resolved freely, the planted link makes its target a secret.
        let free = HostSecrets::new(None, Some(&home), &[]);
        assert!(free.covering(&base.join("elsewhere/notes")).is_some());
        let guarded = HostSecrets::new(None, Some(&home), &[&home]);
        assert!(guarded.covering(&base.join("elsewhere/notes")).is_none(), "the link was followed");
        assert!(guarded.covering(&home.join(".ssh/x")).is_some(), "the entry itself stays");
        // A root outside the tree whose secret path leads into it is not looked through either.
        std::os::unix::fs::symlink(home.join("real-ssh"), base.join("elsewhere/.netrc")).unwrap();
        let s = HostSecrets::new(Some(&format!("{}/elsewhere/.netrc", base.display())), Some(&home), &[&home]);
        assert!(s.masks_under(&base, &[&home]).iter().all(|m| !m.path.starts_with(&home)));
    }

    #[test]
    fn a_secret_that_may_appear_is_watched_where_it_would() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(home.join(".config")).unwrap();
        fs::create_dir_all(home.join("proj")).unwrap();
        let s = HostSecrets::new(Some(&format!("{}/proj/.vault", home.display())), Some(&home), &[]);
        let points = s.watch_points(&[&home], &[&home.join("proj")]);
        let has = |dir: &Path, leaf: &str| points.contains(&WatchPoint { dir: dir.to_path_buf(), leaf: leaf.into() });
        assert!(has(&home, ".aws"), "{points:?}");
        assert!(has(&home.join(".config"), "gh"));
        // ~/.cargo does not exist: its creation is watched for.
        assert!(has(&home, ".cargo"));
        assert!(!points.iter().any(|p| p.dir.starts_with(home.join("proj"))), "not in a tree the sandbox writes");
        assert!(s.watch_points(&[&home.join("proj")], &[]).iter().all(|p| p.dir.starts_with(home.join("proj"))));
    }

    #[tokio::test]
    async fn the_watch_reports_a_secret_that_appears() {
        let t = tempfile::tempdir_in("/var/tmp").unwrap();
        let home = fs::canonicalize(t.path()).unwrap();
        let s = HostSecrets::new(None, Some(&home), &[]);
        let points = s.watch_points(&[&home], &[]);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (_stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(watch(points, move |p| drop(tx.send(p)), stopped));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        fs::write(home.join("notes.txt"), "not a secret").unwrap();
        fs::write(home.join(".netrc"), "machine x").unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.unwrap().unwrap();
        assert_eq!(seen, home.join(".netrc"));
        task.await.unwrap();
    }

    #[test]
    fn a_grant_at_or_under_a_secret_is_covered() {
        let s = HostSecrets::new(None, Some(Path::new("/nonexistent-home")), &[]);
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
        let s = HostSecrets::new(Some(&extra), Some(&home), &[]);
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
