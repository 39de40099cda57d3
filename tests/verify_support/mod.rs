//! Helpers shared by the `verify_cli` tests and `verify_damage_cli`.
#![allow(dead_code, unused_imports)]

pub use capture::{Capture, CaptureOptions, RunInfo, Selection, StageSpec, TreeReader};
pub use std::path::{Path, PathBuf};
pub use std::process::{Command, Output};
pub use std::sync::Mutex;
pub use std::time::{Duration, Instant};

pub use crate::harness::{one_capture_at_a_time, taptree, text};

/// A small tree: 3 layers × 2 stages over 4 positions, plus logits.
/// `bump` changes one element of layer 2's `ffn_down`.
pub fn make_tree(out: &Path, bump: f32) -> capture::Summary {
    let _guard = one_capture_at_a_time();
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: false,
        stages: vec![
            StageSpec::layer("attn_norm", &[]),
            StageSpec::layer("ffn_down", &["attn_norm"]),
            StageSpec::global("logits", &[]),
        ],
        run: RunInfo {
            model: "toy".into(),
            backend: "test".into(),
            precision: "f32".into(),
            ..RunInfo::default()
        },
    })
    .unwrap();
    for layer in 0..3u32 {
        let x: Vec<f32> = (0..4 * 8)
            .map(|i| (i as f32 + layer as f32).sin())
            .collect();
        capture::tap("attn_norm", Some(layer), 0..4, None, &[4, 8], &x);
        let mut y: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
        if layer == 2 {
            y[9] += bump;
        }
        capture::tap("ffn_down", Some(layer), 0..4, None, &[4, 8], &y);
    }
    let logits: Vec<f32> = (0..4 * 16).map(|i| i as f32 / 7.0).collect();
    capture::tap("logits", None, 0..4, None, &[4, 16], &logits);
    cap.finish().unwrap()
}

pub fn two_trees(bump: f32) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    make_tree(&a, 0.0);
    make_tree(&b, bump);
    (dir, a, b)
}

pub fn flip_last_byte(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x20;
    std::fs::write(file, bytes).unwrap();
}

/// Edits a manifest as a writer would have written it: sealed again (its
/// `manifest_blake3` made to match), so that what is tested is the edit.
pub fn edit_manifest(tree: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = tree.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    let mut bytes = serde_json::to_vec(&m).unwrap();
    capture::manifest::seal(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    capture::index::rewrite(tree).unwrap();
}

/// Edits a manifest's fields as a hostile writer would: every hash redone
/// (the directory hashes and root from the entries, the seal, the index),
/// so that only what reads the entries' meaning can see the edit.
pub fn reseal_manifest(tree: &Path, edit: impl FnOnce(&mut capture::Manifest)) {
    capture::index::reseal_edited(tree, edit).unwrap();
}

/// Exit 2, and stderr names `file` and `problem`.
#[track_caller]
pub fn assert_refused(o: &Output, file: &str, problem: &str) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(2), "stdout: {out}\nstderr: {err}");
    assert!(err.contains(file), "stderr should name {file:?}: {err}");
    assert!(
        err.contains(problem),
        "stderr should say {problem:?}: {err}"
    );
    assert!(
        !out.contains("identical"),
        "a failure must not read as identical: {out}"
    );
}

// ---- ls --------------------------------------------------------------------
