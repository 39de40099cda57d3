//! `taptree verify` on bad input, end to end: a missing tree, damaged tap
//! files, a damaged manifest under trusted verify, unsafe manifest paths and
//! an escaping symlink, each exiting 2 and naming the file and the problem.

use crate::verify_support::*;

#[test]
fn missing_tree_and_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = (dir.path().join("a"), ());
    make_tree(&a, 0.0);
    assert_refused(
        &taptree(&[&"verify", &a, &dir.path().join("nope")]),
        "nope",
        "No such file",
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_refused(&taptree(&[&"verify", &empty]), "empty", "not a tree");
}

#[test]
fn damaged_tap_files_are_named() {
    type Damage = fn(&Path);
    let cases: [(&str, Damage, &str); 3] = [
        (
            "truncated",
            |f| {
                let b = std::fs::read(f).unwrap();
                std::fs::write(f, &b[..b.len() - 4]).unwrap();
            },
            "truncated",
        ),
        (
            "not safetensors",
            |f| std::fs::write(f, b"PK\x03\x04 a zip file").unwrap(),
            "not a safetensors file",
        ),
        ("empty", |f| std::fs::write(f, b"").unwrap(), "truncated"),
    ];
    for (name, damage, problem) in cases {
        let (_dir, a, b) = two_trees(0.0);
        let file = b.join("L001/ffn_down.p0-4.safetensors");
        damage(&file);
        let rel = "L001/ffn_down.p0-4.safetensors";
        assert_refused(&taptree(&[&"verify", &b]), rel, problem);
        assert_refused(&taptree(&[&"verify", &"--rehash", &a, &b]), rel, problem);
        let _ = name;
    }
}

#[test]
fn trusted_verify_refuses_a_damaged_manifest() {
    // Trusted mode reads the roots from the heads, but a manifest cut right
    // after a `}` (its head intact), or with a byte flipped in a field
    // nothing else hashes, is damaged: exit 2, never "bitwise identical".
    let (_dir, a, b) = two_trees(0.0);
    let manifest = b.join("manifest.json");
    let whole = std::fs::read(&manifest).unwrap();
    let braces: Vec<usize> = (0..whole.len() - 2).filter(|&i| whole[i] == b'}').collect();
    for &i in [
        braces[0],
        braces[braces.len() / 2],
        braces[braces.len() - 1],
    ]
    .iter()
    {
        std::fs::write(&manifest, &whole[..=i]).unwrap();
        assert_refused(&taptree(&[&"verify", &a, &b]), "manifest.json", "damaged");
    }
    let mut flipped = whole.clone();
    let at = String::from_utf8_lossy(&whole).find("\"argv\"").unwrap() + 2;
    flipped[at] ^= 0x20;
    std::fs::write(&manifest, &flipped).unwrap();
    assert_refused(&taptree(&[&"verify", &a, &b]), "manifest.json", "damaged");
    std::fs::write(&manifest, b"not json at all").unwrap();
    let o = taptree(&[&"verify", &a, &b]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    // One byte changed in place inside the entry list, the size kept: the
    // manifest no longer parses, and the trusted path must see it.
    let mut broken = whole.clone();
    let at = String::from_utf8_lossy(&whole)
        .rfind("\"entries\":[")
        .unwrap()
        + 11;
    assert_eq!(broken[at], b'{');
    broken[at] = b'x';
    assert!(serde_json::from_slice::<serde_json::Value>(&broken).is_err());
    std::fs::write(&manifest, &broken).unwrap();
    assert_refused(&taptree(&[&"verify", &a, &b]), "manifest.json", "damaged");
    // Intact again: trusted.
    std::fs::write(&manifest, &whole).unwrap();
    let o = taptree(&[&"verify", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
}

#[test]
fn unsafe_manifests_are_refused() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &str); 5] = [
        (
            |m| m["entries"][0]["path"] = "/etc/passwd".into(),
            "absolute",
        ),
        (
            |m| m["entries"][0]["path"] = "L000/../../../x.safetensors".into(),
            "escapes the tree",
        ),
        (
            |m| {
                m["entries"][0]["shape"] = serde_json::json!([4, usize::MAX]);
            },
            "overflows",
        ),
        (
            |m| m["entries"][0]["bytes"] = 12345.into(),
            "entry says 12345",
        ),
        (
            |m| m["format_version"] = "3.1".into(),
            "unsupported tree format version 3.1 (this taptree reads 1.x to 2.x)",
        ),
    ];
    for (edit, problem) in cases {
        let (_dir, a, b) = two_trees(0.0);
        edit_manifest(&b, edit);
        assert_refused(&taptree(&[&"verify", &b]), "manifest", problem);
        assert_refused(
            &taptree(&[&"verify", &"--rehash", &a, &b]),
            "manifest",
            problem,
        );
        assert_refused(&taptree(&[&"ls", &b]), "manifest", problem);
    }
}

#[test]
fn a_newer_minor_version_is_refused_as_newer_not_damaged() {
    let (_dir, a, b) = two_trees(0.0);
    edit_manifest(&b, |m| m["format_version"] = "2.4".into());
    let problem = "written by a newer taptree (format 2.4); this taptree reads up to 2.3";
    assert_refused(&taptree(&[&"verify", &a, &b]), "manifest", problem);
    assert_refused(&taptree(&[&"verify", &b]), "manifest", problem);
    assert_refused(
        &taptree(&[&"verify", &"--rehash", &a, &b]),
        "manifest",
        problem,
    );
    assert_refused(&taptree(&[&"ls", &b]), "manifest", problem);
}

#[test]
fn a_symlink_out_of_the_tree_is_refused() {
    let (dir, a, b) = two_trees(0.0);
    let file = b.join("L000/attn_norm.p0-4.safetensors");
    let outside = dir.path().join("elsewhere.safetensors");
    std::fs::rename(&file, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &file).unwrap();
    assert_refused(
        &taptree(&[&"verify", &b]),
        "L000/attn_norm.p0-4.safetensors",
        "outside the tree",
    );
    assert_refused(
        &taptree(&[&"verify", &"--rehash", &a, &b]),
        "L000/attn_norm.p0-4.safetensors",
        "outside the tree",
    );
}

/// Every tap equal, but the runs fed other prompts, run at another
/// precision, with other switches or selection, or another stage graph:
/// what enters the root beside the taps differs, so the trees are not
/// identical (exit 1, naming what differs), however the hashes were redone.
#[test]
fn trees_whose_runs_differ_are_not_identical_however_equal_their_taps() {
    type Edit = fn(&mut capture::Manifest);
    let cases: [(Edit, &str); 5] = [
        (|m| m.run.prompt_tokens = vec![1, 2, 3], "prompt tokens"),
        (|m| m.run.precision = "q8".into(), "precision"),
        (
            |m| {
                m.run
                    .switches
                    .insert("TAPTREE_ACT_ATTN".into(), "f64".into());
            },
            "switches",
        ),
        (|m| m.selection = "layer=0..3".into(), "selection"),
        (
            |m| m.stages[1].inputs = vec!["logits".into()],
            "stage vocabulary",
        ),
    ];
    for (edit, what) in cases {
        let (_dir, a, b) = two_trees(0.0);
        reseal_manifest(&b, edit);
        let trusted = taptree(&[&"verify", &a, &b]);
        let rehashed = taptree(&[&"verify", &"--rehash", &a, &b]);
        for o in [trusted, rehashed] {
            let (out, err) = text(&o);
            assert_eq!(o.status.code(), Some(1), "{what}: {out}{err}");
            assert!(
                out.contains(&format!("every tap equal, but not the runs' {what}")),
                "{what}: {out}"
            );
            assert!(!out.contains("identical"), "{what}: {out}");
        }
        let o = taptree(&[&"verify", &"--json", &a, &b]);
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(o.status.code(), Some(1), "{what}: {report}");
        assert_eq!(report["identical"], false, "{what}");
        assert_eq!(report["inputs_differ"], what, "{what}");
    }
    // The control: resealed without an edit, the trees are identical.
    let (_dir, a, b) = two_trees(0.0);
    reseal_manifest(&b, |_| {});
    let o = taptree(&[&"verify", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
}

/// A stage name no writer writes (`[A-Za-z0-9_.-]`, at most 128 bytes, not
/// starting with `.`), every hash redone, is refused where the tree is
/// opened whatever its format: from a 2.3 tree's index as before, and now
/// from the JSON entries of a 2.0 (or 2.2) tree too, naming the manifest.
#[test]
fn a_stage_name_no_writer_writes_is_refused_in_every_format() {
    let long = "x".repeat(129);
    for name in ["", "a b", ".hidden", "x\ty", long.as_str()] {
        for version in ["2.0", "2.3"] {
            let (_dir, a, b) = two_trees(0.0);
            reseal_manifest(&b, |m| {
                m.format_version = version.into();
                m.entries[0].key.stage = name.into();
            });
            let file = match version {
                "2.0" => "manifest.json",
                _ => "manifest.idx",
            };
            assert_refused(&taptree(&[&"ls", &b]), file, "stage name");
            assert_refused(&taptree(&[&"verify", &a, &b]), file, "stage name");
        }
    }
}
