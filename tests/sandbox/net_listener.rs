//! The proxy's listener inside a held sandbox's network namespace
//! (`nshelper::listen`), made before the payload runs: a client inside
//! reaches the host through it; without it, nothing listens there.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use pi_python_sandbox::bwrap::{BLOCK_FD, INFO_FD};
use pi_python_sandbox::nshelper::listen::PROXY_PORT;
use pi_python_sandbox::spawn::{kill_group, prepare_inside_with, spawn_sandbox};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A sandbox as the product makes one (own user, pid and network
/// namespaces, nested user namespaces disabled, held at `--block-fd`)
/// running `script` under bash; what it printed, and what the host's side
/// of the listener saw.
async fn held_sandbox(script: &str, listen: bool) -> (String, Option<String>) {
    let bwrap = ["/usr/bin/bwrap", "/bin/bwrap"].into_iter().find(|p| std::path::Path::new(p).exists()).unwrap();
    let mut argv: Vec<OsString> = [
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-net",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/bin",
        "/bin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    .map(OsString::from)
    .to_vec();
    for (flag, fd) in [("--info-fd", INFO_FD), ("--block-fd", BLOCK_FD)] {
        argv.push(flag.into());
        argv.push(fd.to_string().into());
    }
    argv.extend(["--", "/bin/bash", "-c", script].map(OsString::from));
    // No --seccomp: the filter is not what this test is about.
    let unused: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let mut child =
        spawn_sandbox(bwrap.as_ref(), &argv, unused, vec![], vec![], pi_python_sandbox::spawn::Channel::None).unwrap();
    let prepared =
        prepare_inside_with(child.info, &child.release, &[], Default::default(), vec![], listen.then_some(PROXY_PORT))
            .await;
    let listener = match prepared {
        Ok(l) => l,
        Err(e) => {
            kill_group(child.pid);
            panic!("not prepared: {e}");
        }
    };
    let served = tokio::spawn(async move {
        let fd = listener?.expect("the listener");
        assert!(fd.as_raw_fd() >= 0);
        let std_listener = std::net::TcpListener::from(fd);
        let l = tokio::net::TcpListener::from_std(std_listener).unwrap();
        let (mut conn, peer) = tokio::time::timeout(Duration::from_secs(10), l.accept()).await.unwrap().unwrap();
        let mut buf = [0u8; 64];
        let n = conn.read(&mut buf).await.unwrap();
        conn.write_all(b"from the host\n").await.unwrap();
        Some(format!("{} from {}", String::from_utf8_lossy(&buf[..n]).trim(), peer.ip()))
    });
    let mut out = String::new();
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        child.stdout.read_to_string(&mut out).await.unwrap();
        child.child.wait().await.unwrap()
    })
    .await;
    kill_group(child.pid);
    waited.expect("the sandbox ended in time");
    let seen = if listen { served.await.unwrap() } else { None };
    (out, seen)
}

const CLIENT: &str = "if exec 3<>/dev/tcp/127.0.0.1/3128; then echo hello >&3; read -r line <&3; echo \"got: $line\"; \
     else echo unreachable; fi";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_inside_reaches_the_host_through_the_listener_made_in_its_namespace() {
    if !super::sandbox_runs("a_client_inside_reaches_the_host_through_the_listener_made_in_its_namespace") {
        return;
    }
    let (out, seen) = held_sandbox(CLIENT, true).await;
    assert_eq!(out.trim(), "got: from the host");
    assert_eq!(seen.as_deref(), Some("hello from 127.0.0.1"));
    // Baseline: the same sandbox without the listener has nothing there.
    let (out, _) = held_sandbox(CLIENT, false).await;
    assert!(out.trim().ends_with("unreachable"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_raises_the_most_bytes_of_one_packet_on_the_sandbox_loopback() {
    if !super::sandbox_runs("the_listener_raises_the_most_bytes_of_one_packet_on_the_sandbox_loopback") {
        return;
    }
    // No seccomp in these sandboxes: `ip` may ask the kernel over netlink.
    let script =
        format!("/usr/sbin/ip -d link show lo | grep -o 'g[sr]o_max_size [0-9]*' | tr '\\n' ' '; echo; {CLIENT}");
    let (out, seen) = held_sandbox(&script, true).await;
    let big = pi_python_sandbox::nshelper::listen::LOOPBACK_GSO;
    assert_eq!(out.lines().next(), Some(format!("gso_max_size {big} gro_max_size {big} ").as_str()), "{out}");
    assert_eq!(seen.as_deref(), Some("hello from 127.0.0.1"));
    // Baseline: without the listener's helper, the kernel's 64 KiB.
    let (out, _) = held_sandbox(&script, false).await;
    assert_eq!(out.lines().next(), Some("gso_max_size 65536 gro_max_size 65536 "), "{out}");
}
