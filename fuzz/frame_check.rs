//! The properties of the worker -> host frame decoder (`frame::body_len`,
//! `frame::decode_reply`, `frame::read_frame`), checked against an exact
//! model of the wire format: a big-endian u32 length in 1..=MAX_FRAME_BYTES,
//! then that many bytes of JSON.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/frame.rs`) and the
//! stable replay test (`tests/frame_fuzz.rs`), so that `cargo test` checks
//! the committed corpus with the same oracle that the fuzzer uses.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use pi_python_sandbox::frame::{body_len, decode_reply, encode, read_frame, FrameError};
use pi_python_sandbox::limits::MAX_FRAME_BYTES;
use tokio::io::{AsyncRead, ReadBuf};

/// Check every property on one input (the bytes of the reply channel).
pub fn check(data: &[u8]) {
    check_header(data);
    let expected = model(data);
    let whole = read_all(&mut &data[..]);
    assert_eq!(whole, expected, "read_frame over one slice disagrees with the model");
    let (chunk, pattern) = trickle_params(data);
    let mut trickle = Trickle { data, pos: 0, chunk, pattern, step: 0, stalled: false };
    let trickled = read_all(&mut trickle);
    assert_eq!(trickled, expected, "the result depends on how the bytes arrive (chunk {chunk}, pattern {pattern:#x})");
    for body in expected.iter().filter_map(|r| r.as_ref().ok()) {
        check_decode(body);
    }
    // The decoder also meets bytes that never passed the length check.
    check_decode(data);
}

/// `body_len` accepts exactly 1..=MAX and reports the length it read.
fn check_header(data: &[u8]) {
    let Some(header) = data.get(..4) else { return };
    let header: [u8; 4] = header.try_into().expect("four bytes");
    let len = u32::from_be_bytes(header) as usize;
    match body_len(header) {
        Ok(n) => assert!(n == len && (1..=MAX_FRAME_BYTES).contains(&n), "body_len accepted {len} as {n}"),
        Err(FrameError::Empty) => assert_eq!(len, 0),
        Err(FrameError::Oversize { len: n }) => assert!(n == len && n > MAX_FRAME_BYTES, "oversize {n} for {len}"),
        Err(other) => panic!("body_len gave {other:?} for {len}"),
    }
}

/// What reading frames until the first error must give.
pub fn model(mut rest: &[u8]) -> Vec<Result<Vec<u8>, FrameError>> {
    let mut out = Vec::new();
    loop {
        let item = if rest.is_empty() {
            Err(FrameError::Eof)
        } else if rest.len() < 4 {
            Err(FrameError::Truncated { got: rest.len(), want: 4 })
        } else {
            let len = u32::from_be_bytes(rest[..4].try_into().expect("four bytes")) as usize;
            let body = &rest[4..];
            if len == 0 {
                Err(FrameError::Empty)
            } else if len > MAX_FRAME_BYTES {
                Err(FrameError::Oversize { len })
            } else if body.len() < len {
                Err(FrameError::Truncated { got: body.len(), want: len })
            } else {
                rest = &body[len..];
                Ok(body[..len].to_vec())
            }
        };
        let end = item.is_err();
        out.push(item);
        if end {
            return out;
        }
    }
}

/// A decoded reply survives encode -> decode unchanged.
fn check_decode(body: &[u8]) {
    let Ok(reply) = decode_reply(body) else { return };
    match encode(&reply) {
        Ok(frame) => {
            let header: [u8; 4] = frame[..4].try_into().expect("header");
            assert_eq!(body_len(header), Ok(frame.len() - 4));
            assert_eq!(decode_reply(&frame[4..]).as_ref(), Ok(&reply), "round trip changed the reply");
        }
        // Re-encoding writes defaulted fields the input left out, so a
        // body near the limit may grow past it; nothing else may fail.
        Err(FrameError::Oversize { .. }) => assert!(body.len() + 256 > MAX_FRAME_BYTES, "{} byte body", body.len()),
        Err(e) => panic!("a decoded reply could not be encoded: {e}"),
    }
}

fn read_all<R: AsyncRead + Unpin>(reader: &mut R) -> Vec<Result<Vec<u8>, FrameError>> {
    let mut out = Vec::new();
    loop {
        let item = poll_to_end(read_frame(reader));
        if let Ok(body) = &item {
            assert!(!body.is_empty() && body.len() <= MAX_FRAME_BYTES, "{} byte body", body.len());
        }
        let end = item.is_err();
        out.push(item);
        if end {
            return out;
        }
    }
}

/// Drive a future whose reader never waits on anything outside it.
fn poll_to_end<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..50_000_000u64 {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("read_frame never finished on an in-memory reader");
}

/// How the trickle reader hands out this input: piece size and the
/// pattern of stalls (Pending or EINTR), derived from the bytes so that
/// corpus files stay plain frames.
fn trickle_params(data: &[u8]) -> (usize, u8) {
    let h = data.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ b as u32).wrapping_mul(0x0100_0193));
    let chunk = match h % 20 {
        0 => usize::MAX,
        n => n as usize,
    };
    (chunk, (h >> 8) as u8)
}

/// A pipe-like reader: at most `chunk` bytes per read, and before some
/// reads one `Pending` (with a wake) or one `Interrupted` error.
struct Trickle<'a> {
    data: &'a [u8],
    pos: usize,
    chunk: usize,
    pattern: u8,
    step: u32,
    stalled: bool,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        me.step = me.step.wrapping_add(1);
        if !me.stalled && (me.pattern >> (me.step % 8)) & 1 == 1 {
            me.stalled = true;
            if me.step % 2 == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            return Poll::Ready(Err(io::ErrorKind::Interrupted.into()));
        }
        me.stalled = false;
        let n = me.chunk.min(buf.remaining()).min(me.data.len() - me.pos);
        buf.put_slice(&me.data[me.pos..me.pos + n]);
        me.pos += n;
        Poll::Ready(Ok(()))
    }
}
