//! `taptree capture --tp N` and `taptree diff` of tensor-parallel trees, on
//! the fixture models (and SmolLM2 where it is cached or under CI): the
//! split forward against the one-device forward, the planted all-reduce
//! fault, and shards that do not tile (missing, overlapping).

use std::path::Path;
use std::process::{Command, Output};

use capture::{Capture, CaptureOptions, RunInfo, Selection, Shard, StageSpec, TapId};
use serde_json::Value;

use crate::harness::{one_capture_at_a_time, row_name, smollm2};

/// Environment variables set for a run.
type Env = [(&'static str, &'static str)];
/// A shard of `sharded_tree`: rank, first column, one past the last.
type Placed = (u32, u32, u32);

fn taptree() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_taptree"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TAPTREE_") {
            c.env_remove(k);
        }
    }
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Captures `model` with `--tp tp` into `out` (with `env` set); the output.
fn capture(model: &str, out: &Path, tp: usize, env: &[(&str, &str)]) -> String {
    let o = taptree()
        .args([
            "capture",
            "--model",
            model,
            "--prompt",
            "hello tensor parallel",
        ])
        .args(["--gen", "3", "--tp", &tp.to_string(), "--out"])
        .arg(out)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    text(&o)
}

/// `taptree diff --json A B`: exit code and report.
fn diff(a: &Path, b: &Path) -> (i32, Value, String) {
    let o = taptree()
        .args(["diff", "--json"])
        .args([a, b])
        .output()
        .unwrap();
    let report = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap(), report, text(&o))
}

fn first_divergence(report: &Value) -> Option<String> {
    let i = report["first_divergence"].as_u64()?;
    Some(row_name(&report["rows"][i as usize]))
}

fn notes(report: &Value) -> String {
    report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn status(report: &Value, row: &str) -> String {
    let r = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| row_name(r) == row)
        .unwrap_or_else(|| panic!("no row {row}"));
    r["status"].as_str().unwrap().to_string()
}

#[test]
fn tp_2_3_4_agree_with_tp_1_and_column_parallel_shards_are_bitwise() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-f32", d.path()).unwrap();
    let model = model.to_str().unwrap();
    let one = d.path().join("tp1");
    capture(model, &one, 1, &[]);
    for tp in [2, 3, 4] {
        let tree = d.path().join(format!("tp{tp}"));
        capture(model, &tree, tp, &[]);
        let (code, report, out) = diff(&tree, &one);
        assert_eq!(code, 0, "--tp {tp}: {out}");
        for row in [
            "L0/q_proj",
            "L0/k_proj",
            "L0/v_proj",
            "L0/q_rope",
            "L0/attn",
        ] {
            assert_eq!(status(&report, row), "equal", "--tp {tp} {row}: {out}");
        }
        assert!(
            notes(&report).contains(&format!("A tp {tp}, B tp 1")),
            "{out}"
        );
    }
}

#[test]
fn tp_1_is_the_one_device_forward_byte_for_byte() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-q", d.path()).unwrap();
    let model = model.to_str().unwrap();
    let (a, b) = (d.path().join("plain"), d.path().join("tp1"));
    let o = taptree()
        .args([
            "capture",
            "--model",
            model,
            "--prompt",
            "hello tensor parallel",
        ])
        .args(["--gen", "3", "--out"])
        .arg(&a)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    capture(model, &b, 1, &[]);
    let (ma, mb) = (
        std::fs::read(a.join("manifest.json")).unwrap(),
        std::fs::read(b.join("manifest.json")).unwrap(),
    );
    let root = |m: &[u8]| serde_json::from_slice::<Value>(m).unwrap()["root"].clone();
    assert_eq!(root(&ma), root(&mb));
    assert!(!String::from_utf8_lossy(&mb).contains("\"rank\""));
}

#[test]
fn a_rank_left_out_of_an_all_reduce_is_named_with_its_layer() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::write("tiny-f32", d.path()).unwrap();
    let model = model.to_str().unwrap();
    let (one, two, bug) = (
        d.path().join("tp1"),
        d.path().join("tp2"),
        d.path().join("bug"),
    );
    capture(model, &one, 1, &[]);
    capture(model, &two, 2, &[]);
    let fault = [("TAPTREE_FAULT_TP_SKIP_ALLREDUCE", "1@1/ffn_down")];
    capture(model, &bug, 2, &fault);
    for reference in [&one, &two] {
        let (code, report, out) = diff(&bug, reference);
        assert_eq!(code, 1, "{out}");
        assert_eq!(
            first_divergence(&report).as_deref(),
            Some("L1/ffn_down"),
            "{out}"
        );
        let n = notes(&report);
        assert!(
            n.contains("L1/ffn_down in A")
                && n.contains(
                    "rank 1's partial sum (ffn_down_partial) is missing from the all-reduce"
                ),
            "{out}"
        );
        assert!(!n.contains("rank 0's partial sum"), "{out}");
    }
    // Against a clean TP=2 tree the partial sums are compared rank by rank:
    // the faulty run computed them all, only their sum is wrong.
    let (_, report, out) = diff(&bug, &two);
    assert_eq!(status(&report, "L1/ffn_down_partial.r1"), "equal", "{out}");
    // The fault at rank 0 is named as rank 0.
    let bug0 = d.path().join("bug0");
    capture(
        model,
        &bug0,
        2,
        &[("TAPTREE_FAULT_TP_SKIP_ALLREDUCE", "0@0/o_proj")],
    );
    let (code, report, out) = diff(&bug0, &one);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        first_divergence(&report).as_deref(),
        Some("L0/o_proj"),
        "{out}"
    );
    assert!(
        notes(&report).contains("rank 0's partial sum (o_proj_partial) is missing"),
        "{out}"
    );
}

#[test]
fn splits_that_cannot_be_made_are_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let f32 = fixtures::write("tiny-f32", d.path()).unwrap();
    let q = fixtures::write("tiny-q", d.path()).unwrap();
    let cases: [(&Path, &str, &Env, &str); 5] = [
        (
            &f32,
            "5",
            &[],
            "--tp 5: 5 ranks leave a rank without a query head",
        ),
        (&f32, "0", &[], "--tp 0: needs at least one rank"),
        (&q, "2", &[], "does not hold whole o_proj blocks of 32"),
        (
            &f32,
            "2",
            &[("TAPTREE_FAULT_TP_SKIP_ALLREDUCE", "2@0/o_proj")],
            "rank 2 of layer 0 does not exist under --tp 2",
        ),
        (
            &f32,
            "1",
            &[("TAPTREE_FAULT_TP_SKIP_ALLREDUCE", "0@0/o_proj")],
            "needs --tp 2 or more",
        ),
    ];
    for (model, tp, env, want) in cases {
        let out = d.path().join("never");
        let o = taptree()
            .args(["capture", "--model"])
            .arg(model)
            .args(["--prompt", "hi", "--gen", "1", "--tp", tp, "--out"])
            .arg(&out)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "--tp {tp}: {}", text(&o));
        assert!(text(&o).contains(want), "--tp {tp}: {}", text(&o));
        assert!(!out.join("manifest.json").exists());
    }
}

/// A tree of one 2-row `[2, 6]` tensor `x` at layer 0, tapped as the
/// `shards` (rank, start, end of 6 columns) say, each shard's values its
/// columns of `0, 1, .. 11`; a one-device tree of the same tensor when
/// `shards` is empty.
fn sharded_tree(out: &Path, shards: &[Placed]) {
    let _one_at_a_time = one_capture_at_a_time();
    let cap = Capture::start(CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::all(),
        force: false,
        stages: vec![StageSpec::layer("x", &[])],
        run: RunInfo::default(),
    })
    .unwrap();
    let full: Vec<f32> = (0..12).map(|v| v as f32).collect();
    if shards.is_empty() {
        capture::tap("x", Some(0), 0..2, None, &[2, 6], &full);
    }
    for &(rank, start, end) in shards {
        let cols: Vec<f32> = full
            .chunks_exact(6)
            .flat_map(|row| row[start as usize..end as usize].to_vec())
            .collect();
        let shard = Shard {
            axis: 1,
            start,
            end,
            full: 6,
        };
        let id = TapId::new("x", Some(0), 0..2, None);
        capture::tap_ranked(id, rank, Some(shard), &[2, (end - start) as usize], &cols);
    }
    cap.finish().unwrap();
}

#[test]
fn shards_that_do_not_tile_are_exit_2_naming_the_tap() {
    let d = tempfile::tempdir().unwrap();
    let one = d.path().join("one");
    sharded_tree(&one, &[]);
    let good = d.path().join("good");
    sharded_tree(&good, &[(1, 4, 6), (0, 0, 4)]);
    let (code, report, out) = diff(&good, &one);
    assert_eq!(code, 0, "{out}");
    assert_eq!(status(&report, "L0/x"), "equal", "{out}");
    let cases: [(&str, &[Placed], &str); 3] = [
        (
            "missing",
            &[(0, 0, 4)],
            "missing shard: 4..6 of 6 along axis 1 is held by no rank",
        ),
        ("gap", &[(0, 0, 2), (1, 3, 6)], "missing shard: 2..3 of 6"),
        (
            "overlap",
            &[(0, 0, 4), (1, 3, 6)],
            "overlapping shards: rank 1 declares 3..6",
        ),
    ];
    for (name, shards, want) in cases {
        let tree = d.path().join(name);
        sharded_tree(&tree, shards);
        let (code, _, out) = diff(&tree, &one);
        assert_eq!(code, 2, "{name}: {out}");
        assert!(
            out.contains("L0/x@0..2: ") && out.contains(want),
            "{name}: {out}"
        );
    }
}

/// A tree whose manifest declares, for rank 0, a shard its tensor does not
/// hold, every hash redone as a hostile writer would: exit 2, naming the
/// rank as a number.
#[test]
fn declared_shards_a_tensor_does_not_hold_are_exit_2_naming_the_rank() {
    let d = tempfile::tempdir().unwrap();
    let one = d.path().join("one");
    sharded_tree(&one, &[]);
    type Edit = fn(&mut Shard);
    let cases: [(&str, Edit, &str); 2] = [
        (
            "narrower",
            |s| s.end -= 1,
            "rank 0: shape [2, 4] does not hold shard 1:0-3/6",
        ),
        ("another full extent", |s| s.full = 7, ": not one tensor"),
    ];
    for (name, edit, want) in cases {
        let tree = d.path().join(name);
        sharded_tree(&tree, &[(0, 0, 4), (1, 4, 6)]);
        let path = tree.join("manifest.json");
        let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let mut m: capture::Manifest = serde_json::from_value(json.clone()).unwrap();
        for (e, v) in m
            .entries
            .iter_mut()
            .zip(json["entries"].as_array_mut().unwrap())
        {
            if e.key.rank == Some(0) {
                edit(e.key.shard.as_mut().unwrap());
                v["key"]["shard"] = serde_json::to_value(e.key.shard).unwrap();
            }
        }
        let (dirs, root) = m.hashes();
        json["dirs"] = serde_json::to_value(dirs).unwrap();
        json["root"] = root.into();
        let mut bytes = serde_json::to_vec(&json).unwrap();
        assert!(capture::manifest::seal(&mut bytes));
        std::fs::write(&path, bytes).unwrap();
        if tree.join(capture::index::INDEX_FILE).exists() {
            capture::index::rewrite(&tree).unwrap();
        }
        let (code, _, out) = diff(&tree, &one);
        assert_eq!(code, 2, "{name}: {out}");
        assert!(
            out.contains("L0/x@0..2: ") && out.contains(want),
            "{name}: {out}"
        );
        assert!(
            out.contains("rank 0") && !out.contains("Some("),
            "{name}: {out}"
        );
    }
}

/// A shard of no width (an empty column range), its tap file and every
/// hash written to match as a hostile writer would: refused where the tree
/// is opened, naming the manifest and the shard, by every command (the
/// diff panicked rebuilding the full tensor: a zero-byte chunk per row).
#[test]
fn a_shard_of_no_width_is_exit_2_naming_the_manifest() {
    let d = tempfile::tempdir().unwrap();
    let one = d.path().join("one");
    sharded_tree(&one, &[]);
    for at in [4u32, 6] {
        let tree = d.path().join(format!("empty-at-{at}"));
        sharded_tree(&tree, &[(0, 0, 4), (1, 4, 6)]);
        let path = tree.join("manifest.json");
        let mut m: capture::Manifest =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let mut e = m.entries[0].clone();
        e.key.rank = Some(2);
        e.key.shard = Some(Shard {
            axis: 1,
            start: at,
            end: at,
            full: 6,
        });
        e.shape = vec![2, 0];
        e.path = capture::manifest::path_of(&e.key);
        let header = capture::tapfile::encode_header(&e.key, e.dtype, &e.shape, 0);
        std::fs::write(tree.join(&e.path), &header).unwrap();
        e.blake3 = blake3::hash(b"").to_hex().to_string();
        e.header_blake3 = Some(blake3::hash(&header).to_hex().to_string());
        e.bytes = 0;
        m.entries.push(e);
        let (dirs, root) = m.hashes();
        (m.dirs, m.root) = (dirs, root);
        m.manifest_blake3 = Some(capture::manifest::UNSEALED.to_string());
        let mut bytes = serde_json::to_vec(&m).unwrap();
        assert!(capture::manifest::seal(&mut bytes));
        std::fs::write(&path, bytes).unwrap();
        let want = format!("L0/x@0..2 rank 2: shard 1:{at}-{at}/6: range is empty");
        let (code, _, out) = diff(&tree, &one);
        assert_eq!(code, 2, "{out}");
        assert!(
            out.contains("manifest.json") && out.contains(&want),
            "{out}"
        );
        for args in [&["verify"][..], &["stat"], &["ls"]] {
            let o = taptree().args(args).arg(&tree).output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
            assert!(text(&o).contains(&want), "{args:?}: {}", text(&o));
        }
    }
}

#[test]
fn a_divergent_shard_names_its_rank() {
    let d = tempfile::tempdir().unwrap();
    let good = d.path().join("good");
    sharded_tree(&good, &[(0, 0, 3), (1, 3, 6)]);
    // The same layout with rank 1's columns changed: a tree of other values.
    let bad = d.path().join("bad");
    let _one_at_a_time = one_capture_at_a_time();
    let cap = Capture::start(CaptureOptions {
        out: bad.clone(),
        selection: Selection::all(),
        force: false,
        stages: vec![StageSpec::layer("x", &[])],
        run: RunInfo::default(),
    })
    .unwrap();
    for (rank, start) in [(0u32, 0u32), (1, 3)] {
        let cols: Vec<f32> = (0..2)
            .flat_map(|r| {
                (start..start + 3)
                    .map(move |c| (r * 6 + c) as f32 + if rank == 1 { 5.0 } else { 0.0 })
            })
            .collect();
        let shard = Shard {
            axis: 1,
            start,
            end: start + 3,
            full: 6,
        };
        capture::tap_ranked(
            TapId::new("x", Some(0), 0..2, None),
            rank,
            Some(shard),
            &[2, 3],
            &cols,
        );
    }
    cap.finish().unwrap();
    let (code, report, out) = diff(&bad, &good);
    assert_eq!(code, 1, "{out}");
    let n = notes(&report);
    assert!(n.contains("rank 0 (columns 0..3) bitwise equal"), "{out}");
    assert!(
        n.contains("rank 1 (columns 3..6) differs, max |a-b| 5.000e0"),
        "{out}"
    );
}

#[test]
fn smollm2_tp_2_agrees_with_tp_1_and_names_a_planted_fault() {
    let Some(model) = smollm2() else { return };
    let d = tempfile::tempdir().unwrap();
    let (one, two, bug) = (
        d.path().join("tp1"),
        d.path().join("tp2"),
        d.path().join("bug"),
    );
    capture(&model, &one, 1, &[]);
    capture(&model, &two, 2, &[]);
    capture(
        &model,
        &bug,
        2,
        &[("TAPTREE_FAULT_TP_SKIP_ALLREDUCE", "1@5/o_proj")],
    );
    let (code, report, out) = diff(&two, &one);
    assert_eq!(code, 0, "{out}");
    assert_eq!(status(&report, "L0/attn"), "equal", "{out}");
    let (code, report, out) = diff(&bug, &one);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        first_divergence(&report).as_deref(),
        Some("L5/o_proj"),
        "{out}"
    );
    assert!(
        notes(&report).contains("rank 1's partial sum (o_proj_partial) is missing"),
        "{out}"
    );
}
