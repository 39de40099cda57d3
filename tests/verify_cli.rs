//! `taptree ls` and `taptree verify`, end to end through the binary.
//!
//! Contents: listing; integrity of one tree (and files it does not list); the A/B oracle (identical,
//! changed, missing, JSON); a killed capture; the Python writer. Bad input
//! (missing trees, damaged files, unsafe paths, symlinks) is in
//! `verify_damage_cli.rs`.

use crate::verify_support::*;

#[test]
fn ls_lists_in_forward_order() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("t");
    let summary = make_tree(&tree, 0.0);
    let o = taptree(&[&"ls", &tree]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains(&format!(
        "7 taps, {} bytes, root {}",
        summary.bytes, summary.root
    )));
    let keys: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "L0/attn_norm@0..4",
            "L0/ffn_down@0..4",
            "L1/attn_norm@0..4",
            "L1/ffn_down@0..4",
            "L2/attn_norm@0..4",
            "L2/ffn_down@0..4",
            "logits@0..4"
        ]
    );
    let reader = TreeReader::open(&tree).unwrap();
    let first = &reader.entries()[0];
    assert!(lines[1].contains("F32") && lines[1].contains("[4, 8]"));
    assert!(lines[1].ends_with(&first.blake3[..12]));

    let o = taptree(&[
        &"ls",
        &"--json",
        &"--select",
        &"stage=ffn_*;layer=1..",
        &tree,
    ]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["root"], summary.root.as_str());
    let keys: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["L1/ffn_down@0..4", "L2/ffn_down@0..4"]);
    assert_eq!(v["entries"][0]["shape"], serde_json::json!([4, 8]));

    let o = taptree(&[&"ls", &"--select", &"lyr=1", &tree]);
    assert_refused(&o, "\"lyr\"", "unknown field");
}

// ---- verify TREE -------------------------------------------------------------

#[test]
fn verify_one_tree_rehashes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("t");
    let summary = make_tree(&tree, 0.0);
    let o = taptree(&[&"verify", &tree]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains(&format!(
            "ok: 7 tensors, {} bytes rehashed, root {}",
            summary.bytes, summary.root
        )),
        "{out}"
    );
    assert!(!out.contains("note:"), "{out}");

    // Files the manifest does not list are named, and are no failure.
    std::fs::write(tree.join("L001/attn_norm.p0-4.safetensors.bak"), b"x").unwrap();
    std::fs::write(tree.join("notes.txt"), b"x").unwrap();
    std::fs::create_dir(tree.join("L009")).unwrap();
    let o = taptree(&[&"verify", &tree]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains(
            "note: 3 files are not in the manifest (not part of the tree, not checked): \
             L001/attn_norm.p0-4.safetensors.bak, L009, notes.txt"
        ),
        "{out}"
    );
    let o = taptree(&[&"verify", &tree, &"--json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["unlisted"].as_array().unwrap().len(), 3, "{json}");

    let file = tree.join("L001/attn_norm.p0-4.safetensors");
    flip_last_byte(&file);
    assert_refused(
        &taptree(&[&"verify", &tree]),
        "L001/attn_norm.p0-4.safetensors",
        "integrity failure",
    );
}

// ---- verify A B --------------------------------------------------------------

#[test]
fn verify_identical_trees() {
    let (_dir, a, b) = two_trees(0.0);
    let root = TreeReader::open(&a).unwrap().root().to_string();
    for extra in [None, Some("--rehash")] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"verify"];
        if let Some(flag) = &extra {
            args.push(flag);
        }
        args.push(&a);
        args.push(&b);
        let o = taptree(&args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}{err}");
        let bytes = 3 * 2 * 4 * 8 * 4 + 4 * 16 * 4;
        assert!(
            out.starts_with(&format!(
                "bitwise identical: 7 tensors, {bytes} bytes, root {root}\n"
            )),
            "{out}"
        );
    }
}

#[test]
fn verify_names_the_first_differing_tap() {
    let (_dir, a, b) = two_trees(0.5);
    let o = taptree(&[&"verify", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("differ: 1 changed, 0 missing from B, 0 extra in B (3 of 4 layer directories identical, skipped)"), "{out}");
    assert!(
        out.contains("first difference in forward order: L2/ffn_down@0..4: tensor bytes differ"),
        "{out}"
    );
    assert!(out.contains("L002/ffn_down.p0-4.safetensors"), "{out}");

    let o = taptree(&[&"verify", &"--json", &a, &b]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["identical"], false);
    assert_eq!(v["first"]["key"], "L2/ffn_down@0..4");
    assert_eq!(v["first"]["kind"], "changed");
    assert_eq!(v["dirs_skipped"], 3);
}

#[test]
fn verify_counts_missing_and_extra_taps() {
    let (_dir, a, b) = two_trees(0.0);
    // Drop layer 1 from B's manifest (and its hash), as a capture that
    // stopped early or a narrower selection would.
    let reader = TreeReader::open(&b).unwrap();
    let kept: Vec<_> = reader
        .entries()
        .iter()
        .filter(|e| e.key.layer != Some(1))
        .cloned()
        .collect();
    let mut m = reader.manifest().clone();
    m.entries = kept.clone();
    let (dirs, root) = m.hashes();
    edit_manifest(&b, |m| {
        m["entries"] = serde_json::to_value(&kept).unwrap();
        m["dirs"] = serde_json::to_value(&dirs).unwrap();
        m["root"] = root.into();
        m["taps"] = kept.len().into();
        m["bytes"] = kept.iter().map(|e| e.bytes).sum::<u64>().into();
    });
    let o = taptree(&[&"verify", &a, &b]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("0 changed, 2 missing from B, 0 extra in B"),
        "{out}"
    );
    assert!(out.contains("L1/attn_norm@0..4: only in A"), "{out}");
    let o = taptree(&[&"verify", &b, &a]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("0 changed, 0 missing from B, 2 extra in B"),
        "{out}"
    );
    assert!(out.contains("L1/attn_norm@0..4: only in B"), "{out}");
}

#[test]
fn verify_trusts_manifests_unless_asked_to_rehash() {
    let (_dir, a, b) = two_trees(0.0);
    flip_last_byte(&b.join("L000/ffn_down.p0-4.safetensors"));
    let o = taptree(&[&"verify", &a, &b]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "trusted manifests read no tensor");
    assert!(
        out.contains("manifests trusted; --rehash rereads every tensor"),
        "{out}"
    );
    let o = taptree(&[&"verify", &"--rehash", &a, &b]);
    assert_refused(&o, "L000/ffn_down.p0-4.safetensors", "integrity failure");
    let help = taptree(&[&"verify", &"--help"]);
    assert!(text(&help).0.contains("manifests are trusted"));
}

// ---- bad input -----------------------------------------------------------------

#[test]
fn a_killed_capture_reads_as_incomplete_never_identical() {
    if std::env::var_os("TAPTREE_TEST_CHILD_OUT").is_some() {
        return; // the child has its own test, below
    }
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    make_tree(&good, 0.0);
    let out = dir.path().join("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "verify_cli::child_captures_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TAPTREE_TEST_CHILD_OUT", &out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once it has written tap files, mid-capture.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let written = std::fs::read_dir(out.join("L002"))
            .map(|d| d.count())
            .unwrap_or(0);
        if written > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the child never wrote a tap");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join("manifest.json").exists());
    assert_refused(&taptree(&[&"verify", &out]), "killed", "incomplete capture");
    assert_refused(
        &taptree(&[&"verify", &good, &out]),
        "killed",
        "incomplete capture",
    );
    assert_refused(
        &taptree(&[&"verify", &out, &good]),
        "killed",
        "incomplete capture",
    );
    assert_refused(&taptree(&[&"ls", &out]), "killed", "incomplete capture");
}

/// Run only as the child of the test above: captures forever.
#[test]
fn child_captures_until_killed() {
    let Some(out) = std::env::var_os("TAPTREE_TEST_CHILD_OUT") else {
        return;
    };
    let _cap = Capture::start(CaptureOptions {
        out: out.into(),
        selection: Selection::all(),
        force: false,
        stages: vec![],
        run: RunInfo::default(),
    })
    .unwrap();
    let x = vec![1.0f32; 4096];
    for pos in 0u32.. {
        for layer in 0..4 {
            capture::tap("ffn_down", Some(layer), pos..pos + 1, None, &[1, 4096], &x);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ---- the Python writer and reader ----------------------------------------------

/// python3 with numpy and blake3, or a printed reason to skip (a failure under CI).
fn python_with(modules: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let why = format!(
            "python3 with {modules} is not available (python3 -m pip install numpy blake3 xxhash)"
        );
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{why}; CI requires it");
        }
        eprintln!("skipping: {why}");
    }
    ok
}

#[test]
fn python_and_rust_write_the_same_tree() {
    if !python_with("numpy, blake3, xxhash") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rust = dir.path().join("rust");
    let py = dir.path().join("py");
    {
        let _guard = one_capture_at_a_time();
        let cap = Capture::start(CaptureOptions {
            out: rust.clone(),
            selection: Selection::all(),
            force: false,
            stages: vec![],
            run: RunInfo::default(),
        })
        .unwrap();
        for layer in 0..2u32 {
            let x: Vec<f32> = (0..4 * 8)
                .map(|i| i as f32 * 0.5 - 3.0 + layer as f32)
                .collect();
            capture::tap("attn_norm", Some(layer), 0..4, None, &[4, 8], &x);
        }
        let h: Vec<capture::half::f16> = (0..6)
            .map(|i| capture::half::f16::from_f32(i as f32 / 4.0))
            .collect();
        capture::tap("attn", Some(1), 4..5, None, &[1, 6], &h);
        capture::tap(
            "logits",
            None,
            3..4,
            Some(1),
            &[1, 5],
            &[-2i32, -1, 0, 1, 2],
        );
        cap.finish().unwrap();
    }
    let script = r#"
import sys, numpy as np
sys.path.insert(0, "python")
from taptree.tree import TreeWriter, open_tree, TreeError
py, rust = sys.argv[1:3]
with TreeWriter(py, run={"backend": "numpy"}) as w:
    for layer in range(2):
        x = np.arange(32, dtype=np.float32) * np.float32(0.5) - np.float32(3.0) + np.float32(layer)
        w.tap("attn_norm", layer, (0, 4), x.reshape(4, 8))
    w.tap("attn", 1, 4, (np.arange(6, dtype=np.float32) / 4).astype(np.float16).reshape(1, 6))
    w.tap("logits", None, range(3, 4), np.array([[-2, -1, 0, 1, 2]], dtype=np.int32), slot=1)
t = open_tree(rust)
assert t.verify() == 4
assert t.read(t.entries[1]).tolist()[0][:3] == [-2.0, -1.5, -1.0], t.read(t.entries[1])
assert t.read(t.entries[3]).tolist() == [[-2, -1, 0, 1, 2]]
try:
    TreeWriter(py)
    raise SystemExit("an existing tree was overwritten without force")
except TreeError as e:
    assert "already holds a tree" in str(e), e
print("python ok")
"#;
    let out = Command::new("python3")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("-c")
        .arg(script)
        .arg(&py)
        .arg(&rust)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "python failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("python ok"));

    let root = TreeReader::open(&rust).unwrap().root().to_string();
    assert_eq!(
        TreeReader::open(&py).unwrap().root(),
        root,
        "same tensors, same root"
    );
    let o = taptree(&[&"verify", &py]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    // Python's index is the one Rust builds from the same manifest bytes.
    let json = std::fs::read(py.join("manifest.json")).unwrap();
    let m: capture::Manifest = serde_json::from_slice(&json).unwrap();
    assert_eq!(m.format_version, capture::FORMAT_VERSION);
    assert_eq!(
        capture::index::build(&json, &m).unwrap(),
        std::fs::read(py.join(capture::index::INDEX_FILE)).unwrap()
    );
    for args in [vec!["verify"], vec!["verify", "--rehash"]] {
        let mut argv: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
        argv.push(&rust);
        argv.push(&py);
        let o = taptree(&argv);
        let (stdout, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{stdout}{stderr}");
        assert!(
            stdout.starts_with(&format!(
                "bitwise identical: 4 tensors, 288 bytes, root {root}"
            )),
            "{stdout}"
        );
    }
}

#[test]
fn ls_into_a_closed_pipe_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("big");
    {
        let _guard = one_capture_at_a_time();
        let cap = Capture::start(CaptureOptions {
            out: tree.clone(),
            selection: Selection::all(),
            force: false,
            stages: vec![],
            run: RunInfo::default(),
        })
        .unwrap();
        // Far more listing than a pipe buffers (64 KiB).
        for pos in 0..3000u32 {
            capture::tap(
                "post_ffn_residual",
                Some(pos % 30),
                pos..pos + 1,
                None,
                &[1, 1],
                &[pos as f32],
            );
        }
        cap.finish().unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_taptree"))
        .arg("ls")
        .arg(&tree)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}
