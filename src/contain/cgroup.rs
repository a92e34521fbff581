//! Applying a containment plan to one sandbox: the cgroups made for it
//! (or, without them, RLIMIT_NPROC where it binds), what its first process
//! joins, its OOM kills, and the removal of the cgroups, with the ledger
//! that lets a later process remove what a killed one left.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{host_plan, Cap, Caps, ContainError, Plan, Split, HOST_LEAF};
use crate::limits::{describe_size, SettingError};

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
                    // cgroup v1 does not charge socket buffers to the limit
                    // above; a limit of their own turns their accounting on.
                    if dir.join("memory.kmem.tcp.limit_in_bytes").exists() {
                        let tcp = super::tcp_share(caps.memory).to_string();
                        write_file(&dir, "memory.kmem.tcp.limit_in_bytes", &tcp)?;
                    }
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
}
