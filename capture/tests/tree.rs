//! Capture a tree, read it back, and damage it in every way the format must
//! catch. Captures are process-global, so tests that arm take `serial()`.

// With `compile-out` nothing is ever tapped; these tests need real taps.
#![cfg(not(feature = "compile-out"))]

use capture::{
    compare, Capture, CaptureOptions, DType, Difference, Error, RunInfo, Selection, StageSpec,
    TreeReader,
};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn opts(out: &Path, selection: &str) -> CaptureOptions {
    CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::parse(selection).unwrap(),
        force: false,
        stages: vec![
            StageSpec::global("embedding", &[]),
            StageSpec::layer("attn_norm", &[]),
            StageSpec::layer("ffn_down", &["attn_norm"]),
            StageSpec::global("logits", &[]),
        ],
        run: RunInfo {
            model: "toy".into(),
            ..RunInfo::default()
        },
    }
}

/// A small forward: 2 layers, 3 positions in one batch, a few dtypes.
/// `bump` changes one value of layer 1's ffn_down.
fn forward(bump: f32) {
    let rows = 3usize;
    let width = 5usize;
    let act =
        |seed: f32| -> Vec<f32> { (0..rows * width).map(|i| seed + i as f32 * 0.25).collect() };
    capture::tap("embedding", None, 0..3, None, &[rows, width], &act(0.0));
    for layer in 0..2u32 {
        capture::tap(
            "attn_norm",
            Some(layer),
            0..3,
            None,
            &[rows, width],
            &act(layer as f32),
        );
        let mut down = act(10.0 + layer as f32);
        if layer == 1 {
            down[7] += bump;
        }
        capture::tap("ffn_down", Some(layer), 0..3, None, &[rows, width], &down);
    }
    let logits: Vec<half::bf16> = (0..rows * 4)
        .map(|i| half::bf16::from_f32(i as f32))
        .collect();
    capture::tap("logits", None, 0..3, None, &[rows, 4], &logits);
}

fn capture_tree(out: &Path, selection: &str, bump: f32) -> capture::Summary {
    let _guard = serial();
    let cap = Capture::start(opts(out, selection)).unwrap();
    forward(bump);
    cap.finish().unwrap()
}

/// A forced capture of everything: replaces the tree at `out`.
fn replace_tree(out: &Path, bump: f32) -> capture::Summary {
    let _guard = serial();
    let mut o = opts(out, "");
    o.force = true;
    let cap = Capture::start(o).unwrap();
    forward(bump);
    cap.finish().unwrap()
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

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
    // A forced capture that finishes replaces it, and leaves nothing beside it.
    let new = replace_tree(&out, 5.0);
    assert_ne!(new.root, old.root);
    assert_eq!(TreeReader::open(&out).unwrap().root(), new.root);
    assert_eq!(listing(dir.path()), ["t"]);
}

/// `tree` moved to where a capture of process `pid` replacing `out` puts
/// the tree it replaces (`old`) or the one it writes (`new`).
fn set_aside(tree: &Path, out: &Path, what: &str, pid: u32) -> PathBuf {
    let name = out.file_name().unwrap().to_str().unwrap();
    let to = out.with_file_name(format!(".{name}.taptree-{what}-{pid}"));
    std::fs::rename(tree, &to).unwrap();
    to
}

/// No process has this id (Linux's largest `pid_max` is 2^22).
const DEAD: u32 = (1 << 22) + 1;

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
        [format!(".t.taptree-old-{}", DEAD + 1), "t".to_string()]
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

// ---- reading damaged trees -------------------------------------------------

fn fresh_tree(dir: &Path) -> PathBuf {
    let out = dir.join("t");
    capture_tree(&out, "", 0.0);
    out
}

/// Edits a manifest as a writer would have written it: sealed again (its
/// `manifest_blake3` made to match), so that what is tested is the edit.
fn edit_manifest(tree: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = tree.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    let mut bytes = serde_json::to_vec(&m).unwrap();
    capture::manifest::seal(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    capture::index::rewrite(tree).unwrap();
}

#[test]
fn a_flipped_byte_is_an_integrity_failure_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let file = out.join("L001/ffn_down.p0-3.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&file, bytes).unwrap();
    let tree = TreeReader::open(&out).unwrap();
    let err = tree.verify().unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.starts_with(&file.display().to_string()), "{msg}");
    assert!(msg.contains("integrity failure"), "{msg}");
}

#[test]
fn truncated_and_foreign_tap_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let file = out.join("L000/attn_norm.p0-3.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
    let tree = TreeReader::open(&out).unwrap();
    for err in [
        tree.verify().unwrap_err(),
        tree.read(&tree.entries()[1]).unwrap_err(),
    ] {
        assert!(matches!(err, Error::CorruptTap { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("attn_norm.p0-3.safetensors: truncated"),
            "{err}"
        );
    }
    std::fs::write(&file, b"#!/bin/sh\necho this is not a tensor\n").unwrap();
    let err = tree.verify().unwrap_err();
    assert!(err.to_string().contains("not a safetensors file"), "{err}");
    // A valid tap file holding another key is caught too.
    std::fs::copy(out.join("L000/ffn_down.p0-3.safetensors"), &file).unwrap();
    let err = tree.verify().unwrap_err();
    assert!(
        err.to_string().contains("file and manifest disagree"),
        "{err}"
    );
}

#[test]
fn unsafe_manifest_paths_are_refused() {
    for (bad, expect) in [
        ("/etc/passwd", "absolute"),
        ("L000/../../outside.safetensors", "escapes"),
        ("../t/L000/attn_norm.p0-3.safetensors", "escapes"),
        ("L001/attn_norm.p0-3.safetensors", "expected L000/"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = fresh_tree(dir.path());
        edit_manifest(&out, |m| m["entries"][1]["path"] = bad.into());
        let err = TreeReader::open(&out).unwrap_err();
        assert!(matches!(err, Error::UnsafePath { .. }), "{bad}: {err}");
        assert!(err.to_string().contains(expect), "{bad}: {err}");
    }
}

#[test]
fn a_symlink_out_of_the_tree_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let outside = dir.path().join("outside.safetensors");
    let file = out.join("L000/attn_norm.p0-3.safetensors");
    std::fs::rename(&file, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &file).unwrap();
    let tree = TreeReader::open(&out).unwrap();
    for err in [
        tree.verify().unwrap_err(),
        tree.read(&tree.entries()[1]).unwrap_err(),
    ] {
        assert!(matches!(err, Error::UnsafePath { .. }), "{err}");
        assert!(err.to_string().contains("outside the tree"), "{err}");
    }
    // A link that stays inside the tree is fine.
    std::fs::remove_file(&file).unwrap();
    std::fs::rename(&outside, out.join("L000/real.safetensors")).unwrap();
    std::os::unix::fs::symlink("real.safetensors", &file).unwrap();
    tree.verify().unwrap();
}

#[test]
fn bad_shapes_in_the_manifest_are_refused() {
    for (shape, bytes, expect) in [
        (serde_json::json!([3, usize::MAX]), 60u64, "overflows"),
        (serde_json::json!([3, 6]), 60, "are 72 bytes, entry says 60"),
        (serde_json::json!([2, 5]), 40, "axis 0"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = fresh_tree(dir.path());
        edit_manifest(&out, |m| {
            m["entries"][1]["shape"] = shape.clone();
            m["entries"][1]["bytes"] = bytes.into();
        });
        let err = TreeReader::open(&out).unwrap_err();
        assert!(matches!(err, Error::BadShape { .. }), "{err}");
        assert!(err.to_string().contains(expect), "{err}");
        assert!(err.to_string().contains("manifest.json"), "{err}");
    }
}

#[test]
fn an_edited_manifest_does_not_match_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    edit_manifest(&out, |m| {
        m["entries"][1]["blake3"] = "00".repeat(32).into();
    });
    let err = TreeReader::open(&out).unwrap_err();
    assert!(
        err.to_string().contains("does not match its entries"),
        "{err}"
    );
}

#[test]
fn unknown_major_versions_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    edit_manifest(&out, |m| m["format_version"] = "3.0".into());
    let err = TreeReader::open(&out).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnsupportedVersion { .. }));
    assert!(msg.contains("3.0") && msg.contains("1.x to 2.x"), "{msg}");
    // A newer minor version with fields this reader does not know is read.
    edit_manifest(&out, |m| {
        m["format_version"] = "2.7".into();
        m["future_field"] = serde_json::json!({"x": 1});
    });
    TreeReader::open(&out).unwrap();
    std::fs::write(out.join("manifest.json"), b"{\"format\": \"taptree\", ").unwrap();
    let err = TreeReader::open(&out).unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
}

#[test]
fn empty_and_missing_directories() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        TreeReader::open(dir.path()).unwrap_err(),
        Error::EmptyDir { .. }
    ));
    let err = TreeReader::open(dir.path().join("nope")).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

// ---- comparing ---------------------------------------------------------------

#[test]
fn compare_names_the_first_difference_in_forward_order() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    let c = dir.path().join("c");
    let d = dir.path().join("d");
    capture_tree(&a, "", 0.0);
    capture_tree(&b, "", 0.0);
    capture_tree(&c, "", 1.0);
    capture_tree(&d, "layer=0,none", 0.0);
    let open = |p: &Path| TreeReader::open(p).unwrap();

    let same = compare(&open(&a), &open(&b));
    assert!(same.identical && same.first.is_none());
    assert_eq!(same.dirs_skipped, 3);

    let changed = compare(&open(&a), &open(&c));
    assert!(!changed.identical);
    assert_eq!((changed.changed, changed.missing, changed.extra), (1, 0, 0));
    assert_eq!(
        changed.dirs_skipped, 2,
        "L000 and global are skipped unread"
    );
    match changed.first.unwrap() {
        Difference::Changed { a, b } => {
            assert_eq!(a.key.to_string(), "L1/ffn_down@0..3");
            assert_ne!(a.blake3, b.blake3);
        }
        other => panic!("{other:?}"),
    }

    let missing = compare(&open(&a), &open(&d));
    assert_eq!((missing.changed, missing.missing, missing.extra), (0, 2, 0));
    assert!(
        matches!(&missing.first, Some(Difference::Missing(e)) if e.key.to_string() == "L1/attn_norm@0..3")
    );
    let extra = compare(&open(&d), &open(&a));
    assert_eq!((extra.changed, extra.missing, extra.extra), (0, 0, 2));
    assert!(
        matches!(&extra.first, Some(Difference::Extra(e)) if e.key.to_string() == "L1/attn_norm@0..3")
    );
}

#[test]
fn the_head_is_read_from_the_first_bytes_and_agrees_with_the_entries() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let full = TreeReader::open(&out).unwrap();
    let head = TreeReader::head(&out).unwrap();
    assert_eq!(head.root, full.root());
    assert_eq!(head.taps, 6);
    assert_eq!(head.bytes, full.manifest().bytes_of_entries());
    assert_eq!(head.format_version, capture::FORMAT_VERSION);
    let raw = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    let end_of_head = raw.find("\"run\"").unwrap();
    assert!(
        raw[..end_of_head].contains("\"bytes\""),
        "{}",
        &raw[..end_of_head]
    );
    assert!(end_of_head < 256, "the head comes first");
    // A manifest cut short is refused, not trusted for its head.
    let manifest = out.join("manifest.json");
    let whole = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &whole[..whole.len() / 2]).unwrap();
    let err = TreeReader::head(&out).unwrap_err();
    assert!(err.to_string().contains("edited or damaged"), "{err}");
    std::fs::write(&manifest, &whole).unwrap();
    // Another writer's field order (here: alphabetical) is read in full.
    edit_manifest(&out, |_| {});
    assert!(std::fs::read_to_string(out.join("manifest.json"))
        .unwrap()
        .starts_with("{\"bytes\""));
    assert_eq!(TreeReader::head(&out).unwrap(), head);
    // Counts that disagree with the entries are refused.
    edit_manifest(&out, |m| m["taps"] = 5.into());
    let err = TreeReader::open(&out).unwrap_err();
    assert!(err.to_string().contains("its head says 5 taps"), "{err}");
    // An incomplete tree has no head either.
    std::fs::remove_file(out.join("manifest.json")).unwrap();
    assert!(matches!(
        TreeReader::head(&out),
        Err(Error::Incomplete { .. })
    ));
}

#[test]
fn a_flipped_byte_in_a_tap_header_is_an_integrity_failure() {
    // Not only the fields the reader checks (key, dtype, shape, offsets):
    // every header byte, so that what passes is always readable by safetensors.
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let file = out.join("L001/ffn_down.p0-3.safetensors");
    let whole = std::fs::read(&file).unwrap();
    let header = String::from_utf8_lossy(&whole[8..]).into_owned();
    for field in ["taptree.key", "taptree.format", "__metadata__"] {
        let at = 8 + header.find(field).unwrap() + 2;
        for (flip, what) in [(0x01u8, "a letter"), (0x80, "invalid UTF-8")] {
            let mut bytes = whole.clone();
            bytes[at] ^= flip;
            std::fs::write(&file, &bytes).unwrap();
            let tree = TreeReader::open(&out).unwrap();
            let err = tree.verify().unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&file.display().to_string()),
                "{field}, {what}: {msg}"
            );
            let entry = &tree.entries()[tree
                .entries()
                .iter()
                .position(|e| file.ends_with(&e.path))
                .unwrap()];
            assert!(tree.read(entry).is_err(), "{field}, {what}: read");
        }
    }
    std::fs::write(&file, &whole).unwrap();
    TreeReader::open(&out).unwrap().verify().unwrap();
}

#[test]
fn a_manifest_cut_after_a_closing_brace_is_refused_by_its_head() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let manifest = out.join("manifest.json");
    let whole = std::fs::read(&manifest).unwrap();
    let mut cuts = 0;
    for (i, &c) in whole.iter().enumerate() {
        if c == b'}' && i + 1 < whole.len() - 2 {
            std::fs::write(&manifest, &whole[..=i]).unwrap();
            let err = TreeReader::head(&out).unwrap_err();
            assert!(
                matches!(err, Error::BadManifest { .. }),
                "cut at {i}: {err}"
            );
            assert!(TreeReader::open(&out).is_err(), "cut at {i}");
            cuts += 1;
        }
    }
    assert!(cuts > 6, "{cuts}");
    // A byte flipped where nothing parses it either (the host name).
    let text = String::from_utf8(whole.clone()).unwrap();
    let mut flipped = whole.clone();
    flipped[text.find("\"host\"").unwrap() + 1] ^= 0x01;
    std::fs::write(&manifest, &flipped).unwrap();
    let err = TreeReader::head(&out).unwrap_err();
    assert!(err.to_string().contains("edited or damaged"), "{err}");
    std::fs::write(&manifest, &whole).unwrap();
    TreeReader::head(&out).unwrap();
}

#[test]
fn editing_what_steers_a_verdict_breaks_the_root() {
    // Stage graph (origin or inherited), run (tokens, precision, switches),
    // selection: edited, even with the manifest's own hash made to match,
    // the root no longer matches.
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let whole = std::fs::read(out.join("manifest.json")).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 5] = [
        ("stages", |m| m["stages"] = serde_json::json!([])),
        ("tokens", |m| {
            m["run"]["prompt_tokens"] = serde_json::json!([9, 9])
        }),
        ("precision", |m| m["run"]["precision"] = "q8".into()),
        ("switches", |m| {
            m["run"]["switches"] = serde_json::json!({"x": "1"})
        }),
        ("selection", |m| m["selection"] = "stage=q_proj".into()),
    ];
    for (what, edit) in edits {
        std::fs::write(out.join("manifest.json"), &whole).unwrap();
        edit_manifest(&out, edit);
        let err = TreeReader::open(&out).unwrap_err();
        assert!(
            err.to_string().contains("does not match its entries"),
            "{what}: {err}"
        );
    }
    // What does not steer a verdict may change.
    std::fs::write(out.join("manifest.json"), &whole).unwrap();
    edit_manifest(&out, |m| m["run"]["host"] = "elsewhere".into());
    TreeReader::open(&out).unwrap();
}

#[test]
fn format_1_trees_are_still_read() {
    // Written by taptree before format 2 (hashes in capture order, no
    // header or manifest hashes): fixtures/format1/.
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/format1/tiny-f32-f32");
    let tree = TreeReader::open(&old).unwrap();
    assert_eq!(tree.manifest().format_version, "1.0");
    assert!(tree.entries().iter().all(|e| e.header_blake3.is_none()));
    tree.verify().unwrap();
    assert_eq!(TreeReader::head(&old).unwrap().root, tree.root());
    // Its tensors are the ones the current golden tree holds.
    let new = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden/tiny-f32-f32");
    let new = TreeReader::open(&new).unwrap();
    // The golden trees are format 2.0 (no index), read as 2.0 was.
    assert_eq!(new.manifest().format_version, "2.0");
    assert_ne!(new.root(), tree.root());
    let hashes = |t: &TreeReader| {
        let mut v: Vec<_> = t
            .entries()
            .iter()
            .map(|e| (e.key.to_string(), e.blake3.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(hashes(&new), hashes(&tree));
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
        [format!(".t.taptree-new-{}", DEAD + 1), "t".to_string()]
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
    assert_eq!(listing(dir.path()), ["t".to_string()]);
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

#[cfg(unix)]
#[test]
fn a_fifo_or_device_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let out = fresh_tree(dir.path());
    let tap = out.join("L001/ffn_down.p0-3.safetensors");
    std::fs::remove_file(&tap).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(&tap)
        .status()
        .unwrap();
    assert!(status.success());
    let tree = TreeReader::open(&out).unwrap();
    let err = tree.verify().unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
    // A manifest that is a device, or a link out of the tree.
    std::fs::remove_file(out.join("manifest.json")).unwrap();
    std::os::unix::fs::symlink("/dev/urandom", out.join("manifest.json")).unwrap();
    let err = TreeReader::open(&out).unwrap_err().to_string();
    assert!(err.contains("outside the tree"), "{err}");
    let elsewhere = dir.path().join("elsewhere.json");
    std::fs::write(&elsewhere, "{}").unwrap();
    std::fs::remove_file(out.join("manifest.json")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("manifest.json")).unwrap();
    let err = TreeReader::head(&out).unwrap_err().to_string();
    assert!(err.contains("outside the tree"), "{err}");
    std::fs::remove_file(out.join("manifest.json")).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(out.join("manifest.json"))
        .status()
        .unwrap();
    assert!(status.success());
    let err = TreeReader::head(&out).unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
}
