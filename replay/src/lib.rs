//! Replay: every op of a tree recomputed from the tree's own captured
//! inputs and the model's weights, so that each op's **local error** — its
//! output against an exact recomputation of it — is measured free of what
//! it inherited from the ops before it.
//!
//! [`replay`] reads a tree ([`diff::Tree`], usually [`capture::TreeReader`])
//! into memory ([`taps::Taps`], every tap widened to f64, declared rotary
//! layouts put in the model's order), recomputes each selected tap with the
//! CPU forward's own ops ([`ops`]: `kernels::cpu`'s norm, matmul, RoPE,
//! attention, gating and residual add, called one at a time) in the
//! arithmetic [`Arith`] names — f64 for the truth, or an engine's own
//! arithmetic for conformance — and returns a [`ReplayReport`]: one [`Row`] per
//! (layer, stage) with its worst position, the diff's [`diff::Metrics`] and
//! the local error, judged against a tolerance. The renderers in [`render`]
//! only format.
//!
//! ```no_run
//! use capture::TreeReader;
//! use kernels::cpu::weights::DenseWeights;
//!
//! let tree = TreeReader::open("runs/cpu-q8")?;
//! let model = model::load::load_model("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let weights = DenseWeights::new(&model.weights)?;
//! let m = replay::Model {
//!     name: "SmolLM2-135M-Instruct.Q4_1.gguf",
//!     config: &model.weights.config,
//!     weights: &weights,
//!     blake3: Some(&model.source.blake3),
//! };
//! let report = replay::replay(&tree, &m, &replay::Options::default())?;
//! if let Some(i) = report.largest {
//!     println!("largest local error: {}", report.rows[i].name());
//! }
//! print!("{}", replay::render::table(&report));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod ops;
pub mod render;
pub mod report;
pub mod taps;

pub use ops::Arith;
pub use report::{replay, Options, PosError, ReplayOutcome, ReplayReport, Row};

use kernels::cpu::weights::DenseWeights;
use model::LlamaConfig;
use std::path::PathBuf;

/// The model a tree is replayed against: its hyperparameters, its weights
/// dequantized exactly, and the blake3 of its file (checked against the
/// tree's record of the model it ran).
pub struct Model<'a> {
    /// How the model was named (its path), for messages.
    pub name: &'a str,
    /// The hyperparameters that fix each stage's width and computation.
    pub config: &'a LlamaConfig,
    /// The weights, dequantized to f32 as the CPU forward reads them.
    pub weights: &'a DenseWeights,
    /// blake3 of the model file, hex; `None` skips the check against the
    /// tree's recorded `model_blake3`.
    pub blake3: Option<&'a str>,
}

/// Why a tree could not be replayed. Every one maps to exit code 2: a tool
/// that could not recompute an op has no verdict on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening or reading the tree failed (missing, incomplete, corrupt).
    #[error(transparent)]
    Capture(#[from] capture::Error),

    /// A declared layout the replay does not understand.
    #[error(transparent)]
    Layout(#[from] diff::Error),

    /// The tree records another model than the one given.
    #[error("{}: the tree was captured from a model with blake3 {recorded}, --model {model} has {given}", tree.display())]
    ModelMismatch {
        /// The tree's directory.
        tree: PathBuf,
        /// The model blake3 the tree's run records.
        recorded: String,
        /// The model given, as [`Model::name`] names it.
        model: String,
        /// That model's blake3.
        given: String,
    },

    /// An op's input is not in the tree.
    #[error("{}: cannot replay {tap}: its input {input} is not in the tree", tree.display())]
    MissingInput {
        /// The tree's directory.
        tree: PathBuf,
        /// The tap being replayed, as `L3/attn@0..7`.
        tap: String,
        /// The input that is missing (a tap name, or the token of a position).
        input: String,
    },

    /// A tap's width is not what the model's hyperparameters make it.
    #[error("{}: {tap}: {width} values per position, the model makes {want} ({why})", tree.display())]
    Shape {
        /// The tree's directory.
        tree: PathBuf,
        /// The tap whose width is wrong.
        tap: String,
        /// Values per position the tap holds.
        width: usize,
        /// Values per position expected (or, for a rotary layout, the head
        /// size the width must be a multiple of).
        want: usize,
        /// Where `want` comes from.
        why: String,
    },

    /// A stage with no computation in the stage contract for this model.
    #[error("{}: stage {stage} has no defined computation for a {family} model (leave it out with --select)", tree.display())]
    UnknownStage {
        /// The tree's directory.
        tree: PathBuf,
        /// The stage, marked `(per layer)` or `(global)`.
        stage: String,
        /// The model's family (`llama`, `gemma3`).
        family: String,
    },

    /// Two taps hold the same position of one stage.
    #[error("{}: position {pos} of {tap} is held by two taps", tree.display())]
    DuplicatePosition {
        /// The tree's directory.
        tree: PathBuf,
        /// The second tap that holds the position.
        tap: String,
        /// The position held twice.
        pos: u32,
    },

    /// The arithmetic asked for does not exist for this tree or model.
    #[error("{}: {reason}", tree.display())]
    Unsupported {
        /// The tree's directory.
        tree: PathBuf,
        /// What is not supported, naming the tap or the run's record.
        reason: String,
    },

    /// The selection left nothing to replay.
    #[error("{}: no tap matches the selection", tree.display())]
    NothingSelected {
        /// The tree's directory.
        tree: PathBuf,
    },
}
