//! What git on the host would execute from a project, found by reading
//! git's configuration files directly (git itself is never run on the host
//! in the project: its fsmonitor would run).
//!
//! Given the repositories a project scan found (`.git` directories and
//! files), [`git_paths`] reads what git would: the system's and the user's
//! configuration (chosen from git's environment, [`HostGit::from_vars`]),
//! each repository's git directory, common directory and configuration,
//! the repository the project is inside of, and every file any of these
//! include, as git's parser and include rules read them. It returns the
//! paths inside the project that git treats as code or configuration (a
//! gitdir or common directory inside the project, `core.hooksPath`
//! targets, included files, whether they exist yet or not), and refusals:
//! what git would trust that cannot be kept read-only, such as a gitdir in
//! a directory the sandbox can write, or a FIFO named as an include.
//!
//! Files inside the project are read through [`Tree`], never following a
//! link; the user's own files outside it are read by path, following
//! links (dotfile managers use them), opened without blocking. Keeping the
//! paths read-only, and deciding what a refusal means, is `protected`'s
//! business. git's conditions (`includeIf`) and discovery ceilings are
//! deliberately not evaluated: every path git might use under some
//! condition counts. Not read at all: settings given in git's environment
//! or command line (`GIT_CONFIG_COUNT`, `GIT_CONFIG_PARAMETERS`, `-c`),
//! `GIT_DIR`/`GIT_WORK_TREE`, and `core.worktree`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};

use crate::beneath::{self, Kind, Tree};

mod copy;
pub use copy::{sandbox_copy, write_sandbox_copy, SANDBOX_PATH as SANDBOX_COPY_PATH};
mod host;
pub use host::HostGit;
mod parse;
use parse::gitfile_target;
pub use parse::{git_config_paths, ConfigPaths};

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

/// Largest configuration file read; a larger one git would read is refused.
const CONFIG_MAX: u64 = 1 << 20;
/// Largest `.git` file or `commondir` read (a path and a newline).
const GITFILE_MAX: u64 = 8192;
/// git's `MAX_INCLUDE_DEPTH`: git refuses to start with configuration
/// included deeper, so nothing deeper can take effect.
const MAX_INCLUDE_DEPTH: usize = 10;
/// Configuration files followed from one starting set (a repository's, or
/// the user's and the system's); git has no such bound, so more is refused.
const MAX_FILES: usize = 100;
/// Distinct hooks paths taken from one starting set; more is refused.
const MAX_HOOKS: usize = 64;
/// Links followed resolving one host path (the kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// What git on the host would use from a project.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitPaths {
    /// Paths inside the project, relative to it, that git would run or
    /// read as configuration, whether they exist yet or not.
    pub wanted: Vec<PathBuf>,
    /// What git would trust that cannot be kept read-only: each says what
    /// and why. A writable mode is not safe while one is reported.
    pub refused: Vec<String>,
}

/// The paths inside the project (relative) that git on the host would run
/// or read as configuration, for the repositories in `found` (entries
/// named `.git`): [`git_paths`]`.wanted`.
pub fn protected_paths(project: &Path, tree: &Tree, found: &[(PathBuf, Kind)], git: &HostGit) -> Vec<PathBuf> {
    git_paths(project, tree, found, git).wanted
}

/// Why the project cannot be protected, from the same reading as
/// [`protected_paths`]: [`git_paths`]`.refused`. A caller that gets any
/// should not make the project writable (and may show them).
pub fn refusals(project: &Path, tree: &Tree, found: &[(PathBuf, Kind)], git: &HostGit) -> Vec<String> {
    git_paths(project, tree, found, git).refused
}

/// Read what git on the host would use from `project` (its canonical
/// path, open as `tree`): the user's and the system's configuration and
/// every file it includes; each repository in `found` with its git
/// directory, common directory, configuration and includes; and the hooks
/// paths all of these name, resolved against each repository.
pub fn git_paths(project: &Path, tree: &Tree, found: &[(PathBuf, Kind)], git: &HostGit) -> GitPaths {
    let mut r = Reader::new(project, tree, git, found);
    let user: Vec<Root> = git
        .configs
        .iter()
        .map(|c| Root::new(Path::new("/"), c, "the user's or the system's git configuration".to_string()))
        .collect();
    let user_hooks = r.chain(user);
    // An absolute hooks path applies to every repository on the host, a
    // relative one to each repository git runs in.
    for hooks in user_hooks.iter().filter(|h| h.is_absolute()) {
        r.hooks_path(Path::new("/"), hooks);
    }
    let mut repos = Vec::new();
    for (rel, kind) in found {
        if rel.file_name() != Some(OsStr::new(".git")) {
            continue;
        }
        let worktree = project.join(rel.parent().unwrap_or(Path::new("")));
        repos.push(Repo { gitdir: r.gitdir(&worktree, *kind), worktree });
    }
    // The repository the project is inside of (pi run in repo/sub): git
    // run in the project, or in the repository above it, uses its
    // configuration and runs its hooks, which may be in the project.
    repos.extend(r.enclosing());
    for repo in &repos {
        let mut hooks = user_hooks.clone();
        if let Some(gitdir) = &repo.gitdir {
            let roots = r.repo_configs(gitdir);
            hooks.extend(r.chain(roots));
        }
        for h in &hooks {
            r.hooks_path(&repo.worktree, h);
            // In a bare repository a relative hooks path is taken from the
            // git directory: keep both.
            if let Some(gitdir) = repo.gitdir.as_ref().filter(|_| h.is_relative()) {
                r.hooks_path(gitdir, h);
            }
        }
    }
    r.out.wanted = outermost(std::mem::take(&mut r.out.wanted));
    r.out
}

/// `paths` without those inside another of them (kept read-only with it).
fn outermost(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    // Sorted by component, a path's descendants follow it directly.
    paths.sort();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        if !out.last().is_some_and(|last| p.starts_with(last)) {
            out.push(p);
        }
    }
    out
}

/// A configuration file to start reading from: `value` from the directory
/// `base` (see [`Reader::locate`]), and why git reads it.
struct Root {
    base: PathBuf,
    value: PathBuf,
    why: String,
}

impl Root {
    fn new(base: &Path, value: &Path, why: String) -> Root {
        Root { base: base.to_path_buf(), value: value.to_path_buf(), why }
    }
}

/// A repository: its worktree root and, when it can be trusted, its git
/// directory (both as git names them, absolute).
struct Repo {
    worktree: PathBuf,
    gitdir: Option<PathBuf>,
}

/// Where a path git opens lands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Place {
    /// Inside the project, relative to it (empty: the project itself).
    Inside(PathBuf),
    /// On the host, outside the project, with every link resolved.
    Host(PathBuf),
    /// Inside `root`, a host directory the sandbox can write.
    Untrusted { path: PathBuf, root: PathBuf },
}

/// A component of a path being resolved.
enum Part {
    Root,
    Up,
    Name(OsString),
}

/// The components of `path`, each with `loose`: whether the sandbox could
/// make it a link before git resolves it (it comes from a configuration
/// value or a link target, not from a directory already held, a worktree
/// or the directory of a file read).
fn parts(path: &Path, loose: bool) -> impl Iterator<Item = (Part, bool)> + '_ {
    path.components().filter_map(move |c| match c {
        Component::RootDir => Some((Part::Root, loose)),
        Component::ParentDir => Some((Part::Up, loose)),
        Component::Normal(n) => Some((Part::Name(n.to_os_string()), loose)),
        Component::CurDir | Component::Prefix(_) => None,
    })
}

struct Reader<'a> {
    project: &'a Path,
    tree: &'a Tree,
    git: &'a HostGit,
    /// The protected names found: the plan keeps each whole (read-only, or
    /// a link put back when replaced), so nothing below one is wanted.
    covered: &'a [(PathBuf, Kind)],
    /// [`HostGit::untrusted`], resolved.
    untrusted: Vec<PathBuf>,
    /// Parsed configuration files, by where they are.
    parsed: HashMap<Place, Option<ConfigPaths>>,
    seen: HashSet<PathBuf>,
    out: GitPaths,
}

impl<'a> Reader<'a> {
    fn new(project: &'a Path, tree: &'a Tree, git: &'a HostGit, covered: &'a [(PathBuf, Kind)]) -> Reader<'a> {
        // Resolved as `locate` resolves host paths; one that does not exist
        // yet from its parent.
        let resolve = |p: &PathBuf| {
            std::fs::canonicalize(p)
                .or_else(|e| match (p.parent().map(std::fs::canonicalize), p.file_name()) {
                    (Some(Ok(parent)), Some(name)) => Ok(parent.join(name)),
                    _ => Err(e),
                })
                .unwrap_or_else(|_| p.clone())
        };
        let untrusted = git.untrusted.iter().filter(|u| u.is_absolute()).map(resolve).collect();
        Reader {
            project,
            tree,
            git,
            covered,
            untrusted,
            parsed: HashMap::new(),
            seen: HashSet::new(),
            out: GitPaths::default(),
        }
    }

    fn refuse(&mut self, why: String) {
        if !self.out.refused.contains(&why) {
            self.out.refused.push(why);
        }
    }

    /// Keep `rel` read-only: git would use it as `why`.
    fn want(&mut self, rel: &Path, why: &str) {
        if rel.as_os_str().is_empty() {
            self.refuse(format!("git on the host would use the whole project as {why}"));
            return;
        }
        if self.covered.iter().any(|(c, _)| rel.starts_with(c)) {
            return;
        }
        if let Err(e) = self.tree.lstat(rel) {
            self.refuse(format!("{} ({why}) cannot be kept read-only: {e}", rel.display()));
        }
        if self.seen.insert(rel.to_path_buf()) {
            self.out.wanted.push(rel.to_path_buf());
        }
    }

    /// Where git lands opening `value` from the directory `base` (an
    /// absolute path as git names it). Outside the project every link is
    /// followed, as the kernel would: those are the user's, out of the
    /// sandbox's reach, and one may lead into the project. Inside the
    /// project nothing is followed (a link there fails to protect, see
    /// [`Reader::want`]); a directory that `value` names before a `..` is
    /// kept read-only too, or the sandbox could make it a link and move
    /// where the `..` lands.
    fn locate(&mut self, base: &Path, value: &Path) -> Place {
        let mut todo: VecDeque<(Part, bool)> = parts(base, false).chain(parts(value, true)).collect();
        let mut host = PathBuf::from("/");
        let mut inside: Option<Vec<(OsString, bool)>> = None;
        let mut links = 0;
        while let Some((part, loose)) = todo.pop_front() {
            match (part, inside.as_mut()) {
                (Part::Root, _) => {
                    host = PathBuf::from("/");
                    inside = None;
                }
                (Part::Up, Some(rel)) => {
                    let at: PathBuf = rel.iter().map(|(n, _)| n).collect();
                    match rel.pop() {
                        Some((_, true)) => self.want(&at, "a directory a git path leads through with `..`"),
                        Some((_, false)) => {}
                        None => {
                            inside = None;
                            host = self.project.parent().unwrap_or(Path::new("/")).to_path_buf();
                        }
                    }
                }
                (Part::Up, None) => {
                    host.pop();
                }
                (Part::Name(n), Some(rel)) => rel.push((n, loose)),
                (Part::Name(n), None) => {
                    let next = host.join(&n);
                    if let Some(root) = self.untrusted.iter().find(|u| next.starts_with(u)) {
                        return Place::Untrusted { path: next, root: root.clone() };
                    }
                    if next == self.project {
                        inside = Some(Vec::new());
                        continue;
                    }
                    match std::fs::symlink_metadata(&next) {
                        Ok(m) if m.file_type().is_symlink() && links < MAX_LINKS => {
                            links += 1;
                            if let Ok(target) = std::fs::read_link(&next) {
                                for p in parts(&target, true).collect::<Vec<_>>().into_iter().rev() {
                                    todo.push_front(p);
                                }
                            }
                        }
                        _ => host = next,
                    }
                }
            }
        }
        match inside {
            Some(rel) => Place::Inside(rel.into_iter().map(|(n, _)| n).collect()),
            None => Place::Host(host),
        }
    }

    /// A configuration value naming a path, as git expands it (`~/`, `~`
    /// and `~user/`); `None` for one that names nothing here: empty, or a
    /// home that is not known, or `%(prefix)/` (git's install prefix, not
    /// the project).
    fn expand(&self, value: &Path) -> Option<PathBuf> {
        let bytes = value.as_os_str().as_bytes();
        if bytes.is_empty() || bytes.starts_with(b"%(prefix)/") {
            return None;
        }
        let Some(rest) = bytes.strip_prefix(b"~") else { return Some(value.to_path_buf()) };
        let (user, rest) = match rest.iter().position(|&b| b == b'/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let home = match user {
            [] => self.git.home.clone()?,
            name => (self.git.user_home?)(OsStr::from_bytes(name))?,
        };
        Some(home.join(OsStr::from_bytes(rest)))
    }

    /// A file git would read, bounded; `None` when git would find nothing
    /// there (missing, a directory, not readable); refused when git would
    /// read something this cannot check (a FIFO, a device, a link inside
    /// the project, a file over `max`).
    fn read(&mut self, name: &Path, place: &Place, why: &str, max: u64) -> Option<Vec<u8>> {
        let opened = match place {
            Place::Inside(rel) if rel.as_os_str().is_empty() => return None,
            Place::Inside(rel) => self.tree.open_at(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY),
            Place::Host(path) => open_host(path),
            Place::Untrusted { path, root } => {
                let (path, root) = (path.clone(), root.clone());
                self.untrusted_use(name, &path, &root, why);
                return None;
            }
        };
        match opened.and_then(|fd| read_config_fd(fd, max)) {
            Ok(text) => text,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES)) => None,
            Err(e) => {
                self.refuse(format!(
                    "{} ({why}): git on the host would read it, but it cannot be checked ({e}); make it a regular \
                     file of at most {max} bytes, or remove it",
                    name.display()
                ));
                None
            }
        }
    }

    /// The hooks paths of the configuration files `roots` (each with why
    /// git reads it) and of every file they include, followed as git does:
    /// an include relative to the directory of the file that names it,
    /// every `includeIf` whatever its condition, at most
    /// [`MAX_INCLUDE_DEPTH`] deep. A file inside the project is read
    /// through the tree and kept read-only, whether it exists or not.
    fn chain(&mut self, roots: Vec<Root>) -> Vec<PathBuf> {
        let mut hooks: HashSet<PathBuf> = HashSet::new();
        let mut queue: VecDeque<(PathBuf, Place, String, usize)> = VecDeque::new();
        for root in roots {
            let place = self.locate(&root.base, &root.value);
            queue.push_back((root.base.join(&root.value), place, root.why, 0));
        }
        let mut seen = HashSet::new();
        while let Some((name, place, why, depth)) = queue.pop_front() {
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Place::Inside(rel) = &place {
                self.want(rel, &why);
            }
            let paths = match self.parsed.get(&place) {
                Some(p) => p.clone(),
                None => {
                    let p = self.read(&name, &place, &why, CONFIG_MAX).map(|text| git_config_paths(&text));
                    self.parsed.insert(place.clone(), p.clone());
                    p
                }
            };
            let Some(paths) = paths else { continue };
            for h in paths.hooks.iter().filter_map(|h| self.expand(h)) {
                if hooks.len() == MAX_HOOKS && !hooks.contains(&h) {
                    self.refuse(format!(
                        "{} names more than {MAX_HOOKS} hooks paths with what it includes: the rest cannot be kept \
                         read-only",
                        name.display()
                    ));
                    return hooks.into_iter().collect();
                }
                hooks.insert(h);
            }
            if depth == MAX_INCLUDE_DEPTH {
                continue;
            }
            let dir = name.parent().unwrap_or(Path::new("/")).to_path_buf();
            let includes: Vec<PathBuf> = paths.includes.iter().filter_map(|i| self.expand(i)).collect();
            for inc in includes {
                if seen.len() + queue.len() >= MAX_FILES {
                    self.refuse(format!(
                        "{} includes more than {MAX_FILES} git configuration files: the rest cannot be checked",
                        name.display()
                    ));
                    return hooks.into_iter().collect();
                }
                let place = self.locate(&dir, &inc);
                queue.push_back((dir.join(&inc), place, format!("included by {}", name.display()), depth + 1));
            }
        }
        hooks.into_iter().collect()
    }

    /// The git directory of the repository whose `.git` (of `kind`) is in
    /// `worktree`, as git names it; `None` when there is none to read.
    fn gitdir(&mut self, worktree: &Path, kind: Kind) -> Option<PathBuf> {
        let dotgit = worktree.join(".git");
        match kind {
            Kind::Dir => Some(dotgit),
            Kind::File => {
                let place = self.locate(worktree, Path::new(".git"));
                self.gitfile(worktree, &place)
            }
            // git follows a `.git` link: read where it points, without
            // following it (the plan puts the link back if it is replaced).
            Kind::Link => {
                let rel = dotgit.strip_prefix(self.project).ok()?;
                let target = self.tree.read_link(rel).ok()?;
                let place = self.locate(worktree, &target);
                let kind = self.kind(&place);
                let target = worktree.join(target);
                if !self.trust(&target, place.clone(), &format!("the target of the link {}", dotgit.display())) {
                    return None;
                }
                match kind? {
                    Kind::Dir => Some(target),
                    Kind::File => self.gitfile(worktree, &place),
                    Kind::Link => {
                        self.refuse(format!(
                            "{} is a link to a link inside the project: git follows both, the host does not; \
                             make it a link to the git directory",
                            dotgit.display()
                        ));
                        None
                    }
                    Kind::Other => None,
                }
            }
            Kind::Other => None,
        }
    }

    /// What is at `place`, not following a link; `None` for nothing, or
    /// for what the sandbox can write.
    fn kind(&self, place: &Place) -> Option<Kind> {
        match place {
            Place::Inside(rel) => self.tree.lstat(rel).ok().flatten().map(|st| Kind::of(&st)),
            Place::Host(path) => std::fs::symlink_metadata(path).ok().map(|m| match m.file_type() {
                t if t.is_dir() => Kind::Dir,
                t if t.is_file() => Kind::File,
                t if t.is_symlink() => Kind::Link,
                _ => Kind::Other,
            }),
            Place::Untrusted { .. } => None,
        }
    }

    /// The git directory a `.git` file at `place` names (relative to
    /// `worktree`, the directory git names the file in).
    fn gitfile(&mut self, worktree: &Path, place: &Place) -> Option<PathBuf> {
        let dotgit = worktree.join(".git");
        if !self.trust(&dotgit, place.clone(), "a .git file") {
            return None;
        }
        let text = self.read(&dotgit, place, "a .git file", GITFILE_MAX)?;
        let dir = gitfile_target(&text)?;
        let place = self.locate(worktree, &dir);
        let gitdir = worktree.join(dir);
        self.trust(&gitdir, place, &format!("the git directory named by {}", dotgit.display())).then_some(gitdir)
    }

    /// The first repository above the project, as git's discovery finds
    /// it walking up from the project's parent to `/`: a `.git` directory
    /// holding a `HEAD` (git passes over one without), or a `.git` file.
    /// These directories are outside the sandbox's reach; their `.git` is
    /// located like any other path (a link there may lead into the
    /// project, whose part is then looked at through the tree). git's
    /// ceiling and file-system boundaries are not applied: going further up
    /// only finds more.
    fn enclosing(&mut self) -> Option<Repo> {
        for dir in self.project.ancestors().skip(1) {
            let place = self.locate(dir, Path::new(".git"));
            match self.kind(&place) {
                Some(Kind::Dir) => {
                    let head = self.locate(dir, Path::new(".git/HEAD"));
                    if self.kind(&head).is_none() {
                        continue;
                    }
                    let gitdir = dir.join(".git");
                    let why = "the git directory of the repository the project is in";
                    let gitdir = self.trust(&gitdir, place, why).then_some(gitdir);
                    return Some(Repo { worktree: dir.to_path_buf(), gitdir });
                }
                Some(Kind::File) => {
                    return Some(Repo { worktree: dir.to_path_buf(), gitdir: self.gitdir(dir, Kind::File) })
                }
                Some(Kind::Link | Kind::Other) | None => {}
            }
        }
        None
    }

    /// The configuration files of the git directory `gitdir`: its
    /// `config` and `config.worktree`, and its common directory's `config`
    /// (`commondir`, as in a linked worktree). A common directory inside
    /// the project is kept read-only: git runs its hooks.
    fn repo_configs(&mut self, gitdir: &Path) -> Vec<Root> {
        let why = |f: &str| format!("{f} of the git directory {}", gitdir.display());
        let mut roots = vec![
            Root::new(gitdir, Path::new("config"), why("the configuration")),
            Root::new(gitdir, Path::new("config.worktree"), why("the worktree configuration")),
        ];
        let name = gitdir.join("commondir");
        let place = self.locate(gitdir, Path::new("commondir"));
        if let Some(text) = self.read(&name, &place, &why("the commondir file"), GITFILE_MAX) {
            let mut value = text.as_slice();
            while let Some(v) = value.strip_suffix(b"\n").or_else(|| value.strip_suffix(b"\r")) {
                value = v;
            }
            if !value.is_empty() {
                let common = Path::new(OsStr::from_bytes(value));
                let place = self.locate(gitdir, common);
                let common = gitdir.join(common);
                if self.trust(&common, place, &format!("the common git directory named by {}", name.display())) {
                    let why = format!("the configuration of the common git directory {}", common.display());
                    roots.push(Root::new(&common, Path::new("config"), why));
                }
            }
        }
        roots
    }

    /// Keep the hooks directory `hooks` (relative to `base`) read-only when
    /// it is inside the project.
    fn hooks_path(&mut self, base: &Path, hooks: &Path) {
        let place = self.locate(base, hooks);
        self.trust(&base.join(hooks), place, "the hooks directory of core.hooksPath");
    }

    /// A file or directory git would run or read from (`name`, at
    /// `place`, as `why`): kept read-only when inside the project; false,
    /// and refused, when the sandbox can write it, so that nothing in it is
    /// read.
    fn trust(&mut self, name: &Path, place: Place, why: &str) -> bool {
        match place {
            Place::Inside(rel) => self.want(&rel, why),
            Place::Host(_) => {}
            Place::Untrusted { path, root } => {
                self.untrusted_use(name, &path, &root, why);
                return false;
            }
        }
        true
    }

    /// Refuse: git would trust `name` (at `path`, inside `root`, which the
    /// sandbox can write) as `why`. Whatever it holds could name any hooks
    /// path or command, so it is never read.
    fn untrusted_use(&mut self, name: &Path, path: &Path, root: &Path, why: &str) {
        self.refuse(format!(
            "{} ({why}) is {}, inside {}, which the sandbox can write: git on the host would run what it names; \
             remove what points there before using a writable mode",
            name.display(),
            path.display(),
            root.display()
        ));
    }
}

/// Open a host file for reading by path, following links (the user's own
/// files: dotfile managers link them). `O_NONBLOCK` so that opening a FIFO
/// or a device never waits; `O_NOCTTY` so that a terminal is never taken.
fn open_host(path: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
}

/// The text of an open configuration file: `None` for a directory or
/// `/dev/null` (git reads both as empty), an error for anything else but a
/// regular file.
fn read_config_fd(fd: OwnedFd, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let st = nix::sys::stat::fstat(&fd).map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
    // `GIT_CONFIG_GLOBAL=/dev/null` is common: it reads as empty.
    let null = nix::sys::stat::makedev(1, 3);
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFCHR && st.st_rdev == null {
        return Ok(None);
    }
    match Kind::of(&st) {
        Kind::Dir => Ok(None),
        Kind::File => beneath::read_bounded(fd, max).map(Some),
        Kind::Link | Kind::Other => {
            Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file (a FIFO, socket or device)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| set.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
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
            crate::random::random_u64()
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
        wanted_in(&base.join("project"), git)
    }

    fn wanted_in(project: &Path, git: &HostGit) -> Vec<String> {
        let project = project.to_path_buf();
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

    /// The user's facts for a fake home: only `home/.gitconfig`.
    fn fake_home(home: &Path) -> HostGit {
        HostGit { home: Some(home.to_path_buf()), configs: vec![home.join(".gitconfig")], ..HostGit::default() }
    }

    fn refused(base: &Path, git: &HostGit) -> Vec<String> {
        let project = base.join("project");
        let tree = Tree::open(&project).expect("open");
        refusals(&project, &tree, &[], git)
    }

    #[test]
    fn includes_of_the_users_configuration_are_followed_from_their_own_directory() {
        let t = tmp("incl");
        let (home, project) = (t.0.join("home"), t.0.join("project"));
        write(&project.join(".git/HEAD"), "ref: refs/heads/main\n");
        // Relative to ~ (the directory of the file naming it), not to the
        // project; `~/`; an includeIf whose condition does not hold here.
        write(
            &home.join(".gitconfig"),
            "[include]\n\tpath = inc/extra.gitconfig\n[includeIf \"gitdir:/nowhere/\"]\n\tpath = ~/cond.gitconfig\n",
        );
        write(&home.join("inc/extra.gitconfig"), "[include]\n\tpath = ../deeper.gitconfig\n");
        write(&home.join("deeper.gitconfig"), "[core]\n\thooksPath = from-include\n");
        write(&home.join("cond.gitconfig"), &format!("[include]\n\tpath = {}/shared.gitconfig\n", project.display()));
        // A file inside the project is protected before it exists...
        assert_eq!(wanted(&t.0, &fake_home(&home)), ["from-include", "shared.gitconfig"]);
        // ... and read through the tree once it does.
        write(&project.join("shared.gitconfig"), "[core]\n\thooksPath = ~/../project/from-shared\n");
        assert_eq!(wanted(&t.0, &fake_home(&home)), ["from-include", "from-shared", "shared.gitconfig"]);
        assert!(refused(&t.0, &fake_home(&home)).is_empty());
    }

    #[test]
    fn host_links_are_followed_as_git_follows_them() {
        let t = tmp("links");
        let (home, project) = (t.0.join("home"), t.0.join("project"));
        write(&project.join(".git/HEAD"), "ref: refs/heads/main\n");
        // A dotfile manager's link: git takes a relative include from the
        // directory of the link (~), not of its target.
        write(
            &home.join("dotfiles/gitconfig"),
            "[include]\n\tpath = local.gitconfig\n\tpath = to-project/evil.gitconfig\n",
        );
        std::os::unix::fs::symlink("dotfiles/gitconfig", home.join(".gitconfig")).expect("link");
        write(&home.join("local.gitconfig"), "[core]\n\thooksPath = from-home-dir\n");
        write(&home.join("dotfiles/local.gitconfig"), "[core]\n\thooksPath = from-dotfiles-dir\n");
        // A host link into the project: the include is the project's file.
        std::os::unix::fs::symlink(&project, home.join("to-project")).expect("link");
        assert_eq!(wanted(&t.0, &fake_home(&home)), ["evil.gitconfig", "from-home-dir"]);
    }

    #[test]
    fn a_users_configuration_inside_the_project_is_read_through_the_tree() {
        // pi run in $HOME: ~/.gitconfig is the project's.
        let t = tmp("inhome");
        let project = t.0.join("project");
        write(&project.join(".git/HEAD"), "ref: refs/heads/main\n");
        write(&project.join(".gitconfig"), "[core]\n\thooksPath = ~/hooks\n[include]\n\tpath = .gitconfig.local\n");
        assert_eq!(wanted(&t.0, &fake_home(&project)), [".gitconfig", ".gitconfig.local", "hooks"]);
    }

    #[test]
    fn includes_stop_where_git_stops_and_cycles_end() {
        let t = tmp("depth");
        let home = t.0.join("home");
        write(&t.0.join("project/.git/HEAD"), "ref: refs/heads/main\n");
        for i in 0..13 {
            let name = if i == 0 { ".gitconfig".to_string() } else { format!("f{i}") };
            write(
                &home.join(name),
                &format!("[core]\n\thooksPath = d{i}\n[include]\n\tpath = f{}\n\tpath = .gitconfig\n", i + 1),
            );
        }
        // git reads ten levels of includes and refuses to start past them.
        let expect: Vec<String> = (0..=10).map(|i| format!("d{i}")).collect();
        let mut got = wanted(&t.0, &fake_home(&home));
        got.sort_by_key(|d| d[1..].parse::<u32>().unwrap_or(0));
        assert_eq!(got, expect);
    }

    #[test]
    fn more_hooks_paths_than_the_bound_are_refused() {
        let t = tmp("manyhooks");
        let home = t.0.join("home");
        let text: String = (0..=MAX_HOOKS).map(|i| format!("[core]\n\thooksPath = h{i}\n")).collect();
        write(&home.join(".gitconfig"), &text);
        let got = refused(&t.0, &fake_home(&home));
        assert!(got.len() == 1 && got[0].contains("more than 64 hooks paths"), "{got:?}");
        write(&home.join(".gitconfig"), &text.replace("h64", "h0"));
        assert_eq!(refused(&t.0, &fake_home(&home)), Vec::<String>::new());
    }

    #[test]
    fn a_directory_named_before_dot_dot_is_kept_too() {
        let t = tmp("dotdot");
        let (home, project) = (t.0.join("home"), t.0.join("project"));
        // The sandbox could make `a` a link and move where `..` lands.
        write(&home.join(".gitconfig"), &format!("[include]\n\tpath = {}/a/b/../../x.gitconfig\n", project.display()));
        assert_eq!(wanted(&t.0, &fake_home(&home)), ["a", "x.gitconfig"]);
    }

    #[test]
    fn a_fifo_or_an_oversized_include_is_refused_and_never_hangs() {
        let t = tmp("fifo");
        let home = t.0.join("home");
        // A directory, a missing file and /dev/null read as nothing, as for git.
        write(
            &home.join(".gitconfig"),
            "[include]\n\tpath = fifo\n\tpath = big\n\tpath = dir\n\tpath = missing\n\tpath = /dev/null\n",
        );
        nix::unistd::mkfifo(&home.join("fifo"), Mode::from_bits_truncate(0o600)).expect("mkfifo");
        std::fs::write(home.join("big"), vec![b'#'; CONFIG_MAX as usize + 1]).expect("write");
        std::fs::create_dir(home.join("dir")).expect("mkdir");
        let (tx, rx) = std::sync::mpsc::channel();
        let base = t.0.clone();
        std::thread::spawn(move || {
            let _ = tx.send(refused(&base, &fake_home(&base.join("home"))));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("reading a FIFO include hung");
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("/home/fifo") && got[0].contains("not a regular file"), "{got:?}");
        assert!(got[1].contains("/home/big") && got[1].contains("larger than"), "{got:?}");
    }

    #[test]
    fn a_repositorys_includes_are_followed_inside_and_outside_the_project() {
        let t = tmp("repoinc");
        let project = t.0.join("project");
        write(
            &project.join(".git/config"),
            &format!("[include]\n\tpath = ../shared.gitconfig\n\tpath = {}/host.gitconfig\n", t.0.display()),
        );
        write(&project.join("shared.gitconfig"), "[core]\n\thooksPath = from-shared\n");
        write(&t.0.join("host.gitconfig"), "[include]\n\tpath = project/nested/more.gitconfig\n");
        write(&project.join("nested/more.gitconfig"), "[core]\n\thooksPath = from-more\n");
        assert_eq!(
            wanted(&t.0, &HostGit::default()),
            ["from-more", "from-shared", "nested/more.gitconfig", "shared.gitconfig"]
        );
    }

    #[test]
    fn a_linked_worktree_reads_its_common_directorys_configuration() {
        // `git worktree add`: the worktree's .git file names a gitdir whose
        // `commondir` leads to the main repository, where the config is.
        let t = tmp("worktree");
        let main = t.0.join("main/.git");
        write(&main.join("config"), "[core]\n\thooksPath = .githooks\n");
        write(&main.join("worktrees/wt/commondir"), "../..\n");
        write(&main.join("worktrees/wt/config.worktree"), "[core]\n\thooksPath = wt-hooks\n");
        write(&t.0.join("project/sub/.git"), &format!("gitdir: {}\n", main.join("worktrees/wt").display()));
        assert_eq!(wanted(&t.0, &HostGit::default()), ["sub/.githooks", "sub/wt-hooks"]);
        // A common directory inside the project is kept read-only: git
        // runs the hooks in it.
        write(&t.0.join("project/sub/.git"), "gitdir: ../gitdir\n");
        write(&t.0.join("project/gitdir/commondir"), "../common\n");
        write(&t.0.join("project/common/config"), "[core]\n\thooksPath = ../from-common\n");
        assert_eq!(wanted(&t.0, &HostGit::default()), ["common", "from-common", "gitdir"]);
    }

    #[test]
    fn an_enclosing_repositorys_hooks_path_into_the_project_is_protected() {
        // pi run in repo/project: the repository's .git is above the project.
        let t = tmp("outer");
        write(&t.0.join(".git/HEAD"), "ref: refs/heads/main\n");
        write(
            &t.0.join(".git/config"),
            "[core]\n\thooksPath = project/hooks\n[include]\n\tpath = ../project/inc.gitconfig\n",
        );
        // The user's relative hooks path is taken from that worktree too.
        let home = t.0.join("home");
        write(&home.join(".gitconfig"), "[core]\n\thooksPath = project/global-hooks\n");
        assert_eq!(wanted(&t.0, &fake_home(&home)), ["global-hooks", "hooks", "inc.gitconfig"]);
        // A .git file: the configuration of the git directory it names.
        std::fs::remove_dir_all(t.0.join(".git")).expect("rm");
        write(&t.0.join(".git"), "gitdir: elsewhere/gitdir\n");
        write(&t.0.join("elsewhere/gitdir/config"), "[core]\n\thooksPath = project/from-gitfile\n");
        assert_eq!(wanted(&t.0, &HostGit::default()), ["from-gitfile"]);
        // A .git link into the project: that git directory is the
        // project's, and git runs its hooks.
        std::fs::remove_file(t.0.join(".git")).expect("rm");
        write(&t.0.join("project/gitdata/HEAD"), "ref: refs/heads/main\n");
        write(&t.0.join("project/gitdata/config"), "[core]\n\thooksPath = project/from-linked\n");
        std::os::unix::fs::symlink("project/gitdata", t.0.join(".git")).expect("link");
        assert_eq!(wanted(&t.0, &HostGit::default()), ["from-linked", "gitdata"]);
    }

    #[test]
    fn only_the_first_enclosing_repository_counts() {
        let t = tmp("first");
        let project = t.0.join("mid/project");
        std::fs::create_dir_all(&project).expect("mkdir");
        write(&t.0.join(".git/HEAD"), "ref: refs/heads/main\n");
        write(&t.0.join(".git/config"), "[core]\n\thooksPath = mid/project/from-outermost\n");
        write(&t.0.join("mid/.git/HEAD"), "ref: refs/heads/main\n");
        write(&t.0.join("mid/.git/config"), "[core]\n\thooksPath = project/from-mid\n");
        assert_eq!(wanted_in(&project, &HostGit::default()), ["from-mid"]);
        // A .git directory without HEAD is no repository: git looks further up.
        std::fs::remove_file(t.0.join("mid/.git/HEAD")).expect("rm");
        assert_eq!(wanted_in(&project, &HostGit::default()), ["from-outermost"]);
    }

    fn refused_with_repos(base: &Path, git: &HostGit) -> Vec<String> {
        let project = base.join("project");
        let tree = Tree::open(&project).expect("open");
        let found = [(PathBuf::from("sub/.git"), Kind::File)];
        refusals(&project, &tree, &found, git)
    }

    #[test]
    fn a_gitdir_the_sandbox_can_write_is_never_read_and_is_refused() {
        let t = tmp("untrusted");
        let (project, runtime) = (t.0.join("project"), t.0.join("runtime"));
        let scratch = runtime.join("0123456789abcdef/scratch");
        // What the sandbox wrote in /scratch: a git directory whose config
        // names hooks in the project.
        write(&scratch.join("evil/config"), &format!("[core]\n\thooksPath = {}/hooks\n", project.display()));
        write(&project.join("sub/.git"), &format!("gitdir: {}\n", scratch.join("evil").display()));
        let git = HostGit { untrusted: vec![runtime.clone()], ..HostGit::default() };
        // Trusted, its config is read (what the plan did before).
        assert_eq!(wanted(&t.0, &HostGit::default()), ["hooks"]);
        assert_eq!(wanted(&t.0, &git), Vec::<String>::new());
        let got = refused_with_repos(&t.0, &git);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("sub/.git") && got[0].contains(&*runtime.to_string_lossy()), "{got:?}");
        // Reached through a host link, or a relative path, all the same.
        std::os::unix::fs::symlink(&scratch, t.0.join("to-scratch")).expect("link");
        for named in [t.0.join("to-scratch/evil"), PathBuf::from("../../runtime/0123456789abcdef/scratch/evil")] {
            write(&project.join("sub/.git"), &format!("gitdir: {}\n", named.display()));
            assert_eq!(wanted(&t.0, &git), Vec::<String>::new(), "{}", named.display());
            assert_eq!(refused_with_repos(&t.0, &git).len(), 1, "{}", named.display());
        }
        // A runtime root that does not exist yet is recognised too.
        std::fs::remove_dir_all(&runtime).expect("rm");
        assert_eq!(refused_with_repos(&t.0, &git).len(), 1);
    }

    #[test]
    fn an_include_or_a_hooks_path_the_sandbox_can_write_is_refused() {
        let t = tmp("untrusted-inc");
        let (home, runtime) = (t.0.join("home"), t.0.join("runtime"));
        write(&t.0.join("project/.git/HEAD"), "ref: refs/heads/main\n");
        write(
            &home.join(".gitconfig"),
            &format!(
                "[include]\n\tpath = {0}/s/scratch/x.gitconfig\n[core]\n\thooksPath = {0}/s/scratch/hooks\n",
                runtime.display()
            ),
        );
        let git = HostGit { untrusted: vec![runtime], ..fake_home(&home) };
        let got = refused(&t.0, &git);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("x.gitconfig") && got[1].contains("hooks"), "{got:?}");
    }

    #[test]
    fn a_dot_git_link_is_read_where_it_points() {
        let t = tmp("gitlink");
        let (project, store) = (t.0.join("project"), t.0.join("store"));
        write(&store.join("repo.git/config"), "[core]\n\thooksPath = from-link-dir\n");
        write(&store.join("repo2.git/config"), "[core]\n\thooksPath = from-link-file\n");
        write(&store.join("gitfile"), &format!("gitdir: {}\n", store.join("repo2.git").display()));
        std::os::unix::fs::symlink(store.join("repo.git"), project.join(".git")).expect("link");
        std::fs::create_dir(project.join("sub")).expect("mkdir");
        std::os::unix::fs::symlink(store.join("gitfile"), project.join("sub/.git")).expect("link");
        assert_eq!(wanted(&t.0, &HostGit::default()), ["from-link-dir", "sub/from-link-file"]);
    }
}
