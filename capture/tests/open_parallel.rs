//! Opening a tree of many taps decodes its index and checks its entries on
//! every core: the entries must be the manifest's own, and a manifest or
//! index with several bad entries must be refused naming the first one, as
//! the one-by-one check always did.

use capture::index::{self, HEAD_LEN, INDEX_FILE, RECORD_LEN};
use capture::{Manifest, StageSpec, TreeReader};
use std::path::{Path, PathBuf};

mod tree_support;
use tree_support::many_taps;

/// More taps than the parallel paths start from.
const TAPS: u32 = 3_000;

fn tree(dir: &Path) -> PathBuf {
    many_taps(dir, StageSpec::layer("ffn_down", &[]), TAPS, |p| {
        Some(p % 40)
    })
}

/// The manifest with the `n`th (from 0) occurrence of `from` in its text
/// replaced by `to`, sealed again and given a fresh index.
fn edit_nth(t: &Path, edits: &[(usize, &str, &str)]) {
    let path = t.join("manifest.json");
    let mut text = std::fs::read_to_string(&path).unwrap();
    for &(n, from, to) in edits {
        let at = text.match_indices(from).nth(n).expect("occurrence").0;
        text.replace_range(at..at + from.len(), to);
    }
    let mut bytes = text.into_bytes();
    assert!(capture::manifest::seal(&mut bytes));
    std::fs::write(&path, &bytes).unwrap();
    index::rewrite(t).unwrap();
}

#[test]
fn the_entries_decoded_from_the_index_are_the_manifests_own() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let opened = TreeReader::open(&t).unwrap();
    let json: Manifest =
        serde_json::from_slice(&std::fs::read(t.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(opened.manifest().entries.len(), TAPS as usize);
    assert_eq!(opened.manifest().entries, json.entries);
}

#[test]
fn of_two_bad_entries_the_first_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let shape = ("\"shape\":[1,2]", "\"shape\":[1,3]");
    // Entries 100 and 2500 hold 3 elements in 8 bytes: entry 100 is named.
    // (Once the 100th is edited, entry 2500's is the 2499th left.)
    edit_nth(&t, &[(100, shape.0, shape.1), (2499, shape.0, shape.1)]);
    let err = TreeReader::open(&t).unwrap_err().to_string();
    assert!(err.contains("L20/ffn_down@100:"), "{err}");
    // With only the later one bad, that one is named.
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    edit_nth(&t, &[(2500, shape.0, shape.1)]);
    let err = TreeReader::open(&t).unwrap_err().to_string();
    assert!(err.contains("L20/ffn_down@2500"), "{err}");
}

#[test]
fn of_two_bad_records_the_first_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let path = t.join(INDEX_FILE);
    let mut idx = std::fs::read(&path).unwrap();
    // An unknown dtype code in records 2900 and 700, sealed again.
    for n in [2900, 700] {
        idx[HEAD_LEN + n * RECORD_LEN + 20] = 200;
    }
    index::reseal(&mut idx);
    std::fs::write(&path, &idx).unwrap();
    let err = TreeReader::open(&t).unwrap_err().to_string();
    assert!(err.contains("record 700: unknown dtype code"), "{err}");
}

#[test]
fn a_key_twice_far_apart_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    // Entry 2890 given the key of entry 10 (same layer, stage and slot;
    // positions 10..11): the two are 2,880 entries apart.
    let text = std::fs::read_to_string(t.join("manifest.json")).unwrap();
    let key_of = |n: u32| {
        format!(
            "\"layer\":{},\"pos\":{{\"start\":{n},\"end\":{}}}",
            n % 40,
            n + 1
        )
    };
    assert!(text.contains(&key_of(10)) && text.contains(&key_of(2890)));
    edit_nth(&t, &[(0, &key_of(2890), &key_of(10))]);
    let err = TreeReader::open(&t).unwrap_err().to_string();
    assert!(err.contains("L10/ffn_down@10 appears twice"), "{err}");
    // Unedited, the same tree opens.
    let dir = tempfile::tempdir().unwrap();
    TreeReader::open(tree(dir.path())).unwrap();
}

/// Trees opened at once come back in the order of their paths, each
/// outcome the one opening it alone gives: a sound tree, a missing one
/// and a damaged one, in each order.
#[test]
fn trees_opened_at_once_are_each_opened_alone() {
    let dir = tempfile::tempdir().unwrap();
    let good = tree(&dir.path().join("good"));
    let damaged = tree(&dir.path().join("damaged"));
    edit_nth(&damaged, &[(7, "\"shape\":[1,2]", "\"shape\":[1,3]")]);
    let missing = dir.path().join("missing");
    let alone = |p: &Path| TreeReader::open(p).map_err(|e| e.to_string());
    for paths in [
        [good.as_path(), missing.as_path(), damaged.as_path()],
        [damaged.as_path(), good.as_path(), missing.as_path()],
        [missing.as_path(), damaged.as_path(), good.as_path()],
    ] {
        let at_once = TreeReader::open_all(&paths);
        assert_eq!(at_once.len(), 3);
        for (p, got) in paths.iter().zip(at_once) {
            let (got, want) = (got.map_err(|e| e.to_string()), alone(p));
            match (got, want) {
                (Ok(g), Ok(w)) => {
                    assert_eq!(g.path(), w.path());
                    assert_eq!(g.manifest().root, w.manifest().root);
                }
                (g, w) => assert_eq!(g.err(), w.err(), "{}", p.display()),
            }
        }
    }
}
