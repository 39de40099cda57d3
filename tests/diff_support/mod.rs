//! Helpers shared by the `diff_cli` and `diff_numpy_cli` tests: the two
//! synthetic trees they diff and the binary they run.
#![allow(dead_code, unused_imports)]
pub use std::path::{Path, PathBuf};
pub use std::process::{Command, Output};
pub use std::sync::Mutex;

pub const LAYERS: u32 = 2;
pub const POSITIONS: u32 = 3;
pub const WIDTH: usize = 300;

pub use crate::harness::{taptree, text, CAPTURE};

pub fn value(stage: &str, layer: Option<u32>, pos: u32, i: usize) -> f32 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in stage.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h ^= (layer.map_or(99, |l| l as u64) << 32) ^ ((pos as u64) << 16) ^ i as u64;
    h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h = (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Writes a fixture tree (the llama vocabulary, decode order) whose values
/// pass through `edit(stage, layer, pos, values)`.
pub fn tree<T: capture::TapElem>(
    out: &Path,
    convert: impl Fn(f32) -> T,
    mut edit: impl FnMut(&str, Option<u32>, u32, &mut Vec<f32>),
) {
    let _turn = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
    let vocab = kernels::stages::llama();
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: out.to_path_buf(),
        selection: capture::Selection::all(),
        force: true,
        stages: vocab.clone(),
        run: capture::RunInfo {
            model: "fixture".into(),
            backend: "test".into(),
            precision: if std::mem::size_of::<T>() == 8 {
                "f64"
            } else {
                "f32"
            }
            .into(),
            ..Default::default()
        },
    })
    .unwrap();
    for pos in 0..POSITIONS {
        let mut order: Vec<(String, Option<u32>)> = vec![("embedding".into(), None)];
        for l in 0..LAYERS {
            for s in vocab.iter().filter(|s| s.scope == capture::Scope::Layer) {
                order.push((s.name.clone(), Some(l)));
            }
        }
        order.push(("final_norm".into(), None));
        order.push(("logits".into(), None));
        for (stage, layer) in order {
            let mut v: Vec<f32> = (0..WIDTH).map(|i| value(&stage, layer, pos, i)).collect();
            edit(&stage, layer, pos, &mut v);
            let data: Vec<T> = v.iter().map(|&x| convert(x)).collect();
            capture::tap(&stage, layer, pos..pos + 1, None, &[1, WIDTH], &data);
        }
    }
    cap.finish().unwrap();
}

pub fn plain(out: &Path) {
    tree(out, |x| x, |_, _, _, _| {});
}

pub fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    (d, a, b)
}
