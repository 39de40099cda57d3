//! Reading a tree's `manifest.json` and checking it before anything trusts
//! it: its head for `verify A B`, its seal, its version, its entries' keys
//! and paths.

use crate::error::{Error, Result};
use crate::key_hash::KeyHasher;
use crate::manifest::{self, Entry, Manifest, FORMAT_MAJOR, FORMAT_MAJOR_OLDEST, MANIFEST_FILE};
use crate::open::*;
use crate::tapfile;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Component, Path};

/// The head of a manifest: see [`TreeReader::head`](crate::TreeReader::head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestHead {
    /// `major.minor`, as the manifest writes it.
    pub format_version: String,
    /// The root hash, lowercase hex.
    pub root: String,
    /// Number of entries.
    pub taps: u64,
    /// Total tensor bytes of the entries.
    pub bytes: u64,
}

/// How much of a manifest [`TreeReader::head`] reads first: the head fields
/// come first in every manifest this crate writes.
pub(crate) const HEAD_PREFIX: usize = 4096;

#[derive(Default)]
pub(crate) struct HeadFields {
    pub(crate) format: Option<String>,
    pub(crate) version: Option<String>,
    pub(crate) root: Option<String>,
    pub(crate) taps: Option<u64>,
    pub(crate) bytes: Option<u64>,
}

pub(crate) struct HeadVisitor<'a>(&'a mut HeadFields);

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

pub(crate) fn version_text(v: serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

/// The manifest's bytes (at most `limit` of them); a missing manifest is an
/// incomplete capture (or, in an empty directory, no tree at all).
pub(crate) fn read_manifest(tree: &Path, limit: Option<usize>) -> Result<FileBytes> {
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
    let read = |path: &Path| -> std::io::Result<FileBytes> {
        let file = open_regular(path)?;
        match limit {
            Some(n) => {
                let mut bytes = Vec::new();
                file.take(n as u64).read_to_end(&mut bytes)?;
                Ok(FileBytes::Read(bytes))
            }
            // Mapped, not read: a copy of a manifest of many megabytes
            // costs as much in fresh zeroed pages as its parse saves.
            None => map_or_read(&file, u64::MAX, false),
        }
    };
    check_link_inside(tree, &path)?;
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

/// Whether this reader reads a tree of format `version`: a major version
/// it knows, and, in the newest major, no newer minor than the one it
/// writes (minors 2.1 and 2.3 changed the index's rules, which an older
/// reader would take for damage).
pub(crate) fn check_version(path: &Path, version: &str) -> Result<()> {
    let newest = manifest::parse_version(manifest::FORMAT_VERSION);
    match manifest::parse_version(version) {
        Some(v) if newest.is_some_and(|n| v.0 == n.0 && v > n) => Err(Error::NewerVersion {
            path: path.to_path_buf(),
            found: version.to_string(),
            newest: manifest::FORMAT_VERSION,
        }),
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

pub(crate) fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Parsed> {
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
    if crate::index::has_index(&version) {
        // Format 2.1: the fields before the entries from the JSON, the
        // entries from the index. The manifest's bytes are checked whole
        // against the index's sealed head (size and XXH3-128), and its
        // `manifest_blake3` must be the one the head records: a blake3 of
        // all 12 MB as well would check the same bytes a second time.
        let tree = path.parent().unwrap_or(Path::new("."));
        let manifest = crate::index::open_manifest(tree, bytes)?;
        return Ok((manifest, (head.taps, head.bytes)));
    }
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
pub(crate) fn scan_head(prefix: &[u8]) -> HeadFields {
    let mut fields = HeadFields::default();
    let mut de = serde_json::Deserializer::from_slice(prefix);
    // The visitor stops the parse as soon as it has the head; the error that
    // stopping (or the end of a prefix) produces is expected.
    let _ = serde::Deserializer::deserialize_map(&mut de, HeadVisitor(&mut fields));
    fields
}

/// Checks every entry and the hashes against the root; returns the
/// entries' total bytes (checked not to overflow).
pub(crate) fn check_entries(tree: &Path, manifest_path: &Path, m: &Manifest) -> Result<u64> {
    // A large manifest is checked on every core first; only one that
    // fails is checked again entry by entry, for the first entry's error.
    let sound = if m.entries.len() < PARALLEL_FROM {
        None
    } else {
        entries_sound(tree, m)
    };
    let bytes = match sound {
        Some(bytes) => bytes,
        None => check_one_by_one(tree, manifest_path, m)?,
    };
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
    Ok(bytes)
}

/// Below this many entries a manifest is checked on one thread.
const PARALLEL_FROM: usize = 2048;

/// The entries' total bytes if every entry passes [`check_one_by_one`]'s
/// checks, found on every core: each entry's own checks ([`check_entry`]),
/// the sums of positions and bytes, and no key twice (on a thread of its
/// own meanwhile).
fn entries_sound(tree: &Path, m: &Manifest) -> Option<u64> {
    use rayon::prelude::*;
    let (sums, unique) = rayon::join(
        || {
            m.entries
                .par_iter()
                .map(|e| {
                    let sound = check_entry(tree, Path::new(""), e).is_ok();
                    sound.then(|| (u64::from(e.key.rows()), u128::from(e.bytes)))
                })
                .try_reduce(|| (0, 0), |a, b| Some((a.0 + b.0, a.1 + b.1)))
        },
        || no_key_twice(&m.entries),
    );
    let (rows, bytes) = sums.filter(|_| unique)?;
    let bytes = u64::try_from(bytes).ok()?;
    (rows <= u64::from(manifest::MAX_POSITION)).then_some(bytes)
}

/// Whether no two entries have one key, found on every core: the keys'
/// hashes sorted, and the keys of each run of equal hashes compared.
fn no_key_twice(entries: &[Entry]) -> bool {
    use rayon::prelude::*;
    use std::hash::BuildHasher;
    let mut hashed: Vec<(u64, usize)> = entries
        .par_iter()
        .enumerate()
        .map(|(i, e)| (KeyHasher::default().hash_one(&e.key), i))
        .collect();
    hashed.par_sort_unstable();
    hashed.chunk_by(|x, y| x.0 == y.0).all(|run| {
        run.iter().enumerate().all(|(n, &(_, i))| {
            run[n + 1..]
                .iter()
                .all(|&(_, j)| entries[i].key != entries[j].key)
        })
    })
}

/// One entry's own checks: its stage's name, its key's bounds and its
/// shard's, its path, its byte count against its shape and dtype, and axis
/// 0 holding its positions.
fn check_entry(tree: &Path, manifest_path: &Path, e: &Entry) -> Result<()> {
    // The writer's rules, which the index's records are held to as well.
    let stage = if manifest::valid_stage_name(&e.key.stage) {
        Ok(())
    } else {
        Err(format!(
            "stage name {:?} is not {}",
            e.key.stage,
            manifest::STAGE_NAME_RULE
        ))
    };
    let bounds = stage
        .and_then(|()| manifest::check_key_bounds(e.key.layer, &e.key.pos))
        .and_then(|()| match e.key.shard {
            Some(s) => manifest::check_shard_bounds(s, e.shape.len()),
            None => Ok(()),
        });
    if let Err(reason) = bounds {
        return Err(Error::BadManifest {
            path: manifest_path.to_path_buf(),
            reason: format!("{}: {reason}", e.key),
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
    if e.shape.first().map(|&r| r as u64) != Some(u64::from(e.key.rows())) {
        return Err(bad_shape(format!(
            "axis 0 must be the {} positions of {}",
            e.key.rows(),
            e.key
        )));
    }
    Ok(())
}

/// Each entry's own checks, the sums of positions and bytes, and no key
/// twice, in entry order: the first problem is the error. Returns the
/// entries' total bytes.
fn check_one_by_one(tree: &Path, manifest_path: &Path, m: &Manifest) -> Result<u64> {
    let mut keys = HashSet::with_capacity_and_hasher(m.entries.len(), KeyHasher::default());
    let mut total: u64 = 0;
    let mut rows: u64 = 0;
    for e in &m.entries {
        check_entry(tree, manifest_path, e)?;
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
        total = total
            .checked_add(e.bytes)
            .ok_or_else(|| Error::BadManifest {
                path: manifest_path.to_path_buf(),
                reason: "the entries' byte counts overflow when summed".into(),
            })?;
        if !keys.insert(&e.key) {
            return Err(Error::BadManifest {
                path: manifest_path.to_path_buf(),
                reason: format!("{} appears twice", e.key),
            });
        }
    }
    Ok(total)
}

/// An entry path is `DIR/FILE.safetensors`, relative, with DIR the key's
/// directory: nothing absolute, no `..`, nothing outside its directory.
pub(crate) fn check_entry_path(tree: &Path, e: &Entry) -> Result<()> {
    if is_plain_entry_path(&e.path, &e.key) {
        return Ok(());
    }
    check_entry_path_fully(tree, e)
}

pub(crate) fn check_entry_path_fully(tree: &Path, e: &Entry) -> Result<()> {
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
    let expected_dir = e.dir();
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
pub(crate) fn is_plain_entry_path(path: &str, key: &crate::key::Key) -> bool {
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
