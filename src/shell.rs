//! One command of the sandboxed `bash` tool: its own sandbox (the engine's
//! confinement with the project at its host path), its output streamed
//! through the engine's text rule and capped, its end (exit, signal,
//! timeout, abort, flood, a secret that appeared) and what the result
//! adds: protected names made inert, and the paths and commands the
//! sandbox does not show, with how to show them. A command never runs
//! twice, and never on the host.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::bwrap::bwrap_argv;
use crate::confine::{self, Confined, HostFacts};
use crate::limits::{CLEANUP_DEADLINE, SHELL_OUTPUT_CAP_BYTES};
use crate::network::decide::SystemResolver;
use crate::nshelper::listen::PROXY_PORT;
use crate::permissions::MountConfig;
use crate::protected;
use crate::rundir::Dirs;
use crate::runtime::shell::{self as payload, Shell};
use crate::spawn::{kill_group, prepare_inside_with, spawn_sandbox};

pub mod hints;
mod start;

pub use start::{make_spare, Spare};
use start::{start, Inputs, Runs, Started};

/// The output cap of one command, when not [`SHELL_OUTPUT_CAP_BYTES`].
pub use crate::options::MAX_OUTPUT_ENV;

/// The output cap in force: the setting, or the default.
fn output_cap() -> Result<usize, ShellError> {
    match std::env::var(MAX_OUTPUT_ENV) {
        Err(_) => Ok(SHELL_OUTPUT_CAP_BYTES),
        Ok(v) => crate::limits::parse_size(&v).and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
            not_started(format!(
                "{MAX_OUTPUT_ENV}={} is not a size (bytes, or a whole number with K, M or G)",
                crate::display::one_line(&v)
            ))
        }),
    }
}

/// What the trusted configuration adds to every command's sandbox.
#[derive(Debug, Clone, Default)]
pub struct ShellConfig {
    /// Host trees shown read-only at their paths (tools under the home
    /// directory, say).
    pub additional_reads: Vec<PathBuf>,
    /// Host variables a command gets by name.
    pub passthrough: Vec<String>,
    /// Where the trusted configuration is, for the hints that name it.
    pub config_path: Option<PathBuf>,
    /// The proxy's policy when commands have a network (`network.mode`
    /// `"proxy"`); none: no network at all.
    pub network: Option<crate::network::proxy::Policy>,
    /// Why commands have no network when the configuration's network part
    /// is in error (said in every result).
    pub network_off: Option<String>,
    /// `network.python`: the python tool's sandbox gets `network` too
    /// (from its next start).
    pub python_network: bool,
}

/// Where a command runs: the session's facts, directories and mounts.
pub struct Context<'a> {
    pub host: &'a HostFacts,
    pub dirs: &'a Dirs,
    /// The canonical project directory.
    pub project: &'a Path,
    pub mounts: &'a MountConfig,
    pub tainted: protected::Tainted,
    pub known: protected::KnownSecrets,
    pub config: &'a ShellConfig,
    /// The read-only project's walk, kept between the session's commands.
    pub plans: &'a confine::PlanCache,
    /// The host-secret check of the trees a command reads, kept between
    /// the session's commands.
    pub kept_reads: &'a crate::hostsecrets::KeptReads,
    /// The network destinations granted for the rest of the session.
    pub net_grants: &'a crate::network::review::SessionGrants,
}

/// One command, as the tool hands it over.
#[derive(Debug, Clone)]
pub struct Command {
    /// The command, with the user's prefix already in front.
    pub command: String,
    /// pi's working directory for it.
    pub cwd: PathBuf,
    /// The user's shell setting, if any.
    pub shell: Option<PathBuf>,
    pub timeout: Option<Duration>,
    /// pi's own session variables (`PI_*`), by name and value.
    pub pi_env: Vec<(String, String)>,
    /// The network review's dialog and the session's yolo mode.
    pub reviewing: crate::network::review::Reviewing,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signalled(i32),
    /// Its timeout passed; every process of it was killed.
    TimedOut,
    /// The caller aborted it; every process of it was killed.
    Aborted,
    /// It wrote more than the output cap; it was killed.
    Flooded,
    /// A watch stopped it (a secret appeared; the text says which).
    Stopped(String),
}

impl Ending {
    /// The exit code pi's bash contract gives it: the code, or 128 plus
    /// the signal (a kill is SIGKILL's).
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Ending::Exited(c) => Some(*c),
            Ending::Signalled(s) => Some(128 + s),
            Ending::Flooded | Ending::Stopped(_) => Some(128 + 9),
            Ending::TimedOut | Ending::Aborted => None,
        }
    }
}

/// A command's end and what its result adds.
#[derive(Debug, Clone)]
pub struct Ended {
    pub ending: Ending,
    /// Sentences for the end of the result, already made safe.
    pub notes: Vec<String>,
    /// A watch stopped it because a secret appeared: what it wrote to
    /// `/scratch` may hold it.
    pub secret_appeared: bool,
}

/// Why a command was not run.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// No sandbox could be made; the text says why and what to do. The
    /// command did not run anywhere.
    #[error("{0}")]
    NotStarted(String),
}

fn not_started(why: impl std::fmt::Display) -> ShellError {
    ShellError::NotStarted(format!(
        "The command was not run (the sandbox could not start; it never runs on the host): {why}"
    ))
}

/// The generated files of the session's shells, made once: `/etc/passwd`,
/// `/etc/group`, `/etc/hosts`, and the copy of the user's git
/// configuration (`crate::gitconfig::sandbox_copy`), in one directory that
/// commands see at `payload::ETC_DIR`. By path, on purpose: the session
/// directory is the host's (0700, made by `rundir`), and no sandbox can
/// write in it (they see its `scratch` child only), so nothing there can be
/// a link a sandbox planted. Returns the directory.
fn session_files(dirs: &Dirs) -> std::io::Result<PathBuf> {
    let dir = dirs.root.join("shell-etc");
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_default();
    let files = payload::etc_files(nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw(), &user);
    for (at, text) in files {
        let name = Path::new(at).file_name().unwrap_or_default();
        let host = dir.join(name);
        if std::fs::read_to_string(&host).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&host, text)?;
        }
    }
    crate::gitconfig::write_sandbox_copy(&dir)?;
    Ok(dir)
}

/// The command's working directory inside: pi's, which must be in the
/// project (the sandbox shows nothing else writable or at that path).
fn working_dir(cwd: &Path, project: &Path) -> Result<PathBuf, ShellError> {
    let canonical = std::fs::canonicalize(cwd).map_err(|e| {
        not_started(format!("the working directory {} is not accessible: {e}", crate::display::one_line(cwd)))
    })?;
    if !canonical.starts_with(project) {
        return Err(not_started(format!(
            "the working directory {} is outside the project {}, the only tree a command sees at its own path",
            crate::display::one_line(&canonical),
            crate::display::one_line(project)
        )));
    }
    Ok(canonical)
}

/// The host trees a command reads at their paths: the system's
/// configuration, `PATH` entries outside the system trees, the trusted
/// extra reads. Never one a sandbox tree or a host secret covers, never
/// one of the engine's own mount points.
fn reads(
    ctx: &Context<'_>,
    path_mounts: &[PathBuf],
    secrets: &crate::hostsecrets::HostSecrets,
    notes: &mut Vec<String>,
) -> Vec<PathBuf> {
    let runtime_root = ctx.dirs.root.parent().unwrap_or(&ctx.dirs.root);
    let mut out: Vec<PathBuf> = Vec::new();
    let covering = secrets.coverer();
    let system = payload::SYSTEM_READS.iter().map(PathBuf::from);
    let extra = ctx.config.additional_reads.iter().cloned();
    for p in system.chain(path_mounts.iter().cloned()).chain(extra) {
        // The engine's own mount points, the project and the session's
        // directories are mounted already (a tree above one of them would
        // cover it, read-only).
        let own = crate::bwrap::RESERVED_MOUNTS.iter().any(|r| p.starts_with(r))
            || p.starts_with(ctx.project)
            || p.starts_with(runtime_root);
        let above = p == Path::new("/") || ctx.project.starts_with(&p) || runtime_root.starts_with(&p);
        if out.contains(&p) {
            continue;
        }
        if own {
            let shown_anyway = p.starts_with("/usr") || p.starts_with(ctx.project);
            if ctx.config.additional_reads.contains(&p) && !shown_anyway {
                notes.push(format!(
                    "{} (filesystem.additionalAllowRead) is not shown: it is under one of the sandbox's own mount \
                     points (/tmp and /dev are private to each command, /proc is its own, /scratch is the session's).",
                    crate::display::one_line(&p)
                ));
            }
            continue;
        }
        if above {
            if ctx.config.additional_reads.contains(&p) {
                notes.push(format!(
                    "{} (filesystem.additionalAllowRead) is not shown: it holds the project or the session's \
                     directory, which a read-only view of it would cover; name the directories inside it instead.",
                    crate::display::one_line(&p)
                ));
            }
            continue;
        }
        // Only what this process can reach: bubblewrap's `-try` skips a
        // missing source, not one it may not look at (a PATH entry under
        // another user's home), which would stop every command.
        if let Err(e) = std::fs::metadata(&p) {
            if ctx.config.additional_reads.contains(&p) {
                notes.push(format!(
                    "{} (filesystem.additionalAllowRead) is not shown: {e}.",
                    crate::display::one_line(&p)
                ));
            }
            continue;
        }
        if let Some(entry) = covering.covering(&p) {
            notes.push(format!(
                "{} is not shown: it is a host secret ({}) that no setting mounts.",
                crate::display::one_line(&p),
                entry.shown()
            ));
            continue;
        }
        out.push(p);
    }
    out
}

/// The environment of a command: the allowlist, with the host's values;
/// pi's session variables; the trusted pass-through names.
fn environment(cmd: &Command, config: &ShellConfig, path: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![("PATH".into(), path.into())];
    for (name, value) in std::env::vars_os().filter_map(|(n, v)| Some((n.into_string().ok()?, v.into_string().ok()?))) {
        let passed = config.passthrough.contains(&name)
            && crate::config::is_env_name(&name)
            && crate::config::refused_name(&name).is_none();
        if payload::allowed_name(&name) || passed {
            env.push((name, value));
        }
    }
    for (name, value) in &cmd.pi_env {
        if payload::pi_session_name(name) && !env.iter().any(|(n, _)| n == name) {
            env.push((name.clone(), value.clone()));
        }
    }
    for name in ["TMP", "TEMP"] {
        env.push((name.into(), "/tmp".into()));
    }
    env.push(("GIT_CONFIG_NOSYSTEM".into(), "1".into()));
    env.push(("GIT_CONFIG_GLOBAL".into(), crate::gitconfig::SANDBOX_COPY_PATH.into()));
    env
}

/// Run `cmd` in a sandbox of its own, handing each piece of its output
/// (made safe) to `on_data`, until it ends, its timeout passes, `cancel`
/// turns true, or it writes more than the cap. With `spare`, a sandbox
/// started ahead of need: used when it was made for the same inputs and
/// the project's walk it has is still right, else killed (the command
/// starts cold). Whether it was used is the second value.
pub async fn run(
    ctx: Context<'_>,
    cmd: Command,
    on_data: &(dyn Fn(String) + Send + Sync),
    mut cancel: watch::Receiver<bool>,
    spare: Option<Spare>,
) -> Result<(Ended, bool), ShellError> {
    let cap = output_cap()?;
    let inputs = Inputs::gather(&ctx, &cmd)?;
    let mut from_spare = false;
    let claimed = match spare {
        Some(s) if s.key == inputs.key(&ctx) => {
            let (plans, project) = (ctx.plans.clone(), ctx.project.to_path_buf());
            let plan = s.started.as_ref().and_then(|s| Some((s.plan_key.clone(), s.walk?)));
            let right =
                tokio::task::spawn_blocking(move || plan.is_some_and(|(k, made)| plans.keeps(&k, made, &project)))
                    .await
                    .unwrap_or(false);
            if right {
                s.claim(&cmd.command, ctx.kept_reads, &start::granted_masks(&ctx, &inputs))
            } else {
                None
            }
        }
        _ => None,
    };
    let started = match claimed {
        Some(s) => {
            from_spare = true;
            s
        }
        None => start(&ctx, &inputs, Runs::Command(cmd.command.clone())).await?,
    };
    let Inputs { search, mut notes, reads, .. } = inputs;
    let Started {
        mut child,
        pid,
        stdout,
        stderr,
        listener,
        guard,
        project_watch,
        watches,
        killed_for,
        secret_appeared,
        start_notes,
        plan_notes,
        mut contained,
        ..
    } = started;
    notes.extend(start_notes);
    if let Some(why) = &ctx.config.network_off {
        notes.push(format!("The command had no network: {}.", crate::display::one_line(why.trim_end_matches('.'))));
    }
    let proxy = match (listener, &ctx.config.network) {
        (Some(Ok(fd)), Some(net)) => match tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd)) {
            Ok(l) => {
                let policy = crate::network::proxy::Policy { yolo: cmd.reviewing.yolo, ..net.clone() };
                let desk = crate::network::review::Desk::new(cmd.reviewing.ask.clone(), ctx.net_grants.clone());
                Some(crate::network::proxy::serve(l, policy, SystemResolver, desk))
            }
            Err(e) => {
                notes.push(format!("The command had no network: its proxy could not serve its listener ({e})."));
                None
            }
        },
        (Some(Err(e)), _) => {
            notes.push(format!("The command had no network: {e}."));
            None
        }
        _ => None,
    };
    let mut out = Streams::new(cap);
    let deadline = cmd.timeout.map(|t| tokio::time::Instant::now() + t);
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let (mut stdout, mut stderr) = (stdout, stderr);
    let (mut out_buf, mut err_buf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let (mut out_open, mut err_open) = (true, true);
    let mut status = None;
    let mut stopped: Option<Ending> = None;
    // After the sandbox ended, what is left in the pipes is read within a
    // bound (its namespace is gone, so no writer is left but a stray
    // descriptor's).
    let drained = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drained);
    // Read both streams until the sandbox has ended and both are closed
    // (when the shell ends, its namespace and every process in it do).
    while out_open || err_open || status.is_none() {
        let (which, read) = tokio::select! {
            n = stdout.read(&mut out_buf), if out_open => (0, n),
            n = stderr.read(&mut err_buf), if err_open => (1, n),
            s = child.wait(), if status.is_none() => {
                status = Some(s.ok());
                drained.as_mut().reset(tokio::time::Instant::now() + CLEANUP_DEADLINE);
                continue;
            },
            _ = &mut drained, if status.is_some() => {
                (out_open, err_open) = (false, false);
                continue;
            },
            _ = &mut sleep, if stopped.is_none() => {
                stopped = Some(Ending::TimedOut);
                kill_group(pid);
                continue;
            },
            r = cancel.changed(), if stopped.is_none() => {
                if r.is_err() || *cancel.borrow() {
                    stopped = Some(Ending::Aborted);
                    kill_group(pid);
                }
                continue;
            },
        };
        let bytes = match read {
            Ok(0) | Err(_) => {
                *(if which == 0 { &mut out_open } else { &mut err_open }) = false;
                continue;
            }
            Ok(n) => {
                if which == 0 {
                    &out_buf[..n]
                } else {
                    &err_buf[..n]
                }
            }
        };
        if !out.push(which, bytes, on_data) && stopped.is_none() {
            stopped = Some(Ending::Flooded);
            kill_group(pid);
        }
    }
    out.finish(on_data);
    drop(watches);
    // Whatever is left of the namespace goes now (a watch's kill, a
    // flood's), before the guard looks at the project once more.
    kill_group(pid);
    let mut ended_notes = Vec::new();
    if let Some(guard) = guard {
        // The watch covers every directory the walk entered: the protected
        // names it saw appear are made inert (and the walk is kept for the
        // next command). Else the whole check.
        let found = Arc::new(parking_lot::Mutex::new(protected::NoteList::default()));
        let sink = found.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if !project_watch.is_some_and(|w| w.protection_kept(|rels| guard.settle_named(rels))) {
                protected::settle_and_check(&guard, None, &sink);
            }
        })
        .await;
        ended_notes.extend(found.lock().take());
    }
    ended_notes.extend(plan_notes.lock().take());
    let watch_said = killed_for.lock().take();
    let appeared = secret_appeared.load(Ordering::Acquire);
    let ending = match (stopped, watch_said) {
        (Some(e), _) => e,
        (None, Some(why)) => Ending::Stopped(why.to_string()),
        (None, None) => match status.flatten() {
            Some(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                (Some(c), _) => Ending::Exited(c),
                (None, Some(sig)) => Ending::Signalled(sig),
                (None, None) => Ending::Exited(-1),
            },
            None => Ending::Exited(-1),
        },
    };
    if let Some(proxy) = proxy {
        ended_notes.extend(proxy.summary().lines());
    }
    if let Some(oom) = contained.oom_note(true) {
        ended_notes.push(oom);
    }
    drop(contained);
    notes.extend(ended_notes);
    match &ending {
        Ending::Flooded => notes.push(format!(
            "The command was stopped: it wrote more than {} of output (the cap of one command). Write big output to \
             a file and look at parts of it.",
            crate::display::format_size(cap)
        )),
        Ending::Stopped(why) => notes.push(format!("The command was stopped: {why}.")),
        _ => {}
    }
    if matches!(ending, Ending::Exited(c) if c != 0) {
        let sandbox = hints::Shown { project: ctx.project, reads: &reads, mounts: ctx.mounts };
        notes.extend(hints::hints(&out.tail(), &sandbox, &search.left_out, ctx.config.config_path.as_deref()));
    }
    Ok((Ended { ending, notes, secret_appeared: appeared }, from_spare))
}

/// The two streams of a command on their way to `on_data`: each made safe
/// with its own state (a sequence split between two reads is one), their
/// total capped, and the last few KiB kept for the hints.
struct Streams {
    text: [crate::display::StreamText; 2],
    /// Bytes read from the command, and bytes of text passed on (a control
    /// character is shown in up to four times its bytes, a carriage
    /// return may show as nothing): the cap bounds both.
    total: usize,
    shown: usize,
    cap: usize,
    tail: std::collections::VecDeque<u8>,
}

/// How much of the end of the output the hints look at.
const TAIL_BYTES: usize = 8 * 1024;

impl Streams {
    fn new(cap: usize) -> Streams {
        Streams {
            text: [crate::display::StreamText::new(), crate::display::StreamText::new()],
            total: 0,
            shown: 0,
            cap,
            tail: Default::default(),
        }
    }

    /// Pass on `bytes` of stream `which`; false once past the cap (what
    /// is past it is dropped).
    fn push(&mut self, which: usize, bytes: &[u8], on_data: &(dyn Fn(String) + Send + Sync)) -> bool {
        let room = self.cap.saturating_sub(self.total);
        let take = &bytes[..bytes.len().min(room)];
        self.total += take.len();
        self.tail.extend(take.iter().copied());
        let excess = self.tail.len().saturating_sub(TAIL_BYTES);
        self.tail.drain(..excess);
        let mut text = self.text[which].push(take);
        let shown_room = self.cap.saturating_sub(self.shown);
        let fits = text.len() <= shown_room;
        if !fits {
            let mut end = shown_room;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        self.shown += text.len();
        if !text.is_empty() {
            on_data(text);
        }
        fits && take.len() == bytes.len()
    }

    fn finish(&mut self, on_data: &(dyn Fn(String) + Send + Sync)) {
        for t in &mut self.text {
            let text = t.finish();
            if !text.is_empty() {
                on_data(text);
            }
        }
    }

    /// The end of the raw output (for the hints; never shown as is).
    fn tail(&self) -> String {
        let (a, b) = self.tail.as_slices();
        let mut v = a.to_vec();
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Everything `push` passes on for `chunks` under `cap`, and whether the last push fit.
    fn passed(cap: usize, chunks: &[&[u8]]) -> (String, bool) {
        let got = Mutex::new(String::new());
        let on_data = |t: String| got.lock().unwrap().push_str(&t);
        let mut s = Streams::new(cap);
        let mut fit = true;
        for c in chunks {
            fit = s.push(0, c, &on_data);
        }
        let text = got.lock().unwrap().clone();
        (text, fit)
    }

    #[test]
    fn the_cap_bounds_the_text_passed_on_as_well_as_the_bytes_read() {
        // A C1 control (2 bytes) is shown as `<U+009B>` (8 bytes): 13 lines of 15 bytes read
        // would pass 741 bytes.
        let line = [&b"\xc2\x9b".repeat(7)[..], b"\n"].concat();
        let c1 = line.repeat(100);
        let (text, fit) = passed(200, &[&c1]);
        assert!(!fit);
        assert!(text.len() <= 200, "{} bytes passed", text.len());
        assert!(text.starts_with("<U+009B>"), "{text}");
        // Carriage returns show as nothing: the bytes read still count.
        let (text, fit) = passed(64, &[&[b'\r'; 100]]);
        assert!(!fit);
        assert!(text.is_empty());
        // Within the cap, all passes.
        let (text, fit) = passed(64, &[b"hello\n", b"world\n"]);
        assert!(fit);
        assert_eq!(text, "hello\nworld\n");
    }
}
