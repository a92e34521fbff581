//! The server name of a TLS ClientHello, read (never answered: the proxy
//! does not terminate TLS) from the first bytes a client sends through a
//! `CONNECT` tunnel.
//!
//! The ClientHello may span several records and several TCP segments:
//! [`parse_client_hello`] is given everything received so far and says
//! "more" until the whole handshake message is there, bounded by
//! [`MAX_HELLO_BYTES`]. Records other than handshake records before the
//! end, a handshake message other than ClientHello, a repeated extension,
//! a server name that is not one canonical host name: refused. With
//! Encrypted Client Hello the name read is the outer one, which is what
//! the tunnel's host must match.

use crate::network::addr::{canonical_host, Host, HostError};
use crate::network::decide::Destination;

/// Bytes of records read for one ClientHello (a post-quantum key share
/// makes it about 2 KiB; this leaves room for many extensions).
pub const MAX_HELLO_BYTES: usize = 32 * 1024;
/// Bytes of input (records with their headers) read for one ClientHello:
/// past this, the hello is refused, never waited for.
pub const MAX_HELLO_INPUT: usize = 2 * MAX_HELLO_BYTES;

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ECH: u16 = 0xfe0d;
/// Largest record payload (RFC 8446 5.1).
const MAX_RECORD: usize = 1 << 14;

/// What the ClientHello says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The server name (the outer one with ECH).
    pub sni: Option<String>,
    pub ech: bool,
}

/// Why the first bytes of a tunnel are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("the first bytes are not a TLS handshake")]
    NotTls,
    #[error("a TLS record is malformed ({0})")]
    Record(&'static str),
    #[error("the first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello is longer than {MAX_HELLO_BYTES} bytes")]
    TooLarge,
    #[error("the ClientHello is malformed ({0})")]
    Malformed(&'static str),
    #[error("the ClientHello repeats extension {0}")]
    DuplicateExtension(u16),
    #[error("the server name is not a host name: {0}")]
    BadName(HostError),
    #[error("the server name is an address")]
    NameIsAddress,
}

/// Whether `first` can start a TLS connection.
pub fn looks_like_tls(first: u8) -> bool {
    first == RECORD_HANDSHAKE
}

/// The ClientHello at the start of `buf`; `None` while incomplete.
pub fn parse_client_hello(buf: &[u8]) -> Result<Option<ClientHello>, TlsError> {
    HelloReader::default().feed(buf)
}

/// A ClientHello read as it arrives: each call is given everything
/// received so far, and takes up only the records completed since the
/// last, so each byte is looked at a bounded number of times however
/// finely the client cuts its hello (records of one byte, one byte per
/// segment).
#[derive(Debug, Default)]
pub struct HelloReader {
    /// Where the next record starts.
    at: usize,
    /// The handshake message's bytes so far.
    message: Vec<u8>,
    /// Bytes looked at so far (the bound's measure).
    looked: usize,
}

impl HelloReader {
    /// Bytes this reader has looked at so far: at most a small multiple
    /// of the input, whatever its cut.
    pub fn looked(&self) -> usize {
        self.looked
    }

    /// The ClientHello at the start of `buf` (which holds every byte fed
    /// before); `None` while incomplete. After an answer, feed no more.
    pub fn feed(&mut self, buf: &[u8]) -> Result<Option<ClientHello>, TlsError> {
        loop {
            let at = self.at;
            let Some(header) = buf.get(at..at + 5) else {
                self.looked += 2;
                return partial(buf, at);
            };
            self.looked += 5;
            if header[0] != RECORD_HANDSHAKE {
                return Err(if at == 0 {
                    TlsError::NotTls
                } else {
                    TlsError::Record("a record other than a handshake")
                });
            }
            if header[1] != 3 || header[2] > 4 {
                return Err(TlsError::Record("version"));
            }
            let len = u16::from_be_bytes([header[3], header[4]]) as usize;
            if len == 0 || len > MAX_RECORD {
                return Err(TlsError::Record("length"));
            }
            if at + 5 + len > MAX_HELLO_INPUT {
                return Err(TlsError::TooLarge);
            }
            let Some(payload) = buf.get(at + 5..at + 5 + len) else {
                return Ok(None);
            };
            self.looked += len;
            self.message.extend_from_slice(payload);
            self.at += 5 + len;
            let message = &self.message;
            if message.len() >= 4 {
                if message[0] != HANDSHAKE_CLIENT_HELLO {
                    return Err(TlsError::NotClientHello);
                }
                let body_len = u32::from_be_bytes([0, message[1], message[2], message[3]]) as usize;
                if body_len > MAX_HELLO_BYTES {
                    return Err(TlsError::TooLarge);
                }
                if message.len() >= 4 + body_len {
                    if message.len() > 4 + body_len {
                        return Err(TlsError::Record("bytes after the ClientHello in its record"));
                    }
                    self.looked += message.len();
                    return client_hello(&message[4..]).map(Some);
                }
            }
            if message.len() > MAX_HELLO_BYTES + 4 {
                return Err(TlsError::TooLarge);
            }
        }
    }
}

/// The bytes after `at` are the start of a record header: judge what is there.
fn partial(buf: &[u8], at: usize) -> Result<Option<ClientHello>, TlsError> {
    let rest = &buf[at.min(buf.len())..];
    match rest.first() {
        Some(&t) if t != RECORD_HANDSHAKE => {
            Err(if at == 0 { TlsError::NotTls } else { TlsError::Record("a record other than a handshake") })
        }
        _ if rest.get(1).is_some_and(|&v| v != 3) => Err(TlsError::Record("version")),
        _ => Ok(None),
    }
}

/// A reader over a byte slice whose every read is checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], TlsError> {
        if self.0.len() < n {
            return Err(TlsError::Malformed(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, TlsError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, TlsError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], TlsError> {
        let n = self.u8(what)? as usize;
        self.take(n, what)
    }
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], TlsError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
}

fn client_hello(body: &[u8]) -> Result<ClientHello, TlsError> {
    let mut c = Cursor(body);
    let version = c.u16("version")?;
    if version >> 8 != 3 {
        return Err(TlsError::Malformed("version"));
    }
    c.take(32, "random")?;
    if c.vec8("session id")?.len() > 32 {
        return Err(TlsError::Malformed("session id"));
    }
    let suites = c.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(TlsError::Malformed("cipher suites"));
    }
    if c.vec8("compression methods")?.is_empty() {
        return Err(TlsError::Malformed("compression methods"));
    }
    let mut hello = ClientHello { sni: None, ech: false };
    if c.0.is_empty() {
        return Ok(hello);
    }
    let mut exts = Cursor(c.vec16("extensions")?);
    if !c.0.is_empty() {
        return Err(TlsError::Malformed("bytes after the extensions"));
    }
    let mut seen: Vec<u16> = Vec::new();
    while !exts.0.is_empty() {
        let kind = exts.u16("extension")?;
        let data = exts.vec16("extension")?;
        if seen.contains(&kind) {
            return Err(TlsError::DuplicateExtension(kind));
        }
        seen.push(kind);
        match kind {
            EXT_SERVER_NAME => hello.sni = Some(server_name(data)?),
            EXT_ECH => hello.ech = true,
            _ => {}
        }
    }
    Ok(hello)
}

fn server_name(data: &[u8]) -> Result<String, TlsError> {
    let mut outer = Cursor(data);
    let mut list = Cursor(outer.vec16("server name list")?);
    if !outer.0.is_empty() {
        return Err(TlsError::Malformed("server name list"));
    }
    let mut found = None;
    while !list.0.is_empty() {
        let kind = list.u8("server name")?;
        let name = list.vec16("server name")?;
        if kind != 0 {
            continue;
        }
        if found.is_some() {
            return Err(TlsError::Malformed("two host names"));
        }
        let text = std::str::from_utf8(name).map_err(|_| TlsError::BadName(HostError::BadCharacter))?;
        match canonical_host(text).map_err(TlsError::BadName)? {
            Host::Name(n) => found = Some(n),
            Host::Ip(_) => return Err(TlsError::NameIsAddress),
        }
    }
    found.ok_or(TlsError::Malformed("no host name in the server name list"))
}

/// Why a tunnel's ClientHello does not fit its `CONNECT` host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SniMismatch {
    #[error("the TLS server name `{sni}` is not the CONNECT host `{host}`")]
    Different { sni: String, host: String },
    #[error("the TLS ClientHello names no server, which only an address allowed by name may do")]
    Missing,
}

/// The ClientHello's name against the tunnel's destination: the same
/// canonical name; no name only for an address destination (the decision
/// let it through only when an allow entry names it).
pub fn check_sni(dest: &Destination, hello: &ClientHello) -> Result<(), SniMismatch> {
    match (&hello.sni, &dest.host) {
        (Some(sni), Host::Name(host)) if sni == host => Ok(()),
        (Some(sni), host) => Err(SniMismatch::Different { sni: sni.clone(), host: host.to_string() }),
        (None, Host::Ip(_)) => Ok(()),
        (None, Host::Name(_)) => Err(SniMismatch::Missing),
    }
}

/// A ClientHello with the given extensions, in records (tests and the
/// fuzz corpus).
pub fn build_client_hello(sni: Option<&[u8]>, extra: &[(u16, &[u8])]) -> Vec<u8> {
    records(&client_hello_message(sni, extra), MAX_RECORD)
}

/// The ClientHello handshake message itself.
pub fn client_hello_message(sni: Option<&[u8]>, extra: &[(u16, &[u8])]) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let mut entry = vec![0u8];
        entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
        entry.extend_from_slice(name);
        let mut list = (entry.len() as u16).to_be_bytes().to_vec();
        list.extend_from_slice(&entry);
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&(list.len() as u16).to_be_bytes());
        exts.extend_from_slice(&list);
    }
    for (kind, data) in extra {
        exts.extend_from_slice(&kind.to_be_bytes());
        exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
        exts.extend_from_slice(data);
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut msg = vec![HANDSHAKE_CLIENT_HELLO];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    msg
}

/// `msg` cut into handshake records of at most `size` bytes.
pub fn records(msg: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in msg.chunks(size.max(1)) {
        out.extend_from_slice(&[RECORD_HANDSHAKE, 3, 1]);
        out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
        out.extend_from_slice(piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handshake message inside one record.
    fn message(hello: &[u8]) -> &[u8] {
        &hello[5..]
    }

    #[test]
    fn the_server_name_is_read_and_canonical() {
        let h = build_client_hello(Some(b"Example.COM"), &[(10, &[0, 2, 0, 29])]);
        assert_eq!(parse_client_hello(&h), Ok(Some(ClientHello { sni: Some("example.com".into()), ech: false })));
        let h = build_client_hello(None, &[]);
        assert_eq!(parse_client_hello(&h), Ok(Some(ClientHello { sni: None, ech: false })));
        let h = build_client_hello(Some(b"public.example"), &[(EXT_ECH, &[0; 8])]);
        assert_eq!(
            parse_client_hello(&h).unwrap().unwrap(),
            ClientHello { sni: Some("public.example".into()), ech: true }
        );
    }

    #[test]
    fn a_hello_across_records_and_segments_is_read_whole() {
        let msg = client_hello_message(Some(b"a.example.com"), &[(21, &[0; 600])]);
        for size in [1, 7, 100, 512] {
            let split = records(&msg, size);
            for cut in [0, 1, 4, 5, 6, split.len() / 2, split.len() - 1] {
                assert_eq!(parse_client_hello(&split[..cut]), Ok(None), "size {size}, cut {cut}");
            }
            assert_eq!(parse_client_hello(&split).unwrap().unwrap().sni.as_deref(), Some("a.example.com"), "{size}");
        }
    }

    #[test]
    fn a_hello_in_tiny_records_is_refused_at_the_input_bound_not_waited_for() {
        let msg = client_hello_message(Some(b"a.com"), &[(21, &vec![0; 20_000])]);
        assert!(parse_client_hello(&records(&msg, 4096)).unwrap().is_some());
        let tiny = records(&msg, 1);
        assert_eq!(parse_client_hello(&tiny), Err(TlsError::TooLarge));
        assert_eq!(parse_client_hello(&tiny[..MAX_HELLO_INPUT + 6]), Err(TlsError::TooLarge));
        assert_eq!(parse_client_hello(&tiny[..MAX_HELLO_INPUT - 6]), Ok(None));
    }

    #[test]
    fn a_hello_fed_a_byte_at_a_time_is_looked_at_a_bounded_number_of_times() {
        // The largest hello taken, in records of one byte (six bytes each),
        // then in one record, arriving one byte per read.
        let msg = client_hello_message(Some(b"a.com"), &[(21, &vec![0; 10_000])]);
        for input in [records(&msg, 1), records(&msg, MAX_RECORD)] {
            let mut reader = HelloReader::default();
            let mut got = None;
            for end in 1..=input.len() {
                if let Some(h) = reader.feed(&input[..end]).unwrap() {
                    got = Some((h, end));
                    break;
                }
            }
            let (hello, end) = got.expect("read whole");
            assert_eq!((hello.sni.as_deref(), end), (Some("a.com"), input.len()));
            // Linear: each byte a few times, where reading from the start
            // on every read looked at about len * len / 2.
            assert!(reader.looked() <= 8 * input.len(), "{} bytes looked at for {}", reader.looked(), input.len());
        }
    }

    #[test]
    fn what_is_not_one_clean_client_hello_is_refused() {
        assert_eq!(parse_client_hello(b"GET / HTTP/1.1\r\n"), Err(TlsError::NotTls));
        assert_eq!(parse_client_hello(b"\x16\x02"), Err(TlsError::Record("version")));
        assert_eq!(parse_client_hello(&[22, 3, 1, 0, 0]), Err(TlsError::Record("length")));
        assert_eq!(parse_client_hello(&[22, 3, 1, 0x40, 1]), Err(TlsError::Record("length")));
        // A ServerHello type, a huge declared length.
        assert_eq!(parse_client_hello(&records(&[2, 0, 0, 1, 0], 100)), Err(TlsError::NotClientHello));
        assert_eq!(parse_client_hello(&records(&[1, 0xff, 0, 0], 100)), Err(TlsError::TooLarge));
        // An alert record in the middle of the hello.
        let one = build_client_hello(Some(b"a.com"), &[]);
        let mut split = records(&message(&one)[..10], 10);
        split.extend_from_slice(&[21, 3, 3, 0, 2, 1, 0]);
        assert_eq!(parse_client_hello(&split), Err(TlsError::Record("a record other than a handshake")));
        let dup = build_client_hello(Some(b"a.com"), &[(0, &[0, 6, 0, 0, 3, b'b', b'.', b'c'])]);
        assert_eq!(parse_client_hello(&dup), Err(TlsError::DuplicateExtension(0)));
        for (name, want) in [
            (&b"a\0b.com"[..], TlsError::BadName(HostError::Nul)),
            (b"127.0.0.1", TlsError::NameIsAddress),
            (b"2130706433", TlsError::NameIsAddress),
            (b"a..b", TlsError::BadName(HostError::EmptyLabel)),
        ] {
            assert_eq!(parse_client_hello(&build_client_hello(Some(name), &[])), Err(want), "{name:?}");
        }
        // A hello whose length runs past its extensions.
        let mut bad = build_client_hello(Some(b"a.com"), &[]);
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(parse_client_hello(&bad).is_err());
    }

    #[test]
    fn the_name_must_be_the_connect_host() {
        let d = Destination::new("github.com", 443).unwrap();
        let hello = |sni: Option<&str>| ClientHello { sni: sni.map(str::to_owned), ech: false };
        assert_eq!(check_sni(&d, &hello(Some("github.com"))), Ok(()));
        assert_eq!(
            check_sni(&d, &hello(Some("evil.com"))).unwrap_err().to_string(),
            "the TLS server name `evil.com` is not the CONNECT host `github.com`"
        );
        assert_eq!(check_sni(&d, &hello(None)), Err(SniMismatch::Missing));
        let ip = Destination::new("93.184.216.34", 443).unwrap();
        assert_eq!(check_sni(&ip, &hello(None)), Ok(()));
        assert!(check_sni(&ip, &hello(Some("github.com"))).is_err());
        assert!(looks_like_tls(22) && !looks_like_tls(b'G'));
    }
}
