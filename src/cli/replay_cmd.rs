//! `taptree replay TREE --model M`: every op of a tree recomputed from the
//! tree's own inputs; each op's local error.

use crate::cli::forward::PrecisionArg;
use crate::exit;
use anyhow::Context;
use capture::{Selection, TreeReader};
use kernels::cpu::weights::DenseWeights;
use std::path::PathBuf;

/// Recompute every op of a tree from its own captured inputs: each op's
/// local error.
///
/// For every tap whose stage the stage contract defines (norms,
/// projections, RoPE, attention, gating, residual adds, logits), the op is
/// run again on the tree's own input taps with the model's weights
/// dequantized exactly, in f64 (or in --precision, for conformance), and
/// compared with the tree's output: the op's own error, free of what it
/// inherited. Exit 0 every op within --tolerance, 1 some op above it, 2
/// could not replay (missing input tap, shape mismatch, unknown stage,
/// model not the tree's, layout not understood).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tree to replay.
    pub tree: PathBuf,
    /// The model the tree ran: `smollm2`, `gemma3-270m`, a GGUF file or an
    /// HF directory. Refused when the tree records another model's blake3.
    #[arg(long)]
    pub model: String,
    /// The arithmetic of the recomputation: `f64` (the truth: each op's
    /// local error), or `f32`, `q8`, `llamacpp` (conformance: how far the
    /// tree's op is from that forward's arithmetic on the same inputs).
    /// (`bf16` and `f16`, a foreign engine's dtypes, are refused.)
    #[arg(
        long,
        visible_alias = "truth-precision",
        value_name = "P",
        value_enum,
        default_value = "f64"
    )]
    pub precision: PrecisionArg,
    /// The largest local error (relative RMS over the op's positions)
    /// within tolerance.
    #[arg(
        short,
        long,
        visible_alias = "tol",
        value_name = "X",
        default_value_t = replay::report::DEFAULT_TOLERANCE
    )]
    pub tolerance: f64,
    /// Only these taps and positions (`stage=ffn_*;layer=20..30;pos=0`);
    /// their inputs are read from the whole tree.
    #[arg(long)]
    pub select: Option<String>,
    /// The report as JSON on stdout (schema in docs/GUIDE.md).
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (local error against depth,
    /// the layer × stage heatmap, each op's positions).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let precision = args.precision.builtin().with_context(|| {
        format!(
            "--precision: bad value {:?}: expected f64, f32, q8 or llamacpp",
            args.precision.name()
        )
    })?;
    if args.tolerance.is_nan() || args.tolerance < 0.0 {
        anyhow::bail!(
            "--tolerance: bad value {}: expected a number >= 0",
            args.tolerance
        );
    }
    let selection = match &args.select {
        Some(s) => Selection::parse(s).with_context(|| format!("--select {s:?}"))?,
        None => Selection::all(),
    };
    // The tree first: a missing or incomplete tree is refused before the
    // model is read.
    let tree = TreeReader::open(&args.tree)?;
    let path = fetch::resolve(&args.model)?;
    let model = model::load::load_model(&path)?;
    let weights = DenseWeights::new(&model.weights)
        .with_context(|| format!("{}: cannot dequantize", path.display()))?;
    let name = path.display().to_string();
    let m = replay::Model {
        name: &name,
        config: &model.weights.config,
        weights: &weights,
        blake3: Some(&model.source.blake3),
    };
    let opts = replay::Options {
        precision,
        tolerance: args.tolerance,
        selection,
    };
    let report = replay::replay(&tree, &m, &opts)?;
    if let Some(path) = &args.html {
        let page = super::replay_html::page(&report, tree.manifest()).render();
        std::fs::write(path, page).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    let code = match report.outcome {
        replay::ReplayOutcome::Within => exit::OK,
        replay::ReplayOutcome::Above => exit::DIVERGED,
    };
    exit::report(code, |out| {
        if args.json {
            writeln!(out, "{}", replay::render::json(&report))
        } else {
            out.write_all(replay::render::table(&report).as_bytes())
        }
    })
}
