//! The start of a command's sandbox, and the spare: a sandbox started
//! ahead of need for the session's next command, whose payload waits for
//! the command's text (see [`Spare`]).

use super::*;

/// What a command's sandbox is made from, gathered for each command: a
/// spare is used only when the command's inputs give the key it was made
/// under.
pub(super) struct Inputs {
    pub(super) cwd: PathBuf,
    pub(super) settings: crate::options::Settings,
    pub(super) search: payload::SearchPath,
    pub(super) secrets: crate::hostsecrets::HostSecrets,
    /// Sentences about what is not shown (for the result).
    pub(super) notes: Vec<String>,
    pub(super) reads: Vec<PathBuf>,
    pub(super) etc_dir: PathBuf,
    pub(super) shell: PathBuf,
    pub(super) env: Vec<(String, String)>,
    /// Which directories the project and the working directory are (their
    /// device and inode): another one put at the same path is not the one
    /// a sandbox made before has mounted.
    pub(super) dir_ids: [Option<(u64, u64)>; 2],
}

impl Inputs {
    pub(super) fn gather(ctx: &Context<'_>, cmd: &Command) -> Result<Inputs, ShellError> {
        let cwd = working_dir(&cmd.cwd, ctx.project)?;
        let settings = crate::options::Settings::from_env();
        let home = settings.home.clone();
        let search = payload::search_path(
            &std::env::var("PATH").unwrap_or_default(),
            home.as_deref(),
            &ctx.config.additional_reads,
        );
        let secrets = confine::host_secrets(&settings, ctx.dirs, ctx.project);
        let mut notes = Vec::new();
        let reads = reads(ctx, &search.mounts, &secrets, &mut notes);
        let etc_dir =
            session_files(ctx.dirs).map_err(|e| not_started(format!("its /etc files could not be written: {e}")))?;
        let shell = payload::choose_shell(cmd.shell.as_deref(), &reads, |p| p.exists());
        let mut env = environment(cmd, ctx.config, &search.value);
        if ctx.config.network.is_some() {
            env.extend(crate::network::proxy::environment(PROXY_PORT));
        }
        let dir_ids = [crate::paths::dir_id(ctx.project), crate::paths::dir_id(&cwd)];
        Ok(Inputs { cwd, settings, search, secrets, notes, reads, etc_dir, shell, env, dir_ids })
    }

    /// Everything the sandbox is made from besides the command's text: the
    /// session's mode and mounts (read roots, grants), the configuration
    /// (network, extra reads, pass-through names), the working directory,
    /// the environment, the shell, the host secrets, what the project's
    /// walk is keyed by, which directories the project and the working
    /// directory are.
    pub(super) fn key(&self, ctx: &Context<'_>) -> String {
        let known = ctx.known.lock();
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{:?}",
            ctx.project,
            ctx.mounts,
            ctx.config,
            self.cwd,
            self.shell,
            self.env,
            self.reads,
            self.etc_dir,
            self.settings,
            self.secrets,
            ctx.tainted.lock(),
            known.masks,
            known.idents.len(),
            self.dir_ids
        )
    }
}

/// A command's sandbox once bubblewrap has made it and the host has
/// prepared and released it: its payload runs (the command, or a spare's
/// reader waiting for one).
pub(super) struct Started {
    pub(super) child: crate::spawn::SandboxChild,
    pub(super) pid: i32,
    pub(super) stdout: tokio::net::unix::pipe::Receiver,
    pub(super) stderr: tokio::net::unix::pipe::Receiver,
    pub(super) listener: Option<Result<std::os::fd::OwnedFd, crate::nshelper::HelperError>>,
    pub(super) guard: Option<Arc<protected::Guard>>,
    /// The project's secret watch (kept with its walk).
    pub(super) project_watch: Option<Arc<protected::SecretWatch>>,
    /// The watches of the project and the host secrets.
    pub(super) watches: Watching,
    pub(super) killed_for: protected::KillSlot,
    pub(super) secret_appeared: Arc<AtomicBool>,
    /// A spare's look at the host-secret watch points, asked at its claim.
    pub(super) sentinel: Option<crate::hostsecrets::Sentinel>,
    /// The kept check of the trees it reads that its masks come from.
    pub(super) reads_check: Option<u64>,
    /// A spare's masks of the host secrets in the granted trees.
    pub(super) granted: Vec<crate::hostsecrets::Mask>,
    /// The kept walk of the project its masks come from.
    pub(super) walk: Option<u64>,
    /// What the start says in the result.
    pub(super) start_notes: Vec<String>,
    pub(super) plan_notes: protected::Notes,
    pub(super) contained: crate::contain::Contained,
    pub(super) plan_key: String,
}

/// The watches of a started sandbox: running, or (a spare's) to start at
/// its claim.
pub(super) enum Watching {
    /// Running while this is kept (dropping it ends them).
    Running {
        _watches: crate::watches::Watches,
    },
    Claim(crate::watches::Armed),
}

/// Start the watches of `armed`, with the guard armed on its sandbox.
fn arm(armed: crate::watches::Armed) -> crate::watches::Watches {
    if let Some(g) = &armed.guard {
        g.arm(armed.pid, armed.killed_for.clone());
        g.set_budget(armed.budget.clone());
    }
    crate::watches::start(armed)
}

/// What a start runs: the command, or a spare's reader with its two
/// descriptors (see `payload::spare_payload`).
pub(super) enum Runs {
    Command(String),
    Reader(PathBuf, [std::os::fd::OwnedFd; 2]),
}

/// The masks of the host secrets in the granted trees (read roots,
/// allow-once directories) as they are now.
pub(super) fn granted_masks(ctx: &Context<'_>, inputs: &Inputs) -> Vec<crate::hostsecrets::Mask> {
    let (_, runtime_root) = confine::sandbox_trees(ctx.dirs, ctx.project);
    confine::host_masks(&inputs.secrets, ctx.mounts, &[ctx.project, runtime_root.as_path()])
}

/// Make the sandbox for `inputs`, run `runs` in it.
pub(super) async fn start(ctx: &Context<'_>, inputs: &Inputs, runs: Runs) -> Result<Started, ShellError> {
    let runs_reader = matches!(runs, Runs::Reader(..));
    // The host secrets in the granted trees, before and after the spare's
    // sentinel is made (below): the same both times, none appeared before
    // the sentinel could see it.
    let granted_masks = || granted_masks(ctx, inputs);
    let granted_before = if runs_reader { granted_masks() } else { Vec::new() };
    // The check of the trees it reads that a spare's masks come from: the
    // one kept before and after its confinement (else none it can be
    // told from).
    let reads_before = ctx.kept_reads.kept();
    let walk_before = ctx.plans.kept();
    let plan_notes = protected::Notes::default();
    let confined = confine::confine(confine::Request {
        host: ctx.host,
        dirs: ctx.dirs,
        project: ctx.project,
        project_at: ctx.project,
        project_names: &[],
        mounts: ctx.mounts,
        notes: plan_notes.clone(),
        tainted: ctx.tainted.clone(),
        known: ctx.known.clone(),
        payload_reads: &inputs.reads,
        runtime_mounts: &[],
        settings: inputs.settings.clone(),
        secrets: inputs.secrets.clone(),
        cache: Some(ctx.plans),
        kept_reads: Some(ctx.kept_reads),
        seccomp: match ctx.config.network {
            Some(_) => crate::seccomp::Profile::ShellNet,
            None => crate::seccomp::Profile::Shell,
        },
    })
    .await
    .map_err(not_started)?;
    let Confined {
        policy,
        mount_fds,
        secret_watch,
        masks_watch,
        guard,
        watcher,
        plan_notes: start_notes,
        mut contained,
        budget,
        plan_key,
        ..
    } = confined;
    let sh = Shell {
        shell: inputs.shell.clone(),
        command: String::new(),
        cwd: inputs.cwd.clone(),
        env: inputs.env.clone(),
        etc_dir: inputs.etc_dir.clone(),
        reads: inputs.reads.clone(),
    };
    let (argv, channel) = match runs {
        Runs::Command(command) => {
            (bwrap_argv(&policy, &payload::payload(&Shell { command, ..sh })), crate::spawn::Channel::None)
        }
        Runs::Reader(reader, fds) => {
            (bwrap_argv(&policy, &payload::spare_payload(&sh, &reader)), crate::spawn::Channel::Given(fds))
        }
    };
    let filter =
        crate::seccomp::bpf_memfd(policy.seccomp).map_err(|e| not_started(format!("its seccomp filter: {e}")))?;
    let mut child = spawn_sandbox(&ctx.host.bwrap.path, &argv, filter, mount_fds, contained.take_join(), channel)
        .map_err(|e| not_started(format!("bubblewrap could not be started: {e}")))?;
    let held = policy.held_mounts();
    let steps = crate::inotify::cap_steps(ctx.host.inotify_share);
    let listen = ctx.config.network.as_ref().map(|_| PROXY_PORT);
    let (prepared, listener) =
        match prepare_inside_with(child.info, &child.release, &policy.held_rlimits(), held, steps, listen).await {
            Ok(listener) => (Ok(()), listener),
            Err(why) => (Err(why), None),
        };
    if let Err(why) = prepared {
        kill_group(child.pid);
        let mut err = String::new();
        let _ = tokio::time::timeout(CLEANUP_DEADLINE, async {
            let _ = (&mut child.stderr).take(8192).read_to_string(&mut err).await;
            let _ = child.child.wait().await;
        })
        .await;
        let said = crate::display::displayed(err.trim().to_string());
        let mut msg = if said.is_empty() { why.to_string() } else { format!("{why}; bubblewrap said: {said}") };
        if let Some(hint) = crate::probe::namespace_hint(&said) {
            let stop = if msg.ends_with('.') { "" } else { "." };
            msg = format!("{msg}{stop}\n{hint}");
        }
        return Err(not_started(msg));
    }
    // No frames: the request and reply pipes close on our side.
    drop((child.requests, child.replies));
    let pid = child.pid;
    let killed_for: protected::KillSlot = Arc::default();
    let secret_appeared = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(protected::Budget::new(budget, pid, killed_for.clone()));
    let project_watch = masks_watch.clone();
    let reads_check = reads_before.filter(|b| ctx.kept_reads.kept() == Some(*b));
    let walk = walk_before.filter(|b| ctx.plans.kept() == Some(*b));
    // A spare that cannot watch where a host secret could appear is not
    // made (none could tell at its claim that one did).
    let sentinel = match &runs_reader {
        false => None,
        true => {
            match crate::hostsecrets::Sentinel::new(&secret_watch).filter(|_| granted_masks() == granted_before) {
                Some(s) => Some(s),
                None => {
                    kill_group(pid);
                    return Err(not_started("a host secret may have appeared while a spare was made, or its watch points could not be watched"));
                }
            }
        }
    };
    let armed = crate::watches::Armed {
        pid,
        guard: guard.clone(),
        watcher,
        secret_watch,
        masks_watch,
        budget,
        killed_for: killed_for.clone(),
        secret_appeared: secret_appeared.clone(),
    };
    // A spare's watches start at its claim: until then no code runs in it,
    // and a name the host makes in the project is the host's (the guard
    // would take a protected one for the sandbox's and make it inert).
    let watches = match runs_reader {
        true => Watching::Claim(armed),
        false => Watching::Running { _watches: arm(armed) },
    };
    Ok(Started {
        pid,
        child: child.child,
        stdout: child.stdout,
        stderr: child.stderr,
        listener,
        guard,
        project_watch,
        watches,
        killed_for,
        secret_appeared,
        sentinel,
        reads_check,
        granted: granted_before,
        walk,
        start_notes,
        plan_notes,
        contained,
        plan_key,
    })
}

/// A sandbox started ahead of need for the session's next command, made
/// like a command's own, whose payload is a reader that waits for the
/// command (`payload::spare_payload`): it runs nothing of a command before
/// [`Spare::claim`], and serves one command at most. Dropped unclaimed,
/// every process of it is killed, and its cgroup removed.
pub struct Spare {
    pub(super) key: String,
    pub(super) started: Option<Started>,
    /// The host's end of the memfd the reader reads the command from.
    command: std::fs::File,
    /// The pipe the reader waits on.
    go: Option<std::os::fd::OwnedFd>,
}

impl Spare {
    /// Bubblewrap's pid (its process group is the sandbox's).
    pub fn pid(&self) -> Option<i32> {
        self.started.as_ref().map(|s| s.pid)
    }

    /// Hand `command` over: the reader runs it. `None` when the reader is
    /// gone, or `granted` (the masks of the host secrets in the granted
    /// trees now) are not the ones it was made with (nothing of the
    /// command ran: the caller starts it cold).
    pub(super) fn claim(
        mut self,
        command: &str,
        kept_reads: &crate::hostsecrets::KeptReads,
        granted: &[crate::hostsecrets::Mask],
    ) -> Option<Started> {
        use std::os::unix::fs::FileExt;
        let mut started = self.started.take()?;
        // A watch stopped it (a secret appeared), or it ended: no code of
        // a command ran in it.
        if started.killed_for.lock().is_some() || !matches!(started.child.try_wait(), Ok(None)) {
            return None;
        }
        // A host secret appeared where the sandbox shows it (its watch may
        // not have seen it yet, or missed it: the masks made again need no
        // event), or in a tree it reads.
        if !started.sentinel.as_ref().is_some_and(|s| s.quiet())
            || started.granted != granted
            || !started.reads_check.is_some_and(|made| kept_reads.unchanged(made))
        {
            return None;
        }
        self.command.write_all_at(command.as_bytes(), 0).ok()?;
        if let Watching::Claim(armed) =
            std::mem::replace(&mut started.watches, Watching::Running { _watches: Default::default() })
        {
            started.watches = Watching::Running { _watches: arm(armed) };
        }
        let go = self.go.take()?;
        match nix::unistd::write(&go, b"\n") {
            Ok(1) => Some(started),
            _ => None,
        }
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(s) = &self.started {
            kill_group(s.pid);
        }
    }
}

/// Start a spare for the next command like `cmd` (its text is not used).
/// None when no reader shell is shown (no bash in the sandbox).
pub async fn make_spare(ctx: Context<'_>, cmd: &Command) -> Result<Option<Spare>, ShellError> {
    let inputs = Inputs::gather(&ctx, cmd)?;
    let Some(reader) = payload::reader_shell(|p| p.exists()) else { return Ok(None) };
    let failed = |e: std::io::Error| not_started(format!("its command's descriptors: {e}"));
    let memfd = nix::sys::memfd::memfd_create(c"pi-sandbox-command", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| failed(e.into()))?;
    // The reader's copy is read-only (an open file description of its own).
    let theirs =
        std::fs::File::open(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&memfd))).map_err(failed)?;
    let (go_read, go) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| failed(e.into()))?;
    let key = inputs.key(&ctx);
    let started = start(&ctx, &inputs, Runs::Reader(reader, [theirs.into(), go_read])).await?;
    let spare = Spare { key, started: Some(started), command: memfd.into(), go: Some(go) };
    // Another directory put at the project's or the working directory's
    // path while it was made: which one it has is not known (dropped, it
    // is killed).
    if [crate::paths::dir_id(ctx.project), crate::paths::dir_id(&inputs.cwd)] != inputs.dir_ids {
        return Err(not_started("the project or the working directory was replaced while a spare was made"));
    }
    Ok(Some(spare))
}
