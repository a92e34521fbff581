//! The shell runtime: one command of the sandboxed `bash` tool, run by a
//! shell under the engine's policy with the project at its host path.
//! Pure parts only: the environment (an allowlist, never the host's), the
//! `PATH` (the host's entries outside the home directory), the generated
//! `/etc` files and the payload; `crate::shell` runs it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::bwrap::{Payload, SCRATCH};

/// The system configuration a shell's tools read, shown read-only where
/// the host has it: certificates for TLS clients, the alternatives links
/// that Debian's `/usr/bin` names point through, the name service switch.
/// No private keys: `/etc/ssl/private` is not among them.
pub const SYSTEM_READS: &[&str] = &[
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/pki/tls/certs",
    "/etc/alternatives",
    "/etc/nsswitch.conf",
    "/etc/inputrc",
    "/etc/mime.types",
];

/// Where `PATH` entries live that the engine mounts for every sandbox.
const SYSTEM_PREFIXES: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64"];

/// Host variables a command gets by name (with the host's value), besides
/// the ones the engine sets: the locale, the time zone, the terminal type.
/// Never a credential: every other variable of pi's process stays out.
pub fn allowed_name(name: &str) -> bool {
    matches!(name, "LANG" | "LANGUAGE" | "TZ" | "TERM" | "COLORTERM" | "NO_COLOR" | "USER" | "LOGNAME")
        || name.starts_with("LC_")
}

/// pi's own session variables (pi 1.x hands them to its bash): `PI_`
/// names that do not look like a credential.
pub fn pi_session_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    name.starts_with("PI_")
        && !["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"].iter().any(|w| upper.contains(w))
}

/// The host's `PATH` as a command sees it: entries outside `home` kept
/// (the ones outside the system trees are mounted read-only), entries
/// under it kept only where `allowed` (a trusted extra read list) covers
/// them; relative and empty entries dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SearchPath {
    /// The value of `PATH` inside.
    pub value: String,
    /// Entries that need a mount of their own (outside the system trees).
    pub mounts: Vec<PathBuf>,
    /// Entries left out because they are under the home directory (where
    /// a "command not found" may be found).
    pub left_out: Vec<PathBuf>,
}

pub fn search_path(host_path: &str, home: Option<&Path>, allowed: &[PathBuf]) -> SearchPath {
    let mut out = SearchPath::default();
    let mut kept: Vec<PathBuf> = Vec::new();
    for entry in host_path.split(':') {
        let p = Path::new(entry);
        if !p.is_absolute() || entry.contains('\0') {
            continue;
        }
        let Some(p) = crate::paths::normalize_path(p) else { continue };
        if kept.contains(&p) || out.left_out.contains(&p) {
            continue;
        }
        let under_home = home.is_some_and(|h| h != Path::new("/") && p.starts_with(h));
        let allowed_here = allowed.iter().any(|a| p.starts_with(a));
        if under_home && !allowed_here {
            out.left_out.push(p);
            continue;
        }
        if !SYSTEM_PREFIXES.iter().any(|s| p.starts_with(s)) && !allowed_here {
            out.mounts.push(p.clone());
        }
        kept.push(p);
    }
    for fallback in ["/usr/local/bin", "/usr/bin", "/bin"] {
        if !kept.iter().any(|k| k == Path::new(fallback)) {
            kept.push(fallback.into());
        }
    }
    out.value = kept.iter().map(|p| p.to_string_lossy().into_owned()).collect::<Vec<_>>().join(":");
    out
}

/// Where a command sees the session's generated files (those of
/// [`etc_files`] and the copy of the git configuration,
/// `crate::gitconfig::SANDBOX_COPY_PATH`): one read-only directory, with
/// `/etc/passwd`, `/etc/group` and `/etc/hosts` links into it. One mount
/// instead of four: each mount makes bubblewrap read the whole mount table
/// again.
pub const ETC_DIR: &str = "/etc/pi-sandbox";

/// The generated `/etc/passwd`, `/etc/group` and `/etc/hosts`: the
/// sandbox's own user (the host's uid, home `/scratch`), root and nobody,
/// and `localhost` only. Nothing of the host's accounts or network.
pub fn etc_files(uid: u32, gid: u32, user: &str) -> [(&'static str, String); 3] {
    let user = if user.is_empty() || !user.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        "user"
    } else {
        user
    };
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
    let mut group = String::from("root:x:0:\n");
    if uid != 0 {
        passwd.push_str(&format!("{user}:x:{uid}:{gid}::{SCRATCH}:/bin/sh\n"));
    }
    if gid != 0 {
        group.push_str(&format!("{user}:x:{gid}:\n"));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    let hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_string();
    [("/etc/passwd", passwd), ("/etc/group", group), ("/etc/hosts", hosts)]
}

/// One command's start.
#[derive(Debug, Clone)]
pub struct Shell {
    /// The shell, by its path inside (the host's: `/usr` is the host's).
    pub shell: PathBuf,
    /// The command, with the user's prefix already in front.
    pub command: String,
    /// Its working directory (inside the project, at its host path).
    pub cwd: PathBuf,
    /// Every variable it gets beyond the policy's own.
    pub env: Vec<(String, String)>,
    /// The session's directory of generated files, shown at [`ETC_DIR`].
    pub etc_dir: PathBuf,
    /// Host trees it reads at their own paths (the system's
    /// configuration, `PATH` entries, the trusted extra read list).
    pub reads: Vec<PathBuf>,
}

/// The payload of `sh`: `shell -c command`, in its working directory,
/// under the policy's init (bubblewrap's, which reaps; when the shell
/// ends, the namespace ends and every process it left with it).
pub fn payload(sh: &Shell) -> Payload {
    Payload {
        runtime_mounts: vec![],
        code: vec![(sh.etc_dir.clone(), ETC_DIR.into())],
        links: etc_files(0, 0, "")
            .map(|(at, _)| {
                let name = Path::new(at).file_name().unwrap_or_default();
                (Path::new(ETC_DIR).strip_prefix("/etc").unwrap_or(Path::new(ETC_DIR)).join(name), at.into())
            })
            .into(),
        read_mounts: sh.reads.clone(),
        fd_mounts: vec![],
        env: sh.env.clone(),
        as_pid_1: false,
        chdir: Some(sh.cwd.clone()),
        argv: vec![sh.shell.clone().into(), OsString::from("-c"), sh.command.clone().into()],
    }
}

/// The descriptor a spare's reader reads the command from (a memfd the
/// host fills at the claim), and the pipe it waits on until then.
pub const COMMAND_FD: i32 = crate::bwrap::REQUEST_FD;
pub const GO_FD: i32 = crate::bwrap::REPLY_FD;

/// The shell that reads a spare's command: bash (its `read -d ''` reads a
/// seekable file in blocks, where a pipe costs one system call a byte).
pub fn reader_shell(exists: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    ["/bin/bash", "/usr/bin/bash"].into_iter().map(PathBuf::from).find(|p| exists(p))
}

/// The payload of a spare sandbox for `sh` (whose `command` is not known
/// yet): `reader` waits for a byte on [`GO_FD`], reads the whole command
/// from [`COMMAND_FD`], closes both, and execs exactly the argv
/// [`payload`] gives (`shell -c command`, `$0` the shell). Nothing of the
/// command runs before the host writes that byte. The variables bash
/// itself adds for the program it runs (`SHLVL`, `PWD`, `OLDPWD`) are
/// unset first unless the environment gave them, so the shell gets the
/// environment a cold start gives it; the reader's own variable gets a
/// name no variable of the environment has.
pub fn spare_payload(sh: &Shell, reader: &Path) -> Payload {
    let given = |n: &str| sh.env.iter().any(|(k, _)| k == n);
    let mut var = String::from("pi_sandbox_command");
    while given(&var) {
        var.push('_');
    }
    let unset: Vec<&str> = ["SHLVL", "PWD", "OLDPWD"].into_iter().filter(|n| !given(n)).collect();
    let unset = if unset.is_empty() { String::new() } else { format!("unset -v {}; ", unset.join(" ")) };
    let script = format!(
        "read -r -u {GO_FD} {var} || exit 125; IFS= read -r -d '' -u {COMMAND_FD} {var}; \
         exec {COMMAND_FD}<&- {GO_FD}<&-; {unset}exec \"$0\" -c \"${var}\""
    );
    Payload { argv: vec![reader.into(), OsString::from("-c"), script.into(), sh.shell.clone().into()], ..payload(sh) }
}

/// The shell to run: the user's when it is an absolute path the sandbox
/// shows (under the system trees or an extra read), else bash, else sh.
pub fn choose_shell(wanted: Option<&Path>, shown: &[PathBuf], exists: impl Fn(&Path) -> bool) -> PathBuf {
    if let Some(w) = wanted.filter(|w| w.is_absolute()) {
        let visible = SYSTEM_PREFIXES.iter().any(|s| w.starts_with(s)) || shown.iter().any(|r| w.starts_with(r));
        if visible && exists(w) {
            return w.to_path_buf();
        }
    }
    ["/bin/bash", "/usr/bin/bash", "/bin/sh"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| exists(p))
        .unwrap_or_else(|| "/bin/sh".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_path_keeps_system_entries_mounts_others_and_leaves_out_the_home() {
        let home = Path::new("/home/u");
        let sp = search_path(
            "/home/u/.cargo/bin:/usr/local/bin:/opt/tool/bin::rel:/usr/bin:/home/u/.nvm/bin:/usr/bin",
            Some(home),
            &["/home/u/.nvm".into()],
        );
        assert_eq!(sp.value, "/usr/local/bin:/opt/tool/bin:/usr/bin:/home/u/.nvm/bin:/bin");
        assert_eq!(sp.mounts, [PathBuf::from("/opt/tool/bin")]);
        assert_eq!(sp.left_out, [PathBuf::from("/home/u/.cargo/bin")]);
    }

    #[test]
    fn a_spare_reads_the_command_then_execs_the_argv_a_cold_start_gives() {
        let mut sh = Shell {
            shell: "/bin/sh".into(),
            command: String::new(),
            cwd: "/p".into(),
            env: vec![("PATH".into(), "/usr/bin".into()), ("pi_sandbox_command".into(), "x".into())],
            etc_dir: "/e".into(),
            reads: vec![],
        };
        let p = spare_payload(&sh, Path::new("/bin/bash"));
        let script = p.argv[2].to_string_lossy().into_owned();
        assert_eq!(p.argv[0], "/bin/bash");
        assert_eq!(p.argv[3], "/bin/sh", "$0 is the shell a cold start runs");
        // A name of the environment is never the reader's variable.
        assert!(script.contains("-u 3 pi_sandbox_command_;") && script.contains("\"$pi_sandbox_command_\""));
        assert!(script.contains("unset -v SHLVL PWD OLDPWD;"));
        sh.env.push(("SHLVL".into(), "4".into()));
        let script = spare_payload(&sh, Path::new("/bin/bash")).argv[2].to_string_lossy().into_owned();
        assert!(script.contains("unset -v PWD OLDPWD;"), "a variable the environment gives is kept: {script}");
        // Everything else is the cold payload's.
        let cold = payload(&sh);
        let warm = spare_payload(&sh, Path::new("/bin/bash"));
        assert_eq!((cold.env, cold.chdir, cold.read_mounts), (warm.env, warm.chdir, warm.read_mounts));
    }

    #[test]
    fn a_root_home_of_slash_leaves_nothing_out() {
        let sp = search_path("/usr/bin:/srv/bin", Some(Path::new("/")), &[]);
        assert_eq!(sp.left_out, Vec::<PathBuf>::new());
        assert_eq!(sp.mounts, [PathBuf::from("/srv/bin")]);
    }

    #[test]
    fn only_the_locale_terminal_and_pi_session_names_pass() {
        for ok in ["LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "USER"] {
            assert!(allowed_name(ok), "{ok}");
        }
        for no in ["OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "LD_PRELOAD", "PATH", "HOME", "SSH_AUTH_SOCK"] {
            assert!(!allowed_name(no), "{no}");
        }
        assert!(pi_session_name("PI_SESSION_ID"));
        assert!(!pi_session_name("PI_API_KEY"));
        assert!(!pi_session_name("PI_GITHUB_TOKEN"));
        assert!(!pi_session_name("ANTHROPIC_API_KEY"));
    }

    #[test]
    fn the_generated_etc_has_the_user_root_nobody_and_localhost_only() {
        let [(p, passwd), (g, group), (h, hosts)] = etc_files(1000, 1000, "alice");
        assert_eq!((p, g, h), ("/etc/passwd", "/etc/group", "/etc/hosts"));
        assert!(passwd.contains("alice:x:1000:1000::/scratch:/bin/sh\n"));
        assert_eq!(passwd.lines().count(), 3);
        assert_eq!(group.lines().count(), 3);
        assert!(!hosts.lines().any(|l| !l.contains("localhost")));
        let [(_, weird), ..] = etc_files(1000, 1000, "a:b\nroot:x:0");
        assert!(weird.contains("user:x:1000") && weird.lines().count() == 3);
        let [(_, root), (_, rgroup), _] = etc_files(0, 0, "root");
        assert_eq!((root.lines().count(), rgroup.lines().count()), (2, 2));
    }

    #[test]
    fn the_user_s_shell_is_used_only_where_the_sandbox_shows_it() {
        let all = |_: &Path| true;
        assert_eq!(choose_shell(Some(Path::new("/usr/bin/zsh")), &[], all), PathBuf::from("/usr/bin/zsh"));
        assert_eq!(choose_shell(Some(Path::new("/home/u/bin/fish")), &[], all), PathBuf::from("/bin/bash"));
        assert_eq!(choose_shell(Some(Path::new("zsh")), &[], all), PathBuf::from("/bin/bash"));
        let only_sh = |p: &Path| p == Path::new("/bin/sh");
        assert_eq!(choose_shell(None, &[], only_sh), PathBuf::from("/bin/sh"));
    }

    #[test]
    fn the_payload_is_the_shell_with_the_command_in_its_working_directory() {
        let sh = Shell {
            shell: "/bin/bash".into(),
            command: "echo hi".into(),
            cwd: "/home/u/proj/sub".into(),
            env: vec![("TERM".into(), "dumb".into())],
            etc_dir: "/run/s/shell-etc".into(),
            reads: vec!["/etc/ssl/certs".into()],
        };
        let p = payload(&sh);
        assert_eq!(p.argv, ["/bin/bash", "-c", "echo hi"].map(OsString::from));
        assert_eq!(p.chdir.as_deref(), Some(Path::new("/home/u/proj/sub")));
        assert!(!p.as_pid_1);
        // The generated files: one directory, and links into it.
        assert_eq!(p.code, [(PathBuf::from("/run/s/shell-etc"), PathBuf::from("/etc/pi-sandbox"))]);
        let links: Vec<(PathBuf, PathBuf)> =
            ["passwd", "group", "hosts"].map(|n| (format!("pi-sandbox/{n}").into(), format!("/etc/{n}").into())).into();
        assert_eq!(p.links, links);
        assert!(crate::gitconfig::SANDBOX_COPY_PATH.starts_with(&format!("{ETC_DIR}/")));
    }
}
