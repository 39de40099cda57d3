//! `taptree capture --engine hf`: Hugging Face transformers' forward
//! captured through the Python package, diffed against taptree's own.
//! Tests that run the engine skip (saying why) without torch and
//! transformers, except under CI (`CI=true`), where that is a failure.

use crate::harness::{taptree, text};
use std::path::Path;
use std::process::Command;

fn hf_ready(test: &str) -> bool {
    let ok = Command::new("python3")
        .args([
            "-c",
            "import torch, transformers, numpy, safetensors, blake3",
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let why = "python3 with torch, transformers, numpy, safetensors and blake3 is not \
                   available (bash scripts/test.sh installs them)";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{test}: {why}; CI requires it");
        }
        eprintln!("skipping {test}: {why}");
    }
    ok
}

fn qwen2_fixture(out: &Path, zero_bias: bool) {
    let mut c = Command::new("python3");
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/qwen2_bias.py"
    ))
    .arg(out);
    if zero_bias {
        c.arg("--zero-bias");
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
}

fn capture(model: &Path, extra: &[&str], out: &Path) {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"capture",
        &"--model",
        &model,
        &"--tokens",
        &"1,5,9,12,40,7,3",
        &"--out",
        &out,
    ];
    for e in extra {
        args.push(e);
    }
    let o = taptree(&args);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
}

#[test]
fn qwen2_with_biases_agrees_with_the_builtin_forward() {
    if !hf_ready("qwen2_with_biases_agrees_with_the_builtin_forward") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (model, unbiased) = (d.path().join("qwen2"), d.path().join("qwen2-no-bias"));
    qwen2_fixture(&model, false);
    qwen2_fixture(&unbiased, true);
    let (ours, hf, truth, control) = (
        d.path().join("ours"),
        d.path().join("hf"),
        d.path().join("f64"),
        d.path().join("no-bias"),
    );
    capture(&model, &[], &ours);
    capture(&model, &["--engine", "hf"], &hf);
    capture(&model, &["--precision", "f64"], &truth);
    capture(&unbiased, &[], &control);

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("manifest.json")).unwrap()).unwrap();
    let run = &manifest["run"];
    assert_eq!(
        run["prompt_tokens"],
        serde_json::json!([1, 5, 9, 12, 40, 7, 3])
    );
    assert_eq!(run["extra"]["engine"], "hf");
    assert!(run["extra"]["engine_versions"]["transformers"].is_string());
    assert_eq!(manifest["stages"][2]["layout"]["rotary"], "half_split");

    let o = taptree(&[&"diff", &ours, &hf, &"--truth", &truth]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("declared layouts reconciled"), "{out}");
    assert!(out.contains("within tolerance"), "{out}");
    assert!(
        out.contains("truth over every row: A is closer to T in"),
        "{out}"
    );
    // A forward without the biases must diverge, at the first biased op.
    let o = taptree(&[&"diff", &control, &hf]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("first diverging op: L0/q_proj@"), "{out}");
    // Hugging Face's "f64" computes some ops in float32: no truth.
    let hf64 = d.path().join("hf64");
    capture(&model, &["--engine", "hf", "--precision", "f64"], &hf64);
    let o = taptree(&[&"diff", &ours, &hf, &"--truth", &hf64]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not a truth: its engine reports ops outside f64"),
        "{err}"
    );
}

#[test]
fn smollm2_through_transformers_agrees_with_the_builtin_forward() {
    if !hf_ready("smollm2_through_transformers_agrees_with_the_builtin_forward") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (ours, hf) = (d.path().join("ours"), d.path().join("hf"));
    for (out, engine) in [(&ours, "builtin"), (&hf, "hf")] {
        let o = taptree(&[
            &"capture",
            &"--model",
            &"smollm2",
            &"--engine",
            &engine,
            &"--prompt",
            &"The capital of France is",
            &"--out",
            out,
        ]);
        assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    }
    let o = taptree(&[&"diff", &ours, &hf]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("in 453 rows"), "{out}");
}

#[test]
fn engine_flags_are_checked_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("t");
    let cases: [(&[&str], &str); 5] = [
        (
            &["--engine", "vllm"],
            "invalid value 'vllm' for '--engine <ENGINE>'\n  [possible values: builtin, hf, llama.cpp]",
        ),
        (
            &["--engine", "hf", "--precision", "q8"],
            "bad value \"q8\" for --engine hf",
        ),
        (
            &["--engine", "hf", "--backend", "cuda"],
            "--engine hf picks its own device",
        ),
        (
            &["--threads", "2"],
            "--threads: only for a foreign --engine",
        ),
        (&["--engine", "hf", "--select", "lyr=3"], "--select"),
    ];
    for (flags, msg) in cases {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
            &"capture",
            &"--model",
            &"tiny-f32",
            &"--tokens",
            &"1,2,3",
            &"--out",
            &out,
        ];
        for f in flags {
            args.push(f);
        }
        let o = taptree(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(msg), "{flags:?}: {err}");
        assert!(!out.exists(), "{flags:?} wrote {}", out.display());
    }
    let o = taptree(&[
        &"capture",
        &"--model",
        &"tiny-f32",
        &"--tokens",
        &"1,2",
        &"--engine",
        &"hf",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("--engine hf writes a tree: give --out"));
    // No Python: exit 2 naming it, nothing written.
    let o = Command::new(env!("CARGO_BIN_EXE_taptree"))
        .args([
            "capture", "--model", "tiny-f32", "--tokens", "1,2", "--engine", "hf", "--out",
        ])
        .arg(&out)
        .env("TAPTREE_PYTHON", d.path().join("no-such-python"))
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such-python"), "{err}");
    assert!(!out.exists());
}
