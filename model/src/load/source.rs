use std::path::{Path, PathBuf};

use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::weights::ModelWeights;

/// The file format a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A single `.gguf` file.
    Gguf,
    /// `config.json` plus `*.safetensors`.
    HfSafetensors,
}

impl ModelFormat {
    /// The format's name as the manifest records it (`gguf`, `hf-safetensors`).
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfSafetensors => "hf-safetensors",
        }
    }
}

/// Where a model came from.
#[derive(Debug, Clone)]
pub struct ModelSource {
    /// The GGUF file or HF directory as given.
    pub path: PathBuf,
    /// blake3 of the GGUF file; for a directory, of its files' names and
    /// hashes (see [`load_hf`](super::load_hf)).
    pub blake3: String,
    /// Which loader read it.
    pub format: ModelFormat,
}

/// A model ready for a forward.
#[derive(Debug)]
pub struct LoadedModel {
    /// Hyperparameters and weights.
    pub weights: ModelWeights,
    /// `None` when the files carry no tokenizer, or one of a kind that is
    /// not supported (then `tokenizer_error` says which); use token ids then.
    pub tokenizer: Option<Tokenizer>,
    /// Why a tokenizer the file describes is not available.
    pub tokenizer_error: Option<TokenizerError>,
    /// Where it came from, and its blake3.
    pub source: ModelSource,
}

/// The blake3 of a file, hex (the manifest's `model_blake3`).
pub fn file_blake3(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(blake3::hash(&[]).to_hex().to_string());
    }
    // SAFETY: read-only map of a file we only hash; see `GgufFile::open`.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(blake3::hash(&map).to_hex().to_string())
}
