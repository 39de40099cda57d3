//! What the capture crate's tree tests share: a toy forward, captures of
//! it (one at a time: captures are process-global), and edits of a tree.
#![allow(dead_code, unused_imports)]

pub use capture::{
    compare, Capture, CaptureOptions, DType, Difference, Error, RunInfo, Selection, StageSpec,
    TreeReader,
};
pub use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn opts(out: &Path, selection: &str) -> CaptureOptions {
    CaptureOptions {
        out: out.to_path_buf(),
        selection: Selection::parse(selection).unwrap(),
        force: false,
        stages: vec![
            StageSpec::global("embedding", &[]),
            StageSpec::layer("attn_norm", &[]),
            StageSpec::layer("ffn_down", &["attn_norm"]),
            StageSpec::global("logits", &[]),
        ],
        run: RunInfo {
            model: "toy".into(),
            ..RunInfo::default()
        },
    }
}

/// A small forward: 2 layers, 3 positions in one batch, a few dtypes.
/// `bump` changes one value of layer 1's ffn_down.
pub fn forward(bump: f32) {
    let rows = 3usize;
    let width = 5usize;
    let act =
        |seed: f32| -> Vec<f32> { (0..rows * width).map(|i| seed + i as f32 * 0.25).collect() };
    capture::tap("embedding", None, 0..3, None, &[rows, width], &act(0.0));
    for layer in 0..2u32 {
        capture::tap(
            "attn_norm",
            Some(layer),
            0..3,
            None,
            &[rows, width],
            &act(layer as f32),
        );
        let mut down = act(10.0 + layer as f32);
        if layer == 1 {
            down[7] += bump;
        }
        capture::tap("ffn_down", Some(layer), 0..3, None, &[rows, width], &down);
    }
    let logits: Vec<half::bf16> = (0..rows * 4)
        .map(|i| half::bf16::from_f32(i as f32))
        .collect();
    capture::tap("logits", None, 0..3, None, &[rows, 4], &logits);
}

pub fn capture_tree(out: &Path, selection: &str, bump: f32) -> capture::Summary {
    let _guard = serial();
    let cap = Capture::start(opts(out, selection)).unwrap();
    forward(bump);
    cap.finish().unwrap()
}

/// A forced capture of everything: replaces the tree at `out`.
pub fn replace_tree(out: &Path, bump: f32) -> capture::Summary {
    let _guard = serial();
    let mut o = opts(out, "");
    o.force = true;
    let cap = Capture::start(o).unwrap();
    forward(bump);
    cap.finish().unwrap()
}

/// The names in `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// `tree` moved to where a capture of process `pid` replacing `out` puts
/// the tree it replaces (`old`) or the one it writes (`new`).
pub fn set_aside(tree: &Path, out: &Path, what: &str, pid: u32) -> PathBuf {
    let name = out.file_name().unwrap().to_str().unwrap();
    let to = out.with_file_name(format!(".{name}.taptree-{what}-{pid}"));
    std::fs::rename(tree, &to).unwrap();
    to
}

/// No process has this id (Linux's largest `pid_max` is 2^22).
pub const DEAD: u32 = (1 << 22) + 1;

pub fn fresh_tree(dir: &Path) -> PathBuf {
    let out = dir.join("t");
    capture_tree(&out, "", 0.0);
    out
}

/// Edits a manifest as a writer would have written it: sealed again (its
/// `manifest_blake3` made to match), so that what is tested is the edit.
pub fn edit_manifest(tree: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = tree.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    let mut bytes = serde_json::to_vec(&m).unwrap();
    capture::manifest::seal(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    capture::index::rewrite(tree).unwrap();
}

/// A tree at `dir/t` of `n` one-position taps of two f32s (`[p, 1]` at
/// position `p`) into the one stage `stage`, at layer `layer_of(p)`:
/// enough taps to span an index's chunks or start the parallel paths.
pub fn many_taps(
    dir: &Path,
    stage: StageSpec,
    n: u32,
    layer_of: impl Fn(u32) -> Option<u32>,
) -> PathBuf {
    let _guard = serial();
    let out = dir.join("t");
    let name = stage.name.clone();
    let cap = Capture::start(CaptureOptions {
        out: out.clone(),
        selection: Selection::parse("").unwrap(),
        force: false,
        stages: vec![stage],
        run: RunInfo {
            model: "toy".into(),
            precision: "f32".into(),
            ..RunInfo::default()
        },
    })
    .unwrap();
    for p in 0..n {
        capture::tap(
            &name,
            layer_of(p),
            p..p + 1,
            None,
            &[1, 2],
            &[p as f32, 1.0],
        );
    }
    cap.finish().unwrap();
    out
}
