//! Unpredictable numbers for names the sandbox must not guess: temporary
//! and session directories, inert names, nonces.

/// An unpredictable 64-bit number (for directory names and nonces).
pub fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == buf.len() as isize {
        return u64::from_ne_bytes(buf);
    }
    // Never reached on Linux 3.17+; still unpredictable enough for names.
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ (std::process::id() as u64).rotate_left(32)
}
