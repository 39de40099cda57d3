//! The HTML report in a real browser: headless Chromium loads a report, a
//! real mouse click on a heatmap cell (DevTools protocol, driven by
//! tests/browser/click.py) must open that op's panel — its positions, its
//! inputs, its statistics — and a click on another cell must switch to that
//! one. Skips, saying why, where chromium is not installed; under CI
//! (`CI=true`) a missing chromium is a failure.

use crate::harness::taptree;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn chromium() -> bool {
    let found = Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").is_err(),
            "CI needs chromium (scripts/test.sh installs it)"
        );
        eprintln!("skipping: chromium is not installed (apt-get install -y chromium)");
    }
    found
}

/// Clicks `cells` in turn in `report`; what the page showed after each.
fn click(report: &Path, cells: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/click.py");
    let o = Command::new("python3")
        .arg(script)
        .arg(report)
        .args(cells)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(&out).unwrap()
}

/// The demo's pipeline on the tiny model with a planted massive activation:
/// f32, q8 and the f64 truth captured, f32 diffed against q8 into `html`.
/// Returns the diff's JSON report.
fn demo(dir: &Path, html: &Path) -> Value {
    let model = fixtures::write("tiny-outlier", dir).unwrap();
    for p in ["f32", "q8", "f64"] {
        let o = taptree(&[
            &"capture",
            &"--model",
            &model,
            &"--prompt",
            &"The quick brown fox",
            &"--gen",
            &"3",
            &"--precision",
            &p,
            &"--out",
            &dir.join(p),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (a, b, t) = (dir.join("f32"), dir.join("q8"), dir.join("f64"));
    let o = taptree(&[&"diff", &a, &b, &"--truth", &t, &"--html", &html]);
    assert_eq!(o.status.code(), Some(1), "q8 must diverge from f32");
    let o = taptree(&[&"diff", &a, &b, &"--truth", &t, &"--json"]);
    serde_json::from_slice(&o.stdout).unwrap()
}

fn name(row: &Value) -> String {
    match row["layer"].as_u64() {
        Some(l) => format!("L{l}/{}", row["stage"].as_str().unwrap()),
        None => row["stage"].as_str().unwrap().to_string(),
    }
}

#[test]
fn clicking_a_heatmap_cell_opens_that_ops_positions_inputs_and_stat() {
    if !chromium() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let html = d.path().join("report.html");
    let report = demo(d.path(), &html);
    let rows = report["rows"].as_array().unwrap();
    let first = &rows[report["first_divergence"].as_u64().unwrap() as usize];
    let first_name = name(first);
    // Another op, in another layer: the panel must follow the click.
    let other = rows
        .iter()
        .map(name)
        .find(|n| n.starts_with("L1/") && *n != first_name)
        .unwrap();
    let got = click(&html, &[&first_name, &other, "no/such_op"]);

    assert_eq!(
        got["before"]["hidden"], true,
        "nothing shown before a click"
    );
    let c = &got["clicks"][0];
    assert_eq!(c["found"], true);
    assert_eq!(c["hidden"], false, "{c}");
    assert_eq!(c["title"].as_str().unwrap(), format!("{first_name} FAIL"));
    assert_eq!(c["selected"], serde_json::json!([first_name]));
    // One bar per position: the prompt's 5 (BOS + 4) and 2 decode steps; the
    // JSON lists only positions that differ, the page also the equal ones.
    let positions = first["positions"].as_array().unwrap();
    assert!(c["bars"].as_u64().unwrap() >= positions.len() as u64, "{c}");
    let failing = positions.iter().filter(|p| p["pass"] == false).count();
    assert_eq!(c["failing"].as_u64().unwrap(), failing as u64, "{c}");
    let text = c["text"].as_str().unwrap();
    assert!(
        text.contains("prefill") && text.contains("decode"),
        "{text}"
    );
    assert!(
        text.contains("stat A@") && text.contains("stat B@"),
        "{text}"
    );
    assert!(text.contains("blocks of 256:"), "{text}");
    // The tokens are shown as text (the manifest's token_pieces).
    let tokens: Vec<&str> = c["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(
        tokens.concat().contains("The quick brown fox"),
        "{tokens:?}"
    );

    let c = &got["clicks"][1];
    assert_eq!(
        c["title"].as_str().unwrap().split(' ').next(),
        Some(other.as_str())
    );
    assert_eq!(c["selected"], serde_json::json!([other]));
    // Every op in a layer reads something of the stage graph.
    assert!(!c["inputs"].as_array().unwrap().is_empty(), "{c}");
    assert_eq!(got["clicks"][2]["found"], false);
}
