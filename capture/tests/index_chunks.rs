//! The index's checksums over 1 MiB chunks (format 2.3), on a tree whose
//! manifest and index body both span several chunks: every chunk, each
//! chunk boundary and the chunks' order are checked by the trusted path;
//! a format 2.1 tree keeps its whole-file checksums and is still verified.

use capture::index::{self, IndexHead, CHUNK, HEAD_LEN, INDEX_FILE};
use capture::{StageSpec, TreeReader};
use std::path::{Path, PathBuf};

mod tree_support;
use tree_support::many_taps;

/// Taps enough for a manifest over 3 MiB and an index body over 1 MiB.
const TAPS: u32 = 11_000;

fn big_tree(dir: &Path) -> PathBuf {
    many_taps(dir, StageSpec::global("embedding", &[]), TAPS, |_| None)
}

fn head_of(t: &Path) -> IndexHead {
    IndexHead::parse(&std::fs::read(t.join(INDEX_FILE)).unwrap()).unwrap()
}

/// Positions at and around every chunk boundary of a file of `len` bytes
/// from `from` on, and its last byte.
fn boundaries(from: usize, len: usize) -> Vec<usize> {
    let mut at: Vec<usize> = (1..=len / CHUNK)
        .flat_map(|c| [c * CHUNK - 1, c * CHUNK, c * CHUNK + 1])
        .chain([from, from + 1, len / 2, len - 1])
        .filter(|&i| i >= from && i < len)
        .collect();
    at.sort();
    at.dedup();
    at
}

#[test]
fn every_chunk_of_a_large_manifest_and_index_is_checked_by_the_trusted_path() {
    let dir = tempfile::tempdir().unwrap();
    let t = big_tree(dir.path());
    let json_path = t.join("manifest.json");
    let json = std::fs::read(&json_path).unwrap();
    let idx_path = t.join(INDEX_FILE);
    let idx = std::fs::read(&idx_path).unwrap();
    assert!(json.len() > 3 * CHUNK, "{} bytes", json.len());
    assert!(idx.len() - HEAD_LEN > CHUNK, "{} bytes", idx.len());
    let head = head_of(&t);
    assert_eq!((head.major, head.minor), (2, 3));
    assert_eq!(head.json_xxh3, index::xxh3_chunked(&json));
    assert_ne!(head.json_xxh3, index::xxh3(&json));
    TreeReader::head(&t).unwrap();

    // One bit flipped at each chunk boundary of the entry list (the
    // flips before it change what the head check reads first).
    let entries = json
        .windows(11)
        .rposition(|w| w == b"\"entries\":[")
        .unwrap()
        + 11;
    for i in boundaries(entries, json.len() - 3) {
        let mut b = json.clone();
        b[i] ^= 0x01;
        std::fs::write(&json_path, &b).unwrap();
        let err = TreeReader::head(&t).unwrap_err().to_string();
        assert!(err.contains("manifest.json"), "manifest flip at {i}: {err}");
    }
    // Two whole chunks swapped: every chunk's digest is intact, their
    // order is not.
    let mut swapped = json.clone();
    let (first, second) = swapped[CHUNK..3 * CHUNK].split_at_mut(CHUNK);
    first.swap_with_slice(second);
    assert_ne!(swapped, json);
    std::fs::write(&json_path, &swapped).unwrap();
    let err = TreeReader::head(&t).unwrap_err().to_string();
    assert!(err.contains("manifest.json"), "swapped chunks: {err}");
    std::fs::write(&json_path, &json).unwrap();

    for i in boundaries(HEAD_LEN, idx.len()) {
        let mut b = idx.clone();
        b[i] ^= 0x01;
        std::fs::write(&idx_path, &b).unwrap();
        let err = TreeReader::head(&t).unwrap_err().to_string();
        assert!(err.contains("manifest.idx"), "index flip at {i}: {err}");
    }
    std::fs::write(&idx_path, &idx).unwrap();
    TreeReader::head(&t).unwrap();
    TreeReader::open(&t).unwrap().verify().unwrap();
}

#[test]
fn a_format_2_1_tree_keeps_its_whole_file_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let t = big_tree(dir.path());
    let json_path = t.join("manifest.json");
    let text = std::fs::read_to_string(&json_path).unwrap();
    let mut old = text
        .replacen(
            "\"format_version\":\"2.3\"",
            "\"format_version\":\"2.1\"",
            1,
        )
        .into_bytes();
    capture::manifest::seal(&mut old);
    std::fs::write(&json_path, &old).unwrap();
    index::rewrite(&t).unwrap();
    let head = head_of(&t);
    assert_eq!((head.major, head.minor), (2, 1));
    assert_eq!(head.json_xxh3, index::xxh3(&old));
    let h = TreeReader::head(&t).unwrap();
    assert_eq!(h.format_version, "2.1");
    TreeReader::open(&t).unwrap();
    // A byte flipped in its second MiB is still found.
    let mut b = old.clone();
    b[CHUNK + 7] ^= 0x01;
    std::fs::write(&json_path, &b).unwrap();
    let err = TreeReader::head(&t).unwrap_err().to_string();
    assert!(err.contains("manifest.json"), "{err}");
}
