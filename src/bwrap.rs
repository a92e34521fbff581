//! The bubblewrap command line: a pure function from a [`Policy`] (what
//! every sandbox gets) and a [`Payload`] (what a runtime runs in it, see
//! `runtime`) to argv, in confinement order, tested whole. Nothing here
//! touches the host or knows what the payload is; `spawn` applies the
//! result and `probe` discovers the host facts the policy carries.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the python tool's policy mounts the project.
pub const WORKSPACE: &str = "/workspace";
/// Where every sandbox has its writable home.
pub const SCRATCH: &str = "/scratch";
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
/// one of them (nor on a runtime's own, see `runtime`).
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
];

/// The host's system directories every sandbox shows read-only at their
/// own paths (`/bin` and the rest are links into `/usr` where the host's
/// are): a project inside one is shown there too.
pub const SYSTEM_MOUNTS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/fonts"];

/// Kernel interfaces under `/proc` bound read-only onto themselves, with
/// why, by the namespace helper in the held sandbox (see
/// [`Policy::held_mounts`]). Bubblewrap leaves them writable: its own
/// read-only remount of `/proc/sys` depends on `access(W_OK)` on that
/// directory (mode 0555), which fails. A process whose uid is global root
/// writes most of these by their mode bits alone, with no capability
/// check. Skipped where missing: a kernel without the interface has nothing
/// to protect there.
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
/// both and comparing, hidden by the namespace helper in the held sandbox
/// (see [`Policy::held_mounts`]). Only those present on the host are
/// masked (a bind needs its mount point; see `probe::proc_masks`). Files that show
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

/// What a sandbox's network is. Every policy unshares the network
/// namespace; with `None` it is empty (loopback only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// Nothing reaches out, and the seccomp profile refuses sockets.
    #[default]
    None,
}

/// What every sandbox gets, whatever runs in it: the namespaces (all of
/// them, always), the mounts and masks, the containment facts the
/// payload's init applies, the network and the seccomp profile. The
/// runtime adds its [`Payload`]; [`bwrap_argv`] puts the two together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `/bin`, `/lib`, ... are symlinks into `/usr` on this host.
    pub merged_usr: bool,
    /// The canonical project directory: one mount of it per sandbox, so
    /// that the protections and masks are bound once.
    pub project_dir: PathBuf,
    /// Where the project is mounted (the payload's working directory).
    pub project_at: PathBuf,
    /// The project's host names (its canonical path, the working directory
    /// as the caller named it): each becomes a link to `project_at` in the
    /// sandbox's root, so that the path pi and its own tools use works,
    /// with the one mount's protections and masks. [`project_links`] says
    /// which can be made.
    pub project_links: Vec<PathBuf>,
    pub workspace_writable: bool,
    /// Mounted writable at [`SCRATCH`], the sandbox's home.
    pub scratch_dir: PathBuf,
    /// Canonical host directories mounted read-only at their own paths.
    pub read_roots: Vec<PathBuf>,
    /// Paths allowed once: `(source, mount point)`, read-only.
    pub once: Vec<(PathBuf, PathBuf)>,
    /// Host secrets inside the read roots, the allow-once directories and
    /// the payload's read mounts, hidden under an empty read-only
    /// directory or file.
    pub host_masks: Vec<crate::hostsecrets::Mask>,
    /// The session's empty file and directory, bound over the kernel
    /// information files and the host masks.
    pub mask_sources: (PathBuf, PathBuf),
    /// The entries of [`PROC_MASKS`] present on this host.
    pub proc_masks: Vec<crate::hostsecrets::Mask>,
    /// Bound over a writable project, in order (see `protected`).
    pub protected: Vec<FdBind>,
    /// Bound over the project in every mode, after `protected`: in a
    /// read-only one the directories above the masks (onto themselves),
    /// then the secret masks (see `secrets`).
    pub masks: Vec<FdBind>,
    /// The same masks where a read root that contains the project shows
    /// it (at its host path), after the read roots.
    pub root_masks: Vec<FdBind>,
    /// The open-file limit of the payload and everything it starts, when
    /// bubblewrap needed a higher one for its mount fds. The payload sets
    /// it, once bubblewrap has closed them: the host cannot (the pid it
    /// learns is bubblewrap's while it still mounts from those fds, and a
    /// lower limit then fails the start).
    pub nofile: Option<u64>,
    /// The RLIMIT_NPROC of the payload and everything it starts, counted
    /// in the sandbox's user namespace, where no cgroup caps its tasks
    /// (see `contain` and [`Policy::held_rlimits`]).
    pub nproc: Option<u64>,
    /// Sizes of the `/tmp` and `/dev/shm` tmpfs, in bytes (never 0, which
    /// would mean unlimited).
    pub tmp_bytes: u64,
    pub shm_bytes: u64,
    pub network: Network,
    /// The system calls the payload may make (see `seccomp`).
    pub seccomp: crate::seccomp::Profile,
}

/// What a runtime runs under a [`Policy`]: its own mounts, each at a fixed
/// place in the confinement order, and its command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Payload {
    /// Host directories the runtime itself needs (an interpreter's
    /// prefix), read-only at their own paths, before the project.
    pub runtime_mounts: Vec<PathBuf>,
    /// The runtime's own files, `(host path, sandbox path)`, read-only,
    /// after the scratch directory.
    pub code: Vec<(PathBuf, PathBuf)>,
    /// Links it makes, `(target, path)`, right after its files: a name
    /// pointing into one of them costs no mount (each mount makes
    /// bubblewrap read the whole mount table again).
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Host trees the runtime reads (its packages), read-only at their own
    /// paths together with the read roots, so that the host masks that
    /// follow cover them too; one that is missing is skipped.
    pub read_mounts: Vec<PathBuf>,
    /// Its trees inside a tree the sandbox can write, from fds, last.
    pub fd_mounts: Vec<FdBind>,
    /// Variables set after the policy's own.
    pub env: Vec<(String, String)>,
    /// The command is the PID namespace's init (`--as-pid-1`): it reaps.
    pub as_pid_1: bool,
    /// Its working directory, when not where the project is mounted (a
    /// directory inside it, say).
    pub chdir: Option<PathBuf>,
    /// The command and its arguments.
    pub argv: Vec<OsString>,
}

/// Where a name made a link to the project cannot be: on, inside or
/// above another mount point (bubblewrap would make the link through it,
/// or fail on the directory it made), except inside the sandbox's own
/// `/tmp`, a tmpfs where the link and its directories live. A link name
/// is absolute and plain (no `.` or `..`) and never the project's mount
/// point, inside or above it.
fn blocks_link(link: &Path, mount: &Path) -> bool {
    if mount == Path::new("/tmp") && link.starts_with(mount) && link != mount {
        return false;
    }
    link.starts_with(mount) || mount.starts_with(link)
}

/// The names of [`Policy::project_links`] made links in this sandbox, in
/// order: those that no mount of the policy or the payload lands on,
/// inside or above (see [`blocks_link`]), and not inside another such
/// name. The payload's fd mounts inside a name go inside the project's
/// mount point instead (see [`placed`]), so they block none. Where a name
/// is not made, the path is what the mounts show there: the project read
/// only through a read root or a system directory that holds it, or
/// nothing.
pub fn project_links(policy: &Policy, payload: &Payload) -> Vec<PathBuf> {
    let system: Vec<PathBuf> =
        ["/proc", "/dev", "/tmp", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
            .into_iter()
            .chain(["/etc/ld.so.cache", "/etc/localtime", "/etc/fonts", SCRATCH])
            .chain(READ_ONLY_PROC.iter().map(|(p, _)| *p))
            .map(PathBuf::from)
            .collect();
    let host_masks = policy.host_masks.iter().chain(&policy.proc_masks).map(|m| &m.path);
    let mut mounts: Vec<&PathBuf> = system.iter().chain(&payload.runtime_mounts).chain(host_masks).collect();
    mounts.push(&policy.project_at);
    mounts.extend(payload.code.iter().map(|(_, at)| at));
    mounts.extend(payload.links.iter().map(|(_, at)| at));
    mounts.extend(policy.read_roots.iter().chain(&payload.read_mounts));
    mounts.extend(policy.once.iter().map(|(_, at)| at));
    mounts.extend(policy.root_masks.iter().map(|b| &b.dest));
    let mut made: Vec<PathBuf> = Vec::new();
    for link in &policy.project_links {
        let plain = link.is_absolute()
            && link.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
        let fd_blocks = payload.fd_mounts.iter().any(|b| !b.dest.starts_with(link) && blocks_link(link, &b.dest));
        if !plain
            || link.parent().is_none()
            || fd_blocks
            || mounts.iter().any(|m| blocks_link(link, m))
            || made.iter().any(|l| blocks_link(link, l))
        {
            continue;
        }
        made.push(link.clone());
    }
    made
}

/// Where a mount of the payload at `dest` goes: inside the project's
/// mount point when `dest` is inside one of the `links` to it (the link
/// leads there, and bubblewrap must not mount through it).
fn placed(dest: &Path, links: &[PathBuf], project_at: &Path) -> PathBuf {
    links
        .iter()
        .find_map(|l| dest.strip_prefix(l).ok().map(|rel| project_at.join(rel)))
        .unwrap_or_else(|| dest.to_path_buf())
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

impl Policy {
    /// What the namespace helper mounts in the held sandbox, after
    /// bubblewrap's mounts and before the payload runs (see
    /// `nshelper::masks`): [`READ_ONLY_PROC`] read-only onto themselves
    /// where present, then the [`PROC_MASKS`] of this host under the
    /// session's empty file or directory. Not bubblewrap's: it reads the
    /// whole mount table again after every bind, and these were half of a
    /// start's binds.
    pub fn held_mounts(&self) -> crate::nshelper::masks::Held {
        crate::nshelper::masks::Held {
            read_only: READ_ONLY_PROC.iter().map(|(p, _)| PathBuf::from(p)).collect(),
            masks: self
                .proc_masks
                .iter()
                .map(|m| crate::nshelper::mount::Mask { path: m.path.clone(), is_dir: m.is_dir })
                .collect(),
            mask_file: self.mask_sources.0.clone(),
            mask_dir: self.mask_sources.1.clone(),
        }
    }

    /// The rlimits (soft = hard) the host sets on the sandbox's first
    /// process before bubblewrap lets the payload run (see
    /// `spawn::prepare_inside`): not part of the argv, and the same for
    /// every payload. Only the task cap: the process may still be making
    /// its mounts, which an open-file limit could fail (see `nofile`).
    pub fn held_rlimits(&self) -> Vec<(nix::sys::resource::Resource, u64)> {
        use nix::sys::resource::Resource;
        self.nproc.map(|n| (Resource::RLIMIT_NPROC, n)).into_iter().collect()
    }
}

/// The full bwrap argv (without the program name), in the order the
/// confinement is built: namespaces, process hygiene, the filesystem from
/// the bottom up, the environment, the seccomp filter, then the payload's
/// command. It knows nothing of what the payload runs.
pub fn bwrap_argv(policy: &Policy, payload: &Payload) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::with_capacity(96 + payload.argv.len());
    // Namespaces: own user (no nested ones), pid, ipc, uts, network, cgroup.
    let Network::None = policy.network;
    push(&mut a, &["--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc"]);
    push(&mut a, &["--unshare-uts", "--hostname", "pi-sandbox", "--unshare-net", "--unshare-cgroup-try"]);
    // Process hygiene: dies with the host, no capabilities. The new session
    // (no controlling terminal) is made by spawn.rs, around bwrap itself.
    push(&mut a, &["--die-with-parent", "--cap-drop", "ALL"]);
    // The host learns the sandbox's pid and holds the payload until the
    // namespace helper has set the sandbox's own limits (see `nshelper`).
    let (info, block) = (INFO_FD.to_string(), BLOCK_FD.to_string());
    push(&mut a, &["--info-fd", &info, "--block-fd", &block]);
    // Filesystem: kernel views, private temp, the system read-only. What
    // code leaves in a tmpfs is RAM that outlives its processes, so each
    // one the code can write has a size, and /dev itself is read-only.
    // (They belong to the sandbox's one user: multiprocessing's semaphores
    // in /dev/shm need no sticky world-writable mode.)
    // The kernel's host-wide settings read-only and its information files
    // empty are the namespace helper's, in the held sandbox (see
    // `Policy::held_mounts`).
    let (mask_file, mask_dir) = &policy.mask_sources;
    push(&mut a, &["--proc", "/proc"]);
    push(&mut a, &["--dev", "/dev"]);
    let (shm, tmp) = (policy.shm_bytes.to_string(), policy.tmp_bytes.to_string());
    push(&mut a, &["--size", &shm, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--size", &tmp, "--tmpfs", "/tmp"]);
    push(&mut a, &["--ro-bind", "/usr", "/usr"]);
    if policy.merged_usr {
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
    for dir in &payload.runtime_mounts {
        push_bind(&mut a, "--ro-bind", dir, dir);
    }
    // The project, once, with its protections and masks right over it.
    let workspace_flag = if policy.workspace_writable { "--bind" } else { "--ro-bind" };
    push_bind(&mut a, workspace_flag, &policy.project_dir, &policy.project_at);
    if policy.workspace_writable {
        for bind in &policy.protected {
            push_fd_bind(&mut a, bind);
        }
    }
    for bind in &policy.masks {
        push_fd_bind(&mut a, bind);
    }
    push_bind(&mut a, "--bind", &policy.scratch_dir, Path::new(SCRATCH));
    for (host, at) in &payload.code {
        push_bind(&mut a, "--ro-bind", host, at);
    }
    for (target, at) in &payload.links {
        push_bind(&mut a, "--symlink", target, at);
    }
    // Host trees, then what is allowed once, then the host secrets in them
    // (the payload's read mounts among them) masked.
    for root in policy.read_roots.iter().chain(&payload.read_mounts) {
        push_bind(&mut a, "--ro-bind-try", root, root);
    }
    for (source, path) in &policy.once {
        push_bind(&mut a, "--ro-bind", source, path);
    }
    for mask in &policy.host_masks {
        push_bind(&mut a, "--ro-bind", if mask.is_dir { mask_dir } else { mask_file }, &mask.path);
    }
    for bind in &policy.root_masks {
        push_fd_bind(&mut a, bind);
    }
    let links = project_links(policy, payload);
    for bind in &payload.fd_mounts {
        push_fd_bind(&mut a, &FdBind { dest: placed(&bind.dest, &links, &policy.project_at), ..bind.clone() });
    }
    // The project's host names, links to its one mount, with the
    // directories above them (in the sandbox's root, or in its /tmp).
    for link in &links {
        let mut dirs: Vec<&Path> = link.ancestors().skip(1).filter(|d| d.parent().is_some()).collect();
        dirs.reverse();
        for dir in dirs.into_iter().filter(|d| *d != Path::new("/tmp")) {
            a.push("--dir".into());
            a.push(dir.into());
        }
        push_bind(&mut a, "--symlink", &policy.project_at, link);
    }
    // Every mount point is made: the root (bubblewrap's tmpfs) becomes
    // read-only, so nothing in it is the sandbox's to write or fill.
    a.push("--remount-ro".into());
    a.push("/".into());
    a.push("--chdir".into());
    a.push(payload.chdir.as_ref().unwrap_or(&policy.project_at).clone().into());
    // Environment: nothing of the host's.
    push(&mut a, &["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", SCRATCH]);
    push(&mut a, &["--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8"]);
    for (name, value) in &payload.env {
        push(&mut a, &["--setenv", name, value]);
    }
    // The filter is loaded last, right before exec.
    a.push("--seccomp".into());
    a.push(SECCOMP_FD.to_string().into());
    if payload.as_pid_1 {
        a.push("--as-pid-1".into());
    }
    a.push("--".into());
    a.extend(payload.argv.iter().cloned());
    a
}

/// The policy the tests of argv builders start from: a read-only project,
/// two kernel information files masked, two protected paths (bound only
/// when the project is writable).
#[cfg(test)]
pub(crate) fn test_policy() -> Policy {
    Policy {
        merged_usr: true,
        project_dir: "/home/u/proj".into(),
        project_at: WORKSPACE.into(),
        project_links: vec![],
        workspace_writable: false,
        scratch_dir: "/tmp/s/scratch".into(),
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
        root_masks: vec![],
        nofile: None,
        nproc: None,
        tmp_bytes: 256 << 20,
        shm_bytes: 64 << 20,
        network: Network::None,
        seccomp: crate::seccomp::Profile::Python,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload with no mounts of its own.
    fn true_payload() -> Payload {
        Payload { argv: vec!["/bin/true".into()], ..Payload::default() }
    }

    fn strings(argv: &[OsString]) -> Vec<String> {
        argv.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    fn argv(policy: &Policy) -> Vec<String> {
        strings(&bwrap_argv(policy, &true_payload()))
    }

    fn has_triple(argv: &[String], triple: [&str; 3]) -> bool {
        argv.windows(3).any(|w| w == triple)
    }

    #[test]
    fn the_policy_s_task_cap_is_the_host_s_to_set_and_no_limit_is_in_the_argv() {
        use nix::sys::resource::Resource;
        assert_eq!(test_policy().held_rlimits(), []);
        let limited = Policy { nofile: Some(128), nproc: Some(256), ..test_policy() };
        // The open-file limit is the payload's: bubblewrap may still be
        // mounting from its fds when the host sets the task cap.
        assert_eq!(limited.held_rlimits(), [(Resource::RLIMIT_NPROC, 256)]);
        assert_eq!(argv(&limited), argv(&test_policy()));
    }

    #[test]
    fn default_policy_with_a_bare_payload_is_exactly_the_documented_confinement() {
        let expected = "--unshare-user --disable-userns --unshare-pid --unshare-ipc \
            --unshare-uts --hostname pi-sandbox --unshare-net --unshare-cgroup-try \
            --die-with-parent --cap-drop ALL --info-fd 6 --block-fd 7 \
            --proc /proc --dev /dev --size 67108864 --tmpfs /dev/shm --remount-ro /dev \
            --size 268435456 --tmpfs /tmp --ro-bind /usr /usr \
            --symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib \
            --symlink usr/lib32 /lib32 --symlink usr/lib64 /lib64 --symlink usr/libx32 /libx32 \
            --ro-bind-try /etc/ld.so.cache /etc/ld.so.cache --ro-bind-try /etc/localtime /etc/localtime \
            --ro-bind-try /etc/fonts /etc/fonts \
            --ro-bind /home/u/proj /workspace --bind /tmp/s/scratch /scratch \
            --remount-ro / --chdir /workspace \
            --clearenv --setenv PATH /usr/bin:/bin --setenv HOME /scratch \
            --setenv TMPDIR /tmp --setenv LANG C.UTF-8 --seccomp 5 -- /bin/true";
        assert_eq!(argv(&test_policy()).join(" "), expected);
    }

    #[test]
    fn proc_s_hardening_is_the_helper_s_and_never_in_the_argv() {
        let held = test_policy().held_mounts();
        assert_eq!(
            held,
            crate::nshelper::masks::Held {
                read_only: ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"]
                    .into_iter()
                    .map(PathBuf::from)
                    .collect(),
                masks: vec![
                    crate::nshelper::mount::Mask { path: "/proc/keys".into(), is_dir: false },
                    crate::nshelper::mount::Mask { path: "/proc/acpi".into(), is_dir: true },
                ],
                mask_file: "/tmp/s/mask-file".into(),
                mask_dir: "/tmp/s/mask-dir".into(),
            }
        );
        let argv = argv(&test_policy());
        assert!(!argv.iter().any(|a| a.starts_with("/proc/")), "{argv:?}");
    }

    #[test]
    fn the_project_is_mounted_once_where_the_policy_says_and_is_the_working_directory() {
        let policy = Policy { project_at: "/home/u/proj".into(), ..test_policy() };
        let argv = argv(&policy);
        let mounts = argv.windows(2).filter(|w| w[1] == "/home/u/proj" && w[0].ends_with("bind")).count();
        assert_eq!(mounts, 1, "{argv:?}");
        assert!(has_triple(&argv, ["--ro-bind", "/home/u/proj", "/home/u/proj"]));
        assert!(argv.windows(2).any(|w| w == ["--chdir", "/home/u/proj"]));
        assert!(!argv.iter().any(|a| a == WORKSPACE));
    }

    #[test]
    fn a_payload_s_mounts_env_and_command_go_where_the_confinement_order_puts_them() {
        let payload = Payload {
            runtime_mounts: vec!["/opt/rt".into()],
            code: vec![("/tmp/s/init".into(), "/init".into())],
            links: vec![("init".into(), "/init-link".into())],
            read_mounts: vec!["/opt/pkgs".into()],
            fd_mounts: vec![FdBind { fd: 9, dest: "/home/u/proj/.pkgs".into(), read_only: true }],
            env: vec![("TERM".into(), "dumb".into())],
            as_pid_1: true,
            chdir: None,
            argv: vec!["/init".into(), "--flag".into()],
        };
        let policy = Policy {
            read_roots: vec!["/etc".into()],
            host_masks: vec![crate::hostsecrets::Mask { path: "/opt/pkgs/.netrc".into(), is_dir: false }],
            root_masks: vec![FdBind { fd: 8, dest: "/home/u/proj/key.pem".into(), read_only: true }],
            ..test_policy()
        };
        let joined = strings(&bwrap_argv(&policy, &payload)).join(" ");
        let at = |s: &str| joined.find(s).unwrap_or_else(|| panic!("{s} missing in {joined}"));
        let order = [
            "--ro-bind-try /etc/fonts /etc/fonts",
            "--ro-bind /opt/rt /opt/rt",
            "--ro-bind /home/u/proj /workspace",
            "--bind /tmp/s/scratch /scratch",
            "--ro-bind /tmp/s/init /init",
            "--symlink init /init-link",
            "--ro-bind-try /etc /etc",
            "--ro-bind-try /opt/pkgs /opt/pkgs",
            "--ro-bind /tmp/s/mask-file /opt/pkgs/.netrc",
            "--ro-bind-fd 8 /home/u/proj/key.pem",
            "--ro-bind-fd 9 /home/u/proj/.pkgs",
            "--remount-ro / ",
            "--setenv LANG C.UTF-8 --setenv TERM dumb --seccomp 5 --as-pid-1 -- /init --flag",
        ];
        for pair in order.windows(2) {
            assert!(at(pair[0]) < at(pair[1]), "{} before {}", pair[0], pair[1]);
        }
        assert!(joined.ends_with("-- /init --flag"), "{joined}");
    }

    #[test]
    fn writable_workspace_uses_bind_and_never_ro_bind() {
        let argv = argv(&Policy { workspace_writable: true, ..test_policy() });
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
        let argv = bwrap_argv(
            &Policy {
                read_roots: vec!["/etc".into()],
                once: vec![("/srv/real.csv".into(), "/srv/link.csv".into())],
                host_masks: vec![
                    Mask { path: "/etc/shadow".into(), is_dir: false },
                    Mask { path: "/etc/sudoers.d".into(), is_dir: true },
                ],
                ..test_policy()
            },
            &true_payload(),
        );
        let joined = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        let at = |s: &str| joined.find(s).unwrap_or_else(|| panic!("{s} missing in {joined}"));
        assert!(at("--ro-bind-try /etc /etc") < at("--ro-bind /srv/real.csv /srv/link.csv"));
        assert!(at("--ro-bind-try /etc /etc") < at("--ro-bind /tmp/s/mask-file /etc/shadow"));
        assert!(at("--ro-bind-try /etc /etc") < at("--ro-bind /tmp/s/mask-dir /etc/sudoers.d"));
    }

    #[test]
    fn the_project_s_host_names_are_links_to_its_one_mount_made_last_with_their_directories() {
        let policy = Policy {
            workspace_writable: true,
            project_links: vec!["/home/u/proj".into(), "/srv/link/proj".into(), "/tmp/t/proj".into()],
            ..test_policy()
        };
        let payload = Payload {
            fd_mounts: vec![FdBind { fd: 9, dest: "/home/u/proj/.venv".into(), read_only: true }],
            ..true_payload()
        };
        let joined = strings(&bwrap_argv(&policy, &payload)).join(" ");
        // One mount of the project; its protections and masks go there only.
        assert_eq!(joined.matches("/home/u/proj ").count(), 2, "{joined}");
        assert!(joined.contains("--bind /home/u/proj /workspace --bind-fd 6 /workspace/sub"), "{joined}");
        let links = "--ro-bind-fd 9 /workspace/.venv \
            --dir /home --dir /home/u --symlink /workspace /home/u/proj \
            --dir /srv --dir /srv/link --symlink /workspace /srv/link/proj \
            --dir /tmp/t --symlink /workspace /tmp/t/proj --remount-ro /";
        assert!(joined.contains(links), "{joined}");
        assert_eq!(project_links(&policy, &payload), policy.project_links);
    }

    #[test]
    fn no_link_is_made_on_in_or_above_another_mount_or_at_a_name_that_is_not_plain() {
        use crate::hostsecrets::Mask;
        let policy = Policy {
            read_roots: vec!["/data".into()],
            once: vec![("/srv/real.csv".into(), "/srv/once/f.csv".into())],
            host_masks: vec![Mask { path: "/opt/pkgs/.netrc".into(), is_dir: false }],
            project_links: [
                "/workspace",
                "/workspace/p",
                "/",
                "/scratch",
                "/scratch/p",
                "/tmp",
                "/usr/local/p",
                "/bin/p",
                "/lib64",
                "/proc/p",
                "/dev/shm/p",
                "/etc/fonts/p",
                "/data/p",
                "/srv",
                "/opt",
                "/rt",
                "/worker.py",
                "/etc/../home/p",
                "relative/p",
                "/home/u/p",
                "/home/u/p/sub",
                "/tmp/ok/p",
            ]
            .into_iter()
            .map(PathBuf::from)
            .collect(),
            ..test_policy()
        };
        let payload = Payload {
            runtime_mounts: vec!["/rt/py".into()],
            code: vec![("/tmp/s/worker.py".into(), "/worker.py".into())],
            fd_mounts: vec![FdBind { fd: 9, dest: "/var/v".into(), read_only: true }],
            ..true_payload()
        };
        let made = project_links(&policy, &payload);
        assert_eq!(made, [PathBuf::from("/home/u/p"), "/tmp/ok/p".into()]);
        // An fd mount above a name blocks it; inside it, it goes to the project.
        let above = Policy { project_links: vec!["/var/v/p".into()], ..test_policy() };
        assert!(project_links(&above, &payload).is_empty());
        // Only the names made are in the argv.
        let joined = strings(&bwrap_argv(&policy, &payload)).join(" ");
        assert_eq!(joined.matches("--symlink /workspace ").count(), 2, "{joined}");
    }

    #[test]
    fn split_usr_binds_the_top_level_dirs_when_present() {
        let argv = argv(&Policy { merged_usr: false, ..test_policy() });
        assert!(has_triple(&argv, ["--ro-bind-try", "/lib64", "/lib64"]));
        assert!(!argv.iter().any(|a| a == "--symlink"));
    }

    #[test]
    fn nothing_from_the_host_environment_or_home_is_named() {
        let argv = argv(&test_policy());
        assert!(argv.contains(&"--clearenv".to_string()));
        for forbidden in ["/home/u/.ssh", "/run", "/var/run", "/root", "SSH_AUTH_SOCK"] {
            assert!(!argv.iter().any(|a| a.starts_with(forbidden)), "{forbidden}");
        }
        // The only host path under /home is the project, mounted at /workspace.
        let home: Vec<_> = argv.iter().filter(|a| a.starts_with("/home")).collect();
        assert_eq!(home, ["/home/u/proj"]);
    }
}
