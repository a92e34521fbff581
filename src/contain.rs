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
//!
//! Three files: this one holds the caps (the settings), the errors and the
//! decision ([`choose`], pure, from the host's facts); `host` reads those
//! facts (`/proc/self/cgroup`, the cgroup mounts, one directory's files);
//! `cgroup` applies a plan to one sandbox (its cgroups, the RLIMIT_NPROC
//! fallback, the ledger of what this process made, their removal).

use std::io;
use std::path::{Path, PathBuf};

use crate::limits::{describe_size, parse_size, SettingError};

mod cgroup;
mod host;

pub use cgroup::{cleanup_all, for_sandbox, join_file, oom_kills, sweep_dead, Contained};
use host::on_disk;
pub use host::{dir_facts, parse_mountinfo, parse_proc_cgroup, CgroupMount, DirFacts, Membership};

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

/// Most TCP socket buffer memory of one sandbox on cgroup v1.
pub const TCP_MAX: u64 = 64 << 20;

/// The TCP socket buffer memory (`memory.kmem.tcp.limit_in_bytes`) of a
/// sandbox whose memory cap is `memory`, on cgroup v1, where socket buffers
/// are not charged to that cap but to the host-wide `net.ipv4.tcp_mem`
/// (every network namespace's sockets together; past its second value the
/// kernel trims every TCP socket's buffers): at most [`TCP_MAX`] and the
/// memory cap. cgroup v2 charges them to `memory.max` itself.
pub fn tcp_share(memory: u64) -> u64 {
    memory.min(TCP_MAX)
}

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

/// `status`'s one line on containment: the caps in force and by what.
pub fn summary(plan: &Plan, caps: &Result<Caps, SettingError>) -> String {
    let Ok(caps) = caps else {
        return "not set up: a setting is wrong (see containment under details)".into();
    };
    let tasks = match &plan.tasks {
        Cap::None => "tasks NOT capped".to_string(),
        c => format!("at most {} tasks ({})", caps.tasks, c.name()),
    };
    let memory = match &plan.memory {
        Cap::CgroupV2(_) | Cap::CgroupV1(_) => {
            format!("{} of memory in all ({})", describe_size(caps.memory), plan.memory.name())
        }
        Cap::Nproc | Cap::None => "memory NOT capped in all".to_string(),
    };
    format!("{tasks}, {memory}; no network; seccomp filter; no capabilities")
}

#[cfg(test)]
mod tests {
    use super::host::unescape;
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
    fn the_tcp_share_is_at_most_64_mib_and_the_memory_cap() {
        assert_eq!(tcp_share(DEFAULT_MAX_MEMORY), 64 << 20);
        assert_eq!(tcp_share(MIN_MEMORY), MIN_MEMORY);
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
}
