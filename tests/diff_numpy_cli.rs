//! `taptree diff --json`'s metrics against an independent numpy computation
//! of the same trees (tests/diff_support's trees, scripts/numpy_diff.py).

use crate::diff_support::*;

/// Whether `python3` can import numpy and safetensors. Under CI a missing
/// package is a failure; elsewhere the test is skipped, saying why.
fn python_ready(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: python3 with numpy and safetensors is required under CI"
        );
        eprintln!("{test}: skipped: python3 with numpy and safetensors not found");
    }
    ok
}

#[test]
fn metrics_agree_with_the_numpy_peer() {
    if !python_ready("metrics_agree_with_the_numpy_peer") {
        return;
    }
    let (_d, a, b) = dirs();
    plain(&a);
    tree(
        &b,
        |x| x,
        |stage, layer, pos, v| {
            for (i, x) in v.iter_mut().enumerate() {
                *x *= 1.0 + 1e-3 * value("wobble", layer, pos, i);
            }
            if stage == "ffn_up" && layer == Some(1) && pos == 1 {
                v[3] = f32::NAN;
                v[4] = -0.0;
            }
        },
    );
    let ours = taptree(&[&"diff", &a, &b, &"--json"]);
    let report: serde_json::Value = serde_json::from_slice(&ours.stdout).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/numpy_diff.py");
    let peer = Command::new("python3")
        .arg(&script)
        .args([&a, &b])
        .arg("--dump")
        .output()
        .unwrap();
    assert!(
        peer.status.success(),
        "{}",
        String::from_utf8_lossy(&peer.stderr)
    );
    let mut theirs = std::collections::HashMap::new();
    for line in String::from_utf8(peer.stdout).unwrap().lines() {
        let m: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = (
            m["stage"].as_str().unwrap().to_string(),
            m["layer"].as_u64(),
            m["pos"].as_u64().unwrap(),
        );
        theirs.insert(key, m);
    }
    let close = |x: f64, y: f64, rel: f64| (x - y).abs() <= rel * x.abs().max(y.abs()).max(1e-300);
    let mut checked = 0;
    for row in report["rows"].as_array().unwrap() {
        for p in row["positions"].as_array().unwrap() {
            let key = (
                row["stage"].as_str().unwrap().to_string(),
                row["layer"].as_u64(),
                p["pos"].as_u64().unwrap(),
            );
            let (m, t) = (&p["metrics"], &theirs[&key]);
            let f = |v: &serde_json::Value| v.as_f64().unwrap();
            assert!(close(f(&m["cos"]), f(&t["cos"]), 1e-12), "{key:?} cos");
            assert!(
                close(f(&m["max_abs"]), f(&t["max_abs"]), 1e-12),
                "{key:?} max_abs"
            );
            assert!(
                close(f(&m["max_rel"]), f(&t["max_rel"]), 1e-12),
                "{key:?} max_rel"
            );
            assert!(close(f(&m["rmse"]), f(&t["rmse"]), 1e-9), "{key:?} rmse");
            assert!(close(f(&m["nmse"]), f(&t["nmse"]), 1e-9), "{key:?} nmse");
            assert_eq!(m["max_ulp"], t["max_ulp"], "{key:?} max_ulp");
            assert_eq!(
                m["bitwise_equal"], t["bitwise_equal"],
                "{key:?} bitwise_equal"
            );
            assert_eq!(m["nonfinite_mismatch"], t["nonfinite_mismatch"], "{key:?}");
            assert_eq!(m["zero_b"], t["zero_b"], "{key:?} zero_b");
            assert_eq!(
                m["argmax_agree"].as_u64() == Some(1),
                t["argmax_agree"].as_bool().unwrap(),
                "{key:?} argmax"
            );
            checked += 1;
        }
    }
    // Every position differs (the wobble is everywhere): all 99 were checked.
    assert_eq!(checked, 99);
}
