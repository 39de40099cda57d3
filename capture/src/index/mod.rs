//! The manifest's binary index (`manifest.idx`, format 2.1): the entries in
//! fixed-size records, and a small sealed head that binds the index to the
//! exact bytes of `manifest.json`.
//!
//! Why: a tree of 37,674 taps has a 12 MB manifest. Checking it whole
//! (blake3) and parsing it costs tens of milliseconds, which trusted
//! `verify A B` and `diff` paid on every call. With the index, trusted
//! `verify A B` checks a 288-byte head, the sizes of both files, the
//! manifest's bytes outside its entry list, and a fast checksum (XXH3-128)
//! of every byte of both files; opening a tree hashes
//! the manifest (to refuse any damage) but parses only those few KB and
//! decodes the entries from the records. docs/FORMAT.md ("The index") is the
//! normative description; docs/TRUST.md says what each path checks.

mod head;
mod records;
mod sum;
mod view;

use head::hex;
pub(crate) use head::hex_into;
pub use head::{checksum, chunked_rule, xxh3, xxh3_chunked, IndexHead, CHUNK};
pub use records::{build, decode};
pub use view::Records;
pub(crate) use view::{hashes_hold, open_views, open_views_unsealed};

use crate::error::{Error, Result};
use crate::manifest::{self, Manifest, MANIFEST_FILE};
use crate::open::*;
use std::io::Read;
use std::path::Path;

/// The index's file name at the root of a tree, beside `manifest.json`.
pub const INDEX_FILE: &str = "manifest.idx";
/// The fixed size of the index's head.
pub const HEAD_LEN: usize = 288;
/// The first bytes of every index.
pub const MAGIC: &[u8; 16] = b"taptree index\n\0\0";
/// The fixed size of one entry's record.
pub const RECORD_LEN: usize = 104;
/// Where the head's own blake3 starts: it covers the bytes before it.
const SEAL_AT: usize = HEAD_LEN - 32;
/// A writer's own path (`path_of(key)`), in a record's path field.
const NONE: u32 = u32::MAX;
/// Record flags: the entry has a `header_blake3`, a layer, a slot.
const HAS_HEADER_HASH: u16 = 1;
const HAS_LAYER: u16 = 2;
const HAS_SLOT: u16 = 4;

/// Whether a manifest of this version has an index beside it. A ranked
/// tree (format 2.2, tensor parallel) has none: its records hold no rank
/// or shard, so its entries are read from the JSON.
pub fn has_index(version: &str) -> bool {
    manifest::parse_version(version).is_some_and(|v| v >= (2, 1))
        && version != manifest::FORMAT_VERSION_RANKED
}

fn bad_index(tree: &Path, reason: impl Into<String>) -> Error {
    Error::BadManifest {
        path: tree.join(INDEX_FILE),
        reason: reason.into(),
    }
}

fn bad_manifest(tree: &Path, reason: impl Into<String>) -> Error {
    Error::BadManifest {
        path: tree.join(MANIFEST_FILE),
        reason: reason.into(),
    }
}

/// Opens the index of the tree at `tree`: a regular file inside the tree.
fn open_index(tree: &Path) -> Result<std::fs::File> {
    let path = tree.join(INDEX_FILE);
    check_link_inside(tree, &path)?;
    open_regular(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            bad_index(
                tree,
                "missing: a format 2.1 manifest must have its index beside it",
            )
        } else {
            Error::io(&path, e)
        }
    })
}

/// Trusted `verify A B`'s check of a format 2.1 tree, given the first
/// bytes of its manifest and the head fields found there: the index's head
/// is sealed, both files have the sizes it records, the manifest's bytes
/// outside its entries are the ones it hashed, and every byte of both files
/// has the XXH3-128 checksum it records. Returns the index head.
pub(crate) fn check_trusted(tree: &Path, version: &str, root: &str) -> Result<IndexHead> {
    let index_path = tree.join(INDEX_FILE);
    let mut file = open_index(tree)?;
    let mut buf = [0u8; HEAD_LEN];
    let n = read_up_to(&mut file, &mut buf).map_err(|e| Error::io(&index_path, e))?;
    let head = IndexHead::parse(&buf[..n]).map_err(|r| bad_index(tree, r))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(&index_path, e))?
        .len();
    if Some(len) != head.body_len.checked_add(HEAD_LEN as u64) {
        return Err(bad_index(
            tree,
            format!(
                "{len} bytes, its head says {}: the index was truncated, appended to, edited or damaged",
                head.body_len.saturating_add(HEAD_LEN as u64)
            ),
        ));
    }
    check_version_and_root(tree, &head, version, root)?;
    let json_path = tree.join(MANIFEST_FILE);
    let json = open_regular(&json_path).map_err(|e| Error::io(&json_path, e))?;
    let json_len = json.metadata().map_err(|e| Error::io(&json_path, e))?.len();
    let span = head
        .entries_span(json_len)
        .map_err(|r| bad_manifest(tree, r))?;
    // The files are mapped only once their sizes are the ones recorded.
    // Whole-file checksums (2.1) walk each file on one thread: the kernel
    // maps every page at once. Chunked ones (2.3) fault their pages in on
    // the threads that share them.
    let populate = !chunked_rule(head.major, head.minor);
    let index = map_or_read(&file, len, populate).map_err(|e| Error::io(&index_path, e))?;
    let json = map_or_read(&json, json_len, populate).map_err(|e| Error::io(&json_path, e))?;
    if index.len() as u64 != len || json.len() as u64 != json_len {
        return Err(bad_manifest(tree, "changed size while it was read"));
    }
    check_against_head(tree, &head, Some(&index[HEAD_LEN..]), &json, span)?;
    Ok(head)
}

/// Checks the manifest's bytes `json` (its size already the one `head`
/// records, its entries at `span`) and, where given, the index's `body`
/// against the index's head: the checksum of each (the body's first), then
/// the manifest's bytes outside its entries and the `manifest_blake3` they
/// hold ([`IndexHead::check_json`]).
fn check_against_head(
    tree: &Path,
    head: &IndexHead,
    body: Option<&[u8]>,
    json: &[u8],
    span: std::ops::Range<usize>,
) -> Result<()> {
    let (body_sum, json_sum) = checksums(head, body, json);
    if body_sum.is_some_and(|sum| sum != head.body_xxh3) {
        return Err(bad_index(
            tree,
            "its records do not have the checksum its head records: the index was edited or damaged",
        ));
    }
    if json_sum != head.json_xxh3 {
        return Err(bad_manifest(
            tree,
            "its bytes do not have the checksum its index records: the manifest was edited or damaged",
        ));
    }
    head.check_json(json, &json[span.end..], json.len() as u64)
        .map_err(|r| bad_manifest(tree, r))
}

/// The checksums of `body` (where given) and `json` under the rule of the
/// head's version: a 2.3 tree's over chunks several threads share, a 2.1
/// tree's each whole, the two side by side (the manifest's is three
/// quarters of the work).
fn checksums(head: &IndexHead, body: Option<&[u8]>, json: &[u8]) -> (Option<[u8; 16]>, [u8; 16]) {
    let Some(body) = body else {
        return (None, checksum(head.major, head.minor, json));
    };
    if chunked_rule(head.major, head.minor) {
        let sums = sum::checksums_of(&[body, json]);
        return (Some(sums[0]), sums[1]);
    }
    std::thread::scope(|s| {
        let body = s.spawn(|| xxh3(body));
        let json = xxh3(json);
        let body = body.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (Some(body), json)
    })
}

fn check_version_and_root(tree: &Path, head: &IndexHead, version: &str, root: &str) -> Result<()> {
    if manifest::parse_version(version) != Some((head.major, head.minor)) {
        return Err(bad_index(
            tree,
            format!(
                "format {}.{}, its manifest says {version}",
                head.major, head.minor
            ),
        ));
    }
    if hex(&head.root) != root {
        return Err(bad_index(
            tree,
            format!("root {}, its manifest says {root}", hex(&head.root)),
        ));
    }
    Ok(())
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The manifest of a format 2.1 tree whose manifest's bytes are `json`:
/// the index is read whole and checked against its seal, `json` against
/// the index's head (its size, its XXH3-128, its bytes outside the entries
/// and the `manifest_blake3` they hold), the manifest's fields
/// before its entries are parsed from `json`, and the entries are decoded
/// from the index.
pub(crate) fn open_manifest(tree: &Path, json: &[u8]) -> Result<Manifest> {
    let file = open_index(tree)?;
    // Mapped, not read: a read into fresh zeroed pages (grown by doubling
    // past a guess at its size) cost more than decoding the records. No
    // `stat` here for its length: the map finds it, the read where it
    // cannot map takes the file whole; the head's sizes are checked after.
    let index_path = tree.join(INDEX_FILE);
    let index = map_or_read(&file, u64::MAX, true).map_err(|e| Error::io(&index_path, e))?;
    let (head, mut m) = open_head(tree, &index, json)?;
    m.entries = decode(&index, &head).map_err(|r| bad_index(tree, r))?;
    Ok(m)
}

/// The head of the index whose bytes are `index` and the manifest's fields
/// besides its entries (left empty), `json` (the manifest's bytes) checked
/// against that head (its size, its checksum, its bytes outside the entries
/// and the `manifest_blake3` they hold) and its version and root the
/// head's: what opening a format 2.1 tree checks before its records, owned
/// or read in place.
fn open_head(tree: &Path, index: &[u8], json: &[u8]) -> Result<(IndexHead, Manifest)> {
    let head = IndexHead::parse(index).map_err(|r| bad_index(tree, r))?;
    let span = head
        .entries_span(json.len() as u64)
        .map_err(|r| bad_manifest(tree, r))?;
    check_against_head(tree, &head, None, json, span.clone())?;
    let mut text = json[..span.start].to_vec();
    text.extend_from_slice(b"[]");
    text.extend_from_slice(&json[span.end..]);
    let m: Manifest = serde_json::from_slice(&text)
        .map_err(|e| bad_manifest(tree, format!("its fields before the entries: {e}")))?;
    check_version_and_root(tree, &head, &m.format_version, &m.root)?;
    Ok((head, m))
}

/// Writes `manifest.idx` for the tree at `tree` from its `manifest.json`
/// as it is now (parsed whole; nothing checked against its root): for tools
/// and tests that edit a manifest and seal it again.
pub fn rewrite(tree: &Path) -> Result<()> {
    let json_path = tree.join(MANIFEST_FILE);
    let json = std::fs::read(&json_path).map_err(|e| Error::io(&json_path, e))?;
    let m: Manifest = serde_json::from_slice(&json).map_err(|e| Error::BadManifest {
        path: json_path.clone(),
        reason: e.to_string(),
    })?;
    let index = build(&json, &m).map_err(|reason| Error::BadManifest {
        path: json_path,
        reason,
    })?;
    // Into place by a rename, as a capture writes it: a reader that has
    // the old one open keeps reading the old one.
    let path = tree.join(INDEX_FILE);
    let new = tree.join(format!(".{INDEX_FILE}.new"));
    std::fs::write(&new, index).map_err(|e| Error::io(&new, e))?;
    std::fs::rename(&new, &path).map_err(|e| Error::io(&path, e))
}

/// Edits the manifest of the tree at `tree` as `edit` says, then redoes
/// every hash a writer makes (the directory hashes and root from the
/// entries, the seal) and the index: what a hostile writer can do, for
/// tests and tools that check that only the entries' own checks can refuse
/// such an edit.
pub fn reseal_edited(tree: &Path, edit: impl FnOnce(&mut Manifest)) -> Result<()> {
    let path = tree.join(MANIFEST_FILE);
    let json = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let bad = |reason: String| Error::BadManifest {
        path: path.clone(),
        reason,
    };
    let mut m: Manifest = serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?;
    edit(&mut m);
    let (dirs, root) = m.hashes();
    m.dirs = dirs;
    m.root = root;
    m.manifest_blake3 = Some(manifest::UNSEALED.to_string());
    let mut bytes = serde_json::to_vec(&m).map_err(|e| bad(e.to_string()))?;
    if !manifest::seal(&mut bytes) {
        return Err(bad("no manifest_blake3 to seal".into()));
    }
    std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
    rewrite(tree)
}

/// Redoes an index's body hash and head seal after an edit of its bytes
/// (for tests and the fuzz harness, so that what is tested is the edit).
/// An index shorter than its head is left alone.
pub fn reseal(index: &mut [u8]) {
    if index.len() < HEAD_LEN {
        return;
    }
    let body = *blake3::hash(&index[HEAD_LEN..]).as_bytes();
    index[176..208].copy_from_slice(&body);
    let major = head::u32_at(index, 16);
    let minor = head::u32_at(index, 20);
    let body = checksum(major, minor, &index[HEAD_LEN..]);
    index[232..248].copy_from_slice(&body);
    let seal = *blake3::hash(&index[..SEAL_AT]).as_bytes();
    index[SEAL_AT..HEAD_LEN].copy_from_slice(&seal);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_fallback_reads_from_the_start_after_the_head_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        let mut head = [0u8; 100];
        assert_eq!(read_up_to(&mut file, &mut head).unwrap(), 100);
        assert_eq!(read_from_start(&file, 1000).unwrap(), bytes);
        assert_eq!(read_from_start(&file, 10).unwrap(), bytes[..10]);
    }
}
