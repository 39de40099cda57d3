//! The one entry point from a file to a model: [`load_model`] takes a GGUF
//! file or an HF-layout safetensors directory and returns the weights, the
//! tokenizer when the files carry one, and where it all came from.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! // `fetch::resolve("smollm2")` gives the real model's path.
//! let path = fixtures::write("tiny-q", dir.path())?;
//! let loaded = model::load::load_model(&path)?;
//! assert_eq!(loaded.weights.config.n_layer, 3);
//! let embedding = loaded.weights.token_embd.to_f32()?; // dequantized, row-major
//! assert_eq!(embedding.len(), 259 * 64);
//! let tokenizer = loaded.tokenizer.expect("fixtures carry a tokenizer");
//! assert_eq!(tokenizer.encode("Hi")?, [0, 3 + b'H' as u32, 3 + b'i' as u32]);
//! # Ok(())
//! # }
//! ```

mod assemble;
mod error;
mod gguf;
mod hf;
mod source;

use std::path::Path;

pub use error::{HfError, LoadError};
pub use gguf::{config_from_gguf, load_gguf, weights_from_gguf};
pub use hf::{config_from_json, load_hf, permute_rope_rows, unpermute_rope_rows};
pub use source::{file_blake3, LoadedModel, ModelFormat, ModelSource};

/// Loads a GGUF file or an HF safetensors directory.
pub fn load_model(path: impl AsRef<Path>) -> Result<LoadedModel, LoadError> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|source| LoadError::Io {
        path: path.into(),
        source,
    })?;
    if meta.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(LoadError::NotAModel { path: path.into() });
        }
        return load_hf(path);
    }
    load_gguf(path)
}
