//! What a failed command's result adds about the sandbox, read from the
//! end of its output: a path it could not find that the sandbox does not
//! show (and how to show it), a command that is on the host only under
//! the home directory, a write refused by a read-only project. A shell
//! command is never run again for a grant: these say what to change, and
//! the model runs it again if it wants to. The output is the sandbox's:
//! it only picks which of the engine's own sentences apply, and every
//! name taken from it is shown through the one-line rule.

use std::path::{Path, PathBuf};

use crate::display::one_line;
use crate::permissions::MountConfig;

/// At most this many hints per result.
const MAX_HINTS: usize = 3;

/// What a command's sandbox shows at host paths.
pub struct Shown<'a> {
    /// The canonical project directory.
    pub project: &'a Path,
    /// The host trees it reads at their own paths.
    pub reads: &'a [PathBuf],
    pub mounts: &'a MountConfig,
}

/// Trees every shell sandbox has.
const ALWAYS: &[&str] =
    &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/tmp", "/scratch", "/proc", "/dev", "/etc"];

impl Shown<'_> {
    fn shows(&self, p: &Path) -> bool {
        p.starts_with(self.project)
            || ALWAYS.iter().any(|a| p.starts_with(a))
            || self.reads.iter().any(|r| p.starts_with(r))
            || self.mounts.read_roots.iter().any(|r| p.starts_with(r))
            || self.mounts.once.iter().any(|m| p.starts_with(&m.path))
    }
}

/// The absolute paths a line names (words starting with `/`, without the
/// quotes and colons that tools put around them).
fn paths_in(line: &str) -> impl Iterator<Item = PathBuf> + '_ {
    line.split(|c: char| c.is_whitespace() || c == '\'' || c == '"' || c == '`')
        .map(|w| w.trim_end_matches([':', ',', ';', ')']))
        .filter(|w| w.starts_with('/') && w.len() < 4096)
        .filter_map(crate::paths::normalize)
}

/// The name in a shell's "command not found" line, if it is one.
fn not_found_name(line: &str) -> Option<&str> {
    let rest = line.strip_suffix(": command not found").or_else(|| line.strip_suffix(": not found"))?;
    let name = rest.rsplit(": ").next()?.trim();
    let plain =
        !name.is_empty() && name.len() < 256 && name.chars().all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
    plain.then_some(name)
}

fn config_words(config: Option<&Path>) -> String {
    match config {
        Some(p) => format!("`filesystem.additionalAllowRead` in {}", one_line(p)),
        None => "`filesystem.additionalAllowRead` in the trusted configuration".into(),
    }
}

/// The hints for a failed command whose output ended with `tail`.
/// `left_out` are the host's `PATH` entries under the home directory.
pub fn hints(tail: &str, shown: &Shown<'_>, left_out: &[PathBuf], config: Option<&Path>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |hint: String| {
        if out.len() < MAX_HINTS && !out.contains(&hint) {
            out.push(hint);
        }
    };
    for line in tail.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = not_found_name(line) {
            if let Some(found) = left_out.iter().map(|d| d.join(name)).find(|p| is_executable(p)) {
                let dir = found.parent().and_then(Path::parent).unwrap_or(Path::new("/"));
                add(format!(
                    "`{}` is not in the sandbox, but the host has it at {}, under the home directory, which commands \
                     do not see. To use it, add {} to {}.",
                    one_line(name),
                    one_line(&found),
                    one_line(dir),
                    config_words(config)
                ));
            }
            continue;
        }
        let missing = line.contains("No such file or directory") || line.contains("Permission denied");
        if missing {
            for p in paths_in(line).filter(|p| !shown.shows(p)) {
                add(format!(
                    "{} is outside what the sandbox shows (the project, the system, /tmp, /scratch and the read \
                     roots), so commands see nothing there. To let them read it, allow it as a read root, or add it \
                     to {}. The command was not run again.",
                    one_line(&p),
                    config_words(config)
                ));
            }
        }
        let in_project = || paths_in(line).any(|p| p.starts_with(shown.project)) || !line.contains('/');
        if line.contains("Read-only file system") && !shown.mounts.workspace_writable && in_project() {
            add("The project is read-only in this permission mode: commands cannot change it. Switch to a mode that \
                 allows edits to let them write."
                .into());
        }
    }
    out
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown<'a>(mounts: &'a MountConfig, reads: &'a [PathBuf]) -> Shown<'a> {
        Shown { project: Path::new("/home/u/proj"), reads, mounts }
    }

    #[test]
    fn a_missing_path_outside_the_mounts_is_named_with_how_to_show_it() {
        let m = MountConfig::default();
        let tail =
            "cat: /home/u/.ssh/id_rsa: No such file or directory\ncat: /home/u/proj/x: No such file or directory\n";
        let h = hints(tail, &shown(&m, &[]), &[], Some(Path::new("/cfg/config.json")));
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h[0].starts_with("/home/u/.ssh/id_rsa is outside what the sandbox shows"), "{h:?}");
        assert!(h[0].contains("/cfg/config.json") && h[0].contains("not run again"));
    }

    #[test]
    fn paths_under_read_roots_and_the_system_are_not_hinted() {
        let m = MountConfig { read_roots: vec!["/srv/data".into()], ..MountConfig::default() };
        let tail = "ls: cannot access '/srv/data/nope': No such file or directory\nsh: /usr/bin/nope: not found\n";
        assert!(hints(tail, &shown(&m, &[]), &[], None).is_empty());
    }

    #[test]
    fn a_command_under_the_home_is_named_with_its_directory() {
        let dir = std::env::temp_dir().join(format!("pps-hint-{}", std::process::id()));
        let bin = dir.join(".tool").join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("mytool");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = MountConfig::default();
        let h = hints("bash: line 1: mytool: command not found\n", &shown(&m, &[]), std::slice::from_ref(&bin), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h[0].contains(&format!("add {}", dir.join(".tool").display())), "{h:?}");
        let none = hints("sh: 1: othertool: not found\n", &shown(&m, &[]), &[bin], None);
        assert!(none.is_empty());
    }

    #[test]
    fn a_read_only_project_says_which_mode_writes() {
        let m = MountConfig::default();
        let h = hints("touch: cannot touch 'x': Read-only file system\n", &shown(&m, &[]), &[], None);
        assert_eq!(h.len(), 1);
        assert!(h[0].contains("read-only in this permission mode"));
        let w = MountConfig { workspace_writable: true, ..MountConfig::default() };
        assert!(hints("touch: cannot touch 'x': Read-only file system\n", &shown(&w, &[]), &[], None).is_empty());
    }

    #[test]
    fn hostile_names_are_shown_on_one_line_and_hints_are_bounded() {
        let m = MountConfig::default();
        let mut tail = String::new();
        for i in 0..10 {
            tail.push_str(&format!("cat: /x{i}\u{1b}[2J: No such file or directory\n"));
        }
        let h = hints(&tail, &shown(&m, &[]), &[], None);
        assert_eq!(h.len(), MAX_HINTS);
        assert!(h.iter().all(|s| !s.contains('\u{1b}')), "{h:?}");
    }
}
