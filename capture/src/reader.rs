//! Reading a tree: open (manifest checks), list in forward order, map a tap
//! zero-copy, verify integrity by rehashing.

use crate::dtype::{DType, TapElem};
use crate::error::{Error, Result};
use crate::manifest::{self, Entry, Manifest, FORMAT_MAJOR, MANIFEST_FILE};
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
        let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
        if !meta.is_dir() {
            return Err(Error::BadManifest {
                path,
                reason: "not a directory (a tree is a directory holding manifest.json)".into(),
            });
        }
        let manifest_path = path.join(MANIFEST_FILE);
        let bytes = match std::fs::read(&manifest_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let empty = std::fs::read_dir(&path)
                    .map(|mut d| d.next().is_none())
                    .unwrap_or(false);
                return Err(if empty {
                    Error::EmptyDir { path }
                } else {
                    Error::Incomplete { path }
                });
            }
            Err(e) => return Err(Error::io(&manifest_path, e)),
        };
        let manifest = parse_manifest(&manifest_path, &bytes)?;
        check_entries(&path, &manifest_path, &manifest)?;
        Ok(TreeReader { path, manifest })
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
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
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
        let path = self.checked_file(entry)?;
        buf.clear();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_end(buf))
            .map_err(|e| Error::io(&path, e))?;
        let header = self.check_header(&path, buf, entry)?;
        let actual = blake3::hash(&buf[header.data_start..]).to_hex();
        if actual.as_str() != entry.blake3 {
            return Err(Error::HashMismatch {
                path,
                expected: entry.blake3.clone(),
                actual: actual.to_string(),
            });
        }
        Ok(())
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
                bytes: self.manifest.bytes(),
            }),
        }
    }

    /// The entry's file path, refusing a file or directory that is a link
    /// pointing outside the tree.
    fn checked_file(&self, entry: &Entry) -> Result<PathBuf> {
        let path = self.path.join(&entry.path);
        let dir = path.parent().unwrap_or(&self.path);
        let linked = |p: &Path| {
            std::fs::symlink_metadata(p)
                .map(|m| m.file_type().is_symlink())
                .unwrap_or(false)
        };
        if linked(dir) || linked(&path) {
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
        Ok(header)
    }
}

fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    // The version is checked before the rest, so that a future format with a
    // different shape is refused as a version, not as garbage.
    #[derive(serde::Deserialize)]
    struct Probe {
        format: Option<String>,
        format_version: Option<serde_json::Value>,
    }
    let bad = |reason: String| Error::BadManifest {
        path: path.to_path_buf(),
        reason,
    };
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if probe.format.as_deref() != Some("taptree") {
        return Err(bad(
            "not a taptree manifest (no \"format\": \"taptree\")".into()
        ));
    }
    let version = match probe.format_version {
        Some(serde_json::Value::String(v)) => v,
        Some(other) => other.to_string(),
        None => return Err(bad("no format_version".into())),
    };
    match manifest::parse_version(&version) {
        Some((major, _)) if major == FORMAT_MAJOR => {}
        _ => {
            return Err(Error::UnsupportedVersion {
                path: path.to_path_buf(),
                found: version,
                supported: FORMAT_MAJOR,
            })
        }
    }
    serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))
}

fn check_entries(tree: &Path, manifest_path: &Path, m: &Manifest) -> Result<()> {
    let mut keys = HashSet::with_capacity(m.entries.len());
    for e in &m.entries {
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
    let (dirs, root) = manifest::tree_hashes(&m.entries);
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

/// An entry path is `DIR/FILE.safetensors`, relative, with DIR the key's
/// directory: nothing absolute, no `..`, nothing outside its directory.
fn check_entry_path(tree: &Path, e: &Entry) -> Result<()> {
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
