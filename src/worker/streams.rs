//! A call's output streams: taken from the idle interpreter, read into the
//! capture, and the streams of earlier calls drained at a bounded rate
//! while a background process still holds them. And the reply channel's
//! reader, which hands its frames to the call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use super::Worker;
use crate::capture::{Capture, Stream};
use crate::frame::{self, FrameError, Reply};
use crate::protected;
use crate::spawn::{kill_group, take_fds};

/// Where the idle interpreter leaves the read ends of the next call's
/// stdout and stderr (see the worker's `prepare_streams`).
pub(super) const STREAM_FDS: [i32; 2] = [14, 15];

/// Take the read ends of the call's fresh output pipes from `pid`.
pub(super) fn call_streams(pid: i32) -> std::io::Result<(pipe::Receiver, pipe::Receiver)> {
    let [out, err] = take_fds(pid, STREAM_FDS)?;
    let (out, err) = (pipe::Receiver::from_owned_fd(out)?, pipe::Receiver::from_owned_fd(err)?);
    Ok((out, err))
}

/// Most streams of earlier calls read at once per sandbox.
pub(super) const MAX_RETIRED: usize = 16;

/// Most bytes a stream of an earlier call is read (and dropped) per
/// second: past it the task sleeps for the rest of the second and the
/// stream's writers block on the full pipe. MAX_RETIRED of them make at
/// most 1 MiB a second, a few dozen reads: what a sandbox's background
/// flood costs the host's process while no call runs.
pub(super) const RETIRED_BYTES_PER_SECOND: usize = 64 * 1024;

/// Most bytes dropped from a call's own pipes before the next call on the
/// same pipes (a pipe holds at most 1 MiB unless its owner is privileged):
/// a writer that never stops cannot keep the host draining.
pub(super) const SAME_PIPES_DRAIN_BYTES: usize = 1024 * 1024;

impl Worker {
    /// Read a stream of an earlier call until its last writer is gone, and
    /// drop what it says (closing it under a writer would hand a background
    /// process SIGPIPE), at most RETIRED_BYTES_PER_SECOND: a flood waits on
    /// the full pipe instead of keeping the host busy. One task and one fd
    /// per stream that a process of the sandbox still holds, at most
    /// MAX_RETIRED: past it the oldest is closed (its writers then get
    /// EPIPE), so that the sandbox cannot make the host hold descriptors
    /// without bound.
    pub(super) fn retire(&mut self, stream: Option<pipe::Receiver>) {
        let Some(stream) = stream else { return };
        self.retired.retain(|task| !task.is_finished());
        if self.retired.len() >= MAX_RETIRED {
            if let Some(oldest) = self.retired.pop_front() {
                oldest.abort();
            }
        }
        self.retired.push_back(tokio::spawn(drop_slowly(stream, RETIRED_BYTES_PER_SECOND)));
    }
}

/// Read `stream` until EOF and drop it, at most `per_second` bytes in any
/// second.
pub(super) async fn drop_slowly(mut stream: pipe::Receiver, per_second: usize) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut window = Instant::now();
    let mut used = 0;
    loop {
        let room = per_second.saturating_sub(used).min(buf.len());
        if room == 0 {
            sleep_until(window + Duration::from_secs(1)).await;
            (window, used) = (Instant::now(), 0);
            continue;
        }
        match stream.read(&mut buf[..room]).await {
            Ok(n) if n > 0 => used += n,
            _ => return,
        }
        if window.elapsed() >= Duration::from_secs(1) {
            (window, used) = (Instant::now(), 0);
        }
    }
}

/// Read what `stream` holds now, without waiting, into `capture`.
pub(super) fn drain_now(stream: &pipe::Receiver, capture: &mut Capture, which: Stream, buf: &mut [u8]) {
    while let Ok(n) = stream.try_read(buf) {
        if n == 0 {
            break;
        }
        capture.feed(which, &buf[..n]);
        if capture.overflowed {
            break;
        }
    }
}

/// Hand a read result to the capture; a closed or failed stream is finished.
pub(super) fn take_read<R>(capture: &mut Capture, which: Stream, slot: &mut Option<R>, buf: &[u8], n: Option<usize>) {
    match n {
        Some(n) if n > 0 => capture.feed(which, &buf[..n]),
        _ => {
            capture.finish(which);
            *slot = None;
        }
    }
}

/// Read from an optional stream; `None` when it is closed or failed.
pub(super) async fn read_opt<R: AsyncRead + Unpin>(stream: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match stream {
        Some(s) => s.read(buf).await.ok(),
        None => std::future::pending().await,
    }
}

/// Read reply frames into `tx` until the stream ends; a frame that arrives
/// while none is expected kills the sandbox.
pub(super) async fn read_replies(
    mut reader: pipe::Receiver,
    tx: mpsc::Sender<Result<Reply, FrameError>>,
    expecting: Arc<AtomicBool>,
    killed: protected::KillSlot,
    group: i32,
) {
    loop {
        let item = frame::read_frame(&mut reader).await.and_then(|body| frame::decode_reply(&body));
        let end = matches!(
            item,
            Err(FrameError::Eof | FrameError::Truncated { .. } | FrameError::Io { .. } | FrameError::Oversize { .. })
        );
        if !end && !expecting.load(Ordering::Acquire) {
            tracing::warn!("sandbox {group} sent a frame while no execution ran; killed");
            *killed.lock() = Some(protected::HostKill::StrayFrame);
            kill_group(group);
            break;
        }
        if tx.send(item).await.is_err() || end {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_read_finishes_a_closed_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut capture = Capture::new(b"END".to_vec(), dir.join("o"), dir.join("e"));
        let mut slot = Some(());
        take_read(&mut capture, Stream::Stdout, &mut slot, b"hello", Some(5));
        assert!(slot.is_some());
        assert_eq!(capture.stdout.total, 5);
        take_read(&mut capture, Stream::Stdout, &mut slot, b"", Some(0));
        assert!(slot.is_none());
    }
}
