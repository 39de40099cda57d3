//! Trees opened from their index's records in place (`TreeReader::open`)
//! against the owned path (`TreeReader::open_owned`): the same manifest,
//! the same fields tap by tap, and for any damage to the records (the
//! body hash and head seal redone, so that only the records' own checks
//! can see it) the same error, word for word.

// With `compile-out` nothing is ever tapped; these tests need real taps.
#![cfg(not(feature = "compile-out"))]

use capture::index::{self, HEAD_LEN, INDEX_FILE, RECORD_LEN};
use capture::{Capture, CaptureOptions, Entries, RunInfo, Selection, StageSpec, TreeReader};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A tree of 2 layers × 3 stages over 4 decode positions, one with a slot,
/// one f64.
fn tree(dir: &Path) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let out = dir.join("t");
    let cap = Capture::start(CaptureOptions {
        out: out.clone(),
        selection: Selection::parse("").unwrap(),
        force: false,
        stages: vec![
            StageSpec::global("embedding", &[]),
            StageSpec::layer("attn_norm", &[]),
            StageSpec::layer("ffn_down", &["attn_norm"]),
        ],
        run: RunInfo {
            model: "toy".into(),
            precision: "f32".into(),
            prompt_tokens: vec![1, 2, 3, 4],
            ..RunInfo::default()
        },
    })
    .unwrap();
    for p in 0..4u32 {
        let row: Vec<f32> = (0..6).map(|i| (p * 10 + i) as f32).collect();
        let wide: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
        capture::tap("embedding", None, p..p + 1, None, &[1, 6], &wide);
        for layer in 0..2 {
            capture::tap("attn_norm", Some(layer), p..p + 1, None, &[1, 6], &row);
            capture::tap("ffn_down", Some(layer), p..p + 1, Some(0), &[1, 2, 3], &row);
        }
    }
    cap.finish().unwrap();
    out
}

/// What `open` and `open_owned` make of the tree: both refuse it with one
/// message, or both open it to one manifest. Returns whether it opened.
fn same_either_way(t: &Path, what: &str) -> bool {
    match (TreeReader::open(t), TreeReader::open_owned(t)) {
        (Ok(v), Ok(o)) => {
            assert_eq!(v.manifest(), o.manifest(), "{what}");
            true
        }
        (Err(v), Err(o)) => {
            assert_eq!(v.to_string(), o.to_string(), "{what}");
            false
        }
        (v, o) => panic!(
            "{what}: opened from the records {:?}, the owned way {:?}",
            v.map(|_| ()),
            o.map(|_| ())
        ),
    }
}

#[test]
fn a_sound_index_opens_as_views_with_every_field_of_the_owned_entries() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let views = TreeReader::open(&t).unwrap();
    let owned = TreeReader::open_owned(&t).unwrap();
    let (Entries::Records(_), Entries::Owned(_)) = (views.listing(), owned.listing()) else {
        panic!("a sound index is read in place, and open_owned decodes it")
    };
    assert!(views.head_fields().entries.is_empty());
    assert_eq!(views.root(), owned.root());
    let (v, o) = (views.listing(), owned.listing());
    assert_eq!((v.len(), v.total_bytes()), (20, o.total_bytes()));
    for i in 0..v.len() {
        let e = &owned.entries()[i];
        assert_eq!(*v.entry(i), *e, "entry {i}");
        assert_eq!(v.stage(i), e.key.stage);
        assert_eq!(
            (v.layer(i), v.pos(i), v.slot(i)),
            (e.key.layer, e.key.pos.clone(), e.key.slot)
        );
        assert_eq!(
            (v.rows(i), v.dtype(i), v.bytes(i)),
            (e.key.rows(), e.dtype, e.bytes)
        );
        assert_eq!(v.shape(i), o.shape(i));
        assert_eq!(v.shape(i).to_vec(), e.shape);
        for j in 0..v.len() {
            // Hashes and keys compare alike across the two kinds.
            let same = o.entry(i).blake3 == o.entry(j).blake3;
            assert_eq!(v.same_hash(i, &v, j), same);
            assert_eq!(v.same_hash(i, &o, j), same);
            assert_eq!(o.same_hash(i, &v, j), same);
            assert_eq!(v.same_key(i, &o, j), i == j);
        }
    }
    // The owned entries, built on first need, are the owned path's.
    assert_eq!(views.manifest(), owned.manifest());
    views.verify().unwrap();
    assert_eq!(TreeReader::head(&t).unwrap().bytes, o.total_bytes());
}

#[test]
fn a_damaged_record_fails_exactly_as_the_owned_path_fails() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let idx_path = t.join(INDEX_FILE);
    let idx = std::fs::read(&idx_path).unwrap();
    // Fields the root does not hash: only an entry's own checks see them.
    let edits: [(&str, usize, &[u8]); 6] = [
        ("byte count", HEAD_LEN + 32, &[1]),
        ("path string", HEAD_LEN + 28, &[0, 0, 0, 0]),
        (
            "position past the format's bound",
            HEAD_LEN + 8,
            &[0, 0, 0, 2],
        ),
        ("empty positions", HEAD_LEN + 12, &[0, 0, 0, 0]),
        ("shape", HEAD_LEN + 24, &[5, 0, 0, 0]),
        ("stage string", HEAD_LEN + RECORD_LEN, &[0, 0, 0, 0]),
    ];
    for (what, at, bytes) in edits {
        let mut b = idx.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        index::reseal(&mut b);
        std::fs::write(&idx_path, &b).unwrap();
        assert!(!same_either_way(&t, what), "{what}: opened");
    }
    // The byte count is in no hash, and moved from one tap to another the
    // total the heads record holds: only each entry's own check sees it.
    let mut b = idx.clone();
    let bytes_at = |r: usize| HEAD_LEN + r * RECORD_LEN + 32;
    assert_eq!((b[bytes_at(1)], b[bytes_at(2)]), (24, 24));
    b[bytes_at(1)] = 28;
    b[bytes_at(2)] = 20;
    index::reseal(&mut b);
    std::fs::write(&idx_path, &b).unwrap();
    let err = TreeReader::open(&t).unwrap_err().to_string();
    assert!(err.contains("entry says"), "{err}");
}

#[test]
fn every_flipped_bit_of_the_body_is_judged_as_the_owned_path_judges_it() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let idx_path = t.join(INDEX_FILE);
    let idx = std::fs::read(&idx_path).unwrap();
    let mut opened = 0;
    for at in HEAD_LEN..idx.len() {
        for bit in [0, 3, 7] {
            let mut b = idx.clone();
            b[at] ^= 1 << bit;
            index::reseal(&mut b);
            std::fs::write(&idx_path, &b).unwrap();
            opened += usize::from(same_either_way(&t, &format!("byte {at} bit {bit}")));
        }
    }
    // Only the header hashes are in no check at opening (verify compares
    // them with the JSON): every other flip is refused.
    assert!(opened <= 20 * 32 * 3, "{opened} flips opened");
}
