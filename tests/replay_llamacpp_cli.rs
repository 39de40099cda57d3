//! `taptree replay` of llama.cpp trees under `--precision llamacpp`
//! (llama-cpp-python's capture; skipped, saying why, without it unless
//! `TAPTREE_REQUIRE_LLAMACPP=1`).

use std::path::{Path, PathBuf};
use std::process::Command;

use kernels::ggml_build::EngineBuild;

use crate::harness::clean::{code, run, taptree, text};
use crate::replay_cli::{replay_json, rows, stages_above, write_tree, MATMULS};

/// Whether llama-cpp-python can run; without it the llama.cpp tests skip,
/// saying why, unless `TAPTREE_REQUIRE_LLAMACPP=1` (scripts/test.sh).
fn llama_cpp_ready(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import llama_cpp, numpy, safetensors, blake3"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let why = "python3 cannot import llama_cpp (bash scripts/test.sh installs llama-cpp-python==0.3.36)";
        if std::env::var("TAPTREE_REQUIRE_LLAMACPP").as_deref() == Ok("1") {
            panic!("{test}: {why}, and TAPTREE_REQUIRE_LLAMACPP=1");
        }
        eprintln!("skipping {test}: {why}");
    }
    ok
}

/// SmolLM2 through llama.cpp: a chat prompt (37 positions) and two decode
/// steps, with llama.cpp's flash attention or without.
fn llamacpp_tree(out: &Path, flash_attn: bool) -> PathBuf {
    let o = taptree()
        .args(["capture", "--engine", "llama.cpp", "--model", "smollm2"])
        .args(["--chat", "What is the capital of France?", "--gen", "3"])
        .args(["--out", out.to_str().unwrap()])
        .env(
            kernels::switches::FLASH_ATTN_VAR,
            if flash_attn { "1" } else { "0" },
        )
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", text(&o));
    fetch::ensure_smollm2().unwrap()
}

#[test]
fn every_op_of_a_llamacpp_tree_replays_within_1e_6_in_precision_llamacpp() {
    if !llama_cpp_ready("every_op_of_a_llamacpp_tree_replays_within_1e_6_in_precision_llamacpp") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("llamacpp");
    let model = llamacpp_tree(&tree, false);
    let m = model.to_str().unwrap();
    let (c, r) = replay_json(
        &tree,
        m,
        &["--precision", "llamacpp", "--tolerance", "1e-6"],
    );
    assert_eq!(c, 0, "ops outside 1e-6: {:?}", stages_above(&r));
    // Every stage of SmolLM2's vocabulary at every layer, prefill and decode.
    assert_eq!(rows(&r).len(), 1 + 15 * 30 + 2);
    assert!(rows(&r).iter().all(|row| row["positions"] == 39));
    // Against the exact recomputation, llama.cpp's error is in its
    // quantized matmuls and its attention (F16 K/V, f16 probabilities);
    // its norms, RoPE, SwiGLU and adds are f32 rounding.
    let (c, r) = replay_json(&tree, m, &[]);
    assert_eq!(c, 1);
    let mut want: std::collections::BTreeSet<String> =
        MATMULS.iter().map(|s| s.to_string()).collect();
    want.insert("attn".into());
    assert_eq!(stages_above(&r), want);
    // The red case: taptree's plain q8 is not llama.cpp's arithmetic.
    let (c, r) = replay_json(&tree, m, &["--precision", "q8", "--tolerance", "1e-6"]);
    assert_eq!(c, 1);
    // Its attention (no f16 operands) leaves 1e-6 at every layer; its
    // activation rounding (half away from zero, scaled by 1/d) differs from
    // llama.cpp's only at ties, in a few matmuls.
    let attn = rows(&r).iter().filter(|row| row["stage"] == "attn");
    assert!(attn.clone().count() == 30 && attn.into_iter().all(|row| row["above"] == true));
    let above = stages_above(&r);
    assert!(
        MATMULS.iter().any(|s| above.contains(*s)),
        "plain q8 matched llama.cpp at every matmul: {above:?}"
    );
}

#[test]
fn with_flash_attention_every_op_replays_within_1e_6_in_precision_llamacpp() {
    if !llama_cpp_ready("with_flash_attention_every_op_replays_within_1e_6_in_precision_llamacpp") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("llamacpp-fa");
    let model = llamacpp_tree(&tree, true);
    let m = model.to_str().unwrap();
    let opened = capture::TreeReader::open(&tree).unwrap();
    let versions = &opened.manifest().run.extra["engine_versions"];
    let flags = versions["cpu_avx512_flags"]
        .as_array()
        .into_iter()
        .flatten();
    let info = versions["system_info"].as_str().unwrap();
    let build = EngineBuild::from_account(info, flags.filter_map(|f| f.as_str())).unwrap();
    if build.flash_attn_unmodelled().is_some() {
        // Not modelled on this build: replay must say so (exit 2), not judge.
        let t = tree.to_str().unwrap();
        let out = run(&["replay", t, "--model", m, "--precision", "llamacpp"]);
        assert_eq!(code(&out), 2, "{}", text(&out));
        assert!(text(&out).contains("AVX512-FP16"), "{}", text(&out));
        eprintln!("llama.cpp built with AVX512-FP16: its flash attention is not modelled");
        return;
    }
    let (c, r) = replay_json(
        &tree,
        m,
        &["--precision", "llamacpp", "--tolerance", "1e-6"],
    );
    assert_eq!(c, 0, "ops outside 1e-6: {:?}", stages_above(&r));
    // The red case: the same taps under a manifest that says flash
    // attention was off replay through llama.cpp's plain kernel, which is
    // not what ran.
    let claims_off = d.path().join("claims-off");
    write_tree(
        &claims_off,
        &tree,
        |_, run| {
            run.extra
                .insert("flash_attn".into(), serde_json::json!(false));
        },
        None,
    );
    let (c, r) = replay_json(
        &claims_off,
        m,
        &["--precision", "llamacpp", "--tolerance", "1e-6"],
    );
    assert_eq!(c, 1);
    assert!(stages_above(&r).contains("attn"), "{:?}", stages_above(&r));
}
