//! The manifest's binary index (format 2.1): written by every capture, it
//! opens to the same manifest as the JSON, and every damage to it or to the
//! manifest is refused by the readers that are meant to see it; a tree
//! read from its records in place is what the owned path reads, or fails
//! as it fails.

// With `compile-out` nothing is ever tapped; these tests need real taps.
#![cfg(not(feature = "compile-out"))]

use capture::index::{self, HEAD_LEN, INDEX_FILE, RECORD_LEN};
use capture::{
    Capture, CaptureOptions, Entries, Manifest, RunInfo, Selection, StageSpec, TreeReader,
};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A tree of 2 layers × 3 stages over 4 decode positions, one with a slot.
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
        capture::tap("embedding", None, p..p + 1, None, &[1, 6], &row);
        for layer in 0..2 {
            capture::tap("attn_norm", Some(layer), p..p + 1, None, &[1, 6], &row);
            capture::tap("ffn_down", Some(layer), p..p + 1, Some(0), &[1, 2, 3], &row);
        }
    }
    cap.finish().unwrap();
    out
}

fn json_manifest(tree: &Path) -> Manifest {
    serde_json::from_slice(&std::fs::read(tree.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn a_capture_writes_an_index_that_opens_to_the_manifest_the_json_holds() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    assert!(t.join(INDEX_FILE).is_file());
    let json = json_manifest(&t);
    assert_eq!(json.format_version, capture::FORMAT_VERSION);
    let opened = TreeReader::open(&t).unwrap();
    assert_eq!(opened.manifest(), &json);
    assert_eq!(opened.entries().len(), 4 * 5);
    assert!(opened.entries().iter().any(|e| e.key.slot == Some(0)));
    // Built again from the same bytes, the index is the same bytes.
    let bytes = std::fs::read(t.join("manifest.json")).unwrap();
    let again = index::build(&bytes, &json).unwrap();
    assert_eq!(again, std::fs::read(t.join(INDEX_FILE)).unwrap());
    let head = TreeReader::head(&t).unwrap();
    assert_eq!(head.root, json.root);
    assert_eq!((head.taps, head.bytes), (20, json.bytes_of_entries()));
    opened.verify().unwrap();
    assert!(
        opened.unlisted().unwrap().is_empty(),
        "the index is the tree's own"
    );
}

#[test]
fn every_byte_of_the_index_head_and_every_size_is_checked_by_the_trusted_path() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let idx_path = t.join(INDEX_FILE);
    let idx = std::fs::read(&idx_path).unwrap();
    for i in 0..HEAD_LEN {
        let mut b = idx.clone();
        b[i] ^= 0x10;
        std::fs::write(&idx_path, &b).unwrap();
        let err = TreeReader::head(&t).unwrap_err().to_string();
        assert!(err.contains("manifest.idx"), "flip at {i}: {err}");
        assert!(TreeReader::open(&t).is_err(), "flip at {i}");
    }
    for len in [0, 1, HEAD_LEN - 1, HEAD_LEN, idx.len() - 1] {
        std::fs::write(&idx_path, &idx[..len]).unwrap();
        assert!(TreeReader::head(&t).is_err(), "index cut to {len}");
        assert!(TreeReader::open(&t).is_err(), "index cut to {len}");
    }
    let mut longer = idx.clone();
    longer.push(0);
    std::fs::write(&idx_path, &longer).unwrap();
    assert!(TreeReader::head(&t).is_err(), "index appended to");
    std::fs::write(&idx_path, &idx).unwrap();

    let json_path = t.join("manifest.json");
    let json = std::fs::read(&json_path).unwrap();
    for len in (0..json.len()).step_by(7).chain([json.len() - 1]) {
        std::fs::write(&json_path, &json[..len]).unwrap();
        assert!(TreeReader::head(&t).is_err(), "manifest cut to {len}");
    }
    let mut longer = json.clone();
    longer.extend_from_slice(b" ");
    std::fs::write(&json_path, &longer).unwrap();
    let err = TreeReader::head(&t).unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
    // Every byte outside the entry list: the head, run, stages, dirs, and
    // the closing brace.
    let at = json
        .windows(11)
        .rposition(|w| w == b"\"entries\":[")
        .unwrap()
        + 10;
    let end = json.len() - 2;
    assert_eq!(&json[end - 1..], b"]}\n");
    for i in (0..=at).chain(end..json.len()) {
        let mut b = json.clone();
        b[i] ^= 0x01;
        std::fs::write(&json_path, &b).unwrap();
        assert!(TreeReader::head(&t).is_err(), "flip at {i}");
    }
    std::fs::write(&json_path, &json).unwrap();
    TreeReader::head(&t).unwrap();
}

#[test]
fn every_byte_of_the_entries_and_the_records_is_checked_by_the_trusted_path() {
    // docs/FORMAT.md, "What trusted `verify A B` trusts": a byte changed in
    // place inside the manifest's entry list or the index's records fails
    // the checksums the index head records; opening the tree refuses it too.
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let json_path = t.join("manifest.json");
    let json = std::fs::read(&json_path).unwrap();
    let at = json
        .windows(11)
        .rposition(|w| w == b"\"entries\":[")
        .unwrap()
        + 11;
    for i in at..json.len() - 3 {
        let mut b = json.clone();
        b[i] ^= 0x01;
        std::fs::write(&json_path, &b).unwrap();
        let err = TreeReader::head(&t).unwrap_err().to_string();
        assert!(err.contains("manifest.json"), "manifest flip at {i}: {err}");
        assert!(TreeReader::open(&t).is_err(), "manifest flip at {i}");
    }
    std::fs::write(&json_path, &json).unwrap();
    let idx_path = t.join(INDEX_FILE);
    let idx = std::fs::read(&idx_path).unwrap();
    for i in HEAD_LEN..idx.len() {
        let mut b = idx.clone();
        b[i] ^= 0x01;
        std::fs::write(&idx_path, &b).unwrap();
        let err = TreeReader::head(&t).unwrap_err().to_string();
        assert!(err.contains("manifest.idx"), "index flip at {i}: {err}");
        let err = TreeReader::open(&t).unwrap_err().to_string();
        assert!(err.contains("manifest.idx"), "index flip at {i}: {err}");
    }
    std::fs::write(&idx_path, &idx).unwrap();
    TreeReader::open(&t).unwrap();
}

#[test]
fn a_manifest_that_no_longer_parses_fails_the_trusted_path() {
    // One byte inside the entry list, the size unchanged: the JSON stops
    // parsing, and the trusted head check must see it.
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let json_path = t.join("manifest.json");
    let mut json = std::fs::read(&json_path).unwrap();
    let at = json
        .windows(11)
        .rposition(|w| w == b"\"entries\":[")
        .unwrap()
        + 11;
    assert_eq!(json[at], b'{');
    json[at] = b'x';
    assert!(serde_json::from_slice::<serde_json::Value>(&json).is_err());
    std::fs::write(&json_path, &json).unwrap();
    let err = TreeReader::head(&t).unwrap_err().to_string();
    assert!(
        err.contains("manifest.json") && err.contains("checksum"),
        "{err}"
    );
}

#[test]
fn a_resealed_index_with_edited_records_is_refused_by_its_checks() {
    // Edits with the body hash and head seal redone: what catches them is
    // the decoder's bounds, the reader rules and the root.
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let idx_path = t.join(INDEX_FILE);
    let idx = std::fs::read(&idx_path).unwrap();
    let edits: [(&str, usize, &[u8]); 7] = [
        ("stage string", HEAD_LEN, &[0xff, 0, 0, 0]),
        ("layer", HEAD_LEN + 4, &[0xff, 0xff, 0xff, 0xff]),
        ("position", HEAD_LEN + 12, &[9, 0, 0, 0]),
        ("dtype", HEAD_LEN + 20, &[9]),
        ("flags", HEAD_LEN + 22, &[0xff]),
        ("dims", HEAD_LEN + 24, &[0xff, 0xff, 0, 0]),
        ("tensor hash", HEAD_LEN + 40, &[0xab]),
    ];
    for (what, at, bytes) in edits {
        let mut b = idx.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        index::reseal(&mut b);
        std::fs::write(&idx_path, &b).unwrap();
        assert!(TreeReader::open(&t).is_err(), "{what}");
    }
    // The header hash is in no root: the JSON, parsed whole, disagrees.
    let mut b = idx.clone();
    b[HEAD_LEN + 72] ^= 1;
    index::reseal(&mut b);
    std::fs::write(&idx_path, &b).unwrap();
    let tree = TreeReader::open(&t).unwrap();
    let err = tree.verify().unwrap_err().to_string();
    assert!(
        err.contains("it and its index disagree at entry 0"),
        "{err}"
    );
}

#[test]
fn a_missing_index_is_refused_and_a_format_2_0_tree_needs_none() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let idx = std::fs::read(t.join(INDEX_FILE)).unwrap();
    std::fs::remove_file(t.join(INDEX_FILE)).unwrap();
    for err in [
        TreeReader::head(&t).unwrap_err(),
        TreeReader::open(&t).unwrap_err(),
    ] {
        assert!(
            err.to_string()
                .contains("manifest.idx: bad manifest: missing"),
            "{err}"
        );
    }
    // The same tree written as format 2.0 (no index): read whole.
    let json = std::fs::read_to_string(t.join("manifest.json")).unwrap();
    let mut old = json
        .replacen(
            "\"format_version\":\"2.3\"",
            "\"format_version\":\"2.0\"",
            1,
        )
        .into_bytes();
    capture::manifest::seal(&mut old);
    std::fs::write(t.join("manifest.json"), &old).unwrap();
    let head = TreeReader::head(&t).unwrap();
    assert_eq!(head.format_version, "2.0");
    TreeReader::open(&t).unwrap().verify().unwrap();
    // A 2.0 manifest beside a stale index: the index is not read.
    std::fs::write(t.join(INDEX_FILE), idx).unwrap();
    TreeReader::head(&t).unwrap();
    TreeReader::open(&t).unwrap();
}

#[test]
fn an_index_that_is_a_link_out_of_the_tree_or_not_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let idx_path = t.join(INDEX_FILE);
    let elsewhere = dir.path().join("elsewhere.idx");
    std::fs::rename(&idx_path, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &idx_path).unwrap();
    let err = TreeReader::head(&t).unwrap_err().to_string();
    assert!(err.contains("outside the tree"), "{err}");
    std::fs::remove_file(&idx_path).unwrap();
    std::fs::create_dir(&idx_path).unwrap();
    assert!(TreeReader::head(&t).is_err());
    assert!(TreeReader::open(&t).is_err());
}

// Trees opened from their index's records in place (`TreeReader::open`)
// against the owned path (`TreeReader::open_owned`): the same manifest, the
// same fields tap by tap, and for any damage to the records (the body hash
// and head seal redone, so that only the records' own checks can see it)
// the same error, word for word.

/// What `open` and `open_owned` make of the tree: both refuse it with one
/// message, or both open it to one manifest. Returns whether it opened.
fn same_either_way(t: &Path, what: &str) -> bool {
    unsealed_as_opened(t, what);
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

/// A tree opened unsealed that passes its last check is the tree `open`
/// opens; one that cannot be opened unsealed fails `open` with the same
/// error.
fn unsealed_as_opened(t: &Path, what: &str) {
    match (TreeReader::open_unsealed(t), TreeReader::open(t)) {
        (Ok(u), Ok(o)) => {
            assert!(!u.check() || u.tree().manifest() == o.manifest(), "{what}")
        }
        (Ok(u), Err(_)) => assert!(!u.check(), "{what}: passed, but open refuses it"),
        (Err(u), Err(o)) => assert_eq!(u.to_string(), o.to_string(), "{what}"),
        (Err(u), Ok(_)) => panic!("{what}: open opens it, unsealed {u}"),
    }
}

/// A record edited in a field its entry's checks cannot see (a tap's
/// tensor hash), the index sealed again: the records are sound, opened
/// unsealed, but not the tree's; the last check says so, and `open`
/// refuses the tree as it always did.
#[test]
fn a_record_not_the_trees_fails_the_last_check() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let unsealed = TreeReader::open_unsealed(&t).unwrap();
    assert!(unsealed.check());
    let idx_path = t.join(INDEX_FILE);
    let mut idx = std::fs::read(&idx_path).unwrap();
    idx[HEAD_LEN + 3 * RECORD_LEN + 40] ^= 1;
    index::reseal(&mut idx);
    std::fs::write(&idx_path, &idx).unwrap();
    let unsealed = TreeReader::open_unsealed(&t).unwrap();
    assert!(matches!(unsealed.tree().listing(), Entries::Records(_)));
    assert!(!unsealed.check());
    let err = TreeReader::open(&t).unwrap_err().to_string();
    assert!(err.contains("manifest.json"), "{err}");
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

#[test]
fn entries_that_only_their_own_checks_refuse_are_refused_from_the_records_too() {
    type Edit = fn(&mut Manifest);
    let cases: [(&str, Edit, &str); 4] = [
        (
            "a key twice",
            |m| {
                let n = m.entries.len();
                m.entries[n - 1] = m.entries[1].clone();
            },
            "appears twice",
        ),
        (
            "axis 0 not its positions",
            |m| {
                let e = &mut m.entries[2];
                e.shape = vec![2, e.shape.iter().skip(1).product::<usize>() / 2];
            },
            "axis 0",
        ),
        (
            "a position past the format's",
            |m| {
                let e = &mut m.entries[3];
                e.key.pos = capture::manifest::MAX_POSITION..capture::manifest::MAX_POSITION + 1;
                e.path = capture::manifest::path_of(&e.key);
            },
            "goes past",
        ),
        (
            "a byte count not its shape's",
            |m| {
                m.entries[4].bytes += 4;
                m.entries[5].bytes -= 4;
            },
            "",
        ),
    ];
    for (what, edit, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let t = tree(dir.path());
        index::reseal_edited(&t, edit).unwrap();
        let err = TreeReader::open_owned(&t).unwrap_err().to_string();
        assert!(err.contains(says), "{what}: {err}");
        // Not opened from the records either, and refused word for word
        // as the owned path refuses it.
        assert!(!same_either_way(&t, what), "{what}");
    }
    // The control: the same rewrite without an edit opens both ways.
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    index::reseal_edited(&t, |_| {}).unwrap();
    assert!(same_either_way(&t, "resealed unedited"));
    assert!(matches!(
        TreeReader::open(&t).unwrap().listing(),
        Entries::Records(_)
    ));
}

#[test]
fn records_opened_are_the_bytes_proven_whatever_the_index_file_becomes() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree(dir.path());
    let reader = TreeReader::open(&t).unwrap();
    let owned = TreeReader::open_owned(&t).unwrap();
    let hash = reader.listing().entry(1).blake3.clone();
    // The index file changed in place under the open tree, then cut short.
    let idx = t.join(INDEX_FILE);
    let mut bytes = std::fs::read(&idx).unwrap();
    for b in &mut bytes[HEAD_LEN..] {
        *b ^= 0x5a;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&idx)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
        .unwrap();
    let listing = reader.listing();
    assert_eq!(listing.entry(1).blake3, hash);
    assert!(listing.same_hash(1, &owned.listing(), 1));
    std::fs::File::create(&idx).unwrap();
    for i in 0..listing.len() {
        assert_eq!(*listing.entry(i), owned.entries()[i], "entry {i}");
    }
}
