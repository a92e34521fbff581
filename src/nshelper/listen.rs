//! The listener job: a TCP socket bound to `127.0.0.1:<port>` inside a
//! held sandbox's network namespace, listening, handed to the host.
//!
//! The helper joins the user namespace that **owns** the sandbox's network
//! namespace (`NS_GET_USERNS` on `/proc/PID/ns/net`, asked by the parent:
//! with `--disable-userns` the payload's own user namespace is a nested
//! one, from which the network namespace cannot be joined), then the
//! network namespace; it makes the socket (close-on-exec, non-blocking:
//! the host serves it with tokio), binds it without `SO_REUSEPORT` (the
//! sandbox shares its uid and could bind the same port beside it), listens,
//! and sends it back over `SCM_RIGHTS`. It never touches `lo`: bubblewrap
//! sets loopback up in the sandbox's namespace while the helper may already
//! run (the held process is announced before that), and a second writer
//! makes bubblewrap's own setup fail; `IP_FREEBIND` lets the socket bind
//! `127.0.0.1` before bubblewrap has added it, and the payload, released
//! after bubblewrap's setup, finds both.
//! The socket stays in the sandbox's namespace: a client inside connects
//! to `127.0.0.1:<port>`, and only the host accepts.
//!
//! Before the socket, the helper lowers the namespace's TCP buffer maxima
//! (`net.ipv4.tcp_rmem`, `tcp_wmem`: per network namespace, written by its
//! owner) to [`TCP_RMEM`] and [`TCP_WMEM`]: every TCP socket of the
//! namespace, the sandbox's own and those the host accepts from this
//! listener, grows its buffers within them, and their memory is counted in
//! the host-wide `net.ipv4.tcp_mem`. A sandbox without them gets no
//! listener, so no network.
//!
//! Then it raises the most bytes of one packet on the namespace's loopback
//! (`gso_max_size`, `gro_max_size` and their IPv4 forms, one
//! `RTM_NEWLINK` that changes no flag and adds no address, so it never
//! meets bubblewrap's setup of `lo`) to [`LOOPBACK_GSO`]: TCP on that
//! loopback then moves a bulk transfer in packets of up to that size
//! instead of 64 KiB ("BIG TCP"), and the proxy's sends to the client and
//! the client's reads take fewer trips through the stack. Best effort: a
//! kernel that refuses it (IPv4 BIG TCP came in Linux 6.3) keeps 64 KiB
//! packets and the listener is made all the same.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{errno, in_helper, HelperError};

/// The port the listener binds inside every sandbox with a proxy.
pub const PROXY_PORT: u16 = 3128;
/// The sandbox's `net.ipv4.tcp_rmem` and `tcp_wmem` (least, default and
/// most bytes of one socket's receive and send buffers): the host's usual
/// least and default, and a most of 512 KiB, which the proxy's connections
/// on the namespace's loopback fill at full speed (microseconds of round
/// trip); the host's defaults let one socket grow to 32 MiB and 4 MiB.
pub const TCP_RMEM: &str = "4096 131072 524288";
pub const TCP_WMEM: &str = "4096 16384 524288";

/// The most bytes of one packet on the sandbox's loopback (see the module
/// notes): the most the kernel gives loopback (`tso_max_size`, 512 KiB
/// less 8 bytes). A packet's bytes count in the socket buffers like any
/// others, so [`TCP_RMEM`] and [`TCP_WMEM`] still bound them.
pub const LOOPBACK_GSO: u32 = 524_280;

/// Connections the kernel queues before the host accepts them.
const BACKLOG: libc::c_int = 128;

const NS_GET_USERNS: libc::c_ulong = 0xb701;

// The record's first word: which step failed (0: none).
const OK: i32 = 0;
const FAILED_JOIN_USER: i32 = 1;
const FAILED_JOIN_NET: i32 = 2;
const FAILED_SOCKET: i32 = 3;
const FAILED_BIND: i32 = 4;
const FAILED_LISTEN: i32 = 5;
const FAILED_OPEN_SYSCTL: i32 = 6;
const FAILED_WRITE_SYSCTL: i32 = 7;

const SYSCTLS: [(&CStr, &str); 2] =
    [(c"/proc/sys/net/ipv4/tcp_rmem", TCP_RMEM), (c"/proc/sys/net/ipv4/tcp_wmem", TCP_WMEM)];

/// A listening socket on `127.0.0.1:port` in the network namespace of
/// process `pid` (held at bubblewrap's `--block-fd`). Blocking: a helper
/// process, a few system calls, a wait (well under a millisecond).
pub fn listen(pid: i32, port: u16) -> Result<OwnedFd, HelperError> {
    let net = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|source| HelperError::OpenNamespace { ns: "net", source })?;
    let net = OwnedFd::from(net);
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd.
    let user = unsafe { libc::ioctl(net.as_raw_fd(), NS_GET_USERNS) };
    if user < 0 {
        return Err(HelperError::OpenNamespace { ns: "user", source: io::Error::last_os_error() });
    }
    // SAFETY: a fresh fd the ioctl made.
    let user = unsafe { OwnedFd::from_raw_fd(user) };
    // Everything the helper touches, made before it starts.
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    let (user_fd, net_fd) = (user.as_raw_fd(), net.as_raw_fd());
    let big = loopback_request(LOOPBACK_GSO);
    let report = in_helper(|| child_listen(user_fd, net_fd, &addr, &big)).map_err(HelperError::Fork)?;
    drop((user, net));
    let (record, fd) = report.map_err(|e| HelperError::NoReport(e.to_string()))?;
    let [what, index, e] = record;
    let source = io::Error::from_raw_os_error(e);
    let sysctl = || SYSCTLS.get(index as usize).map(|(p, _)| p.to_string_lossy().into_owned()).unwrap_or_default();
    let step = match what {
        OK => return fd.ok_or_else(|| HelperError::NoReport("no socket came back".into())),
        FAILED_JOIN_USER => return Err(HelperError::Join { ns: "user", source }),
        FAILED_JOIN_NET => return Err(HelperError::Join { ns: "net", source }),
        FAILED_OPEN_SYSCTL => return Err(HelperError::Open { path: sysctl(), source }),
        FAILED_WRITE_SYSCTL => return Err(HelperError::Write { path: sysctl(), source }),
        FAILED_SOCKET => "make a TCP socket",
        FAILED_BIND => "bind 127.0.0.1",
        FAILED_LISTEN => "listen",
        other => return Err(HelperError::NoReport(format!("record {other}"))),
    };
    Err(HelperError::Listen { step, port, source })
}

/// The loopback's interface index: the same in every network namespace.
const LOOPBACK_INDEX: i32 = 1;

/// An `RTM_NEWLINK` request for the loopback that sets its most bytes of
/// one packet sent and received (`IFLA_GSO_MAX_SIZE`, `IFLA_GRO_MAX_SIZE`
/// and the IPv4 forms, which the kernel keeps apart past 64 KiB) to
/// `size`, and changes nothing else (no flag, no address).
fn loopback_request(size: u32) -> Vec<u8> {
    const IFLA_GSO_MAX_SIZE: u16 = 41;
    const IFLA_GRO_MAX_SIZE: u16 = 58;
    const IFLA_GSO_IPV4_MAX_SIZE: u16 = 63;
    const IFLA_GRO_IPV4_MAX_SIZE: u16 = 64;
    let header = std::mem::size_of::<libc::nlmsghdr>();
    let mut body = Vec::new();
    // struct ifinfomsg: family, pad, type, index, flags, change.
    body.push(libc::AF_UNSPEC as u8);
    body.push(0);
    body.extend_from_slice(&0u16.to_ne_bytes());
    body.extend_from_slice(&LOOPBACK_INDEX.to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    for kind in [IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE] {
        body.extend_from_slice(&8u16.to_ne_bytes());
        body.extend_from_slice(&kind.to_ne_bytes());
        body.extend_from_slice(&size.to_ne_bytes());
    }
    let mut msg = Vec::with_capacity(header + body.len());
    msg.extend_from_slice(&((header + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

// Below: the helper. Raw system calls on prepared memory only.

/// Send the prepared `RTM_NEWLINK` (see [`loopback_request`]) on a route
/// netlink socket of the namespace; the kernel applies it inside the
/// send, and its answer is not waited for (best effort).
fn child_big_loopback(request: &[u8]) {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if fd < 0 {
        return;
    }
    // SAFETY: send(2) reads the prepared buffer of its length; close of the fd just made.
    unsafe {
        libc::send(fd, request.as_ptr().cast(), request.len(), 0);
        libc::close(fd);
    }
}

fn child_listen(user: i32, net: i32, addr: &libc::sockaddr_in, big: &[u8]) -> ([i32; 3], i32) {
    let fail = |what: i32| ([what, 0, errno()], -1);
    // SAFETY: setns on fds the child holds.
    if unsafe { libc::setns(user, libc::CLONE_NEWUSER) } != 0 {
        return fail(FAILED_JOIN_USER);
    }
    // SAFETY: as above.
    if unsafe { libc::setns(net, libc::CLONE_NEWNET) } != 0 {
        return fail(FAILED_JOIN_NET);
    }
    for (i, (path, value)) in SYSCTLS.iter().enumerate() {
        // SAFETY: open of a constant NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
        if fd < 0 {
            return ([FAILED_OPEN_SYSCTL, i as i32, errno()], -1);
        }
        // SAFETY: write of a constant buffer.
        let n = unsafe { libc::write(fd, value.as_ptr().cast(), value.len()) };
        let e = if n < 0 { errno() } else { libc::EIO };
        // SAFETY: close of the fd just opened.
        unsafe { libc::close(fd) };
        if n != value.len() as isize {
            return ([FAILED_WRITE_SYSCTL, i as i32, e], -1);
        }
    }
    child_big_loopback(big);
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return fail(FAILED_SOCKET);
    }
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int of the given size.
    let freebind = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_IP,
            libc::IP_FREEBIND,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if freebind != 0 {
        let r = ([FAILED_BIND, 0, errno()], -1);
        // SAFETY: close of the fd just made.
        unsafe { libc::close(fd) };
        return r;
    }
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: bind(2) reads the prepared address of the given size.
    if unsafe { libc::bind(fd, (addr as *const libc::sockaddr_in).cast(), len) } != 0 {
        let r = ([FAILED_BIND, 0, errno()], -1);
        // SAFETY: close of the fd just made.
        unsafe { libc::close(fd) };
        return r;
    }
    // SAFETY: listen(2) on the fd just bound.
    if unsafe { libc::listen(fd, BACKLOG) } != 0 {
        let r = ([FAILED_LISTEN, 0, errno()], -1);
        // SAFETY: close of the fd just made.
        unsafe { libc::close(fd) };
        return r;
    }
    ([OK, 0, 0], fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_whose_namespaces_cannot_be_joined_gets_a_worded_error() {
        // Our own user namespace cannot be re-entered: the join fails and
        // says which namespace.
        let me = std::process::id() as i32;
        let err = listen(me, PROXY_PORT).unwrap_err();
        assert!(matches!(err, HelperError::Join { ns: "user", .. }), "{err}");
        assert!(err.to_string().starts_with("the helper could not join the sandbox's user namespace"), "{err}");
        let gone = listen(i32::MAX, PROXY_PORT).unwrap_err();
        assert!(matches!(gone, HelperError::OpenNamespace { ns: "net", .. }), "{gone}");
    }
}
