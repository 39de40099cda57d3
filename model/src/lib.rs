//! Model files for taptree: everything between a file on disk and the
//! weights a forward reads.
//!
//! [`load::load_model`] reads a GGUF file ([`gguf`]) or a Hugging Face
//! safetensors directory into [`ModelWeights`] (tensors kept in their file's
//! format as [`QTensor`], dequantized bit for bit as ggml does in [`quant`])
//! with its [`tokenizer`]. A model family is one layer description
//! ([`ModelFamily`]: llama's, or [`gemma3`]'s extra norms, GeGLU, RoPE layout
//! and windows) that the forwards and the stage vocabulary read.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let path = fixtures::write("tiny-q", dir.path())?; // a seeded GGUF
//! let loaded = model::load::load_model(&path)?;
//! let w = &loaded.weights;
//! assert_eq!((w.config.n_layer, w.config.family.rope), (3, model::RopeStyle::Interleaved));
//! assert_eq!(w.token_embd.to_f32()?.len(), w.config.vocab_size * w.config.n_embd);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
pub mod family;
pub mod gemma3;
pub mod gguf;
pub mod load;
pub mod quant;
pub mod tensor_bytes;
pub mod tokenizer;
pub mod weights;

pub use family::{FfnActivation, LayerAttention, ModelFamily, RopeStyle};
pub use quant::GgmlType;
pub use tensor_bytes::TensorBytes;
pub use weights::{ExtraNorms, LayerWeights, LlamaConfig, ModelWeights, QTensor};
