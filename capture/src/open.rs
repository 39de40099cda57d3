//! Opening a tree's files without being fooled: no link followed, no FIFO,
//! device or socket read, no read sized past what the file holds.

use std::io::Read;
use std::path::Path;

pub(crate) fn is_link(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
}

#[cfg(unix)]
pub(crate) fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    open_flags(path, libc::O_NOFOLLOW)
}

#[cfg(not(unix))]
pub(crate) fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    if is_link(path) {
        return Err(std::io::Error::other("a link"));
    }
    open_regular(path)
}

/// Opens a file for reading, refusing anything but a regular file: a FIFO
/// would block the reader forever, a device feed it without end. The open
/// itself does not block (`O_NONBLOCK`, which reads of a regular file
/// ignore).
pub(crate) fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    #[cfg(unix)]
    return open_flags(path, 0);
    #[cfg(not(unix))]
    {
        let f = std::fs::File::open(path)?;
        check_regular(&f)?;
        Ok(f)
    }
}

#[cfg(unix)]
pub(crate) fn open_flags(path: &Path, flags: i32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NONBLOCK)
        .open(path)?;
    check_regular(&f)?;
    Ok(f)
}

pub(crate) fn check_regular(f: &std::fs::File) -> std::io::Result<()> {
    let kind = f.metadata()?.file_type();
    if kind.is_file() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        if kind.is_dir() {
            "a directory, not a file"
        } else {
            "not a regular file (a FIFO, socket or device), refused"
        },
    ))
}

/// The most [`read_all`] reserves before reading.
pub(crate) const MAX_RESERVE: usize = 256 << 20;

/// Reads a whole file into `buf` (kept initialised and reused across files,
/// so it is zero-filled only when it grows) and returns its length. No
/// `stat`: the final zero-length read is the end-of-file check.
pub(crate) fn read_all(
    file: &mut std::fs::File,
    buf: &mut Vec<u8>,
    expected: usize,
) -> std::io::Result<usize> {
    // The expected size comes from a manifest: what is reserved up front
    // is bounded, and the buffer grows only as the file's bytes arrive.
    let expected = expected.min(MAX_RESERVE);
    if buf.len() < expected + 1 {
        buf.resize(expected + 1, 0);
    }
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[n..]) {
            Ok(0) => return Ok(n),
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}
