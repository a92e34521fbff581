//! A project's own `pi-python-sandbox/config.json`: found to say that it
//! is ignored, never read.
//!
//! The look is bounded and link-safe: the fixed place first
//! ([`PROJECT_FILE_REL`], by `lstat` beneath the project's fd), then the
//! project's bounded walk (`scan`, links never followed; dependency trees
//! and `.git` not entered), which finds a `config.json` in a directory
//! named `pi-python-sandbox` anywhere else. Nothing depends on finding
//! them all (no project file is ever read, found or not), so a walk cut
//! short by its bound only shortens the notice.

use std::path::{Path, PathBuf};

use crate::beneath::{Kind, Tree};
use crate::display::one_line;
use crate::scan::{walk, Limits, Visit, DEPENDENCY_DIRS};

/// The bounds of the look at session start (a notice only: what it does
/// not see is ignored just the same).
pub const LOOK_LIMITS: Limits = Limits { max_entries: 50_000, max_depth: 24 };

/// Where a project would put the file, relative to the project.
pub const PROJECT_FILE_REL: &str = ".pi/extensions/pi-python-sandbox/config.json";
/// Paths a notice names at most.
const NAMED: usize = 3;

/// Files (or links) named like the trusted file inside `root` (the
/// project, a real path), relative to it; `trusted` (the trusted file,
/// when it lies in the project) is not one of them.
pub fn project_files(root: &Path, trusted: &Path, limits: Limits) -> Vec<PathBuf> {
    let Ok(tree) = Tree::open(root) else {
        return Vec::new();
    };
    let trusted = std::fs::canonicalize(trusted).ok();
    let is_trusted = |rel: &Path| trusted.as_deref() == Some(root.join(rel).as_path());
    let mut found = Vec::new();
    let fixed = Path::new(PROJECT_FILE_REL);
    if matches!(tree.lstat(fixed), Ok(Some(_))) && !is_trusted(fixed) {
        found.push(fixed.to_path_buf());
    }
    walk(&tree, limits, |rel, kind| {
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if kind == Kind::Dir && (name == ".git" || DEPENDENCY_DIRS.contains(&name)) {
            return Visit::Skip;
        }
        let in_ours = rel.parent().and_then(Path::file_name).is_some_and(|p| p == "pi-python-sandbox");
        if name == "config.json" && in_ours && kind != Kind::Dir && rel != fixed && !is_trusted(rel) {
            found.push(rel.to_path_buf());
        }
        Visit::Descend
    });
    found
}

/// The one-time notice about the project's files, when there are any.
pub fn notice(root: &Path, trusted: &Path, limits: Limits) -> Option<String> {
    let found = project_files(root, trusted, limits);
    if found.is_empty() {
        return None;
    }
    let mut names: Vec<String> = found.iter().take(NAMED).map(|rel| one_line(rel).to_string()).collect();
    if found.len() > NAMED {
        names.push(format!("and {} more", found.len() - NAMED));
    }
    Some(format!(
        "ignored the project's {} {}: the sandbox's configuration is read only from {} (a project cannot widen its own sandbox)",
        if found.len() == 1 { "file" } else { "files" },
        names.join(", "),
        one_line(trusted)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::DEFAULT_LIMITS;
    use std::os::unix::fs::symlink;

    fn mk(root: &Path, rel: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "{\"bash\": \"host\"}").unwrap();
    }

    #[test]
    fn finds_the_fixed_place_and_the_name_anywhere_but_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let trusted = Path::new("/nonexistent/agent").join(super::super::CONFIG_REL);
        assert_eq!(project_files(&root, &trusted, DEFAULT_LIMITS), Vec::<PathBuf>::new());
        assert_eq!(notice(&root, &trusted, DEFAULT_LIMITS), None);
        mk(&root, PROJECT_FILE_REL);
        mk(&root, "sub/pkg/.pi/extensions/pi-python-sandbox/config.json");
        mk(&root, "node_modules/x/pi-python-sandbox/config.json");
        mk(&root, ".git/pi-python-sandbox/config.json");
        mk(&root, "other/config.json");
        let outside = tempfile::tempdir().unwrap();
        mk(outside.path(), "pi-python-sandbox/config.json");
        symlink(outside.path(), root.join("linked")).unwrap();
        assert_eq!(
            project_files(&root, &trusted, DEFAULT_LIMITS),
            [PathBuf::from(PROJECT_FILE_REL), PathBuf::from("sub/pkg/.pi/extensions/pi-python-sandbox/config.json")]
        );
        let said = notice(&root, &trusted, DEFAULT_LIMITS).unwrap();
        assert!(
            said.starts_with("ignored the project's files .pi/extensions/pi-python-sandbox/config.json, sub/"),
            "{said}"
        );
        assert!(said.contains("read only from /nonexistent/agent/extensions/pi-python-sandbox/config.json"), "{said}");
        // A link named like the file is named too (and not followed).
        std::fs::remove_file(root.join(PROJECT_FILE_REL)).unwrap();
        symlink("/etc/passwd", root.join(PROJECT_FILE_REL)).unwrap();
        assert_eq!(project_files(&root, &trusted, DEFAULT_LIMITS).len(), 2);
    }

    #[test]
    fn the_trusted_file_is_not_the_projects_when_the_project_holds_the_agent_dir() {
        // pi run in the home directory: the project is the home, and the
        // agent directory `~/.pi/agent` is inside it.
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        let trusted = home.join(".pi/agent").join(super::super::CONFIG_REL);
        mk(&home, ".pi/agent/extensions/pi-python-sandbox/config.json");
        assert_eq!(project_files(&home, &trusted, DEFAULT_LIMITS), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_control_character_in_a_found_name_is_shown_safely() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        mk(&root, "a\x1b[2Jb/pi-python-sandbox/config.json");
        let said = notice(&root, Path::new("/agent/x"), DEFAULT_LIMITS).unwrap();
        assert!(!said.contains('\x1b'), "{said:?}");
    }
}
