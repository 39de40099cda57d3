//! Taps are plain safetensors: Python's `safetensors.numpy.load_file` reads
//! them, values and metadata included. Skips (saying why) without Python,
//! numpy or safetensors, except under CI (`CI=true`), where that is a failure.

#![cfg(not(feature = "compile-out"))]

use capture::{Capture, CaptureOptions, RunInfo, Selection, TreeReader};
use std::process::Command;

fn python_ready() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, safetensors.numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let why = "python3 with numpy and safetensors is not available \
                   (python3 -m pip install numpy safetensors)";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{why}; CI requires it");
        }
        eprintln!("skipping: {why}");
    }
    ok
}

#[test]
fn safetensors_numpy_reads_a_tap() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t");
    let cap = Capture::start(CaptureOptions {
        out: out.clone(),
        selection: Selection::all(),
        force: false,
        stages: vec![],
        run: RunInfo::default(),
    })
    .unwrap();
    // Values chosen to catch byte order, sign and precision mistakes.
    let f32s: Vec<f32> = (0..3 * 5).map(|i| (i as f32 - 7.0) * 0.1 + 1e-7).collect();
    capture::tap("ffn_down", Some(2), 4..7, None, &[3, 5], &f32s);
    let bf16s: Vec<half::bf16> = [-3664.0f32, 0.5, 0.0009765625]
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .collect();
    capture::tap("logits", None, 0..1, Some(1), &[1, 3], &bf16s);
    capture::tap("ids", None, 0..1, None, &[1, 2], &[-5i32, 1 << 30]);
    cap.finish().unwrap();
    let tree = TreeReader::open(&out).unwrap();
    let paths: Vec<String> = tree
        .entries()
        .iter()
        .map(|e| tree.file_path(e).display().to_string())
        .collect();

    let script = r#"
import sys, numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
f32, bf16, ids = sys.argv[1:4]
t = load_file(f32)["tap"]
assert t.dtype == np.float32 and t.shape == (3, 5), (t.dtype, t.shape)
want = (np.arange(15, dtype=np.float32) - np.float32(7.0)) * np.float32(0.1) + np.float32(1e-7)
assert np.array_equal(t.reshape(-1), want), (t, want)
with safe_open(f32, framework="numpy") as f:
    meta = f.metadata()
assert meta["taptree.key"] == "L2/ffn_down@4..7", meta
assert (meta["stage"], meta["layer"], meta["pos_start"], meta["pos_end"]) == ("ffn_down", "2", "4", "7"), meta
i = load_file(ids)["tap"]
assert i.dtype == np.int32 and i.tolist() == [[-5, 1 << 30]], i
# numpy has no bfloat16: read the raw 16-bit patterns and widen them by hand.
with safe_open(bf16, framework="numpy") as f:
    assert f.metadata()["slot"] == "1"
raw = open(bf16, "rb").read()
n = int.from_bytes(raw[:8], "little")
bits = np.frombuffer(raw[8 + n:], dtype="<u2").astype(np.uint32) << 16
assert bits.view(np.float32).tolist() == [-3664.0, 0.5, 0.0009765625], bits.view(np.float32)
print("python ok")
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(&paths)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("python ok"), "{stdout}");
}
