//! What the per-op conformance tests of `--precision llamacpp` share: running
//! llama.cpp's capture through the Python adapter, reading its taps, and the
//! relative RMS error.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use capture::TreeReader;
use kernels::cpu::weights::DenseWeights;
use kernels::ggml_build::EngineBuild;
use kernels::switches::FLASH_ATTN_VAR;
use model::load::load_model;
use model::LlamaConfig;

/// The per-op bound: relative RMS error against llama.cpp's output.
pub const TOLERANCE: f64 = 1e-6;

/// `(stage, layer, relative RMS error)` per recomputed op, in forward order.
pub type Rows = Vec<(String, Option<u32>, f64)>;

pub fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python")
}

/// `python/` ahead of whatever PYTHONPATH the caller has.
pub fn python_path() -> std::ffi::OsString {
    let mut paths = vec![python_dir()];
    if let Some(p) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).expect("PYTHONPATH")
}

/// `Err(why)` when llama-cpp-python cannot be imported (and it is not required).
pub fn llama_cpp_available() -> Result<(), String> {
    let ok = Command::new("python3")
        .args(["-c", "import llama_cpp"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        return Ok(());
    }
    let why = "python3 cannot import llama_cpp (python3 -m pip install llama-cpp-python==0.3.36)";
    if std::env::var("TAPTREE_REQUIRE_LLAMACPP").as_deref() == Ok("1") {
        panic!("{why}, and TAPTREE_REQUIRE_LLAMACPP=1");
    }
    Err(why.to_string())
}

/// Captures `tokens` through llama.cpp into `out`, with its flash attention
/// or without.
pub fn capture_llamacpp(model: &Path, tokens: &[u32], out: &Path, flash_attn: bool) {
    let ids: Vec<String> = tokens.iter().map(u32::to_string).collect();
    let o = Command::new("python3")
        .args([
            "-m",
            "taptree",
            "capture",
            "--engine",
            "llama.cpp",
            "--model-file",
        ])
        .arg(model)
        .args(["--tokens", &ids.join(","), "--threads", "2", "--out"])
        .arg(out)
        .env("PYTHONPATH", python_path())
        .env(FLASH_ATTN_VAR, if flash_attn { "1" } else { "0" })
        .output()
        .expect("run python3");
    assert!(
        o.status.success(),
        "llama.cpp capture failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The tree's taps by (stage, layer), each over all positions (one prefill).
pub fn taps(tree: &TreeReader) -> HashMap<(String, Option<u32>), Vec<f32>> {
    tree.entries()
        .iter()
        .map(|e| {
            let v = tree.read(e).unwrap().to_f64();
            (
                (e.key.stage.clone(), e.key.layer),
                v.into_iter().map(|x| x as f32).collect(),
            )
        })
        .collect()
}

pub fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += (*g as f64 - *w as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Worst error per stage over the layers, in forward order.
pub fn worst_per_stage(rows: &[(String, Option<u32>, f64)]) -> Vec<(String, Option<u32>, f64)> {
    let mut worst: Vec<(String, Option<u32>, f64)> = Vec::new();
    for (s, l, e) in rows {
        match worst.iter_mut().find(|w| &w.0 == s) {
            Some(w) if *e > w.2 => *w = (s.clone(), *l, *e),
            Some(_) => {}
            None => worst.push((s.clone(), *l, *e)),
        }
    }
    worst
}

/// The ops past [`TOLERANCE`] (or NaN), each named with its layer and error.
pub fn outside_tolerance(rows: &[(String, Option<u32>, f64)]) -> Vec<String> {
    rows.iter()
        .filter(|(_, _, e)| e.is_nan() || *e > TOLERANCE)
        .map(|(s, l, e)| format!("{s} L{l:?}: {e:.3e}"))
        .collect()
}

/// The worst error of `stage` over the layers.
pub fn worst(rows: &[(String, Option<u32>, f64)], stage: &str) -> f64 {
    rows.iter()
        .filter(|(s, _, _)| s == stage)
        .map(|r| r.2)
        .fold(0f64, f64::max)
}

/// Prints the per-stage table: the worst error over the layers (and its
/// layer) in `llamacpp` and in `plain`, the mean over the layers in `exact`.
pub fn print_table(rows: &Rows, plain: &Rows, exact: &Rows) {
    eprintln!(
        "worst over the layers (and its layer) in llamacpp and q8; mean over the layers in f32"
    );
    eprintln!(
        "{:<20} {:>14} {:>14} {:>10}",
        "stage", "llamacpp", "q8", "f32"
    );
    let at = |l: &Option<u32>| l.map(|l| format!("L{l}")).unwrap_or_default();
    for ((s, l, e), (_, lq, eq)) in worst_per_stage(rows).iter().zip(&worst_per_stage(plain)) {
        let local: Vec<f64> = exact.iter().filter(|r| &r.0 == s).map(|r| r.2).collect();
        let mean = local.iter().sum::<f64>() / local.len() as f64;
        eprintln!(
            "{s:<20} {e:>9.2e} {:<4} {eq:>9.2e} {:<4} {mean:>10.2e}",
            at(l),
            at(lq)
        );
    }
}

impl Run {
    /// Why llama.cpp's flash attention on this build is not modelled, if it
    /// is not (see [`EngineBuild::flash_attn_unmodelled`]).
    pub fn unmodelled_flash_attn(&self) -> Option<String> {
        self.build
            .flash_attn_unmodelled()
            .map(|why| format!("skipped: {why}"))
    }
}

/// One llama.cpp capture of the France chat prompt, and what recomputing
/// its ops needs.
pub struct Run {
    pub cfg: LlamaConfig,
    pub weights: DenseWeights,
    pub tokens: Vec<u32>,
    pub taps: HashMap<(String, Option<u32>), Vec<f32>>,
    /// The build of llama.cpp that ran, from the tree's `engine_versions`.
    pub build: EngineBuild,
    _dir: tempfile::TempDir,
}

/// Captures `fetch()`'s model under llama.cpp (`flash_attn` on or off) and
/// reads its taps; `None`, saying why, without llama-cpp-python.
pub fn llamacpp_run(fetch: impl FnOnce() -> PathBuf, flash_attn: bool) -> Option<Run> {
    if let Err(why) = llama_cpp_available() {
        eprintln!("skipped: {why}");
        return None;
    }
    let model_path = fetch();
    let model = load_model(&model_path).expect("load the model");
    let tok = model
        .tokenizer
        .as_ref()
        .expect("the GGUF carries a tokenizer");
    let tokens = tok
        .encode_chat("What is the capital of France? Answer in one word.")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("llamacpp");
    capture_llamacpp(&model_path, &tokens, &out, flash_attn);
    let tree = TreeReader::open(&out).unwrap();
    let versions = &tree.manifest().run.extra["engine_versions"];
    let info = versions["system_info"]
        .as_str()
        .expect("the tree records llama.cpp's system_info");
    let flags = versions["cpu_avx512_flags"]
        .as_array()
        .into_iter()
        .flatten();
    let build = EngineBuild::from_account(info, flags.filter_map(|f| f.as_str())).unwrap();
    eprintln!("llama.cpp's CPU backend: {} ({info})", build.simd);
    Some(Run {
        build,
        cfg: model.weights.config.clone(),
        weights: DenseWeights::new(&model.weights).unwrap(),
        tokens,
        taps: taps(&tree),
        _dir: dir,
    })
}
