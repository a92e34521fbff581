//! The engine against the real bubblewrap sandbox (no Node involved).
//! Skips with the reason printed where bwrap cannot run; under CI=true a
//! skip is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use pi_python_sandbox::outcome::{render, Status};
use pi_python_sandbox::session::{Session, SessionOptions};

#[path = "sandbox/halts.rs"]
mod halts;
#[path = "sandbox/live_mounts.rs"]
mod live_mounts;
#[path = "sandbox/net_listener.rs"]
mod net_listener;
#[path = "sandbox/net_shell.rs"]
mod net_shell;

struct Fixture {
    dir: PathBuf,
    session: Arc<Session>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str) -> Option<Fixture> {
    fixture_with(name, None)
}

/// A fixture whose sandboxes roll back as `rollback` says (None: the
/// environment's setting).
fn fixture_with(name: &str, rollback: Option<bool>) -> Option<Fixture> {
    fixture_opts(name, SessionOptions { rollback, ..Default::default() })
}

/// A fixture with `opts` (the project and the runtime root are its own).
fn fixture_opts(name: &str, opts: SessionOptions) -> Option<Fixture> {
    if !sandbox_runs(name) {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("pps-rs-{name}-{}", std::process::id()));
    let project = dir.join("project");
    std::fs::create_dir_all(&project).expect("project dir");
    std::fs::write(project.join("data.txt"), "fixture-content\n").expect("fixture");
    let session = Session::new(SessionOptions {
        project_dir: project,
        runtime_root: Some(dir.join("runtime")),
        // No background spare: a test that ends while one starts would race
        // the runtime's shutdown.
        prewarm: Some(false),
        ..opts
    });
    Some(Fixture { dir, session })
}

/// Whether bubblewrap runs here; where it does not, test `name` says why
/// and is skipped, except under CI=true, where the sandbox must run and
/// the skip fails.
fn sandbox_runs(name: &str) -> bool {
    match can_sandbox() {
        Ok(()) => true,
        Err(why) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "sandbox test skipped under CI: {why}");
            eprintln!("SKIP {name}: {why}");
            false
        }
    }
}

fn can_sandbox() -> Result<(), String> {
    let ok = std::process::Command::new("bwrap")
        .args([
            "--unshare-user",
            "--unshare-pid",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--symlink",
            "usr/lib",
            "/lib",
            "--",
            "/usr/bin/true",
        ])
        .status()
        .map_err(|e| format!("bwrap not runnable: {e}"))?;
    if ok.success() {
        Ok(())
    } else {
        Err(format!("bwrap cannot create namespaces here ({ok})"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_code_and_keeps_state() {
    let Some(f) = fixture("state") else { return };
    let a = f.session.execute("x = 41\nprint('hi')".into(), 30, None).await;
    assert_eq!(a.status, Status::Ok, "{}", render(&a));
    assert_eq!(a.stdout.head, "hi\n");
    let b = f.session.execute("x + 1".into(), 30, None).await;
    assert_eq!(b.repr.as_deref(), Some("42"), "{}", render(&b));
    assert_eq!(b.generation, 1);
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_and_next_call_is_fresh() {
    let Some(f) = fixture_with("timeout", Some(false)) else { return };
    f.session.execute("y = 1".into(), 30, None).await;
    let t = f.session.execute("while True: pass".into(), 1, None).await;
    assert_eq!(t.status, Status::Timeout, "{}", render(&t));
    assert!(t.state_lost());
    let n = f.session.execute("y".into(), 30, None).await;
    assert_eq!(n.status, Status::RuntimeError, "{}", render(&n));
    assert_eq!(n.generation, 2);
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_rolls_back_and_leaves_only_the_interpreter() {
    let Some(f) = fixture("rollback") else { return };
    f.session.execute("y = 1".into(), 30, None).await;
    f.session.execute("z = [1, 2]".into(), 30, None).await;
    let code = "import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\nz.append(3)\ny = 2\nwhile True: pass";
    let t = f.session.execute(code.into(), 1, None).await;
    assert_eq!(t.status, Status::Timeout, "{}", render(&t));
    assert!(t.rolled_back() && !t.state_lost(), "{}", render(&t));
    let n = f.session.execute("(y, z)".into(), 30, None).await;
    assert_eq!(n.repr.as_deref(), Some("(1, [1, 2])"), "{}", render(&n));
    assert_eq!(n.generation, t.generation);
    // Every other process is gone once PID 1 has reaped it (it reaps as
    // they end, so a killed one may still be a zombie for a moment):
    // asked a few times, never more than a second.
    let others = "import os, time\n\
        me = os.getpid()\n\
        def others():\n\
        \x20   out = []\n\
        \x20   for p in os.listdir('/proc'):\n\
        \x20       if not p.isdigit() or int(p) in (1, me):\n\
        \x20           continue\n\
        \x20       try:\n\
        \x20           state, ppid = open(f'/proc/{p}/stat').read().rsplit(') ', 1)[1].split()[:2]\n\
        \x20       except OSError:\n\
        \x20           continue\n\
        \x20       if ppid != str(me):\n\
        \x20           out.append((p, state))\n\
        \x20   return out\n\
        for _ in range(20):\n\
        \x20   left = others()\n\
        \x20   if not left:\n\
        \x20       break\n\
        \x20   time.sleep(0.05)\n\
        left";
    let left = f.session.execute(others.into(), 30, None).await;
    assert_eq!(left.repr.as_deref(), Some("[]"), "{}", render(&left));
    f.session.dispose("test").await;
}

/// An interpreter's death says how it ended, with rollback on (PID 1
/// records it) and off (the sandbox's own exit), and the state statement
/// after it is true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_names_its_exit_code_or_signal_with_rollback_on_and_off() {
    for rollback in [true, false] {
        let Some(f) = fixture_with(&format!("crash-{rollback}"), Some(rollback)) else { return };
        f.session.execute("y = 1".into(), 30, None).await;
        f.session.execute("z = 2".into(), 30, None).await;
        let exited = f.session.execute("import os\nos._exit(3)".into(), 30, None).await;
        let text = render(&exited);
        assert_eq!(exited.status, Status::WorkerError, "{text}");
        assert!(text.contains("exited with code 3"), "rollback {rollback}: {text}");
        let crashed = f.session.execute("import ctypes\nctypes.string_at(0)".into(), 30, None).await;
        let text = render(&crashed);
        assert_eq!(crashed.status, Status::WorkerError, "{text}");
        assert!(text.contains("killed by signal 11 (SIGSEGV"), "rollback {rollback}: {text}");
        assert_eq!(crashed.rolled_back(), rollback, "{text}");
        let after = f.session.execute("'y' in globals()".into(), 30, None).await;
        assert_eq!(after.repr.as_deref(), Some(if rollback { "True" } else { "False" }), "{}", render(&after));
        f.session.dispose("test").await;
    }
}

/// Run `code` and return its stdout, asserting the call succeeded.
async fn stdout_of(f: &Fixture, code: &str) -> String {
    let o = f.session.execute(code.into(), 30, None).await;
    assert_eq!(o.status, Status::Ok, "{}", render(&o));
    format!("{}{}", o.stdout.head, o.stdout.tail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confinement_holds_for_this_user() {
    let Some(f) = fixture("confine") else { return };
    let out = stdout_of(
        &f,
        r#"
import os, socket, ctypes
def attempt(fn):
    try:
        fn(); return "allowed"
    except OSError as e:
        return "errno%d" % e.errno
print("ws-write", attempt(lambda: open("/workspace/new.txt", "w")))
print("scratch-write", attempt(lambda: open("/scratch/s.txt", "w").write("from-sandbox")))
print("socket", attempt(lambda: socket.socket()))
libc = ctypes.CDLL(None, use_errno=True)
print("unshare-user", libc.unshare(0x10000000), ctypes.get_errno() != 0)
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print("nnp", status["NoNewPrivs"].strip(), "seccomp", status["Seccomp"].strip(), "capeff", status["CapEff"].strip())
print("env", sorted(os.environ))
"#,
    )
    .await;
    assert!(out.contains("ws-write errno30"), "{out}");
    assert!(out.contains("scratch-write allowed"), "{out}");
    assert!(out.contains("socket errno1"), "{out}");
    assert!(out.contains("unshare-user -1 True"), "{out}");
    assert!(out.contains("nnp 1 seccomp 2 capeff 0000000000000000"), "{out}");
    assert!(out.contains("env ['HOME', 'LANG', 'PATH', 'TMPDIR']"), "{out}");
    let scratch = f.session.status().dirs.expect("dirs").scratch;
    assert_eq!(std::fs::read_to_string(scratch.join("s.txt")).expect("host sees scratch"), "from-sandbox");
    assert!(!f.dir.join("project/new.txt").exists());
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_outside_the_mounts_become_permission_needed() {
    let Some(f) = fixture("reads") else { return };
    let s = &f.session;
    let ok = s.execute("x = 1\nopen('data.txt').read()".into(), 30, None).await;
    assert_eq!(ok.repr.as_deref(), Some("'fixture-content\\n'"), "{}", render(&ok));
    for (code, path, is_dir) in [
        ("open('/etc/hostname')", "/etc/hostname", false),
        ("open('../etc/passwd')", "/etc/passwd", false),
        ("import os; os.listdir('/etc')", "/etc", true),
        ("import pathlib; pathlib.Path('/root/.bashrc').read_text()", "/root/.bashrc", false),
    ] {
        let o = s.execute(code.into(), 30, None).await;
        assert_eq!(o.status, Status::PermissionNeeded, "{code}: {}", render(&o));
        assert_eq!(o.permission_path.as_deref(), Some(path), "{code}");
        assert_eq!(o.permission_is_dir, is_dir, "{code}");
        assert!(!o.state_lost());
    }
    // Runtime paths, the scratch and stat-like probes pass; state survived.
    let fine = s
        .execute(
            "import os, json\nopen('/usr/lib/os-release').close(); open('/scratch/a', 'w').close()\n\
         (os.path.exists('/etc/hostname'), os.listdir('/scratch'), x)"
                .into(),
            30,
            None,
        )
        .await;
    assert_eq!(fine.status, Status::Ok, "{}", render(&fine));
    assert_eq!(fine.repr.as_deref(), Some("(False, ['a'], 1)"));
    // Caught by user code, it is an ordinary exception.
    let caught = s
        .execute(
            "try:\n    open('/etc/hostname')\nexcept Exception as e:\n    r = type(e).__name__\nr".into(),
            30,
            None,
        )
        .await;
    assert_eq!(caught.repr.as_deref(), Some("'SandboxReadDenied'"));
    s.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_change_restarts_the_sandbox_and_says_so() {
    // With rollback on the change is made in place (live-grants tests); off, it restarts.
    let Some(f) = fixture_with("remount", Some(false)) else { return };
    let s = &f.session;
    let first = s.execute("v = 1\nopen('/workspace/w.txt', 'w')".into(), 30, None).await;
    assert_eq!(first.exception.as_ref().map(|e| e.type_name.as_str()), Some("OSError"), "{}", render(&first));
    let changed =
        s.set_mounts(pi_python_sandbox::permissions::MountConfig { workspace_writable: true, ..Default::default() });
    assert_eq!(changed, Some(true), "a running interpreter was discarded");
    let second = s.execute("open('/workspace/w.txt', 'w').write('hi')\n'v' in globals()".into(), 30, None).await;
    assert_eq!(second.repr.as_deref(), Some("False"), "{}", render(&second));
    assert!(second.state_lost());
    assert!(second.state_lost_reason().unwrap_or_default().contains("permission mode"));
    assert_eq!(std::fs::read_to_string(f.dir.join("project/w.txt")).expect("written"), "hi");
    assert_eq!(
        s.set_mounts(pi_python_sandbox::permissions::MountConfig { workspace_writable: true, ..Default::default() }),
        None
    );
    s.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_paths_stay_read_only_in_a_writable_workspace() {
    let Some(f) = fixture("protected") else { return };
    let project = f.dir.join("project");
    std::fs::create_dir_all(project.join(".git/hooks")).expect("hooks");
    std::fs::create_dir_all(project.join(".vscode")).expect("vscode");
    std::fs::write(project.join(".git/config"), "[core]\n").expect("config");
    f.session
        .set_mounts(pi_python_sandbox::permissions::MountConfig { workspace_writable: true, ..Default::default() });
    let out = stdout_of(
        &f,
        r#"
def attempt(path):
    try:
        open(path, "w").write("x"); return "wrote"
    except OSError as e:
        return "errno%d" % e.errno
for p in [".git/hooks/pre-commit", ".git/config", ".vscode/tasks.json", "src.py"]:
    print(p, attempt("/workspace/" + p))
"#,
    )
    .await;
    assert!(out.contains(".git/hooks/pre-commit errno30"), "{out}");
    assert!(out.contains(".git/config errno30"), "{out}");
    assert!(out.contains(".vscode/tasks.json errno30"), "{out}");
    assert!(out.contains("src.py wrote"), "{out}");
    assert_eq!(std::fs::read_to_string(project.join(".git/config")).expect("config"), "[core]\n");

    // The directory above protected paths cannot be renamed away with them.
    let moved = stdout_of(
        &f,
        "import os
try:
    os.rename('/workspace/.git', '/workspace/.git-moved'); print('renamed')
except OSError as e:
    print('errno%d' % e.errno)",
    )
    .await;
    assert!(moved.contains("errno16"), "EBUSY expected: {moved}");
    // A protected path the code creates is renamed in place to an inert name.
    let created = f
        .session
        .execute(
            "import os
os.makedirs('/workspace/.idea')
open('/workspace/.mcp.json', 'w').write('{}')"
                .into(),
            30,
            None,
        )
        .await;
    assert_eq!(created.status, Status::Ok, "{}", render(&created));
    assert!(!project.join(".idea").exists() && !project.join(".mcp.json").exists());
    assert!(project.join(".idea.pi-inert").is_dir() && project.join(".mcp.json.pi-inert").is_file());
    let text = render(&created);
    assert!(text.contains(".idea appeared in the project"), "{text}");
    assert!(text.contains("renamed to .idea.pi-inert"), "{text}");
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_file_cannot_be_redirected_in_a_writable_workspace() {
    let Some(f) = fixture("gitfile") else { return };
    let project = f.dir.join("project");
    std::fs::write(project.join(".git"), "gitdir: /elsewhere/.git/worktrees/x\n").expect("git file");
    f.session
        .set_mounts(pi_python_sandbox::permissions::MountConfig { workspace_writable: true, ..Default::default() });
    let out = stdout_of(&f, "try:\n    open('/workspace/.git', 'w').write('gitdir: evil')\n    print('wrote')\nexcept OSError as e:\n    print('errno%d' % e.errno)").await;
    assert!(out.contains("errno30"), "{out}");
    assert_eq!(
        std::fs::read_to_string(project.join(".git")).expect("git file"),
        "gitdir: /elsewhere/.git/worktrees/x\n"
    );
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_workspace_keeps_git_read_only_and_makes_new_protected_names_inert() {
    use pi_python_sandbox::session::MountConfig;
    let Some(f) = fixture("inert") else { return };
    let project = f.dir.join("project");
    std::fs::create_dir_all(project.join(".git")).expect("git dir");
    std::fs::write(project.join(".git/config"), "[core]\n").expect("config");
    f.session.set_mounts(MountConfig { workspace_writable: true, ..Default::default() });
    let code = r#"
import os
def w(p):
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        open(p, "w").write("pwned")
        return "written"
    except OSError as e:
        return e.errno
print(w("/workspace/.git/config"), w("/workspace/.git/commondir"), w("/workspace/src/x.py"), w("/workspace/.envrc"))
"#;
    let r = f.session.execute(code.into(), 30, None).await;
    assert_eq!(r.status, Status::Ok, "{}", render(&r));
    assert_eq!(r.stdout.head.trim(), "30 30 written written", "{}", render(&r));
    assert_eq!(std::fs::read_to_string(project.join(".git/config")).expect("config"), "[core]\n");
    assert!(!project.join(".envrc").exists(), "a new protected name stayed active");
    assert_eq!(std::fs::read_to_string(project.join(".envrc.pi-inert")).expect("inert"), "pwned");
    assert!(render(&r).contains(".envrc appeared in the project"), "{}", render(&r));
    f.session.dispose("test").await;
}

// Containment: one sandbox's tasks and memory in all (see src/contain.rs).
// Each attempt is bounded by the test itself, so that a regression fails
// the test instead of taking the machine down, and each is run once
// without the sandbox (plain bubblewrap: same namespaces, no cgroup, no
// rlimits) to show that the attempt works without the defence.

/// Forks children that wait on a pipe, at most `bound` of them, and says
/// how many tasks the sandbox had before, how many forks succeeded and the
/// errno of the first refused one; then ends every child.
fn fork_bomb(bound: u64) -> String {
    format!(
        r#"
import os, json
def tasks():
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                n += len(os.listdir("/proc/%s/task" % p))
            except OSError:
                pass
    return n
r, w = os.pipe()
before = tasks()
kids, refused = [], None
for i in range({bound}):
    try:
        pid = os.fork()
    except OSError as e:
        refused = e.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    kids.append(pid)
os.close(w)
os.close(r)
for k in kids:
    os.waitpid(k, 0)
print(json.dumps({{"before": before, "forked": len(kids), "refused": refused}}))
"#
    )
}

/// Six children that each try to hold 400 MiB (2.4 GiB in all, each within
/// the per-process address-space limit); says how many held it (`held`),
/// how many were killed by a signal (`killed`), and how many held it and
/// were not killed after (`holding`: a child the memory cap kills may be
/// one that already held it, when the others were slower), then ends them
/// all.
const MEMORY_BOMB: &str = r#"
import os, json, select, time
N, SIZE = 6, 400 << 20
r, w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for i in range(N):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(go_w)
        try:
            block = b"\x01" * SIZE
            os.write(w, b"k%d\n" % i)
        except MemoryError:
            os.write(w, b"m%d\n" % i)
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
os.close(w)
os.close(go_r)
said, killed, buf = {}, set(), b""
until = time.monotonic() + 60
while len(said) + len([k for k in killed if k not in said]) < N and time.monotonic() < until:
    if select.select([r], [], [], 0.05)[0]:
        buf += os.read(r, 64)
        *lines, buf = buf.split(b"\n")
        for line in lines:
            said[int(line[1:])] = chr(line[0])
    for i, k in enumerate(kids):
        if i not in killed:
            pid, status = os.waitpid(k, os.WNOHANG)
            if pid and os.WIFSIGNALED(status):
                killed.add(i)
os.close(go_w)
for i, k in enumerate(kids):
    if i not in killed:
        os.waitpid(k, 0)
held = [i for i, s in said.items() if s == "k"]
print(json.dumps({"held": len(held), "refused": len([s for s in said.values() if s == "m"]), "killed": len(killed),
                  "holding": len([i for i in held if i not in killed])}))
"#;

/// `code` in plain bubblewrap: the sandbox's namespaces without its
/// cgroups, rlimits or filter.
fn unfiltered(code: &str) -> serde_json::Value {
    let out = std::process::Command::new("bwrap")
        .args(["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--die-with-parent"])
        .args(["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib"])
        .args(["--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"])
        .args(["--", "/usr/bin/python3", "-I", "-S", "-c", code])
        .output()
        .expect("plain bwrap");
    assert!(out.status.success(), "baseline failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("baseline json")
}

async fn json_of(f: &Fixture, code: &str) -> (serde_json::Value, pi_python_sandbox::outcome::Outcome) {
    let o = f.session.execute(code.into(), 120, None).await;
    assert_eq!(o.status, Status::Ok, "{}", render(&o));
    let text = format!("{}{}", o.stdout.head, o.stdout.tail);
    (serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {}", render(&o))), o)
}

fn status_text(f: &Fixture) -> String {
    let settings = pi_python_sandbox::options::Settings::from_env();
    pi_python_sandbox::outcome::status_text(&f.session.status(), &settings)
}

fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_capped_at_the_configured_number_of_tasks() {
    use pi_python_sandbox::contain::{host_plan, Cap, DEFAULT_MAX_TASKS};
    let Some(f) = fixture("forkbomb") else { return };
    let cap = DEFAULT_MAX_TASKS;
    let bomb = fork_bomb(cap + 64);
    let plan = host_plan();
    let status = status_text(&f);
    eprintln!("uid {}: tasks capped by {}", uid(), plan.tasks.name());
    // The attempt works without the sandbox: every bounded fork succeeds.
    let baseline = unfiltered(&bomb);
    assert_eq!((baseline["forked"].as_u64(), baseline["refused"].as_u64()), (Some(cap + 64), None), "{baseline}");
    let outside = match plan.tasks {
        // bubblewrap's own process is in the cgroup, outside the namespace.
        Cap::CgroupV1(_) | Cap::CgroupV2(_) => 1,
        // The user namespace counts only what is inside it.
        Cap::Nproc => 0,
        Cap::None => {
            // Only as root, where RLIMIT_NPROC does not bind, and no cgroup is writable.
            assert_eq!(uid(), 0, "an unprivileged user always has RLIMIT_NPROC: {status}");
            assert!(status.contains("tasks NOT contained") && status.contains("exempts"), "{status}");
            f.session.dispose("test").await;
            return;
        }
    };
    assert!(status.contains(&format!("at most {cap} tasks")), "{status}");
    let (got, o) = json_of(&f, &bomb).await;
    let (before, forked) = (got["before"].as_u64().unwrap(), got["forked"].as_u64().unwrap());
    assert_eq!(got["refused"].as_i64(), Some(libc::EAGAIN as i64), "a refused fork is EAGAIN: {got}");
    assert_eq!(before + forked + outside, cap, "{got} under {}: {}", plan.tasks.name(), render(&o));
    // The interpreter is unharmed and forks again once the children are gone.
    let (again, _) = json_of(&f, &fork_bomb(4)).await;
    assert_eq!(again["forked"].as_u64(), Some(4), "{again}");
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_of_several_processes_is_capped_where_a_cgroup_is() {
    use pi_python_sandbox::contain::{host_plan, Cap};
    let Some(f) = fixture("membomb") else { return };
    let plan = host_plan();
    let status = status_text(&f);
    eprintln!("uid {}: memory capped by {}", uid(), plan.memory.name());
    if plan.memory == Cap::None {
        // No writable cgroup for this user here: the report says so, and why.
        assert!(status.contains("memory NOT contained"), "{status}");
        assert!(status.contains(&format!("not writable by uid {}", uid())), "{status}");
        f.session.dispose("test").await;
        return;
    }
    assert!(status.contains("at most 2 GiB of memory in all, swap not counted in its favour"), "{status}");
    let baseline = unfiltered(MEMORY_BOMB);
    assert_eq!(baseline["holding"].as_u64(), Some(6), "without the cap all six hold 400 MiB: {baseline}");
    let (got, o) = json_of(&f, MEMORY_BOMB).await;
    eprintln!("under the cap: {got}");
    let holding = got["holding"].as_u64().unwrap();
    assert!(holding <= 5 && got["killed"].as_u64().unwrap() >= 1, "{got} under {}", plan.memory.name());
    let text = render(&o);
    assert!(text.contains("out of memory: the sandbox's memory cap of 2 GiB"), "{text}");
    assert!(text.contains("the interpreter was not one of them"), "{text}");
    assert!(!o.state_lost(), "{text}");
    f.session.dispose("test").await;
}

/// The cgroup directories the host process `pid` is in.
fn cgroups_of(pid: i32) -> Vec<PathBuf> {
    use pi_python_sandbox::contain::{parse_mountinfo, parse_proc_cgroup};
    let members = parse_proc_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default());
    let mounts = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    members
        .iter()
        .filter_map(|m| {
            let mount = mounts.iter().find(|c| {
                if m.hierarchy == 0 {
                    c.v2
                } else {
                    !c.v2 && m.controllers.iter().any(|x| c.controllers.contains(x))
                }
            })?;
            Some(mount.mount_point.join(m.path.strip_prefix(&mount.root).ok()?))
        })
        .filter(|d| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("pi-python-sandbox.")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cgroup_is_left_after_dispose() {
    use pi_python_sandbox::contain::{host_plan, Cap};
    let Some(f) = fixture("cgroupgone") else { return };
    let _ = stdout_of(&f, "print(1)").await;
    // The sandbox's bubblewrap: the host process whose command line names
    // this fixture's scratch directory.
    let scratch = f.session.status().dirs.expect("dirs").scratch;
    let needle = scratch.to_string_lossy().into_owned();
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .expect("the sandbox's bubblewrap");
    let dirs = cgroups_of(pid);
    let expected = [&host_plan().tasks, &host_plan().memory]
        .iter()
        .filter(|c| matches!(c, Cap::CgroupV1(_) | Cap::CgroupV2(_)))
        .count();
    let expected = if matches!(host_plan().tasks, Cap::CgroupV2(_)) { 1 } else { expected };
    assert_eq!(dirs.len(), expected, "the sandbox is in its own cgroups: {dirs:?}");
    f.session.dispose("test").await;
    for d in &dirs {
        assert!(!d.exists(), "{} is left after dispose", d.display());
    }
}

/// The kernel views and the root, as this user (root or not): bubblewrap
/// can make every read-only bind, mask and the root's remount, and the
/// sandbox cannot write what plain bubblewrap leaves writable. Kernel
/// files are opened for writing and never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_views_and_the_root_are_read_only_for_this_user() {
    let Some(f) = fixture("kernel") else { return };
    let code = r#"
import json, os
def ro(p):
    return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
def open_w(p):
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        return "opened"
    except OSError as e:
        return e.errno
def make(p):
    try:
        os.mkdir(p)
        return "made"
    except OSError as e:
        return e.errno
print(json.dumps({"sys": ro("/proc/sys"), "fs": ro("/proc/fs"), "root": ro("/"), "mkdir": make("/zz"),
                  "core_pattern": open_w("/proc/sys/kernel/core_pattern"),
                  "timer_list": len(open("/proc/timer_list", "rb").read()) if os.getuid() == 0 else 0}))
"#;
    let (inside, _) = json_of(&f, code).await;
    let free = unfiltered(code);
    // Root opens sysctls by mode bits; another user gets EACCES before EROFS.
    let refused = if uid() == 0 { 30 } else { 13 };
    assert_eq!(
        inside,
        serde_json::json!({"sys": true, "fs": true, "root": true, "mkdir": 30, "core_pattern": refused, "timer_list": 0})
    );
    assert_eq!(free["sys"], false, "plain bubblewrap leaves /proc/sys writable: {free}");
    assert_eq!(free["root"], false, "{free}");
    assert_eq!(free["mkdir"], "made", "{free}");
    if uid() == 0 {
        assert_eq!(free["core_pattern"], "opened", "{free}");
        assert!(free["timer_list"].as_u64() > Some(0), "{free}");
    }
    f.session.dispose("test").await;
}

/// Takes inotify instances (with `watches`, one instance and watches on
/// as many fresh files) up to `bound`, in as many processes as the
/// open-file limit needs; says how many it got and the errno of the first
/// refusal. With `hold`, the processes keep them until the sandbox ends.
fn inotify_grab(bound: u64, watches: bool, hold: bool) -> String {
    format!(
        r#"
import ctypes, json, os, tempfile
libc = ctypes.CDLL(None, use_errno=True)
IN_CLOEXEC, IN_ATTRIB = 0o2000000, 0x4
BOUND, WATCHES, HOLD = {bound}, {watches}, {hold}
PER = BOUND if WATCHES else 100
def take(n):
    got, refused, fds = 0, None, []
    if WATCHES:
        d = tempfile.mkdtemp()
        fd = libc.inotify_init1(IN_CLOEXEC)
        if fd < 0:
            return 0, ctypes.get_errno()
        fds.append(fd)
        for i in range(n):
            path = os.path.join(d, str(i))
            open(path, "w").close()
            if libc.inotify_add_watch(fd, path.encode(), IN_ATTRIB) < 0:
                return got, ctypes.get_errno()
            got += 1
    else:
        for i in range(n):
            fd = libc.inotify_init1(IN_CLOEXEC)
            if fd < 0:
                return got, ctypes.get_errno()
            fds.append(fd)
            got += 1
    return got, None
go_r, go_w = os.pipe()
total, refused, kids = 0, None, []
while total < BOUND and refused is None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(go_w)
        null = os.open("/dev/null", os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(null, n)
        got, ref = take(min(PER, BOUND - total))
        os.write(w, json.dumps([got, ref]).encode())
        os.close(w)
        os.read(go_r, 1)
        os._exit(0)
    os.close(w)
    got, refused = json.loads(os.read(r, 100))
    os.close(r)
    kids.append(pid)
    total += got
if not HOLD:
    os.close(go_w)
    for k in kids:
        os.waitpid(k, 0)
print(json.dumps({{"got": total, "refused": refused}}))
"#,
        watches = if watches { "True" } else { "False" },
        hold = if hold { "True" } else { "False" },
    )
}

fn share() -> pi_python_sandbox::inotify::InotifyBudget {
    pi_python_sandbox::inotify::sandbox_share(pi_python_sandbox::inotify::host_budget())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_opens_no_more_inotify_instances_than_its_cap() {
    let Some(f) = fixture("inotify-instances") else { return };
    let cap = share().instances;
    let host = pi_python_sandbox::inotify::host_budget().instances;
    assert!(cap * pi_python_sandbox::inotify::SANDBOXES_AT_ONCE <= host / 2, "cap {cap} of {host}");
    // Baseline: without the cap the same code gets more than the cap.
    let base = unfiltered(&inotify_grab(cap + 8, false, false));
    assert_eq!(base["got"], cap + 8, "baseline: {base}");
    let (inside, _) = json_of(&f, &inotify_grab(1000, false, false)).await;
    assert_eq!(inside["got"], cap, "uid {}: {inside}", uid());
    assert_eq!(inside["refused"], libc::EMFILE, "{inside}");
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_adds_no_more_inotify_watches_than_its_cap() {
    let Some(f) = fixture("inotify-watches") else { return };
    let cap = share().watches;
    let host = pi_python_sandbox::inotify::host_budget().watches;
    assert!(cap * pi_python_sandbox::inotify::SANDBOXES_AT_ONCE <= host / 2, "cap {cap} of {host}");
    let base = unfiltered(&inotify_grab(cap + 64, true, false));
    assert_eq!(base["got"], cap + 64, "baseline: {base}");
    let (inside, _) = json_of(&f, &inotify_grab(cap + 1000, true, false)).await;
    assert_eq!(inside["got"], cap, "uid {}: {inside}", uid());
    assert_eq!(inside["refused"], libc::ENOSPC, "{inside}");
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_keeps_inotify_while_a_sandbox_holds_all_it_can() {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let Some(f) = fixture("inotify-host") else { return };
    let cap = share();
    // A process of the sandbox takes every instance it can and keeps them.
    let (inside, _) = json_of(&f, &inotify_grab(1000, false, true)).await;
    // The host's user still gets an instance, and a watch on it.
    let host = Inotify::init(InitFlags::IN_CLOEXEC);
    let watched = host.as_ref().map_err(|e| *e).map(|h| h.add_watch(&f.dir, AddWatchFlags::IN_CREATE));
    f.session.dispose("test").await;
    let host = host.unwrap_or_else(|e| panic!("uid {}: the host's user has no inotify left ({e}): {inside}", uid()));
    watched.expect("instance").expect("and a watch");
    drop(host);
    assert_eq!(inside["got"], cap.instances, "uid {}: {inside}", uid());
    f.session.dispose("test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_mode_whose_guard_gets_no_inotify_starts_read_only_and_says_why() {
    use pi_python_sandbox::permissions::MountConfig;
    fn no_inotify() -> nix::Result<nix::sys::inotify::Inotify> {
        Err(nix::errno::Errno::EMFILE)
    }
    let opts = SessionOptions {
        mounts: MountConfig { workspace_writable: true, ..Default::default() },
        guard_inotify: Some(no_inotify),
        ..Default::default()
    };
    let Some(f) = fixture_opts("guard-no-inotify", opts) else { return };
    let code = "try:\n    open('/workspace/new.txt', 'w').write('x'); print('wrote')\nexcept OSError as e:\n    print('errno%d' % e.errno)";
    let o = f.session.execute(code.into(), 30, None).await;
    let text = render(&o);
    assert_eq!(o.status, Status::Ok, "{text}");
    assert!(o.stdout.head.contains("errno30"), "read-only expected: {text}");
    assert!(!f.dir.join("project/new.txt").exists());
    assert!(text.contains("READ-ONLY") && text.contains("could not get inotify"), "{text}");
    f.session.dispose("test").await;
    // Baseline: the same session with inotify writes.
    let Some(g) = fixture_opts(
        "guard-inotify",
        SessionOptions { mounts: MountConfig { workspace_writable: true, ..Default::default() }, ..Default::default() },
    ) else {
        return;
    };
    let o = g.session.execute(code.into(), 30, None).await;
    assert!(o.stdout.head.contains("wrote"), "{}", render(&o));
    g.session.dispose("test").await;
}

/// Reads the sandbox's own inotify caps and opens them for writing
/// (never writes).
const OWN_CAPS: &str = r#"
import json, os
out = {}
for name in ("max_inotify_instances", "max_inotify_watches"):
    path = "/proc/sys/user/" + name
    out[name] = int(open(path).read())
    try:
        os.close(os.open(path, os.O_WRONLY))
        out[name + "_open"] = "opened"
    except OSError as e:
        out[name + "_open"] = e.errno
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_raise_its_own_inotify_cap() {
    let Some(f) = fixture("inotify-own-cap") else { return };
    let cap = share();
    // The defence is the capabilities the sandbox lacks (`--cap-drop ALL`).
    // Baseline: plain bubblewrap that keeps CAP_SYS_RESOURCE may open them.
    let out = std::process::Command::new("bwrap")
        .args(["--unshare-user", "--unshare-pid", "--die-with-parent", "--cap-add", "CAP_SYS_RESOURCE"])
        .args(["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib"])
        .args(["--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev"])
        .args(["--", "/usr/bin/python3", "-I", "-S", "-c", OWN_CAPS])
        .output()
        .expect("plain bwrap");
    let base: serde_json::Value = serde_json::from_slice(&out.stdout).expect("baseline json");
    assert_eq!(base["max_inotify_instances_open"], "opened", "baseline: {base}");
    let (inside, _) = json_of(&f, OWN_CAPS).await;
    // What it reads is its innermost namespace's value: bubblewrap may
    // nest one more for --disable-userns, under the capped one (whose cap
    // the kernel applies all the same; see the tests above).
    let read = inside["max_inotify_instances"].as_u64().expect("a number");
    assert!(read == cap.instances || read == i32::MAX as u64, "uid {}: {inside}", uid());
    for name in ["max_inotify_instances_open", "max_inotify_watches_open"] {
        assert!(matches!(inside[name].as_i64(), Some(13 | 30)), "{name}: {inside}");
    }
    f.session.dispose("test").await;
}

// ---------------------------------------------------------------------------
// A payload that is not Python, under the full policy, started the way the
// engine starts every sandbox: bubblewrap with the policy's argv, the
// profile's seccomp program, the rlimits and a session of its own
// (`spawn`), the sandbox's cgroups or task limit (`contain`), and the
// namespace helper's inotify limits before the payload is released.

mod bare {
    use std::path::PathBuf;
    use std::process::ExitStatus;
    use std::time::Duration;

    use pi_python_sandbox::bwrap::{bwrap_argv, Network, Payload, Policy, WORKSPACE};
    use pi_python_sandbox::seccomp::Profile;
    use pi_python_sandbox::{contain, inotify, limits, probe, seccomp, secrets, spawn};
    use tokio::io::AsyncReadExt;

    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Exit status and stdout of `argv` run under `profile`, or None
    /// (the reason printed) where bubblewrap cannot run.
    pub async fn run(name: &str, profile: Profile, argv: &[&str]) -> Option<(ExitStatus, String)> {
        run_capped(name, profile, argv, contain::caps(None, None).expect("default caps"), None).await
    }

    /// [`run`] with the containment caps `caps` and the policy's
    /// open-file limit `nofile`.
    pub async fn run_capped(
        name: &str,
        profile: Profile,
        argv: &[&str],
        caps: contain::Caps,
        nofile: Option<u64>,
    ) -> Option<(ExitStatus, String)> {
        let ran = run_edited(name, profile, argv, caps, nofile, |_, _| {}).await?;
        Some(ran.unwrap_or_else(|(why, _)| panic!("the payload was not released: {why}")))
    }

    /// [`run_capped`] with the policy changed by `edit` (given the
    /// session's directory, where the mask sources are); `Err` with why
    /// the payload was not released and what its stdout held once the
    /// sandbox was killed.
    pub async fn run_edited(
        name: &str,
        profile: Profile,
        argv: &[&str],
        caps: contain::Caps,
        nofile: Option<u64>,
        edit: impl FnOnce(&mut pi_python_sandbox::bwrap::Policy, &std::path::Path),
    ) -> Option<Result<(ExitStatus, String), (String, String)>> {
        let Held { dir, policy, mut child, contained } = held(name, profile, argv, caps, nofile, edit).await?;
        let steps = inotify::cap_steps(inotify::sandbox_share(inotify::host_budget()));
        if let Err(why) =
            spawn::prepare_inside(child.info, &child.release, &policy.held_rlimits(), policy.held_mounts(), steps).await
        {
            spawn::kill_group(child.pid);
            let mut out = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(20), child.stdout.read_to_string(&mut out)).await;
            let _ = child.child.wait().await;
            return Some(Err((why.to_string(), out)));
        }
        let mut out = String::new();
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            child.stdout.read_to_string(&mut out).await.expect("stdout");
            child.child.wait().await.expect("wait")
        })
        .await;
        let status = waited.unwrap_or_else(|_| {
            spawn::kill_group(child.pid);
            panic!("{name}: the payload did not end");
        });
        drop((contained, dir));
        Some(Ok((status, out)))
    }

    /// The python worker's way ([`spawn::prepare_then_mask`]): `argv`
    /// released before the policy's `/proc` masks, which are made while
    /// it runs. `Ok` with the sandbox's mount points (its
    /// `/proc/PID/mountinfo`, read from the host) once the masks are made;
    /// `Err` with why they were not. The payload is killed either way.
    pub async fn masked_while_running(
        name: &str,
        argv: &[&str],
        edit: impl FnOnce(&mut pi_python_sandbox::bwrap::Policy, &std::path::Path),
    ) -> Option<Result<Vec<String>, String>> {
        let caps = contain::caps(None, None).expect("default caps");
        let Held { dir, policy, mut child, contained } = held(name, Profile::Shell, argv, caps, None, edit).await?;
        let steps = inotify::cap_steps(inotify::sandbox_share(inotify::host_budget()));
        let masked = match spawn::prepare_then_mask(
            child.info,
            &child.release,
            &policy.held_rlimits(),
            policy.held_mounts(),
            steps,
        )
        .await
        {
            Ok(masking) => masking.await.expect("the helper's thread"),
            Err(why) => Err(why),
        };
        let points = masked.map_err(|why| why.to_string()).map(|()| {
            let inside =
                pi_python_sandbox::spawn::read_proc(&format!("/proc/{}/task/{}/children", child.pid, child.pid))
                    .expect("children");
            let first =
                String::from_utf8_lossy(&inside).split_whitespace().next().expect("the sandbox's pid").to_owned();
            let table = std::fs::read_to_string(format!("/proc/{first}/mountinfo")).expect("its mount table");
            table.lines().filter_map(|l| l.split(' ').nth(4)).map(str::to_owned).collect()
        });
        spawn::kill_group(child.pid);
        let _ = child.child.wait().await;
        drop((contained, dir));
        Some(points)
    }

    struct Held {
        dir: Dir,
        policy: Policy,
        child: spawn::Spawned,
        contained: contain::Contained,
    }

    /// `argv` spawned held under the full policy, changed by `edit` (given
    /// the session's directory, where the mask sources are); None (the
    /// reason printed) where bubblewrap cannot run.
    async fn held(
        name: &str,
        profile: Profile,
        argv: &[&str],
        caps: contain::Caps,
        nofile: Option<u64>,
        edit: impl FnOnce(&mut pi_python_sandbox::bwrap::Policy, &std::path::Path),
    ) -> Option<Held> {
        if !super::sandbox_runs(name) {
            return None;
        }
        let dir = Dir(std::env::temp_dir().join(format!("pps-rs-bare-{name}-{}", std::process::id())));
        let (project, scratch, session) = (dir.0.join("project"), dir.0.join("scratch"), dir.0.join("session"));
        for d in [&project, &scratch, &session] {
            std::fs::create_dir_all(d).expect("dir");
        }
        std::fs::write(project.join("data.txt"), "fixture-content\n").expect("fixture");
        let sources = secrets::MaskSources::in_dir(&session).expect("mask sources");
        let mut notes = Vec::new();
        let mut contained = contain::for_sandbox(&Ok(caps), &mut notes).expect("containment");
        let mut policy = Policy {
            merged_usr: probe::merged_usr(),
            project_dir: std::fs::canonicalize(&project).expect("project"),
            project_at: WORKSPACE.into(),
            project_links: vec![],
            workspace_writable: false,
            scratch_dir: scratch,
            read_roots: vec![],
            once: vec![],
            host_masks: vec![],
            mask_sources: (sources.file.clone(), sources.dir.clone()),
            proc_masks: probe::proc_masks_of_host(),
            protected: vec![],
            masks: vec![],
            root_masks: vec![],
            nofile,
            nproc: contained.nproc(),
            tmp_bytes: limits::DEFAULT_TMP_BYTES,
            shm_bytes: limits::DEFAULT_SHM_BYTES,
            network: Network::None,
            seccomp: profile,
        };
        edit(&mut policy, &session);
        let payload = Payload { argv: argv.iter().map(Into::into).collect(), ..Payload::default() };
        let bwrap = probe::probe_bwrap().await.expect("bwrap");
        let filter = seccomp::bpf_memfd(policy.seccomp).expect("seccomp program");
        let args = bwrap_argv(&policy, &payload);
        let child =
            spawn::spawn_sandbox(&bwrap.path, &args, filter, vec![], contained.take_join(), spawn::Channel::None)
                .expect("spawn");
        Some(Held { dir, policy, child, contained })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_true_runs_under_the_full_policy() {
    let Some((status, out)) = bare::run("true", pi_python_sandbox::seccomp::Profile::Python, &["/bin/true"]).await
    else {
        return;
    };
    assert_eq!((status.code(), out.as_str()), (Some(0), ""));
}

/// The namespace helper's `/proc` masks under [`bare::run_edited`], with
/// `edit` applied: the payload prints a word if it runs at all.
async fn masked_start(
    name: &str,
    edit: impl FnOnce(&mut pi_python_sandbox::bwrap::Policy, &std::path::Path),
) -> Option<Result<String, (String, String)>> {
    use pi_python_sandbox::contain;
    let caps = contain::caps(None, None).expect("default caps");
    let argv = ["/bin/sh", "-c", "echo payload-ran; wc -c < /proc/sys/vm/stat_refresh"];
    let ran = bare::run_edited(name, pi_python_sandbox::seccomp::Profile::Shell, &argv, caps, None, edit).await?;
    Some(ran.map(|(_, out)| out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proc_mask_that_cannot_be_made_fails_the_start_and_no_payload_runs() {
    use pi_python_sandbox::hostsecrets::Mask;
    // Baseline: the same start with the host's masks runs the payload.
    let Some(ok) = masked_start("mask-ok", |_, _| {}).await else { return };
    assert_eq!(ok.expect("the start with the host's masks").lines().next(), Some("payload-ran"));
    // A mask whose place does not exist in the sandbox's /proc.
    let missing = |p: &mut pi_python_sandbox::bwrap::Policy, _: &std::path::Path| {
        p.proc_masks.push(Mask { path: "/proc/no-such-kernel-file".into(), is_dir: false })
    };
    let (why, out) =
        masked_start("mask-missing", missing).await.expect("sandbox").expect_err("a start without its mask");
    assert!(why.contains("/proc/no-such-kernel-file") && why.contains("No such file"), "{why}");
    assert_eq!(out, "", "the payload ran");
    // A mask whose place is reached through a link (/proc/self): never followed.
    let link = |p: &mut pi_python_sandbox::bwrap::Policy, _: &std::path::Path| {
        p.proc_masks.insert(0, Mask { path: "/proc/self/environ".into(), is_dir: false })
    };
    let (why, out) = masked_start("mask-link", link).await.expect("sandbox").expect_err("a start through a link");
    assert!(why.contains("/proc/self/environ") && why.contains("symbolic links"), "{why}");
    assert_eq!(out, "", "the payload ran");
    // The session's empty file gone: nothing to mask with.
    let gone = |p: &mut pi_python_sandbox::bwrap::Policy, session: &std::path::Path| {
        p.mask_sources.0 = session.join("no-such-mask-file");
    };
    let (why, out) = masked_start("mask-gone", gone).await.expect("sandbox").expect_err("a start without a mask file");
    assert!(why.contains("cloning the empty mask") && why.contains("No such file"), "{why}");
    assert_eq!(out, "", "the payload ran");
}

/// The python worker's start: released before the `/proc` masks, which
/// are made while it starts; the engine sends it nothing before they are,
/// and ends the start when they could not be made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masks_made_while_the_payload_starts_are_all_there_or_their_failure_is_told() {
    use pi_python_sandbox::hostsecrets::Mask;
    let argv = ["/bin/sleep", "30"];
    let Some(made) = bare::masked_while_running("mask-early", &argv, |_, _| {}).await else { return };
    let points = made.expect("the host's masks made while the payload runs");
    let want = pi_python_sandbox::probe::proc_masks_of_host();
    assert!(!want.is_empty(), "this host's /proc has none of the masked files");
    for m in &want {
        assert!(
            points.iter().any(|p| std::path::Path::new(p) == m.path),
            "{} not masked: {points:?}",
            m.path.display()
        );
    }
    // The same failures as a held start's: each is told, with its path.
    let missing = |p: &mut pi_python_sandbox::bwrap::Policy, _: &std::path::Path| {
        p.proc_masks.push(Mask { path: "/proc/no-such-kernel-file".into(), is_dir: false })
    };
    let why = bare::masked_while_running("mask-early-missing", &argv, missing).await.expect("sandbox");
    let why = why.expect_err("masks with one that cannot be made");
    assert!(why.contains("/proc/no-such-kernel-file") && why.contains("No such file"), "{why}");
    let link = |p: &mut pi_python_sandbox::bwrap::Policy, _: &std::path::Path| {
        p.proc_masks.insert(0, Mask { path: "/proc/self/environ".into(), is_dir: false })
    };
    let why = bare::masked_while_running("mask-early-link", &argv, link).await.expect("sandbox");
    let why = why.expect_err("a mask through a link");
    assert!(why.contains("/proc/self/environ") && why.contains("symbolic links"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_s_exit_status_comes_back_from_under_the_full_policy() {
    // The filter is in force (mode 2), the project is the working
    // directory, read-only, and the shell's status is bubblewrap's.
    let script = "grep ^Seccomp: /proc/self/status; pwd; cat data.txt; touch x 2>/dev/null || echo read-only; exit 3";
    let Some((status, out)) =
        bare::run("sh", pi_python_sandbox::seccomp::Profile::Shell, &["/bin/sh", "-c", script]).await
    else {
        return;
    };
    assert_eq!(status.code(), Some(3), "{out}");
    assert_eq!(out, "Seccomp:\t2\n/workspace\nfixture-content\nread-only\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_profile_gives_a_payload_unix_socket_pairs_and_no_network_socket() {
    let probe = "import socket\n\
        def try_(f):\n\
        \x20   try:\n\
        \x20       f()\n\
        \x20       return 'ok'\n\
        \x20   except OSError as e:\n\
        \x20       return e.strerror\n\
        print(try_(lambda: socket.socketpair(socket.AF_UNIX)))\n\
        print(try_(lambda: socket.socket(socket.AF_INET)))\n\
        print(try_(lambda: socket.socket(socket.AF_UNIX)))";
    let argv = ["/usr/bin/python3", "-I", "-S", "-c", probe];
    use pi_python_sandbox::seccomp::Profile;
    let Some((shell, shell_out)) = bare::run("socket-shell", Profile::Shell, &argv).await else { return };
    assert_eq!((shell.code(), shell_out.as_str()), (Some(0), "ok\nOperation not permitted\nOperation not permitted\n"));
    let Some((python, python_out)) = bare::run("socket-python", Profile::Python, &argv).await else { return };
    assert_eq!(
        (python.code(), python_out.as_str()),
        (Some(0), "Operation not permitted\nOperation not permitted\nOperation not permitted\n")
    );
}

/// Processes of this user's on the host, killed and reaped on drop.
struct HostProcesses(Vec<std::process::Child>);

impl HostProcesses {
    fn start(n: u64) -> HostProcesses {
        let mut all = HostProcesses(Vec::new());
        for _ in 0..n {
            all.0.push(std::process::Command::new("sleep").arg("120").spawn().expect("a host process"));
        }
        all
    }
}

impl Drop for HostProcesses {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_payload_forks_no_more_than_the_task_cap() {
    // The cap is the engine's, whatever the payload: a shell (no worker
    // of the tool's) sees it and is refused past it, while this user has
    // more processes on the host than the cap (they do not count). Its
    // open-file limit is the one bubblewrap starts with (a policy's lower
    // one is the payload's to set, once bubblewrap closed its mount fds).
    use pi_python_sandbox::contain::{caps, describe, host_plan, Cap};
    const CAP: u64 = 16;
    let plan = host_plan();
    let caps = caps(Some(&CAP.to_string()), None).expect("caps");
    eprintln!("uid {}: tasks capped by {}", uid(), plan.tasks.name());
    let _host = HostProcesses::start(2 * CAP);
    // A subshell forks sleepers until a fork is refused (it ends there:
    // a shell cannot go on without a fork), at most 64; then, one task
    // short of the cap, `timeout` forks the one that is one too many and
    // says why it could not.
    let script = "grep -e '^Max processes' -e '^Max open files' /proc/self/limits; \
        (i=0; while [ $i -lt 64 ]; do sleep 60 </dev/null >/dev/null 2>&1 & i=$((i+1)); echo forked $i; done); \
        timeout 5 true 2>&1; echo timeout $?";
    let Some((status, out)) =
        bare::run_capped("taskcap", pi_python_sandbox::seccomp::Profile::Shell, &["/bin/sh", "-c", script], caps, None)
            .await
    else {
        return;
    };
    assert_eq!(status.code(), Some(0), "{out}");
    let limit = |n: usize| out.lines().nth(n).unwrap_or("").split_whitespace().collect::<Vec<_>>();
    assert_eq!(limit(1), ["Max", "open", "files", "128", "128", "files"], "{out}");
    let forked = out.lines().filter(|l| l.starts_with("forked ")).count() as u64;
    // Tasks besides the sleepers: bubblewrap's init, the shell and its
    // subshell; a cgroup also counts bubblewrap's own process outside.
    let others = match plan.tasks {
        Cap::Nproc => {
            assert_eq!(limit(0), ["Max", "processes", "16", "16", "processes"], "{out}");
            3
        }
        Cap::CgroupV1(_) | Cap::CgroupV2(_) => 4,
        Cap::None => {
            // Only as root, whom RLIMIT_NPROC exempts, where no cgroup is writable.
            assert_eq!(uid(), 0, "an unprivileged user always has RLIMIT_NPROC");
            let text = describe(plan, &Ok(caps));
            assert!(text.contains("tasks NOT contained") && text.contains("exempts"), "{text}");
            return;
        }
    };
    assert_eq!(forked + others, CAP, "{out}");
    assert!(out.contains("timeout: fork system call failed: Resource temporarily unavailable\ntimeout 125\n"), "{out}");
}

/// The `/proc` masks the namespace helper makes are locked to a process of
/// the sandbox that has a user and mount namespace of its own (which
/// `--disable-userns` already refuses it): a copy of the sandbox's mounts
/// made in the payload's user namespace, with every capability there,
/// cannot unmount a mask (to show what it covers) or make it writable.
/// Baseline: in the same copy a mount of its own is unmounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proc_masks_are_locked_in_a_nested_user_and_mount_namespace() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let masks: Vec<String> = pi_python_sandbox::probe::proc_masks_of_host()
        .into_iter()
        .filter(|m| !m.is_dir)
        .map(|m| m.path.to_string_lossy().into_owned())
        .collect();
    assert!(!masks.is_empty(), "this host's /proc has none of the masked files");
    let marker = format!("9.{}", std::process::id());
    let payload = marker.clone();
    let run = tokio::spawn(async move {
        bare::run("locked", pi_python_sandbox::seccomp::Profile::Shell, &["/usr/bin/sleep", &payload]).await
    });
    // The payload, found by its argv.
    let want = format!("/usr/bin/sleep\0{marker}\0");
    let mut pid = None;
    for _ in 0..400 {
        pid = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            (cmdline == want.as_bytes()).then(|| e.file_name().to_string_lossy().parse::<i32>().ok()).flatten()
        });
        if pid.is_some() || run.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let Some(pid) = pid else {
        let ran = run.await.unwrap();
        assert!(ran.is_none(), "the payload was not found: {ran:?}");
        return;
    };
    let mnt: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).unwrap().into();
    let payload_user: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/user")).unwrap().into();
    // SAFETY: NS_GET_USERNS returns a fresh fd.
    let owner = unsafe { libc::ioctl(mnt.as_raw_fd(), 0xb701) };
    assert!(owner >= 0, "NS_GET_USERNS: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd nothing else owns.
    let owner = unsafe { OwnedFd::from_raw_fd(owner) };
    let (owner_fd, mnt_fd, user_fd) = (owner.as_raw_fd(), mnt.as_raw_fd(), payload_user.as_raw_fd());
    let probe = format!(
        "import ctypes, json, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def call(f, *a):\n    return 0 if f(*a) == 0 else ctypes.get_errno()\n\
         out = {{}}\n\
         for p in {masks:?}:\n\
         \x20   mounted = os.stat(p).st_dev != os.stat('/proc').st_dev\n\
         \x20   umount = call(libc.umount2, p.encode(), 2)\n\
         \x20   writable = call(libc.mount, None, p.encode(), None, ctypes.c_ulong(32 | 4096), None)\n\
         \x20   out[p] = [mounted, umount, writable, os.path.getsize(p)]\n\
         own = call(libc.mount, b'/proc/version', {first:?}.encode(), None, ctypes.c_ulong(4096), None)\n\
         out['own'] = [own, call(libc.umount2, {first:?}.encode(), 2)]\n\
         print(json.dumps(out))",
        first = masks[0],
    );
    let mut cmd = std::process::Command::new("/usr/bin/python3");
    cmd.args(["-I", "-S", "-c", &probe]).env_clear();
    // SAFETY: only setns and unshare, async-signal-safe, in the child.
    unsafe {
        cmd.pre_exec(move || {
            for (fd, flag) in
                [(owner_fd, libc::CLONE_NEWUSER), (mnt_fd, libc::CLONE_NEWNS), (user_fd, libc::CLONE_NEWUSER)]
            {
                if libc::setns(fd, flag) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // CAP_SYS_ADMIN of the namespace kept across exec when the
            // sandbox's uid is not 0 there (pi running as another user).
            const CAP_SYS_ADMIN: u32 = 21;
            let mut head = [0x2008_0522u32, 0];
            let mut data = [0u32; 6];
            if libc::syscall(libc::SYS_capget, head.as_mut_ptr(), data.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            data[2] |= 1 << CAP_SYS_ADMIN;
            if libc::syscall(libc::SYS_capset, head.as_mut_ptr(), data.as_ptr()) != 0
                || libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN as libc::c_ulong, 0, 0)
                    != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output();
    // SAFETY: kill(2) of the payload this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = run.await;
    let out = out.expect("the probe in the nested namespaces");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("json");
    // Baseline: what the copy mounts itself it can unmount.
    assert_eq!(v["own"], serde_json::json!([0, 0]), "{v}");
    for p in &masks {
        // Mounted, not unmounted (EINVAL: locked), not made writable (EPERM), empty.
        assert_eq!(v[p], serde_json::json!([true, libc::EINVAL, libc::EPERM, 0]), "{p}: {v}");
    }
}
