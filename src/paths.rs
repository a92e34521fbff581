//! Lexical path helpers shared by the modules that judge host paths
//! (read roots, grants, host secrets): no file system access.

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
