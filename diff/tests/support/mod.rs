//! Fixture-like trees for the diff tests: the llama stage vocabulary over a
//! few layers, deterministic values that depend only on (stage, layer,
//! position, slot, index), so a batched tree and a decode tree of the same
//! "forward" hold the same numbers. Trees live in memory ([`MemTree`]) for
//! fast and property tests, or on disk through the capture API ([`write`]).
#![allow(dead_code)]

use capture::{DType, Entry, Key, Manifest, RunInfo, Scope, StageSpec};
use diff::tree::{Tensor, Tree};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The llama vocabulary (the same as `kernels::stages::llama`, restated so
/// the diff crate does not depend on the kernels).
pub fn llama() -> Vec<StageSpec> {
    vec![
        StageSpec::global("embedding", &[]),
        StageSpec::layer("attn_norm", &["post_ffn_residual@prev"])
            .with_first_layer_inputs(&["embedding"]),
        StageSpec::layer("q_proj", &["attn_norm"]),
        StageSpec::layer("k_proj", &["attn_norm"]),
        StageSpec::layer("v_proj", &["attn_norm"]),
        StageSpec::layer("q_rope", &["q_proj"]),
        StageSpec::layer("k_rope", &["k_proj"]),
        StageSpec::layer("attn", &["q_rope", "k_rope", "v_proj"]),
        StageSpec::layer("o_proj", &["attn"]),
        StageSpec::layer("post_attn_residual", &["o_proj", "post_ffn_residual@prev"])
            .with_first_layer_inputs(&["o_proj", "embedding"]),
        StageSpec::layer("ffn_norm", &["post_attn_residual"]),
        StageSpec::layer("ffn_gate", &["ffn_norm"]),
        StageSpec::layer("ffn_up", &["ffn_norm"]),
        StageSpec::layer("ffn_swiglu", &["ffn_gate", "ffn_up"]),
        StageSpec::layer("ffn_down", &["ffn_swiglu"]),
        StageSpec::layer("post_ffn_residual", &["ffn_down", "post_attn_residual"]),
        StageSpec::global("final_norm", &["post_ffn_residual@last"]),
        StageSpec::global("logits", &["final_norm"]),
    ]
}

/// The shape of a fixture forward.
#[derive(Debug, Clone)]
pub struct Shape {
    pub layers: u32,
    pub positions: u32,
    pub width: usize,
    /// One tap per stage holding every position (prefill) rather than one
    /// tap per position (decode).
    pub batched: bool,
    pub slots: Vec<Option<u32>>,
    pub dtype: DType,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            layers: 3,
            positions: 4,
            width: 40,
            batched: false,
            slots: vec![None],
            dtype: DType::F32,
        }
    }
}

/// One tap about to be written; `values` (as f64) may be edited.
pub struct Tap {
    pub key: Key,
    pub width: usize,
    pub dtype: DType,
    pub values: Vec<f64>,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The value at one element of the fixture forward, in [-1, 1).
pub fn value(stage: &str, layer: Option<u32>, pos: u32, slot: Option<u32>, i: usize) -> f64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in stage.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let seed = h
        ^ (layer.map_or(999, |l| l as u64) << 40)
        ^ ((pos as u64) << 20)
        ^ slot.map_or(7, |s| s as u64 + 100)
        ^ ((i as u64) << 48);
    let r = splitmix(splitmix(seed) ^ i as u64);
    (r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Every tap of the fixture forward in forward order (position-major for
/// decode trees, as a decode loop taps), each passed through `edit`.
pub fn taps(shape: &Shape, mut edit: impl FnMut(&mut Tap)) -> Vec<Tap> {
    let vocab = llama();
    let mut out = Vec::new();
    let ranges: Vec<std::ops::Range<u32>> = if shape.batched {
        std::iter::once(0..shape.positions).collect()
    } else {
        (0..shape.positions).map(|p| p..p + 1).collect()
    };
    for slot in &shape.slots {
        for range in &ranges {
            let mut push = |stage: &str, layer: Option<u32>| {
                let width = if stage == "logits" {
                    shape.width + 8
                } else {
                    shape.width
                };
                let mut values = Vec::with_capacity(range.len() * width);
                for p in range.clone() {
                    for i in 0..width {
                        values.push(value(stage, layer, p, *slot, i));
                    }
                }
                let mut t = Tap {
                    key: Key::new(stage, layer, range.clone()).with_slot(*slot),
                    width,
                    dtype: shape.dtype,
                    values,
                };
                edit(&mut t);
                out.push(t);
            };
            for s in vocab.iter().filter(|s| s.name == "embedding") {
                push(&s.name, None);
            }
            for l in 0..shape.layers {
                for s in vocab.iter().filter(|s| s.scope == Scope::Layer) {
                    push(&s.name, Some(l));
                }
            }
            for s in vocab
                .iter()
                .filter(|s| s.scope == Scope::Global && s.name != "embedding")
            {
                push(&s.name, None);
            }
        }
    }
    out
}

pub fn encode(values: &[f64], dtype: DType) -> Vec<u8> {
    let mut b = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            DType::F32 => b.extend((v as f32).to_le_bytes()),
            DType::F64 => b.extend(v.to_le_bytes()),
            DType::F16 => b.extend(half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => b.extend(half::bf16::from_f64(v).to_le_bytes()),
            DType::I8 => b.extend((v as i8).to_le_bytes()),
            DType::I32 => b.extend((v as i32).to_le_bytes()),
        }
    }
    b
}

/// A tree held in memory, hashed like a real one.
pub struct MemTree {
    path: PathBuf,
    manifest: Manifest,
    data: Vec<Vec<u8>>,
}

impl MemTree {
    pub fn new(name: &str, taps: Vec<Tap>) -> MemTree {
        let mut entries = Vec::new();
        let mut data = Vec::new();
        for t in taps {
            let bytes = encode(&t.values, t.dtype);
            entries.push(Entry {
                path: capture::manifest::path_of(&t.key),
                shape: vec![t.key.rows() as usize, t.width],
                key: t.key,
                dtype: t.dtype,
                blake3: blake3::hash(&bytes).to_hex().to_string(),
                bytes: bytes.len() as u64,
                header_blake3: None,
            });
            data.push(bytes);
        }
        let mut manifest = Manifest {
            format: "taptree".into(),
            format_version: capture::FORMAT_VERSION.into(),
            root: String::new(),
            manifest_blake3: None,
            run: RunInfo::default(),
            selection: "all".into(),
            stages: llama(),
            dirs: Default::default(),
            entries,
        };
        (manifest.dirs, manifest.root) = manifest.hashes();
        MemTree {
            path: PathBuf::from(name),
            manifest,
            data,
        }
    }
}

impl MemTree {
    /// The same tree with this run metadata (input tokens, ...).
    pub fn with_run(mut self, run: RunInfo) -> MemTree {
        self.manifest.run = run;
        self
    }

    /// The same tree with this stage vocabulary.
    pub fn with_stages(mut self, stages: Vec<StageSpec>) -> MemTree {
        self.manifest.stages = stages;
        self
    }
}

impl Tree for MemTree {
    fn path(&self) -> &Path {
        &self.path
    }
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    fn read(&self, index: usize) -> Result<Tensor, capture::Error> {
        Ok(Tensor::Owned(self.data[index].clone()))
    }
}

/// One capture may be armed per process: tests that write trees take turns.
static CAPTURE: Mutex<()> = Mutex::new(());

/// Writes `taps` as a tree at `out` through the capture API.
pub fn write(out: &Path, taps: &[Tap], run: RunInfo) -> capture::Summary {
    let _turn = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
    let cap = capture::Capture::start(capture::CaptureOptions {
        out: out.to_path_buf(),
        selection: capture::Selection::all(),
        force: true,
        stages: llama(),
        run,
    })
    .expect("capture starts");
    for t in taps {
        let shape = [t.key.rows() as usize, t.width];
        let (stage, layer, pos, slot) = (&t.key.stage, t.key.layer, t.key.pos.clone(), t.key.slot);
        match t.dtype {
            DType::F32 => {
                let v: Vec<f32> = t.values.iter().map(|&x| x as f32).collect();
                capture::tap(stage, layer, pos, slot, &shape, &v);
            }
            DType::F64 => capture::tap(stage, layer, pos, slot, &shape, &t.values),
            DType::F16 => {
                let v: Vec<half::f16> = t.values.iter().map(|&x| half::f16::from_f64(x)).collect();
                capture::tap(stage, layer, pos, slot, &shape, &v);
            }
            DType::BF16 => {
                let v: Vec<half::bf16> =
                    t.values.iter().map(|&x| half::bf16::from_f64(x)).collect();
                capture::tap(stage, layer, pos, slot, &shape, &v);
            }
            DType::I8 => {
                let v: Vec<i8> = t.values.iter().map(|&x| x as i8).collect();
                capture::tap(stage, layer, pos, slot, &shape, &v);
            }
            DType::I32 => {
                let v: Vec<i32> = t.values.iter().map(|&x| x as i32).collect();
                capture::tap(stage, layer, pos, slot, &shape, &v);
            }
        }
    }
    cap.finish().expect("capture finishes")
}

/// The forward-order index of a stage in the vocabulary (for "downstream").
pub fn forward_index(layers: u32, layer: Option<u32>, stage: &str) -> usize {
    let vocab = llama();
    let per_layer: Vec<&StageSpec> = vocab.iter().filter(|s| s.scope == Scope::Layer).collect();
    let i = per_layer.iter().position(|s| s.name == stage);
    match (layer, i) {
        (Some(l), Some(i)) => 1 + l as usize * per_layer.len() + i,
        (None, _) if stage == "embedding" => 0,
        (None, _) => {
            1 + layers as usize * per_layer.len() + if stage == "final_norm" { 0 } else { 1 }
        }
        _ => usize::MAX,
    }
}

/// The diff's default options.
pub fn opts() -> diff::Options<'static> {
    diff::Options::default()
}

/// Whether `t` is the tap of `stage` at `layer`.
pub fn is(t: &Tap, layer: Option<u32>, stage: &str) -> bool {
    t.key.layer == layer && t.key.stage == stage
}

/// A change at `at` that every later op carries (scaled), like a real bug.
pub fn propagated(layer: u32, stage: &str, factor: f64) -> MemTree {
    let start = forward_index(3, Some(layer), stage);
    MemTree::new(
        "b",
        taps(&Shape::default(), |t| {
            let i = forward_index(3, t.key.layer, &t.key.stage);
            if i >= start {
                let k = t.values.len();
                for (j, v) in t.values.iter_mut().enumerate() {
                    // Orthogonal-ish noise growing downstream.
                    *v += factor
                        * (1.0 + (i - start) as f64 * 0.1)
                        * value("noise", None, 0, None, j % k);
                }
            }
        }),
    )
}
