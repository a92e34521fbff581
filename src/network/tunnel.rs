//! A tunnel's relay: bytes from socket to socket both ways, each
//! direction through a pipe with splice(2) (the bytes stay in the kernel;
//! the one exception, a busy direction toward the sandbox, is below), with
//! the proxy's bounds (idle time to read, write time for each
//! piece). A pipe holds [`PIPE`] bytes; a direction that has moved
//! [`GROW_AFTER`] bytes takes one of the process's [`MAX_GROWN_PIPES`] while
//! one is free, so a bulk transfer takes fewer, larger steps: toward the
//! origin its pipe grows to [`GROWN_PIPE`]; toward the sandbox it goes on
//! by read(2) and write(2) through a buffer of that size instead.
//!
//! Why a copy toward the sandbox: the sandbox's loopback carries packets
//! of up to 512 KiB (`nshelper::listen`), but a socket sends spliced bytes
//! as one fragment per page, at most 17 to a packet (`MAX_SKB_FRAGS`), so
//! spliced packets stay at 64 KiB; written bytes are packed into 32 KiB
//! fragments and fill the big packets. Alternated bench runs: the client's
//! CPU per GiB 0.18-0.20 s against 0.32-0.34 spliced, the proxy's the same
//! (0.36-0.38 s: the two copies cost what the packets saved). Toward the
//! origin the host's loopback keeps 64 KiB packets, and the splice stays.
//! Not here: what is relayed before (heads, the ClientHello) and plain
//! requests' bodies (`proxy`).

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::proxy::Bounds;

/// Bytes of a new pipe (the kernel's default size, 16 pages).
const PIPE: usize = 64 * 1024;
/// A direction that has moved this many bytes asks for a [`GROWN_PIPE`]:
/// only bulk transfers grow theirs.
pub const GROW_AFTER: u64 = 1 << 20;
/// The size a busy direction's pipe grows to (the most `F_SETPIPE_SZ`
/// gives a process without `CAP_SYS_RESOURCE`, `fs.pipe-max-size`): a
/// splice then moves up to this much a call, which cut the relay's CPU by
/// a third against 64 KiB. Also the size of a busy direction's buffer
/// toward the sandbox (see the module notes).
const GROWN_PIPE: usize = 1 << 20;
/// Pipes grown (or buffers of that size held) at once in this process,
/// every sandbox's proxy together: the pages a pipe holds are charged to
/// no socket (outside `net.ipv4.tcp_mem`) and its slots count in the
/// user's `fs.pipe-user-pages-soft` (16,384 pages by default; past it
/// every new pipe of the user's is made small), and a buffer is the
/// host's memory, so the grown ones are few: 8 MiB, 2,048 pages.
pub const MAX_GROWN_PIPES: usize = 8;

/// Relay both ways until both directions ended; a direction that failed
/// (a peer that stopped reading, an error) ends both.
pub(super) async fn relay(conn: TcpStream, up: TcpStream, b: &Bounds) {
    relay_halves(conn.into_split(), up.into_split(), b).await;
}

pub(super) async fn relay_halves(
    (cr, mut cw): (tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf),
    (ur, mut uw): (tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf),
    b: &Bounds,
) {
    let to_origin = spliced(&cr, &mut uw, b, false);
    let to_client = spliced(&ur, &mut cw, b, true);
    tokio::pin!(to_origin, to_client);
    tokio::select! {
        ended = &mut to_origin => if ended { to_client.await; },
        ended = &mut to_client => if ended { to_origin.await; },
    }
}

/// Pipes grown now (see [`MAX_GROWN_PIPES`]).
static GROWN_PIPES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The pipes grown now, in this process.
pub fn grown_pipes() -> usize {
    GROWN_PIPES.load(std::sync::atomic::Ordering::SeqCst)
}

/// One of the [`MAX_GROWN_PIPES`], held while its pipe is grown or its
/// buffer is held.
struct GrownPipe;

impl GrownPipe {
    /// One of the process's grown pipes, if one is free.
    fn take() -> Option<GrownPipe> {
        use std::sync::atomic::Ordering;
        GROWN_PIPES
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_GROWN_PIPES).then_some(n + 1))
            .ok()?;
        Some(GrownPipe)
    }

    /// Grow the pipe whose write end is `fd` to [`GROWN_PIPE`], if one of
    /// the process's grown pipes is free: its new size in bytes, or `None`
    /// (the pipe keeps its size).
    fn grow(fd: std::os::fd::BorrowedFd<'_>) -> Option<(GrownPipe, usize)> {
        let held = GrownPipe::take()?;
        let size = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(GROWN_PIPE as libc::c_int)).ok()?;
        Some((held, usize::try_from(size).ok()?))
    }
}

impl Drop for GrownPipe {
    fn drop(&mut self) {
        GROWN_PIPES.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One direction between two sockets through a pipe with splice(2): the
/// bytes go from one socket to the other inside the kernel, never copied
/// through the proxy's memory; the pipe holds at most [`PIPE`]
/// bytes (one read's worth), or [`GROWN_PIPE`] once the direction has
/// moved [`GROW_AFTER`] bytes and one of the [`MAX_GROWN_PIPES`] is free;
/// then, toward the sandbox (`to_sandbox`), the rest goes by [`copied`]
/// instead. The bounds are the same (idle time to read, write time for
/// each piece). Where no pipe can be made (no descriptor left), the
/// connection ends.
async fn spliced(
    from: &tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    b: &Bounds,
    to_sandbox: bool,
) -> bool {
    use std::os::fd::AsRawFd;
    let Ok((pipe_r, pipe_w)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC) else {
        return false;
    };
    let splice = |fd_in: i32, fd_out: i32, len: usize| -> std::io::Result<usize> {
        // SAFETY: descriptors open for the whole call; no pointers are passed.
        let n = unsafe {
            libc::splice(
                fd_in,
                std::ptr::null_mut(),
                fd_out,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    };
    let (src, dst): (&TcpStream, &TcpStream) = (from.as_ref(), to.as_ref());
    let (src_fd, dst_fd) = (src.as_raw_fd(), dst.as_raw_fd());
    let (mut chunk, mut moved_all, mut grown) = (PIPE, 0u64, None);
    loop {
        if grown.is_none() && moved_all >= GROW_AFTER {
            use std::os::fd::AsFd;
            // Asked again after each further GROW_AFTER bytes: a direction
            // that finds none free keeps its size meanwhile.
            moved_all = 0;
            if to_sandbox {
                if let Some(held) = GrownPipe::take() {
                    drop((pipe_r, pipe_w));
                    return copied(from, to, b, held).await;
                }
            } else if let Some((held, size)) = GrownPipe::grow(pipe_w.as_fd()) {
                (grown, chunk) = (Some(held), size);
            }
        }
        // The pipe is empty here: an EAGAIN is the socket's.
        let moved = match read_some(src, b, || splice(src_fd, pipe_w.as_raw_fd(), chunk)).await {
            Ok(n) => n,
            Err(clean) => return shut(to, b, clean).await,
        };
        if grown.is_none() {
            moved_all = moved_all.saturating_add(moved as u64);
        }
        // The pipe holds `moved` bytes: an EAGAIN is the socket's.
        if !write_all(dst, b, moved, |done| splice(pipe_r.as_raw_fd(), dst_fd, moved - done)).await {
            return false;
        }
    }
}

/// Read once from `src` with `read` (non-blocking) within the idle bound:
/// the bytes moved, or how the direction ended: cleanly (the source's
/// end) or not (idle too long, an error).
async fn read_some(
    src: &TcpStream,
    b: &Bounds,
    mut read: impl FnMut() -> std::io::Result<usize>,
) -> Result<usize, bool> {
    loop {
        if !matches!(tokio::time::timeout(b.idle, src.readable()).await, Ok(Ok(()))) {
            return Err(false);
        }
        match src.try_io(tokio::io::Interest::READABLE, &mut read) {
            Ok(0) => return Err(true),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(false),
        }
    }
}

/// A direction's end: `to` shut down (within the write bound); `clean`.
async fn shut(to: &mut tokio::net::tcp::OwnedWriteHalf, b: &Bounds, clean: bool) -> bool {
    let _ = tokio::time::timeout(b.write, to.shutdown()).await;
    clean
}

/// Write `len` bytes to `dst` with `write` (given how many are done;
/// non-blocking) within the write bound; whether they all went.
async fn write_all(
    dst: &TcpStream,
    b: &Bounds,
    len: usize,
    mut write: impl FnMut(usize) -> std::io::Result<usize>,
) -> bool {
    let until = tokio::time::Instant::now() + b.write;
    let mut done = 0;
    while done < len {
        if !matches!(tokio::time::timeout_at(until, dst.writable()).await, Ok(Ok(()))) {
            return false;
        }
        match dst.try_io(tokio::io::Interest::WRITABLE, || write(done)) {
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return false,
        }
    }
    true
}

/// The rest of a busy direction toward the sandbox: read(2) and write(2)
/// through a buffer of [`GROWN_PIPE`] bytes, held with `_held` (see the
/// module notes for why not a splice), with the same bounds as
/// [`spliced`]; whether the direction ended cleanly.
async fn copied(
    from: &tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    b: &Bounds,
    _held: GrownPipe,
) -> bool {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; GROWN_PIPE];
    let (src, dst): (&TcpStream, &TcpStream) = (from.as_ref(), to.as_ref());
    let (src_fd, dst_fd) = (src.as_raw_fd(), dst.as_raw_fd());
    loop {
        let moved = match read_some(src, b, || {
            // SAFETY: reads at most the buffer's length into it.
            let n = unsafe { libc::read(src_fd, buf.as_mut_ptr().cast(), buf.len()) };
            usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
        })
        .await
        {
            Ok(n) => n,
            Err(clean) => return shut(to, b, clean).await,
        };
        let written = write_all(dst, b, moved, |done| {
            // SAFETY: writes bytes of the buffer that were read into it.
            let n = unsafe { libc::write(dst_fd, buf[done..moved].as_ptr().cast(), moved - done) };
            usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
        })
        .await;
        if !written {
            return false;
        }
    }
}
