//! Read back trees damaged in every way the format must catch: flipped,
//! truncated and foreign tap files, unsafe paths and links, edited
//! manifests and heads, unknown versions, format 1 trees, special files;
//! and compare two trees, naming the first difference.

// With `compile-out` nothing is ever tapped; these tests need real taps.
#![cfg(not(feature = "compile-out"))]

mod tree_support;
use tree_support::*;

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
    // A newer minor version of the major it knows is refused as newer (its
    // index may follow rules this reader does not check), not as damaged,
    // by the full open and by trusted verify's head alike.
    edit_manifest(&out, |m| {
        m["format_version"] = "2.7".into();
        m["future_field"] = serde_json::json!({"x": 1});
    });
    for err in [
        TreeReader::open(&out).unwrap_err(),
        TreeReader::head(&out).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(matches!(err, Error::NewerVersion { .. }), "{msg}");
        assert!(
            msg.contains("written by a newer taptree (format 2.7); this taptree reads up to 2.3"),
            "{msg}"
        );
    }
    // The versions it writes are read.
    for version in ["2.3", "2.1"] {
        edit_manifest(&out, |m| {
            m["format_version"] = version.into();
            m.as_object_mut().unwrap().remove("future_field");
        });
        TreeReader::open(&out).unwrap();
        TreeReader::head(&out).unwrap();
    }
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
