//! The host's facts for containment: what the pi process's cgroups are
//! (`/proc/self/cgroup`), where the cgroup file systems are mounted
//! (`/proc/self/mountinfo`), and what one cgroup directory holds. Read
//! here; decided on in `contain`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

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
pub(super) fn unescape(field: &str) -> PathBuf {
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
pub(super) fn on_disk(mount: &CgroupMount, path: &Path) -> Option<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
