//! Reading a tree: open (manifest checks), list in forward order, map a tap
//! zero-copy, verify integrity by rehashing.

use crate::dtype::{DType, TapElem};
use crate::error::{Error, Result};
use crate::manifest::{self, Entry, Manifest, FORMAT_MAJOR, FORMAT_MAJOR_OLDEST, MANIFEST_FILE};
use crate::tapfile;
use memmap2::Mmap;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A complete tree, its manifest checked. Tensors are read on demand.
#[derive(Debug)]
pub struct TreeReader {
    path: PathBuf,
    manifest: Manifest,
    /// The tree's directories that are links, found on first need.
    linked_dirs: std::sync::OnceLock<HashSet<String>>,
}

/// What [`TreeReader::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub taps: usize,
    pub bytes: u64,
}

impl TreeReader {
    /// Opens the tree at `path`: a missing manifest is an incomplete capture;
    /// an unknown major version, an unsafe entry path, a shape that overflows
    /// or disagrees with its byte count, a duplicate key, or hashes that do not
    /// match the entries are refused. No tensor file is read.
    pub fn open(path: impl AsRef<Path>) -> Result<TreeReader> {
        let path = path.as_ref().to_path_buf();
        let manifest_path = path.join(MANIFEST_FILE);
        let bytes = read_manifest(&path, None)?;
        let (manifest, counts) = parse_manifest(&manifest_path, &bytes)?;
        check_entries(&path, &manifest_path, &manifest)?;
        let actual = (manifest.entries.len() as u64, manifest.bytes_of_entries());
        if let (Some(taps), Some(bytes)) = counts {
            if (taps, bytes) != actual {
                return Err(Error::BadManifest {
                    path: manifest_path,
                    reason: format!(
                        "its head says {taps} taps of {bytes} bytes, its entries are {} of {}",
                        actual.0, actual.1
                    ),
                });
            }
        }
        Ok(TreeReader {
            path,
            manifest,
            linked_dirs: Default::default(),
        })
    }

    /// Reads the head of a tree's manifest (version, root, counts) and
    /// checks the manifest whole against its own `manifest_blake3`: what
    /// `verify A B` needs to call two trees identical without parsing their
    /// entries. A damaged manifest (truncated, a flipped byte anywhere) is
    /// refused; the entries are not checked against the root here
    /// ([`TreeReader::open`] does). A format 1 manifest, which has no hash
    /// of its own, is opened whole.
    pub fn head(path: impl AsRef<Path>) -> Result<ManifestHead> {
        let path = path.as_ref();
        let manifest_path = path.join(MANIFEST_FILE);
        let prefix = read_manifest(path, Some(HEAD_PREFIX))?;
        if let HeadFields {
            format: Some(format),
            version: Some(version),
            root: Some(root),
            taps: Some(taps),
            bytes: Some(bytes),
        } = scan_head(&prefix)
        {
            if format == "taptree" {
                check_version(&manifest_path, &version)?;
                if manifest::parse_version(&version).is_some_and(|(major, _)| major >= 2) {
                    let whole = read_manifest(path, None)?;
                    manifest::check_seal(&whole).map_err(|reason| Error::BadManifest {
                        path: manifest_path.clone(),
                        reason,
                    })?;
                    return Ok(ManifestHead {
                        format_version: version,
                        root,
                        taps,
                        bytes,
                    });
                }
            }
        }
        // Format 1, another writer's field order, or no counts: read it all.
        let tree = TreeReader::open(path)?;
        let m = tree.manifest;
        Ok(ManifestHead {
            taps: m.entries.len() as u64,
            bytes: m.bytes_of_entries(),
            format_version: m.format_version,
            root: m.root,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Taps in capture order, which is forward order.
    pub fn entries(&self) -> &[Entry] {
        &self.manifest.entries
    }

    pub fn root(&self) -> &str {
        &self.manifest.root
    }

    /// The absolute-or-relative file system path of an entry's file.
    pub fn file_path(&self, entry: &Entry) -> PathBuf {
        self.path.join(&entry.path)
    }

    /// Maps a tap's file and checks its header against the manifest. The
    /// tensor bytes are not hashed here (see [`TreeReader::verify_entry`]).
    pub fn read(&self, entry: &Entry) -> Result<TensorView> {
        let path = self.checked_file(entry)?;
        let file = open_regular(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the map is read-only; a tree is immutable once its manifest
        // exists, and a file changed underneath is caught by `verify`.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let header = self.check_header(&path, &map, entry)?;
        Ok(TensorView {
            map,
            start: header.data_start,
            len: header.data_len,
            dtype: header.dtype,
            shape: header.shape,
        })
    }

    /// Reads one tap file fully and checks header and tensor hash.
    pub fn verify_entry(&self, entry: &Entry) -> Result<()> {
        let mut buf = Vec::new();
        self.verify_into(entry, &mut buf)
    }

    fn verify_into(&self, entry: &Entry, buf: &mut Vec<u8>) -> Result<()> {
        let data = self.read_into(entry, buf)?;
        let actual = blake3::hash(&buf[data]).to_hex();
        if actual.as_str() != entry.blake3 {
            return Err(Error::HashMismatch {
                path: self.file_path(entry),
                expected: entry.blake3.clone(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }

    /// Reads an entry's tap file whole into `buf` (reused from call to
    /// call: it is zero-filled only when it grows) and checks its header
    /// against the manifest; returns where the tensor bytes lie in `buf`.
    /// The checks are [`TreeReader::read`]'s, at the cost of one `open` that
    /// refuses a link for a file in a directory that is no link (what
    /// `diff -rq` pays too); a link takes the careful path.
    pub fn read_into(&self, entry: &Entry, buf: &mut Vec<u8>) -> Result<std::ops::Range<usize>> {
        let dir = entry.path.split('/').next().unwrap_or("");
        let fast = if self.linked_dirs().contains(dir) {
            None
        } else {
            let path = self.path.join(&entry.path);
            open_no_follow(&path).ok().map(|f| (path, f))
        };
        let (path, mut file) = match fast {
            Some(opened) => opened,
            // A link (or anything odd): the careful path decides.
            None => {
                let path = self.checked_file(entry)?;
                let file = open_regular(&path).map_err(|e| Error::io(&path, e))?;
                (path, file)
            }
        };
        let len = read_all(&mut file, buf, (entry.bytes as usize).saturating_add(4096))
            .map_err(|e| Error::io(&path, e))?;
        let header = self.check_header(&path, &buf[..len], entry)?;
        Ok(header.data_start..len)
    }

    /// The first components of the entries' paths that are links, each
    /// checked once.
    fn linked_dirs(&self) -> &HashSet<String> {
        self.linked_dirs.get_or_init(|| {
            let dirs: HashSet<&str> = self
                .entries()
                .iter()
                .map(|e| e.path.split('/').next().unwrap_or(""))
                .collect();
            dirs.into_iter()
                .filter(|d| is_link(&self.path.join(d)))
                .map(str::to_string)
                .collect()
        })
    }

    /// Files and directories inside the tree that its manifest does not
    /// list (`/`-separated, relative to the tree, sorted): not part of the
    /// tree, never read by taptree, but worth a word (a stray copy, another
    /// capture's leftovers). The manifest and the marker are the tree's own.
    pub fn unlisted(&self) -> Result<Vec<String>> {
        let listed: HashSet<&str> = self.entries().iter().map(|e| e.path.as_str()).collect();
        let dirs: HashSet<&str> = listed
            .iter()
            .filter_map(|p| p.split_once('/').map(|(d, _)| d))
            .collect();
        let names = |dir: &Path| -> Result<Vec<String>> {
            let listing = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
            let mut out = Vec::new();
            for item in listing {
                let item = item.map_err(|e| Error::io(dir, e))?;
                out.push(item.file_name().to_string_lossy().into_owned());
            }
            Ok(out)
        };
        let mut out = Vec::new();
        for name in names(&self.path)? {
            let path = self.path.join(&name);
            if name == MANIFEST_FILE || name == manifest::MARKER_FILE {
                continue;
            }
            if dirs.contains(name.as_str()) && path.is_dir() {
                for inner in names(&path)? {
                    let rel = format!("{name}/{inner}");
                    if !listed.contains(rel.as_str()) {
                        out.push(rel);
                    }
                }
            } else {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Rehashes every tap (in parallel) and returns the first failure in
    /// forward order, or what was checked.
    pub fn verify(&self) -> Result<Verified> {
        let entries = self.entries();
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 8);
        let next = AtomicUsize::new(0);
        let mut failures: Vec<(usize, Error)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut buf = Vec::new();
                        let mut failures = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(entry) = entries.get(i) else { break };
                            if let Err(e) = self.verify_into(entry, &mut buf) {
                                failures.push((i, e));
                            }
                        }
                        failures
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a verify worker panicked"))
                .collect()
        });
        failures.sort_by_key(|(i, _)| *i);
        match failures.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(Verified {
                taps: entries.len(),
                bytes: self.manifest.bytes_of_entries(),
            }),
        }
    }

    /// The entry's file path, refusing a file or directory that is a link
    /// pointing outside the tree.
    fn checked_file(&self, entry: &Entry) -> Result<PathBuf> {
        let path = self.path.join(&entry.path);
        let dir = path.parent().unwrap_or(&self.path);
        if is_link(dir) || is_link(&path) {
            let root = self
                .path
                .canonicalize()
                .map_err(|e| Error::io(&self.path, e))?;
            let target = path.canonicalize().map_err(|e| Error::io(&path, e))?;
            if !target.starts_with(&root) {
                return Err(Error::UnsafePath {
                    tree: self.path.clone(),
                    entry: entry.path.clone(),
                    reason: format!("a symlink to {}, outside the tree", target.display()),
                });
            }
        }
        Ok(path)
    }

    fn check_header(&self, path: &Path, bytes: &[u8], entry: &Entry) -> Result<tapfile::Header> {
        let header = tapfile::parse(bytes).map_err(|reason| Error::CorruptTap {
            path: path.to_path_buf(),
            reason,
        })?;
        let mismatch = |what: String| Error::CorruptTap {
            path: path.to_path_buf(),
            reason: format!("file and manifest disagree: {what}"),
        };
        if header.key != entry.key {
            return Err(mismatch(format!(
                "file holds {}, manifest says {}",
                header.key, entry.key
            )));
        }
        if header.dtype != entry.dtype || header.shape != entry.shape {
            return Err(mismatch(format!(
                "file holds {} {:?}, manifest says {} {:?}",
                header.dtype, header.shape, entry.dtype, entry.shape
            )));
        }
        // The whole header, not only the fields read above: a tree that
        // passes must stay readable by any safetensors reader.
        if let Some(expected) = &entry.header_blake3 {
            let actual = blake3::hash(&bytes[..header.data_start]).to_hex();
            if actual.as_str() != expected {
                return Err(Error::CorruptTap {
                    path: path.to_path_buf(),
                    reason: format!(
                        "integrity failure: header blake3 is {actual}, manifest says {expected}"
                    ),
                });
            }
        }
        Ok(header)
    }
}

fn is_link(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    open_flags(path, libc::O_NOFOLLOW)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    if is_link(path) {
        return Err(std::io::Error::other("a link"));
    }
    open_regular(path)
}

/// Opens a file for reading, refusing anything but a regular file: a FIFO
/// would block the reader forever, a device feed it without end. The open
/// itself does not block (`O_NONBLOCK`, which reads of a regular file
/// ignore).
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
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
fn open_flags(path: &Path, flags: i32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NONBLOCK)
        .open(path)?;
    check_regular(&f)?;
    Ok(f)
}

fn check_regular(f: &std::fs::File) -> std::io::Result<()> {
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
const MAX_RESERVE: usize = 256 << 20;

/// Reads a whole file into `buf` (kept initialised and reused across files,
/// so it is zero-filled only when it grows) and returns its length. No
/// `stat`: the final zero-length read is the end-of-file check.
fn read_all(
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

/// The head of a manifest: see [`TreeReader::head`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestHead {
    pub format_version: String,
    pub root: String,
    pub taps: u64,
    pub bytes: u64,
}

/// How much of a manifest [`TreeReader::head`] reads first: the head fields
/// come first in every manifest this crate writes.
const HEAD_PREFIX: usize = 4096;

#[derive(Default)]
struct HeadFields {
    format: Option<String>,
    version: Option<String>,
    root: Option<String>,
    taps: Option<u64>,
    bytes: Option<u64>,
}

struct HeadVisitor<'a>(&'a mut HeadFields);

impl<'de> serde::de::Visitor<'de> for HeadVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a taptree manifest")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "format" => out.format = Some(map.next_value()?),
                "format_version" => out.version = Some(version_text(map.next_value()?)),
                "root" => out.root = Some(map.next_value()?),
                "taps" => out.taps = Some(map.next_value()?),
                "bytes" => out.bytes = Some(map.next_value()?),
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            let HeadFields {
                format,
                version,
                root,
                taps,
                bytes,
            } = &*out;
            if format.is_some()
                && version.is_some()
                && root.is_some()
                && taps.is_some()
                && bytes.is_some()
            {
                return Err(serde::de::Error::custom("head complete"));
            }
        }
        Ok(())
    }
}

fn version_text(v: serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

/// The manifest's bytes (at most `limit` of them); a missing manifest is an
/// incomplete capture (or, in an empty directory, no tree at all).
fn read_manifest(tree: &Path, limit: Option<usize>) -> Result<ManifestBytes> {
    let path = tree.join(MANIFEST_FILE);
    if !std::fs::metadata(tree)
        .map_err(|e| Error::io(tree, e))?
        .is_dir()
    {
        return Err(Error::BadManifest {
            path: tree.to_path_buf(),
            reason: "not a directory (a tree is a directory holding manifest.json)".into(),
        });
    }
    let read = |path: &Path| -> std::io::Result<ManifestBytes> {
        let file = open_regular(path)?;
        let mut bytes = Vec::new();
        match limit {
            Some(n) => {
                file.take(n as u64).read_to_end(&mut bytes)?;
            }
            None => {
                // Mapped, not read: a copy of a manifest of many megabytes
                // costs as much in fresh zeroed pages as its parse saves.
                // SAFETY: read-only; a manifest is renamed into place whole
                // and never written again.
                if let Ok(map) = unsafe { Mmap::map(&file) } {
                    return Ok(ManifestBytes::Mapped(map));
                }
                (&file).read_to_end(&mut bytes)?;
            }
        };
        Ok(ManifestBytes::Read(bytes))
    };
    check_manifest_link(tree, &path)?;
    match read(&path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let empty = std::fs::read_dir(tree)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            Err(if empty {
                Error::EmptyDir {
                    path: tree.to_path_buf(),
                }
            } else {
                Error::Incomplete {
                    path: tree.to_path_buf(),
                }
            })
        }
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// A manifest that is a link must resolve inside its tree: a tree's
/// description is the tree's own.
fn check_manifest_link(tree: &Path, path: &Path) -> Result<()> {
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

/// A manifest's bytes: a prefix read, or the whole file mapped.
enum ManifestBytes {
    Read(Vec<u8>),
    Mapped(Mmap),
}

impl std::ops::Deref for ManifestBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ManifestBytes::Read(b) => b,
            ManifestBytes::Mapped(m) => m,
        }
    }
}

fn check_version(path: &Path, version: &str) -> Result<()> {
    match manifest::parse_version(version) {
        Some((major, _)) if (FORMAT_MAJOR_OLDEST..=FORMAT_MAJOR).contains(&major) => Ok(()),
        _ => Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version.to_string(),
            oldest: FORMAT_MAJOR_OLDEST,
            supported: FORMAT_MAJOR,
        }),
    }
}

/// The manifest and the head's counts (absent from other writers' manifests).
type Parsed = (Manifest, (Option<u64>, Option<u64>));

fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Parsed> {
    // The version is checked before the rest, so that a future format with a
    // different shape is refused as a version, not as garbage. The head is
    // normally in the first bytes; only another writer's field order costs a
    // second full scan.
    #[derive(serde::Deserialize)]
    struct Probe {
        format: Option<String>,
        format_version: Option<serde_json::Value>,
        taps: Option<u64>,
        bytes: Option<u64>,
    }
    let bad = |reason: String| Error::BadManifest {
        path: path.to_path_buf(),
        reason,
    };
    let mut head = scan_head(&bytes[..bytes.len().min(HEAD_PREFIX)]);
    if head.format.is_none() || head.version.is_none() {
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        head = HeadFields {
            format: probe.format,
            version: probe.format_version.map(version_text),
            root: None,
            taps: probe.taps,
            bytes: probe.bytes,
        };
    }
    if head.format.as_deref() != Some("taptree") {
        return Err(bad(
            "not a taptree manifest (no \"format\": \"taptree\")".into()
        ));
    }
    let version = head
        .version
        .ok_or_else(|| bad("no format_version".into()))?;
    check_version(path, &version)?;
    if manifest::parse_version(&version).is_some_and(|(major, _)| major >= 2) {
        manifest::check_seal(bytes).map_err(bad)?;
    }
    // No entry is written in fewer than 100 bytes: a head that claims more
    // taps than that allows reserves no more than the file could hold.
    let hint = head.taps.unwrap_or(0).min(bytes.len() as u64 / 100) as usize;
    let manifest =
        manifest::with_entries_hint(hint, || serde_json::from_slice(bytes)).map_err(|e| {
            if e.is_data() {
                bad(e.to_string())
            } else {
                bad(format!("not valid JSON: {e}"))
            }
        })?;
    Ok((manifest, (head.taps, head.bytes)))
}

/// The head fields found in `prefix` (a whole manifest or its beginning).
fn scan_head(prefix: &[u8]) -> HeadFields {
    let mut fields = HeadFields::default();
    let mut de = serde_json::Deserializer::from_slice(prefix);
    // The visitor stops the parse as soon as it has the head; the error that
    // stopping (or the end of a prefix) produces is expected.
    let _ = serde::Deserializer::deserialize_map(&mut de, HeadVisitor(&mut fields));
    fields
}

fn check_entries(tree: &Path, manifest_path: &Path, m: &Manifest) -> Result<()> {
    let mut keys = HashSet::with_capacity_and_hasher(m.entries.len(), KeyHasher::default());
    let mut total: u64 = 0;
    let mut rows: u64 = 0;
    for e in &m.entries {
        if let Err(reason) = manifest::check_key_bounds(e.key.layer, &e.key.pos) {
            return Err(Error::BadManifest {
                path: manifest_path.to_path_buf(),
                reason: format!("{}: {reason}", e.key),
            });
        }
        rows += u64::from(e.key.rows());
        if rows > u64::from(manifest::MAX_POSITION) {
            return Err(Error::BadManifest {
                path: manifest_path.to_path_buf(),
                reason: format!(
                    "its taps hold more than the format's {} positions in all",
                    manifest::MAX_POSITION
                ),
            });
        }
        check_entry_path(tree, e)?;
        let bad_shape = |reason: String| Error::BadShape {
            path: manifest_path.to_path_buf(),
            key: e.key.to_string(),
            shape: e.shape.clone(),
            reason,
        };
        let elements = tapfile::element_count(&e.shape).map_err(bad_shape)?;
        let bytes = elements
            .checked_mul(e.dtype.size())
            .ok_or_else(|| bad_shape(format!("byte count of {} elements overflows", elements)))?;
        if bytes as u64 != e.bytes {
            return Err(bad_shape(format!(
                "{elements} elements of {} are {bytes} bytes, entry says {}",
                e.dtype, e.bytes
            )));
        }
        total = total
            .checked_add(e.bytes)
            .ok_or_else(|| Error::BadManifest {
                path: manifest_path.to_path_buf(),
                reason: "the entries' byte counts overflow when summed".into(),
            })?;
        if e.shape.first().map(|&r| r as u64) != Some(u64::from(e.key.rows())) {
            return Err(bad_shape(format!(
                "axis 0 must be the {} positions of {}",
                e.key.rows(),
                e.key
            )));
        }
        if !keys.insert(&e.key) {
            return Err(Error::BadManifest {
                path: manifest_path.to_path_buf(),
                reason: format!("{} appears twice", e.key),
            });
        }
    }
    let (dirs, root) = m.hashes();
    if dirs != m.dirs || root != m.root {
        return Err(Error::BadManifest {
            path: manifest_path.to_path_buf(),
            reason: format!(
                "root {} does not match its entries (they hash to {root}): the manifest was edited or damaged",
                m.root
            ),
        });
    }
    Ok(())
}

/// FNV-1a for the duplicate-key check of [`check_entries`]: keys are short,
/// and SipHash was a good part of opening a tree. Collisions only cost time.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher::default()
    }
}

/// An entry path is `DIR/FILE.safetensors`, relative, with DIR the key's
/// directory: nothing absolute, no `..`, nothing outside its directory.
fn check_entry_path(tree: &Path, e: &Entry) -> Result<()> {
    if is_plain_entry_path(&e.path, &e.key) {
        return Ok(());
    }
    check_entry_path_fully(tree, e)
}

fn check_entry_path_fully(tree: &Path, e: &Entry) -> Result<()> {
    let unsafe_path = |reason: &str| Error::UnsafePath {
        tree: tree.to_path_buf(),
        entry: e.path.clone(),
        reason: reason.to_string(),
    };
    let p = Path::new(&e.path);
    if p.is_absolute() || e.path.starts_with('/') || e.path.contains('\\') {
        return Err(unsafe_path("absolute paths are not allowed"));
    }
    let parts: Vec<Component> = p.components().collect();
    if parts.iter().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(unsafe_path("escapes the tree ('..', '.' or a root)"));
    }
    let expected_dir = manifest::dir_of(&e.key);
    if parts.len() != 2
        || parts[0].as_os_str() != expected_dir.as_str()
        || !e.path.ends_with(".safetensors")
    {
        return Err(unsafe_path(&format!(
            "expected {expected_dir}/<name>.safetensors for {}",
            e.key
        )));
    }
    Ok(())
}

/// Whether `path` is exactly `DIR/NAME.safetensors` with DIR the key's
/// directory and NAME free of separators: what every writer produces, and
/// accepted by [`check_entry_path`] without building components or the
/// directory name. Anything else gets the full check.
fn is_plain_entry_path(path: &str, key: &crate::key::Key) -> bool {
    let Some((dir, name)) = path.split_once('/') else {
        return false;
    };
    let dir_ok = match key.layer {
        None => dir == manifest::GLOBAL_DIR,
        // `L{layer:03}`: at least three digits, no more than the number needs.
        Some(layer) => dir.strip_prefix('L').is_some_and(|digits| {
            let len = layer.checked_ilog10().unwrap_or(0) as usize + 1;
            digits.len() == len.max(3)
                && digits.bytes().all(|c| c.is_ascii_digit())
                && digits.parse::<u32>().ok() == Some(layer)
        }),
    };
    dir_ok
        && name.len() > ".safetensors".len()
        && name.ends_with(".safetensors")
        && !name.contains(['/', '\\'])
}

/// A tap's tensor, mapped from its file: no copy until asked for one.
pub struct TensorView {
    map: Mmap,
    start: usize,
    len: usize,
    dtype: DType,
    shape: Vec<usize>,
}

impl TensorView {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The raw little-endian tensor bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// The elements as `T`, if `T` is the tap's dtype (data is 8-aligned in
    /// the file, so this never copies).
    pub fn as_slice<T: TapElem>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes()).ok()
    }

    /// Every element converted to f64, row-major.
    pub fn to_f64(&self) -> Vec<f64> {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
            DType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::I8 => b.iter().map(|&v| v as i8 as f64).collect(),
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4")) as f64)
                .collect(),
        }
    }
}

impl std::fmt::Debug for TensorView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    #[test]
    fn plain_paths_are_a_subset_of_safe_ones() {
        let keys = [
            Key::new("ffn_down", Some(3), 0..7),
            Key::new("x", Some(0), 0..1),
            Key::new("x", Some(999), 0..1),
            Key::new("x", Some(1000), 0..1),
            Key::new("x", Some(12345), 0..1),
            Key::new("logits", None, 5..6),
        ];
        let paths = [
            "L003/ffn_down.p0-7.safetensors",
            "L000/x.safetensors",
            "L999/x.safetensors",
            "L1000/x.safetensors",
            "L12345/x.safetensors",
            "global/logits.p5-6.safetensors",
            "L3/x.safetensors",
            "L0003/x.safetensors",
            "L01000/x.safetensors",
            "L+03/x.safetensors",
            "l003/x.safetensors",
            "L003//x.safetensors",
            "L003/./x.safetensors",
            "L003/../L003/x.safetensors",
            "L003/a/x.safetensors",
            "L003/a\\x.safetensors",
            "/L003/x.safetensors",
            "L003/.safetensors",
            "L003/x.safetensor",
            "global/x.safetensors",
            "global",
            "",
        ];
        let tree = Path::new("t");
        let mut plain = 0;
        for key in &keys {
            let written = manifest::path_of(key);
            for path in paths.into_iter().chain([written.as_str()]) {
                let e = Entry {
                    key: key.clone(),
                    path: path.to_string(),
                    dtype: DType::F32,
                    shape: vec![1],
                    blake3: String::new(),
                    bytes: 4,
                    header_blake3: None,
                };
                let full = check_entry_path_fully(tree, &e).is_ok();
                if is_plain_entry_path(path, key) {
                    plain += 1;
                    assert!(full, "{path} for {key} taken as plain but unsafe");
                }
                if path == written {
                    assert!(is_plain_entry_path(path, key), "{path} for {key}");
                }
            }
        }
        assert!(plain >= keys.len());
    }
}
