//! The namespace helper's mount job against a real bubblewrap sandbox
//! started here as the product starts its own (`--unshare-user
//! --disable-userns`, a read-only root): a tree attached while the
//! sandbox runs, with its host secrets masked, a file mount point made
//! where none was, a detach, and links the sandbox planted on the way to
//! a mount point, never followed. The sandbox is a shell that runs the
//! test's commands; `/mnt` is a tmpfs it may write (where the product's
//! sandbox has /tmp and /scratch), so that it can plant links.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use pi_python_sandbox::nshelper::mount::{attach, detach, Attach, Mask, MountError, Stage};

struct Sandbox {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// A process inside (bubblewrap's child: the pid namespace's init).
    inside: i32,
}

const SERVE: &str = "while IFS= read -r cmd; do eval \"$cmd\" 2>&1; echo \"@@END $?\"; done";

impl Sandbox {
    fn start() -> Sandbox {
        Sandbox::start_with(&[])
    }

    /// With `extra` bubblewrap arguments after the `/mnt` tmpfs.
    fn start_with(extra: &[&str]) -> Sandbox {
        let mut child = Command::new("bwrap")
            .args(["--unshare-user", "--disable-userns", "--unshare-pid", "--die-with-parent"])
            .args(["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib"])
            .args(["--symlink", "usr/bin", "/bin", "--proc", "/proc", "--tmpfs", "/mnt"])
            .args(extra)
            .args(["--remount-ro", "/"])
            .args(["--", "/bin/sh", "-c", SERVE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("bwrap");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut s = Sandbox { inside: 0, child, stdin, stdout };
        // Once the shell answers, bubblewrap's child is there.
        assert_eq!(s.run("true").1, 0);
        let pid = s.child.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        s.inside = children.split_whitespace().next().expect("a process inside").parse().unwrap();
        s
    }

    /// Run `cmd` in the sandbox's shell: its output and status.
    fn run(&mut self, cmd: &str) -> (String, i32) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut out = String::new();
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the sandbox's shell ended: {out}");
            if let Some(code) = line.strip_prefix("@@END ") {
                return (out, code.trim().parse().unwrap());
            }
            out.push_str(&line);
        }
    }

    fn out(&mut self, cmd: &str) -> String {
        self.run(cmd).0
    }

    fn mounted_at(&mut self, at: &str) -> bool {
        self.out("cat /proc/self/mountinfo").lines().any(|l| l.split(' ').nth(4) == Some(at))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host tree to grant: `data.txt`, a secret directory `vault` and a
/// secret file `key.pem`, and the session's empty mask sources.
struct Host {
    dir: PathBuf,
}

impl Host {
    fn new(name: &str) -> Host {
        let dir = std::env::temp_dir().join(format!("pps-live-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["src/vault", "src/sub", "mask-dir"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("src/data.txt"), "granted-data\n").unwrap();
        std::fs::write(dir.join("src/vault/token"), "vault-token\n").unwrap();
        std::fs::write(dir.join("src/key.pem"), "private-key\n").unwrap();
        std::fs::write(dir.join("src/sub/f.csv"), "1,2\n").unwrap();
        std::fs::write(dir.join("mask-file"), "").unwrap();
        // Readable by the sandbox's user whoever runs the test.
        for d in ["", "src", "src/vault", "src/sub", "mask-dir"] {
            std::fs::set_permissions(dir.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Host { dir: std::fs::canonicalize(&dir).unwrap() }
    }

    fn src(&self) -> PathBuf {
        self.dir.join("src")
    }

    fn masks(&self) -> Vec<Mask> {
        vec![
            Mask { path: self.src().join("vault"), is_dir: true },
            Mask { path: self.src().join("key.pem"), is_dir: false },
        ]
    }

    fn grant<'a>(&'a self, source: &'a Path, at: &'a Path, is_dir: bool, masks: &'a [Mask]) -> Attach<'a> {
        Attach { source, at, is_dir, masks, mask_file: self.mask_file(), mask_dir: self.mask_dir() }
    }

    fn mask_file(&self) -> &'static Path {
        Box::leak(self.dir.join("mask-file").into_boxed_path())
    }

    fn mask_dir(&self) -> &'static Path {
        Box::leak(self.dir.join("mask-dir").into_boxed_path())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ready(name: &str) -> Option<(Sandbox, Host)> {
    if !super::sandbox_runs(name) {
        return None;
    }
    Some((Sandbox::start(), Host::new(name)))
}

fn refused_at(e: &MountError) -> Option<(Stage, i32)> {
    match e {
        MountError::Step { stage, source, .. } => Some((*stage, source.raw_os_error().unwrap_or(0))),
        _ => None,
    }
}

#[test]
fn a_tree_attached_to_a_running_sandbox_is_read_only_with_its_host_secrets_masked() {
    let Some((mut sb, host)) = ready("attach") else { return };
    let src = host.src();
    // Neither /srv nor anything under it exists in the sandbox's root.
    assert_ne!(sb.run("ls /srv").1, 0);
    let masks = host.masks();
    let at = Path::new("/srv/grant/tree");
    let began = Instant::now();
    let done = attach(sb.inside, &host.grant(&src, at, true, &masks)).expect("attached");
    eprintln!("attach took {:?} (whole call {:?})", done.took, began.elapsed());
    assert!(done.took < Duration::from_secs(2));
    assert_eq!(sb.out("cat /srv/grant/tree/data.txt"), "granted-data\n");
    assert_eq!(sb.out("ls -A /srv/grant/tree/vault"), "", "the secret directory is an empty one");
    assert_eq!(sb.run("cat /srv/grant/tree/key.pem"), (String::new(), 0), "the secret file is an empty one");
    let (text, status) = sb.run("echo x > /srv/grant/tree/new");
    assert_ne!(status, 0);
    assert!(text.contains("Read-only"), "{text}");
    assert!(sb.mounted_at("/srv/grant/tree"));
    let info = sb.out("cat /proc/self/mountinfo");
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some("/srv/grant/tree")).unwrap();
    assert!(line.split(' ').nth(5).unwrap().split(',').any(|o| o == "ro"), "{line}");
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    // The root stays read-only to the sandbox (the mount points were made
    // through a clone of its mount, never by lifting the sandbox's own).
    let (text, status) = sb.run("mkdir /made-by-the-sandbox");
    assert_ne!(status, 0);
    assert!(text.contains("Read-only"), "{text}");
    // Baseline: without the masks, the same tree carries the secrets along.
    attach(sb.inside, &host.grant(&src, Path::new("/srv/plain"), true, &[])).expect("attached");
    assert_eq!(sb.out("cat /srv/plain/vault/token /srv/plain/key.pem"), "vault-token\nprivate-key\n");
    // And the host's own files are as they were.
    assert_eq!(std::fs::read_to_string(src.join("vault/token")).unwrap(), "vault-token\n");
}

#[test]
fn a_file_is_attached_at_a_file_mount_point_made_where_none_was() {
    let Some((mut sb, host)) = ready("file") else { return };
    let file = host.src().join("sub/f.csv");
    attach(sb.inside, &host.grant(&file, Path::new("/opt/one/f.csv"), false, &[])).expect("attached");
    assert_eq!(sb.out("cat /opt/one/f.csv"), "1,2\n");
    assert_eq!(sb.out("ls -A /opt/one"), "f.csv\n", "just that file");
    // A directory source for a file grant, and the other way round: refused before the fork.
    let dir = host.src();
    assert!(matches!(
        attach(sb.inside, &host.grant(&dir, Path::new("/opt/two"), false, &[])),
        Err(MountError::SourceKind { dir: true, .. })
    ));
    assert!(matches!(
        attach(sb.inside, &host.grant(&file, Path::new("/opt/three"), true, &[])),
        Err(MountError::SourceKind { dir: false, .. })
    ));
}

#[test]
fn a_link_the_sandbox_planted_at_a_parent_of_the_mount_point_is_not_followed() {
    let Some((mut sb, host)) = ready("parent-link") else { return };
    let src = host.src();
    assert_eq!(sb.run("mkdir -p /mnt/real/sub && ln -s /mnt/real /mnt/p").1, 0);
    let e = attach(sb.inside, &host.grant(&src, Path::new("/mnt/p/sub"), true, &[])).expect_err("refused");
    assert_eq!(refused_at(&e), Some((Stage::Walk, libc::ELOOP)), "{e}");
    assert!(!sb.mounted_at("/mnt/real/sub"), "nothing was mounted where the link points");
    assert_eq!(sb.out("ls -A /mnt/real/sub"), "");
    // Baseline: mounted where the link points, the grant is what the
    // planted name shows (what following the link would have done).
    attach(sb.inside, &host.grant(&src, Path::new("/mnt/real/sub"), true, &[])).expect("attached");
    assert_eq!(sb.out("cat /mnt/p/sub/data.txt"), "granted-data\n");
}

#[test]
fn a_link_the_sandbox_planted_at_the_mount_point_itself_is_not_followed() {
    let Some((mut sb, host)) = ready("point-link") else { return };
    let (src, file) = (host.src(), host.src().join("sub/f.csv"));
    let plant =
        "mkdir -p /mnt/real/dir && touch /mnt/real/file && ln -s /mnt/real/dir /mnt/d && ln -s /mnt/real/file /mnt/f";
    assert_eq!(sb.run(plant).1, 0);
    let e = attach(sb.inside, &host.grant(&src, Path::new("/mnt/d"), true, &[])).expect_err("refused");
    assert_eq!(refused_at(&e), Some((Stage::Walk, libc::ELOOP)), "{e}");
    let e = attach(sb.inside, &host.grant(&file, Path::new("/mnt/f"), false, &[])).expect_err("refused");
    assert_eq!(refused_at(&e), Some((Stage::Walk, libc::ELOOP)), "{e}");
    assert!(!sb.mounted_at("/mnt/real/dir") && !sb.mounted_at("/mnt/real/file"));
    assert_eq!(sb.out("cat /mnt/f; ls -A /mnt/d"), "");
    // Baseline: at the targets themselves, both attach and show through the links.
    attach(sb.inside, &host.grant(&src, Path::new("/mnt/real/dir"), true, &[])).expect("attached");
    attach(sb.inside, &host.grant(&file, Path::new("/mnt/real/file"), false, &[])).expect("attached");
    assert_eq!(sb.out("cat /mnt/f /mnt/d/data.txt"), "1,2\ngranted-data\n");
}

#[test]
fn a_mount_point_is_never_made_under_another_mount() {
    let Some((mut sb, host)) = ready("other-mount") else { return };
    // /mnt is the sandbox's own tmpfs: the helper makes nothing there.
    let e = attach(sb.inside, &host.grant(&host.src(), Path::new("/mnt/new/dir"), true, &[])).expect_err("refused");
    assert_eq!(refused_at(&e), Some((Stage::NotOnRoot, libc::EXDEV)), "{e}");
    assert_eq!(sb.out("ls -A /mnt"), "");
}

#[test]
fn a_detached_tree_is_gone_for_new_opens_and_an_open_file_stays_readable() {
    let Some((mut sb, host)) = ready("detach") else { return };
    let src = host.src();
    let at = Path::new("/srv/d");
    attach(sb.inside, &host.grant(&src, at, true, &[])).expect("attached");
    assert_eq!(sb.run("exec 3</srv/d/data.txt").1, 0);
    detach(sb.inside, at).expect("detached");
    assert!(!sb.mounted_at("/srv/d"));
    assert_ne!(sb.run("cat /srv/d/data.txt").1, 0, "new opens fail");
    assert_eq!(sb.out("cat <&3"), "granted-data\n", "the open file is still read");
    // A link on the way is not followed by a detach either.
    assert_eq!(sb.run("mkdir -p /mnt/x && ln -s /srv /mnt/l").1, 0);
    attach(sb.inside, &host.grant(&src, at, true, &[])).expect("attached");
    let e = detach(sb.inside, Path::new("/mnt/l/d")).expect_err("refused");
    assert_eq!(refused_at(&e), Some((Stage::Walk, libc::ELOOP)), "{e}");
    assert!(sb.mounted_at("/srv/d"));
}

/// A project for the remount job: `f.txt` and a protected `.git/config`,
/// mounted as the product mounts a read-only project (`/work`, with the
/// protected directory bound read-only over it), writable by the
/// sandbox's user whoever runs the test.
fn project_sandbox(name: &str) -> Option<(Sandbox, Host)> {
    if !super::sandbox_runs(name) {
        return None;
    }
    let host = Host::new(name);
    let proj = host.dir.join("proj");
    std::fs::create_dir_all(proj.join(".git")).unwrap();
    std::fs::write(proj.join("f.txt"), "project-file\n").unwrap();
    std::fs::write(proj.join(".git/config"), "[core]\n").unwrap();
    for d in ["proj", "proj/.git"] {
        std::fs::set_permissions(host.dir.join(d), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    for f in ["proj/f.txt", "proj/.git/config"] {
        std::fs::set_permissions(host.dir.join(f), std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let (p, git) = (proj.display().to_string(), proj.join(".git").display().to_string());
    let sb = Sandbox::start_with(&["--ro-bind", &p, "/work", "--ro-bind", &git, "/work/.git"]);
    Some((sb, host))
}

/// The options field of the mount at `at` in the sandbox's mount table.
fn options(sb: &mut Sandbox, at: &str) -> String {
    let info = sb.out("cat /proc/self/mountinfo");
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(at)).expect("mounted").to_string();
    line.split(' ').nth(5).unwrap().to_string()
}

fn is_ro(opts: &str) -> bool {
    opts.split(',').any(|o| o == "ro")
}

#[test]
fn the_project_mount_is_made_writable_and_read_only_again_in_place_its_protected_submount_untouched() {
    use pi_python_sandbox::nshelper::remount::set_read_only;
    let Some((mut sb, host)) = project_sandbox("remount") else { return };
    // Baseline: read-only, and the sandbox cannot change that itself.
    let (text, status) = sb.run("echo x > /work/new");
    assert!(status != 0 && text.contains("Read-only"), "{text}");
    assert_ne!(sb.run("mount -o remount,rw,bind /work").1, 0, "the sandbox has no privilege over its mounts");
    assert!(is_ro(&options(&mut sb, "/work")));
    set_read_only(sb.inside, Path::new("/work"), false).expect("made writable");
    assert!(!is_ro(&options(&mut sb, "/work")));
    assert_eq!(sb.run("echo written > /work/new").1, 0);
    assert_eq!(std::fs::read_to_string(host.dir.join("proj/new")).unwrap(), "written\n");
    // Just that mount: the protected directory bound over it stays read-only.
    let (text, status) = sb.run("echo x >> /work/.git/config");
    assert!(status != 0 && text.contains("Read-only"), "{text}");
    assert!(is_ro(&options(&mut sb, "/work/.git")));
    set_read_only(sb.inside, Path::new("/work"), true).expect("read-only again");
    assert!(is_ro(&options(&mut sb, "/work")));
    let (text, status) = sb.run("echo x > /work/other");
    assert!(status != 0 && text.contains("Read-only"), "{text}");
    assert_eq!(std::fs::read_to_string(host.dir.join("proj/.git/config")).unwrap(), "[core]\n");
}

#[test]
fn a_file_open_for_writing_refuses_the_change_to_read_only_and_a_file_opened_read_only_never_writes() {
    use pi_python_sandbox::nshelper::remount::set_read_only;
    let Some((mut sb, host)) = project_sandbox("remount-busy") else { return };
    // Opened read-only while the mount is: it stays so once the mount is writable.
    assert_eq!(sb.run("exec 4< /work/f.txt").1, 0);
    set_read_only(sb.inside, Path::new("/work"), false).expect("made writable");
    assert_ne!(sb.run("echo through-4 >&4").1, 0, "an fd opened read-only does not write");
    // Held open for writing: the kernel refuses read-only (the caller restarts).
    assert_eq!(sb.run("exec 3>> /work/held").1, 0);
    let e = set_read_only(sb.inside, Path::new("/work"), true).expect_err("busy");
    assert_eq!(refused_at(&e), Some((Stage::Remount, libc::EBUSY)), "{e}");
    assert!(!is_ro(&options(&mut sb, "/work")), "left writable, as it was");
    assert_eq!(sb.run("echo through-3 >&3").1, 0);
    // Closed: the change goes through, and nothing writes any more.
    assert_eq!(sb.run("exec 3>&-").1, 0);
    set_read_only(sb.inside, Path::new("/work"), true).expect("read-only");
    assert_ne!(sb.run("echo x >> /work/held").1, 0);
    assert_eq!(std::fs::read_to_string(host.dir.join("proj/held")).unwrap(), "through-3\n");
    assert_eq!(std::fs::read_to_string(host.dir.join("proj/f.txt")).unwrap(), "project-file\n");
}

#[test]
fn a_remount_never_follows_a_link_the_sandbox_planted_nor_changes_a_path_that_is_no_mount() {
    use pi_python_sandbox::nshelper::remount::set_read_only;
    let Some((mut sb, _host)) = project_sandbox("remount-link") else { return };
    // Baseline: the sandbox may plant where it writes, and its link leads to the project.
    assert_eq!(sb.run("ln -s /work /mnt/link && mkdir /mnt/dir").1, 0);
    assert_eq!(sb.out("cat /mnt/link/f.txt"), "project-file\n");
    let e = set_read_only(sb.inside, Path::new("/mnt/link"), false).expect_err("a link");
    assert_eq!(refused_at(&e), Some((Stage::Walk, libc::ELOOP)), "{e}");
    assert!(is_ro(&options(&mut sb, "/work")), "the link's target is untouched");
    // A directory that is not a mount of its own: its mount (/mnt) is not changed.
    let before = options(&mut sb, "/mnt");
    let e = set_read_only(sb.inside, Path::new("/mnt/dir"), true).expect_err("no mount");
    assert_eq!(refused_at(&e), Some((Stage::Kind, libc::EINVAL)), "{e}");
    assert_eq!(options(&mut sb, "/mnt"), before);
    assert_eq!(sb.run("touch /mnt/dir/still-writable").1, 0);
}

/// The mount table's rows under `/work` (mount point, options, root in
/// its filesystem, type), without ids and peer groups, sorted.
fn work_rows(sb: &mut Sandbox) -> Vec<String> {
    let mut rows: Vec<String> = sb
        .out("cat /proc/self/mountinfo")
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let f: Vec<&str> = a.split(' ').collect();
            let at = *f.get(4)?;
            let fstype = b.split(' ').next()?;
            (at == "/work" || at.starts_with("/work/")).then(|| format!("{at} {} {} {fstype}", f[5], f[3]))
        })
        .collect();
    rows.sort();
    rows
}

/// A project with a protected `.git` and a secret `.env`, its mask file,
/// and the bubblewrap arguments of a fresh start in either mode.
struct Swapped {
    host: Host,
}

impl Swapped {
    fn new(name: &str) -> Option<(Sandbox, Swapped)> {
        let (sb, host) = project_sandbox(name)?;
        drop(sb);
        std::fs::write(host.dir.join("proj/.env"), "API_KEY=project-secret\n").unwrap();
        std::fs::set_permissions(host.dir.join("proj/.env"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = Swapped { host };
        // With /dev: the shell's background jobs read /dev/null.
        let mut args = vec!["--dev".to_string(), "/dev".into()];
        args.extend(s.args(false));
        let sb = Sandbox::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Some((sb, s))
    }

    fn args(&self, writable: bool) -> Vec<String> {
        let d = &self.host.dir;
        let p = |x: &str| d.join(x).display().to_string();
        let mut a = vec![if writable { "--bind" } else { "--ro-bind" }.to_string(), p("proj"), "/work".into()];
        if writable {
            a.extend(["--ro-bind".into(), p("proj/.git"), "/work/.git".into()]);
        }
        a.extend(["--ro-bind".into(), p("mask-file"), "/work/.env".into()]);
        a
    }

    fn over(&self, writable: bool) -> Vec<pi_python_sandbox::nshelper::swap::Over> {
        use pi_python_sandbox::nshelper::swap::{From, Over};
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(self.host.dir.join("proj/.git")).unwrap();
        let git = Over { rel: ".git".into(), from: From::Project { ident: (m.dev(), m.ino()) }, read_only: true };
        let env = Over { rel: ".env".into(), from: From::Mask { is_dir: false }, read_only: true };
        if writable {
            vec![git, env]
        } else {
            vec![env]
        }
    }

    fn replace(&self, sb: &Sandbox, writable: bool) -> Result<(), MountError> {
        use pi_python_sandbox::nshelper::swap::{replace, Replace};
        use std::os::unix::fs::MetadataExt;
        let project = self.host.dir.join("proj");
        let m = std::fs::metadata(&project).unwrap();
        let over = self.over(writable);
        let r = Replace {
            project: &project,
            ident: (m.dev(), m.ino()),
            at: Path::new("/work"),
            writable,
            over: &over,
            mask_file: self.host.mask_file(),
            mask_dir: self.host.mask_dir(),
        };
        replace(sb.inside, &r)
    }

    /// The `/work` rows of a fresh sandbox in the mode.
    fn fresh(&self, writable: bool) -> Vec<String> {
        let args = self.args(writable);
        let mut sb = Sandbox::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
        work_rows(&mut sb)
    }
}

#[test]
fn a_swapped_project_tree_has_the_mount_table_of_a_fresh_start_in_each_mode() {
    let Some((mut sb, s)) = Swapped::new("swap-table") else { return };
    let (ro, rw) = (s.fresh(false), s.fresh(true));
    assert_ne!(ro, rw, "baseline: the modes' tables differ");
    assert_eq!(work_rows(&mut sb), ro);
    s.replace(&sb, true).expect("to writable");
    assert_eq!(work_rows(&mut sb), rw);
    assert_eq!(sb.run("echo w > /work/new").1, 0);
    let (text, status) = sb.run("echo x >> /work/.git/config");
    assert!(status != 0 && text.contains("Read-only"), "{text}");
    assert_eq!(sb.out("cat /work/.env"), "", "the secret stays masked");
    s.replace(&sb, false).expect("to read-only");
    assert_eq!(work_rows(&mut sb), ro);
    let (text, status) = sb.run("echo x > /work/other");
    assert!(status != 0 && text.contains("Read-only"), "{text}");
    assert_eq!(sb.out("cat /work/.env"), "");
    assert_eq!(std::fs::read_to_string(s.host.dir.join("proj/.git/config")).unwrap(), "[core]\n");
}

#[test]
fn a_writer_racing_the_changes_never_writes_a_protected_path_nor_after_the_change_back() {
    let Some((mut sb, s)) = Swapped::new("swap-race") else { return };
    // Writers left running: one at the protected file, one at the project; each logs a success.
    let race = "while :; do echo g 2>/mnt/err >> /work/.git/config && echo git >> /mnt/log; \
                echo p 2>/mnt/err >> /work/f.txt && echo proj >> /mnt/log; done";
    assert_eq!(sb.run(&format!("( {race} ) >/mnt/out 2>&1 & echo $! > /mnt/pid")).1, 0);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sb.out("touch /mnt/log; cat /mnt/log"), "", "read-only: nothing written");
    for _ in 0..5 {
        s.replace(&sb, true).expect("to writable");
        std::thread::sleep(Duration::from_millis(50));
        match s.replace(&sb, false) {
            Ok(()) => {}
            // The writer held the project's file open at that instant: refused, still writable; again.
            Err(e) if refused_at(&e) == Some((Stage::Remount, libc::EBUSY)) => {
                let mut done = false;
                for _ in 0..100 {
                    if s.replace(&sb, false).is_ok() {
                        done = true;
                        break;
                    }
                }
                assert!(done, "read-only again");
            }
            Err(e) => panic!("{e}"),
        }
    }
    let log = sb.out("cat /mnt/log");
    let count = |what: &str| log.lines().filter(|l| *l == what).count();
    assert!(count("proj") > 0, "baseline: the writer writes the project while it is writable");
    assert_eq!(count("git"), 0, "the protected file was never written");
    // After the change back nothing more is written.
    let n = std::fs::read_to_string(s.host.dir.join("proj/f.txt")).unwrap().len();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(std::fs::read_to_string(s.host.dir.join("proj/f.txt")).unwrap().len(), n);
    assert_eq!(std::fs::read_to_string(s.host.dir.join("proj/.git/config")).unwrap(), "[core]\n");
    sb.run("kill $(cat /mnt/pid)");
}
