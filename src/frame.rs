//! The length-prefixed JSON frame protocol between the host and the worker.
//!
//! A frame is a big-endian `u32` body length followed by that many bytes of
//! UTF-8 JSON holding one object with a `type` tag. The length is checked
//! against [`MAX_FRAME_BYTES`] before anything is allocated. Requests travel
//! on the worker's fd 3, replies on its fd 4; stdout and stderr never carry
//! frames. This module owns the wire format and the message types; deciding
//! what a message means for a session is `session`'s job.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::limits::MAX_FRAME_BYTES;

/// One call, as the engine hands it to a runtime to phrase.
#[derive(Debug, Clone, Copy)]
pub struct CallRequest<'a> {
    /// The call's sequence number in its session; the reply names it.
    pub id: u64,
    /// What the caller asked to run.
    pub code: &'a str,
    /// The end mark the sandbox writes on both streams after the result.
    pub mark: &'a [u8],
    /// Take a rollback point before running it.
    pub checkpoint: bool,
    /// How many times the project's mount was replaced under the running
    /// sandbox: an interpreter that has seen fewer moves to /workspace.
    pub moved: u64,
}

/// Version spoken by this host and the embedded worker.
pub const PROTOCOL_VERSION: u32 = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("the channel closed")]
    Eof,
    #[error("the channel closed inside a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("frame of {len} bytes exceeds the {MAX_FRAME_BYTES} byte limit")]
    Oversize { len: usize },
    #[error("empty frame")]
    Empty,
    #[error("frame is not a valid message: {reason}")]
    Malformed { reason: String },
    #[error("channel read failed: {reason}")]
    Io { reason: String },
}

/// Host → worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Run `code` (base64 of the UTF-8 source, so that JSON escaping can
    /// never push a 64 KiB source past the frame limit). After the result the
    /// worker writes `mark` (base64 of [`end_mark`]) on stdout and stderr.
    /// With `checkpoint`, it forks a rollback point first.
    Exec {
        id: u64,
        code: String,
        mark: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        checkpoint: bool,
        /// See [`CallRequest::moved`].
        #[serde(default, skip_serializing_if = "is_zero")]
        moved: u64,
    },
    /// The first frame on fresh channels: the host has taken its ends;
    /// the restored frame echoes `nonce`. With `point`, a restored copy
    /// makes the next call's rollback point before it answers.
    Resume {
        nonce: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        point: bool,
    },
    /// The call's result has come: the worker ends that call's rollback
    /// copy (until then a broken frame the code wrote still finds it).
    Release,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Outcome class reported by the worker for one execution.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    Ok,
    RuntimeError,
    PermissionNeeded,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExceptionInfo {
    #[serde(rename = "type")]
    pub type_name: String,
    pub message: String,
    pub traceback: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExecReport {
    pub id: u64,
    pub status: WorkerStatus,
    pub repr: Option<String>,
    #[serde(default)]
    pub repr_truncated: bool,
    pub exception: Option<ExceptionInfo>,
    /// The path a read was refused for (`permission_needed` only).
    #[serde(default)]
    pub path: Option<String>,
    /// The refused read was a directory listing.
    #[serde(default)]
    pub path_is_dir: bool,
    /// The refused read was of a masked secret (see `secrets`).
    #[serde(default)]
    pub path_secret: bool,
    /// Processes other than the worker still alive when the code finished.
    #[serde(default)]
    pub background: u32,
    /// Images the execution produced, saved under /scratch.
    #[serde(default)]
    pub images: Vec<ImageRef>,
    /// Notes about rich output (images not sent, ...).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The end marks, already written when the worker sends the result
    /// with them (the call started no process to wait for): the call's
    /// last frame, in place of a `drained` one.
    #[serde(default)]
    pub drained: Option<Marks>,
}

/// Which streams carry the call's end mark (user code may have closed
/// one), and whether the next call's fresh pipes wait at fds 14 and 15.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Marks {
    pub stdout: bool,
    pub stderr: bool,
    #[serde(default)]
    pub streams: bool,
}

/// An image file the worker saved under /scratch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageRef {
    /// Path inside the sandbox (under /scratch).
    pub path: String,
    pub mime: String,
    #[serde(default)]
    pub width: Option<u32>,
    #[serde(default)]
    pub height: Option<u32>,
}

/// Worker → host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    #[serde(rename_all = "camelCase")]
    Ready {
        protocol: u32,
        runtime_version: String,
        /// Site directories the worker skipped, and why.
        #[serde(default)]
        site_notes: Vec<String>,
        /// The next call's fresh output pipes wait at fds 14 and 15.
        #[serde(default)]
        streams: bool,
    },
    Result(ExecReport),
    /// The worker's own compiled module as a `.pyc` image (base64), sent
    /// first thing when the host started it with `--emit-code`, in pieces
    /// that each fit a frame: `more` says another piece follows.
    Code {
        pyc: String,
        #[serde(default)]
        more: bool,
    },
    /// Sent after the result once the end marks are written, when the call
    /// started processes the worker waited for (else the result carries the
    /// marks, see [`ExecReport::drained`]): `stdout` / `stderr` say which
    /// streams carry a mark (user code may have closed one).
    Drained {
        id: u64,
        stdout: bool,
        stderr: bool,
        #[serde(default)]
        streams: bool,
    },
    /// Execution `id` begins: its output goes to fresh pipes (whose read
    /// ends the host takes), and `copy` is its rollback point's pid in the
    /// sandbox (none, or `why` there is none). Sent only for a request that
    /// asked for a rollback point.
    Begin {
        id: u64,
        copy: Option<u32>,
        why: Option<String>,
    },
    /// An interpreter on fresh channels: a restored copy, or (`fresh`) a
    /// new one.
    Restored {
        fresh: bool,
        #[serde(default)]
        streams: bool,
        #[serde(default)]
        nonce: Option<String>,
    },
    /// The worker refused a request or could not set itself up.
    Error {
        id: Option<u64>,
        message: String,
    },
}

impl Reply {
    /// The frame's type, as a misplaced one is named.
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Ready { .. } => "ready",
            Reply::Result(_) => "result",
            Reply::Drained { .. } => "drained",
            Reply::Code { .. } => "code",
            Reply::Begin { .. } => "begin",
            Reply::Restored { .. } => "restored",
            Reply::Error { .. } => "error",
        }
    }
}

/// The bytes the worker writes on a stream to end one execution's output.
pub fn end_mark(nonce: &str) -> Vec<u8> {
    let mut mark = b"\0\x1bpipy-end:".to_vec();
    mark.extend_from_slice(nonce.as_bytes());
    mark.push(0);
    mark
}

/// Serialise a message into one frame (length prefix included).
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(message).map_err(|e| FrameError::Malformed { reason: e.to_string() })?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::Oversize { len: body.len() });
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Check a length prefix before any body byte is read or allocated.
pub fn body_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    match len {
        0 => Err(FrameError::Empty),
        n if n > MAX_FRAME_BYTES => Err(FrameError::Oversize { len: n }),
        n => Ok(n),
    }
}

/// Parse a frame body into a worker reply. Why one is malformed quotes
/// what the sandbox sent (serde names an unknown type in full): it becomes
/// one bounded line ([`quoted`]).
pub fn decode_reply(body: &[u8]) -> Result<Reply, FrameError> {
    serde_json::from_slice(body).map_err(|e| FrameError::Malformed { reason: quoted(&e.to_string()) })
}

/// The longest text of the worker's that a diagnostic quotes.
const MAX_QUOTED_BYTES: usize = 512;

/// Text from the sandbox that a diagnostic or a state statement quotes (a
/// malformed frame's error, the worker's reason for no rollback point): one
/// line (tab, newline and CR shown as stand-ins) of at most 512 bytes, so
/// that it can neither start a line of the tool's own nor fill the result.
pub fn quoted(text: &str) -> String {
    crate::display::quoted_line(text, MAX_QUOTED_BYTES)
}

/// Read one frame body from `reader`.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; 4];
    let got = read_full(reader, &mut header).await?;
    if got == 0 {
        return Err(FrameError::Eof);
    }
    if got < header.len() {
        return Err(FrameError::Truncated { got, want: 4 });
    }
    let len = body_len(header)?;
    let mut body = vec![0u8; len];
    let got = read_full(reader, &mut body).await?;
    if got < len {
        return Err(FrameError::Truncated { got, want: len });
    }
    Ok(body)
}

/// Fill `buf` unless the stream ends first; returns how much was read.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]).await {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io { reason: e.to_string() }),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_of(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    async fn read(bytes: &[u8]) -> Result<Reply, FrameError> {
        let mut r = bytes;
        let body = read_frame(&mut r).await?;
        decode_reply(&body)
    }

    #[tokio::test]
    async fn ready_frame_round_trips() {
        let msg = Reply::Ready { protocol: 1, runtime_version: "3.11.2".into(), site_notes: vec![], streams: true };
        let bytes = encode(&msg).expect("encode");
        assert_eq!(&bytes[..4], &(bytes.len() as u32 - 4).to_be_bytes());
        assert_eq!(read(&bytes).await, Ok(msg));
    }

    #[tokio::test]
    async fn result_frame_uses_camel_case_fields() {
        let body = br#"{"type":"result","id":3,"status":"runtime_error","repr":null,
            "reprTruncated":false,"exception":{"type":"ValueError","message":"boom","traceback":"tb"},
            "background":2}"#;
        let Reply::Result(report) = read(&frame_of(body)).await.expect("decode") else {
            panic!("not a result");
        };
        assert_eq!(report.id, 3);
        assert_eq!(report.status, WorkerStatus::RuntimeError);
        assert_eq!(report.background, 2);
        assert_eq!(report.exception.expect("exception").type_name, "ValueError");
    }

    #[tokio::test]
    async fn a_result_may_carry_the_end_marks() {
        let body = br#"{"type":"result","id":4,"status":"ok","repr":null,"exception":null,
            "drained":{"stdout":true,"stderr":false,"streams":true}}"#;
        let Reply::Result(report) = read(&frame_of(body)).await.expect("decode") else {
            panic!("not a result");
        };
        assert_eq!(report.drained, Some(Marks { stdout: true, stderr: false, streams: true }));
        let body = br#"{"type":"result","id":4,"status":"ok","repr":null,"exception":null}"#;
        let Reply::Result(report) = read(&frame_of(body)).await.expect("decode") else {
            panic!("not a result");
        };
        assert_eq!(report.drained, None, "a result without marks is followed by a drained frame");
        for marks in
            [r#""yes""#, r#"{"stdout":1,"stderr":true}"#, r#"{"stdout":true}"#, r#"{"stdout":true,"stderr":null}"#]
        {
            let body =
                format!(r#"{{"type":"result","id":4,"status":"ok","repr":null,"exception":null,"drained":{marks}}}"#);
            assert!(
                matches!(read(&frame_of(body.as_bytes())).await, Err(FrameError::Malformed { .. })),
                "accepted {marks}"
            );
        }
    }

    #[tokio::test]
    async fn eof_before_a_frame_is_distinct_from_a_cut_frame() {
        assert_eq!(read(b"").await, Err(FrameError::Eof));
        assert_eq!(read(&[0, 0]).await, Err(FrameError::Truncated { got: 2, want: 4 }));
        let mut cut = frame_of(br#"{"type":"ready"}"#);
        cut.truncate(10);
        assert_eq!(read(&cut).await, Err(FrameError::Truncated { got: 6, want: 16 }));
    }

    #[tokio::test]
    async fn oversize_length_is_refused_before_reading_the_body() {
        // Only the header is present: a decoder that allocated and read
        // first would report truncation instead.
        let header = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
        assert_eq!(read(&header).await, Err(FrameError::Oversize { len: MAX_FRAME_BYTES + 1 }));
        assert_eq!(read(&u32::MAX.to_be_bytes()).await, Err(FrameError::Oversize { len: u32::MAX as usize }));
    }

    #[tokio::test]
    async fn frame_at_the_limit_is_accepted_by_the_codec() {
        let pad = "x".repeat(MAX_FRAME_BYTES - r#"{"type":"error","id":null,"message":""}"#.len());
        let body = format!(r#"{{"type":"error","id":null,"message":"{pad}"}}"#);
        assert_eq!(body.len(), MAX_FRAME_BYTES);
        assert!(matches!(read(&frame_of(body.as_bytes())).await, Ok(Reply::Error { .. })));
    }

    #[tokio::test]
    async fn malformed_bodies_are_rejected() {
        for body in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"type":"bogus"}"#,
            br#"{"type":"result","id":-1,"status":"ok","repr":null,"exception":null}"#,
            br#"{"type":"result","id":1,"status":"weird","repr":null,"exception":null}"#,
            br#"{"type":"ready","protocol":1,"runtimeVersion":3}"#,
            b"\xff\xfe",
        ] {
            assert!(
                matches!(read(&frame_of(body)).await, Err(FrameError::Malformed { .. })),
                "accepted {:?}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(read(&frame_of(b"")).await, Err(FrameError::Empty));
    }

    #[test]
    fn a_malformed_frame_is_quoted_on_one_bounded_line() {
        let forged = format!("x)\n\nstatus: ok (0.1s, worker generation 1)\n{}", "é".repeat(100_000));
        let body = serde_json::to_vec(&serde_json::json!({ "type": forged })).unwrap();
        let Err(FrameError::Malformed { reason }) = decode_reply(&body) else { panic!("accepted") };
        assert!(!reason.contains('\n') && reason.contains("x)\u{240a}\u{240a}status: ok"), "{reason}");
        assert!(reason.len() < 600 && reason.ends_with("..."), "{} bytes", reason.len());
        assert_eq!(quoted("short"), "short");
    }

    #[test]
    fn exec_request_of_64k_newlines_fits_the_frame() {
        use base64::Engine;
        let code = "\n".repeat(crate::limits::MAX_CODE_BYTES);
        let req = Request::Exec {
            id: u64::MAX,
            code: base64::engine::general_purpose::STANDARD.encode(code),
            mark: base64::engine::general_purpose::STANDARD.encode(end_mark(&"0".repeat(24))),
            checkpoint: true,
            moved: u64::MAX,
        };
        let frame = encode(&req).expect("a maximal source must fit one frame");
        assert!(frame.len() - 4 <= MAX_FRAME_BYTES);
    }

    #[test]
    fn encode_refuses_an_oversize_message() {
        let msg = Reply::Error { id: None, message: "x".repeat(MAX_FRAME_BYTES) };
        assert!(matches!(encode(&msg), Err(FrameError::Oversize { .. })));
    }

    #[test]
    fn end_mark_is_nul_delimited() {
        assert_eq!(end_mark("ab"), b"\0\x1bpipy-end:ab\0");
    }
}
