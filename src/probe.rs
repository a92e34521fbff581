//! Host facts the sandbox depends on: where bubblewrap is and which version,
//! which interpreter to run and what it needs mounted, whether `/usr` is
//! merged. The probes are thin; the decisions take plain values so that
//! they are unit-tested without a special machine. Nothing here runs Python
//! on the host: the interpreter's version is checked inside the sandbox by
//! the worker itself.

use std::path::{Path, PathBuf};

/// Environment variable naming the interpreter (user-controlled).
pub use crate::options::INTERPRETER_ENV;
pub const DEFAULT_INTERPRETER: &str = "/usr/bin/python3";
const BWRAP_CANDIDATES: &[&str] = &["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];
/// `--disable-userns` arrived in bubblewrap 0.8.0.
pub const MIN_BWRAP: (u32, u32, u32) = (0, 8, 0);

pub const INSTALL_BWRAP: &str = "Install it with `sudo apt-get install bubblewrap` (Debian/Ubuntu) \
    or your distribution's bubblewrap package.";
/// Said after a host fact that stops the python tool (bubblewrap's own words serve both tools).
pub const REFUSE: &str = "The python tool never runs Python outside the sandbox.";

/// Why bubblewrap cannot be used (by either tool: the text names neither).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BwrapError {
    #[error("bubblewrap (bwrap) was not found. {INSTALL_BWRAP}")]
    NotFound,
    #[error("{} could not be run: {why}. {INSTALL_BWRAP}", path.display())]
    CannotRun { path: PathBuf, why: String },
    #[error("{} --version printed {printed:?}, which is not a bubblewrap version.", path.display())]
    NoVersion { path: PathBuf, printed: String },
    #[error(
        "bubblewrap {}.{}.{} at {} is too old: the sandbox needs 0.8.0 or newer (for --disable-userns). \
         {INSTALL_BWRAP}",
        version.0, version.1, version.2, path.display()
    )]
    TooOld { path: PathBuf, version: (u32, u32, u32) },
}

/// Why the configured interpreter cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterpreterError {
    #[error(
        "The interpreter ({INTERPRETER_ENV} or the interpreter option) must be an absolute path to a Python 3.10+ \
         binary; got {given:?}. A bare name would be looked up on PATH, which this tool deliberately never does."
    )]
    NotAbsolute { given: String },
    #[error(
        "Python interpreter not found at {}. Install Python 3.10+ (e.g. `sudo apt-get install python3`) or set \
         {INTERPRETER_ENV} to a Python 3.10+ binary. {REFUSE}",
        path.display()
    )]
    NotFound { path: PathBuf },
    #[error("{} is not an executable file. {}", real.display(), InterpreterError::NotFound { path: given.clone() })]
    NotExecutable { real: PathBuf, given: PathBuf },
    #[error(
        "Interpreter {} has no installation prefix that can be mounted on its own (it would expose the whole host \
         filesystem). Install it under its own directory or use /usr/bin/python3.",
        real.display()
    )]
    NoPrefix { real: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bwrap {
    pub path: PathBuf,
    pub version: (u32, u32, u32),
    /// A setuid bwrap widens the attack surface of the sandbox itself.
    pub setuid: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Resolved, as mounted and executed.
    pub path: PathBuf,
    /// Host directories to mount read-only for an interpreter outside `/usr`.
    pub mounts: Vec<PathBuf>,
}

/// Parse `bubblewrap 0.8.0` (the output of `bwrap --version`).
pub fn parse_bwrap_version(out: &str) -> Option<(u32, u32, u32)> {
    let word = out.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let mut parts = word.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next().flatten().unwrap_or(0), parts.next().flatten().unwrap_or(0)))
}

/// Which bwrap to run: the first of the standard locations, else `PATH`.
pub fn find_bwrap(path_env: Option<&str>, exists: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let fixed = BWRAP_CANDIDATES.iter().map(PathBuf::from);
    let from_path =
        path_env.unwrap_or("").split(':').filter(|d| d.starts_with('/')).map(|d| Path::new(d).join("bwrap"));
    fixed.chain(from_path).find(|p| exists(p))
}

/// Check a bwrap version against what the argv needs.
pub fn check_bwrap_version(path: &Path, version: (u32, u32, u32)) -> Result<(), BwrapError> {
    if version < MIN_BWRAP {
        return Err(BwrapError::TooOld { path: path.to_path_buf(), version });
    }
    Ok(())
}

/// What an interpreter at the resolved path `real` needs mounted: nothing
/// under `/usr`; otherwise its installation prefix (the directory above its
/// `bin/`), which holds the standard library.
pub fn interpreter_mounts(real: &Path) -> Result<Vec<PathBuf>, InterpreterError> {
    if real.starts_with("/usr") {
        return Ok(vec![]);
    }
    let bin = real.parent().unwrap_or(Path::new("/"));
    let prefix = if bin.file_name().is_some_and(|n| n == "bin") { bin.parent().unwrap_or(Path::new("/")) } else { bin };
    if prefix == Path::new("/") {
        return Err(InterpreterError::NoPrefix { real: real.to_path_buf() });
    }
    Ok(vec![prefix.to_path_buf()])
}

/// Resolve the configured interpreter (never a bare name looked up on PATH).
pub fn resolve_interpreter(configured: Option<&str>) -> Result<Interpreter, InterpreterError> {
    let configured = PathBuf::from(match configured {
        Some(s) if !s.trim().is_empty() => s.trim(),
        _ => DEFAULT_INTERPRETER,
    });
    if !configured.is_absolute() {
        return Err(InterpreterError::NotAbsolute { given: configured.display().to_string() });
    }
    let missing = || InterpreterError::NotFound { path: configured.clone() };
    let real = std::fs::canonicalize(&configured).map_err(|_| missing())?;
    let meta = std::fs::metadata(&real).map_err(|_| missing())?;
    use std::os::unix::fs::PermissionsExt;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(InterpreterError::NotExecutable { real, given: configured });
    }
    let mounts = interpreter_mounts(&real)?;
    Ok(Interpreter { path: real, mounts })
}

/// `1` adds the system's own dist-packages.
pub use crate::options::SYSTEM_SITE_ENV;
/// User-controlled Python packages: a virtualenv or site directories,
/// colon-separated (never set by the model).
pub use crate::options::VENV_ENV;
pub const SYSTEM_DIST_PACKAGES: &str = "/usr/lib/python3/dist-packages";

/// The user's Python packages, as the sandbox sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonEnv {
    /// Host directories to mount read-only at their own paths.
    pub mounts: Vec<PathBuf>,
    /// Directories the worker adds with `site.addsitedir`.
    pub site_dirs: Vec<PathBuf>,
    /// What was skipped, and why.
    pub notes: Vec<String>,
}

/// Decide the Python environment from the settings. `list_site` lists a
/// venv's `lib/python3.*/site-packages` directories; `resolve` is realpath.
pub fn python_env(
    setting: Option<&str>,
    system_site: bool,
    resolve: impl Fn(&Path) -> std::io::Result<PathBuf>,
    is_venv: impl Fn(&Path) -> bool,
    list_site: impl Fn(&Path) -> Vec<PathBuf>,
) -> PythonEnv {
    let mut env = PythonEnv::default();
    for entry in setting.unwrap_or("").split(':').map(str::trim).filter(|s| !s.is_empty()) {
        if !entry.starts_with('/') {
            env.notes.push(format!("{VENV_ENV}: {entry} is not an absolute path; ignored"));
            continue;
        }
        let real = match resolve(Path::new(entry)) {
            Ok(r) => r,
            Err(e) => {
                env.notes.push(format!("{VENV_ENV}: {entry} cannot be used ({e}); ignored"));
                continue;
            }
        };
        let sites = if is_venv(&real) { list_site(&real) } else { vec![real.clone()] };
        if sites.is_empty() {
            env.notes.push(format!("{VENV_ENV}: {entry} is a virtualenv without lib/python3.*/site-packages; ignored"));
            continue;
        }
        if !real.starts_with("/usr") && !env.mounts.contains(&real) {
            env.mounts.push(real);
        }
        env.site_dirs.extend(sites);
    }
    if system_site {
        env.site_dirs.push(SYSTEM_DIST_PACKAGES.into());
    }
    env
}

/// [`python_env`] from the environment variables and the file system.
/// `writable` are (path as given, canonical path) of trees the sandbox may
/// write (the project, the runtime root): a setting inside one is resolved
/// beneath it without following links, never by realpath, which would
/// follow a link the sandbox planted there out of the tree.
pub fn python_env_from_host(setting: Option<&str>, system_site: bool, writable: &[(PathBuf, PathBuf)]) -> PythonEnv {
    // (tree, path inside it) of a path inside a tree the sandbox can write.
    let beneath = |p: &Path| -> Option<(crate::beneath::Tree, PathBuf, PathBuf)> {
        let lexical = crate::permissions::normalize(&p.to_string_lossy()).unwrap_or_else(|| p.to_path_buf());
        writable.iter().find_map(|(given, canonical)| {
            let rel = lexical.strip_prefix(given).or_else(|_| lexical.strip_prefix(canonical)).ok()?.to_path_buf();
            Some((crate::beneath::Tree::open(canonical).ok()?, rel, canonical.clone()))
        })
    };
    let is_dir_beneath = |t: &crate::beneath::Tree, rel: &Path| {
        t.lstat(rel).ok().flatten().is_some_and(|st| crate::beneath::Kind::of(&st) == crate::beneath::Kind::Dir)
    };
    python_env(
        setting,
        system_site,
        |p| {
            let inside = writable.iter().any(|(given, canonical)| {
                let lexical = crate::permissions::normalize(&p.to_string_lossy()).unwrap_or_else(|| p.to_path_buf());
                lexical.starts_with(given) || lexical.starts_with(canonical)
            });
            if inside {
                let (tree, rel, canonical) = beneath(p)
                    .ok_or_else(|| std::io::Error::other("the tree the sandbox can write cannot be opened"))?;
                tree.dir(&rel).map_err(|e| {
                    std::io::Error::other(format!("{e} (resolved inside a tree the sandbox can write)"))
                })?;
                return Ok(canonical.join(rel));
            }
            let real = std::fs::canonicalize(p)?;
            if !real.is_dir() {
                return Err(std::io::Error::other("not a directory"));
            }
            Ok(real)
        },
        |p| match beneath(p) {
            // Inside a writable tree: looked at beneath it, never through a link.
            Some((tree, rel, _)) => tree
                .lstat(&rel.join("pyvenv.cfg"))
                .ok()
                .flatten()
                .is_some_and(|st| crate::beneath::Kind::of(&st) == crate::beneath::Kind::File),
            None => p.join("pyvenv.cfg").is_file(),
        },
        |venv| {
            let mut found: Vec<PathBuf> = match beneath(venv) {
                Some((tree, rel, canonical)) => tree
                    .list(&rel.join("lib"), 1024)
                    .map(|(entries, _)| entries)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(name, _)| name.to_string_lossy().starts_with("python3."))
                    .map(|(name, _)| rel.join("lib").join(name).join("site-packages"))
                    .filter(|site| is_dir_beneath(&tree, site))
                    .map(|site| canonical.join(site))
                    .collect(),
                None => std::fs::read_dir(venv.join("lib"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("python3."))
                    .map(|e| e.path().join("site-packages"))
                    .filter(|p| p.is_dir())
                    .collect(),
            };
            found.sort();
            found
        },
    )
}

/// The kernel information files of [`crate::bwrap::PROC_MASKS`] this
/// kernel has, each masked as what it is (`kind` gives `Some(is_dir)` for
/// a path that exists): a bind needs its mount point, and bubblewrap
/// cannot make one in `/proc`.
pub fn proc_masks(kind: impl Fn(&Path) -> Option<bool>) -> Vec<crate::hostsecrets::Mask> {
    crate::bwrap::PROC_MASKS
        .iter()
        .filter_map(|m| kind(Path::new(m.path)).map(|is_dir| crate::hostsecrets::Mask { path: m.path.into(), is_dir }))
        .collect()
}

/// [`proc_masks`] of the host's `/proc` (the sandbox's runs on the same
/// kernel; nothing masked is per network namespace).
pub fn proc_masks_of_host() -> Vec<crate::hostsecrets::Mask> {
    proc_masks(|p| std::fs::symlink_metadata(p).ok().filter(|m| !m.file_type().is_symlink()).map(|m| m.is_dir()))
}

/// Is `/bin` a link into `/usr` on this host?
pub fn merged_usr() -> bool {
    std::fs::canonicalize("/bin").is_ok_and(|p| p == Path::new("/usr/bin"))
}

/// [`probe_bwrap_now`], once per process when it succeeds.
pub async fn probe_bwrap() -> Result<Bwrap, BwrapError> {
    static FOUND: tokio::sync::OnceCell<Bwrap> = tokio::sync::OnceCell::const_new();
    FOUND.get_or_try_init(probe_bwrap_now).await.cloned()
}

/// Find bwrap, ask its version, and check it.
pub async fn probe_bwrap_now() -> Result<Bwrap, BwrapError> {
    let path_env = std::env::var("PATH").ok();
    let path = find_bwrap(path_env.as_deref(), |p| p.is_file()).ok_or(BwrapError::NotFound)?;
    let out = tokio::process::Command::new(&path)
        .arg("--version")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| BwrapError::CannotRun { path: path.clone(), why: e.to_string() })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = parse_bwrap_version(&text)
        .ok_or_else(|| BwrapError::NoVersion { path: path.clone(), printed: text.trim().to_string() })?;
    check_bwrap_version(&path, version)?;
    use std::os::unix::fs::PermissionsExt;
    let setuid = std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o4000 != 0);
    Ok(Bwrap { path, version, setuid })
}

/// What to do when bubblewrap's own words (`stderr`) say it could not
/// make the sandbox's namespaces, if they do.
pub fn namespace_hint(stderr: &str) -> Option<&'static str> {
    let said = stderr.contains("namespace") || stderr.contains("uid map") || stderr.contains("Operation not permitted");
    said.then_some(
        "Common causes: unprivileged user namespaces are disabled by the kernel or a container runtime (sysctl \
         kernel.unprivileged_userns_clone, user.max_user_namespaces, or an AppArmor policy such as Ubuntu 24.04's \
         kernel.apparmor_restrict_unprivileged_userns). Fix: allow them for bubblewrap (on Ubuntu 24.04 an AppArmor \
         profile for /usr/bin/bwrap, or sysctl kernel.apparmor_restrict_unprivileged_userns=0), or run pi where user \
         namespaces are available (in a container, one started with them allowed).",
    )
}

/// Whether bubblewrap can make a sandbox's namespaces on this host (a
/// bare `true` in new user, pid and network namespaces), asked once per
/// process: `Err` holds what it said and what to do. For a warning before
/// the first call; every start still says its own failure.
pub async fn sandbox_works() -> Result<(), NoSandbox> {
    SANDBOX_WORKS.get_or_init(sandbox_works_now).await.clone()
}

static SANDBOX_WORKS: tokio::sync::OnceCell<Result<(), NoSandbox>> = tokio::sync::OnceCell::const_new();

/// Why no sandbox can start here, as far as is known without starting
/// one: the host probe's answer once [`sandbox_works`] was asked,
/// bubblewrap not on the path, or the interpreter (`configured`, else the
/// default) missing. For `status` before the first call; None when nothing
/// known stands in the way.
pub fn known_unavailable(configured: Option<&str>) -> Option<String> {
    let asked = SANDBOX_WORKS.get().and_then(|r| r.as_ref().err()).map(|e| e.to_string());
    let path_env = std::env::var("PATH").ok();
    asked
        .or_else(|| {
            find_bwrap(path_env.as_deref(), |p| p.is_file()).is_none().then(|| BwrapError::NotFound.to_string())
        })
        .or_else(|| resolve_interpreter(configured).err().map(|e| e.to_string()))
}

/// Why no sandbox can start on this host, worded with the fix.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct NoSandbox(String);

async fn sandbox_works_now() -> Result<(), NoSandbox> {
    let bwrap = probe_bwrap().await.map_err(|e| NoSandbox(e.to_string()))?;
    let mut cmd = tokio::process::Command::new(&bwrap.path);
    cmd.args(["--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-net", "--die-with-parent"])
        .args(["--ro-bind", "/usr", "/usr", "--ro-bind-try", "/lib", "/lib", "--ro-bind-try", "/lib64", "/lib64"])
        .args(["--", "/usr/bin/true"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(std::time::Duration::from_secs(10), cmd.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(NoSandbox(format!("{} could not be run: {e}", bwrap.path.display()))),
        Err(_) => return Err(NoSandbox(format!("{} did not make a test sandbox within 10 s", bwrap.path.display()))),
    };
    if out.status.success() {
        return Ok(());
    }
    let said = crate::display::displayed(
        String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(4096)]).trim().to_string(),
    );
    let mut msg = format!("bubblewrap cannot make a sandbox on this host: {said}");
    if let Some(hint) = namespace_hint(&said) {
        msg = format!("{msg}. {hint}");
    }
    Err(NoSandbox(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kernel_files_present_are_masked_each_as_what_it_is() {
        use crate::hostsecrets::Mask;
        let masks = proc_masks(|p| match p.to_str() {
            Some("/proc/keys") => Some(false),
            Some("/proc/acpi") => Some(true),
            // A file where a directory was expected is masked as a file.
            Some("/proc/scsi") => Some(false),
            _ => None,
        });
        assert_eq!(
            masks,
            [
                Mask { path: "/proc/acpi".into(), is_dir: true },
                Mask { path: "/proc/keys".into(), is_dir: false },
                Mask { path: "/proc/scsi".into(), is_dir: false },
            ]
        );
    }

    #[test]
    fn every_kernel_view_has_a_reason_and_lies_under_proc() {
        let paths: Vec<&str> = crate::bwrap::PROC_MASKS.iter().map(|m| m.path).collect();
        for m in crate::bwrap::PROC_MASKS {
            assert!(m.reason.len() > 10, "{}: no reason", m.path);
            assert!(m.path.starts_with("/proc/") && !m.path.starts_with("/proc/sys/net"), "{}", m.path);
            assert_eq!(paths.iter().filter(|p| **p == m.path).count(), 1, "{} listed twice", m.path);
        }
        for (path, reason) in crate::bwrap::READ_ONLY_PROC {
            assert!(reason.len() > 10, "{path}: no reason");
            assert!(path.starts_with("/proc/"), "{path}");
        }
    }

    #[test]
    fn bwrap_version_parses() {
        assert_eq!(parse_bwrap_version("bubblewrap 0.8.0\n"), Some((0, 8, 0)));
        assert_eq!(parse_bwrap_version("bubblewrap 0.11"), Some((0, 11, 0)));
        assert_eq!(parse_bwrap_version("garbage"), None);
    }

    #[test]
    fn old_bwrap_is_refused_with_the_install_line() {
        let err = check_bwrap_version(Path::new("/usr/bin/bwrap"), (0, 6, 1)).unwrap_err().to_string();
        assert!(err.contains("0.6.1") && err.contains("apt-get install bubblewrap"), "{err}");
        assert!(check_bwrap_version(Path::new("/usr/bin/bwrap"), (0, 8, 0)).is_ok());
    }

    #[test]
    fn bwrap_is_found_in_fixed_places_before_path() {
        let only = |want: &'static str| move |p: &Path| p == Path::new(want);
        assert_eq!(find_bwrap(Some("/opt/x"), only("/usr/bin/bwrap")), Some("/usr/bin/bwrap".into()));
        assert_eq!(find_bwrap(Some("rel:/opt/x"), only("/opt/x/bwrap")), Some("/opt/x/bwrap".into()));
        assert_eq!(find_bwrap(Some("rel"), only("rel/bwrap")), None);
        assert_eq!(find_bwrap(None, |_| false), None);
    }

    #[test]
    fn interpreter_outside_usr_mounts_its_prefix() {
        assert_eq!(interpreter_mounts(Path::new("/usr/bin/python3.11")), Ok(vec![]));
        assert_eq!(
            interpreter_mounts(Path::new("/root/.pyenv/versions/3.11.7/bin/python3.11")),
            Ok(vec![PathBuf::from("/root/.pyenv/versions/3.11.7")])
        );
        assert_eq!(interpreter_mounts(Path::new("/opt/py/python3")), Ok(vec![PathBuf::from("/opt/py")]));
        assert!(interpreter_mounts(Path::new("/bin/python3")).is_err());
        assert!(interpreter_mounts(Path::new("/python3")).is_err());
    }

    #[test]
    fn python_env_from_settings() {
        let resolve = |p: &Path| -> std::io::Result<PathBuf> {
            match p.to_str() {
                Some("/venv") | Some("/site") | Some("/empty-venv") => Ok(p.to_path_buf()),
                Some("/link") => Ok("/venv".into()),
                _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
            }
        };
        let is_venv = |p: &Path| p == Path::new("/venv") || p == Path::new("/empty-venv");
        let list = |p: &Path| {
            if p == Path::new("/venv") {
                vec![PathBuf::from("/venv/lib/python3.11/site-packages")]
            } else {
                vec![]
            }
        };
        let env = python_env(Some("/link: /site :rel:/missing:/empty-venv"), true, resolve, is_venv, list);
        assert_eq!(env.mounts, [PathBuf::from("/venv"), "/site".into()]);
        assert_eq!(
            env.site_dirs,
            [PathBuf::from("/venv/lib/python3.11/site-packages"), "/site".into(), SYSTEM_DIST_PACKAGES.into()]
        );
        assert_eq!(env.notes.len(), 3, "{:?}", env.notes);
        assert!(env.notes[0].contains("rel is not an absolute path"));
        assert!(env.notes[1].contains("/missing cannot be used"));
        assert!(env.notes[2].contains("without lib/python3.*/site-packages"));
        assert_eq!(python_env(None, false, resolve, is_venv, list), PythonEnv::default());
    }

    #[test]
    fn interpreter_must_be_an_absolute_existing_executable() {
        assert!(resolve_interpreter(Some("python3")).unwrap_err().to_string().contains("absolute path"));
        let missing = resolve_interpreter(Some("/nonexistent/python3")).unwrap_err().to_string();
        assert!(missing.contains("not found at /nonexistent/python3"), "{missing}");
        let not_exec = resolve_interpreter(Some("/etc/passwd")).unwrap_err().to_string();
        assert!(
            not_exec.starts_with("/etc/passwd is not an executable file. Python interpreter not found at /etc/passwd"),
            "{not_exec}"
        );
    }
}
