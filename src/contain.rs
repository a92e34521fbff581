//! Containment of one sandbox as a whole: a cap on its tasks (processes
//! and threads, the tool's own included) and on its total memory, with the
//! best mechanism the host offers.
//!
//! The rlimits in `spawn` bind each process; nothing there stops one
//! sandbox from forking until the machine has no pids left, or from
//! holding many processes' worth of memory. In order of preference:
//!
//! 1. a cgroup v2 child of the pi process's own cgroup, when that cgroup
//!    is writable and has `pids` and `memory` for its children (already
//!    enabled, or enabled here: in the root of a cgroup namespace
//!    directly, elsewhere by first moving the cgroup's processes into a
//!    leaf of their own, since cgroup v2 allows no controller in a cgroup
//!    that holds processes);
//! 2. cgroup v1 `pids` and `memory` children of the cgroups the pi process
//!    is in, where those hierarchies are writable (as root on hosts that
//!    mount them);
//! 3. for tasks only, `RLIMIT_NPROC`, set by the host on the sandbox's
//!    first process while bubblewrap holds it, so that every process of
//!    the payload, whatever it is, inherits it (see `spawn`); the kernel
//!    counts it in the sandbox's own user namespace, so the user's other
//!    processes do not count. Root is exempt from it, capabilities
//!    dropped or not;
//! 4. nothing: `status` says "not contained" and why.
//!
//! Only cgroups this module made are written to or removed, always below
//! the pi process's own; no other cgroup's limits are changed. Each
//! sandbox gets its own cgroups, joined by bubblewrap's process before it
//! execs (see `spawn`), and removed when the [`Contained`] handle is
//! dropped, after its processes are gone; those of a process that exits
//! are removed by [`cleanup_all`]. What happens inside the sandbox, and
//! how a result is worded, are not this module's business.

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::limits::{describe_size, parse_size, SettingError};

/// Most tasks (processes and threads) of one sandbox, bubblewrap's own
/// included.
pub const MAX_TASKS_ENV: &str = "PI_SANDBOX_MAX_TASKS";
/// Most memory of one sandbox in all (bytes, or a number with K, M or G).
pub const MAX_MEMORY_ENV: &str = "PI_SANDBOX_MAX_MEMORY";
pub const DEFAULT_MAX_TASKS: u64 = 256;
pub const DEFAULT_MAX_MEMORY: u64 = 2 << 30;
/// Below these, not even the interpreter starts.
pub const MIN_TASKS: u64 = 8;
pub const MIN_MEMORY: u64 = 64 << 20;

/// The caps of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub tasks: u64,
    pub memory: u64,
}

/// The caps set by the two environment values (`None` or blank: the
/// default), or what to set instead.
pub fn caps(tasks: Option<&str>, memory: Option<&str>) -> Result<Caps, SettingError> {
    fn blank(v: Option<&str>) -> Option<&str> {
        v.map(str::trim).filter(|v| !v.is_empty())
    }
    let tasks = match blank(tasks) {
        None => DEFAULT_MAX_TASKS,
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n >= MIN_TASKS => n,
            _ => return Err(SettingError::TooFew { name: MAX_TASKS_ENV, value: v.to_string(), min: MIN_TASKS }),
        },
    };
    let memory = match blank(memory) {
        None => DEFAULT_MAX_MEMORY,
        Some(v) => match parse_size(v) {
            Some(n) if n >= MIN_MEMORY => n,
            _ => return Err(SettingError::TooSmall { name: MAX_MEMORY_ENV, value: v.to_string(), min: MIN_MEMORY }),
        },
    };
    Ok(Caps { tasks, memory })
}

#[derive(Debug, thiserror::Error)]
pub enum ContainError {
    #[error("cannot create the cgroup {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot set {file} of the cgroup {path}: {source}")]
    Limit { path: PathBuf, file: &'static str, source: io::Error },
    #[error("cannot open the file that joins the cgroup {path}: {source}")]
    Join { path: PathBuf, source: io::Error },
    #[error("cannot give the cgroup {path} its controllers: {source}")]
    Split { path: PathBuf, source: io::Error },
}

// ---------------------------------------------------------------------
// Host facts: what the pi process's cgroups are and where they are mounted.

/// One line of `/proc/self/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// 0 for cgroup v2.
    pub hierarchy: u32,
    /// The v1 controllers of the hierarchy (`pids`, `memory`); empty for v2.
    pub controllers: Vec<String>,
    pub path: PathBuf,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.parse().ok()?;
            let controllers = parts.next()?.split(',').filter(|c| !c.is_empty()).map(String::from).collect();
            let path = PathBuf::from(parts.next()?);
            Some(Membership { hierarchy, controllers, path })
        })
        .collect()
}

/// A mounted cgroup file system (from `/proc/self/mountinfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The cgroup that appears at the mount point.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub v2: bool,
    /// The v1 controllers it carries.
    pub controllers: Vec<String>,
}

/// `\040` and the like, as mountinfo escapes space, tab, newline and `\`.
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let (root, mount_point) = (fields.get(3)?, fields.get(4)?);
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("");
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let controllers = if v2 {
                Vec::new()
            } else {
                options.split(',').filter(|o| matches!(*o, "pids" | "memory")).map(String::from).collect()
            };
            Some(CgroupMount { root: unescape(root), mount_point: unescape(mount_point), v2, controllers })
        })
        .collect()
}

/// Where the cgroup `path` of a hierarchy is, given how it is mounted.
fn on_disk(mount: &CgroupMount, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(&mount.root).ok()?;
    Some(if rel.as_os_str().is_empty() { mount.mount_point.clone() } else { mount.mount_point.join(rel) })
}

/// What the decision needs to know of one cgroup directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirFacts {
    /// We may create cgroups in it and write its files.
    pub writable: bool,
    /// v2: `cgroup.controllers`, `cgroup.subtree_control`, `cgroup.procs`.
    pub controllers: String,
    pub subtree: String,
    pub procs: String,
}

/// The facts of `dir` on this host.
pub fn dir_facts(dir: &Path) -> DirFacts {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    DirFacts {
        writable: nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok(),
        controllers: read("cgroup.controllers"),
        subtree: read("cgroup.subtree_control"),
        procs: read("cgroup.procs"),
    }
}

// ---------------------------------------------------------------------
// The decision (pure).

/// What caps one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cap {
    /// Children of this cgroup v2 directory.
    CgroupV2(PathBuf),
    /// Children of this cgroup v1 directory.
    CgroupV1(PathBuf),
    /// RLIMIT_NPROC in the sandbox's user namespace (tasks only).
    Nproc,
    /// Nothing; the reason is in [`Plan::why`].
    None,
}

impl Cap {
    /// The short name `status` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Cap::CgroupV2(_) => "cgroup-v2",
            Cap::CgroupV1(_) => "cgroup-v1",
            Cap::Nproc => "rlimit-nproc",
            Cap::None => "none",
        }
    }
}

/// How this host contains sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub tasks: Cap,
    pub memory: Cap,
    /// cgroup v2: the children of pi's cgroup get `pids` and `memory`
    /// first (once per process).
    pub split: Option<Split>,
    /// Why each better mechanism is not used.
    pub why: Vec<String>,
}

/// Enabling controllers for the children of a cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub dir: PathBuf,
    /// Its processes move to the leaf [`HOST_LEAF`] first.
    pub move_processes: bool,
}

/// Where the processes of a split cgroup v2 directory go.
pub const HOST_LEAF: &str = "pi-python-sandbox.host";

const V2_NEEDS: [&str; 2] = ["pids", "memory"];

fn has_all(list: &str) -> bool {
    V2_NEEDS.iter().all(|c| list.split_whitespace().any(|w| w == *c))
}

/// Decide from the host's facts: `euid`, the pi process's cgroups, the
/// cgroup mounts, and `look` (the facts of one cgroup directory).
pub fn choose(euid: u32, members: &[Membership], mounts: &[CgroupMount], look: impl Fn(&Path) -> DirFacts) -> Plan {
    let mut why = Vec::new();
    // cgroup v2.
    let v2 = members.iter().find(|m| m.hierarchy == 0).map(|m| &m.path);
    let v2_mount = mounts.iter().find(|m| m.v2);
    match (v2, v2_mount) {
        (None, _) | (_, None) => why.push("cgroup v2: not mounted here".to_string()),
        (Some(path), Some(mount)) => match on_disk(mount, path) {
            None => why.push(format!(
                "cgroup v2: pi's cgroup {} is outside the mounted hierarchy ({})",
                path.display(),
                mount.mount_point.display()
            )),
            Some(dir) => {
                let f = look(&dir);
                let is_root = path == Path::new("/");
                if !has_all(&f.controllers) {
                    why.push(format!(
                        "cgroup v2: pi's cgroup {} does not have the pids and memory controllers (it has: {})",
                        dir.display(),
                        if f.controllers.trim().is_empty() { "none" } else { f.controllers.trim() }
                    ));
                } else if !f.writable {
                    why.push(format!(
                        "cgroup v2: pi's cgroup {} is not writable by uid {euid} (not delegated); start pi in a \
                         delegated scope (`systemd-run --user --scope -p Delegate=yes pi`) to use it",
                        dir.display()
                    ));
                } else {
                    // cgroup v2 allows no controller in a cgroup that holds
                    // processes, but in the root of a (namespaced) hierarchy:
                    // elsewhere the processes move to a leaf first.
                    let split = (!has_all(&f.subtree))
                        .then(|| Split { dir: dir.clone(), move_processes: !is_root && !f.procs.trim().is_empty() });
                    return Plan { tasks: Cap::CgroupV2(dir.clone()), memory: Cap::CgroupV2(dir), split, why };
                }
            }
        },
    }
    // cgroup v1: each controller in its own hierarchy.
    let v1 = |controller: &str, why: &mut Vec<String>| -> Option<PathBuf> {
        let member = members.iter().find(|m| m.hierarchy != 0 && m.controllers.iter().any(|c| c == controller));
        let mount = mounts.iter().find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller));
        let (Some(member), Some(mount)) = (member, mount) else {
            why.push(format!("cgroup v1 {controller}: not mounted here"));
            return None;
        };
        let Some(dir) = on_disk(mount, &member.path) else {
            why.push(format!("cgroup v1 {controller}: pi's cgroup {} is outside the mount", member.path.display()));
            return None;
        };
        if !look(&dir).writable {
            why.push(format!("cgroup v1 {controller}: {} is not writable by uid {euid}", dir.display()));
            return None;
        }
        Some(dir)
    };
    let pids = v1("pids", &mut why);
    let memory = v1("memory", &mut why);
    let tasks = match pids {
        Some(dir) => Cap::CgroupV1(dir),
        None if euid == 0 => {
            why.push("RLIMIT_NPROC: pi runs as root, whom the kernel exempts from it".into());
            Cap::None
        }
        None => Cap::Nproc,
    };
    let memory = match memory {
        Some(dir) => Cap::CgroupV1(dir),
        None => Cap::None,
    };
    Plan { tasks, memory, split: None, why }
}

/// The plan for this host, decided once per process.
pub fn host_plan() -> &'static Plan {
    static PLAN: std::sync::OnceLock<Plan> = std::sync::OnceLock::new();
    PLAN.get_or_init(|| {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let members = parse_proc_cgroup(&read("/proc/self/cgroup"));
        let mounts = parse_mountinfo(&read("/proc/self/mountinfo"));
        choose(nix::unistd::geteuid().as_raw(), &members, &mounts, dir_facts)
    })
}

/// The `status` line: what caps the sandbox's tasks and memory, and why
/// nothing better does.
pub fn describe(plan: &Plan, caps: &Result<Caps, SettingError>) -> String {
    let caps = match caps {
        Ok(c) => c,
        Err(e) => return format!("containment: {e}. No sandbox starts until then."),
    };
    let tasks = match &plan.tasks {
        Cap::CgroupV2(dir) | Cap::CgroupV1(dir) => format!(
            "at most {} tasks (processes and threads, the tool's own included) by {} pids under {}",
            caps.tasks,
            plan.tasks.name(),
            dir.display()
        ),
        Cap::Nproc => format!(
            "at most {} tasks (processes and threads inside the sandbox) by RLIMIT_NPROC in the sandbox's own user \
             namespace",
            caps.tasks
        ),
        Cap::None => "tasks NOT contained (a fork bomb can take the machine's processes)".into(),
    };
    let memory = match &plan.memory {
        Cap::CgroupV2(dir) | Cap::CgroupV1(dir) => format!(
            "at most {} of memory in all, swap not counted in its favour, by {} memory under {}",
            describe_size(caps.memory),
            plan.memory.name(),
            dir.display()
        ),
        Cap::Nproc | Cap::None => "memory NOT contained (each process has its own address-space limit only)".into(),
    };
    let mut text = format!("containment: {tasks}; {memory} ({MAX_TASKS_ENV}, {MAX_MEMORY_ENV})");
    if !plan.why.is_empty() {
        text.push_str(&format!(". Not used: {}", plan.why.join("; ")));
    }
    text
}

// ---------------------------------------------------------------------
// Applying it: one sandbox's cgroups.

/// This process's cgroups are named `pi-python-sandbox.<token>.<n>`.
fn name_prefix() -> &'static str {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PREFIX.get_or_init(|| format!("pi-python-sandbox.{:08x}.", crate::random::random_u64() as u32))
}

static NEXT: AtomicU64 = AtomicU64::new(1);

// A host process that is killed leaves its cgroups behind (its sandboxes
// die with it, so they are empty). Each process records the cgroups it
// makes in a ledger of its own, `<runtime root>/.cgroups/<token>`, whose
// first line names it (pid and start time); the first sandbox of a later
// process removes what the ledgers of dead processes list, and nothing else.

/// `pid starttime` of a live process, from /proc.
fn identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    // Field 22 (starttime) is the 20th after the command name.
    Some(format!("{pid} {}", after.split(' ').nth(19)?))
}

fn ledger_dir() -> PathBuf {
    crate::rundir::default_runtime_root().join(".cgroups")
}

static LEDGER: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

fn ledger_if_made() -> Option<&'static Path> {
    LEDGER.get().and_then(|l| l.as_deref())
}

/// This process's ledger, made on first use (after sweeping the dead's).
fn ledger() -> Option<&'static Path> {
    LEDGER
        .get_or_init(|| {
            let dir = ledger_dir();
            crate::rundir::private_dir(dir.parent()?).ok()?;
            crate::rundir::private_dir(&dir).ok()?;
            sweep(&dir);
            let me = identity(std::process::id())?;
            let path = dir.join(name_prefix().trim_end_matches('.'));
            std::fs::write(&path, format!("{me}\n")).ok()?;
            Some(path)
        })
        .as_deref()
}

/// Record a cgroup this process made.
fn record(dir: &Path) {
    use std::io::Write;
    if let Some(path) = ledger() {
        let line = format!("{}\n", dir.display());
        let _ = std::fs::OpenOptions::new().append(true).open(path).and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// Remove the cgroups that the ledgers of dead processes list (each named
/// with that process's own prefix), then the ledgers.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        let mut lines = text.lines();
        let owner = lines.next().unwrap_or("");
        let pid = owner.split(' ').next().and_then(|p| p.parse::<u32>().ok());
        if pid.and_then(identity).as_deref() == Some(owner) {
            continue; // still running
        }
        let prefix = format!("{}.", entry.file_name().to_string_lossy());
        let mut left = false;
        for cg in lines.map(Path::new) {
            let ours = cg.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
                && prefix.starts_with("pi-python-sandbox.");
            if ours && !remove(cg, Duration::from_millis(100)) {
                left = true;
            }
        }
        if !left {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Cgroups this process made and has not removed yet, for [`cleanup_all`].
static LIVE: parking_lot::Mutex<Vec<PathBuf>> = parking_lot::Mutex::new(Vec::new());

/// How the OOM kills of a sandbox's memory cgroup are counted.
struct OomCounter {
    /// `memory.oom_control` (v1) or `memory.events` (v2), read with pread.
    file: std::fs::File,
    seen: u64,
}

impl OomCounter {
    fn read(&self) -> Option<u64> {
        let mut buf = [0u8; 512];
        let n = std::os::unix::fs::FileExt::read_at(&self.file, &mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        oom_kills(text)
    }
}

/// The `oom_kill N` count of a `memory.oom_control` or `memory.events` text.
pub fn oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

/// One sandbox's containment: the cgroups made for it (removed on drop),
/// what its first process joins, and the task limit the host sets on it.
pub struct Contained {
    pub caps: Caps,
    tasks: Cap,
    memory: Cap,
    made: Vec<PathBuf>,
    join: Vec<OwnedFd>,
    oom: Option<OomCounter>,
}

fn write_file(dir: &Path, file: &'static str, value: &str) -> Result<(), ContainError> {
    std::fs::write(dir.join(file), value).map_err(|source| ContainError::Limit { path: dir.into(), file, source })
}

/// The file the sandbox's first process writes `0` to, to join a cgroup.
/// A write to `cgroup.procs` moves a whole thread group and so takes the
/// kernel's global threadgroup lock for writing, which waits for an RCU
/// grace period (6-8 ms here, more under load: measured on the cold path).
/// The joining process is a child just forked, which has one thread, so
/// in cgroup v1 moving that thread through `tasks` moves the process, and
/// the kernel skips the global lock for a thread moving itself (0.1 ms).
/// cgroup v2 moves single threads only within threaded subtrees: there it
/// is `cgroup.procs`, at that cost.
pub fn join_file(v2: bool) -> &'static str {
    if v2 {
        "cgroup.procs"
    } else {
        "tasks"
    }
}

/// Give the children of a cgroup v2 directory the pids and memory
/// controllers, its processes moved to a leaf of their own first.
fn split(how: &Split) -> Result<(), ContainError> {
    let dir = &how.dir;
    let err = |source| ContainError::Split { path: dir.clone(), source };
    if how.move_processes {
        let leaf = dir.join(HOST_LEAF);
        match std::fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
        // Processes may fork while they move: a few rounds, bounded.
        for _ in 0..16 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).map_err(err)?;
            if procs.trim().is_empty() {
                break;
            }
            for pid in procs.split_whitespace() {
                // A process that exited meanwhile is not an error.
                let _ = std::fs::write(leaf.join("cgroup.procs"), pid);
            }
        }
    }
    std::fs::write(dir.join("cgroup.subtree_control"), "+pids +memory").map_err(err)
}

/// The v2 split is made once per process.
fn split_once(how: &Split) -> Result<(), std::sync::Arc<ContainError>> {
    static DONE: std::sync::OnceLock<Result<(), std::sync::Arc<ContainError>>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| split(how).map_err(std::sync::Arc::new)).clone()
}

impl Contained {
    /// Make the cgroups `plan` calls for, with `caps` set in them.
    pub fn create(plan: &Plan, caps: Caps) -> Result<Contained, ContainError> {
        let mut c = Contained {
            caps,
            tasks: plan.tasks.clone(),
            memory: plan.memory.clone(),
            made: vec![],
            join: vec![],
            oom: None,
        };
        if let Some(how) = &plan.split {
            split_once(how).map_err(|e| ContainError::Split { path: how.dir.clone(), source: io::Error::other(e) })?;
        }
        let name = format!("{}{}", name_prefix(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut dirs: Vec<(PathBuf, bool, bool)> = Vec::new(); // (parent, tasks, memory)
        match (&plan.tasks, &plan.memory) {
            (Cap::CgroupV2(a), Cap::CgroupV2(b)) if a == b => dirs.push((a.clone(), true, true)),
            (tasks, memory) => {
                if let Cap::CgroupV1(d) | Cap::CgroupV2(d) = tasks {
                    dirs.push((d.clone(), true, false));
                }
                if let Cap::CgroupV1(d) | Cap::CgroupV2(d) = memory {
                    dirs.push((d.clone(), false, true));
                }
            }
        }
        let v2 = matches!(plan.memory, Cap::CgroupV2(_));
        for (parent, tasks, memory) in dirs {
            let dir = parent.join(&name);
            std::fs::create_dir(&dir).map_err(|source| ContainError::Create { path: dir.clone(), source })?;
            LIVE.lock().push(dir.clone());
            record(&dir);
            c.made.push(dir.clone());
            if tasks {
                write_file(&dir, "pids.max", &caps.tasks.to_string())?;
            }
            if memory {
                let bytes = caps.memory.to_string();
                if v2 {
                    write_file(&dir, "memory.max", &bytes)?;
                    // No swap at all: swap would let it hold more than the cap.
                    if dir.join("memory.swap.max").exists() {
                        write_file(&dir, "memory.swap.max", "0")?;
                    }
                } else {
                    write_file(&dir, "memory.limit_in_bytes", &bytes)?;
                    // memory + swap together within the same cap; without
                    // swap accounting, keep it from swapping at all.
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        write_file(&dir, "memory.memsw.limit_in_bytes", &bytes)?;
                    } else {
                        write_file(&dir, "memory.swappiness", "0")?;
                    }
                }
                let events = dir.join(if v2 { "memory.events" } else { "memory.oom_control" });
                if let Ok(file) = std::fs::File::open(&events) {
                    let mut counter = OomCounter { file, seen: 0 };
                    counter.seen = counter.read().unwrap_or(0);
                    c.oom = Some(counter);
                }
            }
            let fd = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(join_file(v2)))
                .map_err(|source| ContainError::Join { path: dir.clone(), source })?;
            c.join.push(fd.into());
        }
        Ok(c)
    }

    /// Containment without cgroups: RLIMIT_NPROC where it binds (not for
    /// root), else none.
    pub fn without_cgroups(plan: &Plan, caps: Caps) -> Contained {
        let binds = plan.tasks == Cap::Nproc || !nix::unistd::geteuid().is_root();
        let tasks = if binds { Cap::Nproc } else { Cap::None };
        Contained { caps, tasks, memory: Cap::None, made: vec![], join: vec![], oom: None }
    }

    /// The files (see [`join_file`]) the sandbox's first process writes `0` to
    /// before it execs (see `spawn`); handed over once.
    pub fn take_join(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.join)
    }

    /// The RLIMIT_NPROC of the sandbox's processes (see `Policy::nproc`).
    pub fn nproc(&self) -> Option<u64> {
        (self.tasks == Cap::Nproc).then_some(self.caps.tasks)
    }

    /// The cgroup directories made for this sandbox.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.made
    }

    /// OOM kills in the sandbox since the last call, with how to say so:
    /// `interpreter_died` tells whether the interpreter was among them.
    pub fn oom_note(&mut self, interpreter_died: bool) -> Option<String> {
        let counter = self.oom.as_mut()?;
        let now = counter.read()?;
        let new = now.saturating_sub(counter.seen);
        counter.seen = now;
        if new == 0 {
            return None;
        }
        let cap =
            format!("the sandbox's memory cap of {} ({} memory)", describe_size(self.caps.memory), self.memory.name());
        Some(if interpreter_died {
            let others = if new > 1 { format!(" and {} other process(es)", new - 1) } else { String::new() };
            format!("out of memory: the kernel's OOM killer ended the interpreter{others}: {cap} was reached")
        } else {
            format!(
                "out of memory: {cap} was reached; the kernel's OOM killer ended {new} process(es) the code started \
                 (they saw SIGKILL); the interpreter was not one of them"
            )
        })
    }
}

/// The containment of one new sandbox under the caps in force. A cgroup
/// that cannot be made is said in `notes`, and that sandbox starts with
/// what remains (RLIMIT_NPROC where it binds).
pub fn for_sandbox(caps: &Result<Caps, SettingError>, notes: &mut Vec<String>) -> Result<Contained, SettingError> {
    let caps = caps.clone()?;
    let plan = host_plan();
    Contained::create(plan, caps).or_else(|e| {
        let fallback = Contained::without_cgroups(plan, caps);
        notes.push(format!(
            "containment: {e}; this sandbox's tasks are capped by {} and its memory is not",
            fallback.tasks.name()
        ));
        Ok(fallback)
    })
}

impl Drop for Contained {
    fn drop(&mut self) {
        self.join.clear();
        let dirs = std::mem::take(&mut self.made);
        if dirs.is_empty() {
            return;
        }
        // Usually empty by now; else its processes are killed and the
        // removal waits for them, off this thread past a few milliseconds.
        let rest: Vec<PathBuf> = dirs.into_iter().filter(|d| !remove(d, Duration::from_millis(20))).collect();
        if !rest.is_empty() {
            let _ = std::thread::Builder::new().name("pps-cgroup".into()).spawn(move || {
                for d in rest {
                    remove(&d, crate::limits::CLEANUP_DEADLINE);
                }
            });
        }
    }
}

/// Kill what is left in the cgroup `dir` and remove it, trying until
/// `within` has passed. True when it is gone.
fn remove(dir: &Path, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(_) if Instant::now() < until => {
                kill_members(dir);
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => {
                tracing::warn!("the cgroup {} could not be removed: {e}", dir.display());
                return false;
            }
        }
    }
    LIVE.lock().retain(|d| d != dir);
    true
}

/// SIGKILL every process of a cgroup this module made (only the sandbox's
/// processes are ever in it).
fn kill_members(dir: &Path) {
    // Never created: a directory that is no cgroup has no such file.
    let kill = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.kill"));
    if kill.and_then(|mut f| io::Write::write_all(&mut f, b"1")).is_ok() {
        return;
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).filter(|p| *p > 0) {
        // SAFETY: kill(2) with a pid listed in our own cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Remove every cgroup this process made (its sandboxes are killed
/// first). Synchronous: for exit hooks.
pub fn cleanup_all() {
    let live = std::mem::take(&mut *LIVE.lock());
    let mut left = false;
    for dir in live {
        left |= !remove(&dir, crate::limits::CLEANUP_DEADLINE);
    }
    if let (false, Some(path)) = (left, ledger_if_made()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Remove the cgroups that dead processes' ledgers list (also done by the
/// first sandbox of every process).
pub fn sweep_dead() {
    sweep(&ledger_dir());
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_HOST: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n";
    const V1_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
        39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

    fn facts(writable: &[&str], v2: &[(&str, &str, &str, &str)]) -> impl Fn(&Path) -> DirFacts {
        let writable: Vec<PathBuf> = writable.iter().map(PathBuf::from).collect();
        let v2: Vec<(PathBuf, DirFacts)> = v2
            .iter()
            .map(|(d, c, s, p)| {
                (
                    PathBuf::from(d),
                    DirFacts {
                        writable: false,
                        controllers: c.to_string(),
                        subtree: s.to_string(),
                        procs: p.to_string(),
                    },
                )
            })
            .collect();
        move |dir: &Path| {
            let mut f = v2.iter().find(|(d, _)| d == dir).map(|(_, f)| f.clone()).unwrap_or_default();
            f.writable = writable.iter().any(|w| w == dir);
            f
        }
    }

    #[test]
    fn caps_default_and_parse() {
        assert_eq!(caps(None, Some(" ")), Ok(Caps { tasks: 256, memory: 2 << 30 }));
        assert_eq!(caps(Some("64"), Some("512M")), Ok(Caps { tasks: 64, memory: 512 << 20 }));
        assert!(caps(Some("3"), None).unwrap_err().to_string().contains(MAX_TASKS_ENV));
        assert!(caps(Some("lots"), None).is_err());
        assert!(caps(None, Some("1M")).unwrap_err().to_string().contains(MAX_MEMORY_ENV));
    }

    #[test]
    fn parses_the_hosts_files() {
        let m = parse_proc_cgroup(V1_HOST);
        assert_eq!(m[1], Membership { hierarchy: 8, controllers: vec!["pids".into()], path: "/".into() });
        assert_eq!(m[4], Membership { hierarchy: 0, controllers: vec![], path: "/".into() });
        let mounts = parse_mountinfo(V1_MOUNTS);
        assert_eq!(mounts.len(), 3, "{mounts:?}");
        assert_eq!(
            mounts[0],
            CgroupMount {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/memory".into(),
                v2: false,
                controllers: vec!["memory".into()]
            }
        );
        assert!(mounts[2].v2);
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), Some(3));
        assert_eq!(oom_kills("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n"), Some(1));
    }

    #[test]
    fn cgroup_v1_as_root_on_a_host_like_this_one() {
        let plan = choose(
            0,
            &parse_proc_cgroup(V1_HOST),
            &parse_mountinfo(V1_MOUNTS),
            facts(&["/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory/process_api/abc", "/sys/fs/cgroup/unified"], &[]),
        );
        assert_eq!(
            plan,
            Plan {
                tasks: Cap::CgroupV1("/sys/fs/cgroup/pids".into()),
                memory: Cap::CgroupV1("/sys/fs/cgroup/memory/process_api/abc".into()),
                split: None,
                why: vec![
                    "cgroup v2: pi's cgroup /sys/fs/cgroup/unified does not have the pids and memory controllers (it has: none)"
                        .into()
                ],
            }
        );
    }

    #[test]
    fn an_unprivileged_user_gets_rlimit_nproc_and_no_memory_cap() {
        let plan = choose(65534, &parse_proc_cgroup(V1_HOST), &parse_mountinfo(V1_MOUNTS), facts(&[], &[]));
        assert_eq!((plan.tasks.clone(), plan.memory.clone()), (Cap::Nproc, Cap::None));
        assert!(plan
            .why
            .iter()
            .any(|w| w.contains("cgroup v1 pids: /sys/fs/cgroup/pids is not writable by uid 65534")));
        let desc = describe(&plan, &Ok(Caps { tasks: 256, memory: 2 << 30 }));
        assert!(desc.contains("at most 256 tasks") && desc.contains("RLIMIT_NPROC"), "{desc}");
        assert!(desc.contains("memory NOT contained"), "{desc}");
    }

    #[test]
    fn root_without_a_writable_cgroup_is_not_contained_and_says_why() {
        let plan = choose(0, &parse_proc_cgroup(V1_HOST), &parse_mountinfo(V1_MOUNTS), facts(&[], &[]));
        assert_eq!((plan.tasks.clone(), plan.memory.clone()), (Cap::None, Cap::None));
        assert!(plan.why.iter().any(|w| w.contains("root, whom the kernel exempts")), "{:?}", plan.why);
        let desc = describe(&plan, &Ok(Caps { tasks: 256, memory: 2 << 30 }));
        assert!(desc.contains("tasks NOT contained") && desc.contains("memory NOT contained"), "{desc}");
    }

    #[test]
    fn cgroup_v2_delegated_is_preferred_and_split_when_it_holds_processes() {
        let members = parse_proc_cgroup("0::/user.slice/user-1000.slice/user@1000.service/app.slice/pi.scope\n");
        let mounts = parse_mountinfo("30 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n");
        let dir = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/pi.scope";
        let with = |subtree: &str, writable: bool| {
            let w: &[&str] = if writable { &[dir] } else { &[] };
            choose(1000, &members, &mounts, facts(w, &[(dir, "cpu memory pids", subtree, "4242\n")]))
        };
        let split = with("", true);
        assert_eq!((split.tasks.clone(), split.memory.clone()), (Cap::CgroupV2(dir.into()), Cap::CgroupV2(dir.into())));
        assert_eq!(split.split, Some(Split { dir: dir.into(), move_processes: true }));
        assert!(with("memory pids", true).split.is_none());
        let not_delegated = with("", false);
        assert_eq!(not_delegated.tasks, Cap::Nproc);
        assert!(not_delegated.why[0].contains("not writable by uid 1000"), "{:?}", not_delegated.why);
        // Without the controllers in pi's cgroup, v1 is looked at (absent here).
        let none = choose(1000, &members, &mounts, facts(&[dir], &[(dir, "cpu io", "", "")]));
        assert!(none.why[0].contains("does not have the pids and memory controllers (it has: cpu io)"));
        assert_eq!(none.tasks, Cap::Nproc);
    }

    #[test]
    fn the_sweep_removes_only_what_dead_processes_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let (ledgers, cgroups) = (base.join("ledgers"), base.join("cg"));
        let dead = cgroups.join("pi-python-sandbox.deadbeef.1");
        let foreign = cgroups.join("someone-else");
        let alive = cgroups.join("pi-python-sandbox.0a11fe00.1");
        for d in [&ledgers, &dead, &foreign, &alive] {
            std::fs::create_dir_all(d).unwrap();
        }
        let me = identity(std::process::id()).unwrap();
        // A dead owner (no such pid), listing its own cgroup and one that is not its.
        let dead_ledger = ledgers.join("pi-python-sandbox.deadbeef");
        std::fs::write(&dead_ledger, format!("4000000000 1\n{}\n{}\n", dead.display(), foreign.display())).unwrap();
        // A live owner (this process) keeps what it lists.
        std::fs::write(ledgers.join("pi-python-sandbox.0a11fe00"), format!("{me}\n{}\n", alive.display())).unwrap();
        sweep(&ledgers);
        assert!(!dead.exists() && !dead_ledger.exists());
        assert!(foreign.exists(), "a directory of another name is never removed");
        assert!(alive.exists(), "a live process's cgroups stay");
        // This pid with another start time is a dead owner; what it lists
        // under another process's prefix is still not its to remove.
        std::fs::write(&dead_ledger, format!("{} 1\n{}\n", std::process::id(), alive.display())).unwrap();
        sweep(&ledgers);
        assert!(!dead_ledger.exists(), "a reused pid is not the ledger's owner");
        assert!(alive.exists(), "the prefix must match the ledger's own name");
    }

    #[test]
    fn a_cgroup_namespace_root_maps_to_its_mount_point() {
        let mount =
            CgroupMount { root: "/".into(), mount_point: "/sys/fs/cgroup".into(), v2: true, controllers: vec![] };
        assert_eq!(on_disk(&mount, Path::new("/")), Some(PathBuf::from("/sys/fs/cgroup")));
        let nested = CgroupMount { root: "/a".into(), ..mount };
        assert_eq!(on_disk(&nested, Path::new("/a/b")), Some(PathBuf::from("/sys/fs/cgroup/b")));
        assert_eq!(on_disk(&nested, Path::new("/c")), None);
    }
}
