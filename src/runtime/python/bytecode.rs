//! The worker's compiled form, kept per runtime root and interpreter.
//!
//! Compiling worker.py costs the interpreter about 10 ms, a third of a
//! sandbox start on a slow machine. So the first sandbox for an interpreter
//! runs the source with `--emit-code`: as the first thing it does, before it
//! reads a site directory or a request (so while nothing but the standard
//! library has run in it), the worker sends its own module code as a `.pyc`
//! image. Once that sandbox reports ready, the host stores the image as
//! `<runtime root>/.worker-code/worker-<key>.pyc` (mode 0400, written under
//! a temporary name and renamed), and later sandboxes run it read-only as
//! `/worker.pyc`. The sandbox itself cannot write there.
//!
//! The key covers the worker source and the interpreter file's identity
//! (canonical path, device, inode, size, modification and change times), so
//! a rebuilt addon or a replaced interpreter never runs a stale image. An
//! image that fails to start is deleted and the start is retried from source.

use std::fs::OpenOptions;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;

/// Subdirectory of the runtime root that holds the images.
pub const DIR: &str = ".worker-code";

/// The cache key for running `worker_source` on `interpreter`, or `None`
/// when the interpreter file cannot be examined (then nothing is cached).
pub fn key(interpreter: &Path, worker_source: &str) -> Option<u64> {
    let path = std::fs::canonicalize(interpreter).ok()?;
    let meta = std::fs::metadata(&path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    worker_source.hash(&mut h);
    path.hash(&mut h);
    (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec())
        .hash(&mut h);
    Some(h.finish())
}

/// Where the image for `key` lives under `runtime_root`.
pub fn path(runtime_root: &Path, key: u64) -> PathBuf {
    runtime_root.join(DIR).join(format!("worker-{key:016x}.pyc"))
}

/// The stored image for `key`, if there is one: a regular file (not a
/// link) owned by this user.
pub fn cached(runtime_root: &Path, key: u64) -> Option<PathBuf> {
    let path = path(runtime_root, key);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    (meta.is_file() && meta.uid() == nix::unistd::getuid().as_raw()).then_some(path)
}

/// Why an image sent by a worker was not used, or not stored.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("the worker's code is not base64: {0}")]
    NotBase64(#[from] base64::DecodeError),
    #[error("the worker's code has {0} bytes")]
    TooShort(usize),
    #[error("the worker's code does not start with a .pyc magic number")]
    NoMagic,
    #[error(transparent)]
    Dir(#[from] crate::rundir::DirError),
    #[error("cannot store the worker's code in {}: {source}", dir.display())]
    Store { dir: PathBuf, source: std::io::Error },
}

/// Decode and check an image sent by a worker: base64, more than the
/// 16-byte header (the frame limit bounds the size), and a magic number that
/// ends in `\r\n` as every CPython one does. The interpreter checks the rest.
pub fn decode(pyc_base64: &str) -> Result<Vec<u8>, CodeError> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(pyc_base64)?;
    if bytes.len() <= 16 {
        return Err(CodeError::TooShort(bytes.len()));
    }
    if &bytes[2..4] != b"\r\n" {
        return Err(CodeError::NoMagic);
    }
    Ok(bytes)
}

/// Store `image` for `key`. The directory must be private (as the runtime
/// root is); the file appears complete or not at all.
pub fn store(runtime_root: &Path, key: u64, image: &[u8]) -> Result<PathBuf, CodeError> {
    let final_path = path(runtime_root, key);
    let dir = final_path.parent().unwrap_or(runtime_root);
    crate::rundir::private_dir(dir)?;
    let tmp = dir.join(format!(".tmp-{:016x}", crate::random::random_u64()));
    let written = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o400).open(&tmp)?;
        f.write_all(image)?;
        std::fs::rename(&tmp, &final_path)
    })();
    written.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        CodeError::Store { dir: dir.to_path_buf(), source }
    })?;
    Ok(final_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pyc(len: usize) -> String {
        let mut bytes = vec![0xa7u8, 0x0d, b'\r', b'\n'];
        bytes.resize(len, 0xe3);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn decode_accepts_a_pyc_image_and_refuses_anything_else() {
        assert_eq!(decode(&pyc(40_000)).map(|b| b.len()).ok(), Some(40_000));
        assert!(decode("not base64!").unwrap_err().to_string().contains("not base64"));
        assert!(decode(&pyc(16)).unwrap_err().to_string().contains("16 bytes"));
        let no_magic = base64::engine::general_purpose::STANDARD.encode([b'#'; 64]);
        assert!(decode(&no_magic).unwrap_err().to_string().contains("magic"));
    }

    #[test]
    fn the_key_follows_the_worker_source_and_the_interpreter_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let interp = dir.join("python3");
        std::fs::write(&interp, b"one").unwrap();
        let link = dir.join("python");
        std::os::unix::fs::symlink(&interp, &link).unwrap();
        let k = key(&interp, "src").unwrap();
        assert_eq!(key(&link, "src"), Some(k), "a link to the same file is the same interpreter");
        assert_ne!(key(&interp, "other src"), Some(k));
        // Replaced (as a package upgrade does: a new file renamed over it).
        let new = dir.join("new");
        std::fs::write(&new, b"two!").unwrap();
        std::fs::rename(&new, &interp).unwrap();
        assert_ne!(key(&interp, "src"), Some(k));
        assert_eq!(key(&dir.join("missing"), "src"), None);
    }

    #[test]
    fn store_writes_a_private_read_only_file_that_cached_finds() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        assert_eq!(cached(root, 7), None);
        let stored = store(root, 7, b"image").unwrap();
        assert_eq!(cached(root, 7), Some(stored.clone()));
        assert_eq!(std::fs::read(&stored).unwrap(), b"image");
        assert_eq!(std::fs::metadata(&stored).unwrap().mode() & 0o777, 0o400);
        assert_eq!(std::fs::metadata(root.join(DIR)).unwrap().mode() & 0o777, 0o700);
        // Storing again replaces it (the old file is read-only, the rename is not blocked).
        store(root, 7, b"image 2").unwrap();
        assert_eq!(std::fs::read(&stored).unwrap(), b"image 2");
        assert_eq!(std::fs::read_dir(root.join(DIR)).unwrap().count(), 1, "no temporary file is left");
        // A link in its place is not used.
        std::fs::remove_file(&stored).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &stored).unwrap();
        assert_eq!(cached(root, 7), None);
    }
}
