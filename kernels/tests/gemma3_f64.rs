//! Gemma 3's f64 forward (the truth) against an independent float64 numpy
//! forward over the `gguf` package's own dequantized weights
//! (scripts/reference_forward.py): relative error <= 1e-12 at every position
//! of the final logits; the f32 forward, 1e-6 off, must fail the same check.
//!
//! One test function: a process arms one capture at a time.

mod gguf_python;

use std::path::Path;
use std::process::Command;

use capture::{Capture, CaptureOptions, RunInfo, Selection};
use kernels::cpu::CpuForward;
use kernels::switches::Switches;
use kernels::{stages, Forward, Precision};
use model::load::load_model;

fn capture_logits(model: &model::ModelWeights, ids: &[u32], precision: Precision, out: &Path) {
    let cap = Capture::start(CaptureOptions {
        out: out.into(),
        selection: Selection::parse("stage=logits").unwrap(),
        force: false,
        stages: stages::for_config(&model.config),
        run: RunInfo {
            precision: precision.name().into(),
            prompt_tokens: ids.to_vec(),
            ..Default::default()
        },
    })
    .unwrap();
    let mut f = CpuForward::new(model, precision, &Switches::none()).unwrap();
    f.forward(None, ids, 0).unwrap();
    cap.finish().unwrap();
}

fn reference(model: &Path, tree: &Path) -> (Option<i32>, String) {
    let script = gguf_python::repo_root().join("scripts/reference_forward.py");
    let o = Command::new(gguf_python::python())
        .arg(script)
        .arg("--model")
        .arg(model)
        .arg("--tree")
        .arg(tree)
        .args(["--max-rel", "1e-12"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), text)
}

#[test]
fn gemma3_f64_matches_the_numpy_reference_to_1e_12() {
    if !gguf_python::python_has(&["numpy", "gguf", "safetensors"]) {
        return;
    }
    let Some(path) = gguf_python::gemma3() else {
        return;
    };
    let model = load_model(&path).unwrap();
    let tok = model.tokenizer.as_ref().unwrap();
    let ids = tok.encode_chat("What is the capital of France?").unwrap();
    let dir = tempfile::tempdir().unwrap();

    let f64_tree = dir.path().join("f64");
    capture_logits(&model.weights, &ids, Precision::F64, &f64_tree);
    let (code, text) = reference(&path, &f64_tree);
    eprintln!("{text}");
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "ok: {}: {} positions",
            f64_tree.display(),
            ids.len()
        )),
        "{text}"
    );

    // The check can fail: f32 logits are ~1e-6 off the truth.
    let f32_tree = dir.path().join("f32");
    capture_logits(&model.weights, &ids, Precision::F32, &f32_tree);
    let (code, text) = reference(&path, &f32_tree);
    assert_eq!(code, Some(1), "{text}");
}
