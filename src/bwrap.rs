//! The bubblewrap command line: a pure function from a [`SandboxSpec`] to
//! argv. Nothing here touches the host; `spawn` applies the result and
//! `probe` discovers the host facts the spec carries.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where things appear inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
pub const SCRATCH: &str = "/scratch";
pub const WORKER: &str = "/worker.py";
/// The worker compiled by a previous sandbox (see `bytecode`).
pub const WORKER_PYC: &str = "/worker.pyc";
/// Fixed fd numbers inside the sandbox (set up by `spawn` before exec).
pub const REQUEST_FD: i32 = 3;
pub const REPLY_FD: i32 = 4;
pub const SECCOMP_FD: i32 = 5;
/// bubblewrap writes `{"child-pid": N, ...}` here once the namespaces exist.
pub const INFO_FD: i32 = 6;
/// The payload waits until this is readable (see `nshelper`).
pub const BLOCK_FD: i32 = 7;
/// Mount sources passed as fds (see [`FdBind`]) are placed from here up.
pub const MOUNT_FD_BASE: i32 = 8;

/// A bind mount whose source bubblewrap gets as an open fd (placed at
/// `fd` by `spawn`), never as a path it would resolve at start: for
/// sources inside a tree the sandbox can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdBind {
    pub fd: i32,
    /// Where it goes, inside the sandbox.
    pub dest: PathBuf,
    pub read_only: bool,
}

/// Paths every sandbox mounts itself; a read root may not land on or under
/// one of them.
pub const RESERVED_MOUNTS: &[&str] = &[
    "/workspace",
    "/scratch",
    "/tmp",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/dev",
    "/worker.py",
    "/worker.pyc",
];

/// Kernel interfaces under `/proc` bound read-only onto themselves right
/// after `--proc`, with why. Bubblewrap leaves them writable: its own
/// read-only remount of `/proc/sys` depends on `access(W_OK)` on that
/// directory (mode 0555), which fails. A process whose uid is global root
/// writes most of these by their mode bits alone, with no capability
/// check. The `-try` form: a kernel without the interface has nothing to
/// protect there.
pub const READ_ONLY_PROC: &[(&str, &str)] = &[
    (
        "/proc/sys",
        "sysctls: as host root, kernel.core_pattern names a program the kernel runs as host root, \
         outside every namespace, on the next crash; the rest tune the whole host",
    ),
    ("/proc/sysrq-trigger", "magic SysRq: reboot, crash or freeze the host with one byte"),
    ("/proc/irq", "interrupt affinity of the host's CPUs"),
    ("/proc/bus", "PCI and USB devices' configuration space and settings"),
    ("/proc/fs", "file system drivers' host-wide settings (nfsd, ext4, xfs, fscache)"),
];

/// A kernel information file or directory under `/proc` hidden under an
/// empty read-only file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMask {
    pub path: &'static str,
    pub is_dir: bool,
    pub reason: &'static str,
}

const fn file(path: &'static str, reason: &'static str) -> ProcMask {
    ProcMask { path, is_dir: false, reason }
}

const fn dir(path: &'static str, reason: &'static str) -> ProcMask {
    ProcMask { path, is_dir: true, reason }
}

/// What `/proc` must not tell the sandbox: the container runtimes' default
/// masked paths, and every file there (outside `/proc/<pid>`) that root can
/// read and an ordinary user cannot, found by reading all of `/proc` as
/// both and comparing. Only those present on the host are masked (a bind
/// needs its mount point; see `probe::proc_masks`). Files that show
/// addresses only to a process with a capability in the initial namespace
/// (`kallsyms`, `modules`, `iomem`, `ioports`) are masked as well: the
/// sandbox has none, but what they show then depends on a kernel check,
/// not on this list.
pub const PROC_MASKS: &[ProcMask] = &[
    // The runtimes' defaults.
    dir("/proc/acpi", "ACPI tables and the host's firmware interface"),
    dir("/proc/asound", "the host's sound devices; some entries are writable"),
    file("/proc/kcore", "the host's physical memory as an ELF core"),
    file("/proc/keys", "the kernel keyrings of the uid: another process's session keys when it is root"),
    file("/proc/latency_stats", "scheduler latency records of every host task"),
    file("/proc/timer_list", "every host timer with its task name and pid, kernel addresses"),
    file("/proc/timer_stats", "timer statistics of every host task"),
    file("/proc/sched_debug", "the scheduler's state of every host task, names and pids"),
    dir("/proc/scsi", "the host's SCSI devices; writing scsi/scsi adds and removes them"),
    file("/proc/interrupts", "per-CPU interrupt counts: a side channel on other users' input and I/O"),
    // Readable by root alone (mode 0400 or a uid check), found by comparison.
    file("/proc/key-users", "keyring quotas of every uid on the host"),
    file("/proc/kmsg", "the kernel log; reading it takes messages away from the host's logger"),
    file("/proc/kpagecgroup", "the memory cgroup of every physical page"),
    file("/proc/kpagecount", "the map count of every physical page"),
    file("/proc/kpageflags", "the flags of every physical page: a side channel for memory attacks"),
    file("/proc/pagetypeinfo", "the page allocator's free lists: a side channel for heap attacks"),
    file("/proc/slabinfo", "kernel heap caches: a side channel for heap attacks"),
    file("/proc/vmallocinfo", "kernel virtual memory areas with their addresses and callers"),
    file("/proc/mtrr", "the CPU's memory type ranges; root writes them with a capability"),
    file("/proc/program_cpu", "a hypervisor's CPU programming interface, root only"),
    dir("/proc/tty/driver", "serial ports' settings and counters"),
    file("/proc/sys/kernel/cad_pid", "the pid that Ctrl-Alt-Del signals"),
    dir("/proc/sys/kernel/usermodehelper", "the capabilities of programs the kernel starts"),
    file("/proc/sys/vm/mmap_rnd_bits", "how many bits of address randomisation the host uses"),
    file("/proc/sys/vm/mmap_rnd_compat_bits", "the same, for 32-bit programs"),
    file("/proc/sys/vm/stat_refresh", "a write makes every CPU refresh its memory statistics"),
    // Addresses shown to a process with a capability.
    file("/proc/kallsyms", "kernel symbol addresses: defeats address randomisation"),
    file("/proc/modules", "kernel module addresses"),
    file("/proc/iomem", "physical memory layout with addresses"),
    file("/proc/ioports", "I/O port layout"),
];

/// Which form of the worker a sandbox runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerCode {
    /// The source (host path), compiled by the interpreter at start; with
    /// `emit`, the worker sends its compiled form back.
    Source { path: PathBuf, emit: bool },
    /// A `.pyc` image (host path) an earlier sandbox compiled.
    Bytecode(PathBuf),
}

/// Everything that varies between sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The interpreter, as a resolved host path.
    pub interpreter: PathBuf,
    /// Host directories an interpreter outside `/usr` needs (its prefix),
    /// mounted read-only at the same path.
    pub interpreter_mounts: Vec<PathBuf>,
    /// `/bin`, `/lib`, ... are symlinks into `/usr` on this host.
    pub merged_usr: bool,
    /// The canonical project directory.
    pub project_dir: PathBuf,
    pub workspace_writable: bool,
    pub scratch_dir: PathBuf,
    /// The worker to run.
    pub worker: WorkerCode,
    /// Canonical host directories mounted read-only at their own paths.
    pub read_roots: Vec<PathBuf>,
    /// Paths allowed once: `(source, mount point)`, read-only.
    pub once: Vec<(PathBuf, PathBuf)>,
    /// Host secrets inside the read roots and allow-once directories,
    /// hidden under an empty read-only directory or file.
    pub host_masks: Vec<crate::hostsecrets::Mask>,
    /// The session's empty file and directory, bound over the kernel
    /// information files and the host masks.
    pub mask_sources: (PathBuf, PathBuf),
    /// The entries of [`PROC_MASKS`] present on this host.
    pub proc_masks: Vec<crate::hostsecrets::Mask>,
    /// Bound over a writable workspace, in order (see `protected`).
    pub protected: Vec<FdBind>,
    /// Bound over the workspace in every mode, after `protected`: in a
    /// read-only one the directories above the masks (onto themselves),
    /// then the secret masks (see `secrets`).
    pub masks: Vec<FdBind>,
    /// The masks' sandbox paths, told to the worker (its read hook names
    /// a read of one as a secret).
    pub mask_paths: Vec<String>,
    /// The same masks where a read root that contains the project shows
    /// it (at its host path), after the read roots.
    pub root_masks: Vec<FdBind>,
    /// The user's Python packages: directories mounted read-only at their
    /// own paths, and the site directories the worker adds.
    pub python_mounts: Vec<PathBuf>,
    /// Python package directories inside a tree the sandbox can write,
    /// mounted read-only from fds at their own paths.
    pub python_fd_mounts: Vec<FdBind>,
    /// The open-file limit the worker sets for itself and everything it
    /// starts, when bubblewrap needed a higher one for its mount fds.
    pub nofile: Option<u64>,
    /// The RLIMIT_NPROC the worker sets in the sandbox's user namespace,
    /// where no cgroup caps its tasks (see `contain`).
    pub nproc: Option<u64>,
    /// The worker's bounds, `name=value,...` (see `limits::worker_limits`):
    /// the host's constants are the only source.
    pub worker_limits: String,
    /// Run the worker as PID 1 that keeps the sandbox across interpreters
    /// (rollback and fast reset); off, the worker is the interpreter.
    pub keeper: bool,
    pub site_dirs: Vec<PathBuf>,
    /// Sizes of the `/tmp` and `/dev/shm` tmpfs, in bytes (never 0, which
    /// would mean unlimited).
    pub tmp_bytes: u64,
    pub shm_bytes: u64,
}

fn push(argv: &mut Vec<OsString>, items: &[&str]) {
    argv.extend(items.iter().map(OsString::from));
}

fn push_bind(argv: &mut Vec<OsString>, flag: &str, src: &Path, dest: &Path) {
    argv.push(flag.into());
    argv.push(src.into());
    argv.push(dest.into());
}

fn push_fd_bind(argv: &mut Vec<OsString>, bind: &FdBind) {
    argv.push(if bind.read_only { "--ro-bind-fd" } else { "--bind-fd" }.into());
    argv.push(bind.fd.to_string().into());
    argv.push(bind.dest.clone().into());
}

/// The full bwrap argv (without the program name), in the order the
/// confinement is built: namespaces, process hygiene, the filesystem from
/// the bottom up, the environment, the seccomp filter, then the worker.
pub fn bwrap_argv(spec: &SandboxSpec) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::with_capacity(96);
    // Namespaces: own user (no nested ones), pid, ipc, uts, network, cgroup.
    push(&mut a, &["--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc"]);
    push(&mut a, &["--unshare-uts", "--hostname", "pi-sandbox", "--unshare-net", "--unshare-cgroup-try"]);
    // Process hygiene: dies with the host, no capabilities. The new session
    // (no controlling terminal) is made by spawn.rs, around bwrap itself.
    push(&mut a, &["--die-with-parent", "--cap-drop", "ALL"]);
    // The host learns the sandbox's pid and holds the payload until the
    // namespace helper has set the sandbox's own limits (see `nshelper`).
    let (info, block) = (INFO_FD.to_string(), BLOCK_FD.to_string());
    push(&mut a, &["--info-fd", &info, "--block-fd", &block]);
    // Filesystem: kernel views, private temp, the runtime read-only. What
    // code leaves in a tmpfs is RAM that outlives its processes, so each
    // one the code can write has a size, and /dev itself is read-only.
    // (They belong to the sandbox's one user: multiprocessing's semaphores
    // in /dev/shm need no sticky world-writable mode.)
    // The kernel's host-wide settings read-only, its information files
    // empty (see READ_ONLY_PROC and PROC_MASKS).
    let (mask_file, mask_dir) = &spec.mask_sources;
    push(&mut a, &["--proc", "/proc"]);
    for (path, _) in READ_ONLY_PROC {
        push(&mut a, &["--ro-bind-try", path, path]);
    }
    for mask in &spec.proc_masks {
        push_bind(&mut a, "--ro-bind", if mask.is_dir { mask_dir } else { mask_file }, &mask.path);
    }
    push(&mut a, &["--dev", "/dev"]);
    let (shm, tmp) = (spec.shm_bytes.to_string(), spec.tmp_bytes.to_string());
    push(&mut a, &["--size", &shm, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--size", &tmp, "--tmpfs", "/tmp"]);
    push(&mut a, &["--ro-bind", "/usr", "/usr"]);
    if spec.merged_usr {
        for dir in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            a.push("--symlink".into());
            a.push(format!("usr/{dir}").into());
            a.push(format!("/{dir}").into());
        }
    } else {
        for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
            push(&mut a, &["--ro-bind-try", dir, dir]);
        }
    }
    // The dynamic linker's cache, the time zone, and font configuration
    // (for plotting libraries): system configuration, no secrets.
    for file in ["/etc/ld.so.cache", "/etc/localtime", "/etc/fonts"] {
        push(&mut a, &["--ro-bind-try", file, file]);
    }
    for dir in &spec.interpreter_mounts {
        push_bind(&mut a, "--ro-bind", dir, dir);
    }
    let workspace_flag = if spec.workspace_writable { "--bind" } else { "--ro-bind" };
    push_bind(&mut a, workspace_flag, &spec.project_dir, Path::new(WORKSPACE));
    if spec.workspace_writable {
        for bind in &spec.protected {
            push_fd_bind(&mut a, bind);
        }
    }
    for bind in &spec.masks {
        push_fd_bind(&mut a, bind);
    }
    push_bind(&mut a, "--bind", &spec.scratch_dir, Path::new(SCRATCH));
    let (worker_host, worker) = match &spec.worker {
        WorkerCode::Source { path, .. } => (path, WORKER),
        WorkerCode::Bytecode(path) => (path, WORKER_PYC),
    };
    push_bind(&mut a, "--ro-bind", worker_host, Path::new(worker));
    for root in spec.read_roots.iter().chain(&spec.python_mounts) {
        push_bind(&mut a, "--ro-bind-try", root, root);
    }
    for (source, path) in &spec.once {
        push_bind(&mut a, "--ro-bind", source, path);
    }
    for mask in &spec.host_masks {
        push_bind(&mut a, "--ro-bind", if mask.is_dir { mask_dir } else { mask_file }, &mask.path);
    }
    for bind in &spec.root_masks {
        push_fd_bind(&mut a, bind);
    }
    for bind in &spec.python_fd_mounts {
        push_fd_bind(&mut a, bind);
    }
    // Every mount point is made: the root (bubblewrap's tmpfs) becomes
    // read-only, so nothing in it is the sandbox's to write or fill.
    push(&mut a, &["--remount-ro", "/", "--chdir", WORKSPACE]);
    // Environment: nothing of the host's.
    push(&mut a, &["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", SCRATCH]);
    push(&mut a, &["--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8"]);
    // The filter is loaded last, right before exec.
    a.push("--seccomp".into());
    a.push(SECCOMP_FD.to_string().into());
    if spec.keeper {
        // The worker is the namespace's PID 1 (see `worker`'s rollback).
        a.push("--as-pid-1".into());
    }
    a.push("--".into());
    a.push(spec.interpreter.clone().into());
    push(&mut a, &["-I", "-S", "-B", "-u", "-X", "utf8", worker]);
    if matches!(spec.worker, WorkerCode::Source { emit: true, .. }) {
        a.push("--emit-code".into());
    }
    for dir in &spec.site_dirs {
        a.push("--site".into());
        a.push(dir.into());
    }
    if !spec.mask_paths.is_empty() {
        a.push("--masks".into());
        a.push(serde_json::to_string(&spec.mask_paths).unwrap_or_else(|_| "[]".into()).into());
    }
    a.push("--limits".into());
    a.push(spec.worker_limits.clone().into());
    if spec.keeper {
        a.push("--keeper".into());
    }
    if let Some(n) = spec.nofile {
        a.push("--nofile".into());
        a.push(n.to_string().into());
    }
    if let Some(n) = spec.nproc {
        a.push("--nproc".into());
        a.push(n.to_string().into());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            interpreter: "/usr/bin/python3.11".into(),
            interpreter_mounts: vec![],
            merged_usr: true,
            project_dir: "/home/u/proj".into(),
            workspace_writable: false,
            scratch_dir: "/tmp/s/scratch".into(),
            worker: WorkerCode::Source { path: "/tmp/s/worker.py".into(), emit: false },
            read_roots: vec![],
            once: vec![],
            host_masks: vec![],
            mask_sources: ("/tmp/s/mask-file".into(), "/tmp/s/mask-dir".into()),
            proc_masks: vec![
                crate::hostsecrets::Mask { path: "/proc/keys".into(), is_dir: false },
                crate::hostsecrets::Mask { path: "/proc/acpi".into(), is_dir: true },
            ],
            protected: vec![
                FdBind { fd: 6, dest: "/workspace/sub".into(), read_only: false },
                FdBind { fd: 7, dest: "/workspace/sub/.git".into(), read_only: true },
            ],
            masks: vec![],
            mask_paths: vec![],
            root_masks: vec![],
            python_mounts: vec![],
            python_fd_mounts: vec![],
            nofile: None,
            nproc: None,
            worker_limits: "frame=1".into(),
            keeper: false,
            site_dirs: vec![],
            tmp_bytes: 256 << 20,
            shm_bytes: 64 << 20,
        }
    }

    fn strings(argv: &[OsString]) -> Vec<String> {
        argv.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    fn has_triple(argv: &[String], triple: [&str; 3]) -> bool {
        argv.windows(3).any(|w| w == triple)
    }

    #[test]
    fn default_argv_is_exactly_the_documented_confinement() {
        let argv = strings(&bwrap_argv(&spec()));
        let expected = "--unshare-user --disable-userns --unshare-pid --unshare-ipc \
            --unshare-uts --hostname pi-sandbox --unshare-net --unshare-cgroup-try \
            --die-with-parent --cap-drop ALL --info-fd 6 --block-fd 7 \
            --proc /proc --ro-bind-try /proc/sys /proc/sys \
            --ro-bind-try /proc/sysrq-trigger /proc/sysrq-trigger --ro-bind-try /proc/irq /proc/irq \
            --ro-bind-try /proc/bus /proc/bus --ro-bind-try /proc/fs /proc/fs \
            --ro-bind /tmp/s/mask-file /proc/keys --ro-bind /tmp/s/mask-dir /proc/acpi \
            --dev /dev --size 67108864 --tmpfs /dev/shm --remount-ro /dev \
            --size 268435456 --tmpfs /tmp --ro-bind /usr /usr \
            --symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib \
            --symlink usr/lib32 /lib32 --symlink usr/lib64 /lib64 --symlink usr/libx32 /libx32 \
            --ro-bind-try /etc/ld.so.cache /etc/ld.so.cache --ro-bind-try /etc/localtime /etc/localtime \
            --ro-bind-try /etc/fonts /etc/fonts \
            --ro-bind /home/u/proj /workspace --bind /tmp/s/scratch /scratch \
            --ro-bind /tmp/s/worker.py /worker.py --remount-ro / --chdir /workspace \
            --clearenv --setenv PATH /usr/bin:/bin --setenv HOME /scratch \
            --setenv TMPDIR /tmp --setenv LANG C.UTF-8 --seccomp 5 \
            -- /usr/bin/python3.11 -I -S -B -u -X utf8 /worker.py --limits frame=1";
        assert_eq!(argv.join(" "), expected);
    }

    #[test]
    fn the_worker_runs_as_source_asked_to_emit_its_code_or_as_bytecode() {
        let tail = |worker| {
            let argv = strings(&bwrap_argv(&SandboxSpec { worker, site_dirs: vec!["/v/site".into()], ..spec() }));
            let bind = argv.iter().position(|a| a.starts_with("/worker")).expect("worker bind");
            let command = argv.iter().position(|a| a == "--").expect("--");
            (argv[bind - 2..=bind].join(" "), argv[command + 1..].join(" "))
        };
        let emit = WorkerCode::Source { path: "/tmp/s/worker.py".into(), emit: true };
        assert_eq!(
            tail(emit),
            (
                "--ro-bind /tmp/s/worker.py /worker.py".into(),
                "/usr/bin/python3.11 -I -S -B -u -X utf8 /worker.py --emit-code --site /v/site --limits frame=1".into()
            )
        );
        let pyc = WorkerCode::Bytecode("/rt/.worker-code/worker-00ff.pyc".into());
        assert_eq!(
            tail(pyc),
            (
                "--ro-bind /rt/.worker-code/worker-00ff.pyc /worker.pyc".into(),
                "/usr/bin/python3.11 -I -S -B -u -X utf8 /worker.pyc --site /v/site --limits frame=1".into()
            )
        );
    }

    #[test]
    fn the_worker_is_told_its_open_file_and_task_limits_last() {
        let argv = strings(&bwrap_argv(&SandboxSpec { nofile: Some(128), nproc: Some(256), ..spec() }));
        assert_eq!(argv[argv.len() - 6..], ["--limits", "frame=1", "--nofile", "128", "--nproc", "256"]);
        // As PID 1 (rollback), the worker sets both before it forks the first
        // interpreter (see worker.py's main), so every process has them.
        let keeper = strings(&bwrap_argv(&SandboxSpec { keeper: true, nproc: Some(64), ..spec() }));
        assert_eq!(keeper[keeper.len() - 5..], ["--limits", "frame=1", "--keeper", "--nproc", "64"]);
    }

    #[test]
    fn writable_workspace_uses_bind_and_never_ro_bind() {
        let argv = strings(&bwrap_argv(&SandboxSpec { workspace_writable: true, ..spec() }));
        assert!(has_triple(&argv, ["--bind", "/home/u/proj", "/workspace"]));
        assert!(!has_triple(&argv, ["--ro-bind", "/home/u/proj", "/workspace"]));
        // Protected paths come right after, so they cover the writable bind.
        let at = argv.iter().position(|a| a == "/workspace").expect("workspace");
        assert_eq!(
            argv[at + 1..at + 7],
            ["--bind-fd", "6", "/workspace/sub", "--ro-bind-fd", "7", "/workspace/sub/.git"],
            "protected sources are fds, never paths bubblewrap would resolve"
        );
    }

    #[test]
    fn allow_once_paths_and_host_secret_masks_come_after_the_read_roots() {
        use crate::hostsecrets::Mask;
        let argv = bwrap_argv(&SandboxSpec {
            read_roots: vec!["/etc".into()],
            once: vec![("/srv/real.csv".into(), "/srv/link.csv".into())],
            host_masks: vec![
                Mask { path: "/etc/shadow".into(), is_dir: false },
                Mask { path: "/etc/sudoers.d".into(), is_dir: true },
            ],
            ..spec()
        });
        let joined = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        let at = |s: &str| joined.find(s).unwrap_or_else(|| panic!("{s} missing in {joined}"));
        assert!(at("--ro-bind-try /etc /etc") < at("--ro-bind /srv/real.csv /srv/link.csv"));
        assert!(at("--ro-bind-try /etc /etc") < at("--ro-bind /tmp/s/mask-file /etc/shadow"));
        assert!(at("--ro-bind-try /etc /etc") < at("--ro-bind /tmp/s/mask-dir /etc/sudoers.d"));
    }

    #[test]
    fn secret_masks_cover_the_workspace_in_every_mode_and_are_named_to_the_worker() {
        let masks = vec![
            FdBind { fd: 8, dest: "/workspace/deploy".into(), read_only: true },
            FdBind { fd: 9, dest: "/workspace/deploy/key.pem".into(), read_only: true },
        ];
        let paths = vec!["/workspace/deploy/key.pem".to_string()];
        for writable in [false, true] {
            let argv = strings(&bwrap_argv(&SandboxSpec {
                workspace_writable: writable,
                masks: masks.clone(),
                mask_paths: paths.clone(),
                ..spec()
            }));
            let at = argv.iter().position(|a| a == "/workspace/deploy/key.pem").expect("mask");
            let scratch = argv.iter().position(|a| a == "/scratch").expect("scratch");
            assert!(at < scratch);
            assert_eq!(
                argv[at - 5..=at],
                ["--ro-bind-fd", "8", "/workspace/deploy", "--ro-bind-fd", "9", "/workspace/deploy/key.pem"]
            );
            let protected = argv.iter().position(|a| a == "/workspace/sub/.git");
            assert_eq!(protected.is_some(), writable);
            assert!(protected.is_none_or(|p| p < at), "masks come after protected binds");
            assert_eq!(argv[argv.len() - 4..], ["--masks", r#"["/workspace/deploy/key.pem"]"#, "--limits", "frame=1"]);
        }
    }

    #[test]
    fn read_roots_and_interpreter_prefix_are_mounted_read_only_at_their_paths() {
        let argv = strings(&bwrap_argv(&SandboxSpec {
            read_roots: vec!["/data/a".into(), "/etc".into()],
            interpreter: "/opt/py/bin/python3".into(),
            interpreter_mounts: vec!["/opt/py".into()],
            ..spec()
        }));
        assert!(has_triple(&argv, ["--ro-bind-try", "/data/a", "/data/a"]));
        assert!(has_triple(&argv, ["--ro-bind-try", "/etc", "/etc"]));
        assert!(has_triple(&argv, ["--ro-bind", "/opt/py", "/opt/py"]));
        assert_eq!(argv[argv.len() - 10], "/opt/py/bin/python3");
    }

    #[test]
    fn a_user_venv_is_mounted_read_only_and_named_to_the_worker() {
        let argv = strings(&bwrap_argv(&SandboxSpec {
            python_mounts: vec!["/home/u/venv".into()],
            site_dirs: vec!["/home/u/venv/lib/python3.11/site-packages".into()],
            ..spec()
        }));
        assert!(has_triple(&argv, ["--ro-bind-try", "/home/u/venv", "/home/u/venv"]));
        assert_eq!(
            argv[argv.len() - 5..argv.len() - 2],
            ["/worker.py", "--site", "/home/u/venv/lib/python3.11/site-packages"]
        );
    }

    #[test]
    fn a_venv_inside_the_project_is_mounted_from_an_fd() {
        let argv = strings(&bwrap_argv(&SandboxSpec {
            python_fd_mounts: vec![FdBind { fd: 8, dest: "/home/u/proj/.venv".into(), read_only: true }],
            ..spec()
        }));
        assert!(has_triple(&argv, ["--ro-bind-fd", "8", "/home/u/proj/.venv"]));
        assert!(!argv.iter().any(|a| a == "/workspace/sub"), "protected binds only in a writable workspace");
    }

    #[test]
    fn split_usr_binds_the_top_level_dirs_when_present() {
        let argv = strings(&bwrap_argv(&SandboxSpec { merged_usr: false, ..spec() }));
        assert!(has_triple(&argv, ["--ro-bind-try", "/lib64", "/lib64"]));
        assert!(!argv.iter().any(|a| a == "--symlink"));
    }

    #[test]
    fn nothing_from_the_host_environment_or_home_is_named() {
        let argv = strings(&bwrap_argv(&spec()));
        assert!(argv.contains(&"--clearenv".to_string()));
        for forbidden in ["/home/u/.ssh", "/run", "/var/run", "/root", "SSH_AUTH_SOCK"] {
            assert!(!argv.iter().any(|a| a.starts_with(forbidden)), "{forbidden}");
        }
        // The only host path under /home is the project, mounted at /workspace.
        let home: Vec<_> = argv.iter().filter(|a| a.starts_with("/home")).collect();
        assert_eq!(home, ["/home/u/proj"]);
    }
}
