//! Mounts of the host inside a tree the sandbox is shown.
//!
//! bubblewrap binds a tree with everything mounted inside it. A project or
//! a read root may hold a mount of a kernel interface (a chroot's or build
//! root's `proc` and `sys`, a project at `/`): the host's `/proc/sys`
//! writable from inside when pi runs as root, its `/proc/keys` and
//! `slabinfo` readable in any mode. The sandbox's own `/proc` is masked
//! and read-only where it must be; such a mount is not, so it is hidden:
//! every mount strictly inside a shown tree whose file system is not one
//! that holds files ([`DATA_FILESYSTEMS`]) gets an empty read-only
//! directory (or file) over it. The sandbox cannot mount anything itself,
//! so the host's mount table, read at each start, is the whole list.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::hostsecrets::Mask;

/// File systems that hold files and nothing else of the kernel's: shown as
/// they are inside a shown tree. Every other type (proc, sysfs, cgroup,
/// debugfs, tracefs, securityfs, bpf, configfs, efivarfs, devtmpfs, devpts,
/// mqueue, autofs, binfmt_misc, nsfs, ...) is hidden.
pub const DATA_FILESYSTEMS: &[&str] = &[
    "ext2",
    "ext3",
    "ext4",
    "xfs",
    "btrfs",
    "zfs",
    "f2fs",
    "jfs",
    "reiserfs",
    "bcachefs",
    "nilfs2",
    "tmpfs",
    "ramfs",
    "overlay",
    "squashfs",
    "erofs",
    "iso9660",
    "udf",
    "vfat",
    "msdos",
    "exfat",
    "ntfs",
    "ntfs3",
    "hfs",
    "hfsplus",
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "9p",
    "virtiofs",
    "ceph",
    "glusterfs",
    "fuse",
    "fuseblk",
];

/// Whether a mount of type `fstype` is shown inside a shown tree.
pub fn holds_files(fstype: &str) -> bool {
    DATA_FILESYSTEMS.contains(&fstype) || fstype.strip_prefix("fuse.").is_some_and(|rest| !rest.is_empty())
}

/// One line of `/proc/self/mountinfo`: the mount point and the type.
fn parse_line(line: &str) -> Option<(PathBuf, String)> {
    parse_entry(line).map(|(_, point, fstype)| (point, fstype))
}

/// One line of `/proc/self/mountinfo`: the mount id, the mount point and
/// the type.
fn parse_entry(line: &str) -> Option<(u64, PathBuf, String)> {
    let fields: Vec<&str> = line.split(' ').collect();
    let id = fields.first()?.parse().ok()?;
    let point = fields.get(4)?;
    let dash = fields.iter().position(|f| *f == "-")?;
    let fstype = fields.get(dash + 1)?;
    Some((id, PathBuf::from(unescape(point)), (*fstype).to_string()))
}

/// The kernel writes a space, a tab, a newline and a backslash in a path
/// as `\040`, `\011`, `\012` and `\134`.
fn unescape(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// The masks for `table` (mountinfo's text): for each tree, given as (its
/// canonical host path, where the sandbox sees it), every mount strictly
/// inside it that holds no files, at its place in the sandbox.
pub fn masks_in(table: &str, trees: &[(&Path, &Path)], is_dir: impl Fn(&Path) -> bool) -> Vec<Mask> {
    let mut out: Vec<Mask> = Vec::new();
    for (point, fstype) in table.lines().filter_map(parse_line) {
        if holds_files(&fstype) {
            continue;
        }
        for (source, at) in trees {
            let Ok(rel) = point.strip_prefix(source) else { continue };
            if rel.as_os_str().is_empty() {
                continue;
            }
            let mask = Mask { path: at.join(rel), is_dir: is_dir(&point) };
            if !out.contains(&mask) {
                out.push(mask);
            }
        }
    }
    out.sort();
    out
}

/// The mount ids of the mounts [`masks_in`] masks strictly inside `tree`
/// (a canonical host path), from the same `table`: the walk of that tree
/// passes over them (`beneath::Tree::masking`), since no sandbox shown
/// the tree with these masks sees anything in them.
pub fn masked_ids_in(table: &str, tree: &Path) -> BTreeSet<u64> {
    table
        .lines()
        .filter_map(parse_entry)
        .filter(|(_, point, fstype)| {
            !holds_files(fstype) && point.strip_prefix(tree).is_ok_and(|r| !r.as_os_str().is_empty())
        })
        .map(|(id, _, _)| id)
        .collect()
}

/// This process's mount table (bounded: a table past 16 MiB is read no
/// further).
pub fn table() -> String {
    let table = std::fs::File::open("/proc/self/mountinfo")
        .and_then(|f| crate::beneath::read_bounded(std::os::fd::OwnedFd::from(f), 16 << 20))
        .unwrap_or_default();
    String::from_utf8_lossy(&table).into_owned()
}

/// [`masks_in`] of `table` (see [`table`]), each mount point looked at on
/// the host to tell a directory from a file.
pub fn masks_of(table: &str, trees: &[(&Path, &Path)]) -> Vec<Mask> {
    masks_in(table, trees, |p| std::fs::symlink_metadata(p).map(|m| m.is_dir()).unwrap_or(true))
}

/// [`masks_in`] of this process's mount table.
pub fn masks(trees: &[(&Path, &Path)]) -> Vec<Mask> {
    masks_of(&table(), trees)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
40 22 0:50 / /home/u/proj/chroot/proc rw,relatime - proc proc rw
41 22 0:51 / /home/u/proj/chroot/sys rw,relatime - sysfs sysfs rw
42 22 0:52 / /home/u/proj/data rw,relatime - ext4 /dev/sdb1 rw
43 22 0:53 / /home/u/proj/my\\040dir/dbg rw - debugfs debugfs rw
44 22 0:54 / /home/u/proj/fuse rw - fuse.sshfs host:/x rw
45 22 0:55 / /srv/ro/cg rw - cgroup2 cgroup2 rw
46 22 0:56 / /home/u/proj rw - ext4 /dev/sdc1 rw
";

    #[test]
    fn kernel_mounts_inside_a_shown_tree_are_masked_where_the_sandbox_sees_them() {
        let trees: [(&Path, &Path); 2] =
            [(Path::new("/home/u/proj"), Path::new("/workspace")), (Path::new("/srv/ro"), Path::new("/srv/ro"))];
        let masks = masks_in(TABLE, &trees, |_| true);
        let paths: Vec<&Path> = masks.iter().map(|m| m.path.as_path()).collect();
        assert_eq!(
            paths,
            [
                Path::new("/srv/ro/cg"),
                Path::new("/workspace/chroot/proc"),
                Path::new("/workspace/chroot/sys"),
                Path::new("/workspace/my dir/dbg"),
            ]
        );
        // The host's own /proc is outside every tree; the tree's own mount
        // and data file systems inside it are shown.
        assert!(masks_in(TABLE, &[(Path::new("/"), Path::new("/workspace"))], |_| true)
            .iter()
            .any(|m| m.path == Path::new("/workspace/proc")));
    }

    #[test]
    fn the_walk_passes_over_the_mounts_masked_inside_its_tree_alone() {
        // The proc, sysfs and debugfs mounts inside the project; not its
        // data file systems, not its own mount, not another tree's.
        assert_eq!(masked_ids_in(TABLE, Path::new("/home/u/proj")), BTreeSet::from([40, 41, 43]));
        assert_eq!(masked_ids_in(TABLE, Path::new("/srv/ro")), BTreeSet::from([45]));
        assert!(masked_ids_in(TABLE, Path::new("/home/u/proj/data")).is_empty());
    }

    #[test]
    fn data_file_systems_hold_files_and_kernel_interfaces_do_not() {
        for t in ["ext4", "xfs", "btrfs", "tmpfs", "overlay", "nfs4", "fuse.sshfs", "9p"] {
            assert!(holds_files(t), "{t}");
        }
        for t in [
            "proc",
            "sysfs",
            "cgroup",
            "cgroup2",
            "debugfs",
            "tracefs",
            "securityfs",
            "bpf",
            "devtmpfs",
            "fusectl",
            "fuse.",
            "autofs",
        ] {
            assert!(!holds_files(t), "{t}");
        }
    }

    #[test]
    fn escaped_mount_points_are_read_back() {
        assert_eq!(unescape("/a\\040b\\011c\\134d\\012e"), std::ffi::OsString::from("/a b\tc\\d\ne"));
        assert_eq!(unescape("/bad\\04"), std::ffi::OsString::from("/bad\\04"));
    }
}
