//! Format 2.2: taps with a rank and a shard round-trip through the writer,
//! the reader and the Python reader; a tree without ranks stays 2.3 with its
//! index; a shard that does not fit its tap fails the capture.

#![cfg(not(feature = "compile-out"))]

use capture::{Capture, CaptureOptions, RunInfo, Selection, Shard, TapId, TreeReader};
use std::path::Path;
use std::process::Command;

/// One capture is armed per process: the tests take turns.
static ARMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn start(out: &Path) -> Capture {
    Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: false,
        stages: vec![],
        run: RunInfo::default(),
    })
    .unwrap()
}

const SHARD: Shard = Shard {
    axis: 1,
    start: 2,
    end: 5,
    full: 8,
};

#[test]
fn ranked_taps_round_trip_and_only_their_tree_says_2_2() {
    let _turn = ARMED.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (plain, ranked) = (dir.path().join("plain"), dir.path().join("ranked"));
    let cap = start(&plain);
    capture::tap("x", Some(0), 0..2, None, &[2, 3], &[1.0f32; 6]);
    cap.finish().unwrap();
    let cap = start(&ranked);
    capture::tap("x", Some(0), 0..2, None, &[2, 3], &[1.0f32; 6]);
    let id = TapId::new("q_proj", Some(0), 0..2, None);
    capture::tap_ranked(id, 1, Some(SHARD), &[2, 3], &[2.0f32; 6]);
    capture::tap_ranked(id.with_pos(0..2), 0, None, &[2, 8], &[3.0f32; 16]);
    cap.finish().unwrap();

    let p = TreeReader::open(&plain).unwrap();
    assert_eq!(p.manifest().format_version, capture::FORMAT_VERSION);
    assert!(plain.join("manifest.idx").exists());
    let r = TreeReader::open(&ranked).unwrap();
    assert_eq!(r.manifest().format_version, "2.2");
    assert!(!ranked.join("manifest.idx").exists());
    let keys: Vec<String> = r.entries().iter().map(|e| e.key.to_string()).collect();
    assert_eq!(
        keys,
        [
            "L0/x@0..2",
            "L0/q_proj@0..2 rank 1",
            "L0/q_proj@0..2 rank 0"
        ]
    );
    let e = &r.entries()[1];
    assert_eq!((e.key.rank, e.key.shard), (Some(1), Some(SHARD)));
    assert_eq!(e.path, "L000/q_proj.p0-2.r1.safetensors");
    assert_eq!(r.entries()[2].key.shard, None);
    r.verify().unwrap();
    assert_ne!(p.manifest().root, r.manifest().root);

    if python_ready() {
        let script = "import sys; sys.path.insert(0, sys.argv[2])\n\
                      from taptree.tree import open_tree, key_text\n\
                      t = open_tree(sys.argv[1]); t.verify()\n\
                      print([key_text(e['key']) for e in t.entries])";
        let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../python");
        let o = Command::new("python3")
            .args(["-c", script])
            .arg(&ranked)
            .arg(python)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("'L0/q_proj@0..2 rank 1'"), "{out}");
    }
}

#[test]
fn a_shard_that_does_not_fit_its_tap_fails_the_capture() {
    let _turn = ARMED.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        (Shard { end: 6, ..SHARD }, "holds 4 along axis 1"),
        (
            Shard { axis: 0, ..SHARD },
            "axis 0 is not a non-position axis",
        ),
        (Shard { full: 4, ..SHARD }, "leaves the full extent"),
    ];
    for (i, (shard, want)) in bad.into_iter().enumerate() {
        let out = dir.path().join(format!("t{i}"));
        let cap = start(&out);
        let id = TapId::new("q_proj", Some(0), 0..2, None);
        capture::tap_ranked(id, 0, Some(shard), &[2, 3], &[2.0f32; 6]);
        let e = cap.finish().unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("L0/q_proj@0..2 rank 0"),
            "{e}"
        );
        assert!(!out.join("manifest.json").exists());
    }
}

fn python_ready() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, blake3"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "python3 with numpy and blake3 is not available; CI requires it"
        );
        eprintln!("skipping the Python reader: python3 with numpy and blake3 is not available");
    }
    ok
}
