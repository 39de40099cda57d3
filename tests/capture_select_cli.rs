//! `taptree capture --select`: what a selection keeps, from the command
//! line or the environment, and what it spares the forward.

use std::path::Path;

use serde_json::Value;

use crate::capture_cli::{capture, manifest, ok, TOKENS};
use crate::harness::clean::{fixture, run, taptree, text};

#[test]
fn taptree_out_and_select_from_the_environment() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let out = d.path().join("env");
    let o = taptree()
        .args(["capture", "--model", &m, "--tokens", TOKENS])
        .env("TAPTREE_OUT", &out)
        .env("TAPTREE_SELECT", "stage=ffn_*;layer=1")
        .output()
        .unwrap();
    ok(o);
    let entries = manifest(&out)["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 5);
    assert!(entries.iter().all(|e| e["key"]["layer"] == 1));

    // A bad TAPTREE_SELECT is refused before anything runs.
    let bad = d.path().join("bad");
    let o = taptree()
        .args(["capture", "--model", &m, "--tokens", TOKENS])
        .env("TAPTREE_OUT", &bad)
        .env("TAPTREE_SELECT", "layer=x")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("TAPTREE_SELECT"), "{}", text(&o));
    assert!(!bad.exists());

    // --select on the command line; without any output, only the answer.
    let sel = capture(
        &m,
        &d.path().join("sel"),
        &["--tokens", TOKENS, "--select", "stage=logits"],
    );
    assert_eq!(sel["entries"].as_array().unwrap().len(), 1);
    let printed = ok(run(&[
        "capture", "--model", &m, "--tokens", TOKENS, "--gen", "2",
    ]));
    assert!(printed.contains("no tree written"), "{printed}");
}

/// Logits computed only for the selected positions (and the last) have the
/// bits of the same rows computed with every position's, in f32 and in q8;
/// a tree of other logits (the f32 rows against q8's) goes red.
#[test]
fn selected_logits_rows_alone_keep_their_bits() {
    let d = tempfile::tempdir().unwrap();
    let m = fixture(d.path(), "tiny-q");
    let tree = |name: &str, extra: &[&str]| {
        let out = d.path().join(name);
        let mut args = vec!["--tokens", TOKENS, "--gen", "2"];
        args.extend_from_slice(extra);
        capture(&m, &out, &args);
        out.to_str().unwrap().to_string()
    };
    let diff = |a: &str, b: &str| text(&run(&["diff", a, b, "--common-only"]));
    for precision in ["f32", "q8"] {
        let all = tree(
            precision,
            &["--precision", precision, "--select", "stage=logits"],
        );
        // Positions 1 and 3 of the prefill (its last row, 4, computed but
        // not kept), then decode position 5.
        let some = tree(
            &format!("{precision}-some"),
            &[
                "--precision",
                precision,
                "--select",
                "stage=logits;pos=1,3,5",
            ],
        );
        let m = manifest(Path::new(&some));
        let pos: Vec<&Value> = m["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["key"]["pos"])
            .collect();
        assert_eq!(
            pos,
            [
                &serde_json::json!({"start": 1, "end": 2}),
                &serde_json::json!({"start": 3, "end": 4}),
                &serde_json::json!({"start": 5, "end": 6}),
            ]
        );
        let out = diff(&all, &some);
        assert!(
            out.contains("bitwise equal by content: 3 positions"),
            "{precision}: {out}"
        );
    }
    let red = diff(
        d.path().join("f32").to_str().unwrap(),
        d.path().join("q8-some").to_str().unwrap(),
    );
    assert!(red.contains("first diverging op: logits@1"), "{red}");
}
