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

/// Where `path` (absolute, normalised) resolves, following links one
/// component at a time: an error when it cannot be resolved, or when the
/// resolution passes through one of `trees` (trees the sandbox can write:
/// the project, the session directories), found by path or, for a bind
/// mount or another name of a tree's root, by device and inode. There a
/// name could be a link the sandbox planted (or makes later), so the host
/// never follows one; no component is stat'ed through a link either.
pub fn resolve_avoiding(path: &Path, trees: &[&Path]) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let roots: Vec<(u64, u64)> =
        trees.iter().filter_map(|t| std::fs::symlink_metadata(t).ok()).map(|m| (m.dev(), m.ino())).collect();
    let through = |p: &Path, meta: Option<&std::fs::Metadata>| -> std::io::Result<()> {
        let inside =
            trees.iter().any(|t| p.starts_with(t)) || meta.is_some_and(|m| roots.contains(&(m.dev(), m.ino())));
        if inside {
            return Err(std::io::Error::other(format!(
                "it leads through {}, which the sandbox can write",
                p.display()
            )));
        }
        Ok(())
    };
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
        through(&next, None)?;
        let meta = std::fs::symlink_metadata(&next)?;
        through(&next, Some(&meta))?;
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
    through(&done, None)?;
    Ok(done)
}
