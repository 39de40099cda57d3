//! What every forward (CPU, CUDA) offers: run rows of one sequence, or one
//! decode step of several sequences, tapping every stage on the way.

use model::LlamaConfig;

/// Activation precision of a forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 activations against dequantized weights.
    F32,
    /// Activations quantized to int8 per block (the weight format's block
    /// size) before each quantized matmul, as llama.cpp's integer dot products do.
    Q8,
    /// Every op in f64 from the dequantized weights: the truth.
    F64,
    /// `q8` with llama.cpp's own CPU arithmetic where it differs: its
    /// activation block rounding, f32 RoPE angles, F16 K/V cache and f16
    /// attention operands (see `cpu::llamacpp`). CPU only.
    LlamaCpp,
}

impl Precision {
    /// The name `--precision` and the manifest's `precision` use.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Q8 => "q8",
            Precision::F64 => "f64",
            Precision::LlamaCpp => "llamacpp",
        }
    }

    /// The precision `--precision` names, or `None` for an unknown name.
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" => Some(Precision::F32),
            "q8" => Some(Precision::Q8),
            "f64" => Some(Precision::F64),
            "llamacpp" => Some(Precision::LlamaCpp),
            _ => None,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a forward could not run.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The positions run would pass the model's context length.
    #[error("position {end} exceeds the context length {context}")]
    ContextOverflow {
        /// One past the last position asked for.
        end: usize,
        /// The model's context length.
        context: usize,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The token id.
        id: u32,
        /// The vocabulary's size.
        vocab: usize,
    },
    /// The model, precision or call is one this forward does not run (the
    /// message says which).
    #[error("{0}")]
    Unsupported(String),
    /// The GPU failed (a CUDA error, as text).
    #[error("device: {0}")]
    Device(String),
}

/// A forward of a decoder (llama, or a family its [`model::ModelFamily`] describes) with its own KV cache(s).
///
/// Each call taps every stage (through `capture`) with keys carrying the
/// positions it ran, so the tree of a prefill-then-decode run and the tree of
/// a one-token-at-a-time run diff position by position.
pub trait Forward {
    /// The hyperparameters of the model this forward runs.
    fn config(&self) -> &LlamaConfig;

    /// `"cpu"` or `"cuda"`.
    fn backend(&self) -> &'static str;

    /// The precision this forward was opened in.
    fn precision(&self) -> Precision;

    /// Runs `tokens` at positions `start_pos..start_pos + tokens.len()` of one
    /// sequence, appending to its KV cache (batched prefill when more than one
    /// token). `slot` is `None` for a lone sequence, `Some(i)` for sequence `i`
    /// of a batch; each has its own KV cache and its taps carry the slot.
    /// Returns the logits of the last row.
    fn forward(
        &mut self,
        slot: Option<u32>,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<Vec<f32>, ForwardError>;

    /// One decode step of `tokens.len()` sequences in one batched forward:
    /// sequence `i` (slot `i`, already prefilled with `forward(Some(i), ..)`)
    /// takes `tokens[i]` at `positions[i]`. Returns each sequence's logits.
    fn decode_batch(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f32>>, ForwardError>;

    /// Forgets every cached position (all sequences).
    fn reset(&mut self);

    /// Greedy decoding of the lone sequence (slot `None`) where this forward
    /// has a path of its own for it: `steps` decode steps, the first taking
    /// `first` at `pos`, each next one the greedy token
    /// ([`crate::generate::argmax`]) of the step before. `Some` of the
    /// tokens the steps picked, in order: all `steps` of them, or fewer
    /// ending with the first one in `stop`; the cache then holds every
    /// position a returned token was picked at, as stepping with
    /// [`Self::forward`] would leave it. `None` where there is no such path
    /// (the caller steps with [`Self::forward`]); the default.
    fn greedy_steps(
        &mut self,
        first: u32,
        pos: usize,
        steps: usize,
        stop: &[u32],
    ) -> Option<Result<Vec<u32>, ForwardError>> {
        let _ = (first, pos, steps, stop);
        None
    }
}

/// A decode step of several sequences run one slot at a time, in slot
/// order: sequence `i` (slot `i`) takes `tokens[i]` at `positions[i]`. For
/// forwards without a batched kernel; each slot computes what it would alone.
pub(crate) fn decode_slot_by_slot<F: Forward + ?Sized>(
    f: &mut F,
    tokens: &[u32],
    positions: &[usize],
) -> Result<Vec<Vec<f32>>, ForwardError> {
    if tokens.len() != positions.len() {
        return Err(ForwardError::Unsupported(format!(
            "decode batch of {} tokens for {} positions",
            tokens.len(),
            positions.len()
        )));
    }
    tokens
        .iter()
        .zip(positions)
        .enumerate()
        .map(|(i, (&t, &p))| f.forward(Some(i as u32), &[t], p))
        .collect()
}

/// Checks that the heads of `c` are ones a forward can run: query heads that
/// group over the KV heads, and an even head size for the rotary embedding.
/// The same refusal on every backend.
pub fn check_config(c: &LlamaConfig) -> Result<(), ForwardError> {
    let bad = |why: String| Err(ForwardError::Unsupported(format!("{}: {why}", c.arch)));
    if c.n_head == 0 || c.n_head_kv == 0 || !c.n_head.is_multiple_of(c.n_head_kv) {
        return bad(format!(
            "{} query heads do not group over {} KV heads",
            c.n_head, c.n_head_kv
        ));
    }
    if !c.head_dim.is_multiple_of(2) {
        return bad(format!(
            "odd head size {} cannot take rotary embedding",
            c.head_dim
        ));
    }
    Ok(())
}

/// Checks that `tokens` is a non-empty run of ids inside the vocabulary: the
/// same refusal on every backend.
pub fn check_tokens(config: &LlamaConfig, tokens: &[u32]) -> Result<(), ForwardError> {
    if tokens.is_empty() {
        return Err(ForwardError::Unsupported("no tokens to run".into()));
    }
    match tokens.iter().find(|&&t| t as usize >= config.vocab_size) {
        Some(&id) => Err(ForwardError::TokenOutOfRange {
            id,
            vocab: config.vocab_size,
        }),
        None => Ok(()),
    }
}

/// Checks that `rows` positions from `start` fit the context and continue
/// the `cached` positions of `slot` (a forward cannot skip positions).
pub fn check_positions(
    config: &LlamaConfig,
    slot: Option<u32>,
    rows: usize,
    start: usize,
    cached: usize,
) -> Result<(), ForwardError> {
    let end = start + rows;
    if end > config.context_length {
        return Err(ForwardError::ContextOverflow {
            end,
            context: config.context_length,
        });
    }
    if start > cached {
        return Err(ForwardError::Unsupported(format!(
            "position {start}{}: only {cached} positions are cached",
            slot.map(|s| format!(" of slot {s}")).unwrap_or_default()
        )));
    }
    Ok(())
}
