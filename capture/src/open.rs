//! Opening a tree's files without being fooled: no link followed (or, for
//! the manifest and index, none leading out of the tree), no FIFO, device
//! or socket read, no read sized past what the file holds; and a file's
//! bytes mapped, or read where it cannot be mapped.

use crate::error::{Error, Result};
use memmap2::Mmap;
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

/// A tree's manifest or index that is a link must resolve inside the
/// tree: a tree's description is the tree's own.
pub(crate) fn check_link_inside(tree: &Path, path: &Path) -> Result<()> {
    if !is_link(path) {
        return Ok(());
    }
    let root = tree.canonicalize().map_err(|e| Error::io(tree, e))?;
    let target = path.canonicalize().map_err(|e| Error::io(path, e))?;
    if target.starts_with(&root) {
        return Ok(());
    }
    Err(Error::BadManifest {
        path: path.to_path_buf(),
        reason: format!("a symlink to {}, outside the tree", target.display()),
    })
}

/// A file's bytes (a manifest's, an index's): read, or the whole file mapped.
pub(crate) enum FileBytes {
    Read(Vec<u8>),
    Mapped(Mmap),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Read(b) => b,
            FileBytes::Mapped(m) => m,
        }
    }
}

/// A regular file's bytes, mapped whole (a copy of many megabytes costs
/// more than the checksum or parse over them), or, where mapping fails (a
/// filesystem without mmap), its first `len` bytes read (`u64::MAX`: all
/// of them; a file that shrank gives fewer, which the callers' size checks
/// refuse). `populate`: the kernel maps every page at
/// once rather than one fault at a time as one checksum walks them; not
/// where several threads share the checksum (they fault their pages in
/// side by side).
pub(crate) fn map_or_read(
    file: &std::fs::File,
    len: u64,
    populate: bool,
) -> std::io::Result<FileBytes> {
    let mut options = memmap2::MmapOptions::new();
    if populate {
        options.populate();
    }
    // SAFETY: read-only; a tree's manifest and index are renamed into
    // place whole and never written again.
    if let Ok(map) = unsafe { options.map(file) } {
        return Ok(FileBytes::Mapped(map));
    }
    read_from_start(file, len).map(FileBytes::Read)
}

/// `len` bytes of `file` from its start (at most: a file that shrank
/// gives fewer, which the callers' size checks refuse).
pub(crate) fn read_from_start(mut file: &std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The whole of `file`, which must be `len` bytes long, read by several
/// threads at once: a part of the file per task, each read at its offset
/// into its own part of one buffer. The buffer's pages are fresh from the
/// kernel (a zeroed allocation this large is mapped, not written), so the
/// page faults of filling them, most of the cost of copying a file of a few
/// MB, are shared by the threads rather than taken one after the other.
/// Nothing is allocated for a file of another size (an error); a file that
/// changes while it is read gives an error or other bytes, which the
/// callers' checks refuse.
#[cfg(unix)]
pub(crate) fn read_whole_on_every_core(file: &std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    /// What one task reads: small enough to share a few MB, large enough
    /// that each `pread` is worth its call.
    const PART: usize = 128 << 10;
    if file.metadata()?.len() != len {
        return Err(std::io::Error::other("not the size expected"));
    }
    let len = usize::try_from(len).map_err(|_| std::io::Error::other("larger than memory"))?;
    let mut bytes = vec![0u8; len];
    bytes
        .par_chunks_mut(PART)
        .enumerate()
        .try_for_each(|(i, part)| file.read_exact_at(part, (i * PART) as u64))?;
    Ok(bytes)
}

/// The whole of `file`, which must be `len` bytes long (no threads where
/// there is no `pread`).
#[cfg(not(unix))]
pub(crate) fn read_whole_on_every_core(file: &std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    if file.metadata()?.len() != len {
        return Err(std::io::Error::other("not the size expected"));
    }
    read_from_start(file, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file read by parts on every core is its bytes, at sizes around
    /// the part's; a file of another size than the one expected is an
    /// error, one byte more or less.
    #[test]
    fn a_file_read_by_parts_is_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let part = 128 << 10;
        for len in [0, 1, 4096, part - 1, part, part + 1, 3 << 20] {
            let bytes: Vec<u8> = (0..len as u32).map(|i| (i * 7 + i / 251) as u8).collect();
            std::fs::write(&path, &bytes).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            let n = len as u64;
            assert_eq!(read_whole_on_every_core(&file, n).unwrap(), bytes, "{len}");
            assert!(read_whole_on_every_core(&file, n + 1).is_err(), "{len}");
            if n > 0 {
                assert!(read_whole_on_every_core(&file, n - 1).is_err(), "{len}");
            }
        }
    }

    /// procfs files cannot be mapped: the bytes are read instead.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_file_that_cannot_be_mapped_is_read() {
        let file = std::fs::File::open("/proc/self/maps").unwrap();
        // SAFETY: read-only, and expected to fail.
        assert!(unsafe { memmap2::Mmap::map(&file) }.is_err());
        for populate in [false, true] {
            match map_or_read(&file, 1 << 20, populate).unwrap() {
                FileBytes::Read(b) => assert!(!b.is_empty()),
                FileBytes::Mapped(_) => panic!("a procfs file was mapped"),
            }
        }
    }
}
