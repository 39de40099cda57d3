//! Reading a tree: open (manifest checks), list in forward order, map a tap
//! zero-copy, verify integrity by rehashing.

use crate::entries::Entries;
use crate::error::{Error, Result};
use crate::index::Records;
use crate::manifest::{self, Entry, Manifest, MANIFEST_FILE};
use crate::manifest_file::*;
use crate::open::*;
use crate::tapfile;
use crate::tensor_view::TensorView;
use memmap2::Mmap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A complete tree, its manifest checked. Tensors are read on demand.
#[derive(Debug)]
pub struct TreeReader {
    path: PathBuf,
    /// The manifest; its entries are empty where `views` holds them.
    manifest: Manifest,
    /// The index's records, where the tree was opened from them: the
    /// owned entries are built on first need, into `full`.
    views: Option<Records>,
    full: std::sync::OnceLock<Manifest>,
    /// The tree's directories that are links, found on first need.
    linked_dirs: std::sync::OnceLock<HashSet<String>>,
}

/// What [`TreeReader::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Taps rehashed.
    pub taps: usize,
    /// Their tensor bytes.
    pub bytes: u64,
}

impl TreeReader {
    /// Opens the tree at `path`: a missing manifest is an incomplete capture;
    /// an unknown major version, an unsafe entry path, a shape that overflows
    /// or disagrees with its byte count, a duplicate key, or hashes that do not
    /// match the entries are refused. No tensor file is read.
    ///
    /// A tree with an index is opened from its records where they prove
    /// sound (every check above, made on the records in place); anything
    /// in doubt is opened as [`TreeReader::open_owned`] does, with its error.
    pub fn open(path: impl AsRef<Path>) -> Result<TreeReader> {
        let path = path.as_ref().to_path_buf();
        let bytes = read_manifest(&path, None)?;
        if let Some((manifest, records)) = open_by_views(&path, &bytes, crate::index::open_views) {
            return Ok(TreeReader::of_records(path, manifest, records));
        }
        TreeReader::open_from(path, &bytes)
    }

    pub(crate) fn of_records(path: PathBuf, manifest: Manifest, records: Records) -> TreeReader {
        TreeReader {
            path,
            manifest,
            views: Some(records),
            full: Default::default(),
            linked_dirs: Default::default(),
        }
    }

    /// Whether the directory hashes and root recomputed from the records
    /// the tree was opened from are the manifest's (true for a tree not
    /// opened from its records: its entries' checks made them).
    pub(crate) fn records_hold(&self) -> bool {
        match &self.views {
            Some(records) => crate::index::hashes_hold(records, &self.manifest),
            None => true,
        }
    }

    /// Opens the trees at `paths` at once, each as [`TreeReader::open`]
    /// does, and returns each one's outcome in the order of `paths`.
    ///
    /// The trees are opened on the thread pool, not each on a thread of
    /// its own: the steps of opening one (reading its index by parts,
    /// checking its records, hashing its directories) are themselves shared
    /// by every core, and started from a thread of the pool they are handed
    /// to the other threads directly rather than through the pool's queue,
    /// with a wait for each, as from a thread outside it.
    pub fn open_all(paths: &[&Path]) -> Vec<Result<TreeReader>> {
        open_each(paths, |p| TreeReader::open(p))
    }

    /// Opens the tree at `path` as [`TreeReader::open`] does, every entry
    /// decoded into an owned one and checked there: what `open` falls back
    /// to, and what its view of the records is tested against.
    pub fn open_owned(path: impl AsRef<Path>) -> Result<TreeReader> {
        let path = path.as_ref().to_path_buf();
        let bytes = read_manifest(&path, None)?;
        TreeReader::open_from(path, &bytes)
    }

    pub(crate) fn open_from(path: PathBuf, bytes: &[u8]) -> Result<TreeReader> {
        let manifest_path = path.join(MANIFEST_FILE);
        let (manifest, counts) = parse_manifest(&manifest_path, bytes)?;
        let bytes_of_entries = check_entries(&path, &manifest_path, &manifest)?;
        let actual = (manifest.entries.len() as u64, bytes_of_entries);
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
            views: None,
            full: Default::default(),
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
                if crate::index::has_index(&version) {
                    // Format 2.1: the index's sealed head, both files'
                    // sizes, and the manifest's bytes before its entries.
                    let index = crate::index::check_trusted(path, &version, &root)?;
                    if (index.taps, index.bytes) != (taps, bytes) {
                        return Err(Error::BadManifest {
                            path: manifest_path,
                            reason: format!(
                                "its head says {taps} taps of {bytes} bytes, its index {} of {}",
                                index.taps, index.bytes
                            ),
                        });
                    }
                    return Ok(ManifestHead {
                        format_version: version,
                        root,
                        taps,
                        bytes,
                    });
                }
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
        let entries = tree.listing();
        Ok(ManifestHead {
            taps: entries.len() as u64,
            bytes: entries.total_bytes(),
            format_version: tree.manifest.format_version,
            root: tree.manifest.root,
        })
    }

    /// The tree's directory, as it was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The manifest, parsed and checked (a tree opened from its index's
    /// records builds its owned entries here, once).
    pub fn manifest(&self) -> &Manifest {
        match &self.views {
            None => &self.manifest,
            Some(records) => self.full.get_or_init(|| {
                let mut m = self.manifest.clone();
                m.entries = records.entries();
                m
            }),
        }
    }

    /// The manifest's fields besides its entries, which may be left empty
    /// here (read them through [`TreeReader::listing`]): what a reader that
    /// does not list the taps needs, without building their entries.
    pub fn head_fields(&self) -> &Manifest {
        &self.manifest
    }

    /// The taps, field by field: straight from the index's records where
    /// the tree was opened from them, else the owned entries.
    pub fn listing(&self) -> Entries<'_> {
        match &self.views {
            Some(records) => Entries::Records(records),
            None => Entries::Owned(&self.manifest.entries),
        }
    }

    /// Taps in capture order, which is forward order.
    pub fn entries(&self) -> &[Entry] {
        &self.manifest().entries
    }

    /// The root hash, lowercase hex.
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
            let dirs: HashSet<String> = match self.listing() {
                Entries::Owned(entries) => (entries.iter())
                    .map(|e| e.path.split('/').next().unwrap_or("").to_string())
                    .collect(),
                // Records opened as views name their writer's own paths:
                // the directory is the layer's.
                Entries::Records(r) => (0..r.len())
                    .map(|i| r.layer(i))
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .map(manifest::dir_of_layer)
                    .collect(),
            };
            dirs.into_iter()
                .filter(|d| is_link(&self.path.join(d)))
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
            if name == MANIFEST_FILE
                || name == manifest::MARKER_FILE
                || (name == crate::index::INDEX_FILE
                    && crate::index::has_index(&self.manifest.format_version))
            {
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
        self.check_json_entries()?;
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
                bytes: self.listing().total_bytes(),
            }),
        }
    }

    /// A format 2.1 tree is opened from its index: the manifest is parsed
    /// whole here and must say exactly what the index says, so that a
    /// reader of the JSON alone sees the same tree.
    fn check_json_entries(&self) -> Result<()> {
        if !crate::index::has_index(&self.manifest.format_version) {
            return Ok(());
        }
        let path = self.path.join(MANIFEST_FILE);
        let bytes = read_manifest(&self.path, None)?;
        let json: Manifest =
            manifest::with_entries_hint(self.listing().len(), || serde_json::from_slice(&bytes))
                .map_err(|e| Error::BadManifest {
                    path: path.clone(),
                    reason: format!("not valid JSON: {e}"),
                })?;
        if json != *self.manifest() {
            let first = json
                .entries
                .iter()
                .zip(&self.manifest().entries)
                .position(|(a, b)| a != b)
                .map_or_else(
                    || "its fields or entry count".to_string(),
                    |i| format!("entry {i} ({})", json.entries[i].key),
                );
            return Err(Error::BadManifest {
                path,
                reason: format!("it and its index disagree at {first}"),
            });
        }
        Ok(())
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

/// `open` of each of `paths` at once on the thread pool, each outcome in
/// the order of `paths`.
pub(crate) fn open_each<T: Send>(paths: &[&Path], open: fn(&Path) -> Result<T>) -> Vec<Result<T>> {
    use rayon::prelude::*;
    let mut out = Vec::new();
    // One tree per part: `with_max_len(1)` keeps the pool from opening
    // two of them one after the other on one thread.
    paths
        .par_iter()
        .with_max_len(1)
        .map(|p| open(p))
        .collect_into_vec(&mut out);
    out
}

/// The tree at `tree` opened from its index's records, where its
/// manifest's bytes `bytes` are a taptree manifest of a version with an
/// index and the records prove sound by `open_views`
/// ([`crate::index::open_views`], or its unsealed form, which leaves the
/// root to check); `None` where the owned path must decide.
pub(crate) fn open_by_views(
    tree: &Path,
    bytes: &[u8],
    open_views: impl FnOnce(&Path, &[u8], (Option<u64>, Option<u64>)) -> Option<(Manifest, Records)>,
) -> Option<(Manifest, Records)> {
    let head = scan_head(&bytes[..bytes.len().min(HEAD_PREFIX)]);
    let version = head.version.as_deref()?;
    if head.format.as_deref() != Some("taptree")
        || check_version(&tree.join(MANIFEST_FILE), version).is_err()
        || !crate::index::has_index(version)
    {
        return None;
    }
    open_views(tree, bytes, (head.taps, head.bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
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
