//! Capture a tree and read it back: every dtype, roots, selection, one
//! capture at a time, broken tap contracts, replacing a tree (also by a
//! capture killed half way), arming from the environment. Damaged trees are
//! in `damaged.rs`. Captures are process-global, so tests that arm take
//! `serial()`.

// With `compile-out` nothing is ever tapped; these tests need real taps.
#![cfg(not(feature = "compile-out"))]

mod tree_support;
use tree_support::*;

#[test]
fn round_trip_every_dtype() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let cap = Capture::start(opts(&out, "")).unwrap();
    assert!(capture::is_armed());
    capture::tap(
        "f32",
        None,
        0..1,
        None,
        &[1, 3],
        &[1.0f32, -0.0, f32::INFINITY],
    );
    capture::tap("f64", None, 1..2, None, &[1, 2], &[1e300f64, -2.5]);
    capture::tap(
        "f16",
        None,
        2..3,
        None,
        &[1, 2],
        &[half::f16::from_f32(0.5), half::f16::MAX],
    );
    capture::tap(
        "bf16",
        None,
        3..4,
        None,
        &[1, 1],
        &[half::bf16::from_f32(-3.0)],
    );
    capture::tap("i8", None, 4..5, None, &[1, 3], &[-128i8, 0, 127]);
    capture::tap(
        "i32",
        Some(7),
        5..6,
        Some(2),
        &[1, 2],
        &[i32::MIN, i32::MAX],
    );
    capture::tap("empty", None, 6..7, None, &[1, 0], &[] as &[f32]);
    let summary = cap.finish().unwrap();
    assert!(!capture::is_armed());
    assert_eq!(summary.taps, 7);
    assert_eq!(summary.bytes, 12 + 16 + 4 + 2 + 3 + 8);

    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), summary.root);
    let names: Vec<_> = tree
        .entries()
        .iter()
        .map(|e| e.key.stage.as_str())
        .collect();
    assert_eq!(
        names,
        ["f32", "f64", "f16", "bf16", "i8", "i32", "empty"],
        "capture order"
    );
    let values: Vec<Vec<f64>> = tree
        .entries()
        .iter()
        .map(|e| tree.read(e).unwrap().to_f64())
        .collect();
    assert_eq!(values[0], [1.0, 0.0, f64::INFINITY]);
    assert!(values[0][1].is_sign_negative());
    assert_eq!(values[1], [1e300, -2.5]);
    assert_eq!(values[2], [0.5, 65504.0]);
    assert_eq!(values[3], [-3.0]);
    assert_eq!(values[4], [-128.0, 0.0, 127.0]);
    assert_eq!(values[5], [i32::MIN as f64, i32::MAX as f64]);
    assert!(values[6].is_empty());
    let i32_entry = &tree.entries()[5];
    assert_eq!(i32_entry.key.to_string(), "L7/i32@5 slot 2");
    assert_eq!(i32_entry.dtype, DType::I32);
    assert_eq!(
        tree.read(i32_entry).unwrap().as_slice::<i32>().unwrap(),
        &[i32::MIN, i32::MAX]
    );
    assert!(tree.read(i32_entry).unwrap().as_slice::<f32>().is_none());
    assert_eq!(tree.verify().unwrap().taps, 7);
}

#[test]
fn disarmed_taps_write_nothing() {
    let _guard = serial();
    assert!(!capture::is_armed());
    assert!(!capture::wants("x", None, 0..1, None));
    // A tap with a broken shape is not even looked at while disarmed.
    capture::tap("x", None, 0..1, None, &[9, 9], &[1.0f32]);
}

#[test]
fn same_computation_same_root_whatever_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let a = capture_tree(&dir.path().join("a"), "", 0.0);
    let b = {
        let _guard = serial();
        let mut o = opts(&dir.path().join("b"), "");
        o.run.host = "another-host".into();
        o.run.time = "1999-01-01T00:00:00Z".into();
        let cap = Capture::start(o).unwrap();
        forward(0.0);
        cap.finish().unwrap()
    };
    assert_eq!(a.root, b.root);
    assert_eq!(a.taps, 6);
    let c = capture_tree(&dir.path().join("c"), "", 1.0);
    assert_ne!(a.root, c.root);
    let ta = TreeReader::open(dir.path().join("a")).unwrap();
    assert_eq!(ta.manifest().run.model, "toy");
    assert!(!ta.manifest().run.time.is_empty(), "time is filled in");
    assert_eq!(ta.manifest().stages.len(), 4);
}

#[test]
fn selection_filters_and_slices_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    capture_tree(&out, "stage=ffn_*,logits;layer=1,none;pos=0,2", 0.0);
    let tree = TreeReader::open(&out).unwrap();
    let keys: Vec<String> = tree.entries().iter().map(|e| e.key.to_string()).collect();
    assert_eq!(
        keys,
        ["L1/ffn_down@0", "L1/ffn_down@2", "logits@0", "logits@2"]
    );
    // Row 2 of layer 1's ffn_down is seed 11 + (10..15) * 0.25.
    let row2 = tree.read(&tree.entries()[1]).unwrap();
    assert_eq!(row2.shape(), &[1, 5]);
    assert_eq!(row2.to_f64(), [13.5, 13.75, 14.0, 14.25, 14.5]);
    assert_eq!(
        tree.manifest().selection,
        "stage=ffn_*,logits;layer=1,none;pos=0,2"
    );
}

#[test]
fn an_owned_tap_writes_what_a_copied_tap_writes() {
    // The logits of 3 positions, 1 MiB a row: large enough for the copied
    // tap's parallel copy, and taken whole or in runs by the owned one.
    let width = 1 << 18;
    let logits: Vec<f32> = (0..3 * width)
        .map(|i| (i % 977) as f32 * 0.5 - 7.0)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, selection: &str, owned: bool| {
        let _guard = serial();
        let out = dir.path().join(name);
        let cap = Capture::start(opts(&out, selection)).unwrap();
        capture::tap("embedding", None, 0..3, None, &[3, 1], &[1f32, 2.0, 3.0]);
        match owned {
            true => capture::tap_owned("logits", None, 0..3, None, &[3, width], logits.clone()),
            false => capture::tap("logits", None, 0..3, None, &[3, width], &logits),
        }
        let summary = cap.finish().unwrap();
        let tree = TreeReader::open(&out).unwrap();
        tree.verify().unwrap();
        let last = tree.entries().last().unwrap();
        let row = tree.read(last).unwrap().as_slice::<f32>().unwrap()[..width].to_vec();
        (summary.root, last.key.to_string(), row)
    };
    // Every row kept (the buffer itself written), and one run of two
    // (copied out of it), as the copied tap writes them.
    for (selection, key, first) in [("", "logits@0..3", 0), ("pos=1..", "logits@1..3", 1)] {
        let copied = run(&format!("copied{first}"), selection, false);
        let owned = run(&format!("owned{first}"), selection, true);
        assert_eq!(owned.1, key);
        assert_eq!(owned.0, copied.0, "selection {selection:?}: roots");
        let want = &logits[first * width..(first + 1) * width];
        assert!(owned.2 == want && copied.2 == want, "{key}: its first row");
    }
    // A changed byte shows in the root.
    let again = run("again", "", false).0;
    let mut other = logits.clone();
    other[2 * width + 5] += 1.0;
    let _guard = serial();
    let out = dir.path().join("other");
    let cap = Capture::start(opts(&out, "")).unwrap();
    capture::tap("embedding", None, 0..3, None, &[3, 1], &[1f32, 2.0, 3.0]);
    capture::tap_owned("logits", None, 0..3, None, &[3, width], other);
    assert_ne!(cap.finish().unwrap().root, again);
}

#[test]
fn wants_follows_the_selection() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let cap = Capture::start(opts(&dir.path().join("t"), "stage=k_*;pos=3..")).unwrap();
    assert!(capture::wants("k_rope", Some(0), 0..4, None));
    assert!(!capture::wants("k_rope", Some(0), 0..3, None));
    assert!(!capture::wants("q_rope", Some(0), 5..6, None));
    // Nothing was tapped: a selection that selected nothing is an error.
    assert!(cap.finish().is_err());
    assert!(!capture::wants("k_rope", Some(0), 0..4, None));
}

#[test]
fn one_capture_at_a_time() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let first = Capture::start(opts(&dir.path().join("a"), "")).unwrap();
    let err = Capture::start(opts(&dir.path().join("b"), ""))
        .err()
        .unwrap();
    assert!(matches!(err, Error::AlreadyArmed { .. }), "{err}");
    first.finish().unwrap();
    Capture::start(opts(&dir.path().join("b"), ""))
        .unwrap()
        .finish()
        .unwrap();
}

#[test]
fn broken_tap_contracts_fail_finish_and_leave_no_manifest() {
    type BadTap = Box<dyn Fn()>;
    let cases: Vec<(&str, BadTap)> = vec![
        (
            "axis 0",
            Box::new(|| capture::tap("x", None, 0..2, None, &[3, 1], &[0f32; 3])),
        ),
        (
            "holds 4 elements",
            Box::new(|| capture::tap("x", None, 0..2, None, &[2, 2], &[0f32; 3])),
        ),
        (
            "stage names",
            Box::new(|| capture::tap("../x", None, 0..1, None, &[1], &[0f32])),
        ),
        (
            "empty or reversed",
            Box::new(|| capture::tap("x", None, 2..2, None, &[0], &[] as &[f32])),
        ),
        (
            "tapped twice",
            Box::new(|| {
                capture::tap("x", Some(1), 0..1, None, &[1], &[0f32]);
                capture::tap("x", Some(1), 0..1, None, &[1], &[1f32]);
            }),
        ),
    ];
    for (expected, bad) in cases {
        let _guard = serial();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("t");
        let cap = Capture::start(opts(&out, "")).unwrap();
        bad();
        let err = cap.finish().unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
        assert!(matches!(
            TreeReader::open(&out),
            Err(Error::Incomplete { .. })
        ));
    }
}

#[test]
fn writer_errors_surface_from_finish() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let cap = Capture::start(opts(&out, "")).unwrap();
    // A file where the layer directory must go: the writer cannot create it.
    std::fs::write(out.join("L000"), b"in the way").unwrap();
    capture::tap("x", Some(0), 0..1, None, &[1], &[0f32]);
    let err = cap.finish().unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains("L000"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn a_dropped_capture_reads_as_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    {
        let _guard = serial();
        let _cap = Capture::start(opts(&out, "")).unwrap();
        forward(0.0);
    }
    assert!(!capture::is_armed());
    let err = TreeReader::open(&out).unwrap_err();
    assert!(matches!(err, Error::Incomplete { .. }));
    assert!(err.to_string().contains("incomplete capture"), "{err}");
}

#[test]
fn refuses_a_non_empty_directory_that_is_not_a_tree() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("precious");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("thesis.tex"), b"years of work").unwrap();
    for force in [false, true] {
        let mut o = opts(&out, "");
        o.force = force;
        let err = Capture::start(o).err().unwrap();
        assert!(matches!(err, Error::NotATree { .. }), "{err}");
    }
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        Capture::start(opts(&file, "")).err().unwrap(),
        Error::NotATree { .. }
    ));
    assert_eq!(
        std::fs::read(out.join("thesis.tex")).unwrap(),
        b"years of work"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn an_existing_tree_needs_force_and_survives_a_failed_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let old = capture_tree(&out, "", 0.0);
    {
        let _guard = serial();
        let err = Capture::start(opts(&out, "")).err().unwrap();
        assert!(matches!(err, Error::TreeExists { .. }), "{err}");
        assert!(err.to_string().contains("--force"));
        // A forced capture that dies before finishing leaves the old tree.
        let mut o = opts(&out, "");
        o.force = true;
        let cap = Capture::start(o).unwrap();
        forward(5.0);
        drop(cap);
    }
    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), old.root);
    tree.verify().unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no staging left"
    );
    // A forced capture that finishes replaces it, and leaves only the
    // replaced tree beside it, hidden, as the next replacement's space.
    let new = replace_tree(&out, 5.0);
    assert_ne!(new.root, old.root);
    assert_eq!(TreeReader::open(&out).unwrap().root(), new.root);
    assert_eq!(listing(dir.path()), [".t.taptree-spare", "t"]);
}

#[test]
fn a_capture_killed_between_the_renames_of_a_replacement_gets_the_old_tree_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    // What a replacing capture killed between its two renames leaves: the
    // old tree set aside, the new one complete in staging, `t` gone.
    let (x, y) = (dir.path().join("x"), dir.path().join("y"));
    let old = capture_tree(&x, "", 0.0);
    capture_tree(&y, "", 5.0);
    set_aside(&x, &out, "old", DEAD);
    set_aside(&y, &out, "new", DEAD);
    // A staging directory of a capture still running is left alone.
    let live = std::os::unix::process::parent_id();
    let busy = dir.path().join(format!(".t.taptree-new-{live}"));
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join(".taptree"), "in progress").unwrap();

    let err = {
        let _guard = serial();
        Capture::start(opts(&out, "")).err().unwrap()
    };
    assert!(matches!(err, Error::TreeExists { .. }), "{err}");
    let tree = TreeReader::open(&out).unwrap();
    assert_eq!(tree.root(), old.root);
    tree.verify().unwrap();
    let left = listing(dir.path());
    assert_eq!(left, [format!(".t.taptree-new-{live}"), "t".to_string()]);
}

#[test]
fn a_capture_killed_after_its_replacement_leaves_nothing_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    // Killed while deleting the tree it replaced, and another killed while
    // writing its staging: `t` is the replacement.
    let x = dir.path().join("x");
    capture_tree(&x, "", 0.0);
    let new = capture_tree(&out, "", 5.0);
    set_aside(&x, &out, "old", DEAD);
    let staging = dir.path().join(format!(".t.taptree-new-{}", DEAD - 1));
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join(".taptree"), "in progress").unwrap();
    // Not a tree: never touched, whatever its name.
    let stranger = dir.path().join(format!(".t.taptree-old-{}", DEAD + 1));
    std::fs::create_dir(&stranger).unwrap();
    std::fs::write(stranger.join("notes.txt"), "mine").unwrap();

    let replaced = replace_tree(&out, 7.0);
    assert_ne!(replaced.root, new.root);
    assert_eq!(TreeReader::open(&out).unwrap().root(), replaced.root);
    let left = listing(dir.path());
    assert_eq!(
        left,
        [
            format!(".t.taptree-old-{}", DEAD + 1),
            ".t.taptree-spare".into(),
            "t".to_string()
        ]
    );
    assert_eq!(std::fs::read(stranger.join("notes.txt")).unwrap(), b"mine");
}

#[test]
fn from_env_arms_and_selects() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    // Environment changes are serialised by `serial()`; no other test of
    // this binary reads these variables.
    std::env::remove_var("TAPTREE_OUT");
    assert!(Capture::from_env(vec![], RunInfo::default())
        .unwrap()
        .is_none());
    std::env::set_var("TAPTREE_OUT", &out);
    std::env::set_var("TAPTREE_SELECT", "layer=0");
    let cap = Capture::from_env(vec![], RunInfo::default())
        .unwrap()
        .unwrap();
    forward(0.0);
    assert_eq!(cap.finish().unwrap().taps, 2);
    std::env::set_var("TAPTREE_SELECT", "layer=zero");
    let err = Capture::from_env(vec![], RunInfo::default()).err().unwrap();
    assert!(err.to_string().contains("\"zero\""), "{err}");
    std::env::remove_var("TAPTREE_OUT");
    std::env::remove_var("TAPTREE_SELECT");
}

#[test]
fn a_replaced_tree_half_deleted_by_a_killed_capture_is_cleaned_up() {
    // The old tree's manifest and marker went first, then the kill: what
    // is left is no longer a tree, only tree-shaped files. The next capture
    // to the path cleans it up.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let x = dir.path().join("x");
    capture_tree(&x, "", 0.0);
    capture_tree(&out, "", 5.0);
    std::fs::remove_file(x.join("manifest.json")).unwrap();
    std::fs::remove_file(x.join(".taptree")).unwrap();
    std::fs::remove_dir_all(x.join("L000")).unwrap();
    let left_over = set_aside(&x, &out, "old", DEAD);
    // The same shape with a stranger's file inside is not ours: kept.
    let stranger = dir.path().join(format!(".t.taptree-new-{}", DEAD + 1));
    std::fs::create_dir_all(stranger.join("L000")).unwrap();
    std::fs::write(stranger.join("L000/notes.txt"), "mine").unwrap();

    let replaced = replace_tree(&out, 7.0);
    assert_eq!(TreeReader::open(&out).unwrap().root(), replaced.root);
    assert!(!left_over.exists());
    assert_eq!(
        listing(dir.path()),
        [
            format!(".t.taptree-new-{}", DEAD + 1),
            ".t.taptree-spare".into(),
            "t".to_string()
        ]
    );
}

#[cfg(unix)]
#[test]
fn a_second_capture_to_a_locked_path_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let before = capture_tree(&out, "", 0.0);
    // Another process's capture to `t` holds the lock.
    let lock_path = dir.path().join(".t.taptree-lock");
    let held = std::fs::File::create(&lock_path).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    std::fs::write(&lock_path, "held by process 4242\n").unwrap();
    let err = {
        let _guard = serial();
        let mut o = opts(&out, "");
        o.force = true;
        Capture::start(o).err().unwrap()
    };
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("held by process 4242"), "{err}");
    assert_eq!(TreeReader::open(&out).unwrap().root(), before.root);
    // Released: the capture runs, and leaves no lock file behind.
    drop(held);
    let after = replace_tree(&out, 3.0);
    assert_ne!(after.root, before.root);
    assert_eq!(listing(dir.path()), [".t.taptree-spare", "t"]);
}

#[test]
fn a_selection_that_matches_no_stage_names_the_stages() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    for (selection, says) in [
        (
            "stage=ffn_dwon",
            "stage \"ffn_dwon\" is not one of embedding, attn_norm, ffn_down",
        ),
        // Stages that exist, but no tap selected (a layer past the last).
        ("layer=90", "matched no tap of this run"),
    ] {
        let err = {
            let _guard = serial();
            let cap = Capture::start(opts(&out, selection)).unwrap();
            forward(0.0);
            cap.finish().unwrap_err()
        };
        let msg = err.to_string();
        assert!(matches!(err, Error::SelectsNothing { .. }), "{msg}");
        assert!(msg.contains(says), "{msg}");
        assert!(!out.exists(), "{selection}: no tree written");
    }
}

#[test]
fn absurd_layers_and_positions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let whole = std::fs::read(out.join("manifest.json")).unwrap();
    let edits: [fn(&mut serde_json::Value); 2] = [
        |m| m["entries"][0]["key"]["layer"] = u32::MAX.into(),
        |m| m["entries"][0]["key"]["pos"] = serde_json::json!({"start": 0, "end": u32::MAX}),
    ];
    for edit in edits {
        std::fs::write(out.join("manifest.json"), &whole).unwrap();
        edit_manifest(&out, edit);
        let err = TreeReader::open(&out).unwrap_err().to_string();
        assert!(err.contains("format's"), "{err}");
    }
}
