//! The trusted configuration file: what the user, and never the project,
//! says about the sandbox.
//!
//! One file, read at session start:
//! `<agent dir>/extensions/pi-python-sandbox/config.json`, where the agent
//! directory is pi's own (`PI_CODING_AGENT_DIR`, else `~/.pi/agent`: the
//! caller passes what pi's `getAgentDir()` says). A project's file of the
//! same name is never read (a cloned repository must not widen its own
//! sandbox): [`project`] looks for one, without following a link, so that
//! the user is told it is ignored.
//!
//! The file is strict JSON with a fixed schema ([`parse`]). Every error
//! names its key path, and the part of the configuration it is in gets its
//! most restrictive value ([`TrustedConfig::fall_back`]); the other parts
//! apply. A missing file is the defaults, with no error; a file that cannot
//! be read, is not a regular file, is larger than [`MAX_FILE_BYTES`], or
//! lies in the project where the sandbox could write it, is an error, and
//! every part is most restrictive. `PI_SANDBOX_BASH` sets `bash` too, and
//! wins over the file (see [`load`]).
//!
//! This module reads and judges; it does not apply: the bash tool's
//! JavaScript chooses its tool from [`Loaded`], and the engine mounts the
//! read paths through the same rules as every read root (host secrets
//! stay masked).

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod network;
mod node;
mod parse;
mod project;

pub use network::NetworkConfig;
pub use parse::{is_env_name, parse, read_path, refused_name, Parsed, MAX_ENTRY_BYTES, MAX_LIST, REFUSED_NAMES};
pub use project::{project_files, PROJECT_FILE_REL};

/// The file, relative to pi's agent directory.
pub const CONFIG_REL: &str = "extensions/pi-python-sandbox/config.json";
/// The largest file read (a configuration is a few hundred bytes).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// `0`, `false`, `off` or `no`: pi's own bash; `1`, `true`, `on` or `yes`:
/// the sandboxed one. Wins over the file's `bash`.
pub const BASH_ENV: &str = "PI_SANDBOX_BASH";

/// Where the model's `bash` tool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bash {
    /// This package's tool: each command in a sandbox (the default).
    Sandbox,
    /// pi's own tool, on the host.
    Host,
}

/// Where the user's `!cmd` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserBash {
    /// On the host, as pi runs it (the default: the user typed it).
    Host,
    /// In the sandbox, as the model's commands.
    Sandbox,
}

impl Bash {
    pub fn as_str(self) -> &'static str {
        match self {
            Bash::Sandbox => "sandbox",
            Bash::Host => "host",
        }
    }
}

impl UserBash {
    pub fn as_str(self) -> &'static str {
        match self {
            UserBash::Host => "host",
            UserBash::Sandbox => "sandbox",
        }
    }
}

/// Why the network is off when the whole file is in error (the error
/// itself is among the file's errors).
pub const NETWORK_OFF_REASON: &str = "the trusted configuration file has an error";

/// The parts of the configuration, each of which falls back on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Bash,
    UserBash,
    Filesystem,
    Env,
    Network,
}

impl Part {
    pub const ALL: &'static [Part] = &[Part::Bash, Part::UserBash, Part::Filesystem, Part::Env, Part::Network];
}

/// What the trusted configuration says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedConfig {
    pub bash: Bash,
    pub user_bash: UserBash,
    /// Host paths (absolute, normalised) the sandbox may read, at their
    /// own paths.
    pub additional_allow_read: Vec<PathBuf>,
    /// Names of pi's environment variables a sandboxed command gets.
    pub env_passthrough: Vec<String>,
    /// The sandboxes' network (`network`).
    pub network: NetworkConfig,
}

impl TrustedConfig {
    /// No file, or a file that sets nothing.
    pub const DEFAULT: TrustedConfig = TrustedConfig {
        bash: Bash::Sandbox,
        user_bash: UserBash::Host,
        additional_allow_read: Vec::new(),
        env_passthrough: Vec::new(),
        network: NetworkConfig::DEFAULT,
    };

    /// The defaults, with `parts` at their most restrictive.
    pub fn most_restrictive(parts: &[Part]) -> TrustedConfig {
        let mut c = TrustedConfig::DEFAULT;
        for p in parts {
            c.fall_back(*p);
        }
        c
    }

    /// Part `p` at its most restrictive: the model's bash sandboxed, the
    /// user's `!cmd` sandboxed too (a broken file never lets a command out
    /// of the sandbox that the file may have meant to keep in: the result
    /// names the error, and fixing the file restores the host), no extra
    /// reads, no environment, no network (the reason is set by whoever knows
    /// the error: [`Parsed`]).
    pub fn fall_back(&mut self, p: Part) {
        match p {
            Part::Bash => self.bash = Bash::Sandbox,
            Part::UserBash => self.user_bash = UserBash::Sandbox,
            Part::Filesystem => self.additional_allow_read.clear(),
            Part::Env => self.env_passthrough.clear(),
            Part::Network => {
                let reason = self.network.off_because.take();
                self.network = NetworkConfig::off(reason.unwrap_or_else(|| NETWORK_OFF_REASON.to_owned()));
            }
        }
    }
}

/// Why an entry of `filesystem.additionalAllowRead` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathProblem {
    Empty,
    Nul,
    TooLong,
    Relative,
    DotDot,
    Root,
}

impl PathProblem {
    fn says(self) -> String {
        match self {
            PathProblem::Empty => "is empty".into(),
            PathProblem::Nul => "holds a NUL byte".into(),
            PathProblem::TooLong => format!("is longer than {MAX_ENTRY_BYTES} bytes"),
            PathProblem::Relative => "is not an absolute path (write it from `/`; `~` is not expanded)".into(),
            PathProblem::DotDot => "has a `..` component (write the path it means)".into(),
            PathProblem::Root => "is the whole file system (name the directories to read)".into(),
        }
    }
}

/// What is wrong with the file or a setting. Each says where (the file, or
/// a key path such as `filesystem.additionalAllowRead[2]`) and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the agent directory `{}` is not an absolute path (set PI_CODING_AGENT_DIR to one)",
        crate::display::one_line(dir)
    )]
    AgentDirRelative { dir: PathBuf },
    #[error("cannot read the file: {reason}")]
    Unreadable { reason: String },
    #[error("the file is a link to `{}`, which does not exist", crate::display::one_line(target))]
    DanglingLink { target: PathBuf },
    #[error("the file is {what}, not a regular file")]
    NotRegular { what: &'static str },
    #[error("the file is larger than {max} bytes")]
    TooBig { max: u64 },
    #[error("the file is `{}`, inside the project, where the sandbox can write: it is not trusted (move the agent directory out of the project)", crate::display::one_line(real))]
    InsideProject { real: PathBuf },
    #[error("the file is not UTF-8")]
    NotUtf8,
    #[error("not valid JSON: {detail}")]
    Syntax { detail: String },
    #[error("{}: expected {expected}, found {found}", at(key))]
    WrongType { key: String, expected: &'static str, found: &'static str },
    #[error("{key}: unknown key (the keys here are {})", known.join(", "))]
    UnknownKey { key: String, known: &'static [&'static str] },
    #[error("{key}: duplicate key")]
    DuplicateKey { key: String },
    #[error("{key}: `{found}` is not one of {}", quoted(choices))]
    NotAChoice { key: String, found: String, choices: &'static [&'static str] },
    #[error("{}: {detail}", at(key))]
    Schema { key: String, detail: String },
    #[error("{key}: more than {max} entries")]
    TooMany { key: String, max: usize },
    #[error("{key}: `{}` {}", path.escape_debug(), problem.says())]
    Path { key: String, path: String, problem: PathProblem },
    #[error(
        "{key}: `{name}` is not an environment variable name (letters, digits and `_`, not starting with a digit)"
    )]
    EnvName { key: String, name: String },
    #[error("{key}: `{name}` is never passed: {why}")]
    EnvRefused { key: String, name: String, why: &'static str },
    #[error("{key}: `{}` {problem}", entry.escape_debug())]
    Entry { key: String, entry: String, problem: crate::network::policy::EntryError },
    #[error("{name}={value:?} is not `0`, `false`, `off`, `no`, `1`, `true`, `on` or `yes`: bash stays sandboxed")]
    BadEnvironment { name: &'static str, value: String },
}

fn at(key: &str) -> &str {
    if key.is_empty() {
        "the file"
    } else {
        key
    }
}

fn quoted(choices: &[&str]) -> String {
    choices.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ")
}

/// Where the value of `bash` in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Default,
    File,
    Environment,
    /// An error (in the file or the environment) made it most restrictive.
    Fallback,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File => "file",
            Source::Environment => "environment",
            Source::Fallback => "fallback",
        }
    }
}

/// What a session starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub config: TrustedConfig,
    pub bash_source: Source,
    /// The trusted file's path (read or not).
    pub path: PathBuf,
    /// The file was there and was read.
    pub found: bool,
    pub errors: Vec<ConfigError>,
    /// What the user is told once (a project's file ignored).
    pub notices: Vec<String>,
}

/// The configuration of a session: the trusted file under `agent_dir`,
/// then `bash_env` (the value of [`BASH_ENV`]; `None` or empty: unset).
/// `project` (the project directory, when there is one) is searched for
/// files that are ignored, and the trusted file must not lie in it.
///
/// The environment wins over the file for `bash`, both ways: it is set for
/// one run of pi (`PI_SANDBOX_BASH=0 pi` to compare with pi's own bash),
/// the file for every run. A value that is not a yes or a no is an error,
/// and `bash` is then sandboxed whatever the file says.
pub fn load(agent_dir: &Path, project: Option<&Path>, bash_env: Option<&str>) -> Loaded {
    let path = agent_dir.join(CONFIG_REL);
    let project_real = project.and_then(|p| std::fs::canonicalize(p).ok());
    let mut found = false;
    let parsed = match read(agent_dir, &path, project_real.as_deref()) {
        Ok(None) => parse("{}"),
        Ok(Some(text)) => {
            found = true;
            parse(&text)
        }
        Err(e) => {
            found = true;
            Parsed::whole_file(e)
        }
    };
    let Parsed { mut config, mut errors, set, fell_back } = parsed;
    let mut bash_source = if fell_back.contains(&Part::Bash) {
        Source::Fallback
    } else if set.contains(&Part::Bash) {
        Source::File
    } else {
        Source::Default
    };
    match bash_env.map(str::trim).filter(|v| !v.is_empty()) {
        None => {}
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "0" | "false" | "off" | "no" => (config.bash, bash_source) = (Bash::Host, Source::Environment),
            "1" | "true" | "on" | "yes" => (config.bash, bash_source) = (Bash::Sandbox, Source::Environment),
            _ => {
                errors.push(ConfigError::BadEnvironment { name: BASH_ENV, value: v.to_owned() });
                (config.bash, bash_source) = (Bash::Sandbox, Source::Fallback);
            }
        },
    }
    let notices = match project_real.as_deref() {
        Some(root) => project::notice(root, &path, project::LOOK_LIMITS).into_iter().collect(),
        None => Vec::new(),
    };
    Loaded { config, bash_source, path, found, errors, notices }
}

/// The trusted file's text; `None` when there is none. A link is followed
/// (a dotfile manager links the user's files from elsewhere): the user's
/// agent directory is theirs; what it ends at must be a regular file, and
/// not one in the project (`project`, real) outside a `.pi` directory (a
/// protected name at any depth, which the sandbox never writes).
fn read(agent_dir: &Path, path: &Path, project: Option<&Path>) -> Result<Option<String>, ConfigError> {
    if !agent_dir.is_absolute() {
        return Err(ConfigError::AgentDirRelative { dir: agent_dir.to_path_buf() });
    }
    let unreadable = |e: std::io::Error| ConfigError::Unreadable { reason: e.to_string() };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match std::fs::read_link(path) {
                Ok(target) => Err(ConfigError::DanglingLink { target }),
                Err(_) => Ok(None),
            };
        }
        Err(e) => return Err(unreadable(e)),
    };
    let meta = file.metadata().map_err(unreadable)?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a named pipe"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(ConfigError::NotRegular { what });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ConfigError::TooBig { max: MAX_FILE_BYTES });
    }
    if let Some(root) = project {
        // Where the open file really is (the links it came through resolved).
        let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(unreadable)?;
        if let Ok(rel) = real.strip_prefix(root) {
            // `.pi` is a protected name at any depth: read-only in the sandbox.
            let dirs = rel.parent().map(|d| d.components().collect::<Vec<_>>()).unwrap_or_default();
            if !dirs.iter().any(|c| c.as_os_str() == OsStr::new(".pi")) {
                return Err(ConfigError::InsideProject { real });
            }
        }
    }
    let mut data = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut data).map_err(unreadable)?;
    if data.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigError::TooBig { max: MAX_FILE_BYTES });
    }
    String::from_utf8(data).map(Some).map_err(|_| ConfigError::NotUtf8)
}

#[cfg(test)]
mod tests;
