//! Writes a synthetic tree with the shape of a 7B llama model's capture:
//! every stage of every layer, one tap per position (decode), f32.
//! Deterministic: the same arguments always give the same root.
//!
//! ```text
//! cargo run --release -p capture --example gen_tree -- OUT [--layers 32] [--positions 78]
//!     [--hidden 4096] [--ffn 11008] [--vocab 32000] [--seed 1]
//! ```
//! The defaults give 78 × (32 × 15 + 3) = 37,674 taps, about 0.85 GB.

use capture::{Capture, CaptureOptions, RunInfo, Selection, StageSpec};
use std::path::PathBuf;

const LAYER_STAGES: [&str; 15] = [
    "attn_norm",
    "q_proj",
    "k_proj",
    "v_proj",
    "q_rope",
    "k_rope",
    "attn",
    "o_proj",
    "post_attn_residual",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_swiglu",
    "ffn_down",
    "post_ffn_residual",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut out: Option<PathBuf> = None;
    let (mut layers, mut positions, mut hidden, mut ffn, mut vocab, mut seed) =
        (32u32, 78u32, 4096usize, 11008usize, 32000usize, 1u64);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> Result<u64, Box<dyn std::error::Error>> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            Ok(v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))?)
        };
        match arg.as_str() {
            "--layers" => layers = value("--layers")? as u32,
            "--positions" => positions = value("--positions")? as u32,
            "--hidden" => hidden = value("--hidden")? as usize,
            "--ffn" => ffn = value("--ffn")? as usize,
            "--vocab" => vocab = value("--vocab")? as usize,
            "--seed" => seed = value("--seed")?,
            _ if out.is_none() && !arg.starts_with("--") => out = Some(arg.into()),
            _ => return Err(format!("unexpected argument {arg:?}").into()),
        }
    }
    let out = out.ok_or("usage: gen_tree OUT [--layers N] [--positions N] ...")?;
    let mut stages = vec![StageSpec::global("embedding", &[])];
    stages.extend(LAYER_STAGES.iter().map(|s| StageSpec::layer(s, &[])));
    stages.push(StageSpec::global("final_norm", &[]));
    stages.push(StageSpec::global("logits", &["final_norm"]));
    let cap = Capture::start(CaptureOptions {
        out,
        selection: Selection::all(),
        force: true,
        stages,
        run: RunInfo {
            model: format!("synthetic-{layers}x{hidden}"),
            backend: "gen_tree".into(),
            precision: "f32".into(),
            ..RunInfo::default()
        },
    })?;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf: Vec<f32> = Vec::new();
    let mut tap = |stage: &str, layer: Option<u32>, pos: u32, width: usize| {
        buf.clear();
        buf.extend((0..width).map(|_| {
            // xorshift64*: cheap, deterministic, every tap different.
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            let bits = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
            (bits >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        }));
        capture::tap(stage, layer, pos..pos + 1, None, &[1, width], &buf);
    };
    for pos in 0..positions {
        tap("embedding", None, pos, hidden);
        for layer in 0..layers {
            for stage in LAYER_STAGES {
                let width = if matches!(stage, "ffn_gate" | "ffn_up" | "ffn_swiglu") {
                    ffn
                } else {
                    hidden
                };
                tap(stage, Some(layer), pos, width);
            }
        }
        tap("final_norm", None, pos, hidden);
        tap("logits", None, pos, vocab);
    }
    let summary = cap.finish()?;
    println!(
        "{}: {} taps, {} bytes, root {}",
        summary.path.display(),
        summary.taps,
        summary.bytes,
        summary.root
    );
    Ok(())
}
