//! Secret masks: which project entries look like secrets, and what hides
//! them.
//!
//! At every sandbox start, in every permission mode, the project walk of
//! `protected` (one walk, bounded by entries and depth, see `scan`) also
//! finds the entries whose names match the secret patterns. Each one is
//! hidden under an empty read-only file or directory of the session's own
//! (`MaskSources`), bound over it from an fd: the sandbox, its
//! subprocesses included, sees the name and no content, and cannot write
//! it. The worker gets the masked sandbox paths so that its read hook can
//! report a read of one as a secret (a `permission_needed` result). The
//! other names of a masked file (hard links, by device and inode) are
//! masked too. A secret that appears while the sandbox runs stops it: see
//! `protected::SecretWatch`.
//!
//! What is not masked, by rule: entries inside dependency trees (`scan`'s
//! `DEPENDENCY_DIRS`: their test keys are not the user's secrets) and
//! inside protected directories (`.git`, `.vscode`, ...), which the walk
//! does not enter; granted read roots outside the project (never walked);
//! entries past the walk's bound (the start says so); and secrets at or
//! under a path of `MountConfig::unmasked` (in `permissions`) (what the
//! user allowed). This module decides; `protected` walks and opens,
//! `launch` mounts.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;

use crate::beneath::Kind;
use crate::scan::{Limits, Summary, ENTRIES_ENV};

/// Replaces [`DEFAULT_SECRETS`]: a colon-separated list of name patterns
/// (`*` and `?` as in a shell; a trailing `/` matches directories only; a
/// leading `!` makes an exception). Empty: nothing is masked.
pub const SECRETS_ENV: &str = "PI_SANDBOX_SECRETS";

/// The setting that names what masks sandbox path `path`: the project's
/// secret patterns under `/workspace`, the host-secret list elsewhere (a
/// granted tree).
pub fn env_of(path: &str) -> &'static str {
    if path == crate::bwrap::WORKSPACE || path.starts_with("/workspace/") {
        SECRETS_ENV
    } else {
        crate::hostsecrets::HOST_SECRETS_ENV
    }
}

/// The default patterns, matched against entry names at any depth.
pub const DEFAULT_SECRETS: &[&str] = &[
    ".env",
    ".env.*",
    "!.env.example",
    "!.env.sample",
    "!.env.template",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.keystore",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    ".netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    "credentials*.json",
    "secrets/",
    ".secrets/",
];

/// The most bytes of mask paths told to the worker (on its command line).
pub const MAX_WORKER_PATHS_BYTES: usize = 64 << 10;

/// Most masks one sandbox gets (each is a mount and an fd at start).
pub const MAX_MASKS: usize = 1024;

/// One pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Glob {
    pattern: String,
    dirs_only: bool,
    exception: bool,
}

/// The secret patterns in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRules {
    globs: Vec<Glob>,
}

impl SecretRules {
    /// `override_list` (from the environment) or the default. Entries
    /// holding a `/` other than a trailing one are dropped: patterns are
    /// names.
    pub fn new(override_list: Option<&str>) -> SecretRules {
        let list: Vec<&str> = match override_list {
            Some(l) => l.split(':').map(str::trim).filter(|s| !s.is_empty()).collect(),
            None => DEFAULT_SECRETS.to_vec(),
        };
        let mut globs = Vec::new();
        for entry in list {
            let (exception, rest) = match entry.strip_prefix('!') {
                Some(r) => (true, r),
                None => (false, entry),
            };
            let (dirs_only, name) = match rest.strip_suffix('/') {
                Some(n) => (true, n),
                None => (false, rest),
            };
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                continue;
            }
            let g = Glob { pattern: name.to_string(), dirs_only, exception };
            if !globs.contains(&g) {
                globs.push(g);
            }
        }
        SecretRules { globs }
    }

    /// Masking is off (the setting is empty).
    pub fn is_empty(&self) -> bool {
        !self.globs.iter().any(|g| !g.exception)
    }

    /// Whether an entry `name` of `kind` looks like a secret. A link is
    /// judged by its name as a file would be (its target is masked).
    pub fn matches(&self, name: &OsStr, kind: Kind) -> bool {
        // By bytes: a name that is not UTF-8 is a name all the same.
        let name = std::os::unix::ffi::OsStrExt::as_bytes(name);
        // A protected name the guard made inert (`.npmrc.pi-inert-2`) is
        // still what it was: the rename does not unmask it.
        let names = [Some(name), inert_base(name)];
        let applies = |g: &&Glob| !g.dirs_only || kind == Kind::Dir;
        names.into_iter().flatten().any(|name| {
            let hit = |g: &&Glob| glob_match(g.pattern.as_bytes(), name);
            let mut globs = self.globs.iter().filter(applies);
            let wanted = globs.clone().any(|g| !g.exception && hit(&g));
            wanted && !globs.any(|g| g.exception && hit(&g))
        })
    }

    /// The patterns as the user would write them (for `status`).
    pub fn describe(&self) -> Vec<String> {
        self.globs
            .iter()
            .map(|g| {
                format!("{}{}{}", if g.exception { "!" } else { "" }, g.pattern, if g.dirs_only { "/" } else { "" })
            })
            .collect()
    }
}

/// The inert name's mark: `NAME.pi-inert`, `NAME.pi-inert-2`, ... (the
/// guard of `protected` renames a protected name so; a secret made inert
/// is still masked as the secret it was).
pub const INERT_MARK: &str = ".pi-inert";

/// The name a protected entry had before the guard made it inert:
/// `NAME` of `NAME.pi-inert` and `NAME.pi-inert-N`.
fn inert_base(name: &[u8]) -> Option<&[u8]> {
    let mark = INERT_MARK.as_bytes();
    let at = name.windows(mark.len()).rposition(|w| w == mark).filter(|&at| at > 0)?;
    let rest = &name[at + mark.len()..];
    let numbered = rest.first() == Some(&b'-') && rest.len() > 1 && rest[1..].iter().all(u8::is_ascii_digit);
    (rest.is_empty() || numbered).then(|| &name[..at])
}

/// Shell-style matching of a whole name: `*` any run, `?` one byte.
/// ASCII letters match in either case: a key exported elsewhere is
/// `SERVER.PEM` or `ID_RSA` as often as `server.pem`, and a project
/// copied from a case-insensitive file system holds `.ENV` where its
/// tools read `.env`.
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&name[n])) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// A masked entry: where, relative to the project, and whether it is a
/// directory (masked by an empty directory) or not (an empty file).
/// `host`: it is on the host-secret list (`hostsecrets`), which no grant
/// unmasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub rel: PathBuf,
    pub dir: bool,
    pub host: bool,
}

/// Secrets found by a walk, split by the unmask set: `project` is the
/// canonical project directory, `unmasked` canonical host paths; a secret
/// at or under one of them is left readable, unless it is a host secret.
/// Returns (masked, unmasked).
pub fn split(found: &[Mask], project: &Path, unmasked: &[PathBuf]) -> (Vec<Mask>, Vec<Mask>) {
    found.iter().cloned().partition(|m| {
        let host = project.join(&m.rel);
        m.host || !unmasked.iter().any(|u| host.starts_with(u))
    })
}

/// What a grant of a path inside a masked directory opens: exactly that
/// path (relative to the project), never the directory. `masked` is what
/// stays masked (see [`split`]). A path under a host secret is never one;
/// one inside another is covered by it.
pub fn holes(masked: &[Mask], project: &Path, unmasked: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = unmasked
        .iter()
        .filter_map(|u| u.strip_prefix(project).ok())
        .filter(|rel| plain(rel))
        .filter(|rel| masked.iter().any(|m| m.dir && !m.host && rel.starts_with(&m.rel) && *rel != m.rel))
        .filter(|rel| !masked.iter().any(|m| m.host && rel.starts_with(&m.rel)))
        .map(Path::to_path_buf)
        .collect();
    out.sort();
    out.dedup();
    let all = out.clone();
    out.retain(|h| !all.iter().any(|o| o != h && h.starts_with(o)));
    out
}

/// Whether `m` is hidden by a masked directory above it (and so needs no
/// mount of its own): true unless a hole opens the way to it.
pub fn inside_masked_dir(m: &Mask, masked: &[Mask], holes: &[PathBuf]) -> bool {
    masked.iter().any(|d| {
        d.dir
            && m.rel != d.rel
            && m.rel.starts_with(&d.rel)
            && !holes.iter().any(|h| h.starts_with(&d.rel) && h != &d.rel && m.rel.starts_with(h))
    })
}

/// A project-relative path without `..`, `.` or a root.
pub fn plain(rel: &Path) -> bool {
    !rel.as_os_str().is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)))
}

/// What one start masked, for `status`, the first result and the read
/// decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaskReport {
    /// The setting is empty: nothing was looked for.
    pub off: bool,
    /// Masked entries.
    pub masked: Vec<Mask>,
    /// Secrets found but left readable (the unmask set).
    pub unmasked: Vec<Mask>,
    /// Paths inside a masked directory that a grant opened alone
    /// (relative to the project; see [`holes`]).
    pub holes: Vec<PathBuf>,
    /// Entries the walk read, and whether it read everything in bounds.
    pub entries: usize,
    pub complete: bool,
    pub limits: Option<Limits>,
    /// The (device, inode) of the masked files, for later starts (see
    /// `protected::Known`).
    pub idents: Vec<(u64, u64)>,
}

impl MaskReport {
    pub fn new(found: &[Mask], project: &Path, unmasked: &[PathBuf], summary: &Summary, limits: Limits) -> Self {
        let (masked, left) = split(found, project, unmasked);
        let holes = holes(&masked, project, unmasked);
        let masked = masked.iter().filter(|m| !inside_masked_dir(m, &masked, &holes)).cloned().collect();
        MaskReport {
            off: false,
            masked,
            unmasked: left,
            holes,
            entries: summary.entries,
            complete: summary.complete,
            limits: Some(limits),
            idents: Vec::new(),
        }
    }

    /// The sandbox paths of the masks (under `/workspace`).
    pub fn sandbox_paths(&self) -> Vec<String> {
        self.masked.iter().map(|m| Path::new(crate::bwrap::WORKSPACE).join(&m.rel).display().to_string()).collect()
    }

    /// The masks' sandbox paths for the worker's read hook, within
    /// [`MAX_WORKER_PATHS_BYTES`] (one left out is still masked; its read
    /// is just not named a secret).
    /// A directory with a hole is left out (the hook would name a read of
    /// the opened path a secret's).
    pub fn worker_paths(&self) -> Vec<String> {
        let mut used = 0;
        self.masked
            .iter()
            .filter(|m| !self.holes.iter().any(|h| h.starts_with(&m.rel)))
            .map(|m| Path::new(crate::bwrap::WORKSPACE).join(&m.rel).display().to_string())
            .take_while(|p| {
                used += p.len() + 4;
                used <= MAX_WORKER_PATHS_BYTES
            })
            .collect()
    }

    /// Whether sandbox path `path` is a masked entry or inside one.
    pub fn hides(&self, path: &Path) -> bool {
        self.covering(path).is_some()
    }

    /// The mask that hides sandbox path `path` (the entry itself, or the
    /// masked directory it is in).
    pub fn covering(&self, path: &Path) -> Option<&Mask> {
        let rel = path.strip_prefix(crate::bwrap::WORKSPACE).ok()?;
        let opened = |m: &Mask| self.holes.iter().any(|h| h.starts_with(&m.rel) && h != &m.rel && rel.starts_with(h));
        self.masked.iter().find(|m| rel.starts_with(&m.rel) && !opened(m))
    }

    /// Every secret found, as canonical host paths (masked or not): what a
    /// grant inside the project can unmask (a host secret never).
    pub fn host_paths(&self, project: &Path) -> Vec<PathBuf> {
        self.masked.iter().chain(&self.unmasked).filter(|m| !m.host).map(|m| project.join(&m.rel)).collect()
    }

    /// The note for an incomplete walk, if it was one.
    pub fn incomplete_note(&self) -> Option<String> {
        if self.off || self.complete {
            return None;
        }
        let limits = self.limits.unwrap_or(crate::scan::DEFAULT_LIMITS);
        Some(format!(
            "The secret scan was incomplete: it stopped after {} (bounds: {} entries, depth {}), so \
             secrets past that point are NOT masked; {} were masked. Raise {ENTRIES_ENV} (or {}) to scan further.",
            crate::display::count(self.entries, "entry", "entries"),
            limits.max_entries,
            limits.max_depth,
            self.masked.len(),
            crate::scan::DEPTH_ENV
        ))
    }

    /// One line for `status`.
    pub fn describe(&self) -> String {
        if self.off {
            return format!("secret masks: off ({SECRETS_ENV} is empty)");
        }
        let list: Vec<String> = self.sandbox_paths().iter().map(|p| crate::display::one_line(p).to_string()).collect();
        let mut line = if list.is_empty() {
            "secret masks (every mode): none found".to_string()
        } else {
            format!("secret masks (every mode, shown empty): {}", list.join(", "))
        };
        if !self.unmasked.is_empty() {
            let shown: Vec<String> = self
                .unmasked
                .iter()
                .map(|m| crate::display::one_line(&Path::new(crate::bwrap::WORKSPACE).join(&m.rel)).to_string())
                .collect();
            line.push_str(&format!("; unmasked by a grant: {}", shown.join(", ")));
        }
        match self.incomplete_note() {
            Some(n) => line.push_str(&format!("; {n}")),
            None => line.push_str(&format!(
                "; the scan read {}, all of the project",
                crate::display::count(self.entries, "entry", "entries")
            )),
        }
        line
    }
}

/// The session's empty file and directory that masks are bound from
/// (under its private directory, which the sandbox never sees).
#[derive(Debug, Clone)]
pub struct MaskSources {
    pub file: PathBuf,
    pub dir: PathBuf,
}

impl MaskSources {
    /// Made in `root` when missing (empty). Owner-writable on purpose: the
    /// binds are read-only, and a write from the sandbox then fails with
    /// EROFS, as on any read-only path, not with EACCES.
    pub fn in_dir(root: &Path) -> std::io::Result<MaskSources> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        let sources = MaskSources { file: root.join("mask-file"), dir: root.join("mask-dir") };
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&sources.file) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&sources.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Kept empty whatever happened before.
        let meta = std::fs::symlink_metadata(&sources.file)?;
        if !meta.is_file() || meta.len() != 0 {
            return Err(std::io::Error::other(format!("{} is not an empty file", sources.file.display())));
        }
        std::fs::set_permissions(&sources.dir, std::fs::Permissions::from_mode(0o700))?;
        if std::fs::read_dir(&sources.dir)?.next().is_some() {
            return Err(std::io::Error::other(format!("{} is not an empty directory", sources.dir.display())));
        }
        Ok(sources)
    }

    /// An fd to bind a masked directory from that holds just `holes`
    /// (relative paths, and whether each is a directory), empty: the
    /// mount points of the paths a grant opened alone. Made fresh in the
    /// session's private directory, which the sandbox never sees.
    pub fn shaped(&self, holes: &[(PathBuf, bool)]) -> std::io::Result<OwnedFd> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let root = self.dir.parent().unwrap_or(&self.dir);
        let shape = root.join(format!("mask-shape-{:x}", crate::random::random_u64()));
        std::fs::DirBuilder::new().mode(0o700).create(&shape)?;
        for (rel, dir) in holes {
            if !plain(rel) {
                return Err(std::io::Error::other(format!("not a plain relative path: {}", rel.display())));
            }
            let at = shape.join(rel);
            if let Some(parent) = at.parent() {
                std::fs::DirBuilder::new().mode(0o700).recursive(true).create(parent)?;
            }
            if *dir {
                std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&at)?;
            } else {
                std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&at)?;
            }
        }
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        nix::fcntl::open(shape.as_path(), flags, nix::sys::stat::Mode::empty()).map_err(std::io::Error::from)
    }

    /// An fd to bind one mask from.
    pub fn open(&self, dir: bool) -> std::io::Result<OwnedFd> {
        let (path, flags) = if dir {
            (&self.dir, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        } else {
            (&self.file, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        };
        nix::fcntl::open(path.as_path(), flags, nix::sys::stat::Mode::empty()).map_err(std::io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(rules: &SecretRules, list: &[(&str, Kind)]) -> Vec<String> {
        list.iter().filter(|(n, k)| rules.matches(OsStr::new(n), *k)).map(|(n, _)| n.to_string()).collect()
    }

    #[test]
    fn a_secret_the_guard_made_inert_is_still_a_secret() {
        let r = SecretRules::new(None);
        let f = Kind::File;
        let all = [
            (".npmrc.pi-inert", f),
            (".npmrc.pi-inert-2", f),
            (".env.pi-inert-17", f),
            (".npmrc.pi-inert-", f),
            (".npmrc.pi-inert-x", f),
            (".pi-inert", f),
            ("notes.pi-inert", f),
            ("README.md.pi-inert", f),
        ];
        assert_eq!(names(&r, &all), [".npmrc.pi-inert", ".npmrc.pi-inert-2", ".env.pi-inert-17"]);
    }

    #[test]
    fn the_default_patterns_match_secrets_and_leave_examples() {
        let r = SecretRules::new(None);
        let f = Kind::File;
        let all = [
            (".env", f),
            (".env.production", f),
            (".env.local", f),
            (".env.example", f),
            (".env.sample", f),
            (".env.template", f),
            ("env", f),
            ("my.env", f),
            ("server.pem", f),
            ("tls.key", f),
            ("keyboard.py", f),
            ("cert.p12", f),
            ("cert.pfx", f),
            ("release.keystore", f),
            ("id_rsa", f),
            ("id_rsa.pub", f),
            ("id_ed25519", f),
            ("id_ecdsa_sk", f),
            (".netrc", f),
            (".pgpass", f),
            (".npmrc", f),
            (".pypirc", f),
            ("credentials.json", f),
            ("credentials-prod.json", f),
            ("credentials.yaml", f),
            ("secrets", Kind::Dir),
            ("secrets", f),
            (".secrets", Kind::Dir),
            ("secret", Kind::Dir),
            (".env", Kind::Link),
            (".ENV", f),
            (".Env.Local", f),
            (".ENV.EXAMPLE", f),
            ("SERVER.PEM", f),
            ("ID_RSA", f),
            ("Secrets", Kind::Dir),
        ];
        assert_eq!(
            names(&r, &all),
            [
                ".env",
                ".env.production",
                ".env.local",
                "server.pem",
                "tls.key",
                "cert.p12",
                "cert.pfx",
                "release.keystore",
                "id_rsa",
                "id_rsa.pub",
                "id_ed25519",
                "id_ecdsa_sk",
                ".netrc",
                ".pgpass",
                ".npmrc",
                ".pypirc",
                "credentials.json",
                "credentials-prod.json",
                "secrets",
                ".secrets",
                ".env",
                ".ENV",
                ".Env.Local",
                "SERVER.PEM",
                "ID_RSA",
                "Secrets",
            ]
        );
        assert!(!r.is_empty());
    }

    #[test]
    fn the_setting_replaces_the_list_and_empty_turns_masking_off() {
        let r = SecretRules::new(Some(" *.sqlite : vault/ :!keep.sqlite: a/b :: ../x"));
        assert_eq!(r.describe(), ["*.sqlite", "vault/", "!keep.sqlite"]);
        let f = Kind::File;
        assert_eq!(
            names(&r, &[("db.sqlite", f), ("keep.sqlite", f), ("vault", Kind::Dir), ("vault", f), (".env", f)]),
            ["db.sqlite", "vault"]
        );
        assert!(SecretRules::new(Some("")).is_empty());
        assert!(SecretRules::new(Some("!only-an-exception")).is_empty());
        assert!(!SecretRules::new(Some("")).matches(OsStr::new(".env"), f));
    }

    #[test]
    fn globs() {
        for (p, n, m) in [
            ("*", "", true),
            ("*.pem", ".pem", true),
            ("*.pem", "a.pem.bak", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("id_rsa*", "id_rsa", true),
            ("?x", "ax", true),
            ("?x", "x", false),
            ("**", "abc", true),
            ("*.pem", "SERVER.PEM", true),
            (".env", ".Env", true),
            ("id_rsa*", "ID_RSA.pub", true),
            ("?x", "aX", true),
            // Only ASCII letters fold: other bytes match themselves alone.
            ("\u{e4}.key", "\u{c4}.key", false),
            ("a_b", "a-b", false),
        ] {
            assert_eq!(glob_match(p.as_bytes(), n.as_bytes()), m, "{p} ~ {n}");
        }
    }

    #[test]
    fn the_unmask_set_leaves_exactly_what_it_covers() {
        let project = Path::new("/home/u/proj");
        let m = |rel: &str, dir| Mask { rel: rel.into(), dir, host: false };
        let found =
            [m(".env", false), m("sub/.env.production", false), m("sub/deploy/key.pem", false), m("secrets", true)];
        let (masked, left) = split(&found, project, &[PathBuf::from("/home/u/proj/.env")]);
        assert_eq!(left, [m(".env", false)]);
        assert_eq!(masked.len(), 3);
        let (masked, left) = split(&found, project, &[PathBuf::from("/home/u/proj/sub")]);
        assert_eq!(masked, [m(".env", false), m("secrets", true)]);
        assert_eq!(left.len(), 2);
        // A sibling with a common prefix is not under it; a path inside a
        // masked directory unmasks nothing of it (the mask is whole).
        let (masked, _) =
            split(&found, project, &[PathBuf::from("/home/u/proj/su"), PathBuf::from("/home/u/proj/secrets/a")]);
        assert_eq!(masked.len(), 4);
        let (masked, left) = split(&found, project, &[PathBuf::from("/home/u/proj")]);
        assert!(masked.is_empty() && left.len() == 4);
    }

    #[test]
    fn the_report_names_masks_and_an_incomplete_scan() {
        let project = Path::new("/p");
        let found = [
            Mask { rel: ".env".into(), dir: false, host: false },
            Mask { rel: "s/secrets".into(), dir: true, host: false },
        ];
        let summary = Summary { entries: 7, complete: false, ..Summary::default() };
        let r = MaskReport::new(&found, project, &[], &summary, Limits { max_entries: 7, max_depth: 24 });
        assert_eq!(r.sandbox_paths(), ["/workspace/.env", "/workspace/s/secrets"]);
        assert!(r.hides(Path::new("/workspace/s/secrets/x")) && r.hides(Path::new("/workspace/.env")));
        assert!(!r.hides(Path::new("/workspace/.env.example")) && !r.hides(Path::new("/scratch/.env")));
        let note = r.incomplete_note().expect("incomplete");
        assert!(note.contains("stopped after 7 entries") && note.contains(ENTRIES_ENV), "{note}");
        assert!(r.describe().contains("/workspace/.env, /workspace/s/secrets"), "{}", r.describe());
        let done = MaskReport { complete: true, ..r };
        assert_eq!(done.incomplete_note(), None);
        assert!(done.describe().ends_with("the scan read 7 entries, all of the project"), "{}", done.describe());
        let one = MaskReport { entries: 1, ..done };
        assert!(one.describe().ends_with("the scan read 1 entry, all of the project"), "{}", one.describe());
    }
}
