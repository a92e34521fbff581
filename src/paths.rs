//! Path helpers shared by the modules that judge host paths (read roots,
//! grants, host secrets): lexical normalisation, and a resolution that
//! never follows a link inside a tree the sandbox can write.

use std::path::{Component, Path, PathBuf};

/// Lexically normalised absolute path (`.`, `..`, repeated and trailing
/// slashes removed); `None` for a relative path.
pub fn normalize(path: &str) -> Option<PathBuf> {
    normalize_path(Path::new(path))
}

/// [`normalize`] for a path.
pub fn normalize_path(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    Some(out)
}

/// The device and inode of the entry at `path` (canonical: a link put
/// there since is the link, never followed): which one is there now
/// (another one put at the same path since a sandbox mounted it is not
/// the one it has).
pub fn dir_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Where `path` (absolute, normalised) resolves, following links one
/// component at a time: an error when it cannot be resolved, or when the
/// resolution passes through one of `trees` (trees the sandbox can write:
/// the project, the session directories), found by path or, for a bind
/// mount or another name of a tree's root, by device and inode. There a
/// name could be a link the sandbox planted (or makes later), so the host
/// never follows one; no component is stat'ed through a link either.
pub fn resolve_avoiding(path: &Path, trees: &[&Path]) -> std::io::Result<PathBuf> {
    Resolver::new(trees).resolve(path)
}

/// [`resolve_avoiding`] for many paths against the same trees: the trees'
/// roots are looked at once, and every directory a resolution looked a
/// name up in is recorded (what a cached result depends on).
pub struct Resolver<'a> {
    trees: &'a [&'a Path],
    roots: Vec<(u64, u64)>,
    /// The directories looked in, each once.
    pub consulted: std::collections::HashSet<PathBuf>,
}

impl<'a> Resolver<'a> {
    pub fn new(trees: &'a [&'a Path]) -> Resolver<'a> {
        use std::os::unix::fs::MetadataExt;
        let roots =
            trees.iter().filter_map(|t| std::fs::symlink_metadata(t).ok()).map(|m| (m.dev(), m.ino())).collect();
        Resolver { trees, roots, consulted: std::collections::HashSet::new() }
    }

    /// Whether `p` is at or under one of the trees (by path).
    pub fn in_tree(&self, p: &Path) -> bool {
        self.trees.iter().any(|t| p.starts_with(t))
    }

    /// Whether `meta` is one of the trees' roots (a bind mount or another
    /// name of it).
    pub fn is_tree_root(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.roots.contains(&(meta.dev(), meta.ino()))
    }

    fn through(&self, p: &Path, meta: Option<&std::fs::Metadata>) -> std::io::Result<()> {
        if self.in_tree(p) || meta.is_some_and(|m| self.is_tree_root(m)) {
            return Err(std::io::Error::other(format!(
                "it leads through {}, which the sandbox can write",
                p.display()
            )));
        }
        Ok(())
    }

    /// `lstat` of `path`, recording its directory as consulted.
    pub fn lstat(&mut self, path: &Path) -> std::io::Result<std::fs::Metadata> {
        if let Some(dir) = path.parent() {
            self.note(dir);
        }
        std::fs::symlink_metadata(path)
    }

    /// Records `dir` as consulted.
    pub fn note(&mut self, dir: &Path) {
        if !self.consulted.contains(dir) {
            self.consulted.insert(dir.to_path_buf());
        }
    }

    /// See [`resolve_avoiding`].
    pub fn resolve(&mut self, path: &Path) -> std::io::Result<PathBuf> {
        let mut done = PathBuf::from("/");
        let mut todo: std::collections::VecDeque<std::ffi::OsString> =
            path.components().filter(|c| matches!(c, Component::Normal(_))).map(|c| c.as_os_str().to_owned()).collect();
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                done.pop();
                continue;
            }
            if name == "." || name.is_empty() {
                continue;
            }
            let next = done.join(&name);
            self.through(&next, None)?;
            let meta = self.lstat(&next)?;
            self.through(&next, Some(&meta))?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > 40 {
                    return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = std::fs::read_link(&next)?;
                if target.is_absolute() {
                    done = PathBuf::from("/");
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => todo.push_front(n.to_owned()),
                        Component::ParentDir => todo.push_front("..".into()),
                        _ => {}
                    }
                }
            } else {
                done = next;
            }
        }
        self.through(&done, None)?;
        Ok(done)
    }
}
